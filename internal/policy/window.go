// SPDX-License-Identifier: Apache-2.0

package policy

// The ordered merge over BPF ring buffers (Options.Order): the records are
// copied out of the rings into a window of bounded size, and their space is
// handed back at once; the window delivers them in key order.
//
// Why copies, where perf rings are merged in place (ordered.go): a ring
// buffer wakes its reader only when the record committed is the one at the
// consumer position, so a record held in place would silence the wakeups
// for everything behind it, and the ring would fill while the reader
// sleeps; and a ring written by several CPUs (one ring buffer, a ring per
// N CPUs) holds its records in the order they were reserved, not in the
// order of their keys, so that only a window that sees several of them can
// sort them.

import (
	"encoding/binary"
	"errors"
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
	// OneWriter says, for each ring, whether one CPU alone writes it: its
	// keys then only grow (rule 1). A ring buffer shared by CPUs does not
	// count for rule 1, and while one is read rule 1 releases nothing.
	OneWriter []bool
}

// window is the ordered merge over ring buffers. Its rules are the Order's,
// over the copies:
//
//  1. every ring is written by one CPU and has shown a key at least as
//     large (its newest key copied; an empty ring or one whose next
//     record is busy holds back the keys above its newest);
//  2. a key Window larger has been copied from any ring;
//  3. the record was copied MaxDelay ago;
//  4. the window is full (and until it is down to three quarters), or a
//     ring is more than an eighth full at an intake while the reader
//     delivers, or three quarters after a wait, or its producers wrote a
//     chunk while an intake copied one (see hot);
//  5. a Flush or Close is under way.
type window struct {
	s         *Set
	keyOffset int
	keyFn     func([]byte) uint64
	keyWindow uint64
	maxDelay  time.Duration
	dueSlack  time.Duration
	dropLate  bool
	limit     int // Bytes

	rs []windowRing
	// The copies, in runs of keys that do not fall (a ring's records
	// mostly come in key order: a ring of one CPU is one run), and a heap
	// of the runs by their first copy's key (tie its seq, ref the run).
	runs    []copyRun
	idle    []int // runs with no copy, not in the heap
	heap    keyHeap
	lastRun int // the run the last copy went to; -1: none
	held    int // copies in the window
	slots   []copySlot
	free    []int32 // slots not in use
	arena   arena

	seq     uint64 // copies made: the heap's tie break, arrival order
	newest  uint64 // the largest key copied
	last    uint64 // the largest key delivered
	shared  int    // rings written by several CPUs
	minSeen uint64 // the smallest newest key over the rings (rule 1); valid when allSeen
	allSeen bool
	full    bool // rule 4 releases: the window filled and is still above three quarters
	look    bool // take in the rings before the next release
	// Under a flood the window always has records to release: it takes
	// the rings in again once it delivered a quarter of the smallest
	// ring's bytes since it last did (as a turn of the fullest-first
	// policy commits), so that the rings do not fill meanwhile.
	sinceTake, takeEvery int
	// A ring's copies, and the hot ring's records, are committed every
	// chunk bytes (commitChunk of the smallest ring), not only at the
	// intake: the hot ring when sinceTake reaches hotDue.
	chunk, hotDue int
	drain         bool // a Flush took in every ring: deliver the window, take nothing more
	start         time.Time

	out   ring.Record // the record being delivered
	outAt int32       // its slot; -1: none
	tmp   ring.Record
	in    int   // the ring being taken in, for stage
	inAt  int64 // and when (one clock read a ring's intake)
	clock int64 // the last clock read (window.now) of rule 3

	// hot is the ring the reader fell behind, or -1: an intake found it
	// more than an eighth full while the reader was delivering (not after
	// a wait: waited; a wait that returned at once because the rings had
	// moved is none), or more than three quarters full after a wait
	// (Order's HighWater default over perf rings), or whose producers
	// wrote a chunk while an intake copied one. The producers outpace
	// the reader, and copying costs several times more a record than
	// reading in place (docs/performance.md, "The hot ring"); a smaller
	// burst that came while the reader waited is copied and ordered, and
	// so is a larger one if it is over by the time the reader copies it
	// (docs/performance.md, "A flood after a wait").
	// Its records are not copied but delivered from the ring at once,
	// merged with the window's smallest copy, the smaller key first (rule
	// 4: what comes later with a smaller key is Late), until a look finds
	// it empty or its next record busy, hotHold or more after a look last
	// found it more than an eighth full (hotAt). Only the record being
	// delivered is held in place, so the kernel's wakeups are not
	// silenced: the reader is busy, and every intake commits the ring.
	hot   int
	hotAt int64         // (window.now)
	hold  time.Duration // hotHold
	// waited: the reader waited since the last intake (Idle, and no
	// NoWait after it), or none was made.
	waited bool
	hrec   ring.Record // ring hot's next record, parsed and not delivered, if hhave
	hkey   uint64      // its key
	hhave  bool
	hout   bool // the record out is hrec
	// Each's loop over the hot ring (eachHot): the ring's own loop calls
	// hotF (w.hotRec, made once), which calls hfn.
	hloop ring.Record
	hotF  func(*ring.Record) error
	hfn   func(*ring.Record) error
	// stageF is w.stage, made once: a method value made at each intake
	// was an allocation an intake.
	stageF func(*ring.Record) error
}

