// SPDX-License-Identifier: Apache-2.0

package owner

import (
	"context"
	"fmt"
	"os"
	"unsafe"

	"github.com/perfbuf/perfbuf/internal/ring"
)

// The reads that copy (ReadInto, ReadBatch): a record straight from the
// ring into the caller's Sample where the policy allows, else the
// policy's loop copying into a batch.

// ReadInto copies the next record into s: ReadBatch of one Sample.
func (r *Reader) ReadInto(s *ring.Copy) error {
	// The common case, in one small frame: a record there. Enter without
	// waiting, copy the next record straight from the ring (the policy's
	// NextCopy; the fullest-first policy's called directly) or else take
	// the policy's Next and copy it (nextInto), exit. Anything else
	// (another read in progress, closed, a corruption to report, CPUs to
	// add, nothing to deliver now, a flush) is ReadBatch's, for one Sample
	// (readInto); the policy's Next, if it found nothing, is asked again
	// there at no cost but its look at the rings.
	if l := &r.C.Life; s != nil && l.TryEnterExclusive() {
		copied := false
		if r.C.readsNow() {
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
	rec, i := r.pol.Next()
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
	defer r.C.Life.ExitExclusive()
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
		if err := r.C.addNewCPUs(); err != nil {
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
// up the policy's loop for one record. No policy runs a user's function
// here, so none needs wait.Reads. The fullest-first policy is called
// directly: it needs no interface, and its Delivered does nothing; its
// ring's loop copies in line (ring.Sink), with no call a record but the
// copy's; so does the ordered merge's during a run (policy.BatchCopier).
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
	var more bool
	if b := r.batcher; b != nil {
		more = b.CopyInto(&r.sink, r.copyF)
	} else {
		more, _ = r.pol.Each(r.copyF)
	}
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
