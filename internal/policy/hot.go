// SPDX-License-Identifier: Apache-2.0

package policy

// The window's hot ring: a ring buffer the reader fell behind, read in
// place and merged with the window's copies.

import (
	"math"
	"time"

	"github.com/perfbuf/perfbuf/internal/ring"
)

// hotRing is the ring the reader fell behind, read in place rather than
// copied: an intake found it more than an eighth full while the reader
// was delivering (not after a wait: intake.waited; a wait that returned
// at once because the rings had moved is none), or more than three
// quarters full after a wait, or its producers wrote a chunk while an
// intake copied one. The producers outpace the reader there, and copying
// costs several times more a record than reading in place
// (docs/performance.md, "The hot ring"); a smaller burst that came while
// the reader waited is copied and ordered, and so is a larger one if it
// is over by the time the reader copies it ("A flood after a wait").
//
// Its records are delivered from the ring at once, merged with the
// window's smallest copy, the smaller key first (rule 4: what comes later
// with a smaller key is Late), until a look finds it empty or its next
// record busy, hold or more after a look last found it more than an
// eighth full (at). Only the record being delivered is held in place (and
// the copies the window held before, which the ring's commits do not pass):
// the reader is busy, and every intake commits the ring.
type hotRing struct {
	ring int           // the ring's index; -1: none is hot
	at   int64         // the last look that found it behind (window.now)
	hold time.Duration // hotHold
	rec  ring.Record   // its next record, parsed and not delivered, if have
	key  uint64        // rec's key
	have bool
	out  bool // the record out is rec
	// Each's loop over the ring (eachHot): the ring's own loop within
	// sink's bounds (KeyEnd, set once, and the last key delivered), with
	// the owner's sink into during CopyInto and EachSteps; a record it
	// does not take goes through eachF
	// (w.hotRec, made once), which calls fn.
	loop  ring.Record
	sink  ring.Sink
	into  *ring.Sink
	eachF func(*ring.Record) error
	fn    func(*ring.Record) error
}

// hotHold is how long a ring stays hot at least after a look found it
// more than an eighth full: it bounds how often a flood's ring goes back
// to copying, each return taking in a millisecond or more of records and
// delivering them cold while the ring fills again (docs/performance.md,
// "The hot ring", for the losses measured with and without it).
const hotHold = 10 * time.Millisecond

// holdHot reports whether the hot ring stays hot with nothing to read now:
// a look found it more than an eighth full less than hotHold ago.
func (w *window) holdHot() bool { return w.now()-w.hot.at < int64(w.hot.hold) }

// pullHot parses the hot ring's next record into hot.rec, or reports false:
// when a look finds the ring empty or its next record busy, the ring stays
// hot within hotHold and is cooled after; a corruption cools it at once
// (skipped, for the read to report).
func (w *window) pullHot() bool {
	i := w.hot.ring
	rb := w.s.Rings[i]
	for tries := 0; ; tries++ {
		var ok bool
		var err error
		if r, is := rb.(*ring.RingBuf); is {
			ok, err = r.Next(&w.hot.rec) // (a direct call: the window reads ring buffers)
		} else {
			ok, err = rb.Next(&w.hot.rec)
		}
		switch {
		case ok:
			w.hot.key, w.hot.have = w.keyAt(w.hot.rec.Data), true // (a ring buffer's record is one piece)
			w.saw(i, w.hot.key)
			return true
		case err == nil && tries == 0:
			rb.Refresh()
			if rb.Cur().Pending() > 0 {
				continue
			}
		}
		if err == nil && w.holdHot() {
			w.CommitPublish(i) // empty, or its next record busy: hot still
			return false
		}
		w.leaveHot(err)
		return false
	}
}

// coolDown ends the hot ring's turn: its record parsed and not delivered,
// if any, is copied into the window.
func (w *window) coolDown() {
	i := w.hot.ring
	w.hot.ring = -1
	if w.hot.have {
		w.hot.have = false
		w.take.ring, w.take.at = i, w.now()
		w.stage(&w.hot.rec) // (errWindowFull: the copy is in, which may pass the bound by one)
		w.hot.rec = ring.Record{}
	}
}

// leaveHot ends the hot ring's turn from a look at it (pullHot, eachHot):
// a corruption it met, if err is one, is skipped for the read to report;
// its record parsed, if any, is copied in (coolDown); the ring is
// committed, and what comes next is copied in at the next intake.
func (w *window) leaveHot(err error) {
	i := w.hot.ring
	if err != nil {
		w.s.SkipCorrupt(i, err)
	}
	w.coolDown()
	w.CommitPublish(i)
	w.take.look = true
}