// windowRing is what the window keeps of one ring.
type windowRing struct {
	cpu       int // the ring's CPU (ring.Record.CPU)
	oneWriter bool
	newest    uint64 // the largest key copied from it
	seen      bool
	staged    uint64 // samples copied and not delivered
	bytes     uint64 // their payloads' bytes
}

// copySlot is a copy: where its payload is in the arena, and what the
// record said. It holds no pointer, so that the slots cost the garbage
// collector nothing.
type copySlot struct {
	pos  uint64 // where the record was in its ring
	next uint64
	seen int64 // when it was copied (window.now)
	at   arenaRef
	ring int32 // (40 bytes in all)
}

func NewWindow(s *Set, cfg WindowConfig) *window {
	w := &window{
		s:         s,
		keyOffset: cfg.KeyOffset,
		keyFn:     cfg.Key,
		keyWindow: cfg.Window,
		maxDelay:  cfg.MaxDelay,
		dueSlack:  cfg.MaxDelay / 2,
		dropLate:  cfg.DropLate,
		limit:     max(cfg.Bytes, 1),
		outAt:     -1,
		lastRun:   -1,
		hot:       -1,
		hold:      hotHold,
		waited:    true,
		look:      true,
		start:     time.Now(),
	}
	smallest, largest := s.Rings[0].Cur().Size(), 0
	for i := range s.Rings {
		smallest = min(smallest, s.Rings[i].Cur().Size())
		largest = max(largest, s.Rings[i].Cur().Size())
		one := i < len(cfg.OneWriter) && cfg.OneWriter[i]
		w.rs = append(w.rs, windowRing{cpu: s.Rings[i].Cur().CPU(), oneWriter: one})
		if !one {
			w.shared++
		}
		s.Rings[i].Begin()
	}
	w.takeEvery = max(smallest/4, 1)
	w.chunk = min(commitChunk(smallest), w.takeEvery)
	w.hotDue = w.chunk
	w.reserve(min(w.limit, largest))
	w.out.Type = ring.Sample
	w.hotF, w.stageF = w.hotRec, w.stage
	return w
}

// reserve makes room for n bytes of copies before the first intake: the
// arena's chunks, and slots and a run for copies of 64 bytes. NewWindow
// reserves a full ring's worth (at most Bytes), so that a flood's first
// intake, which may copy most of a ring, does not grow the heap: grown
// there, 2 to 4 MiB of copies started up to four garbage collections,
// which held that intake, and the ring's space, for 10 to 40 ms while the
// ring filled (docs/performance.md, "The window made at NewReader").
// Allocations this large, from memory the heap has not used before, are
// the OS's untouched zero pages until used; beyond n the window grows on
// demand, up to Bytes.
func (w *window) reserve(n int) {
	w.arena.reserve(n)
	copies := n / 64
	w.slots = make([]copySlot, 0, copies)
	w.free = make([]int32, 0, copies)
	w.runs = append(w.runs, copyRun{q: make([]heapEntry, 0, copies)})
	w.idle = append(w.idle, len(w.runs)-1)
}

