// SPDX-License-Identifier: Apache-2.0

// Package ledger checks the accounting of selftest/bpfbuffer's program
// (bpfbuffer.bpf.c, a PERFBUF_BUFFER), whichever loader loaded it: what
// the program saw, per CPU, against what a closed perfbuf reader reports.
// It needs no cgo, so that the libbpfgo selftests and the cilium/ebpf ones
// (which run without cgo too) check the same ledger.
package ledger

import (
	"encoding/binary"
	"slices"
	"testing"

	"github.com/perfbuf/perfbuf"
)

// Outcome mirrors bpfbuffer.bpf.c's struct outcome: what the program saw
// on one CPU.
type Outcome struct {
	Attempts, OK, Discarded, Full, NoSpc, NoEnt, Inval, Other uint64
}

func (o Outcome) add(p Outcome) Outcome {
	return Outcome{o.Attempts + p.Attempts, o.OK + p.OK, o.Discarded + p.Discarded, o.Full + p.Full,
		o.NoSpc + p.NoSpc, o.NoEnt + p.NoEnt, o.Inval + p.Inval, o.Other + p.Other}
}

// Check checks, once the reader is closed, that every attempt is accounted
// for, after TestBothKinds' script (2 reserves too big and 2 discards per
// CPU, at least 3 outputs without a ring, a full ring, records left at
// Close): per CPU for a perf event array, and for a ring buffer (ring) in
// its one ring's entry, which holds every CPU's failures, and in the sums.
// cpus are the CPUs the program ran on, out what it saw on each, delivered
// the samples the reader delivered by the CPU each says it was written on,
// stats the closed reader's Stats.
func Check(t testing.TB, ring bool, cpus []int, out map[int]Outcome, delivered map[int]uint64, stats perfbuf.Stats) {
	t.Helper()
	byCPU := map[int]perfbuf.Stats{}
	for _, s := range stats.Rings {
		if ring {
			// A ring buffer read alone: one entry, every CPU's failures
			// on it.
			if len(stats.Rings) != 1 || s.CPU != -1 {
				t.Fatalf("Stats %+v: want one ring, of cpu -1", stats)
			}
			continue
		}
		if _, dup := byCPU[s.CPU]; dup {
			t.Fatalf("Stats %+v: two entries for cpu %d", stats, s.CPU)
		}
		byCPU[s.CPU] = s
	}
	var sum Outcome
	for _, cpu := range cpus {
		o, st := out[cpu], byCPU[cpu]
		fl := st.Failed
		if o.OK+o.Discarded+o.Full+o.NoSpc+o.NoEnt+o.Inval+o.Other != o.Attempts || o.Other != 0 {
			t.Errorf("cpu %d: the program's counts do not add up: %+v", cpu, o)
		}
		// The failure map against what the helpers returned (a ring
		// buffer's: the sum, on the ring's entry, below).
		if !ring && (o.Full != 0 || fl.NoEntry != o.NoEnt || fl.Invalid != o.Inval || fl.TooBig+fl.NotOnCPU+fl.Other != 0) {
			t.Errorf("cpu %d: Failed %+v; the program saw full %d, noent %d, einval %d", cpu, fl, o.Full, o.NoEnt, o.Inval)
		}
		// A perf ring takes every discard (the record is built apart); a
		// ring buffer that every CPU fills may refuse a discard's reserve
		// as full, as on 8 CPUs.
		if o.Inval != 2 || o.NoEnt < 3 || !ring && o.Discarded != 2 {
			t.Errorf("cpu %d: %d reserves too big, %d outputs without a ring, %d discarded; want 2, at least 3, 2", cpu, o.Inval, o.NoEnt, o.Discarded)
		}
		if !ring {
			// A discarded perf record was never written: it is not an
			// output.
			if got := st.Samples + st.Lost + st.Left + fl.Total(); got != o.Attempts-o.Discarded || st.Lost != o.NoSpc || o.NoSpc == 0 {
				t.Errorf("cpu %d: attempted %d (discarded %d), Stats %+v; the program saw %d lost", cpu, o.Attempts, o.Discarded, st, o.NoSpc)
			}
			if delivered[cpu] != st.Samples || st.Samples+st.Left != o.OK {
				t.Errorf("cpu %d: delivered %d, Stats %+v; the program saw %+v", cpu, delivered[cpu], st, o)
			}
			t.Logf("cpu %d: attempted %d = discarded by the program %d + received %d + lost %d + left %d + failed %d (noent %d, einval %d, other %d)",
				cpu, o.Attempts, o.Discarded, st.Samples, st.Lost, st.Left, fl.Total(), fl.NoEntry, fl.Invalid, fl.Other)
		} else {
			t.Logf("cpu %d: attempted %d = submitted %d + discarded %d + full %d + failed %d (noent %d, einval %d)",
				cpu, o.Attempts, o.OK, o.Discarded, o.Full, o.NoEnt+o.Inval, o.NoEnt, o.Inval)
		}
		sum = sum.add(o)
	}
	// The sums: the whole ledger, for either kind.
	if got := stats.Samples + stats.Lost + stats.Discarded + stats.Left + stats.Failed.Total() + stats.NotRun; got != sum.Attempts-sumPerfDiscards(ring, sum) {
		t.Errorf("sums %+v: %d outputs accounted for; the program attempted %d (%+v)", stats, got, sum.Attempts, sum)
	}
	if !ring {
		return
	}
	st := stats.Rings[0]
	failed := st.Failed
	if st.Lost != sum.Full || failed.NoEntry != sum.NoEnt || failed.Invalid != sum.Inval || failed.TooBig+failed.NotOnCPU+failed.Other != 0 {
		t.Errorf("ring: Lost %d, Failed %+v; the program saw full %d, noent %d, einval %d", st.Lost, failed, sum.Full, sum.NoEnt, sum.Inval)
	}
	var all uint64
	for _, n := range delivered {
		all += n
	}
	if got := st.Samples + st.Lost + st.Discarded + st.Left + failed.Total(); got != sum.Attempts || sum.Full == 0 || sum.NoSpc != 0 {
		t.Errorf("attempted %d, ring %+v: the sum is %d", sum.Attempts, st, got)
	}
	if st.Samples != all || st.Samples+st.Left != sum.OK || st.Discarded != sum.Discarded || st.Left == 0 {
		t.Errorf("ring %+v, delivered %d; the program saw %+v", st, all, sum)
	}
	t.Logf("ring: attempted %d = delivered %d + lost (full) %d + discarded %d + left %d + failed %d (noent %d, einval %d, other %d)",
		sum.Attempts, st.Samples, st.Lost, st.Discarded, st.Left, failed.Total(), failed.NoEntry, failed.Invalid, failed.Other)
}

