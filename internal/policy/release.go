// SPDX-License-Identifier: Apache-2.0

package policy

// The ordered merge's release rule (see Order): when the smallest key among
// the rings' fronts may go although some ring shows no record yet. Rule 1
// over the rings without a front, rule 2 (a key a window larger seen,
// parsing ahead), rule 3 (held MaxDelay: the marks of when the reader first
// saw each stretch of a ring), rule 4 (a ring past HighWater), rule 5 (a
// Flush or Close).

import "github.com/perfbuf/perfbuf/internal/ring"

// mark says that a ring's records below pos were in the reader's view at t.
type mark struct {
	pos uint64
	t   int64 // ordered.now()
}

// releasable applies rules 1 to 5 to ring best's front, the smallest key,
// when some ring shows no record.
func (o *ordered) releasable(best int) bool {
	o.pressure = false
	if o.s.Flushing() || o.s.Stop.Load() {
		return true // rule 5
	}
	key := o.rs[best].key
	all := true // rule 1 over the rings without a front: their newest keys
	for _, i := range o.waiting {
		if r := &o.rs[i]; !r.seen || r.newest < key {
			all = false
			break
		}
	}
	if all || o.windowPassed(key) {
		return true // rules 1 and 2
	}
	o.scanAhead()
	if o.windowPassed(key) || o.due(best) {
		return true // rules 2 and 3
	}
	for _, rb := range o.s.Rings {
		if rb.Cur().Used() > o.highWater {
			o.pressure = true
			return true // rule 4
		}
	}
	return false
}

// windowPassed reports rule 2 for key.
func (o *ordered) windowPassed(key uint64) bool {
	return o.newest >= o.window && key <= o.newest-o.window
}

// scanAhead parses the rings with a front ahead of it for their newest
// keys (rule 2), up to the head snapshot, or a fresh one once that is used
// up (a fresh snapshot is a load of data_head, a cache line the producer
// writes: not taken for every record). Rings without a front are left to
// next, which has just looked at them: a record found there must take its
// place in the merge, not be passed over.
func (o *ordered) scanAhead() {
	for _, e := range o.heap {
		i := e.ref
		r, rb := &o.rs[i], o.s.Rings[i]
		pos := rb.Cur().Pos()
		if int64(r.scanned-pos) > 0 && int64(rb.Cur().Head()-r.scanned) >= 0 {
			pos = r.scanned // (not past a head that skipCorrupt moved back)
		}
		if pos == rb.Cur().Head() {
			o.refresh(i)
		}
		for rb.Peek(pos, &o.tmp) {
			if o.tmp.Type == ring.Sample {
				o.saw(r, o.keys.key(&o.tmp))
			}
			pos = o.tmp.Next
		}
		r.scanned = pos
		o.tmp = ring.Record{}
	}
}

// refresh takes a new head snapshot of ring i and marks the time when it
// shows new records (rule 3).
func (o *ordered) refresh(i int) {
	rb := o.s.Rings[i]
	old := rb.Cur().Head()
	rb.Refresh()
	if h := rb.Cur().Head(); h != old {
		o.mark(i, h)
		o.look = true // the merge's view moved on: the idle rings' too
	}
}

// mark notes that ring i's records below pos are in the reader's view now,
// dropping the marks of records already delivered. Marks closer in time
// than markGrain are merged.
func (o *ordered) mark(i int, pos uint64) {
	r, oldest := &o.rs[i], o.Oldest(i)
	k := 0
	for k < len(r.marks) && int64(r.marks[k].pos-oldest) <= 0 {
		k++
	}
	r.marks = r.marks[:copy(r.marks, r.marks[k:])]
	now := o.now()
	if n := len(r.marks); n > 0 && now-r.marks[n-1].t < o.markGrain {
		r.marks[n-1].pos = pos // seen within the grain of the last mark
		return
	}
	r.marks = append(r.marks, mark{pos: pos, t: now})
}

// seenAt returns when the reader first saw ring i's front.
func (o *ordered) seenAt(i int) int64 {
	r := &o.rs[i]
	for _, m := range r.marks {
		if int64(m.pos-r.front.Pos) > 0 {
			return m.t
		}
	}
	return o.now() // not reached: a front lies below some head snapshot
}

// due reports rule 3 for ring i's front.
func (o *ordered) due(i int) bool {
	r := &o.rs[i]
	if int64(r.dueBefore-r.front.Pos) > 0 {
		return true
	}
	limit := o.now() - int64(o.maxDelay)
	for _, m := range r.marks {
		if m.t > limit {
			break
		}
		r.dueBefore = m.pos
	}
	return int64(r.dueBefore-r.front.Pos) > 0
}
