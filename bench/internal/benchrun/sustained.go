// SPDX-License-Identifier: Apache-2.0

package benchrun

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/perfbuf/perfbuf"
	"github.com/perfbuf/perfbuf/bench/internal/cref"
	"github.com/perfbuf/perfbuf/internal/bpfrun"
	"golang.org/x/sys/unix"
)

// SustainedModes are the consumers the sustained measurement compares, the
// reference first.
var SustainedModes = []string{ModeC, ModeCallback, ModeReader, ModeReaderBatch, ModeReaderEach, ModeReaderBatches, ModeOrdered, ModeOrderedBatch, ModeOrderedBatches, ModeOrderedEach}

// SustainedBatches are the test-run sizes that perfbench's saturation
// measurements, of perf event arrays and of ring buffers, run by default:
// samples per BPF_PROG_TEST_RUN. A test run on the producer's own CPU runs
// with preemption off, so the larger batch keeps the consumer off that CPU
// up to 16 times as long at a stretch.
var SustainedBatches = []int{SustainedBatch, MaxBatch}

// Defaults of the sustained measurement.
const (
	SustainedSize   = 64   // bytes per sample
	SustainedPages  = 1024 // 4 MiB rings with 4 KiB pages
	SustainedWakeup = 64   // WakeupEvents
	// SustainedBatch is how many samples one test run emits by default.
	// A test run on the producer's own CPU runs with preemption off: this
	// bounds how long the consumer may wait for that CPU (~100 µs).
	SustainedBatch = 256
	// MaxBatch is the most samples one test run of perfbench's emitters
	// emits (EMIT_RUN_MAX of bench/perfbench/bpf/emit_run.bpf.h, for the
	// perf event array's and the ring buffer's alike). Other emit.bpf.h
	// objects, such as bench/selftest's, take SustainedBatch at most.
	MaxBatch = 4096
	// SustainedLatency is the consumers' poll timeout (MaxLatency for the
	// readers). With WakeupEvents > 1 the last samples of a run raise no
	// wakeup; this is what picks them up.
	SustainedLatency = time.Millisecond
)

// SustainedConfig is one sustained measurement. Zero fields take the
// defaults above.
type SustainedConfig struct {
	Mode         string // one of SustainedModes
	Samples      int    // in all, split evenly over the CPUs' producers
	Size         int
	Pages        int
	WakeupEvents int
	Batch        int           // samples per test run, at most MaxBatch (and what the emitter takes)
	Timeout      time.Duration // bounds the whole run; 0 means a minute
}

// SustainedResult is what a sustained run produced and consumed.
type SustainedResult struct {
	Mode     string
	Batch    int           // samples per test run
	Emitted  uint64        // the emitter's successful outputs, all CPUs
	Failed   uint64        // outputs that found the ring full: lost
	Received uint64        // samples the consumer read
	Lost     uint64        // samples the consumer was told were lost
	Late     uint64        // ordered Reader: records delivered out of order
	MaxFill  int           // Reader: the most bytes seen waiting in a ring
	Wall     time.Duration // from the producers' start to the last record read
	// ConsumerRan and ConsumerWaited are what the process's threads but
	// the producers' (the consumer's, and the Go runtime's beside it) ran
	// and waited runnable for a CPU over the run (schedstat.go).
	ConsumerRan, ConsumerWaited time.Duration
}

// Rate is samples received per second of wall time.
func (r SustainedResult) Rate() float64 {
	if r.Wall <= 0 {
		return 0
	}
	return float64(r.Received) / r.Wall.Seconds()
}

// Check reports an accounting mismatch: samples received must be those
// the emitter output, and lost counts those that failed.
func (r SustainedResult) Check() error {
	if r.Received != r.Emitted || r.Lost != r.Failed {
		return fmt.Errorf("sustained %s: received %d and lost %d, emitter says emitted %d and failed %d",
			r.Mode, r.Received, r.Lost, r.Emitted, r.Failed)
	}
	return nil
}

// consumer is one mode's reading side.
type consumer interface {
	// step waits (up to SustainedLatency, about) and reads what came, or
	// for a reader, reads on until it has accounted for want samples (read
	// or lost) or for another 4096 records.
	step(want uint64) error
	// counts returns the samples read and the lost samples reported.
	counts() (received, lost, late uint64)
	// maxFill is the most bytes a reader saw waiting in a ring, or 0.
	maxFill() int
	close()
}

