// SPDX-License-Identifier: Apache-2.0

package policy

// The ordered policy (Options.Order): every ring merged in key order, the
// records kept in the rings until delivered. The merge takes the smallest
// front from a heap (heap.go); when a ring shows no record, the
// release rule (release.go) says whether the smallest may go anyway.

import (
	"encoding/binary"
	"slices"
	"time"

	"github.com/perfbuf/perfbuf/internal/ring"
)

// orderedRing is the merge's state for one ring. Only its front, the next
// record to deliver from it, is parsed: a CPU's records come in key order,
// so the front is the ring's smallest key and the records behind it can
// wait in the ring unparsed.
type orderedRing struct {
	cur *ring.Cursor // the ring's Cur, kept: load asks it for every record

	front ring.Record // valid when has; aliases the ring like any ring.Record
	key   uint64      // front's key, for a sample
	has   bool

	newest uint64 // the largest key parsed from the ring, front and look-ahead included
	seen   bool   // newest is valid

	// scanned is how far rule 2's look-ahead parsed beyond the front.
	scanned uint64
	// marks say when the reader first saw the ring's records (rule 3):
	// oldest first; those behind the front are dropped.
	marks []mark
	// dueBefore: the records below it are due by rule 3 (a cache of marks).
	dueBefore uint64

	freed int // bytes delivered since the ring's last commit
}

// saw notes key as parsed from the ring.
func (r *orderedRing) saw(key uint64) {
	if !r.seen || key > r.newest {
		r.newest, r.seen = key, true
	}
}

// ordered merges the rings by key.
//
// The heap holds the rings whose front is a sample; the others wait
// (waiting): no front, or a lost record as front. Only the root's ring
// changes between two calls of next, by delivering its front, so next
// begins by putting the root back in place (fixRoot).
type ordered struct {
	s         *Set
	rs        []orderedRing
	keys      keyReader
	window    uint64
	maxDelay  time.Duration
	markGrain int64 // marks closer in time than this are merged: MaxDelay/32
	// dueSlack is how late rule 3's timer may fire: MaxDelay/2.
	dueSlack  time.Duration
	highWater int
	commitAt  int  // bytes delivered from a ring before its tail is committed
	pressure  bool // released by rule 4: commit at once
	heap      keyHeap
	waiting   []int
	newest    uint64 // the largest key parsed from any ring
	last      uint64 // largest key released
	start     time.Time
	// look: next looks at the waiting rings (a load of each one's
	// data_head) only when set: when the merge took a new head snapshot of
	// a ring, found nothing to release, took up a Flush or delivered a lost
	// record, not once per record.
	look bool
	tmp  ring.Record
	run  orderedRun
}

// orderedRun is the merge's run (ordered_run.go): the ring whose front
// next released by rule 1, and the smallest front key of the other rings
// then. Until one of those is delivered, that ring's records up to bound
// go next by rule 1, and deliverRun delivers them through the ring's loop,
// bounded by sink.
type orderedRun struct {
	ring  int // -1: no run
	bound uint64
	sink  ring.Sink  // the ring loop's bounds: KeyEnd, set once, and [last, bound]
	into  *ring.Sink // the owner's sink: CopyInto's batch, or EachSteps's steps
}

// keyReader says where a sample's key is: the u64 at offset, in host
// byte order. The merge and the window read keys through it.
type keyReader struct {
	offset int
	end    int // offset+8: the merge reads a key in line below it
}

// OrderConfig is what the merge takes of an Order: the key's offset,
// MaxDelay and rule 2's key window (defaults resolved), HighWater (zero: a
// quarter of a ring).
type OrderConfig struct {
	KeyOffset int
	MaxDelay  time.Duration
	Window    uint64
	HighWater int
	// Stamped: the keys are bpf_ktime_get_ns() read after the record's
	// reservation (Order.StampedKeys); the window over ring buffers
	// applies rule 1 to a ring it finds empty (windowRules.stamped).
	Stamped bool
}

