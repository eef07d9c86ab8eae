// SPDX-License-Identifier: Apache-2.0

package owner

import (
	"errors"
	"syscall"
	"testing"

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
