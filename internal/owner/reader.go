// SPDX-License-Identifier: Apache-2.0

package owner

// The Reader's mechanism (perfbuf.Reader documents each method): the read
// loop and what the reads share (waiting, deadlines, Flush). How the next
// record is chosen is the policy's (internal/policy); the rings, Close and
// Stats are the owner core's (owner.go).

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

// Reader reads every ring of a core for perfbuf.Reader. Reads run one at
// a time; Close, SetDeadline, Flush and the core's Stats may be called
// from any goroutine. A read called from inside a read's function fails
// with wait.ErrReentrant.
type Reader struct {
	C    *Core // the owner of the rings
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
	countF func(*ring.Record) error
	fn     func(*ring.Record) error
	n      int

	// ReadBatch's copy: over the fullest-first policy, the ring's loop
	// copies into sink (sink.Into: the caller's Samples; sink.Room: what
	// is left of the call's batchBytes); over another policy, copyF
	// (r.copyRec(), made once) copies what the policy's loop delivers into
	// sink.Into, sink.N of them so far.
	sink  ring.Sink
	copyF func(*ring.Record) error

	// The policy's calls that may run a user's function (fn, an Order's
	// Key), run inside wait.Reads (see polEach): turnF and nextF (r.turn,
	// r.nextTurn, made once) and what they take and give.
	turnF, nextF func()
	call         polCall

	// The contexts of errors, naming what is read (made once: see readOp).
	opRead, opConsume *readOp
}

