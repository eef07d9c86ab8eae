package perfbuf

import (
	"context"
	"errors"
	"fmt"
	"iter"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
)

// ErrFlushed is returned by a read once every record that was in the rings
// when Flush was called has been delivered.
var ErrFlushed = errors.New("perf buffer flushed")

// DefaultMaxLatency is ReaderOptions.MaxLatency when it is zero.
const DefaultMaxLatency = 100 * time.Millisecond

// ReaderOptions configures NewReader and NewOrderedReader.
type ReaderOptions struct {
	// MaxLatency bounds how long a record waits in a ring for a wakeup:
	// the reader drains at least this often while it blocks. With
	// Options.WakeupEvents > 1 (or WakeupBytes) a ring below its threshold
	// raises no wakeup (libbpf#438); this is what still delivers it.
	// Zero means DefaultMaxLatency; negative means wait for wakeups only.
	MaxLatency time.Duration

	// Budget is how many bytes a pass reads from one ring before it moves
	// on to the next, so that one busy CPU cannot starve the others. Zero
	// means a quarter of the ring. At least one record is read per turn.
	Budget int

	// RoundRobin drains the rings in index order on every pass. By
	// default each pass drains the fullest ring first (by data_head -
	// data_tail), which is the one closest to losing samples.
	RoundRobin bool
}

// Sample is a record as a reader delivers it: a sample, or a count of
// samples the kernel lost.
type Sample struct {
	CPU  int
	Type RecordType // RecordSample or RecordLost
	// Data is a copy of the payload (padded by the kernel: see
	// Options.SampleFunc). ReadInto reuses its capacity; Read allocates.
	Data []byte
	Lost uint64 // for RecordLost

	Key  uint64 // OrderedReader: the key the record was ordered by
	Late bool   // OrderedReader: delivered after a record with a later key
}

// ReaderStats counts what a reader did with one CPU's ring.
type ReaderStats struct {
	CPU          int
	Samples      uint64 // samples delivered (OrderedReader: or dropped as late)
	Bytes        uint64 // their payload bytes
	Lost         uint64 // samples the kernel reported lost, in the lost records delivered
	CorruptBytes uint64 // bytes skipped as corrupt (see RawBuffer.SkipCorrupt)
	Other        uint64 // records of other types, skipped
	Late         uint64 // OrderedReader: records behind a key already released
	Dropped      uint64 // OrderedReader with DropLate: late records dropped
	Discarded    uint64 // bytes not delivered, left in the ring at Close
	MaxFill      int    // the most bytes seen waiting in the ring
}

// ringSet is what Reader and OrderedReader share: the rings of a PerfBuffer
// held as RawBuffers, the wait, Close, deadlines, Flush and stats.
type ringSet struct {
	rings    []*RawBuffer
	w        *waiter
	life     lifetime // reads are its exclusive calls: one at a time
	evs      []unix.EpollEvent
	deadline atomic.Int64 // unix nanoseconds; 0 means none
	// Flush stores every ring's data_head in flushHeads and sets flushReq;
	// the read that takes it up copies them to flushTo, and ErrFlushed
	// comes once every ring's undelivered records start at or past them.
	flushReq   atomic.Bool
	flushMu    sync.Mutex // guards flushHeads
	flushHeads []uint64
	flushTo    []uint64 // the running flush's heads (read side only)
	flushOn    bool     // a flush runs
	latency    time.Duration
	budget     int

	statsMu sync.Mutex
	stats   []ReaderStats
}

// open takes every ring of pb.
func (rs *ringSet) open(pb *PerfBuffer, opts ReaderOptions) error {
	if pb == nil {
		return fmt.Errorf("nil perf buffer: %w", ErrInvalidOptions)
	}
	n := pb.BufferCount()
	rings := make([]*RawBuffer, 0, n)
	fds := make([]int, 0, n)
	for i := 0; i < n; i++ {
		rb, err := pb.Buffer(i)
		if err == nil {
			rings = append(rings, rb)
			var fd int
			fd, err = pb.BufferFD(i)
			fds = append(fds, fd)
		}
		if err != nil {
			for _, rb := range rings {
				rb.Release()
			}
			return err
		}
	}
	return rs.init(rings, fds, opts)
}

