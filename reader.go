package perfbuf

// The Reader: its options, its read methods, and the core they share
// (waiting, Close, deadlines, Flush, stats). How the next record is chosen
// is the policy's: fullest.go or ordered.go.

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
)

// ReaderOptions configures NewReader.
type ReaderOptions struct {
	// PageCount, RingBytes, WakeupEvents, WakeupBytes and MaxSampleSize
	// size the rings and their wakeups, as in Options.
	PageCount, RingBytes, WakeupEvents, WakeupBytes, MaxSampleSize int

	// FailureMap, if set, is the BPF-side failure counters, as in Options.
	FailureMap Map

	// MaxLatency bounds how long a record waits in a ring for a wakeup:
	// the reader drains at least this often while it blocks. With
	// WakeupEvents > 1 (or WakeupBytes) a ring below its threshold raises
	// no wakeup (libbpf#438); this is what still delivers it. Zero means
	// 100 ms with such wakeups and none without them (every sample wakes
	// the reader, and an idle reader sleeps until the next one); negative
	// means wait for wakeups only.
	MaxLatency time.Duration

	// Order, if set, merges the rings in the order of a key; by default
	// each pass drains the fullest ring first (by data_head - data_tail),
	// the one closest to losing samples, up to a quarter of a ring before
	// it moves to the next.
	Order *Order
}

func (o *ReaderOptions) ring() ringOptions {
	return ringOptions{o.PageCount, o.RingBytes, o.WakeupEvents, o.WakeupBytes, o.MaxSampleSize}
}

// defaultMaxLatency is ReaderOptions.MaxLatency when it is zero.
const defaultMaxLatency = 100 * time.Millisecond

// Sample is a record as ReadInto, Read and All deliver it: a copy of a
// sample, or a count of samples the kernel lost.
type Sample struct {
	CPU  int
	Type RecordType // RecordSample or RecordLost
	// Data is a copy of the payload (padded by the kernel: see
	// Options.SampleFunc). ReadInto reuses its capacity; Read allocates.
	Data []byte
	Lost uint64 // for RecordLost
	// Key and Late are set with ReaderOptions.Order: see Record.
	Key  uint64
	Late bool
}

// Reader reads every ring of a perf event array in pure Go and owns them:
// NewReader opens them, Close frees them.
//
// One read (ReadInto, Read, Each, an All loop) runs at a time: reads from
// several goroutines are serialised. Close, SetDeadline, Flush and Stats may
// be called from any goroutine. A read called from inside an Each function
// or an All loop (of any Reader) does not wait for a read in progress, the
// one running it or another goroutine's: it fails with ErrReentrant.
//
// A read reports a corrupt ring (a record or head the kernel never writes)
// once, as a *CorruptError matching ErrCorrupt, after getting past it as
// RawBuffer.SkipCorrupt does and counting it in Stats; the next read goes on
// with every ring.
type Reader struct {
	// rings grow when a CPU comes online (hotplug.go): on the read side,
	// under flushMu and statsMu, which other goroutines take to read them.
	rings []*RawBuffer
	owner *rings // what NewReader opened (nil over rings of a test's own)
	w     *waiter
	life  lifetime // reads are its exclusive calls: one at a time
	pol   policy

	latency  time.Duration
	deadline atomic.Int64 // unix nanoseconds; 0 means none
	// Flush stores every ring's data_head in flushHeads and sets flushReq;
	// the read that takes it up copies them to flushTo, and ErrFlushed
	// comes once every ring's undelivered records start at or past them.
	flushReq   atomic.Bool
	flushMu    sync.Mutex // guards flushHeads
	flushHeads []uint64
	flushTo    []uint64 // the running flush's heads (read side only)
	flushOn    bool     // a flush runs
	// corrupt is a ring's corruption that the policy skipped and the read
	// has still to report (read side only).
	corrupt error

	statsMu sync.Mutex
	stats   []Stats
}