// Sustained runs one producer per CPU, each locked to its CPU and calling
// the emit program there in a loop (cfg.Batch samples per test run, at most
// MaxBatch, and at most what e's program takes: perfbench.bpf.o takes
// MaxBatch, emit.bpf.h's other objects SustainedBatch) until its share of
// cfg.Samples is emitted, while cfg.Mode consumes on whatever
// CPU the scheduler gives it, competing with the producers. The timer runs
// from the producers' start until the consumer has accounted for every
// sample (read or reported lost). Stopped timer on return.
//
// GOMAXPROCS is raised for the run so that the producers' threads, which
// sit in the bpf syscall, never hold the P the consumer needs: the Go
// scheduler is then no part of what is measured, only the CPUs are.
//
// Lost counts arrive with the next sample that fits: if a run ended on a
// lost sample, its count would never come. So if the consumer has not
// accounted for everything 100 ms after the producers are done, a watchdog
// emits one more sample per CPU (counted like the others), at most 3 times.
func Sustained(e *bpfrun.Emitter, cfg SustainedConfig, t Timer) (SustainedResult, error) {
	t.StopTimer()
	cfg.defaults()
	res := SustainedResult{Mode: cfg.Mode, Batch: cfg.Batch}
	if cfg.Batch > MaxBatch {
		return res, fmt.Errorf("sustained %s: batch %d over %d", cfg.Mode, cfg.Batch, MaxBatch)
	}
	ncpu := len(e.CPUs)
	if cfg.Samples < ncpu {
		cfg.Samples = ncpu
	}
	c, err := openConsumer(e, cfg)
	if err != nil {
		return res, fmt.Errorf("sustained %s: %w", cfg.Mode, err)
	}
	defer c.close()
	before, err := e.Stats()
	if err != nil {
		return res, err
	}
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(max(runtime.GOMAXPROCS(0), ncpu+2)))
	sched0, err := readSched()
	if err != nil {
		return res, err
	}

	start := make(chan struct{})
	var p producers
	p.start(e, cfg.Samples, start, func(cpu, n int) error {
		return emitRuns(e, cpu, n, cfg.Size, cfg.Batch)
	})

	// The watchdog: once the producers are done, if the consumer has not
	// finished 100 ms later, emit one more sample per CPU (expected grows
	// first, so that the consumer waits for them). The consumer stops by
	// setting doneBit in expected, and the watchdog grows it only while
	// that bit is clear: either the consumer sees the new samples counted,
	// or the watchdog sees it gone and emits nothing. (A plain Add after
	// the consumer's last look left samples emitted and never read.)
	const doneBit = 1 << 63
	var expected atomic.Uint64
	expected.Store(uint64(cfg.Samples))
	grow := func() bool {
		for {
			x := expected.Load()
			if x&doneBit != 0 {
				return false
			}
			if expected.CompareAndSwap(x, x+uint64(ncpu)) {
				return true
			}
		}
	}
	finished := make(chan struct{})
	watchdog := make(chan struct{})
	go func() {
		defer close(watchdog)
		p.wg.Wait()
		for range 3 {
			select {
			case <-finished:
				return
			case <-time.After(100 * time.Millisecond):
			}
			if !grow() {
				return
			}
			for _, cpu := range e.CPUs {
				if err := e.Emit(cpu, 1, uint64(cfg.Size), 0); err != nil {
					p.fail(err)
				}
			}
		}
	}()

	t.StartTimer()
	t0 := time.Now()
	close(start)
	for steps := 1; ; steps++ {
		got, lost, _ := c.counts()
		if x := expected.Load(); got+lost >= x && expected.CompareAndSwap(x, x|doneBit) || p.failed.Load() {
			break
		}
		// A reader's step is one record: look at the clock now and then
		// only (the readers' deadline bounds a blocked read).
		if steps%1024 == 0 && time.Since(t0) > cfg.Timeout {
			err = fmt.Errorf("timed out after %v: %d read + %d lost of %d", cfg.Timeout, got, lost, expected.Load()&^doneBit)
			break
		}
		if err = c.step(expected.Load() &^ doneBit); err != nil {
			break
		}
	}
	res.Wall = time.Since(t0)
	t.StopTimer()
	sched1, serr := readSched()
	close(finished)
	<-watchdog
	if err == nil {
		err = p.err()
	}
	if err == nil {
		err = serr
	}
	if err != nil {
		return res, fmt.Errorf("sustained %s: %w", cfg.Mode, err)
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
	res.Received, res.Lost, res.Late = c.counts()
	res.MaxFill = c.maxFill()
	d := schedDelta(sched0, sched1, p.threads())
	res.ConsumerRan, res.ConsumerWaited = d.ran, d.waited
	return res, nil
}