// init sets rs up over rings, waking when fds[i] (ring i's perf event) is
// readable. It releases the rings if it fails.
func (rs *ringSet) init(rings []*RawBuffer, fds []int, opts ReaderOptions) error {
	rs.rings = rings
	if opts.Budget < 0 {
		rs.release()
		return fmt.Errorf("budget %d is negative: %w", opts.Budget, ErrInvalidOptions)
	}
	rs.latency = opts.MaxLatency
	if rs.latency == 0 {
		rs.latency = DefaultMaxLatency
	}
	rs.budget = opts.Budget
	if rs.budget == 0 {
		rs.budget = max(rings[0].Size()/4, 1)
	}
	rs.flushHeads, rs.flushTo = make([]uint64, len(rings)), make([]uint64, len(rings))
	var err error
	if rs.w, err = newWaiter(fds); err != nil {
		rs.release()
		return err
	}
	rs.evs = make([]unix.EpollEvent, len(rings)+1)
	rs.stats = make([]ReaderStats, len(rings))
	for i, rb := range rings {
		rs.stats[i].CPU = rb.CPU()
		rb.skipOther = true
	}
	rs.life.free = rs.free
	rs.life.callbacks = readCallbackFrames
	return nil
}

func (rs *ringSet) release() {
	for _, rb := range rs.rings {
		rb.Release()
	}
}

// free counts what Close leaves in the rings, then hands them back.
func (rs *ringSet) free() {
	rs.statsMu.Lock()
	for i, rb := range rs.rings {
		rs.stats[i].Discarded += uint64(rb.Used())
	}
	rs.statsMu.Unlock()
	rs.release()
	rs.w.close()
}

// Close stops the reader: a blocked read returns an error matching
// os.ErrClosed at once, later reads fail with it, and the rings go back to
// the PerfBuffer (which the caller still owns and closes). Records still in
// the rings are not delivered: they are counted in Stats as Discarded. To
// deliver them first, call Flush and read until ErrFlushed. Close may be
// called from any goroutine, also from a callback, any number of times.
func (rs *ringSet) Close() error {
	rs.life.close(rs.w.wake)
	return nil
}

// poke wakes a blocked read, unless the reader is closed (and its eventfd
// perhaps gone).
func (rs *ringSet) poke() {
	if rs.life.enter("") == nil {
		rs.w.wake()
		rs.life.exit()
	}
}

// SetDeadline makes reads blocked at or after t return an error matching
// os.ErrDeadlineExceeded. Past the deadline a read still delivers what it
// can without waiting, and fails once it would wait: a Reader returns every
// record in the rings first; an OrderedReader those its release rule lets go
// (a record it holds back for an earlier one is waited for, so the read
// fails). The zero time means no deadline. It may be called
// from any goroutine; a read blocked at the time sees the new deadline.
func (rs *ringSet) SetDeadline(t time.Time) {
	var ns int64
	if !t.IsZero() {
		ns = t.UnixNano()
	}
	rs.deadline.Store(ns)
	rs.poke()
}

// Flush makes the reader deliver every record that is in the rings now
// without waiting for a wakeup; once they are all delivered, a read returns
// ErrFlushed (records written since may come before it), and reading goes
// on as before after that. It may be called from any goroutine.
func (rs *ringSet) Flush() {
	if rs.life.enter("") != nil {
		return // closed: the rings are gone
	}
	rs.flushMu.Lock()
	for i, rb := range rs.rings {
		rs.flushHeads[i] = rb.Head()
	}
	rs.flushReq.Store(true)
	rs.flushMu.Unlock()
	rs.w.wake()
	rs.life.exit()
}

