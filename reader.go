// SPDX-License-Identifier: Apache-2.0

package perfbuf

// The Reader: its read methods and what they share (waiting, deadlines,
// Flush). How the next record is chosen is the policy's (internal/policy);
// the rings, Close and Stats are the owner core's (owner.go).

import (
	"context"
	"errors"
	"fmt"
	"iter"
	"os"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/perfbuf/perfbuf/internal/policy"
	"github.com/perfbuf/perfbuf/internal/ring"
	"github.com/perfbuf/perfbuf/internal/wait"
)

// Reader reads every ring of a map. [NewReader] opens them, [Reader.Close]
// frees them.
//
// Reads run one at a time: reads from several goroutines are serialised.
// Close, SetDeadline, Flush and Stats may be called from any goroutine. A
// read called from inside a read's function (of any Reader) fails with
// [ErrReentrant] rather than wait for itself.
//
// A corrupt ring (a record or position the kernel never writes) is got
// past, counted, and reported once, as a *[CorruptError]; the next read goes
// on with every ring.
type Reader struct {
	c    *core
	pol  policy.Reading
	full *policy.Fullest // pol, when it is the fullest-first policy: called directly
	// copier is pol, when it can copy a record straight into a Sample and
	// runs no user function (bare): ReadInto's first try.
	copier policy.Copier
	// lags is pol's Lags (policy.Lagger), or nil: the rings whose wake
	// rule a wait does not rely on.
	lags func(i int) bool
	// bare: pol runs no user function (no Order.Key), so that its Next
	// needs no wait.Reads frame.
	bare     bool
	deadline atomic.Int64 // unix nanoseconds; 0 means none

	// Consume's count: countF (r.countRec, made once, so that Consume
	// does not allocate) counts the records it passes on to fn.
	countF func(*Record) error
	fn     func(*Record) error
	n      int

	// ReadBatch's copy: over the fullest-first policy, the ring's loop
	// copies into sink (sink.Into: the caller's Samples; sink.Room: what
	// is left of the call's batchBytes); over another policy, copyF
	// (r.copyRec(), made once) copies what the policy's loop delivers into
	// sink.Into, sink.N of them so far.
	sink  ring.Sink
	copyF func(*Record) error

	// The policy's calls that may run a user's function (fn, an Order's
	// Key), run inside wait.Reads (see polEach): turnF and nextF (r.turn,
	// r.nextTurn, made once) and what they take and give.
	turnF, nextF func()
	turnFn       func(*Record) error
	turnMore     bool
	turnErr      error
	nextRec      *Record
	nextRing     int

	// The contexts of errors, naming what is read (made once: see readOp).
	opRead, opConsume *readOp
}

// readOp is the context of a read's errors: its name ("read ring buffer
// \"events\"", "consume perf event array \"events\""), and the errors that
// end reads in the normal course, wrapped once at NewReader. A read
// formats nothing unless it fails: fmt.Errorf, on a path the CPU's caches
// had left, took a read that ended a flush 4-6 µs (docs/performance.md,
// "A read that ends a flush").
type readOp struct {
	name     string
	flushed  error // ErrFlushed
	deadline error // os.ErrDeadlineExceeded
}

func newReadOp(name string) *readOp {
	return &readOp{
		name:     name,
		flushed:  fmt.Errorf("%s: %w", name, ErrFlushed),
		deadline: fmt.Errorf("%s: %w", name, os.ErrDeadlineExceeded),
	}
}

// NewReader opens every ring of m and returns a Reader over them: a ring
// on every online CPU for a perf event array (and, later, on each CPU that
// comes online), the ring of a BPF ring buffer (its records carry CPU -1),
// the ring buffers in an array of maps, and those of opts.Maps.
//
// A map has one reader in a process: NewReader fails with [ErrMapInUse]
// while another reads it. (A perf event array has a ring slot per CPU:
// across processes, the last reader opened takes the slots over.) A ring
// buffer has one reader at a time across processes: one opened while a
// reader in another process holds it reads nothing from it, its reads
// waiting, until that reader closed or ended; it then goes on from that
// reader's last commit (docs/failures.md). New and NewRaw do the same.
//
// Errors: os.ErrInvalid for an option out of range, naming it, or for a
// map that is not what bpfbuffer's or ciliumbuffer's Prepare made, when
// it completed opts (a collection made before Prepare);
// [ErrSampleTooLarge], [ErrMapInUse], [ErrMapType]; and the kernel's errno
// (EBADF for a closed descriptor, EPERM without CAP_BPF and CAP_PERFMON).
func NewReader(m Map, opts ReaderOptions) (*Reader, error) {
	const op = "new reader"
	p, err := opts.plan()
	if err != nil {
		return nil, wrap(op, err)
	}
	c, err := openCore(m, p.ring, opts.Maps, opts.FailureMap)
	if err != nil {
		return nil, wrap(op, err)
	}
	return newReader(c, p), nil
}

