// SPDX-License-Identifier: Apache-2.0

package policy

// The ordered merge over BPF ring buffers (Options.Order): the records are
// copied out of the rings into a window of bounded size, which delivers
// them in key order. A ring's space is handed back up to its oldest copy
// not delivered (heldRing), so that a reader that dies holding copies
// leaves them in the ring for the next one.
//
// Why copies, where perf rings are merged in place (ordered.go): a ring
// written by several CPUs (one ring buffer, a ring per N CPUs) holds its
// records in the order they were reserved, not in the order of their keys,
// so that only a window that sees several of them can sort them. A copy
// held keeps consumer_pos behind it, which silences the ring's wakeups
// (the kernel wakes only for a record committed at consumer_pos): the
// read then sleeps on the window's timers (Idle, Lags), and rule 4
// releases once the copies keep half the ring (tighten).

import (
	"encoding/binary"
	"time"

	"github.com/perfbuf/perfbuf/internal/ring"
)

// WindowConfig is what the window takes beside an Order.
type WindowConfig struct {
	OrderConfig
	// Bytes bounds the window: the bytes its copies take (each rounded up
	// to 8), beside about 64 bytes of bookkeeping a record. The copy that
	// fills it is the last taken in until the smallest key went (rule 4):
	// the copies take at most Bytes and one record, in chunks of 64 KiB
	// that take at most twice Bytes and two chunks more.
	Bytes int
	// OneWriter says, for ring i, whether one CPU alone writes it: its
	// keys then only grow (rule 1). A ring buffer shared by CPUs counts for
	// rule 1 only while empty, with stamped keys; else rule 1 releases
	// nothing while one is read. It is asked once a ring, as the ring
	// comes in (NewWindow, AddRing); nil: none.
	OneWriter func(i int) bool
}

// window is the ordered merge over ring buffers. Its rules are the Order's,
// over the copies:
//
//  1. every ring is written by one CPU and has shown a key at least as
//     large (its newest key copied; an empty ring or one whose next
//     record is busy holds back the keys above its newest), or, with
//     stamped keys, was empty at the last intake (stamp.go);
//  2. a key Window larger has been copied from any ring;
//  3. the record was copied MaxDelay ago;
//  4. the window is full (and until it is down to three quarters), or a
//     ring's copies keep more than half of it (and until they keep three
//     eighths: tighten), or a
//     ring is more than an eighth full at an intake while the reader
//     delivers, or three quarters after a wait, or its producers wrote a
//     chunk while an intake copied one (the hot ring: hot.go);
//  5. a Flush or Close is under way.
//
// Its parts: the copies in runs of rising keys (copyruns.go), their
// payloads in an arena (arena.go), the intake that copies the rings in
// (intake.go), the rings' space handed back (handback.go), the hot ring
// read in place (hot.go), rule 1 for stamped keys (stamp.go).
type window struct {
	s     *Set
	keys  keyReader
	limit int  // Bytes
	full  bool // rule 4 releases: the window filled and is still above three quarters
	tight int  // rule 4 releases: rings whose copies keep more than half of them (windowRing.tight)
	// last is the largest key delivered: a smaller one is Late (order).
	last uint64

	rs     []windowRing
	rules  windowRules
	copies copyRuns   // the copies by key
	slots  []copySlot // the copies, by the index the runs hold
	free   []int32    // slots not in use
	arena  arena      // the copies' payloads
	take   intake
	hot    hotRing
	start  time.Time // the clock's origin (window.now)

	out   ring.Record // the record being delivered
	outAt int32       // its slot; -1: none
}

// windowRules is what rules 1 to 3 look at: the keys copied, and the
// clock.
type windowRules struct {
	window   uint64        // OrderConfig.Window (rule 2)
	maxDelay time.Duration // rule 3
	dueSlack time.Duration // how late rule 3's timer may fire: MaxDelay/2
	newest   uint64        // the largest key copied
	// oneWriter says whether ring i is written by one CPU (rule 1):
	// WindowConfig.OneWriter, asked once a ring.
	oneWriter func(i int) bool
	minSeen   uint64 // the smallest newest key over the rings (rule 1); valid when allSeen
	allSeen   bool
	clock     int64 // the last clock read (window.now) of rule 3
	// stamped: the keys are CLOCK_MONOTONIC times that the programs read
	// after reserving their records (stamp.go); mono reads that clock.
	stamped bool
	mono    func() int64
}