func NewOrdered(s *Set, cfg OrderConfig) *ordered {
	o := &ordered{
		s:         s,
		keys:      keyReader{offset: cfg.KeyOffset, end: cfg.KeyOffset + 8},
		maxDelay:  cfg.MaxDelay,
		window:    cfg.Window,
		highWater: cfg.HighWater,
		start:     time.Now(),
		run:       orderedRun{ring: -1},
		look:      true,
	}
	o.run.sink.KeyEnd = uint64(o.keys.end)
	size := s.Rings[0].Cur().Size()
	if o.highWater == 0 {
		o.highWater = size / 4
	}
	o.commitAt = commitChunk(size)
	o.markGrain = int64(o.maxDelay / 32)
	o.dueSlack = o.maxDelay / 2
	o.rs = make([]orderedRing, 0, len(s.Rings))
	o.heap = make(keyHeap, 0, len(s.Rings))
	o.waiting = make([]int, 0, len(s.Rings))
	for i := range s.Rings {
		o.AddRing(i)
	}
	return o
}

// AddRing takes in ring i, the last: it waits for a front, and what it
// holds now was first seen now (rule 3).
func (o *ordered) AddRing(i int) {
	rb := o.s.Rings[i]
	rb.Begin()
	o.rs = append(o.rs, orderedRing{cur: rb.Cur(), scanned: rb.Cur().Tail(), dueBefore: rb.Cur().Tail()})
	o.waiting = append(o.waiting, i)
	o.run.ring = -1 // rule 1 waits for this ring too: no run goes on past it
	if rb.Cur().Pending() > 0 {
		o.mark(i, rb.Cur().Head())
	}
}

func (o *ordered) now() int64 { return int64(time.Since(o.start)) }

// saw notes key as parsed from ring r, and as the newest of all if it is.
func (o *ordered) saw(r *orderedRing, key uint64) {
	r.saw(key)
	o.newest = max(o.newest, key)
}

// key reads a sample's key: the u64 at KeyOffset (0 for a sample too short
// to hold it; Order.check bounds the offset, so the sum cannot overflow).
func (k *keyReader) key(rec *ring.Record) uint64 {
	if k.end <= len(rec.Data) {
		return binary.NativeEndian.Uint64(rec.Data[k.offset:]) // (in line: the common case)
	}
	return k.cut(rec)
}

// cut is key for a key at KeyOffset that a short sample or the ring's end
// cuts. Not inlined, so that key is, with the common case only.
//
//go:noinline
func (k *keyReader) cut(rec *ring.Record) uint64 {
	off := k.offset
	if off+8 > rec.Len() {
		return 0
	}
	var b [8]byte // the key straddles the ring's end
	for j := range b {
		if i := off + j; i < len(rec.Data) {
			b[j] = rec.Data[i]
		} else {
			b[j] = rec.Wrapped[i-len(rec.Data)]
		}
	}
	return binary.NativeEndian.Uint64(b[:])
}

// Next returns the front that goes next and its ring, or -1 when none may
// go yet. A late record is counted.
//
// Per record it costs a sift of the heap, O(log rings), and none within a
// run (rule 1 over the records of one ring below the other fronts). The
// rings without a front (idle CPUs' rings, whose next record could come
// first) are looked at (ring.quiet: a load of their head) when look says
// the view moved: a new head snapshot of any ring, nothing to release, a
// Flush, a lost or corrupt record; so once per snapshot's records, not once
// per record.
// Under rule 1 that misses nothing (a waiting ring's next keys are at
// least its newest); under rules 2 and 3 a record that arrives on an idle
// ring meanwhile joins at the next look.
func (o *ordered) Next() (*ring.Record, int) {
	// A run (see run) goes on here too, record by record (ReadInto): while
	// the run's ring's next record keys within [o.last, o.run.bound], rule 1
	// still releases it and the heap's order holds (the root's key grows
	// within the bound), so it goes without the merge's look and sift.
	// During a flush it goes on while the record lies before the ring's
	// flush head (Set.FlushNeeds): the flush must deliver it, so the flush
	// is not reached yet, which is all merge would have checked.
	if i := o.run.ring; i >= 0 {
		flushing := o.s.Flushing()
		if !flushing || o.s.FlushNeeds(i, o.Oldest(i)) {
			r := &o.rs[i]
			if (r.has || o.load(i)) && r.front.Type == ring.Sample && r.key >= o.last {
				if r.key <= o.run.bound {
					o.heap[0].key = r.key // (heap[0] is ring i's: only next changes the heap)
					o.last = r.key
					r.front.Key, r.front.Late = r.key, false
					return &r.front, i
				}
				// The run ended at a sample above its bound (the rings'
				// keys interleave): every ring still shows a sample, so
				// rule 1 releases the new root's, as merge would, without
				// its look, flush and release checks; during a flush,
				// merge checks whether the flush was reached.
				if !flushing {
					return o.nextRoot(r)
				}
			}
		}
	}
	return o.merge()
}

