// SPDX-License-Identifier: Apache-2.0

package policy

// The fullest-first policy, a Reader's default: passes over the rings, the
// fullest first, each ring's turn bounded by a budget of bytes.

import (
	"slices"
	"time"

	"github.com/perfbuf/perfbuf/internal/ring"
)

// Fullest drains the rings in passes: a pass snapshots every ring and
// orders the non-empty ones by fill, fullest first; each gets a turn of at
// most budget bytes, committed at its end and every chunk bytes within it
// (commitChunk), so that a long turn hands the space back as it goes.
//
// It runs no user function of its own (Next runs none at all; Each only
// fn): a read may call it outside wait.Reads, and a copying read calls it
// directly rather than through the Reading interface.
type Fullest struct {
	s      *Set
	rec    ring.Record // the record being delivered
	budget int         // bytes a turn reads from a ring (at least one record)
	chunk  int         // bytes a turn reads between two commits
	order  []int       // rings of the current pass, in drain order
	pos    int         // current ring in order
	left   int         // budget left for it
	due    int         // left at or below which the turn commits before it reads on
	// turn is the ring of the turn Next is in, Rings[turnI]; nil when a
	// turn ended.
	turn  ring.Ring
	turnI int
}

// NewFullest returns the fullest-first policy over s's rings.
func NewFullest(s *Set) *Fullest {
	f := &Fullest{s: s}
	if len(s.Rings) > 0 {
		f.AddRing(0)
	}
	return f
}

// SetTurn sets a turn's bytes (at least one record is read) and the
// bytes between two commits in a turn (at most the turn's). The first
// ring added sets a quarter of its size and commitChunk.
func (f *Fullest) SetTurn(budget, chunk int) {
	f.budget, f.chunk = budget, min(chunk, budget)
	f.left, f.due = budget, budget-f.chunk
}

// commitChunk is how many bytes of a ring of size bytes a read delivers
// (or copies) before it commits them: a thirty-second of the ring, or a
// sixteenth up to 16 KiB. It bounds the room the kernel's producers lack
// while a read goes on (they see the ring full up to the committed
// position; libbpf's C consumer and cilium/ebpf commit each record), and
// keeps a commit (a store, and the counts published under a mutex) a small
// part of a record's cost (docs/performance.md, "Space handed back as it
// is read", for both measured).
func commitChunk(size int) int { return max(size/32, min(size/16, 16<<10), 1) }

// commitDue commits ring i's turn so far once it read a chunk since the
// last commit: every record before the cursor was delivered.
func (f *Fullest) commitDue(i int) {
	if f.left <= f.due {
		f.CommitPublish(i)
		f.due = f.left - f.chunk
	}
}

// Next returns the next record of the pass, starting a pass when the last
// one ended.
func (f *Fullest) Next() (*ring.Record, int) {
	// Within a turn (ReadInto's common case): the turn's ring, kept, so
	// that a record costs no lookup of it, and called as its kind, so that
	// it costs a direct call rather than the interface's.
	if f.turn != nil && f.left > 0 {
		f.commitDue(f.turnI) // (the records Next returned before were delivered)
		var ok bool
		switch rb := f.turn.(type) {
		case *ring.RingBuf:
			ok, _ = rb.Next(&f.rec)
		case *ring.Perf:
			ok, _ = rb.Next(&f.rec)
		default:
			ok, _ = rb.Next(&f.rec)
		}
		if ok {
			f.left -= int(f.rec.Next - f.rec.Pos)
			return &f.rec, f.turnI
		}
	}
	return f.next() // (the end of the turn, or an error: looked at again there)
}

// NextCopy is Next's common case for a copying read (ReadInto): within a
// turn, the turn's next plain sample copied straight into c, with no
// Record between (the ring kinds' NextCopy). It reports false for
// anything else, Next's: a turn's end, another record, a ring of another
// kind.
func (f *Fullest) NextCopy(c *ring.Copy) bool {
	if f.turn == nil || f.left <= 0 {
		return false
	}
	f.commitDue(f.turnI) // (the records before were delivered)
	var n uint64
	switch rb := f.turn.(type) {
	case *ring.RingBuf:
		n = rb.NextCopy(c)
	case *ring.Perf:
		n = rb.NextCopy(c)
	}
	f.left -= int(n)
	return n != 0
}

// next is Next past a turn's records: the ends of turns and passes.
func (f *Fullest) next() (*ring.Record, int) {
	rec := &f.rec
	for {
		if f.pos >= len(f.order) && !f.startPass() {
			return nil, -1
		}
		i := f.order[f.pos]
		rb := f.s.Rings[i]
		if f.left > 0 {
			ok, err := rb.Next(rec)
			if ok {
				f.left -= int(rec.Next - rec.Pos)
				f.turn, f.turnI = rb, i
				return rec, i
			}
			if err != nil {
				f.s.SkipCorrupt(i, err)
			}
		}
		f.endTurn(i)
	}
}