// windowRing is what the window keeps of one ring.
type windowRing struct {
	cpu       int // the ring's CPU (ring.Record.CPU)
	oneWriter bool
	newest    uint64 // the largest key copied from it
	seen      bool
	staged    uint64 // samples copied and not delivered
	bytes     uint64 // their payloads' bytes
	held      heldRing
	half      uint64 // half the ring's size (tighten)
	// tight: the ring's space from its oldest copy not delivered to the
	// cursor passed half the ring, and is not yet back to three eighths:
	// rule 4 releases, so that the producers find room.
	tight bool
}

// copySlot is a copy: where its payload is in the arena, and what the
// record said. It holds no pointer, so that the slots cost the garbage
// collector nothing.
type copySlot struct {
	pos  uint64 // where the record was in its ring
	next uint64
	seen int64  // when it was copied (window.now)
	held uint64 // its index in its ring's heldRing
	at   arenaRef
	ring int32 // (48 bytes in all)
}

func NewWindow(s *Set, cfg WindowConfig) *window {
	w := &window{
		s:      s,
		keys:   keyReader{offset: cfg.KeyOffset, end: cfg.KeyOffset + 8},
		limit:  max(cfg.Bytes, 1),
		rules:  windowRules{window: cfg.Window, maxDelay: cfg.MaxDelay, dueSlack: cfg.MaxDelay / 2, oneWriter: cfg.OneWriter, stamped: cfg.Stamped},
		copies: copyRuns{last: -1},
		take:   intake{waited: true, look: true},
		hot:    hotRing{ring: -1, hold: hotHold},
		outAt:  -1,
		start:  time.Now(),
	}
	if w.rules.stamped {
		off := monotonicOffset(w.start)
		w.rules.mono = func() int64 { return w.now() + off }
	}
	largest := 0
	for i := range s.Rings {
		largest = max(largest, s.Rings[i].Cur().Size())
		w.AddRing(i)
	}
	w.reserve(min(w.limit, largest))
	w.out.Type = ring.Sample
	w.hot.eachF, w.take.stageF = w.hotRec, w.stage
	w.hot.sink.KeyEnd = uint64(w.keys.end)
	return w
}

// reserve makes room for n bytes of copies before the first intake: the
// arena's chunks, and slots and a run for copies of 64 bytes. NewWindow
// reserves a full ring's worth (at most Bytes), so that a flood's first
// intake, which may copy most of a ring, does not grow the heap: grown
// there, the copies start garbage collections that hold that intake, and
// the ring's space, while the ring fills (docs/performance.md, "The
// window made at NewReader").
// Allocations this large, from memory the heap has not used before, are
// the OS's untouched zero pages until used; beyond n the window grows on
// demand, up to Bytes.
func (w *window) reserve(n int) {
	w.arena.reserve(n)
	copies := n / 64
	w.slots = make([]copySlot, 0, copies)
	w.free = make([]int32, 0, copies)
	w.copies.runs = append(w.copies.runs, copyRun{q: make([]heapEntry, 0, copies)})
	w.copies.idle = append(w.copies.idle, len(w.copies.runs)-1)
}

func (w *window) now() int64 { return int64(time.Since(w.start)) }

// AddRing takes in ring i, the last: at NewWindow, or a ring buffer taken
// over from a reader in another process later. A window with no ring yet
// (every ring waiting for its reader) releases nothing, and reserved
// nothing: its copies grow on demand.
func (w *window) AddRing(i int) {
	rb := w.s.Rings[i]
	one := w.rules.oneWriter != nil && w.rules.oneWriter(i)
	// Room for the places of copies of 64 bytes over half the ring (past
	// which rule 4 releases: tight), so that a flood's first intake does
	// not grow it (see reserve): 32 KiB for a ring of 256 KiB.
	held := heldRing{q: make([]heldPos, 0, rb.Cur().Size()/2/64)}
	w.rs = append(w.rs, windowRing{cpu: rb.Cur().CPU(), oneWriter: one, half: uint64(rb.Cur().Size()) / 2, held: held})
	rb.Begin()
	if size := rb.Cur().Size(); w.take.smallest == 0 || size < w.take.smallest {
		w.take.smallest = size
		w.take.every = max(size/takeEveryPart, 1)
		w.take.chunk = min(commitChunk(size), w.take.every)
		w.take.hotDue = w.take.chunk
	}
	w.take.look, w.rules.allSeen = true, false // rule 1 waits for its key too
}

