// SPDX-License-Identifier: Apache-2.0

package bpfbuffer

import (
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"syscall"
	"testing"
)

// The slots of the rings: one for each group of n CPUs holding a possible
// CPU, gaps in the possible CPUs left empty.
func TestRingKeys(t *testing.T) {
	for _, tc := range []struct {
		possible []int
		n        int
		want     []uint32
	}{
		{[]int{0, 1}, 1, []uint32{0, 1}},
		{[]int{0, 1}, 2, []uint32{0}},
		{[]int{0, 1, 2, 3, 4}, 2, []uint32{0, 1, 2}},
		{[]int{0, 1, 6, 7}, 2, []uint32{0, 3}},
		{[]int{0, 1, 2}, 8, []uint32{0}},
	} {
		if got := ringKeys(tc.possible, tc.n); !slices.Equal(got, tc.want) {
			t.Errorf("ringKeys(%v, %d) = %v, want %v", tc.possible, tc.n, got, tc.want)
		}
	}
}

// A ring's name is the buffer's and its slot, within 15 characters, the
// slot kept whole.
func TestRingName(t *testing.T) {
	for _, tc := range []struct {
		name string
		key  uint32
		want string
	}{
		{"events", 3, "events_3"},
		{"a_very_long_buffer", 3, "a_very_long_b_3"},
		{"a_very_long_buffer", 255, "a_very_long_255"},
		{"fifteen_chars_x", 3, "fifteen_chars_3"},
	} {
		if got := ringName(tc.name, tc.key); got != tc.want || len(got) > 15 {
			t.Errorf("ringName(%q, %d) = %q, want %q", tc.name, tc.key, got, tc.want)
		}
	}
}

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