func (w *window) now() int64 { return int64(time.Since(w.start)) }

// AddRing: ring buffers do not come and go with CPUs.
func (w *window) AddRing(int) {}

// Oldest is where ring i's records not copied and not delivered start:
// the window's copies are no longer the ring's (Held counts them at
// Close); a hot ring's next record is parsed and still the ring's.
func (w *window) Oldest(i int) uint64 {
	if i == w.hot && w.hhave {
		return w.hrec.Pos
	}
	return w.s.Rings[i].Cur().Pos()
}

// Held returns the samples of ring i copied and not delivered: at Close,
// they are left undelivered like those in the ring.
func (w *window) Held(i int) uint64 { return w.rs[i].staged }

// CommitPublish hands ring i's space back up to Oldest and publishes its
// counts: what it parsed but the copies held and a hot ring's next record.
func (w *window) CommitPublish(i int) {
	if err := w.s.Rings[i].Cur().Commit(w.Oldest(i)); err != nil {
		panic(err) // the cursor, or a record parsed: a record boundary past the tail
	}
	w.publish(i)
}

func (w *window) publish(i int) {
	st, r := w.s.Rings[i].Cur().Counts(), &w.rs[i]
	samples, bytes := st.Samples-r.staged, st.Bytes-r.bytes
	if i == w.hot && w.hhave {
		samples, bytes = samples-1, bytes-uint64(len(w.hrec.Data))
	}
	held := int64(-1)
	if w.held > 0 {
		// The copy that goes next, if it is this ring's: the window
		// releases its copies in key order, about the order of their
		// age.
		if sl := &w.slots[w.min().ref]; int(sl.ring) == i {
			held = sl.seen + int64(w.start.Sub(epoch))
		}
	}
	w.s.Publish(i, w.Oldest(i), samples, bytes, st.Lost, held)
}

// takeIn copies what ring i holds now into the window, as far as it has
// room, and hands the space back; a ring more than an eighth full at an
// intake not after a wait, or three quarters after one, becomes hot
// instead, and so does one whose producers wrote a chunk while the intake
// copied one (the rest is then read in place); the hot ring stays so
// while it holds records or within the hold.
func (w *window) takeIn(i int) {
	rb := w.s.Rings[i]
	if i == w.hot {
		w.CommitPublish(i) // what was delivered in place
	}
	rb.Refresh()
	cur := rb.Cur()
	hurry := !w.drain && !w.s.Flushing() && !w.s.Stop.Load() && !cur.Failed()
	switch {
	case i == w.hot && hurry && cur.Pending() > cur.Size()/8:
		w.hotAt = w.now()
		return
	case i == w.hot && hurry && (cur.Pending() > 0 || w.holdHot()):
		return
	case i == w.hot:
		w.coolDown()
	case w.hot < 0 && hurry && cur.Pending() > cur.Size()/8 && (!w.waited || cur.Pending() > cur.Size()/4*3):
		// (Behind at an eighth: entering at half lost 4-15 % in the
		// median flood round, at three quarters 7-42 %, at an eighth
		// 0-2.5 %.)
		w.hot, w.hotAt = i, w.now()
		return
	}
	if cur.Pending() == 0 && !cur.Failed() || w.isFull() {
		return // (a pending corruption: Each returns it, to be skipped and reported)
	}
	w.in, w.inAt = i, w.now()
	w.clock = w.inAt
	head := cur.Head()
	for {
		// (The snapshot's records, a chunk at a time: what was copied is
		// the window's, and its space goes back at once.)
		_, used, err := rb.Each(&w.tmp, uint64(w.chunk), nil, w.stageF, nil)
		if err != nil && err != errWindowFull {
			// A record that cannot be valid: nothing is held in the ring, so
			// skipping to its head hands back nothing still in use.
			w.s.SkipCorrupt(i, err)
		}
		if err != nil || int(used) < w.chunk {
			break
		}
		w.CommitPublish(i)
		if w.hot < 0 && hurry && cur.LoadHead()-head >= uint64(w.chunk) {
			// The producers wrote a chunk while this intake copied: not a
			// burst that came while the reader waited but a flood, which
			// copying would let fill the ring. The rest is read in place.
			w.hot, w.hotAt = i, w.now()
			break
		}
	}
	w.tmp = ring.Record{}
	w.CommitPublish(i)
}

