// SPDX-License-Identifier: Apache-2.0

package ciliumbuffer

import (
	"errors"
	"runtime"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/perfbuf/perfbuf"
	"github.com/perfbuf/perfbuf/bpfbuffer/ciliumbuffer"
	"golang.org/x/sys/unix"
)

// collecting is a perfbuf.Map that, asked for its descriptor, first
// collects the garbage until the descriptor watch is closed (at most 100
// times), and then gives its number to another map, taker: a garbage
// collection, and another map opened, between NewReader's look at one map
// and its duplicate of it.
type collecting struct {
	perfbuf.Map
	t      *testing.T
	watch  int
	taker  *ebpf.Map
	closed *bool
}

func (c collecting) FileDescriptor() int {
	for range 100 {
		runtime.GC()
		if _, err := unix.FcntlInt(uintptr(c.watch), unix.F_GETFD, 0); errors.Is(err, unix.EBADF) {
			*c.closed = true
			if err := unix.Dup3(c.taker.FD(), c.watch, unix.O_CLOEXEC); err != nil {
				c.t.Fatal(err)
			}
			break
		}
	}
	return c.Map.FileDescriptor()
}

// A *ebpf.Map referenced by nothing but its ciliumbuffer.Map, passed to
// NewReader: the garbage collector may close its descriptor during the
// call, and another map take the number, before NewReader duplicates it.
// NewReader never reads that other map: it keeps the maps it is given
// reachable until it holds duplicates of their descriptors (runtime.KeepAlive
// in owner.Open), so the collector cannot close them during the call, and the
// Reader it returns reads the right maps. Without the KeepAlive, NewReader
// failed with EBADF here.
func TestMapCollectedDuringNewReader(t *testing.T) {
	privileged(t, nil)
	ring := func() *ebpf.Map {
		m, err := ebpf.NewMap(&ebpf.MapSpec{Type: ebpf.RingBuf, MaxEntries: uint32(unix.Getpagesize())})
		if err != nil {
			privileged(t, err)
			t.Fatal(err)
		}
		return m
	}
	first, second, taker := ring(), ring(), ring()
	defer second.Close()
	defer taker.Close()
	info, err := first.Info()
	if err != nil {
		t.Fatal(err)
	}
	firstID, _ := info.ID()
	fd := first.FD()
	m := ciliumbuffer.Map(first)
	first = nil // m is all that references it
	var closed bool
	r, err := perfbuf.NewReader(m, perfbuf.ReaderOptions{
		Options: perfbuf.Options{
			Maps: []perfbuf.Map{
				collecting{Map: ciliumbuffer.Map(second), t: t, watch: fd, taker: taker, closed: &closed}},
		},
	})
	if closed {
		defer unix.Close(fd) // the taker's duplicate
	}
	switch {
	case err == nil:
		defer r.Close()
		if closed {
			t.Fatalf("NewReader read on after the map's descriptor was closed under it, and another map given its number")
		}
		// The first ring is the first map, by ID.
		if st := r.Stats(); len(st.Rings) != 2 {
			t.Fatalf("Stats %+v: want 2 rings", st)
		}
		t.Logf("NewReader kept the map reachable: %d garbage collections left descriptor %d (map %d) open", 100, fd, firstID)
	default:
		t.Fatalf("NewReader: %v (descriptor closed during the call: %v)", err, closed)
	}
}
