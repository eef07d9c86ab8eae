package perfbuf

import (
	"encoding/binary"
	"fmt"
	"time"
)

// OrderedOptions configures NewOrderedReader.
type OrderedOptions struct {
	// MaxLatency as for Reader; Budget and RoundRobin do not apply.
	ReaderOptions

	// KeyOffset is where the key sits in each sample: a little-endian u64,
	// such as a bpf_ktime_get_ns() stamp. A sample too short to hold it
	// has key 0.
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

// held is a record parsed ahead and held in place in its ring.
type held struct {
	rec  Record
	key  uint64
	seen int64 // monotonic nanoseconds when the reader first parsed it
}

// ringQueue is one ring's held records, oldest first. Its memory is reused.
type ringQueue struct {
	recs   []held
	head   int
	newest uint64 // the largest key parsed from this ring
	seen   bool   // newest is valid
	freed  int    // bytes released since the ring's last commit
	// corrupt: parsing stopped at a corrupt record. The ring is skipped
	// past it (SkipCorrupt commits to the head) only once the records held
	// before it are delivered: they live in the ring until then.
	corrupt bool
}

func (q *ringQueue) empty() bool  { return q.head == len(q.recs) }
func (q *ringQueue) front() *held { return &q.recs[q.head] }

func (q *ringQueue) pop() {
	q.freed += int(q.recs[q.head].rec.Next - q.recs[q.head].rec.Pos)
	q.recs[q.head] = held{} // drop the references into the ring
	q.head++
	if q.empty() {
		q.recs, q.head = q.recs[:0], 0
	}
}

// OrderedReader merges the records of every ring into one stream in
// nondecreasing order of a key (a timestamp, typically), without copying
// them out of the rings: it parses ahead and holds records in place, and
// commits a ring's tail as its records are delivered.
//
// The release rule. A CPU's records come in key order, but an idle CPU may
// still produce an earlier record. The smallest held key is released when
//
//  1. every ring has shown a key at least as large (nothing earlier can come
//     from a CPU whose keys only grow), or
//  2. a key KeyWindow (default MaxDelay, as nanoseconds) larger has been
//     seen on any ring, or
//  3. the reader first saw it MaxDelay ago, or
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
	q         []ringQueue
	keyOffset int
	keyFn     func([]byte) uint64
	window    uint64
	maxDelay  time.Duration
	dropLate  bool
	highWater int
	last      uint64 // largest key released
	released  bool   // last is valid
	start     time.Time
	tmp       Record
	scratch   []byte
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
	o.q = make([]ringQueue, len(o.rings))
	for _, rb := range o.rings {
		rb.Begin()
	}
	o.src = o
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
		return binary.LittleEndian.Uint64(rec.Data[off:])
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
	return binary.LittleEndian.Uint64(b[:])
}

// refill parses every ring ahead up to a fresh head snapshot.
func (o *OrderedReader) refill() {
	now := o.now()
	for i, rb := range o.rings {
		q := &o.q[i]
		if q.corrupt {
			if !q.empty() {
				continue
			}
			// Skip to the head snapshot of when the corruption was found.
			rb.SkipCorrupt() // counted in the ring's CorruptBytes
			o.publish(i)
			q.corrupt = false
		}
		rb.Refresh()
		o.noteFill(i, rb.Pending()+int(rb.Cursor()-rb.Tail()))
		for {
			ok, err := rb.Next(&o.tmp)
			if err != nil {
				q.corrupt = true
				break
			}
			if !ok {
				break
			}
			h := held{rec: o.tmp, seen: now}
			if h.rec.Type == RecordSample {
				h.key = o.key(&h.rec)
				q.newest, q.seen = max(q.newest, h.key), true
			}
			q.recs = append(q.recs, h)
		}
	}
}

// commit hands ring i's delivered records back to the kernel: its tail
// moves to its oldest held record, or to its cursor if it holds none.
func (o *OrderedReader) commit(i int) {
	rb, q := o.rings[i], &o.q[i]
	pos := rb.Cursor()
	if !q.empty() {
		pos = q.front().rec.Pos
	}
	if err := rb.Commit(pos); err != nil {
		panic(err) // held positions lie between the tail and the cursor
	}
	q.freed = 0
}

func (o *OrderedReader) next(rec *Record, s *Sample) int {
	for {
		// Parse ahead only when what is held cannot go: while it can,
		// newer records in the rings would not change the choice.
		i := o.pick()
		if i < 0 {
			o.refill()
			i = o.pick()
		}
		if i < 0 || o.take(i, rec, s) {
			return i
		}
	}
}

// pick returns the ring whose oldest held record goes next, or -1 if none
// may go yet.
func (o *OrderedReader) pick() int {
	best := -1
	for i := range o.q {
		q := &o.q[i]
		if q.empty() {
			continue
		}
		if q.front().rec.Type != RecordSample {
			return i // lost records carry no key: at once
		}
		if best < 0 || q.front().key < o.q[best].front().key {
			best = i
		}
	}
	if best < 0 || !o.releasable(o.q[best].front()) {
		return -1
	}
	return best
}

// releasable applies the release rule to the smallest held key.
func (o *OrderedReader) releasable(h *held) bool {
	if o.flushing() || o.life.closed() {
		return true
	}
	all, newest := true, uint64(0)
	for i := range o.q {
		q := &o.q[i]
		if q.seen {
			newest = max(newest, q.newest)
		}
		if !q.seen || q.newest < h.key {
			all = false
		}
	}
	if all || // rule 1
		(newest >= o.window && h.key <= newest-o.window) || // rule 2
		o.now()-h.seen >= int64(o.maxDelay) { // rule 3
		return true
	}
	for _, rb := range o.rings {
		if rb.Used() > o.highWater {
			return true // rule 4
		}
	}
	return false
}

// take pops ring i's oldest held record into rec, marking it late if it
// is. It reports false for a late record dropped by DropLate (popped and
// counted).
func (o *OrderedReader) take(i int, rec *Record, s *Sample) bool {
	q := &o.q[i]
	h := q.front()
	*rec = h.rec
	s.Key, s.Late = h.key, false
	if rec.Type == RecordSample {
		if o.released && h.key < o.last {
			s.Late = true
			o.statsMu.Lock()
			o.stats[i].Late++
			if o.dropLate {
				o.stats[i].Dropped++
			}
			o.statsMu.Unlock()
		}
		if !s.Late {
			o.last, o.released = h.key, true
		}
	}
	q.pop()
	if s.Late && o.dropLate {
		o.delivered(i)
		return false
	}
	return true
}

// delivered commits ring i once a sixteenth of it was released, or at once
// when it is past the high-water mark.
func (o *OrderedReader) delivered(i int) {
	q, rb := &o.q[i], o.rings[i]
	if q.freed >= rb.Size()/16 || (q.freed > 0 && rb.Used() > o.highWater) {
		o.commit(i)
		o.publish(i)
	}
}

// idle commits every ring and waits at most until the oldest held record
// is due (rule 3), and MaxLatency.
func (o *OrderedReader) idle() time.Duration {
	timeout := o.latency
	now := o.now()
	for i := range o.q {
		o.commit(i)
		o.publish(i)
		if q := &o.q[i]; !q.empty() {
			due := time.Duration(q.front().seen + int64(o.maxDelay) - now)
			if timeout < 0 || due < timeout {
				timeout = max(due, 0)
			}
		}
	}
	return timeout
}
