// SPDX-License-Identifier: Apache-2.0

package crossproc

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/perfbuf/perfbuf/bpfbuffer/ciliumbuffer"
	"github.com/perfbuf/perfbuf/internal/owner"
)

// perfRecord and ringRecord are the ring space one size-byte output takes:
// a perf record (header, u32 size, data padded so that records stay 8-byte
// aligned) and a ring buffer record (8-byte header, data rounded up to 8).
const (
	perfRecord = 8 + 4 + (size+4+7)&^7 - 4
	ringRecord = 8 + (size+7)&^7
)

// check accounts, per CPU, for every output the program made, against the
// readers' logs, their Stats at Close and the failure map:
//
//	ring buffer: attempted == delivered + the last reader's Left + failed
//	perf array:  attempted == delivered + Σ Lost + Σ Left + failed
//	             (+ what a killed reader's rings held)
//
// where delivered is the union of the logs, each seq once. A sample is
// logged twice only when a killed reader logged it without committing it:
// then the killed reader's last samples are the next reader's first ones,
// in the same order, no more than it delivered since its last commit can
// be. A perf ring is its reader's own: nothing is delivered
// twice, and what a killed reader's rings held is lost with them (at most
// a ring of samples a CPU). Each reader delivers a CPU's samples in
// increasing seq.
func (f *fixture) check(t *testing.T, readers []*agent) {
	t.Helper()
	perf := f.kind == ciliumbuffer.PerfEventArray
	out := f.outcomes(t)
	var fails []mapFailures
	if err := f.coll.Maps["events_failures"].Lookup(uint32(0), &fails); err != nil {
		t.Fatal(err)
	}
	failed := map[int]mapFailures{}
	for k, cpu := range f.possible {
		failed[cpu] = fails[k]
	}

	logs := make([][]entry, len(readers))
	for i, r := range readers {
		logs[i] = r.entries(t)
		last := map[int]uint64{}
		for _, e := range logs[i] {
			if prev, ok := last[e.cpu]; ok && e.seq <= prev {
				t.Errorf("%s delivered cpu %d's seq %d after %d", r.Name, e.cpu, e.seq, prev)
			}
			last[e.cpu] = e.seq
		}
		if r.killed {
			continue
		}
		if st := r.stats; st.Corrupt != 0 || st.Found != 0 && perf {
			t.Errorf("%s: Stats %+v: corrupt or found records", r.Name, st)
		}
		if samples := r.stats.Samples; samples != uint64(len(logs[i])) {
			t.Errorf("%s: Stats say %d samples delivered, its log %d", r.Name, samples, len(logs[i]))
		}
	}

	// Who logged each (cpu, seq); the duplicates only as a killed
	// reader's tail, which the next reader delivered first.
	by := map[entry][]int{}
	for i, l := range logs {
		for _, e := range l {
			by[e] = append(by[e], i)
		}
	}
	if !perf {
		// One reader of a ring buffer at a time: what a reader delivered
		// comes, for each CPU, after all that the readers before it
		// delivered, bar a killed reader's tail delivered again.
		upTo := map[int]uint64{} // the largest seq delivered, by CPU
		for i, l := range logs {
			for _, e := range l {
				if m, ok := upTo[e.cpu]; ok && e.seq <= m && by[e][0] == i {
					t.Errorf("%s delivered cpu %d's seq %d, after a reader before it delivered seq %d", readers[i].Name, e.cpu, e.seq, m)
					break
				}
			}
			for _, e := range l {
				if m, ok := upTo[e.cpu]; !ok || e.seq > m {
					upTo[e.cpu] = e.seq
				}
			}
		}
	}
	twice := map[int]int{} // by the killed reader's index: samples delivered again
	for e, rs := range by {
		if len(rs) == 1 {
			continue
		}
		if len(rs) != 2 || rs[1] != rs[0]+1 || !readers[rs[0]].killed || perf {
			t.Errorf("cpu %d seq %d delivered by %v", e.cpu, e.seq, rs)
			continue
		}
		twice[rs[0]]++
	}
	for i, n := range twice {
		// What a reader delivered since its last commit: a Reader
		// commits at the end of a turn, at most a quarter of the ring
		// (the record it was delivering too); callback mode at the end
		// of a drain, up to the whole ring; an ordered Reader up to its
		// oldest copy not delivered, which lies at most a ring behind
		// its cursor (docs/failures.md).
		limit := f.ringSize/4 + ringRecord
		if f.mode == "callback" || f.mode == "ordered" {
			limit = f.ringSize
		}
		if f.mode == "ordered" {
			// The killed reader delivered by key, the next one again by
			// key from the killed one's oldest copy not delivered on:
			// the samples delivered twice are among the killed reader's
			// last ring of samples and the next one's first.
			span := limit / ringRecord
			tail := logs[i][max(len(logs[i])-span, 0):]
			head := logs[i+1][:min(2*span, len(logs[i+1]))]
			for e, rs := range by {
				if len(rs) == 2 && rs[0] == i && (!slices.Contains(tail, e) || !slices.Contains(head, e)) {
					t.Errorf("cpu %d seq %d, delivered twice, is not among %s's last %d samples and %s's first %d",
						e.cpu, e.seq, readers[i].Name, len(tail), readers[i+1].Name, len(head))
				}
			}
		} else if tail, head := logs[i][len(logs[i])-n:], logs[i+1][:min(n, len(logs[i+1]))]; !slices.Equal(tail, head) {
			t.Errorf("%s's last %d samples are not %s's first ones", readers[i].Name, n, readers[i+1].Name)
		}
		if n*ringRecord > limit {
			t.Errorf("%s: %d samples (%d bytes) delivered again, past its last commit at most %d bytes (%s mode)", readers[i].Name, n, n*ringRecord, limit, f.mode)
		}
	}

	// What each clean reader's rings say, by CPU (a ring buffer: -1).
	lostBy, leftBy := map[int]uint64{}, map[int]uint64{}
	killed := false
	for _, r := range readers {
		killed = killed || r.killed
		for _, st := range r.stats.Rings {
			lostBy[st.CPU] += st.Lost
			leftBy[st.CPU] += st.Left
		}
	}
	if lastLeft := readers[len(readers)-1].stats.Left; lastLeft != 0 {
		t.Errorf("the last reader left %d samples after a drain with the producers stopped", lastLeft)
	}

	var sum struct{ attempts, ok, delivered, twice, lost, left, failed, full, noent, dead, deadLost uint64 }
	for _, cpu := range f.cpus {
		o, fl := out[cpu], failed[cpu]
		if o.OK+o.Full+o.NoSpc+o.NoEnt+o.Other+o.Inval+o.Discarded != o.Attempts || o.Other+o.Inval+o.Discarded != 0 {
			t.Errorf("cpu %d: the program's counts do not add up: %+v", cpu, o)
		}
		if fl.Full != o.Full || fl.NoEntry != o.NoEnt || fl.Total() != o.Full+o.NoEnt {
			t.Errorf("cpu %d: failure map %+v; the program saw full %d, noent %d", cpu, fl, o.Full, o.NoEnt)
		}
		delivered := uint64(0)
		per := make([]uint64, len(readers))
		for e, rs := range by {
			if e.cpu != cpu {
				continue
			}
			delivered++
			if e.seq >= o.Attempts {
				t.Errorf("cpu %d: seq %d delivered, of %d attempts", cpu, e.seq, o.Attempts)
			}
			for _, i := range rs {
				per[i]++
			}
		}
		var who []string
		for i, r := range readers {
			who = append(who, fmt.Sprintf("%s %d", r.Name, per[i]))
		}
		if !perf {
			// The ring is shared: with nothing left, each CPU's
			// outputs that got into it were delivered.
			if o.OK != delivered {
				t.Errorf("cpu %d: %d outputs into the ring, %d delivered", cpu, o.OK, delivered)
			}
			t.Logf("cpu %d: attempted %d = delivered %d (%s) + failed %d (full %d, noent %d)",
				cpu, o.Attempts, delivered, strings.Join(who, ", "), fl.Total(), fl.Full, fl.NoEntry)
		} else {
			// What the clean readers do not account for went with a
			// killed reader's rings: nothing without a kill.
			dead := int64(o.OK) - int64(delivered) - int64(leftBy[cpu])
			deadLost := int64(o.NoSpc) - int64(lostBy[cpu])
			switch {
			case !killed && dead != 0:
				t.Errorf("cpu %d: %d outputs into the rings, %d delivered, %d left", cpu, o.OK, delivered, leftBy[cpu])
			case killed && (dead < 0 || dead > int64(f.ringSize/perfRecord)+1):
				t.Errorf("cpu %d: %d outputs into the rings, %d delivered, %d left: %d in the killed reader's rings, a ring holds %d",
					cpu, o.OK, delivered, leftBy[cpu], dead, f.ringSize/perfRecord)
			case deadLost < 0 || !killed && owner.CloseExact() && deadLost != 0:
				t.Errorf("cpu %d: %d outputs refused by a full ring, %d counted lost (CloseExact %v)", cpu, o.NoSpc, lostBy[cpu], owner.CloseExact())
			}
			line := fmt.Sprintf("cpu %d: attempted %d = delivered %d (%s) + lost %d + left %d + failed %d (noent %d)",
				cpu, o.Attempts, delivered, strings.Join(who, ", "), lostBy[cpu], leftBy[cpu], fl.Total(), fl.NoEntry)
			if killed {
				line += fmt.Sprintf(" + in the killed reader's rings %d + lost there %d", dead, deadLost)
			} else if deadLost != 0 {
				line += fmt.Sprintf(" + lost and not counted %d", deadLost)
			}
			t.Log(line)
			sum.dead += uint64(max(dead, 0))
			sum.deadLost += uint64(max(deadLost, 0))
		}
		sum.attempts += o.Attempts
		sum.delivered += delivered
		sum.failed += fl.Total()
	}
	for _, n := range twice {
		sum.twice += uint64(n)
	}
	for _, n := range lostBy {
		sum.lost += n
	}
	for _, n := range leftBy {
		sum.left += n
	}
	if perf {
		t.Logf("all: attempted %d = delivered %d + lost %d + left %d + failed %d + with a killed reader's rings %d (lost there %d)",
			sum.attempts, sum.delivered, sum.lost, sum.left, sum.failed, sum.dead, sum.deadLost)
	} else {
		t.Logf("all: attempted %d = delivered %d (%d of them twice, after the kill) + failed %d; Stats: %s",
			sum.attempts, sum.delivered, sum.twice, sum.failed, statsLine(readers))
	}
}

// statsLine says what each clean reader's Stats said at Close.
func statsLine(readers []*agent) string {
	var s []string
	for _, r := range readers {
		if r.killed {
			s = append(s, r.Name+" killed")
			continue
		}
		st := r.stats
		s = append(s, fmt.Sprintf("%s samples %d found %d left %d", r.Name, st.Samples, st.Found, st.Left))
	}
	return strings.Join(s, "; ")
}

// mapFailures is a CPU's value of the failure map: struct
// perfbuf_failures of bpf/perfbuf.bpf.h, a ring buffer's full ring
// included (Stats count it as Lost).
type mapFailures struct {
	NoEntry, TooBig, Invalid, NotOnCPU, Other, Full uint64
}

// Total is the number of failed outputs of every cause.
func (f mapFailures) Total() uint64 {
	return f.NoEntry + f.TooBig + f.Invalid + f.NotOnCPU + f.Other + f.Full
}