// Stats returns per-CPU counts in buffer index order. It may be called from
// any goroutine.
func (rs *ringSet) Stats() []ReaderStats {
	rs.statsMu.Lock()
	defer rs.statsMu.Unlock()
	return slices.Clone(rs.stats)
}

// publish copies ring i's counters into the shared stats.
func (rs *ringSet) publish(i int) { rs.publishStats(i, rs.rings[i].Stats()) }

// publishStats copies st, ring i's counters, into the shared stats. An
// OrderedReader passes its own Samples, Bytes and Lost: it parses ahead of what
// it delivers.
func (rs *ringSet) publishStats(i int, st RawStats) {
	rs.statsMu.Lock()
	s := &rs.stats[i]
	s.Samples, s.Bytes, s.Lost, s.CorruptBytes, s.Other = st.Samples, st.Bytes, st.Lost, st.CorruptBytes, st.Unknown
	rs.statsMu.Unlock()
}

// noteFill records ring i's fill level.
func (rs *ringSet) noteFill(i, used int) {
	rs.statsMu.Lock()
	rs.stats[i].MaxFill = max(rs.stats[i].MaxFill, used)
	rs.statsMu.Unlock()
}

// flushing reports whether a flush is under way (records must not wait).
func (rs *ringSet) flushing() bool { return rs.flushOn || rs.flushReq.Load() }

// pastDeadline reports whether the deadline has passed.
func (rs *ringSet) pastDeadline() bool {
	dl := rs.deadline.Load()
	return dl != 0 && time.Now().UnixNano() >= dl
}

// wait blocks until a ring is ready, timeout passes (negative: no limit),
// the deadline passes, or the waiter is woken. It returns the error a read
// should return, or nil to go on reading.
func (rs *ringSet) wait(op string, timeout time.Duration) error {
	if dl := rs.deadline.Load(); dl != 0 {
		left := time.Until(time.Unix(0, dl))
		if left <= 0 {
			return fmt.Errorf("%s: %w", op, os.ErrDeadlineExceeded)
		}
		if timeout < 0 || left < timeout {
			timeout = left
		}
	}
	n, err := rs.w.wait(rs.evs, timeout)
	if err != nil {
		return fmt.Errorf("%s: %w", op, err)
	}
	for _, ev := range rs.evs[:n] {
		if ev.Fd == wakeTag && !rs.life.closed() {
			rs.w.clearWake() // Flush or SetDeadline: look again
		}
	}
	return nil
}

// flushReached takes up a Flush that was called and reports whether the
// running flush has delivered everything up to its heads. Readers check it
// between passes (Reader) or records (OrderedReader), so that a flush ends
// while a producer keeps writing, and block checks it when all is read.
func (c *core) flushReached() bool {
	if c.flushReq.Load() {
		c.flushMu.Lock()
		c.flushReq.Store(false)
		copy(c.flushTo, c.flushHeads)
		c.flushMu.Unlock()
		c.flushOn = true
	}
	if !c.flushOn {
		return false
	}
	for i := range c.rings {
		if int64(c.src.oldest(i)-c.flushTo[i]) < 0 {
			return false
		}
	}
	return true
}

// flushDone is flushReached, ending the flush if it has.
func (c *core) flushDone() bool {
	if !c.flushReached() {
		return false
	}
	c.flushOn = false
	return true
}

// source is how a reader chooses records: Reader drains fullest first,
// OrderedReader merges by key.
type source interface {
	// next returns the next record to deliver and its ring's index, or
	// -1 when there is none to deliver now. The record stays valid until
	// delivered(i). next sets the source's part of s: Key and Late.
	next(s *Sample) (*Record, int)
	// delivered is called after the record's consumer returned.
	delivered(i int)
	// idle commits what was delivered and returns how long to wait.
	idle() time.Duration
	// commitPublish commits what ring i delivered and publishes its
	// stats; core.free calls it for every ring, so that Close counts as
	// Discarded only what was not delivered.
	commitPublish(i int)
	// oldest is where ring i's records not yet delivered start.
	oldest(i int) uint64
}

