// SPDX-License-Identifier: Apache-2.0

package bpfbuffer

// A corrupt ring in an array of ring buffers (issue 30, item 9): one ring's
// consumer position written where the kernel never puts it, through a
// second mapping of its consumer page (the one page of a ring buffer that
// user space may write, as any process with the map's descriptor can).

import (
	"errors"
	"fmt"
	"os"
	"sync/atomic"
	"testing"
	"unsafe"

	"github.com/perfbuf/perfbuf"
	"golang.org/x/sys/unix"
)

// With a ring per CPU, and per 2 CPUs, the last CPU's ring gets a
// consumer position that cannot be valid, while every ring holds records,
// after the reader opened or before (a pinned ring opened again may hold
// one): the Reader reports one *CorruptError naming that ring (one found
// at opening was named ring 0, whichever ring it was, before the fix of
// Cursor.SetIndex), counts it on that ring only, and goes on:
// every other ring's records all arrive, and the
// corrupt ring's records written after the skip arrive too, all of them
// (the skip goes to the producer's position: the records before it are
// skipped, not counted as samples).
func TestRingPerCPUCorrupt(t *testing.T) {
	cases := []struct {
		name    string
		consume func(cons, prod uint64) uint64
	}{
		{"consumer unaligned", func(cons, _ uint64) uint64 { return cons + 4 }},
		{"consumer past producer", func(_, prod uint64) uint64 { return prod + 64 }},
		{"consumer a ring behind", func(cons, _ uint64) uint64 { return cons - 1<<20 }},
	}
	for _, n := range []int{1, 2} {
		for _, tc := range cases {
			for _, atOpen := range []bool{false, true} {
				when := "while reading"
				if atOpen {
					when = "before the reader opens" // as a pinned ring opened again may be
				}
				t.Run(fmt.Sprintf("%d CPUs a ring/%s/%s", n, tc.name, when), func(t *testing.T) {
					testRingPerCPUCorrupt(t, n, tc.consume, atOpen)
				})
			}
		}
	}
}

// testRingPerCPUCorrupt is a case of TestRingPerCPUCorrupt: n CPUs a ring,
// the last CPU's ring's consumer position set by to, before the reader
// opens (atOpen) or after.
func testRingPerCPUCorrupt(t *testing.T, n int, to func(cons, prod uint64) uint64, atOpen bool) {
	p := setupPerCPU(t, n)
	f := p.fixture
	bad := p.Of(f.cpus[len(f.cpus)-1]) // not ring 0 where there are two
	var r *perfbuf.Reader
	if !atOpen {
		r = newReader(t, p)
	}
	got := map[int]uint64{} // samples delivered, by ring
	var corrupt []*perfbuf.CorruptError
	consume := func() {
		t.Helper()
		for range 10 {
			_, err := r.Consume(func(rec *perfbuf.Record) error {
				got[rec.Ring]++
				return nil
			})
			var ce *perfbuf.CorruptError
			switch {
			case err == nil:
				return
			case errors.As(err, &ce):
				corrupt = append(corrupt, ce)
			default:
				t.Fatal(err)
			}
		}
		t.Fatal("Consume still failing after 10 calls")
	}
	for _, cpu := range f.cpus {
		f.produce(t, cpu, 4, 48, viaOutput, 1)
	}
	setConsumer(t, p.ring(bad).FileDescriptor(), to)
	if atOpen {
		r = newReader(t, p)
	}
	consume()
	for _, cpu := range f.cpus {
		f.produce(t, cpu, 3, 48, viaOutput, 1)
	}
	consume()
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	if len(corrupt) != 1 || corrupt[0].Ring != bad {
		t.Fatalf("corruptions reported: %v; want one, of ring %d", corrupt, bad)
	}
	t.Logf("reported: %v", corrupt[0])
	perRing := map[int]uint64{}
	for _, cpu := range f.cpus {
		perRing[p.Of(cpu)] += 7
	}
	stats := r.Stats()
	if stats.Corrupt != 1 {
		t.Errorf("sums %+v: %d corruptions, want 1", stats, stats.Corrupt)
	}
	for i, st := range stats.Rings {
		switch {
		case st.Samples != got[i]:
			t.Errorf("ring %d: delivered %d, Stats %+v", i, got[i], st)
		case i == bad && (st.Corrupt != 1 || got[i] != perRing[i]/7*3):
			// The skip passed over the 4 records of each CPU
			// (to the producer's position), the 3 after it came.
			t.Errorf("ring %d (corrupt): delivered %d of %d, Stats %+v; want the %d after the skip, one corruption", i, got[i], perRing[i], st, perRing[i]/7*3)
		case i != bad && (st.Corrupt != 0 || got[i] != perRing[i]):
			t.Errorf("ring %d: delivered %d of %d, Stats %+v; want all, no corruption", i, got[i], perRing[i], st)
		}
	}
}

// setConsumer writes to(consumer_pos, producer_pos) into the consumer
// position of the ring buffer map fd, through a mapping of its own: the
// consumer page read-write at offset 0, the producer page read-only after
// it (kernel/bpf/ringbuf.c's ringbuf_map_mmap_kern).
func setConsumer(t *testing.T, fd int, to func(cons, prod uint64) uint64) {
	t.Helper()
	page := os.Getpagesize()
	cons, err := unix.Mmap(fd, 0, page, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(cons)
	prod, err := unix.Mmap(fd, int64(page), page, unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(prod)
	// The reader is not reading (the test's goroutine is), and the
	// program runs only when the test runs it: plain atomics suffice.
	c, pr := (*uint64)(unsafe.Pointer(&cons[0])), (*uint64)(unsafe.Pointer(&prod[0]))
	atomic.StoreUint64(c, to(atomic.LoadUint64(c), atomic.LoadUint64(pr)))
}
