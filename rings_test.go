// SPDX-License-Identifier: Apache-2.0

package perfbuf

import (
	"errors"
	"os"
	"slices"
	"syscall"
	"testing"

	"github.com/perfbuf/perfbuf/internal/cpus"
	"github.com/perfbuf/perfbuf/internal/kernel"
	"golang.org/x/sys/unix"
)

// The methods of Rings are every owner's, the same: a Reader's, a
// PerfBuffer's, a Raw's and a Recorder's rings count and descriptors,
// refused out of range and after Close (but the count and Stats, which
// stay), and Pause and Resume after Close. Before Rings, a Reader had no
// BufferCount, BufferFD or EpollFD, a Raw no Pause or Resume, and a
// Recorder none of them but Pause, Resume, Stats and Close.
func TestRingsEveryOwner(t *testing.T) {
	owners := map[string]func(f *fakeRings) Rings{
		"Reader":     func(f *fakeRings) Rings { return f.reader(t, ReaderOptions{}).Rings },
		"PerfBuffer": func(f *fakeRings) Rings { return f.perfBuffer(t, func(int, []byte) {}, nil).Rings },
		"Raw":        func(f *fakeRings) Rings { return f.raw(t).Rings },
	}
	for name, open := range owners {
		t.Run(name, func(t *testing.T) {
			f := newFakeRings(t, 2, 4096)
			r := open(f)
			// Fake rings have no epoll set (selftest/callback has one).
			checkRings(t, r, f.fds, f.cpus, errors.ErrUnsupported, os.ErrClosed)
		})
	}
	// A Recorder's rings are a real perf event array's backward rings,
	// one per online CPU, in an epoll set that a caller may wait on.
	t.Run("Recorder", func(t *testing.T) {
		online, err := cpus.Online()
		if err != nil {
			t.Fatal(err)
		}
		rec, err := NewRecorder(MapFD(createPerfEventArray(t, "pb_rings_rec")), Options{RingBytes: os.Getpagesize()})
		privileged(t, "open a Recorder", err)
		t.Cleanup(func() { rec.Close() })
		fds := make([]int, len(online))
		for i := range fds {
			if fds[i], err = rec.BufferFD(i); err != nil || fds[i] < 0 || slices.Contains(fds[:i], fds[i]) {
				t.Fatalf("BufferFD(%d) = %d, %v; want a descriptor of its own", i, fds[i], err)
			}
		}
		for _, call := range []func() error{rec.Pause, rec.Resume} {
			if err := call(); err != nil {
				t.Errorf("Pause or Resume: %v", err)
			}
		}
		checkRings(t, rec.Rings, fds, online, nil, os.ErrClosed)
	})
}

// checkRings checks r's methods over the rings whose descriptors are fds
// and whose CPUs are ringCPUs, and closes r. EpollFD fails with epollErr
// (nil: it succeeds), and with closedEpollErr after Close.
func checkRings(t *testing.T, r Rings, fds, ringCPUs []int, epollErr, closedEpollErr error) {
	t.Helper()
	n := len(fds)
	if got := r.BufferCount(); got != n {
		t.Errorf("BufferCount %d, want %d", got, n)
	}
	for i, want := range fds {
		if fd, err := r.BufferFD(i); fd != want || err != nil {
			t.Errorf("BufferFD(%d) = %d, %v; want %d", i, fd, err, want)
		}
	}
	for _, i := range []int{-1, n} {
		if _, err := r.BufferFD(i); !errors.Is(err, os.ErrInvalid) {
			t.Errorf("BufferFD(%d): %v, want os.ErrInvalid", i, err)
		}
	}
	if _, err := r.EpollFD(); !errors.Is(err, epollErr) {
		t.Errorf("EpollFD: %v, want %v", err, epollErr)
	}
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := r.BufferFD(0); !errors.Is(err, os.ErrClosed) {
		t.Errorf("BufferFD after Close: %v, want os.ErrClosed", err)
	}
	if _, err := r.EpollFD(); !errors.Is(err, closedEpollErr) {
		t.Errorf("EpollFD after Close: %v, want %v", err, closedEpollErr)
	}
	for _, call := range []func() error{r.Pause, r.Resume} {
		if err := call(); !errors.Is(err, os.ErrClosed) {
			t.Errorf("Pause or Resume after Close: %v, want os.ErrClosed", err)
		}
	}
	// Nothing was written: no counts, no wakeup; a ring's entry per ring,
	// its CPU's, and the sums of no CPU.
	st := r.Stats()
	if r.BufferCount() != n || len(st.Rings) != n || st.CPU != -1 || st.Wakeups != 0 || st.Samples+st.Lost+st.Left != 0 {
		t.Errorf("after Close: BufferCount %d, Stats %+v; want %d rings", r.BufferCount(), st, n)
	}
	for i, s := range st.Rings {
		if s.CPU != ringCPUs[i] || s.Rings != nil || s.Wakeups != 0 || s.Size != st.Rings[0].Size {
			t.Errorf("after Close: Rings[%d] = %+v; want cpu %d's", i, s, ringCPUs[i])
		}
	}
	if err := r.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
}

// createPerfEventArray creates a perf event array of a slot per possible
// CPU named name, closed at cleanup; the test is skipped without the
// privilege.
func createPerfEventArray(t *testing.T, name string) int {
	t.Helper()
	possible, err := cpus.Possible()
	if err != nil {
		t.Fatal(err)
	}
	fd, err := kernel.CreatePerfEventArray(name, uint32(slices.Max(possible)+1))
	privileged(t, "create a perf event array", err)
	t.Cleanup(func() { unix.Close(fd) })
	return fd
}

// privileged skips the test if err says that it needs privileges or a
// kernel (bpf(2) not implemented: an emulator), outside CI; it fails on
// other errors.
func privileged(t *testing.T, what string, err error) {
	t.Helper()
	if err == nil {
		return
	}
	if errors.Is(err, syscall.ENOSYS) {
		t.Skipf("%s: %v (bpf(2) is not implemented here, an emulator: no kernel)", what, err)
	}
	if (errors.Is(err, os.ErrPermission) || errors.Is(err, syscall.EACCES)) && os.Getenv("CI") != "true" {
		t.Skipf("%s: %v (needs privileges)", what, err)
	}
	t.Fatalf("%s: %v", what, err)
}
