// SPDX-License-Identifier: Apache-2.0

package kernel

import (
	"errors"
	"os"
	"strings"
	"syscall"
	"testing"

	"github.com/perfbuf/perfbuf/internal/ringtest"
	"golang.org/x/sys/unix"
)

// A backward ring's event is the BPF output event with write_backward, nothing else.
func TestBackwardAttr(t *testing.T) {
	c := PerfConfig{Pages: 2, PageSize: 4096, WakeupEvents: 1}
	a, want := BackwardAttr(c), BPFOutputAttr(c)
	want.Bits |= unix.PerfBitWriteBackward
	if a != want {
		t.Errorf("attr %+v, want %+v", a, want)
	}
}

// The probe says ErrUnsupported, naming 6.19, on kernels before 6.19, and nothing on
// later ones. Needs CAP_BPF.
func TestProbeRingOverwrite(t *testing.T) {
	major, minor, err := Version()
	if err != nil {
		t.Fatal(err)
	}
	err = ProbeRingOverwrite()
	if errors.Is(err, syscall.EPERM) {
		if os.Getenv("CI") == "true" {
			t.Fatalf("privileged test under CI: %v", err)
		}
		t.Skipf("needs CAP_BPF: %v", err)
	}
	if major > 6 || major == 6 && minor >= 19 {
		if err != nil {
			t.Errorf("kernel %d.%d: %v, want overwrite mode", major, minor, err)
		}
		return
	}
	if !errors.Is(err, errors.ErrUnsupported) || !errors.Is(err, syscall.EINVAL) || !strings.Contains(err.Error(), "6.19") {
		t.Errorf("kernel %d.%d: %v; want errors.ErrUnsupported with the kernel's EINVAL, naming 6.19", major, minor, err)
	}
	t.Logf("kernel %d.%d: %v", major, minor, err)
}

// The pause is an ioctl of perf events: on another descriptor it fails, wrapped.
func TestPauseOutputErrors(t *testing.T) {
	f, err := os.Open(os.DevNull)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := PauseOutput(int(f.Fd()), true); !errors.Is(err, syscall.ENOTTY) || !strings.Contains(err.Error(), "pause") {
		t.Errorf("pause %s: %v, want ENOTTY", os.DevNull, err)
	}
	if err := PauseOutput(-1, false); !errors.Is(err, syscall.EBADF) || !strings.Contains(err.Error(), "resume") {
		t.Errorf("resume -1: %v, want EBADF", err)
	}
}

// A backward ring is opened, mapped as the kernel set it up, paused and resumed, and
// stored in the map. Needs CAP_BPF and CAP_PERFMON.
func TestOpenBackwardRings(t *testing.T) {
	m := perfEventArray(t)
	fds := ringtest.OpenFDs(t)
	page := os.Getpagesize()
	p, err := OpenBackwardRings(m.FD(), PerfConfig{Pages: 2, PageSize: page, WakeupEvents: 1}, []int32{0})
	if err != nil {
		t.Fatal(err)
	}
	base, size := p.Ring(0)
	hdr := (*unix.PerfEventMmapPage)(base)
	if size != 2*page || hdr.Data_size != uint64(size) || hdr.Data_head != 0 {
		t.Errorf("ring of %d bytes; header: %d bytes, head %d", size, hdr.Data_size, hdr.Data_head)
	}
	if err := p.Pause(0, true); err != nil {
		t.Error(err)
	}
	if err := p.Pause(0, false); err != nil {
		t.Error(err)
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	if now := ringtest.OpenFDs(t); now != fds {
		t.Errorf("%d descriptors open after Close, %d before", now, fds)
	}
	if err := DeleteSlot(m.FD(), 0); err != nil {
		t.Errorf("slot 0 after Close: delete: %v, want the ring stored there", err)
	}
}

// MapRingBuffer refuses sizes the kernel never makes, before any mmap.
func TestMapRingBufferInvalid(t *testing.T) {
	for _, n := range []int{0, -4096, 100, 3 * os.Getpagesize()} {
		if _, err := MapRingBuffer(-1, n); !errors.Is(err, os.ErrInvalid) {
			t.Errorf("size %d: %v, want os.ErrInvalid", n, err)
		}
	}
	if _, err := MapRingBuffer(-1, os.Getpagesize()); !errors.Is(err, syscall.EBADF) {
		t.Errorf("descriptor -1: %v, want EBADF", err)
	}
}