// newReader builds a Reader over a core (tests pass cores over rings of
// their own) with its plan.
func newReader(c *core, p readerPlan) *Reader {
	c.Latency = p.latency
	if c.ringBufs() {
		c.holdOffRingBufs(p)
	}
	r := &Reader{c: c, opRead: newReadOp("read " + c.name()), opConsume: newReadOp("consume " + c.name())}
	r.countF, r.copyF, r.turnF, r.nextF = r.countRec, r.copyRec(), r.turn, r.nextTurn
	if p.order != nil && c.ringBufs() {
		r.pol = policy.NewWindow(&c.Set, c.windowConfig(*p.order))
	} else if p.order != nil {
		r.pol = policy.NewOrdered(&c.Set, *p.order)
	} else {
		r.full = policy.NewFullest(&c.Set)
		r.pol = r.full
	}
	r.bare = p.order == nil || p.order.Key == nil
	if cp, ok := r.pol.(policy.Copier); ok && r.bare {
		r.copier = cp
	}
	if l, ok := r.pol.(policy.Lagger); ok {
		r.lags = l.Lags
	}
	c.start(r.pol, wait.Reads)
	return r
}

// Close stops the reader: a blocked read returns os.ErrClosed at once, and
// Close frees the rings (after the outputs in progress end: an RCU grace
// period), or, while a read runs a function, the read does as it returns;
// a Pause or Resume in progress delays neither. What is still in
// them is counted in Stats as Left; to deliver it first, call Flush and
// Consume. Close may be called from any goroutine, also from a read's
// function, any number of times.
//
// Close commits every record the reader delivered (a record given to a
// function counts, whatever the function returned) and nothing else: a
// Reader opened again over a pinned ring buffer goes on with the first
// record not delivered, none twice, none skipped, and counts what it finds
// there as Stats.Found. A process that ends without Close leaves the
// consumer position at the last commit (the end of a ring's turn, at most a
// quarter of the ring, or a wait): the next reader delivers those records
// again. An ordered Reader over ring buffers commits the records it copies
// into its window (see [Order]), so they are no longer in the ring for the
// next reader: a read by a function (Each, Consume, All) in progress when
// Close is called from elsewhere than a read's function delivers them
// before it returns os.ErrClosed; those that no such read delivers count
// as Left (Flush and read first to hand none over). A perf event array's rings are the reader's
// own: what is in them at Close goes with them, and a new reader starts
// with empty rings.
func (r *Reader) Close() error {
	r.c.close()
	return nil
}

// SetDeadline makes reads that would block at or after t fail with
// os.ErrDeadlineExceeded; until they would block, they deliver what they
// can. The zero time means none. A read blocked at the call sees it.
func (r *Reader) SetDeadline(t time.Time) {
	var ns int64
	if !t.IsZero() {
		ns = t.UnixNano()
	}
	r.deadline.Store(ns)
	r.c.poke()
}

// Flush makes the reader deliver what is in the rings now without waiting
// for a wakeup (an ordered Reader releases what it holds). Once it is
// delivered, a blocking read returns [ErrFlushed] and Consume returns; then
// reading goes on. A ring buffer's records behind one not yet submitted are
// not in it yet.
func (r *Reader) Flush() {
	if r.c.life.Enter("") != nil {
		return // closed: the rings are gone
	}
	r.c.RequestFlush()
	r.c.w.Wake(false)
	r.c.life.Exit()
}

// Stats returns each ring's counts (see [Stats]). It may be called from any
// goroutine, also after Close.
func (r *Reader) Stats() []Stats { return r.c.statsNow() }

// FollowsCPUs reports whether samples of CPUs that come online after
// NewReader are read: always for ring buffers; for a perf event array, when
// the CPU uevent socket opened (not in a user namespace: docs/kernels.md).
func (r *Reader) FollowsCPUs() bool { return r.c.followsCPUs() }

