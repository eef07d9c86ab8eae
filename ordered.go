package perfbuf

// The ordered policy (ReaderOptions.Order): every ring merged in key order,
// the records kept in the rings until delivered.

import (
	"encoding/binary"
	"math"
	"slices"
	"time"
)

// Order makes a Reader merge the rings in nondecreasing order of a key (a
// timestamp, typically): see ReaderOptions.Order and the release rule below.
//
// The release rule. A CPU's records come in key order, but an idle CPU may
// still produce an earlier record. The smallest key among the rings' next
// records is released when
//
//  1. every ring has shown a key at least as large (nothing earlier can come
//     from a CPU whose keys only grow), or
//  2. a key KeyWindow (default MaxDelay, as nanoseconds) larger has been
//     seen on any ring (while records wait, the reader parses ahead to find
//     the newest keys), or
//  3. the reader first saw it MaxDelay ago (to within MaxDelay/32), or
//  4. a ring is filled past HighWater: release rather than lose, or
//  5. a Flush or Close is under way.
//
// Rules 2 and 3 can release a record before an earlier one arrives; such a
// record, delivered after a larger key, is late: counted in Stats, and
// delivered with Late set, or dropped with DropLate. Lost records carry no
// key and are delivered as soon as they are reached.
//
// The records stay in the rings until delivered: each ring's next record is
// parsed in place, and a ring's tail is committed as its records go.
type Order struct {
	// KeyOffset is where the key sits in each sample: a u64 in the host's
	// byte order, as a BPF program stores it, such as a bpf_ktime_get_ns()
	// stamp. A sample too short to hold it has key 0.
	KeyOffset int
	// Key, if set, computes the key instead; data is the whole payload
	// (copied when it straddles the ring's end) and valid during the call.
	Key func(data []byte) uint64

	// MaxDelay is how long a record may be held back waiting for an
	// earlier one from another CPU, both in wall-clock time since the
	// reader first saw it and, by default, in key units read as
	// nanoseconds (see KeyWindow). Zero means 100 ms.
	MaxDelay time.Duration
	// KeyWindow, if set, replaces MaxDelay in key units: a record is
	// released once a key KeyWindow larger has been seen.
	KeyWindow uint64

	// DropLate drops late samples instead of delivering them marked Late.
	// Either way they are counted.
	DropLate bool

	// HighWater is the ring fill, in bytes, above which records are
	// released even if an earlier one might still come: holding records
	// fills the rings, and a full ring loses samples. Zero means three
	// quarters of the ring.
	HighWater int
}

