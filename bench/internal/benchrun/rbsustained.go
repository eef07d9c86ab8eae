// SPDX-License-Identifier: Apache-2.0

package benchrun

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync/atomic"
	"time"

	"github.com/cilium/ebpf/ringbuf"
	"github.com/perfbuf/perfbuf"
	"github.com/perfbuf/perfbuf/bench/internal/cref"
	"github.com/perfbuf/perfbuf/internal/bpfrun"
)

// RBSustainedModes are the consumers the ring buffer saturation
// measurement compares, the reference (ring_buffer__poll from C) first.
var RBSustainedModes = []string{ModeC, ModeCallback, ModeReader, ModeReaderBatch, ModeReaderEach, ModeReaderBatches, ModeOrdered, ModeOrderedBatch, ModeOrderedEach, ModeOrderedBatches, ModeCilium, ModeLibbpfgo}

// RBSustained is Sustained over a BPF ring buffer: one producer per CPU,
// each locked to its CPU, emits its share of cfg.Samples (cfg.Size bytes,
// in test runs of cfg.Batch samples, at most MaxBatch) flat out into the one
// ring buffer of e (rbbench.bpf.o) while cfg.Mode consumes on whatever CPU
// the scheduler gives it. A ring buffer reports no loss to its reader: a
// sample that finds the ring full is the program's failed output, counted
// per CPU in emit_stats, and that is the result's Failed (and Lost, so that
// Check holds when every emitted sample was received). cfg.Pages and
// cfg.WakeupEvents are not used: the kernel wakes a ring buffer's reader
// when a record is committed at the position it has consumed up to.
//
// The timer runs from the producers' start until the consumer has read
// every sample emitted: once the producers are done, the consumer is told
// (the readers through Flush), and it reads what is left.
func RBSustained(e *bpfrun.Emitter, cfg SustainedConfig, t Timer) (SustainedResult, error) {
	t.StopTimer()
	cfg.defaults()
	res := SustainedResult{Mode: cfg.Mode, Batch: cfg.Batch}
	if cfg.Batch > MaxBatch {
		return res, fmt.Errorf("ring buffer sustained %s: batch %d over %d", cfg.Mode, cfg.Batch, MaxBatch)
	}
	ncpu := len(e.CPUs)
	if cfg.Samples < ncpu {
		cfg.Samples = ncpu
	}
	c, err := openRBConsumer(e, cfg)
	if err != nil {
		return res, fmt.Errorf("ring buffer sustained %s: %w", cfg.Mode, err)
	}
	defer c.close()
	before, err := e.Stats()
	if err != nil {
		return res, err
	}
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(max(runtime.GOMAXPROCS(0), ncpu+2)))
	sched0, err := readSched() // (before the producers start: an error leaves none waiting)
	if err != nil {
		return res, err
	}

	start := make(chan struct{})
	var p producers
	p.start(e, cfg.Samples, start, func(cpu, n int) error {
		return emitRuns(e, cpu, n, cfg.Size, cfg.Batch)
	})

	// Once the producers are done, everything they emitted is in the
	// ring (a test run returns after its commits): the watcher sets the
	// target, the number emitted, then tells the consumer.
	var target atomic.Uint64
	done := make(chan struct{})
	watched := make(chan struct{})
	go func() {
		defer close(watched)
		p.wg.Wait()
		after, err := e.Stats()
		if err != nil {
			p.fail(err)
		} else {
			var n uint64
			for _, cpu := range e.CPUs {
				n += after[cpu].Sub(before[cpu]).Emitted
			}
			target.Store(n)
		}
		close(done)
		c.flush()
	}()

	t.StartTimer()
	t0 := time.Now()
	close(start)
	err = c.run(done, &target, t0.Add(cfg.Timeout))
	res.Wall = time.Since(t0)
	t.StopTimer()
	sched1, serr := readSched()
	<-watched
	if err == nil {
		err = p.err()
	}
	if err == nil {
		err = serr
	}
	if err != nil {
		return res, fmt.Errorf("ring buffer sustained %s: %w", cfg.Mode, err)
	}
	after, err := e.Stats()
	if err != nil {
		return res, err
	}
	for _, cpu := range e.CPUs {
		d := after[cpu].Sub(before[cpu])
		res.Emitted += d.Emitted
		res.Failed += d.Failed
	}
	res.Lost = res.Failed
	res.Received = c.received()
	d := schedDelta(sched0, sched1, p.threads())
	res.ConsumerRan, res.ConsumerWaited = d.ran, d.waited
	return res, nil
}

