// SPDX-License-Identifier: Apache-2.0

package owner

// Callback mode's mechanism (perfbuf.PerfBuffer documents each method):
// waits and drains that hand each sample to a function.

import (
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/perfbuf/perfbuf/internal/policy"
	"github.com/perfbuf/perfbuf/internal/wait"
)

// PerfBuffer reads every ring of a core in callback mode, for
// perfbuf.PerfBuffer. Drains are serialised, and a Poll waiting holds no
// lock. A call from inside a callback that would wait for a drain fails
// with wait.ErrReentrant.
type PerfBuffer struct {
	C  *Core // the owner of the rings
	cb *policy.Callback

	drainMu sync.Mutex // serialises drains and ring additions

	// The contexts of errors, naming what is read: "poll ring buffer
	// \"events\"" (made once: a call formats nothing unless it fails).
	opPoll, opConsume string

	// cut: a drain stopped before its last ring (a callback panicked), so
	// rings that epoll reported ready may still hold samples, and their
	// readiness is spent: the next Poll drains every ring without waiting.
	cut atomic.Bool

	// drainF (pb.drainTurn, made once) drains ring drainI inside
	// wait.Drains (see drainRing), giving drainK and drainErr.
	drainF   func()
	drainI   int
	drainK   int
	drainErr error
}

// NewPerfBuffer builds a PerfBuffer over c that hands each sample to
// sample and each lost count to lost (if not nil), and starts c.
func NewPerfBuffer(c *Core, sample func(int, []byte), lost func(int, uint64)) *PerfBuffer {
	pb := &PerfBuffer{C: c, opPoll: "poll " + c.Name(), opConsume: "consume " + c.Name()}
	pb.cb = policy.NewCallback(&c.Set, sample, lost)
	pb.drainF = pb.drainTurn
	c.start(pb.cb, wait.Drains)
	return pb
}

// Poll waits up to timeout for a wakeup, then drains every ring that holds
// records, and returns how many it delivered (perf_buffer__poll).
func (pb *PerfBuffer) Poll(timeout time.Duration) (int, error) {
	op := pb.opPoll
	if err := pb.C.Life.Enter(op); err != nil {
		return 0, err
	}
	defer pb.C.Life.Exit()

	if pb.cut.Swap(false) {
		return pb.drain(op, -1, false) // see cut
	}
	// From inside a callback, fail before waiting rather than after.
	if err := pb.lockDrain(); err != nil {
		return 0, wrap(op, err)
	}
	// A BPF ring buffer's kernel wakes its reader only for a record
	// committed at the consumer position: one committed while the last
	// drain was still behind it raised no wakeup (ring.settle). Drain it
	// rather than wait for a wakeup that will not come.
	// Rings to add (a CPU came online, a ring buffer's takeover won):
	// drain adds them. Their poke may have gone to the last Poll, after
	// its wait had ended for another reason, so the flag, not the poke,
	// says so.
	settled := !pb.C.pending() && pb.C.settled(nil)
	pb.drainMu.Unlock()
	if !settled {
		return pb.drain(op, -1, false)
	}
	event, err := pb.C.W.Wait(timeout, 0)
	if err != nil {
		return 0, wrap(op, err)
	}
	if pb.C.Life.Closed() {
		return 0, wrap(op, os.ErrClosed)
	}
	if pb.C.W.Woken() {
		pb.C.W.ClearWake() // a poke: its rings are pending, below
	}
	if !event && !pb.C.pending() {
		return 0, nil
	}
	return pb.drain(op, -1, true)
}

// Consume drains every ring without waiting (perf_buffer__consume).
func (pb *PerfBuffer) Consume() (int, error) {
	op := pb.opConsume
	if err := pb.C.Life.Enter(op); err != nil {
		return 0, err
	}
	defer pb.C.Life.Exit()
	return pb.drain(op, -1, false)
}

// ConsumeBuffer drains ring i without waiting
// (perf_buffer__consume_buffer).
func (pb *PerfBuffer) ConsumeBuffer(i int) (int, error) {
	op := fmt.Sprintf("consume ring %d of %s", i, pb.C.Name())
	if err := pb.C.checkIndex(i); err != nil {
		return 0, wrap(op, err)
	}
	if err := pb.C.Life.Enter(op); err != nil {
		return 0, err
	}
	defer pb.C.Life.Exit()
	return pb.drain(op, i, false)
}

// drain delivers the records of ring one, or of every ring (-1) (after a
// wait, those with something in them: a wait does not say which ring woke
// it, see internal/wait), and returns the number of
// records delivered and the first ring's corruption. It opens the rings of
// CPUs that came online first, and reports a failure to after the drain.
// Drains are serialised; the caller holds a call reference (enter).
func (pb *PerfBuffer) drain(op string, one int, nonEmpty bool) (int, error) {
	if err := pb.lockDrain(); err != nil {
		return 0, wrap(op, err)
	}
	defer pb.drainMu.Unlock()
	firstErr := wrap(op, pb.C.addNewCPUs())
	from, to := 0, len(pb.C.Rings)
	if one >= 0 {
		from, to = one, one+1
	}
	done := false
	defer func() {
		if !done {
			pb.cut.Store(true) // a panic: see cut
		}
	}()
	n := 0
	for i := from; i < to; i++ {
		if pb.C.Stop.Load() {
			break // Close was called from a callback
		}
		if nonEmpty && pb.C.Rings[i].Cur().Used() == 0 {
			continue
		}
		k, err := pb.drainRing(i)
		n += k
		if err != nil && firstErr == nil {
			firstErr = wrap(op, err)
		}
	}
	done = true
	return n, firstErr
}

// drainRing drains ring i inside wait.Drains: a call that its sample or
// lost function makes fails with ErrReentrant rather than wait for the drain.
func (pb *PerfBuffer) drainRing(i int) (int, error) {
	pb.drainI = i
	wait.Drains.Run(pb.drainF)
	return pb.drainK, pb.drainErr
}

func (pb *PerfBuffer) drainTurn() { pb.drainK, pb.drainErr = pb.cb.Drain(pb.drainI) }

// lockDrain takes drainMu, unless it would wait from inside a callback:
// then it fails with ErrReentrant (see internal/wait).
func (pb *PerfBuffer) lockDrain() error {
	if pb.drainMu.TryLock() {
		return nil
	}
	if wait.Drains.Inside() {
		return wait.ErrReentrant
	}
	pb.drainMu.Lock()
	return nil
}