// policy chooses the records a Reader delivers: fullest (fullest.go) or
// ordered (ordered.go).
type policy interface {
	// next returns the next record to deliver and its ring's index, or
	// -1 when there is none to deliver now. The record stays valid until
	// delivered(i).
	next() (*Record, int)
	// delivered is called after the record's consumer returned.
	delivered(i int)
	// each delivers records to fn, zero-copy, until there is none to
	// deliver now (false, nil), fn fails (its error), or it stops for the
	// read to look at ctx and the reader's state (true, nil): at most a
	// turn or a run apart, and when the reader is closed.
	each(fn func(*Record) error) (more bool, err error)
	// idle commits what was delivered and returns how long to wait.
	idle() time.Duration
	// commitPublish commits what ring i delivered and publishes its
	// stats; free calls it for every ring, so that Close counts as
	// Discarded only what was not delivered.
	commitPublish(i int)
	// oldest is where ring i's records not yet delivered start.
	oldest(i int) uint64
	// addRing takes in ring i, added last to the reader's rings.
	addRing(i int)
}

// NewReader opens a ring on every online CPU for the perf event array m, as
// New does, and returns a Reader over them. Errors: as New's, and
// os.ErrInvalid for ReaderOptions or Order fields out of range.
func NewReader(m Map, opts ReaderOptions) (*Reader, error) {
	const op = "new reader"
	cfg, err := opts.ring().hostConfig()
	if err != nil {
		return nil, fmt.Errorf("%s: %w", op, err)
	}
	if err := opts.check(); err != nil {
		return nil, fmt.Errorf("%s: %w", op, err)
	}
	owner, err := openRings(m, cfg, opts.FailureMap)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", op, err)
	}
	if opts.MaxLatency == 0 && cfg.wakeupEvents == 1 && cfg.wakeupBytes == 0 {
		opts.MaxLatency = -1 // a wakeup on every sample: nothing waits without one
	}
	r, err := newReader(owner.raw, owner.fds, opts)
	if err != nil {
		owner.close()
		return nil, fmt.Errorf("%s: %w", op, err)
	}
	r.owner = owner
	if owner.watch != nil {
		owner.watch.notify = r.poke
		owner.watch.start()
	}
	return r, nil
}

// check checks the options that are the Reader's own.
func (o *ReaderOptions) check() error {
	if ord := o.Order; ord != nil && (ord.KeyOffset < 0 || ord.MaxDelay < 0 || ord.HighWater < 0) {
		return fmt.Errorf("negative Order field: %w", os.ErrInvalid)
	}
	return nil
}

// newReader builds a Reader over rings, woken when fds[i] (ring i's perf
// event) is readable. It does not close what it was given if it fails.
func newReader(rings []*RawBuffer, fds []int, opts ReaderOptions) (*Reader, error) {
	if err := opts.check(); err != nil {
		return nil, err
	}
	r := &Reader{
		rings:      rings,
		latency:    opts.MaxLatency,
		flushHeads: make([]uint64, len(rings)),
		flushTo:    make([]uint64, len(rings)),
		stats:      make([]Stats, len(rings)),
	}
	if r.latency == 0 {
		r.latency = defaultMaxLatency
	}
	for i, rb := range rings {
		r.stats[i].CPU = rb.CPU()
		rb.skipOther, rb.closed = true, &r.life
	}
	var err error
	if r.w, err = newWaiter(rings, fds); err != nil {
		return nil, err
	}
	r.rings = slices.Clip(r.rings) // appends must not write the caller's array
	if opts.Order != nil {
		r.pol = newOrdered(r, opts.Order)
	} else {
		r.pol = newFullest(r)
	}
	r.life.free = r.free
	r.life.callbacks = readCallbackFrames
	return r, nil
}

// addNewCPUs gives the CPUs that came online since the last call their
// rings (hotplug.go). On the read side; a check of one atomic when none
// did.
func (r *Reader) addNewCPUs(op string) error {
	if !r.owner.cpusPending() {
		return nil
	}
	if err := r.owner.addNewCPUs(r.added); err != nil {
		return fmt.Errorf("%s: %w", op, err)
	}
	return nil
}

