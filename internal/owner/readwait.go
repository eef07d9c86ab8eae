// SPDX-License-Identifier: Apache-2.0

package owner

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/perfbuf/perfbuf/internal/policy"
)

// What a read does when there is nothing to deliver: report, commit, end
// a flush, or wait for the rings (and, over ring buffers, hold the drain
// off below the mark).

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
	if !c.settled(r.lags) {
		r.noWait()
		return false, nil // a ring's kernel would not wake us: read again
	}
	quick, woken := c.W.AtOnce(), c.W.Wakeups()
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
	// A ring's wakeup ended a parked wait (not the timer, nor a ring
	// found moved at once): hold the drain off if the rings are below
	// their mark.
	if c.W.Wakeups() != woken && c.hold > 0 && c.belowHoldOff() {
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
	c := r.C
	end := time.Now().Add(c.hold)
	if dl := r.deadline.Load(); dl != 0 && dl < end.UnixNano() {
		end = time.Unix(0, dl)
	}
	for {
		left := time.Until(end)
		if left <= 0 {
			return nil
		}
		c.Life.Park()
		held, err := c.W.WaitEvent(left)
		c.Life.Unpark()
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
