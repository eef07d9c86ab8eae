// SPDX-License-Identifier: Apache-2.0

package ciliumbuffer

// Reopening the pinned rings of an array of ring buffers made by
// cilium/ebpf's loader (issue 30, item 7).

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/perfbuf/perfbuf"
	"github.com/perfbuf/perfbuf/bpfbuffer/ciliumbuffer"
	"github.com/perfbuf/perfbuf/internal/cpus"
	"github.com/perfbuf/perfbuf/selftest/internal/ledger"
	"github.com/perfbuf/perfbuf/selftest/internal/pins"
)

// A ring per CPU, each ring and the failure map pinned with cilium/ebpf's
// Pin (the rings themselves, not the array: a Reader given them needs no
// CAP_SYS_ADMIN). A Reader reads half of what every CPU wrote and closes;
// another, opened from the pins, finds in each ring what the first left
// there (Stats.Found) and delivers it: every sample once, by one of the
// two, and nothing left.
func TestReopenPinnedRings(t *testing.T) {
	possible, err := cpus.Possible()
	if err != nil {
		t.Fatal(err)
	}
	opts := perfbuf.Options{RingBytes: 4 * os.Getpagesize()}
	f := setup(t, ciliumbuffer.RingBufPerCPU, &opts, ciliumbuffer.CPUsPerRing(1))
	rings := ledger.NewRings(possible, 1)
	m, ropts, err := ciliumbuffer.Maps(f.coll, "events", opts)
	if err != nil {
		t.Fatal(err)
	}
	dir := pins.Dir(t)
	var paths []string
	for _, k := range rings.Keys {
		path := filepath.Join(dir, fmt.Sprintf("events_%d", k))
		if err := f.coll.Maps[fmt.Sprintf("events_%d", k)].Pin(path); err != nil {
			t.Fatal(err)
		}
		paths = append(paths, path)
	}
	if err := f.coll.Maps["events_failures"].Pin(filepath.Join(dir, "events_failures")); err != nil {
		t.Fatal(err)
	}

	delivered := map[[2]uint64]int{} // by CPU and sequence number
	read := func(r *perfbuf.Reader, n int) (got int) {
		t.Helper()
		r.SetDeadline(time.Now().Add(10 * time.Second))
		if n < 0 {
			r.Flush()
		}
		var s perfbuf.Sample
		for n < 0 || got < n {
			err := r.ReadInto(&s)
			if n < 0 && errors.Is(err, perfbuf.ErrFlushed) {
				return got
			}
			if err != nil {
				t.Fatal(err)
			}
			delivered[[2]uint64{uint64(binary.NativeEndian.Uint32(s.Data[8:])), binary.NativeEndian.Uint64(s.Data)}]++
			got++
		}
		return got
	}

	r1, err := perfbuf.NewReader(m, perfbuf.ReaderOptions{Options: ropts})
	if err != nil {
		t.Fatal(err)
	}
	defer r1.Close()
	const each = 12
	for _, cpu := range f.cpus {
		f.produce(t, cpu, each, 48, viaOutput, 1)
	}
	got1 := read(r1, each*len(f.cpus)/2)
	if err := r1.Close(); err != nil {
		t.Fatal(err)
	}
	st1 := r1.Stats()

	var fds []perfbuf.Map
	for _, path := range paths {
		rm, err := ebpf.LoadPinnedMap(path, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer rm.Close()
		fds = append(fds, perfbuf.MapFD(rm.FD()))
	}
	failures, err := ebpf.LoadPinnedMap(filepath.Join(dir, "events_failures"), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer failures.Close()
	r2, err := perfbuf.NewReader(fds[0], perfbuf.ReaderOptions{Options: perfbuf.Options{Maps: fds[1:], FailureMap: perfbuf.MapFD(failures.FD())}})
	if err != nil {
		t.Fatal(err)
	}
	defer r2.Close()
	opened := r2.Stats()
	if len(opened.Rings) != len(st1.Rings) {
		t.Fatalf("the second reader: %d rings, the first %d", len(opened.Rings), len(st1.Rings))
	}
	for i, e := range opened.Rings {
		if e.Found != st1.Rings[i].Left {
			t.Errorf("ring %d: found %d, the first reader left %d", i, e.Found, st1.Rings[i].Left)
		}
	}
	got2 := read(r2, -1)
	if err := r2.Close(); err != nil {
		t.Fatal(err)
	}
	st2 := r2.Stats()
	left, found := st2.Left, st2.Found
	want := each * len(f.cpus)
	if got1+got2 != want || len(delivered) != want || uint64(got2) != found || left != 0 {
		t.Errorf("delivered %d then %d (%d different) of %d; the second found %d, left %d", got1, got2, len(delivered), want, found, left)
	}
	for key, n := range delivered {
		if n != 1 {
			t.Errorf("cpu %d sample %d delivered %d times", key[0], key[1], n)
		}
	}
	t.Logf("%d rings: %d samples = %d by the first reader + %d found and delivered by the second", len(paths), want, got1, got2)
}