// NextCopy is Next's common case under a flood for a copying read, in one
// call: the hot ring's next record copied straight into c
// (ring.RingBuf.NextCopy) and delivered, when the window holds no copy, no
// intake or flush is due, and the ring's next record is a committed
// sample. A late key goes as Next would send it: marked Late and counted.
// False: Next's way, which looks again.
func (w *window) NextCopy(c *ring.Copy) bool {
	i := w.hot.ring
	if i < 0 || w.copies.held != 0 || w.hot.have || w.take.look || w.take.drain || w.take.since >= w.take.every || w.s.Flushing() {
		return false
	}
	w.commitHot(i) // (the record copied last was delivered)
	rb, ok := w.s.Rings[i].(*ring.RingBuf)
	if !ok {
		return false
	}
	n := rb.NextCopy(c)
	if n == 0 {
		return false // (empty, busy or corrupt: Next looks again)
	}
	w.take.since += int(n)
	key := w.keyAt(c.Data)
	w.saw(i, key)
	c.Key, c.Late = key, w.order(i, key)
	return true
}

// fromHot returns the hot ring's record parsed, to be delivered in place.
func (w *window) fromHot() *ring.Record {
	late := w.order(w.hot.ring, w.hot.key)
	w.hot.rec.Key, w.hot.rec.Late, w.hot.out = w.hot.key, late, true
	return &w.hot.rec
}

// eachHot runs the hot ring's records through the ring's loop, in place,
// up to the next intake (intake.every). The window holds no copy, so each
// record is the smallest there is. The loop delivers a key no smaller than
// the last delivered itself (ring.Sink's KeyEnd, the last key its lower
// bound), to fn or copied into a ReadBatch's batch (hot.into), and stops
// before any other record, which goes through hotRec: a Late key, a sample
// too short for its key. It reports false when the ring's snapshot had no
// record: its end, a busy record and the intake are Next's to look at.
func (w *window) eachHot(fn func(*ring.Record) error) (ran bool, err error) {
	i := w.hot.ring
	rb := w.s.Rings[i]
	limit := uint64(min(w.take.every, w.take.hotDue) - w.take.since)
	s, into := &w.hot.sink, w.hot.into
	n, used := 0, uint64(0)
	for {
		s.Lo, s.Hi = w.last, math.MaxUint64
		k, u, e := runLoop(rb, &w.hot.loop, limit-used, &w.s.Stop, fn, s, into)
		n, used, err = n+k, used+u, e
		if k > 0 {
			w.last = s.Lo
			w.saw(i, s.Lo) // the largest key of the run: its last
		}
		if err != nil || used >= limit || w.s.Stop.Load() || into.Full() {
			break
		}
		// The record the run stopped before, if any.
		w.hot.fn = fn
		k, u, err = rb.Each(&w.hot.loop, 1, &w.s.Stop, w.hot.eachF, nil)
		w.hot.fn = nil
		n, used = n+k, used+u
		if k == 0 || err != nil || used >= limit || w.s.Stop.Load() {
			break // (the end of the snapshot, a busy record)
		}
	}
	w.hot.loop = ring.Record{}
	w.take.since += int(used)
	w.commitHot(i)
	if _, ok := err.(*ring.CorruptError); ok && rb.Cur().IsCorrupt(err) {
		w.leaveHot(err)
		return true, nil
	}
	return n > 0 || err != nil, err
}

// EachSteps is Each for Batches (Stepper): the hot ring's records go
// through its loop a run of steps at a time (s.Steps, s.Yield), and every
// other record to fn.
func (w *window) EachSteps(fn func(*ring.Record) error, s *ring.Sink) (bool, error) {
	w.hot.into = s
	defer func() { w.hot.into = nil }()
	return w.Each(fn)
}

// CopyInto is Each for a ReadBatch (BatchCopier): fn copies a record into
// s, and the hot ring's loop copies its records into s in line.
func (w *window) CopyInto(s *ring.Sink, fn func(*ring.Record) error) bool {
	w.hot.into = s
	more, _ := w.Each(fn) // (fn's only error ends a full batch)
	w.hot.into = nil
	return more
}

// commitHot commits hot ring i up to its records delivered, once a chunk
// was delivered since the last commit.
func (w *window) commitHot(i int) {
	if w.take.since >= w.take.hotDue {
		w.CommitPublish(i)
		w.take.hotDue = w.take.since + w.take.chunk
	}
}

// hotRec is eachHot's function for a record of the hot ring that its run
// does not take: its key, Late, rules 1 and 2's bookkeeping, then the
// read's function.
func (w *window) hotRec(rec *ring.Record) error {
	key := w.keyAt(rec.Data) // (a ring buffer's record is one piece)
	w.saw(w.hot.ring, key)
	rec.Key, rec.Late = key, w.order(w.hot.ring, key)
	return w.hot.fn(rec)
}