// core implements the read methods over a source.
type core struct {
	ringSet
	src  source
	meta Sample // the source's part of a delivery: key, late mark
}

// setSource completes a reader's construction: src reads, and Close, once
// the last read is out, commits what src delivered before it frees.
func (c *core) setSource(src source) {
	c.src = src
	c.life.free = c.free
}

// free is ringSet.free after every ring's delivered records are committed:
// Discarded counts from there. No read is in progress (see lifetime).
func (c *core) free() {
	for i := range c.rings {
		c.src.commitPublish(i)
	}
	c.ringSet.free()
}

// readFunc runs fn on each record, zero-copy, until fn fails or the reader
// stops (close, deadline, ctx, a Flush completing).
func (c *core) readFunc(ctx context.Context, op string, fn func(i int, rec *Record, s *Sample) error) error {
	stop, err := c.enterRead(ctx, op)
	if err != nil {
		return err
	}
	defer c.exitRead(stop)
	for n := 0; ; n++ {
		if c.life.closed() {
			return fmt.Errorf("%s: %w", op, os.ErrClosed)
		}
		// ctx is checked every 256 records, and whenever there is nothing
		// to read; its cancellation wakes the wait (AfterFunc above).
		if n&255 == 0 {
			if err := ctx.Err(); err != nil {
				return fmt.Errorf("%s: %w", op, err)
			}
		}
		if rec, i := c.src.next(&c.meta); i >= 0 {
			err := fn(i, rec, &c.meta)
			c.src.delivered(i)
			if err != nil {
				return err
			}
			continue
		}
		if err := c.block(ctx, op); err != nil {
			return err
		}
	}
}

// enterRead starts a read: it takes the reader (reads run one at a time)
// and, if ctx can be cancelled, makes its cancellation wake the wait. Pass
// what it returns to exitRead.
func (c *core) enterRead(ctx context.Context, op string) (stop func() bool, err error) {
	if err := c.life.enterExclusive(op); err != nil {
		return nil, err
	}
	if ctx.Done() != nil {
		// poke, not wake: the func may still run after the read returned
		// and Close freed the waiter; poke does nothing once closed.
		stop = context.AfterFunc(ctx, c.poke)
	}
	return stop, nil
}

// exitRead ends a read that enterRead started.
func (c *core) exitRead(stop func() bool) {
	if stop != nil {
		stop()
	}
	c.life.exitExclusive()
}

// block is what a read does when there is nothing to deliver: commit, end
// a completed Flush, or wait.
func (c *core) block(ctx context.Context, op string) error {
	if c.life.closed() {
		return fmt.Errorf("%s: %w", op, os.ErrClosed)
	}
	timeout := c.src.idle()
	if c.flushDone() {
		return fmt.Errorf("%s: %w", op, ErrFlushed)
	}
	if c.flushing() {
		// The flush is not done: read on without waiting, but not past
		// the deadline.
		if c.pastDeadline() {
			return fmt.Errorf("%s: %w", op, os.ErrDeadlineExceeded)
		}
		return nil
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("%s: %w", op, err)
	}
	return c.wait(op, timeout)
}

// errStop ends readFunc after one record; it never leaves this file.
var errStop = errors.New("stop")

// ReadInto blocks until a record is available and copies it into s, reusing
// s.Data's capacity: no allocation once it is large enough.
//
// Errors (wrapped): os.ErrClosed after Close, os.ErrDeadlineExceeded past
// the deadline, ErrFlushed once a Flush completed, ErrReentrant from inside
// an Each function or All loop (see Reader).
func (c *core) ReadInto(s *Sample) error {
	// readFunc's loop without its callback and context: this is the call
	// made once per record.
	const op = "read perf buffer"
	if err := c.life.enterExclusive(op); err != nil {
		return err
	}
	defer c.life.exitExclusive()
	for !c.life.closed() {
		if rec, i := c.src.next(&c.meta); i >= 0 {
			c.copySample(s, i, rec, &c.meta)
			c.src.delivered(i)
			return nil
		}
		if err := c.block(context.Background(), op); err != nil {
			return err
		}
	}
	return fmt.Errorf("%s: %w", op, os.ErrClosed)
}