// polCall is what a policy's call run inside wait.Reads takes (fn, Each's)
// and gives (Each's more and err; Next's record and its ring).
type polCall struct {
	fn   func(*ring.Record) error
	more bool
	err  error
	rec  *ring.Record
	ring int
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

// Plan is a reader's options checked and resolved, once, at the root's
// NewReader: what its rings, its wait and its policy take.
type Plan struct {
	Ring    RingOptions
	Latency time.Duration       // MaxLatency resolved (negative: no bound)
	Order   *policy.OrderConfig // nil: the fullest ring first
}

// NewReader builds a Reader over c with its plan p, and starts c.
func NewReader(c *Core, p Plan) *Reader {
	c.Latency = p.Latency
	if c.RingBufs() {
		c.HoldOffRingBufs(p.Ring, p.Latency)
	}
	r := &Reader{C: c, opRead: newReadOp("read " + c.Name()), opConsume: newReadOp("consume " + c.Name())}
	r.countF, r.copyF, r.turnF, r.nextF = r.countRec, r.copyRec(), r.turn, r.nextTurn
	if p.Order != nil && c.RingBufs() {
		r.pol = policy.NewWindow(&c.Set, c.WindowConfig(*p.Order))
	} else if p.Order != nil {
		r.pol = policy.NewOrdered(&c.Set, *p.Order)
	} else {
		r.full = policy.NewFullest(&c.Set)
		r.pol = r.full
	}
	r.bare = p.Order == nil || p.Order.Key == nil
	if cp, ok := r.pol.(policy.Copier); ok && r.bare {
		r.copier = cp
	}
	if l, ok := r.pol.(policy.Lagger); ok {
		r.lags = l.Lags
	}
	c.Start(r.pol, wait.Reads)
	return r
}

// Pol is the reader's policy.
func (r *Reader) Pol() policy.Reading { return r.pol }

// Close stops the reader (perfbuf.Reader.Close).
func (r *Reader) Close() error {
	r.C.Close()
	return nil
}

// SetDeadline makes reads that would block at or after t fail with
// os.ErrDeadlineExceeded; the zero time means none.
func (r *Reader) SetDeadline(t time.Time) {
	var ns int64
	if !t.IsZero() {
		ns = t.UnixNano()
	}
	r.deadline.Store(ns)
	r.C.Poke()
}

// Flush makes the reader deliver what is in the rings now, then end a
// blocking read with ErrFlushed.
func (r *Reader) Flush() {
	if r.C.Life.Enter("") != nil {
		return // closed: the rings are gone
	}
	r.C.RequestFlush()
	r.C.W.Wake(false)
	r.C.Life.Exit()
}

// takeCorrupt returns the corruption a policy skipped, once.
func (r *Reader) takeCorrupt(op *readOp) error {
	if r.C.Corrupt == nil {
		return nil
	}
	err := r.C.Corrupt
	r.C.Corrupt = nil
	return fmt.Errorf("%s: %w", op.name, err)
}

// enterRead starts a read: it takes the reader (reads run one at a time)
// and, if ctx can be cancelled, makes its cancellation wake the wait. Pass
// what it returns to exitRead.
func (r *Reader) enterRead(ctx context.Context, op *readOp) (stop func() bool, err error) {
	if err := r.C.Life.EnterExclusive(op.name); err != nil {
		return nil, err
	}
	if ctx.Done() != nil {
		// poke, not wake: the func may still run after the read returned
		// and Close freed the waiter; poke does nothing once closed.
		stop = context.AfterFunc(ctx, r.C.Poke)
	}
	return stop, nil
}

// exitRead ends a read that enterRead started.
func (r *Reader) exitRead(stop func() bool) {
	if stop != nil {
		stop()
	}
	r.C.Life.ExitExclusive()
}

// ReadInto copies the next record into s: ReadBatch of one Sample.
func (r *Reader) ReadInto(s *ring.Copy) error {
	// The common case, in one small frame: a record there, over a policy
	// that runs no user function (bare). Enter without waiting, copy the
	// next record straight from the ring (the policy's NextCopy; the
	// fullest-first policy's called directly) or else take the policy's
	// Next and copy it (nextInto), exit. Anything else (another read in
	// progress, closed, a corruption to report, CPUs to add, nothing to
	// deliver now, a flush) is ReadBatch's, for one Sample (readInto); the
	// policy's Next, if it found nothing, is asked again there at no cost
	// but its look at the rings.
	if l := &r.C.Life; r.bare && s != nil && l.TryEnterExclusive() {
		copied := false
		if r.C.ReadsNow() {
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
func (r *Reader) nextInto(s *ring.Copy) bool {
	if f := r.full; f != nil {
		rec, _ := f.Next()
		if rec == nil {
			return false
		}
		ring.SetCopy(s, rec)
		return true
	}
	rec, i := r.polNext()
	if i < 0 {
		return false
	}
	ring.SetCopy(s, rec)
	r.pol.Delivered(i)
	return true
}

// readInto is ReadInto past its common case: ReadBatch of one Sample.
func (r *Reader) readInto(s *ring.Copy) error {
	if s == nil {
		return fmt.Errorf("%s: nil sample: %w", r.opRead.name, os.ErrInvalid)
	}
	_, err := r.ReadBatch(unsafe.Slice(s, 1))
	return err
}

// ReadBatch copies up to len(s) records into s, about batchBytes of
// payload at most, once one is there.
func (r *Reader) ReadBatch(s []ring.Copy) (int, error) {
	op := r.opRead
	if len(s) == 0 {
		return 0, nil
	}
	if err := r.C.Life.EnterExclusive(op.name); err != nil {
		return 0, err
	}
	defer r.C.Life.ExitExclusive() // (a Key function may panic)
	r.sink.Room = batchBytes
	// enterExclusive found the reader open: the loop looks again after
	// each turn and each wait.
	for got := 0; ; {
		if r.C.Corrupt != nil {
			if got > 0 {
				return got, nil // the error is the next call's
			}
			return 0, r.takeCorrupt(op)
		}
		if err := r.C.AddNewCPUs(); err != nil {
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
		if r.C.Life.Closed() {
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
func (r *Reader) copyOut(s []ring.Copy) (int, bool) {
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
func (r *Reader) copyRec() func(*ring.Record) error {
	return func(rec *ring.Record) error {
		ring.SetCopy(&r.sink.Into[r.sink.N], rec)
		if r.sink.Took(rec.Len()) {
			return errStop
		}
		return nil
	}
}

// Each calls fn with every record, zero-copy, until ctx is done, the
// deadline passes, a Flush completes, a ring is corrupt, fn fails, or the
// reader is closed.
func (r *Reader) Each(ctx context.Context, fn func(rec *ring.Record) error) error {
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
// does, without waiting, and returns how many it delivered.
func (r *Reader) Consume(fn func(rec *ring.Record) error) (int, error) {
	op := r.opConsume
	if fn == nil {
		return 0, fmt.Errorf("%s: nil function: %w", op.name, os.ErrInvalid)
	}
	if err := r.C.Life.EnterExclusive(op.name); err != nil {
		return 0, err
	}
	defer r.C.Life.ExitExclusive()
	r.fn, r.n = fn, 0
	defer func() { r.fn = nil }()
	err := r.each(context.Background(), op, r.countF, false)
	return r.n, err
}

// countRec is Consume's function: fn, counted.
func (r *Reader) countRec(rec *ring.Record) error {
	r.n++
	return r.fn(rec)
}

// each is the loop of Each, Consume and All: it delivers records to fn
// through the policy, and when there is none, waits (wait) or returns.
func (r *Reader) each(ctx context.Context, op *readOp, fn func(*ring.Record) error, wait bool) error {
	for {
		if r.C.Life.Closed() {
			return fmt.Errorf("%s: %w", op.name, os.ErrClosed)
		}
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("%s: %w", op.name, err)
		}
		if err := r.C.AddNewCPUs(); err != nil {
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
			return err
		}
	}
}

// polEach runs the policy's loop with fn inside wait.Reads: a read that fn
// calls fails with ErrReentrant rather than wait for this one.
func (r *Reader) polEach(fn func(*ring.Record) error) (bool, error) {
	r.call.fn = fn
	wait.Reads.Run(r.turnF)
	r.call.fn = nil
	return r.call.more, r.call.err
}

func (r *Reader) turn() { r.call.more, r.call.err = r.pol.Each(r.call.fn) }

// polNext is the policy's next: inside wait.Reads, where an Order's Key
// runs, or directly for a policy that runs no user function (bare).
func (r *Reader) polNext() (*ring.Record, int) {
	if r.bare {
		return r.pol.Next()
	}
	wait.Reads.Run(r.nextF)
	return r.call.rec, r.call.ring
}

func (r *Reader) nextTurn() { r.call.rec, r.call.ring = r.pol.Next() }

// errStop ends a policy's loop early: All's when yield returns false,
// ReadBatch's when the batch is full. It never leaves this file.
var errStop = errors.New("stop")

// All returns an iterator over the records, copied into one Sample reused
// by the next iteration.
func (r *Reader) All(ctx context.Context) iter.Seq2[*ring.Copy, error] {
	op := r.opRead
	return func(yield func(*ring.Copy, error) bool) {
		var s ring.Copy
		fn := func(rec *ring.Record) error {
			ring.SetCopy(&s, rec)
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
func (r *Reader) allRead(ctx context.Context, op *readOp, fn func(*ring.Record) error) error {
	stop, err := r.enterRead(ctx, op)
	if err != nil {
		return err
	}
	defer r.exitRead(stop)
	return r.each(ctx, op, fn, true)
}
