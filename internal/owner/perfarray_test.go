// SPDX-License-Identifier: Apache-2.0

package owner

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

// release lets go of the map file the slots were filled through, at once,
// and leaves in its descriptor's place the first opening's epoll set, no
// map, for perf_buffer__free's deletes by key; once only. A pipe's read
// end plays the map file: its write end fails with EPIPE once it is
// released. (selftest/upgrade shows the kernel's side: another process's
// reader keeps its slots.)
func TestReleaseMapFile(t *testing.T) {
	p := make([]int, 2)
	if err := unix.Pipe2(p, unix.O_CLOEXEC); err != nil {
		t.Fatal(err)
	}
	defer unix.Close(p[1])
	epfd, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(epfd)
	ev := newFakeEvents([]int32{0})
	r := &rings{mapFD: p[0], mapOwned: true, cs: []PerfEvents{ev}, epfd: epfd, stored: []int32{0}}
	r.release()
	if _, err := unix.Write(p[1], []byte{1}); !errors.Is(err, syscall.EPIPE) {
		t.Errorf("write to the map file's pipe after release: %v, want EPIPE (the file released)", err)
	}
	var got, want unix.Stat_t
	if err := unix.Fstat(r.mapFD, &got); err != nil {
		t.Fatalf("mapFD after release: %v", err)
	}
	if err := unix.Fstat(epfd, &want); err != nil {
		t.Fatal(err)
	}
	if got.Ino != want.Ino || got.Dev != want.Dev {
		t.Errorf("mapFD after release is inode %d, want the epoll set's %d", got.Ino, want.Ino)
	}
	r.release() // once only: nothing more
	r.close()
	if !ev.closed {
		t.Error("close did not free the opening")
	}
	if err := unix.Fstat(r.mapFD, &got); !errors.Is(err, unix.EBADF) {
		t.Errorf("mapFD after close: %v, want EBADF", err)
	}
}

// createPerfEventArray creates a perf event array of a slot per possible
// CPU, closed at cleanup.
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

// Open over a real perf event array: a ring on every online CPU, stored
// through a map file of the reader's own (no slot deleted by key), with
// an epoll set and a descriptor per ring; Pause and Resume through each
// ring's event; the map claimed until Close. A Recorder over the same map
// opens backward rings once the reader closed.
func TestOpenPerfEventArray(t *testing.T) {
	fd := createPerfEventArray(t, "pb_owner_perf")
	online, err := cpus.Online()
	if err != nil {
		t.Fatal(err)
	}
	c, err := Open(mapFD(fd), RingOptions{RingBytes: os.Getpagesize()}, nil, nil, nil)
	privileged(t, "open perf rings", err)
	NewRaw(c) // starts c
	if n := c.Count(); n != len(online) {
		t.Errorf("%d rings, want one per online CPU (%d)", n, len(online))
	}
	if got, want := c.Name(), `perf event array "pb_owner_perf"`; got != want {
		t.Errorf("Name() = %q, want %q", got, want)
	}
	for i, st := range c.Stats() {
		if st.CPU != online[i] || c.src.(*rings).byKey {
			t.Errorf("Stats()[%d] = %+v; want CPU %d, and the slot released with the reader's map file", i, st, online[i])
		}
		if rfd, err := c.BufferFD(i); err != nil || rfd < 0 {
			t.Errorf("BufferFD(%d) = %d, %v", i, rfd, err)
		}
	}
	if ep, err := c.EpollFD(); err != nil || ep < 0 {
		t.Errorf("EpollFD() = %d, %v", ep, err)
	}
	for _, on := range []bool{true, false} {
		if err := c.SetPaused("pause", on); err != nil {
			t.Errorf("SetPaused(%v): %v", on, err)
		}
	}
	if _, err := Open(mapFD(fd), RingOptions{}, nil, nil, nil); !errors.Is(err, ErrMapInUse) {
		t.Errorf("Open of a map read: %v; want ErrMapInUse", err)
	}
	c.Close()
	if err := c.SetPaused("pause", true); !errors.Is(err, os.ErrClosed) {
		t.Errorf("SetPaused after Close: %v; want os.ErrClosed", err)
	}

	r, err := OpenRecorder(mapFD(fd), RingOptions{RingBytes: os.Getpagesize()}, nil, nil, nil)
	if err != nil {
		t.Fatalf("OpenRecorder after Close: %v", err)
	}
	recs, err := r.Snapshot(make([]byte, 4096), nil, false)
	if err != nil || len(recs) != 0 {
		t.Errorf("Snapshot of empty rings: %d records, %v", len(recs), err)
	}
	if st := r.Stats(); len(st) != len(online) {
		t.Errorf("Recorder Stats: %d entries, want %d", len(st), len(online))
	}
	r.Close()
}