// rbConsumer is one mode's reading side of RBSustained.
type rbConsumer interface {
	// run reads until done is closed and then every sample emitted
	// (target, set before done is closed) is read, or until deadline.
	run(done <-chan struct{}, target *atomic.Uint64, deadline time.Time) error
	// flush is called once done is closed, from another goroutine: it
	// ends a reader's blocked read once the ring is empty.
	flush()
	received() uint64
	close()
}

func openRBConsumer(e *bpfrun.Emitter, cfg SustainedConfig) (rbConsumer, error) {
	fd := e.Events.FileDescriptor()
	switch cfg.Mode {
	case ModeC:
		r, err := cref.OpenRing(fd)
		if err != nil {
			return nil, err
		}
		return &rbCConsumer{r: r}, nil
	case ModeCallback:
		c := &rbCallbackConsumer{}
		pb, err := perfbuf.New(e.Events, func(_ int, data []byte) {
			c.total += cref.ReadAll(data)
			c.n++
		}, nil, perfbuf.Options{})
		if err != nil {
			return nil, err
		}
		c.pb = pb
		return c, nil
	case ModeReader, ModeReaderEach, ModeReaderBatch, ModeReaderBatches, ModeOrdered, ModeOrderedEach, ModeOrderedBatch, ModeOrderedBatches:
		var ropts perfbuf.ReaderOptions
		if isOrdered(cfg.Mode) {
			// One ring buffer, every CPU's: ordered by rules 2 to 5
			// (perfbuf.Order), the records held a millisecond.
			ropts.Order = &perfbuf.Order{KeyOffset: 8, MaxDelay: time.Millisecond} // the sample's ktime
		}
		r, err := perfbuf.NewReader(e.Events, ropts)
		if err != nil {
			return nil, err
		}
		each := cfg.Mode == ModeReaderEach || cfg.Mode == ModeOrderedEach
		batches := cfg.Mode == ModeReaderBatches || cfg.Mode == ModeOrderedBatches
		return &rbReaderConsumer{r: r, each: each, batches: batches, s: samplesFor(cfg.Mode)}, nil
	case ModeCilium:
		r, err := openCilium(fd)
		if err != nil {
			return nil, err
		}
		return &rbCiliumConsumer{r: r}, nil
	case ModeLibbpfgo:
		l, err := openLibbpfgo(e)
		if err != nil {
			return nil, err
		}
		return &rbLibbpfgoConsumer{l: l}, nil
	}
	return nil, fmt.Errorf("unknown ring buffer sustained mode %q", cfg.Mode)
}

// errTimedOut is a consumer's error when the run's Timeout passed.
var errTimedOut = errors.New("timed out")

// rbCConsumer: ring_buffer__poll with a C callback, then, once the
// producers are done, ring_buffer__consume for what is left.
type rbCConsumer struct{ r *cref.RingReader }

func (c *rbCConsumer) run(done <-chan struct{}, _ *atomic.Uint64, deadline time.Time) error {
	return pollUntilDone(done, deadline, func() error {
		_, err := c.r.Poll(SustainedLatency)
		return err
	}, func() error {
		_, err := c.r.Consume()
		return err
	})
}

func (c *rbCConsumer) flush()           {}
func (c *rbCConsumer) received() uint64 { return c.r.Samples() }
func (c *rbCConsumer) close()           { c.r.Close() }

// pollUntilDone calls poll until done is closed, then consume once.
func pollUntilDone(done <-chan struct{}, deadline time.Time, poll, consume func() error) error {
	for i := 0; ; i++ {
		select {
		case <-done:
			return consume()
		default:
		}
		if i%1024 == 0 && time.Now().After(deadline) {
			return errTimedOut
		}
		if err := poll(); err != nil {
			return err
		}
	}
}

// rbCallbackConsumer: PerfBuffer.Poll with a sample function, then Consume.
type rbCallbackConsumer struct {
	pb       *perfbuf.PerfBuffer
	n, total uint64
}

func (c *rbCallbackConsumer) run(done <-chan struct{}, _ *atomic.Uint64, deadline time.Time) error {
	return pollUntilDone(done, deadline, func() error {
		_, err := c.pb.Poll(SustainedLatency)
		return err
	}, func() error {
		_, err := c.pb.Consume()
		return err
	})
}