// merge is Next past a run: it puts the root in place, looks at the
// waiting rings if look says so, and applies the release rule.
func (o *ordered) merge() (*ring.Record, int) {
	o.run.ring = -1
	if o.s.flushReq.Load() {
		o.look = true // a Flush: what the idle rings hold now goes too
	}
	if o.s.Flushing() && o.s.FlushReached(o) {
		return nil, -1 // the read returns ErrFlushed
	}
	o.fixRoot()
	// The rings without a front: a lost record goes at once (its ring
	// stays waiting: delivered empties it), a sample joins the heap.
	look := o.look
	o.look = false
	for k := 0; look && k < len(o.waiting); {
		i := o.waiting[k]
		r := &o.rs[i]
		if !r.has && (o.s.Rings[i].Quiet() || !o.load(i)) {
			k++
			continue
		}
		if r.front.Type != ring.Sample {
			return &r.front, i // lost records carry no key: at once
		}
		o.waiting = slices.Delete(o.waiting, k, k+1)
		o.heap.push(heapEntry{key: r.key, tie: uint64(i), ref: i})
	}
	if len(o.heap) == 0 {
		o.look = true
		return nil, -1
	}
	best, key := o.heap[0].ref, o.heap[0].key
	if len(o.waiting) == 0 {
		o.pressure = false // rule 1: every other front is at least as large
		o.run.ring, o.run.bound = best, o.heap.second()
	} else if !o.releasable(best) {
		o.look = true
		return nil, -1
	}
	front := &o.rs[best].front
	front.Key, front.Late = key, key < o.last
	if !front.Late {
		o.last = key
	} else {
		o.run.ring = -1
		o.s.CountLate(best)
	}
	return front, best
}

// nextRoot is Next when the run's ring r, the root, shows a sample above
// the run's bound and every ring is in the heap (a run is on): the root goes
// down to its place, and the new root's front goes by rule 1 and starts a
// run. It is not late: its key is the run's bound, the smallest of the other
// fronts when the run began, and the run delivered keys up to it only.
func (o *ordered) nextRoot(r *orderedRing) (*ring.Record, int) {
	o.newest = max(o.newest, r.newest) // from a run
	o.look = false                     // (no ring waits: nothing to look at)
	o.pressure = false
	if h := o.heap; len(h) == 2 {
		h[0], h[1] = h[1], h[0] // (r's key is above the other's: it goes down)
		h[1].key = r.key
	} else {
		h[0].key = r.key
		h.siftDown()
	}
	best, key := o.heap[0].ref, o.heap[0].key
	o.run.ring, o.run.bound, o.last = best, o.heap.second(), key
	front := &o.rs[best].front
	front.Key, front.Late = key, false
	return front, best
}

// fixRoot loads the root's next front if it has none, and sifts it down to
// its place, or moves it to the waiting rings when its ring has no sample
// to show.
func (o *ordered) fixRoot() {
	if len(o.heap) == 0 {
		return
	}
	i := o.heap[0].ref
	r := &o.rs[i]
	o.newest = max(o.newest, r.newest) // from a run
	if !r.has && !o.s.Rings[i].Quiet() {
		o.load(i)
	}
	if r.has && r.front.Type == ring.Sample {
		o.heap[0].key = r.key
		o.heap.siftDown()
	} else {
		if r.has {
			o.look = true // a lost record: next delivers it at once
		}
		o.waiting = append(o.waiting, o.heap.pop().ref)
	}
}

