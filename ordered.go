package perfbuf

import (
	"context"
	"encoding/binary"
	"fmt"
	"math"
	"os"
	"slices"
	"time"
)

// OrderedOptions configures NewOrderedReader.
type OrderedOptions struct {
	// MaxLatency as for Reader; Budget and RoundRobin do not apply.
	ReaderOptions

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

	// DropLate drops records that arrive behind a key already released
	// instead of delivering them marked Late. Either way they are counted.
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

	samples, bytes uint64 // delivered (or dropped as late), for Stats
	lost           uint64 // lost samples, as their lost records are delivered
}

// saw notes key as parsed from the ring.
func (r *orderedRing) saw(key uint64) {
	if !r.seen || key > r.newest {
		r.newest, r.seen = key, true
	}
}

// saw notes key as parsed from ring r, and as the newest of all if it is.
// (Each's run loop notes only the ring's: fixRoot catches up.)
func (o *OrderedReader) saw(r *orderedRing, key uint64) {
	r.saw(key)
	o.newest = max(o.newest, key)
}

type mark struct {
	pos uint64
	t   int64 // OrderedReader.now()
}

// OrderedReader merges the records of every ring into one stream in
// nondecreasing order of a key (a timestamp, typically), without copying
// them out of the rings: each ring's next record is parsed in place, the
// smallest key goes first, and a ring's tail is committed as its records
// are delivered.
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
// delivered with Sample.Late set, or dropped with DropLate. Lost records
// carry no key and are delivered as soon as they are reached.
//
// The concurrency contract is Reader's.
type OrderedReader struct {
	core
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
	// A run (Each): the ring whose front next released by rule 1, and the
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

// NewOrderedReader takes every ring of pb for an OrderedReader. Errors:
// ErrInvalidOptions, ErrBusy if a ring is held already, os.ErrClosed.
func NewOrderedReader(pb *PerfBuffer, opts OrderedOptions) (*OrderedReader, error) {
	o, err := newOrdered(opts)
	if err == nil {
		err = o.open(pb, opts.ReaderOptions)
	}
	if err != nil {
		return nil, fmt.Errorf("new ordered reader: %w", err)
	}
	o.setup()
	return o, nil
}

// newOrdered checks opts; open or init adds the rings, then setup.
func newOrdered(opts OrderedOptions) (*OrderedReader, error) {
	if opts.KeyOffset < 0 || opts.MaxDelay < 0 || opts.HighWater < 0 {
		return nil, fmt.Errorf("negative option: %w", ErrInvalidOptions)
	}
	o := &OrderedReader{
		keyOffset: opts.KeyOffset,
		keyFn:     opts.Key,
		maxDelay:  opts.MaxDelay,
		window:    opts.KeyWindow,
		dropLate:  opts.DropLate,
		highWater: opts.HighWater,
		start:     time.Now(),
	}
	if o.maxDelay == 0 {
		o.maxDelay = 100 * time.Millisecond
	}
	if o.window == 0 {
		o.window = uint64(o.maxDelay.Nanoseconds())
	}
	return o, nil
}

func (o *OrderedReader) setup() {
	if o.highWater == 0 {
		o.highWater = o.rings[0].Size() * 3 / 4
	}
	o.commitAt = max(o.rings[0].Size()/16, 1)
	o.markGrain = int64(o.maxDelay / 32)
	o.rs = make([]orderedRing, len(o.rings))
	for i, rb := range o.rings {
		rb.Begin()
		r := &o.rs[i]
		r.scanned, r.dueBefore = rb.Tail(), rb.Tail()
		if rb.Pending() > 0 {
			o.mark(i, rb.head)
			o.noteFill(i, rb.Pending())
		}
	}
	o.heap = make([]heapEntry, 0, len(o.rings))
	o.waiting = make([]int, len(o.rings))
	for i := range o.waiting {
		o.waiting[i] = i
	}
	o.setSource(o)
	o.runRing = -1
}

func (o *OrderedReader) now() int64 { return int64(time.Since(o.start)) }

// key reads a sample's key.
func (o *OrderedReader) key(rec *Record) uint64 {
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
func (o *OrderedReader) next(s *Sample) (*Record, int) {
	for {
		o.runRing = -1
		if o.flushing() && o.flushReached() {
			return nil, -1 // block returns ErrFlushed
		}
		o.fixRoot()
		// The rings without a front: a lost record goes at once (its ring
		// stays waiting: delivered empties it), a sample joins the heap.
		for k := 0; k < len(o.waiting); {
			i := o.waiting[k]
			r := &o.rs[i]
			if !r.has && (o.rings[i].quiet() || !o.load(i)) {
				k++
				continue
			}
			if r.front.Type != RecordSample {
				s.Key, s.Late = 0, false
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
		s.Key, s.Late = key, key < o.last
		if !s.Late {
			o.last = key
		} else {
			o.runRing = -1
			if o.countLate(best); o.dropLate {
				o.delivered(best)
				continue
			}
		}
		return &o.rs[best].front, best
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
func (o *OrderedReader) fixRoot() {
	if len(o.heap) == 0 {
		return
	}
	i := o.heap[0].ring
	r := &o.rs[i]
	o.newest = max(o.newest, r.newest) // from a run (Each)
	if !r.has && !o.rings[i].quiet() {
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
func (o *OrderedReader) push(i int) {
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
func (o *OrderedReader) siftDown() {
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
func (o *OrderedReader) second() uint64 {
	key := uint64(math.MaxUint64)
	for _, c := range o.heap[1:min(3, len(o.heap))] {
		key = min(key, c.key)
	}
	return key
}

func (o *OrderedReader) countLate(i int) {
	o.statsMu.Lock()
	o.stats[i].Late++
	if o.dropLate {
		o.stats[i].Dropped++
	}
	o.statsMu.Unlock()
}

// load parses ring i's next record into its front, taking a new head
// snapshot when the last one is used up. It reports whether the ring has a
// front.
func (o *OrderedReader) load(i int) bool {
	rb, r := o.rings[i], &o.rs[i]
	if rb.Pending() == 0 {
		o.refresh(i)
	}
	ok, err := rb.Next(&r.front)
	if err != nil {
		// Only the front is ever held, and it was delivered: skipping to
		// the head hands back nothing that is still in use.
		rb.SkipCorrupt() // counted in the ring's CorruptBytes
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
func (o *OrderedReader) parsedFront(r *orderedRing) {
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
func (o *OrderedReader) refresh(i int) {
	rb := o.rings[i]
	old := rb.head
	rb.Refresh()
	if rb.head != old {
		o.mark(i, rb.head)
		o.noteFill(i, int(rb.head-rb.Tail()))
	}
}

// mark notes that ring i's records below pos are in the reader's view now,
// dropping the marks of records already delivered.
func (o *OrderedReader) mark(i int, pos uint64) {
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
func (o *OrderedReader) seenAt(i int) int64 {
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
func (o *OrderedReader) releasable(best int) bool {
	o.pressure = false
	if o.flushing() || o.life.closed() {
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
	for _, rb := range o.rings {
		if rb.Used() > o.highWater {
			o.pressure = true
			return true // rule 4
		}
	}
	return false
}

// windowPassed reports rule 2 for key.
func (o *OrderedReader) windowPassed(key uint64) bool {
	return o.newest >= o.window && key <= o.newest-o.window
}

// scanAhead parses the rings with a front ahead of it for their newest
// keys (rule 2), up to the head snapshot, or a fresh one once that is used
// up (a fresh snapshot is a load of data_head, a cache line the producer
// writes: not taken for every record). Rings without a front are left to
// next, which has just looked at them: a record found there must take its
// place in the merge, not be passed over.
func (o *OrderedReader) scanAhead() {
	for _, e := range o.heap {
		i := e.ring
		r, rb := &o.rs[i], o.rings[i]
		pos := rb.Cursor()
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
func (o *OrderedReader) due(i int) bool {
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
func (o *OrderedReader) delivered(i int) {
	r := &o.rs[i]
	r.has = false
	switch r.front.Type {
	case RecordSample:
		r.samples++
		r.bytes += uint64(len(r.front.Data) + len(r.front.Wrapped))
	case RecordLost:
		r.lost += r.front.Lost
	}
	if r.freed += int(r.front.Next - r.front.Pos); r.freed >= o.commitAt || o.pressure {
		o.commitPublish(i)
	}
}

// publish is ringSet.publish with the samples and lost counts delivered rather
// than parsed.
func (o *OrderedReader) publish(i int) {
	st := o.rings[i].Stats()
	st.Samples, st.Bytes, st.Lost = o.rs[i].samples, o.rs[i].bytes, o.rs[i].lost
	o.publishStats(i, st)
}

func (o *OrderedReader) commitPublish(i int) {
	o.commit(i)
	o.publish(i)
}

// oldest is ring i's oldest record not delivered: its front, or where its
// cursor stands if it has none.
func (o *OrderedReader) oldest(i int) uint64 {
	if r := &o.rs[i]; r.has {
		return r.front.Pos
	}
	return o.rings[i].Cursor()
}

// commit hands ring i's delivered records back to the kernel: its tail
// moves to its front, or to its cursor if it has none.
func (o *OrderedReader) commit(i int) {
	if err := o.rings[i].Commit(o.oldest(i)); err != nil {
		panic(err) // the front lies between the tail and the cursor
	}
	o.rs[i].freed = 0
}

// idle commits every ring and waits at most MaxLatency, and until the
// smallest front, the only one that can go next, is due (rule 3).
func (o *OrderedReader) idle() time.Duration {
	timeout := o.latency
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

// Each calls fn with every record in key order, zero-copy, until ctx is
// done, the reader is closed, the deadline passes, a Flush completes, or fn
// returns an error, and returns that error (ctx.Err() wrapped for ctx; a
// nil fn is ErrInvalidOptions). rec aliases ring memory and is valid only
// during the call; meta carries the CPU, the key and the late mark. ctx is checked every 256 records and
// whenever nothing can be delivered. Called from inside an Each function or
// All loop, it fails with ErrReentrant rather than wait (see Reader).
func (o *OrderedReader) Each(ctx context.Context, fn func(rec *Record, meta *Sample) error) error {
	const op = "read perf buffer"
	if fn == nil {
		return fmt.Errorf("%s: nil function: %w", op, ErrInvalidOptions)
	}
	stop, err := o.enterRead(ctx, op)
	if err != nil {
		return err
	}
	defer o.exitRead(stop)
	meta := &o.meta
	for n := 0; ; n++ {
		if o.life.closed() {
			return fmt.Errorf("%s: %w", op, os.ErrClosed)
		}
		if n&255 == 0 {
			if err := ctx.Err(); err != nil {
				return fmt.Errorf("%s: %w", op, err)
			}
		}
		rec, i := o.next(meta)
		if i < 0 {
			if err := o.block(ctx, op); err != nil {
				return err
			}
			continue
		}
		meta.CPU, meta.Type, meta.Lost, meta.Data = o.rings[i].CPU(), rec.Type, rec.Lost, nil
		err := fn(rec, meta)
		o.delivered(i)
		if err != nil {
			return err
		}
		// The run: ring i's next records go at once while their keys stay
		// within runBound, without another look at the other rings. The
		// run stops for ctx's check every 256 records.
		for r, rb := &o.rs[i], o.rings[i]; o.runRing == i && n&255 != 255 && !o.life.closed(); {
			// A plain sample is parsed in line (RawBuffer.parse, written
			// out); the end of the head snapshot and any other record are
			// for next's load, and so is a front that may not go yet.
			p, room := rb.plainRoom()
			size, plen := plainAt(p, room)
			if size == 0 {
				break
			}
			rb.take(&r.front, p, size, plen)
			// parsedFront and delivered, written out for the common case:
			// a sample with its key in place, not behind o.last.
			rec := &r.front
			off := o.keyOffset
			if o.keyFn != nil || rec.Type != RecordSample || off+8 > len(rec.Data) {
				o.parsedFront(r)
				break
			}
			r.has, r.key = true, binary.NativeEndian.Uint64(rec.Data[off:])
			r.saw(r.key) // o.newest: fixRoot
			if r.key > o.runBound || r.key < o.last {
				break
			}
			n++
			o.last = r.key
			meta.Key, meta.Late, meta.Type, meta.Lost = r.key, false, RecordSample, 0
			err := fn(rec, meta)
			r.has = false
			r.samples++
			r.bytes += uint64(len(rec.Data) + len(rec.Wrapped))
			// (A run starts on rule 1, which clears o.pressure.)
			if r.freed += int(rec.Next - rec.Pos); r.freed >= o.commitAt {
				o.commitPublish(i)
			}
			if err != nil {
				return err
			}
		}
	}
}