// holdHot reports whether the hot ring stays hot with nothing to read now:
// a look found it more than an eighth full less than hotHold ago.
func (w *window) holdHot() bool { return w.now()-w.hotAt < int64(w.hold) }

// pullHot parses the hot ring's next record into hrec, or reports false:
// when a look finds the ring empty or its next record busy, the ring stays
// hot within hotHold and is cooled after; a corruption cools it at once
// (skipped, for the read to report).
func (w *window) pullHot() bool {
	i := w.hot
	rb := w.s.Rings[i]
	for tries := 0; ; tries++ {
		var ok bool
		var err error
		if r, is := rb.(*ring.RingBuf); is {
			ok, err = r.Next(&w.hrec) // (a direct call: the window reads ring buffers)
		} else {
			ok, err = rb.Next(&w.hrec)
		}
		switch {
		case ok:
			w.hkey, w.hhave = w.keyOf(w.hrec.Data), true // (a ring buffer's record is one piece)
			w.saw(i, w.hkey)
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
	i := w.hot
	w.hot = -1
	if w.hhave {
		w.hhave = false
		w.in, w.inAt = i, w.now()
		w.stage(&w.hrec) // (errWindowFull: the copy is in, which may pass the bound by one)
		w.hrec = ring.Record{}
	}
}

// leaveHot ends the hot ring's turn from a look at it (pullHot, eachHot):
// a corruption it met, if err is one, is skipped for the read to report;
// its record parsed, if any, is copied in (coolDown); the ring is
// committed, and what comes next is copied in at the next intake.
func (w *window) leaveHot(err error) {
	i := w.hot
	if err != nil {
		w.s.SkipCorrupt(i, err)
	}
	w.coolDown()
	w.CommitPublish(i)
	w.look = true
}

// hotHold is how long a ring stays hot at least after a look found it
// more than an eighth full. Under a flood, each return to copying takes
// in a millisecond or more of records and delivers them cold while the
// ring fills again: leaving the hot ring at once lost 1.4-5.3 % in the
// median round, staying 10 ms 0-1.3 % (docs/performance.md, "The hot
// ring").
const hotHold = 10 * time.Millisecond

// errWindowFull ends a ring's intake once the window is full; the record
// stage returned it for is in the window. It never leaves this file.
var errWindowFull = errors.New("window full")

// stage copies one record of ring w.in into the window; errWindowFull
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
	key := w.keyOf(buf)
	w.seq++
	var slot int32
	if k := len(w.free); k > 0 {
		slot, w.free = w.free[k-1], w.free[:k-1]
	} else {
		slot = int32(len(w.slots))
		w.slots = append(w.slots, copySlot{})
	}
	w.slots[slot] = copySlot{at: at, pos: rec.Pos, next: rec.Next, seen: w.inAt, ring: int32(w.in)}
	w.add(heapEntry{key: key, tie: w.seq, ref: int(slot)})
	r := &w.rs[w.in]
	r.staged++
	r.bytes += uint64(n)
	w.saw(w.in, key)
	if w.over() {
		return errWindowFull
	}
	return nil
}

// keyOf reads a copy's key: the u64 at KeyOffset (0 for a sample too short
// to hold it), or Order.Key's.
func (w *window) keyOf(data []byte) uint64 {
	if w.keyFn != nil {
		return w.keyFn(data)
	}
	return w.keyAt(data)
}

// keyAt reads the u64 at KeyOffset, 0 for a sample too short to hold it.
func (w *window) keyAt(data []byte) uint64 {
	if w.keyOffset+8 > len(data) {
		return 0
	}
	return binary.NativeEndian.Uint64(data[w.keyOffset:])
}

// takeInAll takes in every ring and recomputes rule 1's bound.
func (w *window) takeInAll() {
	w.sinceTake, w.hotDue = 0, w.chunk
	for i := range w.rs {
		w.takeIn(i)
	}
	w.waited = false
	w.allSeen = w.shared == 0
	w.minSeen = ^uint64(0)
	for i := range w.rs {
		r := &w.rs[i]
		if !r.seen {
			w.allSeen = false
			break
		}
		w.minSeen = min(w.minSeen, r.newest)
	}
}

// releasable reports whether the smallest copy may go (rules 1 to 5).
func (w *window) releasable() bool {
	e := w.min()
	switch {
	case w.drain || w.s.Flushing() || w.s.Stop.Load(): // rule 5
		return true
	case w.allSeen && e.key <= w.minSeen: // rule 1
		return true
	case w.newest >= w.keyWindow && e.key <= w.newest-w.keyWindow: // rule 2
		return true
	case w.due(w.slots[e.ref].seen):
		return true // rule 3
	}
	return w.isFull() // rule 4
}

// due reports rule 3 for a copy made at seen. It reads the clock only
// when the last reading does not already show it due: under a flood, not
// once a record.
func (w *window) due(seen int64) bool {
	if w.clock-seen >= int64(w.maxDelay) {
		return true // (the clock only goes forward)
	}
	w.clock = w.now()
	return w.clock-seen >= int64(w.maxDelay)
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

// Next returns the copy that goes next and its ring, or -1 when none may
// go yet. A late record that DropLate drops is counted and passed over.
func (w *window) Next() (*ring.Record, int) {
	took := false // whether this call took the rings in
	for {
		if w.s.Flushing() && !w.drain {
			// A Flush: every ring taken in up to its head now (past the
			// flush's), then the window delivered, with nothing more
			// taken in, so that the flush ends while producers go on.
			w.takeInAll()
			w.drain = true
		} else if !w.s.Flushing() {
			w.drain = false
		}
		if (w.look || w.sinceTake >= w.takeEvery) && !w.drain {
			w.look = false
			w.takeInAll()
			took = true
		}
		inPlace := w.hot >= 0 && (w.hhave || w.pullHot())
		if inPlace {
			if w.held == 0 || w.hkey < w.min().key {
				if rec := w.fromHot(); rec != nil {
					return rec, w.hot
				}
				continue // late, and dropped
			}
			// The window's smallest goes first, due or not.
		} else if w.held == 0 && w.drain && !w.s.FlushReached(w) {
			// The window had no room for all of it: take in the rest.
			// If nothing comes (a ring corrupt, its error pending), the
			// read reports it.
			if w.takeInAll(); w.held > 0 {
				continue
			}
		}
		if !inPlace && (w.held == 0 || !w.releasable()) {
			w.look = true // take in before the next release
			if took || w.drain {
				return nil, -1
			}
			continue
		}
		e := w.popMin()
		sl := &w.slots[e.ref]
		i := int(sl.ring)
		late, drop := w.order(i, e.key)
		if drop {
			w.outAt = int32(e.ref)
			w.Delivered(i)
			continue
		}
		// (w.out is a sample with no Wrapped part: only these change)
		out := &w.out
		out.Ring, out.CPU, out.Pos, out.Next = i, w.rs[i].cpu, sl.pos, sl.next
		out.Data, out.Key, out.Late = w.arena.bytesOf(sl.at), e.key, late
		w.outAt = int32(e.ref)
		return &w.out, i
	}
}

// NextCopy is Next's common case under a flood for a copying read, in one
// call: the hot ring's next record copied straight into c
// (ring.RingBuf.NextCopy) and delivered, when the window holds no copy, no
// intake or flush is due, and the ring's next record is a committed
// sample. A late key goes as Next would send it: marked Late and counted,
// or dropped (DropLate), and then NextCopy reports false. False: Next's
// way, which looks again.
func (w *window) NextCopy(c *ring.Copy) bool {
	i := w.hot
	if i < 0 || w.held != 0 || w.hhave || w.look || w.drain || w.sinceTake >= w.takeEvery || w.keyFn != nil || w.s.Flushing() {
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
	w.sinceTake += int(n)
	key := w.keyAt(c.Data) // (no Key: NextCopy's condition)
	w.saw(i, key)
	late, drop := w.order(i, key)
	c.Key, c.Late = key, late
	return !drop
}

// fromHot returns the hot ring's record parsed, to be delivered in place,
// or nil when it is late and DropLate dropped it.
func (w *window) fromHot() *ring.Record {
	late, drop := w.order(w.hot, w.hkey)
	if drop {
		w.hout = true
		w.Delivered(w.hot)
		return nil
	}
	w.hrec.Key, w.hrec.Late, w.hout = w.hkey, late, true
	return &w.hrec
}

// Delivered ends the delivery of the record Next returned: its copy goes
// back to the pool, or the hot ring's cursor is past it.
func (w *window) Delivered(i int) {
	if w.hout {
		w.hout, w.hhave = false, false
		w.sinceTake += int(w.hrec.Next - w.hrec.Pos)
		w.commitHot(i)
		return
	}
	if w.outAt < 0 {
		return
	}
	sl := &w.slots[w.outAt]
	r := &w.rs[i]
	r.staged--
	r.bytes -= uint64(sl.at.n)
	w.sinceTake += int(sl.at.n) + 8 // (as in the ring: the header's 8 bytes)
	w.arena.release(sl.at)
	w.free = append(w.free, w.outAt)
	w.outAt = -1
}

// Idle publishes every ring and waits at most MaxLatency, and until the
// smallest copy is due (rule 3), or up to MaxDelay/2 later. The rings are
// committed as they are taken in: the kernel wakes the reader for the
// next record of each.
func (w *window) Idle() (time.Duration, time.Duration) {
	w.waited = true
	timeout, slack := w.s.Latency, time.Duration(0)
	for i := range w.rs {
		w.CommitPublish(i)
	}
	if w.held > 0 {
		due := time.Duration(w.slots[w.min().ref].seen + int64(w.maxDelay) - w.now())
		if timeout < 0 || due+w.dueSlack < timeout {
			timeout, slack = max(due, 0), w.dueSlack
		}
	}
	return timeout, slack
}

// NoWait: the read went on after Idle without waiting.
func (w *window) NoWait() { w.waited = false }

// Each delivers up to 256 copies in key order before it returns for the
// read to look at its context; or, while a ring is hot and the window holds
// no copy, that ring's records through the ring's own loop (eachHot).
func (w *window) Each(fn func(*ring.Record) error) (bool, error) {
	for n := 0; n < 256; n++ {
		if w.hot >= 0 && w.held == 0 && !w.hhave && w.sinceTake < w.takeEvery && !w.drain && !w.s.Flushing() {
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
		if err != nil || w.s.Stop.Load() {
			return true, err
		}
	}
	return true, nil
}

// eachHot runs the hot ring's records through the ring's loop, in place,
// up to the next intake (takeEvery): the fullest-first Reader's loop, with
// a key and a comparison a record (hotRec). The window holds no copy, so
// each record is the smallest there is. It reports false when the ring's
// snapshot had no record: its end, a busy record and the intake are Next's
// to look at.
func (w *window) eachHot(fn func(*ring.Record) error) (ran bool, err error) {
	i := w.hot
	rb := w.s.Rings[i]
	w.hfn = fn
	n, used, err := rb.Each(&w.hloop, uint64(min(w.takeEvery, w.hotDue)-w.sinceTake), &w.s.Stop, w.hotF, nil)
	w.hfn, w.hloop = nil, ring.Record{}
	w.sinceTake += int(used)
	w.commitHot(i)
	if _, ok := err.(*ring.CorruptError); ok && rb.Cur().IsCorrupt(err) {
		w.leaveHot(err)
		return true, nil
	}
	return n > 0 || err != nil, err
}

// commitHot commits hot ring i up to its records delivered, once a chunk
// was delivered since the last commit.
func (w *window) commitHot(i int) {
	if w.sinceTake >= w.hotDue {
		w.CommitPublish(i)
		w.hotDue = w.sinceTake + w.chunk
	}
}

// hotRec is eachHot's function for each record of the hot ring: its key,
// Late, rules 1 and 2's bookkeeping, then the read's function. A late
// record DropLate drops is counted and passed over.
func (w *window) hotRec(rec *ring.Record) error {
	key := w.keyOf(rec.Data) // (a ring buffer's record is one piece)
	w.saw(w.hot, key)
	late, drop := w.order(w.hot, key)
	if drop {
		return nil
	}
	rec.Key, rec.Late = key, late
	return w.hfn(rec)
}

// saw notes a key taken from ring i, copied or read in place: the ring's
// newest (rule 1) and the newest of all (rule 2).
func (w *window) saw(i int, key uint64) {
	if r := &w.rs[i]; !r.seen || key > r.newest {
		r.newest, r.seen = key, true
	}
	w.newest = max(w.newest, key)
}

// order checks a key about to go from ring i against the last delivered:
// in order, it becomes the last; late, it is counted, and drop reports
// that DropLate drops it.
func (w *window) order(i int, key uint64) (late, drop bool) {
	if key >= w.last {
		w.last = key
		return false, false
	}
	w.s.CountLate(i, w.dropLate)
	return true, w.dropLate
}

// copyRun is a run of copies whose keys do not fall, oldest first: q[head:].
type copyRun struct {
	q    []heapEntry // key, seq (tie), slot (ref)
	head int
	tail uint64 // the last key added
}

// maxRunScan bounds how many runs add looks at for one that takes a key,
// beyond the last one used: a key that fits none of them starts a run.
const maxRunScan = 8

// add puts a copy in a run: the run the last copy went to if the key does
// not fall below its last, else the first of a few others that takes it,
// else a new run. Copies in key order (a ring of one CPU, or a shared
// ring's records reserved in key order) cost no sift: the heap holds runs,
// and only a run's first copy is in it.
func (w *window) add(e heapEntry) {
	w.held++
	j := w.lastRun
	if j < 0 || w.runs[j].tail > e.key || w.runs[j].head == len(w.runs[j].q) {
		j = -1
		for k, scanned := 0, 0; k < len(w.heap) && scanned < maxRunScan; k, scanned = k+1, scanned+1 {
			if r := &w.runs[w.heap[k].ref]; r.tail <= e.key {
				j = w.heap[k].ref
				break
			}
		}
	}
	if j < 0 {
		if k := len(w.idle); k > 0 {
			j, w.idle = w.idle[k-1], w.idle[:k-1]
		} else {
			j = len(w.runs)
			w.runs = append(w.runs, copyRun{})
		}
		r := &w.runs[j]
		r.q, r.head, r.tail = append(r.q[:0], e), 0, e.key
		w.heap.push(heapEntry{key: e.key, tie: e.tie, ref: j})
	} else {
		r := &w.runs[j]
		r.q, r.tail = append(r.q, e), e.key
	}
	w.lastRun = j
}

// min returns the smallest copy: the first of the heap's first run.
func (w *window) min() heapEntry {
	r := &w.runs[w.heap[0].ref]
	return r.q[r.head]
}

// popMin removes the smallest copy and returns it.
func (w *window) popMin() heapEntry {
	w.held--
	j := w.heap[0].ref
	r := &w.runs[j]
	e := r.q[r.head]
	r.head++
	if r.head == len(r.q) {
		w.heap.pop()
		r.q, r.head = r.q[:0], 0
		w.idle = append(w.idle, j)
		if w.lastRun == j {
			w.lastRun = -1
		}
		return e
	}
	if r.head >= 1024 && r.head*2 >= len(r.q) {
		r.q = r.q[:copy(r.q, r.q[r.head:])] // (a long run keeps its array)
		r.head = 0
	}
	next := r.q[r.head]
	w.heap[0].key, w.heap[0].tie = next.key, next.tie
	w.heap.siftDown()
	return e
}

// arena holds the copies' payloads: chunks filled in the order the copies
// are made, each freed for reuse once its last copy is released. The
// window releases its copies in key order, about the order they came in,
// so that chunks empty in turn; a copy held long (rule 3 bounds how long)
// keeps only its chunk.
type arena struct {
	chunks [][]byte
	live   []int32 // copies not released, per chunk
	spare  []int32 // empty chunks of chunkSize, for reuse
	cur    int32   // the chunk being filled; -1: none
	off    int     // where its free space starts
	bytes  int     // the chunks' bytes, but the spare ones'
	used   int     // the payloads' bytes, each rounded up to 8
}

// chunkSize is an arena chunk's size; a larger payload gets a chunk of
// its own.
const chunkSize = 64 << 10

// arenaRef is where a payload lies: its chunk, offset and length.
type arenaRef struct {
	chunk int32
	off   int32
	n     int32
}

// reserve adds spare chunks for n bytes (rounded down). It makes the
// arena: it is called once, before the first alloc.
func (a *arena) reserve(n int) {
	a.cur = -1
	for range n / chunkSize {
		a.spare = append(a.spare, int32(len(a.chunks)))
		a.chunks, a.live = append(a.chunks, make([]byte, chunkSize)), append(a.live, 0)
	}
}

// alloc returns room for n bytes and where it lies.
func (a *arena) alloc(n int) (arenaRef, []byte) {
	if a.cur < 0 || a.off+n > len(a.chunks[a.cur]) {
		a.next(n)
	}
	ref := arenaRef{chunk: a.cur, off: int32(a.off), n: int32(n)}
	a.live[a.cur]++
	a.off += (n + 7) &^ 7
	a.used += (n + 7) &^ 7
	return ref, a.chunks[a.cur][ref.off : int(ref.off)+n : int(ref.off)+n]
}

// next starts a chunk with room for n bytes.
func (a *arena) next(n int) {
	old := a.cur
	switch k := len(a.spare); {
	case n <= chunkSize && k > 0:
		a.cur, a.spare = a.spare[k-1], a.spare[:k-1]
	default:
		a.cur = int32(len(a.chunks))
		for i, c := range a.chunks {
			if c == nil { // a slot freed by a large chunk
				a.cur = int32(i)
				break
			}
		}
		mem := make([]byte, max(n, chunkSize))
		if int(a.cur) == len(a.chunks) {
			a.chunks, a.live = append(a.chunks, mem), append(a.live, 0)
		} else {
			a.chunks[a.cur] = mem
		}
	}
	a.off = 0
	a.bytes += len(a.chunks[a.cur])
	if old >= 0 && a.live[old] == 0 {
		a.drop(old) // (emptied while it was being filled)
	}
}

// bytesOf returns the payload at ref.
func (a *arena) bytesOf(ref arenaRef) []byte {
	return a.chunks[ref.chunk][ref.off : ref.off+ref.n : ref.off+ref.n]
}

// release frees the payload at ref; its chunk, once empty and no longer
// being filled, is kept for reuse (or dropped, if larger than chunkSize).
func (a *arena) release(ref arenaRef) {
	a.used -= (int(ref.n) + 7) &^ 7
	if a.live[ref.chunk]--; a.live[ref.chunk] == 0 && ref.chunk != a.cur {
		a.drop(ref.chunk)
	}
}

// drop takes empty chunk c out of use.
func (a *arena) drop(c int32) {
	a.bytes -= len(a.chunks[c])
	if len(a.chunks[c]) == chunkSize {
		a.spare = append(a.spare, c)
	} else {
		a.chunks[c] = nil
	}
}