// Pause stops the output into every ring and returns once the outputs in
// progress have finished, until [Reader.Resume]. Reads while paused still
// deliver what is in the rings, then block. Pausing a paused Reader does
// nothing, as does resuming one not paused; after Close both fail with
// os.ErrClosed. Any goroutine may call them.
//
// A perf event array's rings are paused by the kernel
// (PERF_EVENT_IOC_PAUSE_OUTPUT; the ring of a CPU that comes online
// meanwhile opens paused). It refuses the outputs (bpf_perf_event_output
// returns ENOSPC) and counts them: a ring's next output after Resume comes
// after a lost record of that count, delivered as a [RecordLost] and
// counted in [Stats] Lost. The kernel reports that count only then: on a
// ring closed paused, or not written again, it is counted nowhere.
//
// Ring buffers have no such switch: Pause marks the reader key of
// Options.FailureMap closed, as the last reader's Close does. Outputs
// through bpf/perfbuf.bpf.h then fail in the program, counted in [Stats]
// Failed.NoEntry; other outputs are not stopped. Without a FailureMap
// whose reader key counts this Reader, the error wraps
// errors.ErrUnsupported; while another process's reader holds the key
// open, [ErrMapInUse].
func (r *Reader) Pause() error { return r.c.setPaused("pause "+r.c.name(), true) }

// Resume undoes Pause: the outputs reach the rings again. Errors: as
// Pause's.
func (r *Reader) Resume() error { return r.c.setPaused("resume "+r.c.name(), false) }

// Wakeups counts the blocked reads that a ring's wakeup ended (not a
// timeout, Close, Flush or a deadline). Any goroutine may call it.
func (r *Reader) Wakeups() uint64 { return r.c.w.Wakeups() }

// pastDeadline reports whether the deadline has passed.
func (r *Reader) pastDeadline() bool {
	dl := r.deadline.Load()
	return dl != 0 && time.Now().UnixNano() >= dl
}

// block is what a read does when there is nothing to deliver: report a
// corruption, commit, end a completed Flush, or wait (unless wait is
// false: Consume). It returns the error the read should return, or nil to
// go on reading; done reports that a non-waiting read is done.
func (r *Reader) block(ctx context.Context, op *readOp, wait bool) (done bool, err error) {
	c := r.c
	if c.life.Closed() {
		return true, fmt.Errorf("%s: %w", op.name, os.ErrClosed)
	}
	if err := r.takeCorrupt(op); err != nil {
		return true, err
	}
	timeout, slack := r.pol.Idle()
	if c.Flushing() && c.FlushReached(r.pol) {
		c.EndFlush()
		if !wait {
			return true, nil
		}
		return true, op.flushed
	}
	if c.Flushing() {
		// The flush is not done: read on without waiting, but not past
		// the deadline.
		if r.pastDeadline() {
			return true, op.deadline
		}
		return false, nil
	}
	if !wait {
		return true, nil
	}
	if err := ctx.Err(); err != nil {
		return true, fmt.Errorf("%s: %w", op.name, err)
	}
	if dl := r.deadline.Load(); dl != 0 {
		left := time.Until(time.Unix(0, dl))
		if left <= 0 {
			return true, op.deadline
		}
		if timeout < 0 || left < timeout+slack {
			timeout, slack = left, 0
		}
	}
	if !c.settled(r.lags) {
		r.noWait()
		return false, nil // a ring's kernel would not wake us: read again
	}
	quick, woken := c.w.AtOnce(), c.w.Wakeups()
	c.life.Park() // Close waits for this read to go, and frees itself
	_, err = c.w.Wait(timeout, slack)
	c.life.Unpark()
	if err != nil {
		return true, fmt.Errorf("%s: %w", op.name, err)
	}
	if c.w.Woken() {
		if !c.life.Closed() {
			c.w.ClearWake() // Flush, SetDeadline, ctx or a CPU: look again
		}
		return false, nil
	}
	if c.w.AtOnce() != quick {
		r.noWait() // the rings had moved: the wait returned at once
	}
	// A ring's wakeup ended a parked wait (not the timer, nor a ring
	// found moved at once): hold the drain off if the rings are below
	// their mark.
	if c.w.Wakeups() != woken && c.hold > 0 && c.belowHoldOff() {
		if err := r.holdOff(op); err != nil {
			return true, err
		}
	}
	return false, nil
}

