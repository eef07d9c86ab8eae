// SPDX-License-Identifier: Apache-2.0

package perfbuf

import (
	"errors"
	"os"
	"testing"
)

// The methods of Rings are every owner's, the same: a Reader's, a
// PerfBuffer's and a Raw's rings count and descriptors, refused out of
// range and after Close (but the count and Stats, which stay), and Pause
// and Resume after Close. Before Rings, a Reader had no BufferCount,
// BufferFD or EpollFD, and a Raw no Pause or Resume.
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
			if n := r.BufferCount(); n != 2 {
				t.Errorf("BufferCount %d, want 2", n)
			}
			for i, want := range f.fds {
				if fd, err := r.BufferFD(i); fd != want || err != nil {
					t.Errorf("BufferFD(%d) = %d, %v; want %d", i, fd, err, want)
				}
			}
			for _, i := range []int{-1, 2} {
				if _, err := r.BufferFD(i); !errors.Is(err, os.ErrInvalid) {
					t.Errorf("BufferFD(%d): %v, want os.ErrInvalid", i, err)
				}
			}
			// Fake rings have no epoll set (selftest/callback has one).
			if _, err := r.EpollFD(); !errors.Is(err, errors.ErrUnsupported) {
				t.Errorf("EpollFD over fake rings: %v, want errors.ErrUnsupported", err)
			}
			if err := r.Close(); err != nil {
				t.Fatal(err)
			}
			if _, err := r.BufferFD(0); !errors.Is(err, os.ErrClosed) {
				t.Errorf("BufferFD after Close: %v, want os.ErrClosed", err)
			}
			if _, err := r.EpollFD(); !errors.Is(err, os.ErrClosed) {
				t.Errorf("EpollFD after Close: %v, want os.ErrClosed", err)
			}
			for _, call := range []func() error{r.Pause, r.Resume} {
				if err := call(); !errors.Is(err, os.ErrClosed) {
					t.Errorf("Pause or Resume after Close: %v, want os.ErrClosed", err)
				}
			}
			if st := r.Stats(); r.BufferCount() != 2 || len(st) != 2 || st[1].CPU != 1 {
				t.Errorf("after Close: BufferCount %d, Stats %+v", r.BufferCount(), st)
			}
			if err := r.Close(); err != nil {
				t.Errorf("second Close: %v", err)
			}
		})
	}
}
