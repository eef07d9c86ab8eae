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
			return r.closed(op, fn)
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
			if r.C.Life.Closed() {
				return r.closed(op, fn)
			}
			return err
		}
	}
}

// closed ends a read that found the reader closed. A Close from outside
// the reads' functions hands over (policy.Set.HandOver): the copies an
// ordered window holds, no longer in the ring, go to fn first.
func (r *Reader) closed(op *readOp, fn func(*ring.Record) error) error {
	if h, ok := r.pol.(policy.Holder); ok && r.C.HandOver.Load() {
		for i := range r.C.Rings {
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
