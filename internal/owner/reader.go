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
	// copier is pol, when it can copy a record straight into a Sample:
	// ReadInto's first try.
	copier policy.Copier
	// batcher is pol, when its loop copies a ReadBatch's runs in line.
	batcher policy.BatchCopier
	// lags is pol's Lags (policy.Lagger), or nil: the rings whose wake
	// rule a wait does not rely on.
	lags func(i int) bool
	// skipSettle is keepsHeld, made once: the rings a wait sleeps on
	// without their wake rule. heldAt[i] is ring i's tail at the last
	// wait (noteHeld), for a ring buffer that holds a record back.
	skipSettle func(i int) bool
	heldAt     []uint64
	deadline   atomic.Int64 // unix nanoseconds; 0 means none

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

	// EachSteps's runs: over a policy that can (stepper: pol, a
	// policy.Stepper), the rings' loops hand their plain samples out
	// through steps (Steps and Yield set during the call).
	stepper policy.Stepper
	steps   ring.Sink

	// The policy's loop with a user's function (Each's, Consume's) runs
	// inside wait.Reads (see polEach): turnF (r.turn, made once) and what
	// it takes and gives.
	turnF func()
	call  polCall

	// The contexts of errors, naming what is read (made once: see readOp).
	opRead, opConsume *readOp
}

// polCall is what a policy's loop run inside wait.Reads takes (fn) and
// gives (Each's more and err).
type polCall struct {
	fn   func(*ring.Record) error
	more bool
	err  error
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

// Pol is the reader's policy.
func (r *Reader) Pol() policy.Reading { return r.pol }

// SetDeadline makes reads that would block at or after t fail with
// os.ErrDeadlineExceeded; the zero time means none.
func (r *Reader) SetDeadline(t time.Time) {
	var ns int64
	if !t.IsZero() {
		ns = t.UnixNano()
	}
	r.deadline.Store(ns)
	r.C.poke()
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
		stop = context.AfterFunc(ctx, r.C.poke)
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

// polEach runs the policy's loop with fn inside wait.Reads: a read that fn
// calls fails with ErrReentrant rather than wait for this one.
func (r *Reader) polEach(fn func(*ring.Record) error) (bool, error) {
	r.call.fn = fn
	wait.Reads.Run(r.turnF)
	r.call.fn = nil
	return r.call.more, r.call.err
}

func (r *Reader) turn() {
	if r.steps.Steps != nil && r.stepper != nil {
		r.call.more, r.call.err = r.stepper.EachSteps(r.call.fn, &r.steps)
		return
	}
	r.call.more, r.call.err = r.pol.Each(r.call.fn)
}

// errStop ends a policy's loop early: ReadBatch's when the batch is full.
// It never leaves this package.
var errStop = errors.New("stop")