// added takes the owner's ring i, new, into the reader.
func (r *Reader) added(i int) error {
	rb := r.owner.raw[i]
	rb.skipOther, rb.closed = true, &r.life
	if err := r.w.addRing(rb, r.owner.fds[i]); err != nil {
		return err
	}
	r.flushMu.Lock()
	r.statsMu.Lock()
	r.rings = append(r.rings, rb)
	r.flushHeads = append(r.flushHeads, 0)
	r.flushTo = append(r.flushTo, 0) // the running flush has nothing to wait for here
	r.stats = append(r.stats, Stats{CPU: rb.CPU()})
	r.statsMu.Unlock()
	r.flushMu.Unlock()
	r.pol.addRing(len(r.rings) - 1)
	return nil
}

// free commits what was delivered, counts what Close leaves in the rings,
// then frees them. No read is in progress (see lifetime).
func (r *Reader) free() {
	for i := range r.rings {
		r.pol.commitPublish(i)
	}
	r.statsMu.Lock()
	for i, rb := range r.rings {
		r.stats[i].Discarded += uint64(rb.Used())
	}
	r.statsMu.Unlock()
	if r.owner != nil {
		r.owner.close()
	}
	r.w.close()
}

// Close stops the reader: a blocked read returns an error matching
// os.ErrClosed at once, later reads fail with it, and the rings are freed
// once the read in progress, if any, has returned. Records still in the
// rings are not delivered: they are counted in Stats as Discarded when the
// rings are freed (at once if no read is in progress, else when it
// returns). To deliver them first, call Flush and read until ErrFlushed.
// Close may be called from any goroutine, also from a callback, any number
// of times, and returns nil.
func (r *Reader) Close() error {
	r.life.close(func() { r.w.wake(true) })
	return nil
}

// poke wakes a blocked read (see waiter.wakeOpen).
func (r *Reader) poke() { r.w.wakeOpen(&r.life) }

// SetDeadline makes reads blocked at or after t return an error matching
// os.ErrDeadlineExceeded. Past the deadline a read still delivers what it
// can without waiting, and fails once it would wait: the fullest-first
// Reader returns every record in the rings first; an ordered one those its
// release rule lets go (a record it holds back for an earlier one is waited
// for, so the read fails). The zero time means no deadline. It may be called
// from any goroutine; a read blocked at the time sees the new deadline.
func (r *Reader) SetDeadline(t time.Time) {
	var ns int64
	if !t.IsZero() {
		ns = t.UnixNano()
	}
	r.deadline.Store(ns)
	r.poke()
}

// Flush makes the reader deliver every record that is in the rings now
// without waiting for a wakeup; once they are all delivered, a read returns
// ErrFlushed (records written since may come before it), and reading goes
// on as before after that. It may be called from any goroutine.
func (r *Reader) Flush() {
	if r.life.enter("") != nil {
		return // closed: the rings are gone
	}
	r.flushMu.Lock()
	for i, rb := range r.rings {
		r.flushHeads[i] = rb.loadHead()
	}
	r.flushReq.Store(true)
	r.flushMu.Unlock()
	r.w.wake(false)
	r.life.exit()
}

// Stats returns per-CPU counts in buffer index order. It may be called from
// any goroutine, also after Close.
func (r *Reader) Stats() []Stats {
	r.statsMu.Lock()
	st, rings := slices.Clone(r.stats), r.rings
	r.statsMu.Unlock()
	return completeStats(st, rings, &r.life, r.owner.failureCounters())
}

// publish copies ring i's counts into the shared stats; samples, bytes and
// lost are the policy's, delivered rather than parsed.
func (r *Reader) publish(i int, samples, bytes, lost uint64) {
	st := r.rings[i].stats
	st.Samples, st.Bytes, st.Lost = samples, bytes, lost
	r.statsMu.Lock()
	s := &r.stats[i]
	st.Late, st.Dropped, st.Discarded = s.Late, s.Dropped, s.Discarded
	*s = st
	r.statsMu.Unlock()
}

// skipCorrupt skips ring i to its head after a corruption, counted, and
// keeps err for the read to report.
func (r *Reader) skipCorrupt(i int, err error) {
	r.rings[i].SkipCorrupt()
	if r.corrupt == nil {
		r.corrupt = err
	}
}

// flushing reports whether a flush is under way (records must not wait).
func (r *Reader) flushing() bool { return r.flushOn || r.flushReq.Load() }