// holdOff waits, once a ring buffer's wakeup came with every ring below
// its hold-off mark (core.holdOff), until a ring reaches it (a forced
// wakeup of the programs'), the hold's time is up, the deadline, or a
// wake (Close, Flush, SetDeadline, ctx): a ring's wakeup below the mark,
// another ring's first record, does not end it. While it holds the
// reader commits nothing, so the kernel wakes it no more.
func (r *Reader) holdOff(op *readOp) error {
	c := r.c
	end := time.Now().Add(c.hold)
	if dl := r.deadline.Load(); dl != 0 && dl < end.UnixNano() {
		end = time.Unix(0, dl)
	}
	for {
		left := time.Until(end)
		if left <= 0 {
			return nil
		}
		c.life.Park()
		held, err := c.w.WaitEvent(left)
		c.life.Unpark()
		if err != nil {
			return fmt.Errorf("%s: %w", op.name, err)
		}
		if !held || !c.belowHoldOff() {
			return nil
		}
	}
}

// noWait tells a policy that cares (policy.Waits) that the read went on
// after Idle without waiting.
func (r *Reader) noWait() {
	if p, ok := r.pol.(policy.Waits); ok {
		p.NoWait()
	}
}

// takeCorrupt returns the corruption a policy skipped, once.
func (r *Reader) takeCorrupt(op *readOp) error {
	if r.c.Corrupt == nil {
		return nil
	}
	err := r.c.Corrupt
	r.c.Corrupt = nil
	return fmt.Errorf("%s: %w", op.name, err)
}

// enterRead starts a read: it takes the reader (reads run one at a time)
// and, if ctx can be cancelled, makes its cancellation wake the wait. Pass
// what it returns to exitRead.
func (r *Reader) enterRead(ctx context.Context, op *readOp) (stop func() bool, err error) {
	if err := r.c.life.EnterExclusive(op.name); err != nil {
		return nil, err
	}
	if ctx.Done() != nil {
		// poke, not wake: the func may still run after the read returned
		// and Close freed the waiter; poke does nothing once closed.
		stop = context.AfterFunc(ctx, r.c.poke)
	}
	return stop, nil
}

// exitRead ends a read that enterRead started.
func (r *Reader) exitRead(stop func() bool) {
	if stop != nil {
		stop()
	}
	r.c.life.ExitExclusive()
}

// ReadInto blocks until a record is there and copies it into s, reusing
// s.Data's memory. It is [Reader.ReadBatch] of one Sample.
//
// Errors (wrapped): os.ErrClosed, os.ErrDeadlineExceeded, [ErrFlushed], a
// *[CorruptError], [ErrReentrant], os.ErrInvalid for a nil s.
func (r *Reader) ReadInto(s *Sample) error {
	// The common case, in one small frame: a record there, over a policy
	// that runs no user function (bare). Enter without waiting, copy the
	// next record straight from the ring (the policy's NextCopy; the
	// fullest-first policy's called directly) or else take the policy's
	// Next and copy it (nextInto), exit. Anything else (another read in
	// progress, closed, a corruption to report, CPUs to add, nothing to
	// deliver now, a flush) is ReadBatch's, for one Sample (readInto); the
	// policy's Next, if it found nothing, is asked again there at no cost
	// but its look at the rings.
	if l := &r.c.life; r.bare && s != nil && l.TryEnterExclusive() {
		copied := false
		if r.c.readsNow() {
			if f := r.full; f != nil {
				copied = f.NextCopy(s)
			} else if cp := r.copier; cp != nil {
				copied = cp.NextCopy(s)
			}
			if !copied {
				copied = r.nextInto(s)
			}
		}
		l.ExitExclusive()
		if copied {
			return nil
		}
	}
	return r.readInto(s)
}

// nextInto copies the policy's next record into s and reports whether
// there was one: ReadInto's way past the policy's NextCopy, and a
// ReadBatch of one Sample's (copyOut). Inside the reader.
func (r *Reader) nextInto(s *Sample) bool {
	if f := r.full; f != nil {
		rec, _ := f.Next()
		if rec == nil {
			return false
		}
		copySample(s, rec)
		return true
	}
	rec, i := r.polNext()
	if i < 0 {
		return false
	}
	copySample(s, rec)
	r.pol.Delivered(i)
	return true
}

