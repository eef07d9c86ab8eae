// SPDX-License-Identifier: Apache-2.0

package perfbuf

// Tests of the map checks (map.go) that ask the kernel, in every build.

import (
	"errors"
	"os"
	"strings"
	"syscall"
	"testing"
)

// A descriptor that is not a BPF map is refused as such, ErrMapType with
// the errno the kernel gave (BPF_OBJ_GET_INFO_BY_FD on /dev/null), before
// anything is claimed or opened.
func TestNewNotAMap(t *testing.T) {
	f, err := os.Open(os.DevNull)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	_, err = NewRaw(MapFD(f.Fd()), Options{})
	var errno syscall.Errno
	if !errors.Is(err, ErrMapType) || !errors.As(err, &errno) || !strings.Contains(err.Error(), "is not a BPF map (/dev/null)") {
		t.Errorf("New over /dev/null: %v; want ErrMapType and an errno, not a BPF map", err)
	}
	_, err = NewReader(MapFD(f.Fd()), ReaderOptions{})
	if !errors.Is(err, ErrMapType) || !errors.As(err, &errno) || !strings.HasPrefix(err.Error(), "new reader: fd ") {
		t.Errorf("NewReader over /dev/null: %v; want ErrMapType and an errno, not a BPF map", err)
	}
}
