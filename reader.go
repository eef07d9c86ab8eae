// SPDX-License-Identifier: Apache-2.0

package perfbuf

// The Reader: its read methods and what they share (waiting, deadlines,
// Flush). The read loop is the owner's (internal/owner/reader.go); how the
// next record is chosen is the policy's (internal/policy).

import (
	"context"
	"errors"
	"iter"
	"time"

	"github.com/perfbuf/perfbuf/internal/owner"
	"github.com/perfbuf/perfbuf/internal/ring"
)

// Reader reads every ring of a map. Reads run one at a time; one called
// from inside a read's function fails with [ErrReentrant]. SetDeadline,
// Flush and the methods of [Rings] may be called from any goroutine. A
// corrupt ring is got past, counted, and reported once, as a
// *[CorruptError]. Close commits what was delivered and nothing else, so
// that a Reader opened again over a pinned ring buffer goes on with the
// first record not delivered (docs/failures.md).
type Reader struct {
	Rings
	r *owner.Reader
}

// NewReader opens every ring of m: a ring on every online CPU for a perf
// event array (and later on each CPU that comes online), a ring buffer's,
// those in an array of ring buffers, and those of opts.Maps. A map has one
// reader in a process ([ErrMapInUse]); across processes, a ring buffer's
// second reader waits for the first to end (docs/failures.md). Errors:
// os.ErrInvalid naming the option, [ErrSampleTooLarge], [ErrMapInUse],
// [ErrMapType], the kernel's errno (EPERM without CAP_BPF and CAP_PERFMON).
func NewReader(m Map, opts ReaderOptions) (*Reader, error) {
	const op = "new reader"
	p, err := opts.plan()
	if err != nil {
		return nil, wrap(op, err)
	}
	c, err := owner.Open(m, p.Ring, ownerMaps(opts.Maps), opts.FailureMap, opts.Programs)
	if err != nil {
		return nil, wrap(op, err)
	}
	return newReader(c, p), nil
}

// newReader builds a Reader over a core (tests pass cores over rings of
// their own) with its plan.
func newReader(c *owner.Core, p owner.Plan) *Reader { return &Reader{Rings{c}, owner.NewReader(c, p)} }

// SetDeadline makes reads that would block at or after t fail with
// os.ErrDeadlineExceeded; until they would block, they deliver what they
// can. The zero time means none. A read blocked at the call sees it.
func (r *Reader) SetDeadline(t time.Time) { r.r.SetDeadline(t) }

// Flush makes the reader deliver what is in the rings now (an ordered
// Reader releases what it holds); then a blocking read returns
// [ErrFlushed] once, and reading goes on.
func (r *Reader) Flush() { r.r.Flush() }

// ReadInto blocks until a record is there and copies it into s, reusing
// s.Data's memory. Errors: os.ErrClosed, os.ErrDeadlineExceeded,
// [ErrFlushed], a *[CorruptError], [ErrReentrant].
func (r *Reader) ReadInto(s *Sample) error { return r.r.ReadInto(s) }

// ReadBatch is ReadInto of up to len(s) records, without waiting for more
// than one, and about 8 KiB of payload at most (so that the copies are in
// cache when read). An error met after records were copied is the next
// call's.
func (r *Reader) ReadBatch(s []Sample) (int, error) { return r.r.ReadBatch(s) }

// Each calls fn with every record, in place, until ctx is done, fn fails,
// or a read would return an error (as ReadInto's), and returns that error.
// rec is valid only during the call.
func (r *Reader) Each(ctx context.Context, fn func(rec *Record) error) error {
	return r.r.Each(ctx, fn)
}

// Batches is Each for the caller's own loop: it yields the records in
// batches, in place, and then the error that ended it, as Each returns.
// A batch is a run of one ring's samples (an ordered Reader's: those that
// go next in key order, each with its Key) whose step, [Batch.Next], is
// inlined into the loop, with no call a record; every other record is a
// batch of its own. Records are valid until the loop moves on to the
// next batch, which commits what was taken. The records of a run that the
// loop did not step to come again in the next batch; a batch of one is
// delivered once yielded, as Each's fn is given a record. Close ends the
// reading at the batch's end.
//
//	for b, err := range r.Batches(ctx) {
//		if err != nil {
//			return err
//		}
//		for b.Next() {
//			rec := b.Record()
//			...
//		}
//	}
func (r *Reader) Batches(ctx context.Context) iter.Seq2[*Batch, error] {
	return func(yield func(*Batch, error) bool) {
		var b Batch
		st := b.steps()
		err := r.r.EachSteps(ctx, st, func(*ring.Steps) error {
			if !b.first() {
				return ring.ErrNoRun
			}
			if !yield(&b, nil) {
				return errMovedOn
			}
			return nil
		}, func(rec *ring.Record) error {
			ring.StepOne(st, rec) // a batch of one: not probed, it has its record
			if !yield(&b, nil) {
				return errMovedOn
			}
			return nil
		})
		if err != errMovedOn {
			yield(nil, err)
		}
	}
}

// errMovedOn ends Batches's reading when the caller's loop broke out: it
// never leaves this package.
var errMovedOn = errors.New("the loop moved on")

// Consume is Each without the wait: it calls fn with the records that can
// be delivered now, and returns how many.
func (r *Reader) Consume(fn func(rec *Record) error) (int, error) { return r.r.Consume(fn) }