// readInto is ReadInto past its common case: ReadBatch of one Sample.
func (r *Reader) readInto(s *Sample) error {
	if s == nil {
		return fmt.Errorf("%s: nil sample: %w", r.opRead.name, os.ErrInvalid)
	}
	_, err := r.ReadBatch(unsafe.Slice(s, 1))
	return err
}

// ReadBatch blocks until a record is there, then copies up to len(s)
// records into s without waiting for more, reusing each Data's memory, and
// returns how many: the copying form for a consumer that must keep up. A
// call copies about 8 KiB of payload at most (at least one record), so
// that the copies are still in the CPU's first-level cache when the caller
// reads them. Errors: as ReadInto's; one met after records were copied is
// the next call's.
func (r *Reader) ReadBatch(s []Sample) (int, error) {
	op := r.opRead
	if len(s) == 0 {
		return 0, nil
	}
	if err := r.c.life.EnterExclusive(op.name); err != nil {
		return 0, err
	}
	defer r.c.life.ExitExclusive() // (a Key function may panic)
	r.sink.Room = batchBytes
	// enterExclusive found the reader open: the loop looks again after
	// each turn and each wait.
	for got := 0; ; {
		if r.c.Corrupt != nil {
			if got > 0 {
				return got, nil // the error is the next call's
			}
			return 0, r.takeCorrupt(op)
		}
		if err := r.c.addNewCPUs(); err != nil {
			return 0, wrap(op.name, err)
		}
		n, more := r.copyOut(s[got:])
		got += n
		if got == len(s) || got > 0 && (!more || r.sink.Room <= 0) {
			return got, nil
		}
		if !more {
			if _, err := r.block(context.Background(), op, true); err != nil {
				return 0, err
			}
		}
		if r.c.life.Closed() {
			if got > 0 {
				return got, nil
			}
			return 0, fmt.Errorf("%s: %w", op.name, os.ErrClosed)
		}
	}
}

// copyOut copies the records the policy delivers now into s, up to len(s),
// and returns how many, and whether there may be more to deliver without a
// wait (the policy's Each's more).
//
// One record (ReadInto) is the policy's next, which costs less than setting
// up the policy's loop for one record. The fullest-first policy is called
// directly: it runs no user function, so it needs neither the interface
// nor wait.Reads, and its Delivered does nothing; its ring's loop copies
// in line (ring.Sink), with no call a record but the copy's.
func (r *Reader) copyOut(s []Sample) (int, bool) {
	if len(s) == 1 {
		if r.nextInto(&s[0]) {
			return 1, true
		}
		return 0, false
	}
	if f := r.full; f != nil {
		r.sink.Into, r.sink.N = s, 0
		more := f.CopyInto(&r.sink)
		n := r.sink.N
		r.sink.Into = nil // drop the caller's Samples
		return n, more
	}
	r.sink.Into, r.sink.N = s, 0
	more, _ := r.polEach(r.copyF)
	n := r.sink.N
	r.sink.Into = nil
	return n, more
}

// batchBytes is about how much payload a ReadBatch copies at most: with the
// ring's lines it reads, a quarter to a half of a first-level data cache
// (32 KiB on most x86 and arm64 cores). A batch of 64 records of 1 KiB
// copied 64 KiB, which the caller then read back from the second level:
// ReadBatch was slower than ReadInto at 1 KiB (issue 31).
const batchBytes = 8 << 10

// copyRec returns ReadBatch's function for a policy's loop other than the
// fullest-first one's: it copies a record into the batch's next Sample, and
// ends the loop (errStop) once the batch is full or its bytes reach
// batchBytes. (A closure over r rather than a method value, whose wrapper
// would be one more call a record. Not inlined into newReader: the
// closure's copy made there would call copySample rather than inline it.)
//
//go:noinline
func (r *Reader) copyRec() func(*Record) error {
	return func(rec *Record) error {
		copySample(&r.sink.Into[r.sink.N], rec)
		if r.sink.Took(rec.Len()) {
			return errStop
		}
		return nil
	}
}