// pastDeadline reports whether the deadline has passed.
func (r *Reader) pastDeadline() bool {
	dl := r.deadline.Load()
	return dl != 0 && time.Now().UnixNano() >= dl
}

// flushReached takes up a Flush that was called and reports whether the
// running flush has delivered everything up to its heads. The policies
// check it between passes (fullest) or records (ordered), so that a flush
// ends while a producer keeps writing, and block checks it when all is read.
func (r *Reader) flushReached() bool {
	if r.flushReq.Load() {
		r.flushMu.Lock()
		r.flushReq.Store(false)
		copy(r.flushTo, r.flushHeads)
		r.flushMu.Unlock()
		r.flushOn = true
	}
	if !r.flushOn {
		return false
	}
	for i, rb := range r.rings {
		// A head the ring passed over as invalid (RawBuffer.SkipCorrupt) is
		// no record boundary to wait for.
		if to := r.flushTo[i]; int64(r.pol.oldest(i)-to) < 0 && !(rb.ignoring && to == rb.ignored) {
			return false
		}
	}
	return true
}

// block is what a read does when there is nothing to deliver: report a
// corruption, commit, end a completed Flush, or wait. It returns the error
// the read should return, or nil to go on reading.
func (r *Reader) block(ctx context.Context, op string) error {
	if r.life.closed() {
		return fmt.Errorf("%s: %w", op, os.ErrClosed)
	}
	if err := r.takeCorrupt(op); err != nil {
		return err
	}
	timeout := r.pol.idle()
	if r.flushReached() {
		r.flushOn = false
		return fmt.Errorf("%s: %w", op, ErrFlushed)
	}
	if r.flushing() {
		// The flush is not done: read on without waiting, but not past
		// the deadline.
		if r.pastDeadline() {
			return fmt.Errorf("%s: %w", op, os.ErrDeadlineExceeded)
		}
		return nil
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("%s: %w", op, err)
	}
	if dl := r.deadline.Load(); dl != 0 {
		left := time.Until(time.Unix(0, dl))
		if left <= 0 {
			return fmt.Errorf("%s: %w", op, os.ErrDeadlineExceeded)
		}
		if timeout < 0 || left < timeout {
			timeout = left
		}
	}
	if _, err := r.w.wait(timeout); err != nil {
		return fmt.Errorf("%s: %w", op, err)
	}
	if r.w.woken.Load() && !r.life.closed() {
		r.w.clearWake() // Flush, SetDeadline or ctx: look again
	}
	return nil
}

// takeCorrupt returns the corruption a policy skipped, once.
func (r *Reader) takeCorrupt(op string) error {
	if r.corrupt == nil {
		return nil
	}
	err := r.corrupt
	r.corrupt = nil
	return fmt.Errorf("%s: %w", op, err)
}

// enterRead starts a read: it takes the reader (reads run one at a time)
// and, if ctx can be cancelled, makes its cancellation wake the wait. Pass
// what it returns to exitRead.
func (r *Reader) enterRead(ctx context.Context, op string) (stop func() bool, err error) {
	if err := r.life.enterExclusive(op); err != nil {
		return nil, err
	}
	if ctx.Done() != nil {
		// poke, not wake: the func may still run after the read returned
		// and Close freed the waiter; poke does nothing once closed.
		stop = context.AfterFunc(ctx, r.poke)
	}
	return stop, nil
}

// exitRead ends a read that enterRead started.
func (r *Reader) exitRead(stop func() bool) {
	if stop != nil {
		stop()
	}
	r.life.exitExclusive()
}

// ReadInto blocks until a record is available and copies it into s, reusing
// s.Data's capacity: no allocation once it is large enough.
//
// Errors (wrapped): os.ErrClosed after Close, os.ErrDeadlineExceeded past
// the deadline, ErrFlushed once a Flush completed, a *CorruptError (see
// Reader), ErrReentrant from inside an Each function or All loop.
func (r *Reader) ReadInto(s *Sample) error {
	const op = "read perf buffer"
	if err := r.life.enterExclusive(op); err != nil {
		return err
	}
	defer r.life.exitExclusive() // (a Key function may panic)
	return r.readInto(s, op)
}