// copySample fills s with ring i's record, copying the payload into the
// memory s.Data already has when it is large enough.
func (c *core) copySample(s *Sample, i int, rec *Record, meta *Sample) {
	buf := s.Data
	*s = *meta
	s.CPU, s.Type, s.Lost, s.Data = c.rings[i].CPU(), rec.Type, rec.Lost, rec.AppendTo(buf[:0])
}

// Read is ReadInto into a new Sample.
func (c *core) Read() (*Sample, error) {
	s := new(Sample)
	if err := c.ReadInto(s); err != nil {
		return nil, err
	}
	return s, nil
}

// All returns an iterator over the records, copied into one reused Sample
// (valid until the next iteration). It ends when ctx is done or the reader
// is closed, yielding that error last; other errors (deadline, ErrFlushed)
// are yielded and reading goes on.
func (c *core) All(ctx context.Context) iter.Seq2[*Sample, error] {
	return func(yield func(*Sample, error) bool) {
		var s Sample
		for {
			err := c.readFunc(ctx, "read perf buffer", func(i int, rec *Record, meta *Sample) error {
				c.copySample(&s, i, rec, meta)
				if !yield(&s, nil) {
					return errStop
				}
				return nil
			})
			if err == errStop {
				return
			}
			if !yield(nil, err) || errors.Is(err, os.ErrClosed) || ctx.Err() != nil {
				return
			}
		}
	}
}

// Reader reads every ring of a PerfBuffer in pure Go: it drains the fullest
// ring first, a budget of bytes per ring per pass, committing each ring's
// tail once per turn. It blocks in epoll over the rings and an eventfd, and
// drains at least every MaxLatency.
//
// A Reader holds all rings (PerfBuffer.Buffer) until Close. One read runs at
// a time: reads from several goroutines are serialised. Close, SetDeadline,
// Flush and Stats may be called from any goroutine. A read called from
// inside an Each function or an All loop (of any reader) does not wait for
// a read in progress, the one running it or another goroutine's: it fails
// with ErrReentrant.
type Reader struct {
	core
	rec        Record // the record being delivered
	roundRobin bool
	order      []int // rings of the current pass, in drain order
	pos        int   // current ring in order
	left       int   // budget left for it
}

// NewReader takes every ring of pb for a Reader. Errors: ErrInvalidOptions,
// ErrBusy if a ring is held already, os.ErrClosed.
func NewReader(pb *PerfBuffer, opts ReaderOptions) (*Reader, error) {
	r := &Reader{roundRobin: opts.RoundRobin}
	if err := r.open(pb, opts); err != nil {
		return nil, fmt.Errorf("new reader: %w", err)
	}
	r.setSource(r)
	return r, nil
}

// next returns the next record of the pass, starting a pass when the last
// one ended.
func (r *Reader) next(*Sample) (*Record, int) {
	rec := &r.rec
	for {
		if r.pos >= len(r.order) && !r.startPass() {
			return nil, -1
		}
		i := r.order[r.pos]
		rb := r.rings[i]
		if r.left > 0 {
			ok, err := rb.Next(rec)
			if ok {
				r.left -= int(rec.Next - rec.Pos)
				return rec, i
			}
			if err != nil {
				rb.SkipCorrupt() // counted; the ring goes on at the head
			}
		}
		r.endTurn(i)
	}
}

func (r *Reader) delivered(int) {}

// oldest: the Reader delivers each record as it parses it.
func (r *Reader) oldest(i int) uint64 { return r.rings[i].Cursor() }

