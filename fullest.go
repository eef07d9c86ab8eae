// SPDX-License-Identifier: Apache-2.0

package perfbuf

// The fullest-first policy, a Reader's default: passes over the rings, the
// fullest first, each ring's turn bounded by a budget of bytes.

import (
	"slices"
	"time"
)

// fullest drains the rings in passes: a pass snapshots every ring and
// orders the non-empty ones by fill, fullest first; each gets a turn of at
// most budget bytes, committed once at its end.
type fullest struct {
	s      *ringSet
	rec    Record // the record being delivered
	budget int    // bytes a turn reads from a ring (at least one record)
	order  []int  // rings of the current pass, in drain order
	pos    int    // current ring in order
	left   int    // budget left for it
}

func newFullest(s *ringSet) *fullest {
	return &fullest{s: s, budget: max(s.rings[0].Cur().Size()/4, 1)}
}

// next returns the next record of the pass, starting a pass when the last
// one ended.
func (f *fullest) next() (*Record, int) {
	rec := &f.rec
	for {
		if f.pos >= len(f.order) && !f.startPass() {
			return nil, -1
		}
		i := f.order[f.pos]
		rb := f.s.rings[i]
		if f.left > 0 {
			ok, err := rb.Next(rec)
			if ok {
				f.left -= int(rec.Next - rec.Pos)
				return rec, i
			}
			if err != nil {
				f.s.skipCorrupt(i, err)
			}
		}
		f.endTurn(i)
	}
}

func (f *fullest) delivered(int) {}

// addRing: each pass looks at every ring.
func (f *fullest) addRing(int) {}

// each runs one turn: ring i's records through the ring's loop, up to the
// budget. A turn cut short by fn's error goes on at the next read.
func (f *fullest) each(fn func(*Record) error) (bool, error) {
	if f.pos >= len(f.order) && !f.startPass() {
		return false, nil
	}
	i := f.order[f.pos]
	rb := f.s.rings[i]
	_, used, err := rb.Each(&f.rec, uint64(max(f.left, 0)), &f.s.stop, fn)
	f.left -= int(used)
	if _, ok := err.(*CorruptError); ok && rb.Cur().IsCorrupt(err) {
		f.s.skipCorrupt(i, err) // the read reports it
		err = nil
	} else if err != nil || f.s.stop.Load() {
		return true, err // fn's error, or Close from fn: free commits what was delivered
	}
	f.endTurn(i)
	return true, nil
}

// endTurn commits ring i once for its whole turn and moves to the next.
func (f *fullest) endTurn(i int) {
	f.commitPublish(i)
	f.pos++
	f.left = f.budget
}

// commitPublish commits ring i up to its cursor: every record before it
// was delivered.
func (f *fullest) commitPublish(i int) {
	rb := f.s.rings[i]
	rb.Cur().CommitCursor()
	st := rb.Cur().Counts()
	f.s.publish(i, st.Samples, st.Bytes, st.Lost)
}

// oldest: the fullest-first Reader delivers each record as it parses it.
func (f *fullest) oldest(i int) uint64 { return f.s.rings[i].Cur().Pos() }

// startPass snapshots every ring and orders the non-empty ones, fullest
// first; a ring with an error pending gets a turn too, to report and skip
// it. A ring stalled at a record not yet submitted counts as empty: a pass
// that gave it a turn would deliver nothing, and the passes would spin. It
// reports false when all are empty, or a flush has delivered what it was
// for (the read then returns ErrFlushed).
func (f *fullest) startPass() bool {
	f.order, f.pos, f.left = f.order[:0], 0, f.budget
	if f.s.flushing() && f.s.flushReached(f) {
		return false
	}
	for i, rb := range f.s.rings {
		if rb.Quiet() {
			continue // empty, and nothing new: one load, no snapshot to write
		}
		rb.Begin()
		if rb.Cur().Failed() || rb.Cur().Pending() > 0 && !rb.Stalled() {
			f.order = append(f.order, i)
		}
	}
	slices.SortStableFunc(f.order, func(a, b int) int {
		return f.s.rings[b].Cur().Pending() - f.s.rings[a].Cur().Pending()
	})
	return len(f.order) > 0
}

// idle: every turn ended with a commit already; MaxLatency is a bound.
func (f *fullest) idle() (time.Duration, time.Duration) { return f.s.latency, 0 }