// sumPerfDiscards is what the ledger leaves out of the attempts: a perf
// event array's discards, which were never written.
func sumPerfDiscards(ring bool, o Outcome) uint64 {
	if ring {
		return 0
	}
	return o.Discarded
}

// Rings are the rings of an array of ring buffers, n CPUs a ring: Keys[i]
// is ring i's slot, which CPU c writes when c/N is it.
type Rings struct {
	N    int
	Keys []uint32
}

// NewRings returns the rings of an array of ring buffers over the
// possible CPUs, n CPUs a ring: a slot for each group that holds one.
func NewRings(possible []int, n int) Rings {
	r := Rings{N: n}
	for _, c := range possible {
		if k := uint32(c / n); !slices.Contains(r.Keys, k) {
			r.Keys = append(r.Keys, k)
		}
	}
	return r
}

// Of returns the index of the ring that cpu writes.
func (r Rings) Of(cpu int) int { return slices.Index(r.Keys, uint32(cpu/r.N)) }

// AnyRing is the ring of a sample delivered without one (perfbuf.New's
// sample function): the sample's CPU says which.
const AnyRing = -2

// RingCollector counts what a reader of an array of ring buffers
// delivered, by ring and by the CPU the sample says, and checks that each
// went to its CPU's ring.
type RingCollector struct {
	t     testing.TB
	rings Rings
	Got   map[int]uint64 // by CPU
	Ring  map[int]uint64 // by ring
}

// NewRingCollector returns a collector of samples read from rings.
func NewRingCollector(t testing.TB, rings Rings) *RingCollector {
	return &RingCollector{t: t, rings: rings, Got: map[int]uint64{}, Ring: map[int]uint64{}}
}

// Sample counts a sample read from ring (AnyRing: the sample's CPU's),
// delivered for recCPU, which a ring buffer's record says is -1.
func (c *RingCollector) Sample(ring, recCPU int, data []byte) {
	if len(data) < 16 {
		c.t.Errorf("%d-byte sample", len(data))
		return
	}
	cpu := int(binary.NativeEndian.Uint32(data[8:]))
	if recCPU != -1 {
		c.t.Errorf("a ring buffer's record delivered for cpu %d, want -1", recCPU)
	}
	if want := c.rings.Of(cpu); ring == AnyRing {
		ring = want
	} else if ring != want {
		c.t.Errorf("a sample written on cpu %d read from ring %d, want its ring %d", cpu, ring, want)
	}
	c.Got[cpu]++
	c.Ring[ring]++
}