func (c *rbCallbackConsumer) flush()           {}
func (c *rbCallbackConsumer) received() uint64 { return c.n }
func (c *rbCallbackConsumer) close()           { c.pb.Close() }

// rbReaderConsumer: Reader.ReadInto into one reused Sample, ReadBatch into
// 64, or Reader.Each, until ErrFlushed.
type rbReaderConsumer struct {
	r        *perfbuf.Reader
	s        []perfbuf.Sample // ReadInto the one, or ReadBatch into them all
	each     bool
	batches  bool
	n, total uint64
}

func (c *rbReaderConsumer) run(_ <-chan struct{}, _ *atomic.Uint64, deadline time.Time) error {
	c.r.SetDeadline(deadline)
	var err error
	if c.each {
		err = c.r.Each(context.Background(), func(rec *perfbuf.Record) error {
			if rec.Type != perfbuf.RecordSample {
				return notSample(rec.CPU, rec.Type, rec.Lost)
			}
			c.total += readRecord(rec)
			c.n++
			return nil
		})
	} else if c.batches {
		err = c.batchesUntilFlushed()
	} else {
		var n int
		n, err = readUntilFlushed(c.r, c.s, &c.total, nil)
		c.n += uint64(n)
		if err == nil {
			return nil
		}
	}
	if errors.Is(err, perfbuf.ErrFlushed) {
		return nil
	}
	return err
}

// batchesUntilFlushed reads with Batches until the Flush ends the run
// (ErrFlushed, or the deadline's error).
func (c *rbReaderConsumer) batchesUntilFlushed() error {
	for b, err := range c.r.Batches(context.Background()) {
		if err != nil {
			return err
		}
		for b.Next() {
			rec := b.Record()
			if rec.Type != perfbuf.RecordSample {
				return notSample(rec.CPU, rec.Type, rec.Lost)
			}
			c.total += readRecord(rec)
			c.n++
		}
	}
	return nil
}

func (c *rbReaderConsumer) flush()           { c.r.Flush() }
func (c *rbReaderConsumer) received() uint64 { return c.n }
func (c *rbReaderConsumer) close()           { c.r.Close() }

// rbCiliumConsumer: cilium/ebpf's ringbuf.Reader.ReadInto until its
// ErrFlushed (Reader.Flush makes the read return it once the ring is empty).
type rbCiliumConsumer struct {
	r        *ciliumReader
	rec      ringbuf.Record
	n, total uint64
}

func (c *rbCiliumConsumer) run(_ <-chan struct{}, _ *atomic.Uint64, deadline time.Time) error {
	c.r.r.SetDeadline(deadline)
	for {
		err := c.r.r.ReadInto(&c.rec)
		if errors.Is(err, ringbuf.ErrFlushed) {
			return nil
		}
		if err != nil {
			return err
		}
		c.total += cref.ReadAll(c.rec.RawSample)
		c.n++
	}
}

func (c *rbCiliumConsumer) flush()           { _ = c.r.r.Flush() }
func (c *rbCiliumConsumer) received() uint64 { return c.n }
func (c *rbCiliumConsumer) close()           { c.r.close() }

// rbLibbpfgoConsumer: libbpfgo's RingBuffer, receiving from its channel
// until every sample emitted is received.
type rbLibbpfgoConsumer struct {
	l        *libbpfgoRing
	n, total uint64
}

func (c *rbLibbpfgoConsumer) run(done <-chan struct{}, target *atomic.Uint64, deadline time.Time) error {
	timeout := time.NewTimer(time.Until(deadline))
	defer timeout.Stop()
	for {
		select {
		case b := <-c.l.ch:
			c.total += cref.ReadAll(b)
			c.n++
			continue
		case <-done:
		case <-timeout.C:
			return errTimedOut
		}
		break
	}
	for c.n < target.Load() {
		select {
		case b := <-c.l.ch:
			c.total += cref.ReadAll(b)
			c.n++
		case <-timeout.C:
			return errTimedOut
		}
	}
	return nil
}

func (c *rbLibbpfgoConsumer) flush()           {}
func (c *rbLibbpfgoConsumer) received() uint64 { return c.n }
func (c *rbLibbpfgoConsumer) close()           { c.l.close() }
