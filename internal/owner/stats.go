// SPDX-License-Identifier: Apache-2.0

package owner

// What the owner counts per ring, as the root's Stats and Failures
// publish it (perfbuf.Stats documents each count).

import (
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/perfbuf/perfbuf/internal/kernel"
	"github.com/perfbuf/perfbuf/internal/policy"
	"github.com/perfbuf/perfbuf/internal/ring"
)

// Stats are one ring's counts: perfbuf.Stats, field for field.
type Stats struct {
	Ring, CPU int
	Tally
	Failed              Failures
	MaxFill, Fill, Size int
	DeletesSlot         bool
	Waiting, Held       time.Duration
}

// Tally are the records of a ring that Stats counts, by fate.
type Tally struct {
	Samples, Dropped, Lost, Discarded, Left, Found uint64
	Skipped, Overwritten                           uint64
	Bytes, Late, Other, Corrupt, CorruptBytes      uint64
}

// Failures are the outputs that failed before reaching a ring, by cause:
// perfbuf.Failures, field for field.
type Failures struct {
	NoEntry, TooBig, Invalid, NotOnCPU, Other, Full uint64
}

// SetCounts puts what a ring parsed, c, on st: every count but the
// owner's (Late, Dropped, Left) and the reads' (Fill, Size, Failed).
func (st *Stats) SetCounts(c *ring.Counts) {
	st.Samples, st.Bytes, st.Lost, st.Other, st.Discarded = c.Samples, c.Bytes, c.Lost, c.Other, c.Discarded
	st.Corrupt, st.CorruptBytes, st.MaxFill = c.Corrupt, c.CorruptBytes, c.MaxFill
}

// The errors that the root exports under the same names (perfbuf's
// errors.go documents them).
var (
	ErrFlushed        = errors.New("reader flushed")
	ErrBusy           = errors.New("ring held by a raw reader")
	ErrMapType        = errors.New("map is neither a perf event array nor a BPF ring buffer")
	ErrSampleTooLarge = errors.New("sample does not fit in the ring")
	ErrMapInUse       = errors.New("map read by another reader")
)

// wrap adds op to a non-nil error.
func wrap(op string, err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("%s: %w", op, err)
}

// Add returns the sum of f's and g's counts, cause by cause.
func (f Failures) Add(g Failures) Failures {
	return Failures{NoEntry: f.NoEntry + g.NoEntry, TooBig: f.TooBig + g.TooBig, Invalid: f.Invalid + g.Invalid,
		NotOnCPU: f.NotOnCPU + g.NotOnCPU, Other: f.Other + g.Other, Full: f.Full + g.Full}
}

// Stats returns the published counts with what is read at the time of
// the call, while the rings are mapped: each ring's fill, and its positions,
// which it observes (policy.Tally.Observe) for Waiting; and the failure
// map's counts, which may append entries. Any goroutine may call it.
func (c *Core) Stats() []Stats {
	now := policy.Now() // before the positions are loaded: see Observe
	mapped := c.Life.Enter("") == nil
	c.StatsMu.Lock()
	rings := c.Rings
	waiting := make([]bool, len(rings))
	if mapped {
		for i, rb := range rings {
			tail, head := rb.Cur().Positions()
			c.Tallies[i].Observe(tail, head, now)
			waiting[i] = tail != head
		}
	}
	tallies := slices.Clone(c.Tallies)
	var kinds []ring.Kind
	var fds []int
	if _, raw := c.pol.(policy.Raw); mapped && c.countsLost && !raw {
		// (A Raw's losses are its RawBuffers' until Close.)
		kinds, fds = slices.Clone(c.Kinds), slices.Clone(c.fds)
	}
	c.StatsMu.Unlock()
	st := make([]Stats, len(tallies))
	for i, t := range tallies {
		st[i] = Stats{Ring: i, CPU: t.CPU, Size: t.Size, Tally: Tally{Late: t.Late, Dropped: t.Dropped, Left: t.Left, Found: t.Found}}
		st[i].SetCounts(&t.Counts)
		st[i].Samples -= t.Dropped // parsed, but dropped rather than delivered
		if waiting[i] {
			st[i].Waiting = time.Duration(max(now-t.Clear, 0))
		}
		if mapped && t.HeldSince >= 0 {
			st[i].Held = time.Duration(max(now-t.HeldSince, 0))
		}
	}
	if mapped {
		for i := range st {
			st[i].Fill = rings[i].Cur().Used()
			if i >= len(kinds) {
				continue // (no count, or a ring added meanwhile)
			}
			if n, ok := c.refused(kinds[i], fds[i]); ok {
				st[i].Lost = max(st[i].Lost, n)
			}
		}
		c.Life.Exit()
	}
	if c.deletesSlots() {
		for i := range st {
			st[i].DeletesSlot = true
		}
	}
	return c.src.failureCounters().addTo(st)
}

// deletesSlots reports whether Close deletes the slots of c's perf event
// array by key (Stats.DeletesSlot): its rings have no map file of their
// own. Fixed at opening.
func (c *Core) deletesSlots() bool {
	r, ok := c.src.(*rings)
	return ok && r.byKey
}

// refused returns how many outputs the perf ring rb, whose event is fd,
// refused since it opened (full or paused), whether its lost records
// reported them yet or not: the kernel's count (kernel.LostSamples). ok is
// false for a ring buffer, and for a perf ring opened without the count
// (kernels before 6.0, or rings given whole: Over), whose losses are only
// those its lost records report. The count is at least what the lost records delivered and in
// the ring report, and the difference is what the kernel has yet to
// report: Lost is the larger of the two.
func (c *Core) refused(rb ring.Kind, fd int) (uint64, bool) {
	if _, perf := rb.(*ring.Perf); !perf || !c.countsLost {
		return 0, false
	}
	n, ok, err := kernel.LostSamples(fd)
	return n, ok && err == nil
}

// AddViewLost adds to viewLost what a RawBuffer of ring i counted lost.
func (c *Core) AddViewLost(i int, lost uint64) {
	c.StatsMu.Lock()
	defer c.StatsMu.Unlock()
	if i >= len(c.viewLost) {
		c.viewLost = append(c.viewLost, make([]uint64, i+1-len(c.viewLost))...)
	}
	c.viewLost[i] += lost
}
