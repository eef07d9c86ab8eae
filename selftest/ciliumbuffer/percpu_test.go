// SPDX-License-Identifier: Apache-2.0

package ciliumbuffer

// The array of ring buffers on cilium/ebpf's loader
// (ciliumbuffer.RingBufPerCPU): the rings made by ebpf.NewCollection from
// the specs Prepare added, in their slots when it returns, read through
// ciliumbuffer.Maps with every attempt accounted for per ring, the same
// ledger as selftest/bpfbuffer's.

import (
	"fmt"
	"os"
	"slices"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/perfbuf/perfbuf"
	"github.com/perfbuf/perfbuf/bpfbuffer/ciliumbuffer"
	"github.com/perfbuf/perfbuf/internal/cpus"
	"github.com/perfbuf/perfbuf/selftest/internal/ledger"
)

// A ring per CPU, and per 2 CPUs, on each CPU: outputs and reserves that
// reach its ring, discards, reserves above the buffer's max sample
// (einval), outputs to a missing inner ring buffer of another map (noent),
// outputs while the CPU's slot is empty (noent), a full ring (full, and
// only that ring's CPUs refused), and records left at Close. Per ring:
// attempted == delivered + discarded + left + the CPUs' failures. Any
// makes the same ring per CPU on a kernel that takes ring buffers in an
// array of maps (5.10 and later, as every kernel these tests run on).
func TestRingPerCPU(t *testing.T) {
	page := os.Getpagesize()
	possible, err := cpus.Possible()
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		want ciliumbuffer.Kind
		n    int
	}{{ciliumbuffer.RingBufPerCPU, 1}, {ciliumbuffer.RingBufPerCPU, 2}, {ciliumbuffer.Any, 1}} {
		n := c.n
		t.Run(fmt.Sprintf("%v, %d CPUs a ring", c.want, n), func(t *testing.T) {
			opts := perfbuf.Options{RingBytes: page}
			var more []ciliumbuffer.Option
			if c.want == ciliumbuffer.RingBufPerCPU {
				more = append(more, ciliumbuffer.CPUsPerRing(n))
			}
			f := setup(t, c.want, &opts, more...)
			if f.kind != ciliumbuffer.RingBufPerCPU || opts.RingBytes != 0 {
				t.Fatalf("Prepare(%v) chose %v, left RingBytes %d; want %v, RingBytes cleared", c.want, f.kind, opts.RingBytes, ciliumbuffer.RingBufPerCPU)
			}
			rings := ledger.NewRings(possible, n)
			events := f.coll.Maps["events"]
			if last := rings.Keys[len(rings.Keys)-1]; events.Type() != ebpf.ArrayOfMaps || events.MaxEntries() != last+1 {
				t.Fatalf("events: %v of %d slots, want an array of maps of %d", events.Type(), events.MaxEntries(), last+1)
			}
			m, ropts, err := ciliumbuffer.Maps(f.coll, "events", opts)
			if err != nil {
				t.Fatal(err)
			}
			if ropts.FailureMap == nil || len(ropts.Maps) != len(rings.Keys)-1 {
				t.Fatalf("Maps: %d further rings, failure map %v; want %d, events_failures", len(ropts.Maps), ropts.FailureMap, len(rings.Keys)-1)
			}
			// Each slot holds the collection's ring of its name, of a
			// page, which Maps handed over in slot order.
			ring := func(i int) perfbuf.Map {
				if i == 0 {
					return m
				}
				return ropts.Maps[i-1]
			}
			for i, k := range rings.Keys {
				name := fmt.Sprintf("events_%d", k)
				rm := f.coll.Maps[name]
				if rm == nil {
					t.Fatalf("no ring %s in the collection", name)
				}
				info, err := rm.Info()
				if err != nil {
					t.Fatal(err)
				}
				id, _ := info.ID()
				var inSlot ebpf.MapID
				if err := events.Lookup(k, &inSlot); err != nil || inSlot != id || info.Type != ebpf.RingBuf || int(info.MaxEntries) != page {
					t.Errorf("slot %d holds map %d (%v); %s is %v %d of %d bytes, want that ring buffer, of a page", k, inSlot, err, name, info.Type, id, info.MaxEntries)
				}
				if ring(i).FileDescriptor() != rm.FD() {
					t.Errorf("ring %d of Maps is descriptor %d, want %s's %d", i, ring(i).FileDescriptor(), name, rm.FD())
				}
			}

			r, err := perfbuf.NewReader(m, perfbuf.ReaderOptions{Options: ropts})
			if err != nil {
				t.Fatal(err)
			}
			defer r.Close()
			c := ledger.NewRingCollector(t, rings)
			consume := func() {
				t.Helper()
				if _, err := r.Consume(func(rec *perfbuf.Record) error {
					if rec.Type == perfbuf.RecordSample {
						c.Sample(rec.Ring, rec.CPU, rec.AppendTo(nil))
					}
					return nil
				}); err != nil {
					t.Fatal(err)
				}
			}
			for _, cpu := range f.cpus {
				f.produce(t, cpu, 5, 48, viaOutput, 1)
				f.produce(t, cpu, 5, 32, viaReserve, 1)
				f.produce(t, cpu, 4, 200, viaReserve, 1) // 256-byte reserves
				f.produce(t, cpu, 8, 32, viaDiscard, 4)  // 2 discarded
				f.produce(t, cpu, 2, 32, viaTooBig, 1)
				f.produce(t, cpu, 3, 48, viaInner, 1)
			}
			consume()

			// The first CPU's slot emptied: its outputs and reserves (and
			// those of the CPUs sharing its ring) fail as noent, the
			// others' go on. The slot is filled again with its ring.
			first := f.cpus[0]
			emptied := rings.Keys[rings.Of(first)]
			if err := events.Delete(emptied); err != nil {
				t.Fatal(err)
			}
			for _, cpu := range f.cpus {
				f.produce(t, cpu, 3, 48, viaOutput, 1)
				f.produce(t, cpu, 2, 32, viaReserve, 1)
			}
			if err := events.Put(emptied, f.coll.Maps[fmt.Sprintf("events_%d", emptied)]); err != nil {
				t.Fatal(err)
			}
			consume()

			// The first CPU's ring full: 40 records of 200 bytes into one
			// page (a larger page, as many more), not read. Only the CPUs
			// of that ring are refused.
			f.produce(t, first, 40*uint64(page/4096), 200, viaOutput, 1)
			for _, cpu := range f.cpus {
				f.produce(t, cpu, 3, 48, viaOutput, 1) // left at Close, or full
			}
			if err := r.Close(); err != nil {
				t.Fatal(err)
			}
			ledger.CheckRings(t, rings, f.cpus, f.outcomes(t), c, r.Stats(), emptied)
		})
	}
}