func (f *Fullest) Delivered(int) {}

// AddRing sizes the turns by the first ring (a quarter of it; a Fullest
// made over no ring has none until then); each pass looks at every ring.
func (f *Fullest) AddRing(i int) {
	if f.budget == 0 {
		size := f.s.Rings[i].Cur().Size()
		f.SetTurn(max(size/4, 1), commitChunk(size))
	}
}

// Each runs one turn: ring i's records through the ring's loop, up to the
// budget. A turn cut short by fn's error goes on at the next read.
func (f *Fullest) Each(fn func(*ring.Record) error) (bool, error) { return f.each(fn, nil) }

// CopyInto runs one turn as Each does, the ring's loop copying the records
// into s.Into (see ring.Sink) rather than calling a function. A turn cut
// short because s is full goes on at the next call. It reports whether
// there may be more to deliver without a wait (Each's more).
func (f *Fullest) CopyInto(s *ring.Sink) bool {
	more, _ := f.each(nil, s) // (no function: no error but a corruption, reported by the read)
	return more
}

// EachSteps runs one turn as Each does, the ring's loop handing its plain
// samples out a run at a time through s (s.Steps and s.Yield: see
// ring.Sink) and every other record to fn. A turn whose run the caller
// left untaken ends; the next turn of that ring starts with it.
func (f *Fullest) EachSteps(fn func(*ring.Record) error, s *ring.Sink) (bool, error) {
	return f.each(fn, s)
}

// each is Each, CopyInto and EachSteps: one turn into fn or s.
func (f *Fullest) each(fn func(*ring.Record) error, s *ring.Sink) (bool, error) {
	if f.pos >= len(f.order) && !f.startPass() {
		return false, nil
	}
	i := f.order[f.pos]
	rb := f.s.Rings[i]
	for {
		f.commitDue(i)
		limit := max(min(f.left, f.left-f.due), 0) // (0: one record)
		_, used, err := rb.Each(&f.rec, uint64(limit), &f.s.Stop, fn, s)
		f.left -= int(used)
		if _, ok := err.(*ring.CorruptError); ok && rb.Cur().IsCorrupt(err) {
			f.s.SkipCorrupt(i, err) // the read reports it
			break
		} else if err != nil || f.s.Stop.Load() || s.Full() {
			return true, err // fn's error, Close from fn, or a full batch: free commits what was delivered
		}
		if int(used) < limit || f.left <= 0 {
			break // the ring's snapshot ended, or the turn's budget
		}
	}
	f.endTurn(i)
	return true, nil
}

// endTurn commits ring i once for its whole turn and moves to the next.
func (f *Fullest) endTurn(i int) {
	f.turn = nil
	f.CommitPublish(i)
	f.pos++
	f.left, f.due = f.budget, f.budget-f.chunk
}

// CommitPublish commits ring i up to its cursor: every record before it
// was delivered.
func (f *Fullest) CommitPublish(i int) {
	rb := f.s.Rings[i]
	rb.Cur().CommitCursor()
	st := rb.Cur().Counts()
	f.s.Publish(i, rb.Cur().Pos(), st.Samples, st.Bytes, st.Lost)
}

// Oldest is the cursor: the fullest-first Reader delivers each record as
// it parses it.
func (f *Fullest) Oldest(i int) uint64 { return f.s.Rings[i].Cur().Pos() }

// startPass snapshots every ring and orders the non-empty ones, fullest
// first; a ring with an error pending gets a turn too, to report and skip
// it. A ring stalled at a record not yet submitted counts as empty: a pass
// that gave it a turn would deliver nothing, and the passes would spin. It
// reports false when all are empty, or a flush has delivered what it was
// for (the read then returns ErrFlushed).
func (f *Fullest) startPass() bool {
	f.order, f.pos, f.left, f.due, f.turn = f.order[:0], 0, f.budget, f.budget-f.chunk, nil
	if f.s.Flushing() && f.s.FlushReached(f) {
		return false
	}
	for i, rb := range f.s.Rings {
		if rb.Quiet() {
			continue // empty, and nothing new: one load, no snapshot to write
		}
		rb.Begin()
		if rb.Cur().Failed() || rb.Cur().Pending() > 0 && !rb.Stalled() {
			f.order = append(f.order, i)
		}
	}
	slices.SortStableFunc(f.order, func(a, b int) int {
		return f.s.Rings[b].Cur().Pending() - f.s.Rings[a].Cur().Pending()
	})
	return len(f.order) > 0
}

// Idle returns MaxLatency: every turn ended with a commit already.
func (f *Fullest) Idle() (time.Duration, time.Duration) { return f.s.Latency, 0 }
