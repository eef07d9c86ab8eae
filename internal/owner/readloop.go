// SPDX-License-Identifier: Apache-2.0

package owner

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/perfbuf/perfbuf/internal/policy"
	"github.com/perfbuf/perfbuf/internal/ring"
	"github.com/perfbuf/perfbuf/internal/wait"
)

// The reads that hand records to a function (Each, Consume), and the
// Reader's making, which sets up every read's loop.

// Plan is a reader's options checked and resolved, once, at the root's
// NewReader: what its rings, its wait and its policy take.
type Plan struct {
	Ring    RingOptions
	Latency time.Duration       // MaxLatency resolved (negative: no bound)
	Order   *policy.OrderConfig // nil: the fullest ring first
}

// lookEvery is how often a Reader within the latency budget latency looks
// at rings that will not wake it (policy.Set.Latency): an eighth less than
// the budget, so that a record that came just after a look, taken at the
// next one, is delivered within the budget. The runtime's netpoller sleeps
// in whole milliseconds (epoll_pwait), so a timer fires up to a
// millisecond after its time: looking every budget, p99 was 10.2-10.3 ms
// for a 10 ms budget, and so it was looking every 15/16 of it
// (docs/performance.md, "Ring buffers hold a record back"). Negative (no
// budget) stays.
func lookEvery(latency time.Duration) time.Duration {
	if latency <= 0 {
		return latency
	}
	return latency - latency/8
}

// NewReader builds a Reader over c with its plan p, and starts c.
func NewReader(c *Core, p Plan) *Reader {
	c.Latency = lookEvery(p.Latency)
	if c.ringBufs() {
		c.holdBackRingBufs(p.Ring, p.Latency)
	}
	r := &Reader{C: c, opRead: newReadOp("read " + c.Name()), opConsume: newReadOp("consume " + c.Name())}
	r.countF, r.copyF, r.turnF = r.countRec, r.copyRec(), r.turn
	if p.Order != nil && c.ringBufs() {
		r.pol = policy.NewWindow(&c.Set, c.windowConfig(*p.Order))
	} else if p.Order != nil {
		r.pol = policy.NewOrdered(&c.Set, *p.Order)
	} else {
		r.full = policy.NewFullest(&c.Set)
		r.pol = r.full
	}
	r.copier, _ = r.pol.(policy.Copier)
	r.batcher, _ = r.pol.(policy.BatchCopier)
	r.stepper, _ = r.pol.(policy.Stepper)
	if l, ok := r.pol.(policy.Lagger); ok {
		r.lags = l.Lags
	}
	r.skipSettle = r.keepsHeld
	c.start(r.pol, wait.Reads)
	return r
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

// EachSteps is Each with the records in runs: the policy's ring loops hand
// their plain samples out a run at a time in st (ring.Sink's Steps; an
// ordered policy's runs are those of rule 1: policy.Stepper) to run, and
// every other record to one, as Each's fn (which sets it in st alone with
// ring.StepOne, one call a record where a closure of this package made
// two). It returns as Each does; run's and one's errors end it, returned
// as they are.
func (r *Reader) EachSteps(ctx context.Context, st *ring.Steps, run func(*ring.Steps) error, one func(*ring.Record) error) error {
	op := r.opRead
	if ctx == nil || st == nil || run == nil || one == nil {
		return fmt.Errorf("%s: nil context, steps or function: %w", op.name, os.ErrInvalid)
	}
	stop, err := r.enterRead(ctx, op)
	if err != nil {
		return err
	}
	defer r.exitRead(stop)
	r.steps = ring.Sink{Steps: st, Yield: run}
	defer func() { r.steps = ring.Sink{} }()
	return r.each(ctx, op, one, true)
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

// each is the loop of Each and Consume: it delivers records to fn
// through the policy, and when there is none, waits (wait) or returns.
func (r *Reader) each(ctx context.Context, op *readOp, fn func(*ring.Record) error, wait bool) error {
	for {
		if r.C.Life.Closed() {
			return r.closed(op, fn)
		}
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("%s: %w", op.name, err)
		}
		if err := r.C.addNewCPUs(); err != nil {
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

// ringBufs reports whether c reads BPF ring buffers (an ordered Reader
// over them merges copies: policy.NewWindow).
func (c *Core) ringBufs() bool {
	if _, ok := c.src.(*ringBufSource); ok {
		return true // (with no ring yet, all waiting for their lock)
	}
	if len(c.Kinds) == 0 {
		return false
	}
	_, ok := c.Kinds[0].(*ring.RingBuf)
	return ok
}

// windowConfig is the ordered merge's over c's ring buffers: the Order's,
// the window's size (HighWater, or the rings' total size, those waiting
// for their consumer lock too), and which rings one CPU writes.
func (c *Core) windowConfig(ord policy.OrderConfig) policy.WindowConfig {
	wc := policy.WindowConfig{OrderConfig: ord, Bytes: ord.HighWater}
	s, _ := c.src.(*ringBufSource)
	if wc.Bytes == 0 && s != nil {
		wc.Bytes = s.bytes
	} else if wc.Bytes == 0 {
		for _, rb := range c.Rings {
			wc.Bytes += rb.Cur().Size()
		}
	}
	// Asked as each ring is added (policy.Policy's AddRing), by the
	// reading goroutine, which also grows s.oneWriter (addNew).
	wc.OneWriter = c.src.oneWriter
	return wc
}