// CheckRings checks, once the reader of an array of ring buffers is
// closed, that every attempt is accounted for, per ring, with the
// failures of the CPUs that write it, after TestRingPerCPU's script (on
// each CPU 2 reserves too big and 3 outputs to an empty map-in-map slot;
// the slot emptied, 3 outputs and 2 reserves of its CPUs; the first CPU's
// ring filled; records left at Close): attempted == delivered + discarded
// + left + the CPUs' failures. cpus are the CPUs the program ran on (the
// first one's ring filled), out what it saw on each, c what the reader
// delivered, stats the closed reader's Stats.
func CheckRings(t testing.TB, rings Rings, cpus []int, out map[int]Outcome, c *RingCollector, stats perfbuf.Stats, emptied uint32) {
	t.Helper()
	if len(stats.Rings) != len(rings.Keys) {
		t.Fatalf("Stats %+v: %d rings, want %d", stats, len(stats.Rings), len(rings.Keys))
	}
	for i, s := range stats.Rings {
		if s.CPU != -1 {
			t.Errorf("ring %d: cpu %d, want -1 (a ring of %d CPUs)", i, s.CPU, rings.N)
		}
	}
	// The failures of CPUs that share rings are no ring's: they are in
	// the sums (one ring alone holds them too), checked against the
	// CPUs' below; each ring is checked against its CPUs' counts.
	alone := len(stats.Rings) == 1
	var want perfbuf.Failures
	var wantLost uint64
	type sum struct{ attempts, ok, discarded, full, failed, noent uint64 }
	by := map[int]*sum{}
	for _, cpu := range cpus {
		o := out[cpu]
		if o.OK+o.Discarded+o.Full+o.NoSpc+o.NoEnt+o.Inval+o.Other != o.Attempts || o.Other != 0 || o.NoSpc != 0 {
			t.Errorf("cpu %d: the program's counts do not add up: %+v", cpu, o)
		}
		// 3 to the other map's empty slot, and, for the CPUs of the ring
		// whose slot was emptied, 3 outputs and 2 reserves: the program
		// counts a reserve that gets nothing as full, which the failure
		// map tells apart.
		wantNoEnt, reserves := uint64(3), uint64(0)
		if uint32(cpu/rings.N) == emptied {
			wantNoEnt, reserves = 3+3, 2
		}
		if o.Inval != 2 || o.NoEnt != wantNoEnt || c.Got[cpu] == 0 {
			t.Errorf("cpu %d: einval %d, noent %d, delivered %d; want 2, %d, some", cpu, o.Inval, o.NoEnt, c.Got[cpu], wantNoEnt)
		}
		full, noent := o.Full-reserves, o.NoEnt+reserves
		want.NoEntry += noent
		want.Invalid += o.Inval
		wantLost += full
		i := rings.Of(cpu)
		if by[i] == nil {
			by[i] = &sum{}
		}
		s := by[i]
		s.attempts += o.Attempts
		s.ok += o.OK
		s.discarded += o.Discarded
		s.full += full
		s.failed += noent + o.Inval
		s.noent += noent
	}
	if stats.Failed != want || stats.Lost != wantLost {
		t.Errorf("sums: Failed %+v, Lost %d; the CPUs saw %+v and %d full", stats.Failed, stats.Lost, want, wantLost)
	}
	if alone && (stats.Rings[0].Failed != want || stats.Rings[0].Lost != wantLost) {
		t.Errorf("ring 0 alone: Failed %+v, Lost %d; its CPUs saw %+v and %d full", stats.Rings[0].Failed, stats.Rings[0].Lost, want, wantLost)
	}
	first := rings.Of(cpus[0])
	var attempts uint64
	for i, s := range by {
		st := stats.Rings[i]
		attempts += s.attempts
		if got := st.Samples + st.Discarded + st.Left + s.full + s.failed; got != s.attempts {
			t.Errorf("ring %d: attempted %d, Stats %+v, its CPUs' full %d and failed %d: the sum is %d", i, s.attempts, st, s.full, s.failed, got)
		}
		if st.Samples != c.Ring[i] || st.Samples+st.Left != s.ok || st.Discarded != s.discarded || st.Corrupt != 0 {
			t.Errorf("ring %d: Stats %+v, delivered %d; its CPUs saw %+v", i, st, c.Ring[i], *s)
		}
		// Only the ring filled refused records.
		if (s.full != 0) != (i == first) || st.Left == 0 {
			t.Errorf("ring %d: %d refused as full, %d left; want refusals in ring %d only, some left", i, s.full, st.Left, first)
		}
		t.Logf("ring %d (slot %d): attempted %d = delivered %d + discarded %d + left %d + full %d + failed %d (noent %d)",
			i, rings.Keys[i], s.attempts, st.Samples, st.Discarded, st.Left, s.full, s.failed, s.noent)
	}
	if got := stats.Samples + stats.Lost + stats.Discarded + stats.Left + stats.Failed.Total() + stats.NotRun; got != attempts {
		t.Errorf("sums %+v: %d outputs accounted for; the program attempted %d", stats, got, attempts)
	}
}
