// SPDX-License-Identifier: Apache-2.0

package perfbuf

// The Reader: its read methods and what they share (waiting, deadlines,
// Flush). The read loop is the owner's (internal/owner/reader.go); how the
// next record is chosen is the policy's (internal/policy).

import (
	"context"
	"time"

	"github.com/perfbuf/perfbuf/internal/owner"
)

// Reader reads every ring of a map. [NewReader] opens them, [Rings.Close]
// frees them.
//
// Reads run one at a time: reads from several goroutines are serialised.
// SetDeadline, Flush and the methods of [Rings] may be called from any
// goroutine. A read called from inside a read's function (of any Reader)
// fails with [ErrReentrant] rather than wait for itself.
//
// A corrupt ring (a record or position the kernel never writes) is got
// past, counted, and reported once, as a *[CorruptError]; the next read goes
// on with every ring.
//
// Close commits every record the reader delivered (a record given to a
// function counts, whatever the function returned) and nothing else, so
// that a Reader opened again over a pinned ring buffer goes on with the
// first record not delivered; a process that ends without Close leaves the
// records since its last commit to the next reader, which delivers them
// again. docs/failures.md, "Reopening a pinned buffer", says where each
// form commits, and what an ordered Reader's window hands over.
type Reader struct {
	Rings
	r *owner.Reader
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

// Flush makes the reader deliver what is in the rings now without waiting
// for a wakeup (an ordered Reader releases what it holds). Once it is
// delivered, a blocking read returns [ErrFlushed] and Consume returns; then
// reading goes on. A ring buffer's records behind one not yet submitted are
// not in it yet.
func (r *Reader) Flush() { r.r.Flush() }

// ReadInto blocks until a record is there and copies it into s, reusing
// s.Data's memory. It is [Reader.ReadBatch] of one Sample.
//
// Errors (wrapped): os.ErrClosed, os.ErrDeadlineExceeded, [ErrFlushed], a
// *[CorruptError], [ErrReentrant], os.ErrInvalid for a nil s.
func (r *Reader) ReadInto(s *Sample) error { return r.r.ReadInto(s) }

// ReadBatch blocks until a record is there, then copies up to len(s)
// records into s without waiting for more, reusing each Data's memory, and
// returns how many: the copying form for a consumer that must keep up. A
// call copies about 8 KiB of payload at most (at least one record), so
// that the copies are still in the CPU's first-level cache when the caller
// reads them. Errors: as ReadInto's; one met after records were copied is
// the next call's.
func (r *Reader) ReadBatch(s []Sample) (int, error) { return r.r.ReadBatch(s) }

// Each calls fn with every record, zero-copy, until ctx is done, the
// deadline passes, a Flush completes, a ring is corrupt, fn fails, or the
// reader is closed, and returns that error. rec is valid only during the
// call: the form that keeps up with the kernel at the cost of a call per
// record. Errors: as ReadInto's, os.ErrInvalid for a nil ctx or fn.
func (r *Reader) Each(ctx context.Context, fn func(rec *Record) error) error {
	return r.r.Each(ctx, fn)
}

// Consume calls fn with every record that can be delivered now, as Each
// does, without waiting, and returns how many it delivered. It allocates
// nothing. Errors: as Each's, but for the wait's.
func (r *Reader) Consume(fn func(rec *Record) error) (int, error) { return r.r.Consume(fn) }
