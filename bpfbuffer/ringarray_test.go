// SPDX-License-Identifier: Apache-2.0

package bpfbuffer

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"syscall"
	"testing"
)

// An EPERM creating the rings names RLIMIT_MEMLOCK, its value and what the
// rings need, and stays an EPERM; another error is left as it is.
func TestMemlockHint(t *testing.T) {
	eperm := fmt.Errorf("create ring buffer %q of %d bytes: %w", "events_0", 1<<20, syscall.EPERM)
	err := memlockHint(eperm, 256, 1<<20)
	if !errors.Is(err, syscall.EPERM) || !errors.Is(err, os.ErrPermission) {
		t.Errorf("%v: not an EPERM", err)
	}
	for _, want := range []string{"RLIMIT_MEMLOCK", "before 5.11", "256 rings of 1048576 bytes take 268435456 bytes of it", "CAP_BPF"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("%v: does not say %q", err, want)
		}
	}
	t.Log(err)
	other := fmt.Errorf("create: %w", syscall.EINVAL)
	if got := memlockHint(other, 2, 4096); got != other {
		t.Errorf("memlockHint(EINVAL) = %v, want it unchanged", got)
	}
}
