// SPDX-License-Identifier: Apache-2.0

package owner

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/perfbuf/perfbuf/internal/policy"
	"github.com/perfbuf/perfbuf/internal/ring"
)

// What a read does when there is nothing to deliver: report, commit, end
// a flush, or wait for the rings (over ring buffers within a budget, on
// its timer for the rings that hold a record back).

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
	c := r.C
	if c.Life.Closed() {
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
	if !c.settled(r.skipSettle) {
		r.noWait()
		return false, nil // a ring's kernel would not wake us: read again
	}
	if r.noteHeld() && (timeout < 0 || timeout > c.Latency) {
		timeout, slack = c.Latency, 0 // a ring holds a record back: look within the budget
	}
	quick := c.W.AtOnce()
	c.Life.Park() // Close waits for this read to go, and frees itself
	_, err = c.W.Wait(timeout, slack)
	c.Life.Unpark()
	if err != nil {
		return true, fmt.Errorf("%s: %w", op.name, err)
	}
	if c.W.Woken() {
		if !c.Life.Closed() {
			c.W.ClearWake() // Flush, SetDeadline, ctx or a CPU: look again
		}
		return false, nil
	}
	if c.W.AtOnce() != quick {
		r.noWait() // the rings had moved: the wait returned at once
	}
	return false, nil
}

// keepsHeld reports whether ring i may be slept on without its kind's
// wake rule (core.settled skips it): the policy's lag (policy.Lagger), or
// a ring buffer that holds a record back (ring.RingBuf.Held) and whose
// reader delivered records from it since the last wait: they keep
// coming, and the budget's timer looks again. One that brought nothing
// new since is settled, which stores its tail, so that the next record
// wakes the reader.
func (r *Reader) keepsHeld(i int) bool {
	if r.lags != nil && r.lags(i) {
		return true
	}
	b, ok := r.C.Kinds[i].(*ring.RingBuf)
	return ok && b.Held() && (i >= len(r.heldAt) || b.Cur().Tail() != r.heldAt[i])
}

// noteHeld takes each ring buffer's tail before a wait, for keepsHeld's
// next look, and reports whether one holds a record back.
func (r *Reader) noteHeld() bool {
	if !r.C.holdBack {
		return false
	}
	held := false
	for i, rb := range r.C.Kinds {
		if i == len(r.heldAt) {
			r.heldAt = append(r.heldAt, 0)
		}
		if b, ok := rb.(*ring.RingBuf); ok {
			r.heldAt[i] = b.Cur().Tail()
			held = held || b.Held()
		}
	}
	return held
}

// noWait tells a policy that cares (policy.Waits) that the read went on
// after Idle without waiting.
func (r *Reader) noWait() {
	if p, ok := r.pol.(policy.Waits); ok {
		p.NoWait()
	}
}