// readInto is ReadInto once the reader is taken.
func (r *Reader) readInto(s *Sample, op string) error {
	for !r.life.closed() {
		if r.corrupt != nil {
			return r.takeCorrupt(op)
		}
		if err := r.addNewCPUs(op); err != nil {
			return err
		}
		if rec, i := r.pol.next(); i >= 0 {
			copySample(s, rec)
			r.pol.delivered(i)
			return nil
		}
		if err := r.block(context.Background(), op); err != nil {
			return err
		}
	}
	return fmt.Errorf("%s: %w", op, os.ErrClosed)
}

// copySample fills s with rec, copying the payload into the memory s.Data
// already has when it is large enough. (Field by field: a composite literal
// is built on the stack and copied in wide loads that stall on the narrow
// stores before them.)
func copySample(s *Sample, rec *Record) {
	s.Data = rec.AppendTo(s.Data[:0])
	s.CPU, s.Type, s.Lost, s.Key, s.Late = rec.CPU, rec.Type, rec.Lost, rec.Key, rec.Late
}

// Read is ReadInto into a new Sample.
func (r *Reader) Read() (*Sample, error) {
	s := new(Sample)
	if err := r.ReadInto(s); err != nil {
		return nil, err
	}
	return s, nil
}

// Each calls fn with every record, zero-copy, until ctx is done, the reader
// is closed, the deadline passes, a Flush completes, a ring is found
// corrupt, or fn returns an error, and returns that error (ctx.Err()
// wrapped for ctx). rec aliases ring memory and is valid only during the
// call. This is the form meant to keep up with the kernel: a record costs a
// parse and a call of fn. ctx is checked between turns (a quarter of a ring
// at most) and whenever nothing can be delivered.
//
// Errors: as ReadInto's, and os.ErrInvalid for a nil fn.
func (r *Reader) Each(ctx context.Context, fn func(rec *Record) error) error {
	const op = "read perf buffer"
	if fn == nil {
		return fmt.Errorf("%s: nil function: %w", op, os.ErrInvalid)
	}
	stop, err := r.enterRead(ctx, op)
	if err != nil {
		return err
	}
	defer r.exitRead(stop)
	return r.each(ctx, op, fn)
}

// each is Each's loop, for Each and All.
func (r *Reader) each(ctx context.Context, op string, fn func(*Record) error) error {
	for {
		if r.life.closed() {
			return fmt.Errorf("%s: %w", op, os.ErrClosed)
		}
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("%s: %w", op, err)
		}
		if err := r.addNewCPUs(op); err != nil {
			return err
		}
		more, err := r.pol.each(fn)
		if err != nil {
			return err
		}
		if err := r.takeCorrupt(op); err != nil {
			return err
		}
		if more {
			continue
		}
		if err := r.block(ctx, op); err != nil {
			return err
		}
	}
}

// errStop ends each after one record; it never leaves this file.
var errStop = errors.New("stop")

// All returns an iterator over the records, copied into one reused Sample
// (valid until the next iteration). It ends when ctx is done or the reader
// is closed, yielding that error last; other errors (deadline, ErrFlushed,
// a *CorruptError) are yielded and reading goes on.
func (r *Reader) All(ctx context.Context) iter.Seq2[*Sample, error] {
	const op = "read perf buffer"
	return func(yield func(*Sample, error) bool) {
		var s Sample
		fn := func(rec *Record) error {
			copySample(&s, rec)
			if !yield(&s, nil) {
				return errStop
			}
			return nil
		}
		for {
			err := r.allRead(ctx, op, fn)
			if err == errStop {
				return
			}
			if !yield(nil, err) || errors.Is(err, os.ErrClosed) || ctx.Err() != nil {
				return
			}
		}
	}
}

// allRead is one read of All's: Each without its checks.
func (r *Reader) allRead(ctx context.Context, op string, fn func(*Record) error) error {
	stop, err := r.enterRead(ctx, op)
	if err != nil {
		return err
	}
	defer r.exitRead(stop)
	return r.each(ctx, op, fn)
}