// producers are the goroutines that emit the samples of a sustained run,
// one per CPU of the emitter, locked to it. The first error of any of them
// is kept; failed says there is one, for the consumer to stop early.
type producers struct {
	wg     sync.WaitGroup // done when every producer has returned
	failed atomic.Bool
	mu     sync.Mutex
	first  error
	tids   []int // the producers' threads (mu)
}

// start starts the producers: each waits for start to close, then calls
// emit(cpu, n) on its CPU with its share n of samples (the first
// samples%len(e.CPUs) CPUs take one more).
func (p *producers) start(e *bpfrun.Emitter, samples int, start <-chan struct{}, emit func(cpu, n int) error) {
	ncpu := len(e.CPUs)
	for i, cpu := range e.CPUs {
		n := samples / ncpu
		if i < samples%ncpu {
			n++
		}
		p.wg.Add(1)
		go func() {
			defer p.wg.Done()
			unpin, err := bpfrun.Pin(cpu)
			if err != nil {
				p.fail(err)
				return
			}
			defer unpin()
			p.mu.Lock()
			p.tids = append(p.tids, unix.Gettid())
			p.mu.Unlock()
			<-start
			if err := emit(cpu, n); err != nil {
				p.fail(err)
			}
		}()
	}
}

// emitRuns emits k samples of size bytes on cpu in test runs of at most
// batch samples: each run is one BPF_PROG_TEST_RUN, so batch must be at
// most what e's program takes in one run (the program returns 2 otherwise,
// an error here).
func emitRuns(e *bpfrun.Emitter, cpu, k, size, batch int) error {
	for first := 0; first < k; first += batch {
		n := min(k-first, batch)
		ret, err := bpfrun.Run(e.Prog, cpu, uint64(n), uint64(size), 0, uint64(first))
		if err != nil {
			return fmt.Errorf("emit: %w", err)
		}
		if ret != 0 {
			return fmt.Errorf("emit %d samples of %d bytes on cpu %d: program returned %d", n, size, cpu, ret)
		}
	}
	return nil
}

// fail records err, if it is the first.
func (p *producers) fail(err error) {
	p.mu.Lock()
	if p.first == nil {
		p.first = err
	}
	p.mu.Unlock()
	p.failed.Store(true)
}

// threads returns the producers' thread IDs.
func (p *producers) threads() []int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.tids)
}

// err returns the first error fail recorded.
func (p *producers) err() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.first
}

func (cfg *SustainedConfig) defaults() {
	if cfg.Size == 0 {
		cfg.Size = SustainedSize
	}
	if cfg.Pages == 0 {
		cfg.Pages = SustainedPages
	}
	if cfg.WakeupEvents == 0 {
		cfg.WakeupEvents = SustainedWakeup
	}
	if cfg.Batch == 0 {
		cfg.Batch = SustainedBatch
	}
	if cfg.Timeout == 0 {
		cfg.Timeout = time.Minute
	}
}

func openConsumer(e *bpfrun.Emitter, cfg SustainedConfig) (consumer, error) {
	if cfg.Mode == ModeC {
		r, err := cref.Open(e.Events.FileDescriptor(), cfg.Pages, cfg.WakeupEvents)
		if err != nil {
			return nil, err
		}
		return &cConsumer{r: r}, nil
	}
	opts := perfbuf.Options{RingBytes: RingBytes(cfg.Pages), WakeupEvents: cfg.WakeupEvents}
	ropts := perfbuf.ReaderOptions{Options: opts, MaxLatency: SustainedLatency}
	switch cfg.Mode {
	case ModeCallback:
		c := &callbackConsumer{}
		pb, err := perfbuf.New(e.Events, func(_ int, data []byte) {
			c.total += cref.ReadAll(data)
			c.received++
		}, func(_ int, n uint64) { c.lost += n }, opts)
		if err != nil {
			return nil, err
		}
		c.pb = pb
		return c, nil
	case ModeReader, ModeReaderEach, ModeReaderBatch, ModeReaderBatches, ModeOrdered, ModeOrderedEach, ModeOrderedBatch, ModeOrderedBatches:
		if isOrdered(cfg.Mode) {
			ropts.Order = &perfbuf.Order{
				KeyOffset: 8, // the sample's ktime
				MaxDelay:  time.Millisecond,
			}
		}
		r, err := perfbuf.NewReader(e.Events, ropts)
		if err != nil {
			return nil, err
		}
		r.SetDeadline(time.Now().Add(cfg.Timeout))
		c := newReaderConsumer(r, cfg.Mode == ModeReaderEach || cfg.Mode == ModeOrderedEach)
		c.batches = cfg.Mode == ModeReaderBatches || cfg.Mode == ModeOrderedBatches
		c.s = samplesFor(cfg.Mode)
		return c, nil
	}
	return nil, fmt.Errorf("unknown sustained mode %q", cfg.Mode)
}