// Oldest is where ring i's records not copied and not delivered start:
// the window's copies are no longer the ring's (Held counts them at
// Close); a hot ring's next record is parsed and still the ring's.
func (w *window) Oldest(i int) uint64 {
	if i == w.hot.ring && w.hot.have {
		return w.hot.rec.Pos
	}
	return w.s.Rings[i].Cur().Pos()
}

// Held returns the samples of ring i copied and not delivered: at Close,
// unless a read in progress hands them over (Set.HandOver), they count as
// left undelivered, as those in the ring do.
func (w *window) Held(i int) uint64 { return w.rs[i].staged }

// releasable reports whether the smallest copy may go (rules 1 to 5).
func (w *window) releasable() bool {
	e := w.copies.min()
	switch {
	case w.take.drain || w.s.Flushing() || w.s.Stop.Load(): // rule 5
		return true
	case w.rules.allSeen && e.key <= w.rules.minSeen: // rule 1
		return true
	case w.rules.newest >= w.rules.window && e.key <= w.rules.newest-w.rules.window: // rule 2
		return true
	case w.due(w.slots[e.ref].seen):
		return true // rule 3
	case w.tight > 0:
		return true // rule 4: a ring's copies keep half of it
	}
	return w.isFull() // rule 4
}

// due reports rule 3 for a copy made at seen. It reads the clock only
// when the last reading does not already show it due: under a flood, not
// once a record.
func (w *window) due(seen int64) bool {
	if w.rules.clock-seen >= int64(w.rules.maxDelay) {
		return true // (the clock only goes forward)
	}
	w.rules.clock = w.now()
	return w.rules.clock-seen >= int64(w.rules.maxDelay)
}

// Next returns the copy that goes next and its ring, or -1 when none may
// go yet. A late record is counted. Once Close stopped the reader, it
// takes nothing more in: the copies go (rule 5), and with them, in key
// order, a hot ring's record parsed.
func (w *window) Next() (*ring.Record, int) {
	took := false // whether this call took the rings in
	for {
		stop := w.s.Stop.Load()
		if stop {
			// (The records not taken in stay in the ring, the next reader's.)
		} else if w.s.Flushing() && !w.take.drain {
			// A Flush: every ring taken in up to its head now (past the
			// flush's), then the window delivered, with nothing more
			// taken in, so that the flush ends while producers go on.
			w.takeInAll()
			w.take.drain = true
		} else if !w.s.Flushing() {
			w.take.drain = false
		}
		if (w.take.look || w.take.since >= w.take.every) && !w.take.drain && !stop {
			w.take.look = false
			w.takeInAll()
			took = true
		}
		inPlace := w.hot.ring >= 0 && (w.hot.have || !stop && w.pullHot())
		if inPlace {
			// The smaller key first, unless a ring's copies keep half of
			// it: then the window's smallest (rule 4).
			if w.copies.held == 0 || w.hot.key < w.copies.min().key && w.tight == 0 {
				return w.fromHot(), w.hot.ring
			}
			// The window's smallest goes first, due or not.
		} else if w.copies.held == 0 && w.take.drain && !stop && !w.s.FlushReached(w) {
			// The window had no room for all of it: take in the rest.
			// If nothing comes (a ring corrupt, its error pending), the
			// read reports it.
			if w.takeInAll(); w.copies.held > 0 {
				continue
			}
		}
		if !inPlace && (w.copies.held == 0 || !w.releasable()) {
			w.take.look = true // take in before the next release
			if took || w.take.drain || stop {
				return nil, -1
			}
			continue
		}
		e := w.copies.popMin()
		sl := &w.slots[e.ref]
		i := int(sl.ring)
		late := w.order(i, e.key)
		// (w.out is a sample with no Wrapped part: only these change)
		out := &w.out
		out.Ring, out.CPU, out.Pos, out.Next = i, w.rs[i].cpu, sl.pos, sl.next
		out.Data, out.Key, out.Late = w.arena.bytesOf(sl.at), e.key, late
		w.outAt = int32(e.ref)
		return &w.out, i
	}
}

