// SPDX-License-Identifier: Apache-2.0

package policy

// The window's intake: the rings' records copied into the window, a chunk
// at a time, their space handed back up to the oldest copy not delivered;
// the window's bound.

import (
	"errors"

	"github.com/perfbuf/perfbuf/internal/ring"
)

// intake is the state of the window's intakes, which copy the rings in.
type intake struct {
	look bool // take in the rings before the next release
	// drain: a Flush took in every ring: deliver the window, take nothing
	// more.
	drain bool
	// waited: the reader waited since the last intake (Idle, and no
	// NoWait after it), or none was made.
	waited bool
	// Under a flood the window always has records to release: it takes
	// the rings in again once it delivered every bytes (a quarter of the
	// smallest ring: takeEveryPart) since it last did, so that the rings
	// do not fill meanwhile.
	since, every int
	smallest     int // the smallest ring's size; 0 before the first ring
	// A ring's copies, and the hot ring's records, are committed every
	// chunk bytes (commitChunk of the smallest ring), not only at the
	// intake: the hot ring when since reaches hotDue.
	chunk, hotDue int
	ring          int   // the ring being taken in, for stage
	at            int64 // and when (one clock read a ring's intake)
	tmp           ring.Record
	// stageF is w.stage, made once: a method value made at each intake
	// would be an allocation an intake.
	stageF func(*ring.Record) error
}

// takeEveryPart: the window takes the rings in again once it delivered
// a takeEveryPart-th of the smallest ring since the last intake, as a
// fullest-first turn reads a quarter of a ring before the next.
const takeEveryPart = 4

// A ring becomes hot (hot.go) when an intake finds more than
// 1/hotBehindPart of it pending while the reader delivers, or more than
// hotAfterWaitNum/hotAfterWaitDen after a wait (Order's HighWater default
// over perf rings): the first bounds how far the reader lets a flood get
// ahead before it stops copying (docs/performance.md, "The hot ring"),
// the second how large a burst that came while the reader waited is
// still copied and ordered ("A flood after a wait").
const (
	hotBehindPart   = 8
	hotAfterWaitNum = 3
	hotAfterWaitDen = 4
)

// takeIn copies what ring i holds now into the window, as far as it has
// room, and hands the space back; a ring more than an eighth full at an
// intake not after a wait, or three quarters after one, becomes hot
// instead, and so does one whose producers wrote a chunk while the intake
// copied one (the rest is then read in place); the hot ring stays so
// while it holds records or within the hold.
func (w *window) takeIn(i int) {
	rb := w.s.Rings[i]
	if i == w.hot.ring {
		w.CommitPublish(i) // what was delivered in place
	}
	rb.Refresh()
	cur := rb.Cur()
	hurry := !w.take.drain && !w.s.Flushing() && !w.s.Stop.Load() && !cur.Failed()
	switch {
	case i == w.hot.ring && hurry && cur.Pending() > cur.Size()/hotBehindPart:
		w.hot.at = w.now()
		return
	case i == w.hot.ring && hurry && (cur.Pending() > 0 || w.holdHot()):
		return
	case i == w.hot.ring:
		w.coolDown()
	case w.hot.ring < 0 && hurry && cur.Pending() > cur.Size()/hotBehindPart &&
		(!w.take.waited || cur.Pending() > cur.Size()/hotAfterWaitDen*hotAfterWaitNum):
		w.hot.ring, w.hot.at = i, w.now()
		return
	}
	if cur.Pending() == 0 && !cur.Failed() || w.isFull() {
		return // (a pending corruption: Each returns it, to be skipped and reported)
	}
	w.take.ring, w.take.at = i, w.now()
	w.rules.clock = w.take.at
	head := cur.Head()
	for {
		// (The snapshot's records, a chunk at a time: what was copied is
		// the window's, and its space goes back at once.)
		_, used, err := rb.Each(&w.take.tmp, uint64(w.take.chunk), nil, w.take.stageF, nil)
		if err != nil && err != errWindowFull {
			// A record that cannot be valid: nothing is held in the ring, so
			// skipping to its head hands back nothing still in use.
			w.s.SkipCorrupt(i, err)
		}
		if err != nil || int(used) < w.take.chunk {
			break
		}
		w.CommitPublish(i)
		if w.hot.ring < 0 && hurry && cur.LoadHead()-head >= uint64(w.take.chunk) {
			// The producers wrote a chunk while this intake copied: not a
			// burst that came while the reader waited but a flood, which
			// copying would let fill the ring. The rest is read in place.
			w.hot.ring, w.hot.at = i, w.now()
			break
		}
	}
	w.take.tmp = ring.Record{}
	w.CommitPublish(i)
}

// takeInAll takes in every ring and recomputes rule 1's bound.
func (w *window) takeInAll() {
	w.take.since, w.take.hotDue = 0, w.take.chunk
	empty := w.stampBound() // (before any ring's producer_pos: stamp.go)
	for i := range w.rs {
		w.takeIn(i)
	}
	w.take.waited = false
	w.rules.allSeen, w.rules.minSeen = true, ^uint64(0)
	for i := range w.rs {
		bound, ok := w.ringBound(i, empty)
		if !ok {
			w.rules.allSeen = false
			break
		}
		w.rules.minSeen = min(w.rules.minSeen, bound)
	}
}

// errWindowFull ends a ring's intake once the window is full; the record
// stage returned it for is in the window. It never leaves this file.
var errWindowFull = errors.New("window full")

// stage copies one record of ring w.take.ring into the window; errWindowFull
// once that filled it.
func (w *window) stage(rec *ring.Record) error {
	if rec.Type != ring.Sample {
		return nil // (ring buffers have no other records)
	}
	n := rec.Len()
	at, buf := w.arena.alloc(n)
	if len(rec.Wrapped) == 0 {
		copy(buf, rec.Data) // (always, for a ring buffer)
	} else {
		rec.AppendTo(buf[:0])
	}
	key := w.keyAt(buf)
	w.copies.seq++
	var slot int32
	if k := len(w.free); k > 0 {
		slot, w.free = w.free[k-1], w.free[:k-1]
	} else {
		slot = int32(len(w.slots))
		w.slots = append(w.slots, copySlot{})
	}
	r := &w.rs[w.take.ring]
	w.slots[slot] = copySlot{at: at, pos: rec.Pos, next: rec.Next, seen: w.take.at, held: r.held.add(rec.Pos), ring: int32(w.take.ring)}
	w.copies.add(heapEntry{key: key, tie: w.copies.seq, ref: int(slot)})
	r.staged++
	r.bytes += uint64(n)
	if !r.tight {
		w.tighten(w.take.ring, rec.Next)
	}
	w.saw(w.take.ring, key)
	if w.over() {
		return errWindowFull
	}
	return nil
}

// over reports that the window holds Bytes: its copies' bytes, or its
// chunks' twice that (copies held long, each keeping a chunk) and two
// chunks more.
func (w *window) over() bool {
	return w.arena.used >= w.limit || w.arena.bytes >= 2*w.limit+2*chunkSize
}

// isFull reports rule 4, with a low-water mark: once full, the window
// releases down to three quarters before it takes in again, so that under
// a flood it takes in runs of records, not one record a release.
func (w *window) isFull() bool {
	if w.over() {
		w.full = true
	} else if w.arena.used <= w.limit/4*3 && w.arena.bytes <= 2*w.limit+chunkSize {
		w.full = false
	}
	return w.full
}