// cConsumer: perf_buffer__poll with C callbacks.
type cConsumer struct{ r *cref.Reader }

// step polls; on a timeout it consumes every ring, as a libbpf program must
// with sample_period > 1: poll drains only the rings that woke it, and a
// ring below its wakeup threshold never does.
func (c *cConsumer) step(uint64) error {
	n, err := c.r.Poll(SustainedLatency)
	if err == nil && n == 0 {
		_, err = c.r.Consume()
	}
	return err
}

func (c *cConsumer) counts() (uint64, uint64, uint64) { return c.r.Samples(), c.r.Lost(), 0 }
func (c *cConsumer) maxFill() int                     { return 0 }
func (c *cConsumer) close()                           { c.r.Close() }

// callbackConsumer: PerfBuffer.Poll with sample and lost functions.
type callbackConsumer struct {
	pb                    *perfbuf.PerfBuffer
	received, lost, total uint64
}

// step is cConsumer.step with PerfBuffer.Poll and Consume.
func (c *callbackConsumer) step(uint64) error {
	n, err := c.pb.Poll(SustainedLatency)
	if err == nil && n == 0 {
		_, err = c.pb.Consume()
	}
	return err
}

func (c *callbackConsumer) counts() (uint64, uint64, uint64) { return c.received, c.lost, 0 }
func (c *callbackConsumer) maxFill() int                     { return 0 }
func (c *callbackConsumer) close()                           { c.pb.Close() }

// readerConsumer: a Reader, fullest-first or ordered, with ReadInto one
// reused Sample, ReadBatch into 64, with Each, or with Batches.
type readerConsumer struct {
	r                           *perfbuf.Reader
	s                           []perfbuf.Sample // ReadInto the one, or ReadBatch into them all (samplesFor)
	received, lost, late, total uint64
	each                        func(rec *perfbuf.Record) error // nil: ReadInto, ReadBatch or Batches
	batches                     bool
	want                        uint64 // Each's goal (Batches's is stepBatches' argument)
}

// errEnough ends a consumer's Each.
var errEnough = errors.New("enough for this step")

func newReaderConsumer(r *perfbuf.Reader, each bool) *readerConsumer {
	c := &readerConsumer{r: r}
	if each {
		c.each = func(rec *perfbuf.Record) error {
			c.count(rec.Type, rec.Lost, rec.Late, readRecord(rec))
			if n := c.received + c.lost; n >= c.want || n%4096 == 0 {
				return errEnough
			}
			return nil
		}
	}
	return c
}

// step reads one record with ReadInto, what one ReadBatch returns, or with
// Each or Batches reads until want samples are accounted for (or 4096
// more). Each and Batches wait as long as it takes: the reader drains at
// least every MaxLatency, and the deadline bounds it.
func (c *readerConsumer) step(want uint64) error {
	if c.batches {
		return c.stepBatches(want)
	}
	if c.each != nil {
		c.want = want
		if err := c.r.Each(context.Background(), c.each); err != errEnough {
			return err // os.ErrDeadlineExceeded once the run's Timeout passed
		}
		return nil
	}
	got, err := read(c.r, c.s)
	for i := range c.s[:got] {
		s := &c.s[i]
		c.count(s.Type, s.Lost, s.Late, cref.ReadAll(s.Data))
	}
	return err
}

// stepBatches is step with Batches. (A method of its own: the loop's body
// is a closure that captures want, which would move step's want to the
// heap, an allocation a ReadInto.)
func (c *readerConsumer) stepBatches(want uint64) error {
	for b, err := range c.r.Batches(context.Background()) {
		if err != nil {
			return err // os.ErrDeadlineExceeded once the run's Timeout passed
		}
		for b.Next() {
			rec := b.Record()
			c.count(rec.Type, rec.Lost, rec.Late, readRecord(rec))
			if n := c.received + c.lost; n >= want || n%4096 == 0 {
				return nil // (the records stepped to are taken)
			}
		}
	}
	return nil
}

// count adds a record of type typ: lost is its lost count, late its mark,
// sum the sum of its bytes.
func (c *readerConsumer) count(typ perfbuf.RecordType, lost uint64, late bool, sum uint64) {
	switch typ {
	case perfbuf.RecordSample:
		c.received++
		c.total += sum
		if late {
			c.late++
		}
	case perfbuf.RecordLost:
		c.lost += lost
	}
}

func (c *readerConsumer) counts() (uint64, uint64, uint64) { return c.received, c.lost, c.late }

func (c *readerConsumer) maxFill() int { return c.r.Stats().MaxFill }

func (c *readerConsumer) close() { c.r.Close() }