// load parses ring i's next record into its front, taking a new head
// snapshot when the last one is used up. It reports whether the ring has a
// front.
func (o *ordered) load(i int) bool {
	r := &o.rs[i]
	if r.cur.Pending() == 0 {
		o.refresh(i)
	}
	ok, err := o.s.Rings[i].Next(&r.front)
	if err != nil {
		// Only the front is ever held, and it was delivered: skipping to
		// the head hands back nothing that is still in use.
		o.s.SkipCorrupt(i, err)
		o.publish(i)
		o.look = true // look at the ring again past the corruption
		return false
	}
	if ok {
		o.parsedFront(r)
	}
	return ok
}

// parsedFront completes r's front once parsed: its key, and the ring's
// newest key.
func (o *ordered) parsedFront(r *orderedRing) {
	r.has = true
	if r.front.Type != ring.Sample {
		return
	}
	r.key = o.keys.key(&r.front)
	o.saw(r, r.key)
}

// Delivered ends the delivery of ring i's front. The ring is committed once
// a chunk of it (commitChunk) was delivered, or at once when rule 4
// released it.
func (o *ordered) Delivered(i int) {
	r := &o.rs[i]
	r.has = false
	if r.front.Type != ring.Sample {
		o.look = true // its ring waits: look at it again at once
	}
	if r.freed += int(r.front.Next - r.front.Pos); r.freed >= o.commitAt || o.pressure {
		o.CommitPublish(i)
	}
}

// publish copies ring i's counts into the shared stats: what it parsed
// but its front, which is not delivered yet, and since when the front is
// held (rule 3's marks).
func (o *ordered) publish(i int) {
	st, r := o.s.Rings[i].Cur().Counts(), &o.rs[i]
	samples, bytes, lost := st.Samples, st.Bytes, st.Lost
	if r.has {
		switch r.front.Type {
		case ring.Sample:
			samples--
			bytes -= uint64(r.front.Len())
		case ring.Lost:
			lost -= r.front.Lost
		}
	}
	o.s.Publish(i, o.Oldest(i), samples, bytes, lost)
}

func (o *ordered) CommitPublish(i int) {
	o.commit(i)
	o.publish(i)
}

// Oldest is ring i's oldest record not delivered: its front, or where its
// cursor stands if it has none.
func (o *ordered) Oldest(i int) uint64 {
	if r := &o.rs[i]; r.has {
		return r.front.Pos
	}
	return o.s.Rings[i].Cur().Pos()
}

// commit hands ring i's delivered records back to the kernel: its tail
// moves to its front, or to its cursor if it has none.
func (o *ordered) commit(i int) {
	if err := o.s.Rings[i].Cur().Commit(o.Oldest(i)); err != nil {
		panic(err) // the front lies between the tail and the cursor
	}
	o.rs[i].freed = 0
}

// Idle commits every ring and waits at most MaxLatency, and until the
// smallest front, the only one that can go next, is due (rule 3), or up to
// MaxDelay/2 later: while samples come, a wakeup for one of them releases
// it first, and the timer is not moved once a sample (waiter.setDeadline).
func (o *ordered) Idle() (time.Duration, time.Duration) {
	timeout, slack := o.s.Latency, time.Duration(0)
	for i := range o.rs {
		o.CommitPublish(i)
	}
	if len(o.heap) > 0 && o.rs[o.heap[0].ref].has { // next put the root in place
		due := time.Duration(o.seenAt(o.heap[0].ref) + int64(o.maxDelay) - o.now())
		if timeout < 0 || due+o.dueSlack < timeout {
			timeout, slack = max(due, 0), o.dueSlack
		}
	}
	return timeout, slack
}