// orderedRing is the merge's state for one ring. Only its front, the next record to deliver
// from it, is parsed: a CPU's records come in key order, so the front is the ring's smallest
// key and the records behind it can wait in the ring unparsed.
type orderedRing struct {
	front Record // valid when has; aliases the ring like any Record
	key   uint64 // front's key, for a sample
	has   bool

	newest uint64 // the largest key parsed from the ring, front and look-ahead included
	seen   bool   // newest is valid

	// scanned is how far rule 2's look-ahead parsed beyond the front.
	scanned uint64
	// marks say when the reader first saw the ring's records (rule 3): those below pos were
	// in its head snapshot at time t. Oldest first; those behind the cursor are dropped.
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

// saw notes key as parsed from ring r, and as the newest of all if it is.
// (A run notes only the ring's: fixRoot catches up.)
func (o *ordered) saw(r *orderedRing, key uint64) {
	r.saw(key)
	o.newest = max(o.newest, key)
}

type mark struct {
	pos uint64
	t   int64 // ordered.now()
}

// ordered merges the rings by key. Only each ring's front, the next record
// to deliver from it, is parsed: a CPU's records come in key order, so the
// front is the ring's smallest key and the records behind it can wait in
// the ring unparsed.
type ordered struct {
	r         *Reader
	rs        []orderedRing
	keyOffset int
	keyFn     func([]byte) uint64
	window    uint64
	maxDelay  time.Duration
	markGrain int64 // marks closer in time than this are merged: MaxDelay/32
	dropLate  bool
	highWater int
	commitAt  int  // bytes delivered from a ring before its tail is committed
	pressure  bool // released by rule 4: commit at once
	// A run: the ring whose front next released by rule 1, and the
	// smallest front key of the other rings then. Until one of those is
	// delivered, that ring's records up to runBound go next by rule 1.
	runRing  int
	runBound uint64
	heap     []heapEntry // rings whose front is a sample (see heapEntry)
	waiting  []int       // the other rings: no front, or one being delivered
	newest   uint64      // the largest key parsed from any ring
	last     uint64      // largest key released
	start    time.Time
	tmp      Record
	scratch  []byte
}

func newOrdered(r *Reader, opts *Order) *ordered {
	o := &ordered{
		r:         r,
		keyOffset: opts.KeyOffset,
		keyFn:     opts.Key,
		maxDelay:  opts.MaxDelay,
		window:    opts.KeyWindow,
		dropLate:  opts.DropLate,
		highWater: opts.HighWater,
		start:     time.Now(),
		runRing:   -1,
	}
	if o.maxDelay == 0 {
		o.maxDelay = 100 * time.Millisecond
	}
	if o.window == 0 {
		o.window = uint64(o.maxDelay.Nanoseconds())
	}
	size := r.rings[0].Size()
	if o.highWater == 0 {
		o.highWater = size * 3 / 4
	}
	o.commitAt = max(size/16, 1)
	o.markGrain = int64(o.maxDelay / 32)
	o.rs = make([]orderedRing, 0, len(r.rings))
	o.heap = make([]heapEntry, 0, len(r.rings))
	o.waiting = make([]int, 0, len(r.rings))
	for i := range r.rings {
		o.addRing(i)
	}
	return o
}

// addRing takes in ring i, the reader's last: it waits for a front, and
// what it holds now was first seen now (rule 3).
func (o *ordered) addRing(i int) {
	rb := o.r.rings[i]
	rb.Begin()
	o.rs = append(o.rs, orderedRing{scanned: rb.tail, dueBefore: rb.tail})
	o.waiting = append(o.waiting, i)
	if rb.pending() > 0 {
		o.mark(i, rb.head)
	}
}

func (o *ordered) now() int64 { return int64(time.Since(o.start)) }

// key reads a sample's key.
func (o *ordered) key(rec *Record) uint64 {
	if o.keyFn != nil {
		data := rec.Data
		if len(rec.Wrapped) > 0 {
			o.scratch = rec.AppendTo(o.scratch[:0])
			data = o.scratch
		}
		return o.keyFn(data)
	}
	off := o.keyOffset
	if off+8 <= len(rec.Data) {
		return binary.NativeEndian.Uint64(rec.Data[off:])
	}
	if off+8 > rec.Len() {
		return 0
	}
	var b [8]byte // the key straddles the ring's end
	for j := range b {
		if k := off + j; k < len(rec.Data) {
			b[j] = rec.Data[k]
		} else {
			b[j] = rec.Wrapped[k-len(rec.Data)]
		}
	}
	return binary.NativeEndian.Uint64(b[:])
}

// next returns the front that goes next and its ring, or -1 when none may
// go yet. A late record that DropLate drops is counted and passed over.
//
// Per record it costs a sift of the heap, O(log rings), and a look at each
// ring without a front (RawBuffer.quiet: a load of its data_head): an idle
// CPU's ring must be looked at, since a record there could come first.
func (o *ordered) next() (*Record, int) {
	for {
		o.runRing = -1
		if o.r.flushing() && o.r.flushReached() {
			return nil, -1 // block returns ErrFlushed
		}
		o.fixRoot()
		// The rings without a front: a lost record goes at once (its ring
		// stays waiting: delivered empties it), a sample joins the heap.
		for k := 0; k < len(o.waiting); {
			i := o.waiting[k]
			r := &o.rs[i]
			if !r.has && (o.r.rings[i].quiet() || !o.load(i)) {
				k++
				continue
			}
			if r.front.Type != RecordSample {
				return &r.front, i // lost records carry no key: at once
			}
			o.waiting = slices.Delete(o.waiting, k, k+1)
			o.push(i)
		}
		if len(o.heap) == 0 {
			return nil, -1
		}
		best, key := o.heap[0].ring, o.heap[0].key
		if len(o.waiting) == 0 {
			o.pressure = false // rule 1: every other front is at least as large
			o.runRing, o.runBound = best, o.second()
		} else if !o.releasable(best) {
			return nil, -1
		}
		front := &o.rs[best].front
		front.Key, front.Late = key, key < o.last
		if !front.Late {
			o.last = key
		} else {
			o.runRing = -1
			if o.countLate(best); o.dropLate {
				o.delivered(best)
				continue
			}
		}
		return front, best
	}
}

// The heap holds the rings whose front is a sample, smallest (key, ring)
// first; the others wait (o.waiting). Only the root's ring changes between
// two calls of next, by delivering its front, so next begins by putting the
// root back in place (fixRoot).
type heapEntry struct {
	key  uint64 // the ring's front key (a copy, so that a sift reads only the heap)
	ring int
}

func (a heapEntry) before(b heapEntry) bool {
	return a.key < b.key || a.key == b.key && a.ring < b.ring
}

// fixRoot loads the root's next front if it has none, and sifts it down to
// its place, or moves it to the waiting rings when its ring has no sample
// to show.
func (o *ordered) fixRoot() {
	if len(o.heap) == 0 {
		return
	}
	i := o.heap[0].ring
	r := &o.rs[i]
	o.newest = max(o.newest, r.newest) // from a run (Each)
	if !r.has && !o.r.rings[i].quiet() {
		o.load(i)
	}
	if r.has && r.front.Type == RecordSample {
		o.heap[0].key = r.key
	} else {
		n := len(o.heap) - 1
		o.heap[0] = o.heap[n]
		o.heap = o.heap[:n]
		o.waiting = append(o.waiting, i)
	}
	o.siftDown()
}

// push adds ring i, whose front is a sample, to the heap.
func (o *ordered) push(i int) {
	h := append(o.heap, heapEntry{key: o.rs[i].key, ring: i})
	for j := len(h) - 1; j > 0; {
		up := (j - 1) / 2
		if !h[j].before(h[up]) {
			break
		}
		h[j], h[up] = h[up], h[j]
		j = up
	}
	o.heap = h
}

// siftDown moves the root down to its place.
func (o *ordered) siftDown() {
	h := o.heap
	for j := 0; ; {
		c := 2*j + 1
		if c >= len(h) {
			return
		}
		if c+1 < len(h) && h[c+1].before(h[c]) {
			c++
		}
		if !h[c].before(h[j]) {
			return
		}
		h[j], h[c] = h[c], h[j]
		j = c
	}
}

// second returns the smallest front key after the root's (a child of the
// root), or the largest key if the root is alone.
func (o *ordered) second() uint64 {
	key := uint64(math.MaxUint64)
	for _, c := range o.heap[1:min(3, len(o.heap))] {
		key = min(key, c.key)
	}
	return key
}

func (o *ordered) countLate(i int) {
	o.r.statsMu.Lock()
	o.r.stats[i].Late++
	if o.dropLate {
		o.r.stats[i].Dropped++
	}
	o.r.statsMu.Unlock()
}

// load parses ring i's next record into its front, taking a new head
// snapshot when the last one is used up. It reports whether the ring has a
// front.
func (o *ordered) load(i int) bool {
	rb, r := o.r.rings[i], &o.rs[i]
	if rb.pending() == 0 {
		o.refresh(i)
	}
	ok, err := rb.Next(&r.front)
	if err != nil {
		// Only the front is ever held, and it was delivered: skipping to
		// the head hands back nothing that is still in use.
		o.r.skipCorrupt(i, err)
		o.publish(i)
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
	if r.front.Type != RecordSample {
		return
	}
	if off := o.keyOffset; o.keyFn == nil && off+8 <= len(r.front.Data) {
		r.key = binary.NativeEndian.Uint64(r.front.Data[off:])
	} else {
		r.key = o.key(&r.front)
	}
	o.saw(r, r.key)
}

// refresh takes a new head snapshot of ring i and marks the time when it
// shows new records.
func (o *ordered) refresh(i int) {
	rb := o.r.rings[i]
	old := rb.head
	rb.Refresh()
	if rb.head != old {
		o.mark(i, rb.head)
	}
}

// mark notes that ring i's records below pos are in the reader's view now,
// dropping the marks of records already delivered.
func (o *ordered) mark(i int, pos uint64) {
	r, oldest := &o.rs[i], o.oldest(i)
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

// releasable applies rules 1 to 5 to ring best's front, the smallest key,
// when some ring shows no record.
func (o *ordered) releasable(best int) bool {
	o.pressure = false
	if o.r.flushing() || o.r.life.closed() {
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
	for _, rb := range o.r.rings {
		if rb.Used() > o.highWater {
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
		i := e.ring
		r, rb := &o.rs[i], o.r.rings[i]
		pos := rb.cursor
		if int64(r.scanned-pos) > 0 && int64(rb.head-r.scanned) >= 0 {
			pos = r.scanned // (not past a head that SkipCorrupt moved back)
		}
		if pos == rb.head {
			o.refresh(i)
		}
		for rb.parseAt(pos, &o.tmp) {
			if o.tmp.Type == RecordSample {
				o.saw(r, o.key(&o.tmp))
			}
			pos = o.tmp.Next
		}
		r.scanned = pos
		o.tmp = Record{}
	}
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

// delivered ends the delivery of ring i's front. The ring is committed once
// a sixteenth of it was delivered, or at once when rule 4 released it.
func (o *ordered) delivered(i int) {
	r := &o.rs[i]
	r.has = false
	if r.freed += int(r.front.Next - r.front.Pos); r.freed >= o.commitAt || o.pressure {
		o.commitPublish(i)
	}
}

// publish copies ring i's counts into the Reader's stats: what it parsed
// but its front, which is not delivered yet.
func (o *ordered) publish(i int) {
	st, r := &o.r.rings[i].stats, &o.rs[i]
	samples, bytes, lost := st.Samples, st.Bytes, st.Lost
	if r.has {
		switch r.front.Type {
		case RecordSample:
			samples--
			bytes -= uint64(r.front.Len())
		case RecordLost:
			lost -= r.front.Lost
		}
	}
	o.r.publish(i, samples, bytes, lost)
}

func (o *ordered) commitPublish(i int) {
	o.commit(i)
	o.publish(i)
}

// oldest is ring i's oldest record not delivered: its front, or where its
// cursor stands if it has none.
func (o *ordered) oldest(i int) uint64 {
	if r := &o.rs[i]; r.has {
		return r.front.Pos
	}
	return o.r.rings[i].cursor
}

// commit hands ring i's delivered records back to the kernel: its tail
// moves to its front, or to its cursor if it has none.
func (o *ordered) commit(i int) {
	if err := o.r.rings[i].Commit(o.oldest(i)); err != nil {
		panic(err) // the front lies between the tail and the cursor
	}
	o.rs[i].freed = 0
}

// idle commits every ring and waits at most MaxLatency, and until the
// smallest front, the only one that can go next, is due (rule 3).
func (o *ordered) idle() time.Duration {
	timeout := o.r.latency
	for i := range o.rs {
		o.commitPublish(i)
	}
	if len(o.heap) > 0 && o.rs[o.heap[0].ring].has { // next put the root in place
		due := time.Duration(o.seenAt(o.heap[0].ring) + int64(o.maxDelay) - o.now())
		if timeout < 0 || due < timeout {
			timeout = max(due, 0)
		}
	}
	return timeout
}

// each delivers up to 256 records in key order, or runs (see run), before
// it returns for the read to look at ctx.
func (o *ordered) each(fn func(*Record) error) (bool, error) {
	for n := 0; n < 256; n++ {
		rec, i := o.next()
		if i < 0 {
			return false, nil
		}
		err := fn(rec)
		o.delivered(i)
		if err == nil && o.runRing == i && !o.r.life.closed() {
			var k int
			if k, err = o.run(i, fn); k > 0 {
				return true, err // at most a run apart (see policy.each)
			}
		}
		if err != nil || o.r.life.closed() {
			return true, err
		}
	}
	return true, nil
}

// run delivers ring i's next records at once while their keys stay within
// [o.last, o.runBound], without another look at the other rings: rule 1
// holds for them. The first is parsed as the ring's front, as next would
// (most runs end there when the rings' keys interleave); the rest go
// through RawBuffer.each keyed, up to the ring's next commit. What the run
// may not deliver stays the ring's front. It returns how many it delivered.
func (o *ordered) run(i int, fn func(*Record) error) (int, error) {
	r, rb := &o.rs[i], o.r.rings[i]
	if p, room := rb.plainRoom(); o.keyFn == nil && room > 0 {
		// RawBuffer.parse's plain sample, in line: the common front.
		size, n := plainAt(p, room)
		if size == 0 {
			return 0, nil // next's load parses it
		}
		r.front.CPU = rb.cpu
		rb.take(&r.front, p, size, n)
		o.parsedFront(r)
	} else if !o.load(i) {
		return 0, nil
	}
	if r.front.Type != RecordSample || r.key > o.runBound || r.key < o.last {
		return 0, nil // next takes the front
	}
	o.last = r.key
	r.front.Key, r.front.Late = r.key, false
	err := fn(&r.front)
	o.delivered(i)
	if err != nil || o.keyFn != nil || o.r.life.closed() {
		return 1, err // (keys only Key can read: next takes each record)
	}
	rb.keyed, rb.keyOff, rb.keyLo, rb.keyHi = true, uint64(o.keyOffset), o.last, o.runBound
	from := rb.cursor
	k, err := rb.each(&r.front, uint64(o.commitAt-r.freed), fn)
	rb.keyed = false
	if k > 0 {
		o.last = rb.keyLo
		r.saw(rb.keyLo) // o.newest: fixRoot
	}
	if err == errHeld {
		o.parsedFront(r) // the ring's front now; its bytes are not delivered
		r.freed += int(r.front.Pos - from)
		err = nil
	} else {
		r.freed += int(rb.cursor - from)
	}
	if _, ok := err.(*CorruptError); ok {
		err = nil // next's load reports and skips it
	}
	if r.freed >= o.commitAt {
		o.commitPublish(i)
	}
	return 1 + k, err
}