// Each collection made from one prepared spec has rings of its own, and
// a spec prepared again as a shared ring buffer loses them; Maps of a
// buffer that is not an array gives the map itself.
func TestRingPerCPUCollections(t *testing.T) {
	page := os.Getpagesize()
	s := spec(t)
	opts := perfbuf.Options{RingBytes: 2 * page}
	if _, err := ciliumbuffer.Prepare(s, "events", ciliumbuffer.RingBufPerCPU, &opts); err != nil {
		t.Fatal(err)
	}
	ids := func(coll *ebpf.Collection) []ebpf.MapID {
		m, ropts, err := ciliumbuffer.Maps(coll, "events", opts)
		if err != nil {
			t.Fatal(err)
		}
		fds := []int{m.FileDescriptor()}
		for _, rm := range ropts.Maps {
			fds = append(fds, rm.FileDescriptor())
		}
		var out []ebpf.MapID
		for _, em := range coll.Maps {
			if !slices.Contains(fds, em.FD()) {
				continue
			}
			info, err := em.Info()
			if err != nil {
				t.Fatal(err)
			}
			id, _ := info.ID()
			out = append(out, id)
		}
		if len(out) != len(fds) {
			t.Fatalf("Maps handed over %d rings, %d of them the collection's", len(fds), len(out))
		}
		return out
	}
	a, b := ids(load(t, s)), ids(load(t, s))
	for _, id := range a {
		if slices.Contains(b, id) {
			t.Errorf("two collections share ring %d: %v, %v", id, a, b)
		}
	}
	if _, err := ciliumbuffer.Prepare(s, "events", ciliumbuffer.RingBuf, &perfbuf.Options{RingBytes: page}); err != nil {
		t.Fatal(err)
	}
	for name, ms := range s.Maps {
		if ms.Type == ebpf.RingBuf && name != "events" && name != "inner_rb" {
			t.Errorf("ring %q left in the spec prepared as a shared ring buffer", name)
		}
	}
	coll := load(t, s)
	m, ropts, err := ciliumbuffer.Maps(coll, "events", perfbuf.Options{})
	if err != nil || m.FileDescriptor() != coll.Maps["events"].FD() || len(ropts.Maps) != 0 || ropts.FailureMap == nil {
		t.Errorf("Maps of a shared ring buffer = %v, %+v, %v; want the map, its failure map", m, ropts, err)
	}
}
