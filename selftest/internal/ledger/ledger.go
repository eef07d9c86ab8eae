// SPDX-License-Identifier: Apache-2.0

// Package ledger checks the accounting of selftest/bpfbuffer's program
// (bpfbuffer.bpf.c, a PERFBUF_BUFFER), whichever loader loaded it: what
// the program saw, per CPU, against what a closed perfbuf reader reports.
// It needs no cgo, so that the libbpfgo selftests and the cilium/ebpf ones
// (which run without cgo too) check the same ledger.
package ledger

import (
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
// Close): per CPU for a perf event array, per ring (the CPUs' failures
// summed) for a ring buffer (ring). cpus are the CPUs the program ran on,
// out what it saw on each, delivered the samples the reader delivered by
// the CPU each says it was written on, stats the closed reader's Stats.
func Check(t testing.TB, ring bool, cpus []int, out map[int]Outcome, delivered map[int]uint64, stats []perfbuf.Stats) {
	t.Helper()
	byCPU := map[int]perfbuf.Stats{}
	var rb *perfbuf.Stats
	for i, s := range stats {
		if ring && s.Ring >= 0 {
			if rb != nil || s.CPU != -1 {
				t.Fatalf("Stats %+v: want one ring, of cpu -1", stats)
			}
			rb = &stats[i]
			continue
		}
		if _, dup := byCPU[s.CPU]; dup {
			t.Fatalf("Stats %+v: two entries for cpu %d", stats, s.CPU)
		}
		byCPU[s.CPU] = s
	}
	var sum Outcome
	var failed perfbuf.Failures
	for _, cpu := range cpus {
		o, st := out[cpu], byCPU[cpu]
		fl := st.Failed
		if o.OK+o.Discarded+o.Full+o.NoSpc+o.NoEnt+o.Inval+o.Other != o.Attempts || o.Other != 0 {
			t.Errorf("cpu %d: the program's counts do not add up: %+v", cpu, o)
		}
		// The failure map against what the helpers returned.
		if fl.Full != o.Full || fl.NoEntry != o.NoEnt || fl.Invalid != o.Inval || fl.TooBig+fl.NotOnCPU+fl.Other != 0 {
			t.Errorf("cpu %d: Failed %+v; the program saw full %d, noent %d, einval %d", cpu, fl, o.Full, o.NoEnt, o.Inval)
		}
		if o.Inval != 2 || o.NoEnt < 3 || o.Discarded != 2 {
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
			t.Logf("cpu %d: attempted %d = discarded by the program %d + received %d + lost %d + left %d + failed %d (full %d, noent %d, einval %d, other %d)",
				cpu, o.Attempts, o.Discarded, st.Samples, st.Lost, st.Left, fl.Total(), fl.Full, fl.NoEntry, fl.Invalid, fl.Other)
		} else {
			if st.Ring != -1 && fl.Total() > 0 {
				t.Errorf("cpu %d: failures on entry %+v, want one of Ring -1", cpu, st)
			}
			t.Logf("cpu %d: attempted %d = submitted %d + discarded %d + failed %d (full %d, noent %d, einval %d, other %d)",
				cpu, o.Attempts, o.OK, o.Discarded, fl.Total(), fl.Full, fl.NoEntry, fl.Invalid, fl.Other)
		}
		sum = sum.add(o)
		failed = perfbuf.Failures{NoEntry: failed.NoEntry + fl.NoEntry, Invalid: failed.Invalid + fl.Invalid,
			Other: failed.Other + fl.Other, Full: failed.Full + fl.Full}
	}
	if !ring {
		return
	}
	if rb == nil {
		t.Fatalf("Stats %+v: no ring", stats)
	}
	var all uint64
	for _, n := range delivered {
		all += n
	}
	st := *rb
	if got := st.Samples + st.Discarded + st.Left + failed.Total(); got != sum.Attempts || sum.Full == 0 || sum.NoSpc != 0 {
		t.Errorf("attempted %d, ring %+v, failed %+v: the sum is %d", sum.Attempts, st, failed, got)
	}
	if st.Samples != all || st.Samples+st.Left != sum.OK || st.Discarded != sum.Discarded || st.Left == 0 || st.Lost != 0 {
		t.Errorf("ring %+v, delivered %d; the program saw %+v", st, all, sum)
	}
	t.Logf("ring: attempted %d = delivered %d + discarded %d + left %d + failed %d (full %d, noent %d, einval %d, other %d)",
		sum.Attempts, st.Samples, st.Discarded, st.Left, failed.Total(), failed.Full, failed.NoEntry, failed.Invalid, failed.Other)
}