// Each calls fn with every record, zero-copy, until ctx is done, the reader
// is closed, the deadline passes, a Flush completes, or fn returns an error,
// and returns that error (ctx.Err() wrapped for ctx); a nil fn is
// ErrInvalidOptions, and a call from inside another Each function or All
// loop ErrReentrant (see Reader). rec aliases ring memory and is valid only
// during the call; meta carries the CPU. This is the form meant to keep up
// with the kernel: the turn loop is written out, so that a record costs a
// parse and a call of fn. ctx is checked between
// turns (at most Budget bytes) and whenever the rings are empty.
func (r *Reader) Each(ctx context.Context, fn func(rec *Record, meta *Sample) error) error {
	const op = "read perf buffer"
	if fn == nil {
		return fmt.Errorf("%s: nil function: %w", op, ErrInvalidOptions)
	}
	stop, err := r.enterRead(ctx, op)
	if err != nil {
		return err
	}
	defer r.exitRead(stop)
	rec, meta := &r.rec, &r.meta
	for {
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("%s: %w", op, err)
		}
		if r.pos >= len(r.order) && !r.startPass() {
			if err := r.block(ctx, op); err != nil {
				return err
			}
			continue
		}
		i := r.order[r.pos]
		rb := r.rings[i]
		*meta = Sample{CPU: rb.CPU()}
		for r.left > 0 {
			if r.life.closed() {
				return fmt.Errorf("%s: %w", op, os.ErrClosed)
			}
			// The plain samples: RawBuffer.samples written out for
			// Each's fn (through an adapter closure to samples' fn, a
			// record cost about a tenth more: 2.07x against 1.85x the C
			// reference at 64 bytes). Then any other record: Next.
			meta.Type, meta.Lost = RecordSample, 0
			p, room := rb.plainRoom()
			pos := rb.cursor
			end, stop, from := pos+room, pos+min(room, uint64(r.left)), pos
			var ferr error
			for int64(stop-pos) > 0 {
				size, n := plainAt(p, end-pos)
				if size == 0 {
					break
				}
				pos, p = rb.take(rec, p, size, n)
				if ferr = fn(rec, meta); ferr != nil || r.life.closed() {
					break
				}
			}
			r.left -= int(pos - from)
			if ferr != nil {
				return ferr // the turn goes on at the next read
			}
			if pos != from {
				continue // (Close is seen at the top)
			}
			ok, err := rb.Next(rec)
			if !ok {
				if err != nil {
					rb.SkipCorrupt() // counted; the ring goes on at the head
				}
				break
			}
			r.left -= int(rec.Next - rec.Pos)
			meta.Type, meta.Lost = rec.Type, rec.Lost
			if err := fn(rec, meta); err != nil {
				return err // the turn goes on at the next read
			}
		}
		r.endTurn(i)
	}
}

// endTurn commits ring i once for its whole turn and moves to the next.
func (r *Reader) endTurn(i int) {
	r.commitPublish(i)
	r.pos++
	r.left = r.budget
}

// commitPublish commits ring i up to its cursor: every record before it
// was delivered.
func (r *Reader) commitPublish(i int) {
	rb := r.rings[i]
	if err := rb.Commit(rb.Cursor()); err != nil {
		panic(err) // the cursor is always a valid commit position
	}
	r.publish(i)
}

// startPass snapshots every ring and orders the non-empty ones, fullest
// first unless RoundRobin; a ring with an invalid head gets a turn too, to
// skip it. It reports false when all are empty, or a flush has delivered
// what it was for (block then returns ErrFlushed).
func (r *Reader) startPass() bool {
	r.order, r.pos, r.left = r.order[:0], 0, r.budget
	if r.flushing() && r.flushReached() {
		return false
	}
	for i, rb := range r.rings {
		rb.Begin()
		if used := rb.Pending(); used > 0 || rb.corrupt != nil {
			r.noteFill(i, used)
			r.order = append(r.order, i)
		}
	}
	if !r.roundRobin {
		slices.SortStableFunc(r.order, func(a, b int) int {
			return r.rings[b].Pending() - r.rings[a].Pending()
		})
	}
	return len(r.order) > 0
}

// idle: every turn ended with a commit already.
func (r *Reader) idle() time.Duration { return r.latency }