// Delivered ends the delivery of the record Next returned: its copy goes
// back to the pool, or the hot ring's cursor is past it.
func (w *window) Delivered(i int) {
	if w.hot.out {
		w.hot.out, w.hot.have = false, false
		w.take.since += int(w.hot.rec.Next - w.hot.rec.Pos)
		if r := &w.rs[i]; !r.tight && r.staged > 0 {
			w.tighten(i, w.hot.rec.Next) // copies made before it went hot
		}
		w.commitHot(i)
		return
	}
	if w.outAt < 0 {
		return
	}
	sl := &w.slots[w.outAt]
	r := &w.rs[i]
	r.held.done(sl.held)
	if r.tight {
		w.tighten(i, w.s.Rings[i].Cur().Pos())
	}
	r.staged--
	r.bytes -= uint64(sl.at.n)
	w.take.since += int(sl.at.n) + 8 // (as in the ring: the header's 8 bytes)
	w.arena.release(sl.at)
	w.free = append(w.free, w.outAt)
	w.outAt = -1
}

// Idle commits and publishes every ring and waits at most MaxLatency, and
// until the smallest copy is due (rule 3), or up to MaxDelay/2 later, or,
// with stamped keys and no budget, until rule 1 may release it (stampDue). A
// ring committed up to its cursor wakes the reader for its next record; one
// held back by a copy (Lags) wakes it no more until that copy goes, by
// rule 3 at the latest, and this timeout looks at it meanwhile (every
// hotHold at most with no budget, Latency < 0).
func (w *window) Idle() (time.Duration, time.Duration) {
	w.take.waited = true
	timeout, slack := w.s.Latency, time.Duration(0)
	for i := range w.rs {
		w.CommitPublish(i)
	}
	if w.copies.held > 0 {
		due := time.Duration(w.slots[w.copies.min().ref].seen + int64(w.rules.maxDelay) - w.now())
		if timeout < 0 || due+w.rules.dueSlack < timeout {
			timeout, slack = max(due, 0), w.rules.dueSlack
		}
		if w.s.Latency < 0 && timeout > hotHold {
			// No budget (a wakeup for every record), but a ring held back
			// by a copy raises none: look at the rings every hotHold.
			timeout, slack = hotHold, 0
		}
		if d, ok := w.stampDue(w.copies.min().key); ok && w.s.Latency < 0 && d < timeout {
			// No budget: rule 1 then, if the rings are empty (stamp.go).
			// Within one, the look the budget makes comes soon enough,
			// and a timer a record would be a wakeup a record.
			timeout, slack = d, 0
		}
	}
	return timeout, slack
}

// NoWait: the read went on after Idle without waiting.
func (w *window) NoWait() { w.take.waited = false }

// Each delivers up to 256 copies in key order before it returns for the
// read to look at its context; or, while a ring is hot and the window holds
// no copy, that ring's records through the ring's own loop (eachHot). Once
// Close stopped the reader, it returns after the record in progress, or
// with HandOver, once every copy went.
func (w *window) Each(fn func(*ring.Record) error) (bool, error) {
	for n := 0; n < 256 || w.s.HandOver.Load(); n++ {
		if w.hot.ring >= 0 && w.copies.held == 0 && !w.hot.have && w.take.since < w.take.every && !w.take.drain && !w.s.Flushing() && !w.s.Stop.Load() {
			if ran, err := w.eachHot(fn); ran {
				return true, err
			}
		}
		rec, i := w.Next()
		if i < 0 {
			return false, nil
		}
		err := fn(rec)
		w.Delivered(i)
		if err != nil || w.s.Stop.Load() && !w.s.HandOver.Load() {
			return true, err
		}
	}
	return true, nil
}

// saw notes a key taken from ring i, copied or read in place: the ring's
// newest (rule 1) and the newest of all (rule 2).
func (w *window) saw(i int, key uint64) {
	if r := &w.rs[i]; !r.seen || key > r.newest {
		r.newest, r.seen = key, true
	}
	w.rules.newest = max(w.rules.newest, key)
}

// order checks a key about to go from ring i against the last delivered:
// in order, it becomes the last; late, it is counted.
func (w *window) order(i int, key uint64) (late bool) {
	if key >= w.last {
		w.last = key
		return false
	}
	w.s.CountLate(i)
	return true
}

// keyAt reads a copy's key: the u64 at KeyOffset, 0 for a sample too short
// to hold it.
func (w *window) keyAt(data []byte) uint64 {
	if w.keys.end > len(data) {
		return 0
	}
	return binary.NativeEndian.Uint64(data[w.keys.offset:])
}