// Each calls fn with every record, zero-copy, until ctx is done, the
// deadline passes, a Flush completes, a ring is corrupt, fn fails, or the
// reader is closed, and returns that error. rec is valid only during the
// call: the form that keeps up with the kernel at the cost of a call per
// record. Errors: as ReadInto's, os.ErrInvalid for a nil ctx or fn.
func (r *Reader) Each(ctx context.Context, fn func(rec *Record) error) error {
	op := r.opRead
	if ctx == nil || fn == nil {
		return fmt.Errorf("%s: nil context or function: %w", op.name, os.ErrInvalid)
	}
	stop, err := r.enterRead(ctx, op)
	if err != nil {
		return err
	}
	defer r.exitRead(stop)
	return r.each(ctx, op, fn, true)
}

// Consume calls fn with every record that can be delivered now, as Each
// does, without waiting, and returns how many it delivered. It allocates
// nothing. Errors: as Each's, but for the wait's.
func (r *Reader) Consume(fn func(rec *Record) error) (int, error) {
	op := r.opConsume
	if fn == nil {
		return 0, fmt.Errorf("%s: nil function: %w", op.name, os.ErrInvalid)
	}
	if err := r.c.life.EnterExclusive(op.name); err != nil {
		return 0, err
	}
	defer r.c.life.ExitExclusive()
	r.fn, r.n = fn, 0
	defer func() { r.fn = nil }()
	err := r.each(context.Background(), op, r.countF, false)
	return r.n, err
}

// countRec is Consume's function: fn, counted.
func (r *Reader) countRec(rec *Record) error {
	r.n++
	return r.fn(rec)
}

// each is the loop of Each, Consume and All: it delivers records to fn
// through the policy, and when there is none, waits (wait) or returns.
func (r *Reader) each(ctx context.Context, op *readOp, fn func(*Record) error, wait bool) error {
	for {
		if r.c.life.Closed() {
			return r.closed(op, fn)
		}
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("%s: %w", op.name, err)
		}
		if err := r.c.addNewCPUs(); err != nil {
			return wrap(op.name, err)
		}
		more, err := r.polEach(fn)
		if err != nil {
			return err
		}
		if err := r.takeCorrupt(op); err != nil {
			return err
		}
		if more {
			continue
		}
		if done, err := r.block(ctx, op, wait); done || err != nil {
			if r.c.life.Closed() {
				return r.closed(op, fn)
			}
			return err
		}
	}
}

// closed ends a read that found the reader closed. A Close from outside
// the reads' functions hands over (policy.Set.HandOver): the copies an
// ordered window holds, no longer in the ring, go to fn first.
func (r *Reader) closed(op *readOp, fn func(*Record) error) error {
	if h, ok := r.pol.(policy.Holder); ok && r.c.HandOver.Load() {
		for i := range r.c.Rings {
			if h.Held(i) > 0 {
				if _, err := r.polEach(fn); err != nil {
					return err
				}
				break
			}
		}
	}
	return fmt.Errorf("%s: %w", op.name, os.ErrClosed)
}

// polEach runs the policy's loop with fn inside wait.Reads: a read that fn
// calls fails with ErrReentrant rather than wait for this one.
func (r *Reader) polEach(fn func(*Record) error) (bool, error) {
	r.turnFn = fn
	wait.Reads.Run(r.turnF)
	r.turnFn = nil
	return r.turnMore, r.turnErr
}

func (r *Reader) turn() { r.turnMore, r.turnErr = r.pol.Each(r.turnFn) }

// polNext is the policy's next: inside wait.Reads, where an Order's Key
// runs, or directly for a policy that runs no user function (bare).
func (r *Reader) polNext() (*Record, int) {
	if r.bare {
		return r.pol.Next()
	}
	wait.Reads.Run(r.nextF)
	return r.nextRec, r.nextRing
}

func (r *Reader) nextTurn() { r.nextRec, r.nextRing = r.pol.Next() }

// errStop ends a policy's loop early: All's when yield returns false,
// ReadBatch's when the batch is full. It never leaves this file.
var errStop = errors.New("stop")

// All returns an iterator over the records, copied into one Sample reused
// by the next iteration. It ends when ctx is done or the reader is closed,
// yielding that error last; it yields other errors and reads on.
func (r *Reader) All(ctx context.Context) iter.Seq2[*Sample, error] {
	op := r.opRead
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
func (r *Reader) allRead(ctx context.Context, op *readOp, fn func(*Record) error) error {
	stop, err := r.enterRead(ctx, op)
	if err != nil {
		return err
	}
	defer r.exitRead(stop)
	return r.each(ctx, op, fn, true)
}
