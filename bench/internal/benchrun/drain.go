// SPDX-License-Identifier: Apache-2.0

// Package benchrun holds the measurements that the Go benchmarks
// (bench/selftest) and bench/perfbench share, so that both measure every
// mode the same way: the C reference (bench/internal/cref), callback mode, raw
// zero-copy and copying drains, and the Reader, fullest-first and ordered.
//
// Three kinds of measurement:
//
//   - Drain: BPF pre-fills the rings (BPF_PROG_TEST_RUN, untimed), then one
//     timed pass reads every sample, touching each byte once; repeated in
//     rounds of at most a ring's worth until the requested count is read.
//   - Sustained: producers on every CPU emit while the mode under test
//     consumes; samples per second of wall time, and the lost samples.
//   - Quiet (quiet.go): one sample per wakeup at a steady rate, or none,
//     with the consumer in a process of its own; its CPU time and context
//     switches per wakeup, from getrusage.
//
// A Timer marks the timed parts of the first two: *testing.B is one,
// Stopwatch is the one perfbench uses. It does not depend on testing.
package benchrun

import (
	"context"
	"errors"
	"fmt"
	"os"
	"runtime"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/perf"
	"github.com/perfbuf/perfbuf"
	"github.com/perfbuf/perfbuf/bench/internal/cref"
	"github.com/perfbuf/perfbuf/internal/bpfrun"
)

// Timer is started around the timed part of a measurement and stopped
// around the rest. *testing.B satisfies it.
type Timer interface {
	StartTimer()
	StopTimer()
}

// The modes, as the benchmarks and perfbench name them.
const (
	ModeC            = "C"             // libbpf from C: bench/internal/cref
	ModeC2CPU        = "C-2cpu"        // the same, over the ordered modes' fill
	ModeCallback     = "callback"      // PerfBuffer.Consume with a sample function
	ModeRawZeroCopy  = "raw-zerocopy"  // RawBuffer.Drain, reading in place
	ModeRawCopy      = "raw-copy"      // RawBuffer.Drain, copying each record out
	ModeReader       = "reader"        // Reader.ReadInto
	ModeReaderEach   = "reader-each"   // Reader.Each, zero-copy
	ModeReaderBatch  = "reader-batch"  // Reader.ReadBatch, 64 Samples a call
	ModeOrdered      = "ordered"       // Reader with Order, ReadInto
	ModeOrderedEach  = "ordered-each"  // Reader with Order, Each, zero-copy
	ModeOrderedBatch = "ordered-batch" // Reader with Order, ReadBatch, 64 Samples a call

	ModeReaderBatches  = "reader-batches"  // Reader.Batches, the caller's loop in place
	ModeOrderedBatches = "ordered-batches" // Reader with Order, Batches
)

// DrainModes are the modes Drain measures, the reference first.
var DrainModes = []string{ModeC, ModeCallback, ModeRawZeroCopy, ModeRawCopy, ModeReader, ModeReaderBatch, ModeReaderEach, ModeReaderBatches, ModeC2CPU, ModeOrdered, ModeOrderedBatch, ModeOrderedEach, ModeOrderedBatches, ModeCilium}

// Reference is the C reference mode measures against: the one that reads
// the same fill. The ordered modes' fill (both CPUs' rings, in alternating
// batches) costs the C reference itself 1.03-1.10 times as much per sample
// as one CPU's ring does here (1.5 times with a wakeup per sample, which a
// fill on the reading CPU must avoid: see orderedWakeup).
func Reference(mode string) string {
	if isOrdered(mode) {
		return ModeC2CPU
	}
	return ModeC
}

// isOrdered reports whether mode reads with ReaderOptions.Order.
func isOrdered(mode string) bool {
	return mode == ModeOrdered || mode == ModeOrderedEach || mode == ModeOrderedBatch || mode == ModeOrderedBatches
}

// batchSize is the Samples a ReadBatch mode passes a call.
const batchSize = 64

// samplesFor is what mode reads into: batchSize Samples for a ReadBatch
// mode, else one (ReadInto; readSamples tells them apart by the length).
func samplesFor(mode string) []perfbuf.Sample {
	if mode == ModeReaderBatch || mode == ModeOrderedBatch {
		return make([]perfbuf.Sample, batchSize)
	}
	return make([]perfbuf.Sample, 1)
}

// Sizes are the sample sizes the drain measurements use, in bytes.
var Sizes = []int{16, 64, 256, 1024}

const (
	// DrainPages is the ring size of the drain measurements: 64 pages
	// (256 KiB with 4 KiB pages), perfbuf's default RingBytes.
	DrainPages = 64
	// FillCPU is the CPU the drain measurements fill; the reader is
	// pinned to DrainCPU().
	FillCPU = 0
	// orderedBatch is how many samples the ordered fill writes on one CPU
	// before it turns to the other.
	orderedBatch = 32
)

// DrainCPU is the CPU a drain runs on: another than FillCPU, as a reader
// runs beside its producers, so that every mode reads the ring under the
// same conditions. (A test run on the draining CPU itself is interrupted by
// each sample's wakeup: filling gets 30 times slower.)
func DrainCPU() int { return (FillCPU + 1) % runtime.NumCPU() }

// DrainConfig is one drain measurement.
type DrainConfig struct {
	Mode    string // one of DrainModes
	Size    int    // sample size in bytes
	Samples int    // samples to read in all
	Pages   int    // data pages per ring; 0 means DrainPages
}

// DrainResult is what a drain read.
type DrainResult struct {
	Samples int
	Sum     uint64 // of every byte read, so the reads cannot be elided
}

// PerRound is how many samples of size bytes one round fills and drains:
// a ring's worth, less a page of slack.
func PerRound(pages, size int) int {
	return (RingBytes(pages) - os.Getpagesize()) / RecordSize(size)
}

// RingBytes is the Options.RingBytes of a ring of pages pages of the host's
// page size: what the C reference maps for the same page count (libbpf's
// page_cnt), and what PerRound fills. (A constant 4096 made the Go modes'
// rings a quarter of that on 16 KiB pages: a round overfilled them.)
func RingBytes(pages int) int { return pages * os.Getpagesize() }

// RecordSize is the ring space an n-byte sample takes: the 8-byte
// perf_event_header, the u32 raw size, and the data, padded to 8 bytes.
func RecordSize(n int) int { return 8 + (n+4+7)&^7 }

// drainer is one mode's side of a drain measurement.
type drainer interface {
	// fill puts k samples in the rings (untimed).
	fill(k int) error
	// drain reads exactly the k samples filled, every byte (timed).
	drain(k int) error
	sum() uint64
	close()
}

// Drain measures cfg.Mode alone: DrainCompare with one mode.
func Drain(e *bpfrun.Emitter, cfg DrainConfig, t Timer) (DrainResult, error) {
	res, err := DrainCompare(e, cfg, []string{cfg.Mode}, []Timer{t})
	if err != nil {
		return DrainResult{}, err
	}
	return res[0], nil
}

// DrainCompare measures modes side by side at cfg's size and sample count
// (cfg.Mode is not used), timing mode i with timers[i]. It opens every mode
// at once, mode i over copy i of e (e.Copy: a perf event array of its own,
// since a map has one reader, and the program that writes into it), then
// goes in rounds of at most PerRound samples: in each, every mode in turn
// (starting with another one each round) fills FillCPU's ring (the ordered
// modes: both CPUs' rings) with its timer stopped, and drains the round
// with its timer running. So the modes are compared within milliseconds of
// each other: the machine's load, which drifts on a shared host, weighs on
// all of them alike. The calling goroutine is pinned to DrainCPU()
// meanwhile. The timers are stopped when DrainCompare returns.
func DrainCompare(e *bpfrun.Emitter, cfg DrainConfig, modes []string, timers []Timer) ([]DrainResult, error) {
	if cfg.Pages == 0 {
		cfg.Pages = DrainPages
	}
	return drainCompare(e, cfg, modes, timers, PerRound(cfg.Pages, max(cfg.Size, 1)), openDrainer)
}

// drainCompare is DrainCompare over any kind of map: open opens a mode's
// drainer over its copy of e, and each round fills and drains at most
// perRound samples.
func drainCompare(e *bpfrun.Emitter, cfg DrainConfig, modes []string, timers []Timer, perRound int,
	open func(*bpfrun.Emitter, DrainConfig) (drainer, error)) ([]DrainResult, error) {
	for _, t := range timers {
		t.StopTimer()
	}
	if cfg.Samples < 0 || cfg.Size < 1 || perRound < 1 || len(modes) == 0 || len(timers) != len(modes) {
		return nil, fmt.Errorf("drain %v/%d: bad config %+v with %d timers", modes, cfg.Size, cfg, len(timers))
	}
	unpin, err := bpfrun.Pin(DrainCPU())
	if err != nil {
		return nil, err
	}
	defer unpin()
	ds := make([]drainer, len(modes))
	defer func() {
		for _, d := range ds {
			if d != nil {
				d.close()
			}
		}
	}()
	for i, mode := range modes {
		c := cfg
		c.Mode = mode
		me, err := e.Copy(i)
		if err != nil {
			return nil, fmt.Errorf("drain %s/%d: %w", mode, cfg.Size, err)
		}
		if ds[i], err = open(me, c); err != nil {
			return nil, fmt.Errorf("drain %s/%d: %w", mode, cfg.Size, err)
		}
	}
	for done, round := 0, 0; done < cfg.Samples; round++ {
		k := min(perRound, cfg.Samples-done)
		for j := range modes {
			i := (j + round) % len(modes)
			if err := fillDrain(ds[i], k, timers[i]); err != nil {
				return nil, fmt.Errorf("drain %s/%d: %w", modes[i], cfg.Size, err)
			}
		}
		done += k
	}
	out := make([]DrainResult, len(modes))
	for i, d := range ds {
		out[i] = DrainResult{Samples: cfg.Samples, Sum: d.sum()}
	}
	return out, nil
}

// fillDrain fills k samples for d and drains them with t running.
func fillDrain(d drainer, k int, t Timer) error {
	if err := d.fill(k); err != nil {
		return fmt.Errorf("fill: %w", err)
	}
	t.StartTimer()
	err := d.drain(k)
	t.StopTimer()
	return err
}

// openDrainer opens cfg.Mode's reader over e's perf event array.
func openDrainer(e *bpfrun.Emitter, cfg DrainConfig) (drainer, error) {
	base := fillOne{e: e, size: cfg.Size}
	switch cfg.Mode {
	case ModeC, ModeC2CPU:
		wakeup := 0
		if cfg.Mode == ModeC2CPU {
			wakeup = orderedWakeup
		}
		r, err := cref.Open(e.Events.FileDescriptor(), cfg.Pages, wakeup)
		if err != nil {
			return nil, err
		}
		return &cDrain{fillOne: base, r: r, both: cfg.Mode == ModeC2CPU}, nil
	case ModeCallback:
		d := &callbackDrain{fillOne: base}
		pb, err := perfbuf.New(e.Events, func(_ int, data []byte) { d.total += cref.ReadAll(data) }, nil, perfbuf.Options{
			RingBytes: RingBytes(cfg.Pages),
		})
		if err != nil {
			return nil, err
		}
		d.pb = pb
		return d, nil
	case ModeRawZeroCopy, ModeRawCopy:
		return openRaw(base, cfg)
	case ModeReader, ModeReaderEach, ModeReaderBatch, ModeReaderBatches:
		r, err := perfbuf.NewReader(e.Events, perfbuf.ReaderOptions{Options: perfbuf.Options{RingBytes: RingBytes(cfg.Pages)}})
		if err != nil {
			return nil, err
		}
		return &readerDrain{fillOne: base, r: r, each: cfg.Mode == ModeReaderEach, batches: cfg.Mode == ModeReaderBatches, s: samplesFor(cfg.Mode)}, nil
	case ModeOrdered, ModeOrderedEach, ModeOrderedBatch, ModeOrderedBatches:
		return openOrdered(e, cfg)
	case ModeCilium:
		return openCiliumPerf(base, cfg)
	}
	return nil, fmt.Errorf("unknown mode %q", cfg.Mode)
}

// fillOne fills FillCPU's ring; the drain thread runs on another CPU, so
// the kernel runs the program on FillCPU in an IPI.
type fillOne struct {
	e     *bpfrun.Emitter
	size  int
	batch int // samples per test run: 0 for the perf emitter's (bpfrun.Emit)
}

func (f fillOne) fill(k int) error {
	if f.batch > 0 {
		return emitRuns(f.e, FillCPU, k, f.size, f.batch)
	}
	return f.e.Emit(FillCPU, uint64(k), uint64(f.size), 0)
}

// checkCount is a drain's error: err, or else an error if it read n
// samples where k were filled.
func checkCount(err error, n, k int) error {
	if err == nil && n != k {
		return fmt.Errorf("drained %d samples, filled %d", n, k)
	}
	return err
}

// cDrain: perf_buffer__consume with a C callback.
type cDrain struct {
	fillOne
	r    *cref.Reader
	both bool // fill as the ordered modes do
}

func (d *cDrain) fill(k int) error {
	if d.both {
		_, err := fillBoth(d.e, k, d.size)
		return err
	}
	return d.fillOne.fill(k)
}

func (d *cDrain) drain(k int) error {
	n, err := d.r.Consume()
	return checkCount(err, n, k)
}

func (d *cDrain) sum() uint64 { return d.r.Sum() }
func (d *cDrain) close()      { d.r.Close() }

// callbackDrain: PerfBuffer.Consume with a sample function, which receives a
// sample that straddles the ring's end copied into one buffer, as libbpf's
// callback does.
type callbackDrain struct {
	fillOne
	pb    *perfbuf.PerfBuffer
	total uint64
}

func (d *callbackDrain) drain(k int) error {
	n, err := d.pb.Consume()
	return checkCount(err, n, k)
}

func (d *callbackDrain) sum() uint64 { return d.total }
func (d *callbackDrain) close()      { d.pb.Close() }

// rawDrain: RawBuffer.Drain over FillCPU's ring.
type rawDrain struct {
	fillOne
	pb    *perfbuf.Raw
	rb    *perfbuf.RawBuffer
	fn    func(*perfbuf.Record) error
	buf   []byte
	total uint64
}

func openRaw(base fillOne, cfg DrainConfig) (drainer, error) {
	pb, err := perfbuf.NewRaw(base.e.Events, perfbuf.Options{RingBytes: RingBytes(cfg.Pages)})
	if err != nil {
		return nil, err
	}
	d := &rawDrain{fillOne: base, pb: pb}
	for i := 0; i < pb.BufferCount() && d.rb == nil; i++ {
		if pb.Stats().Rings[i].CPU == FillCPU {
			if d.rb, err = pb.Buffer(i); err != nil {
				pb.Close()
				return nil, err
			}
		}
	}
	if d.rb == nil {
		pb.Close()
		return nil, fmt.Errorf("no ring for cpu %d", FillCPU)
	}
	if cfg.Mode == ModeRawZeroCopy {
		d.fn = func(rec *perfbuf.Record) error {
			d.total += cref.ReadAll(rec.Data) + readWrapped(rec)
			return nil
		}
	} else {
		d.buf = make([]byte, 0, 64<<10)
		d.fn = func(rec *perfbuf.Record) error {
			d.buf = rec.AppendTo(d.buf[:0])
			d.total += cref.ReadAll(d.buf)
			return nil
		}
	}
	return d, nil
}

func (d *rawDrain) drain(k int) error {
	n, err := d.rb.Drain(d.fn)
	return checkCount(err, n, k)
}

func (d *rawDrain) sum() uint64 { return d.total }

func (d *rawDrain) close() {
	d.rb.Release()
	d.pb.Close()
}

// readerDrain: Reader.ReadInto into one reused Sample. Flush is set before
// each round (untimed) and the round reads until ErrFlushed: the Reader
// commits each ring's last turn when it finds the rings empty, so the
// round leaves the rings empty for the next fill.
type readerDrain struct {
	fillOne
	r       *perfbuf.Reader
	s       []perfbuf.Sample // ReadInto the one, or ReadBatch into them all (samplesFor)
	total   uint64
	each    bool // Reader.Each instead
	batches bool // Reader.Batches instead
}

func (d *readerDrain) fill(k int) error {
	if err := d.fillOne.fill(k); err != nil {
		return err
	}
	// A bound on the round, so that a drain that misses samples fails
	// instead of hanging.
	d.r.SetDeadline(time.Now().Add(10 * time.Second))
	d.r.Flush()
	return nil
}

func (d *readerDrain) drain(k int) error {
	n := 0
	var err error
	// The record's read is written out in each loop, not called: a call a
	// record is what the forms differ by.
	switch {
	case d.each:
		err = d.r.Each(context.Background(), func(rec *perfbuf.Record) error {
			if rec.Type != perfbuf.RecordSample {
				return notSample(rec.CPU, rec.Type, rec.Lost)
			}
			d.total += cref.ReadAll(rec.Data) + readWrapped(rec)
			n++
			return nil
		})
	case d.batches:
		for b, e := range d.r.Batches(context.Background()) {
			if err = e; e != nil {
				break
			}
			for b.Next() {
				rec := b.Record()
				if rec.Type != perfbuf.RecordSample {
					return notSample(rec.CPU, rec.Type, rec.Lost)
				}
				d.total += cref.ReadAll(rec.Data) + readWrapped(rec)
				n++
			}
		}
	default:
		n, err = readUntilFlushed(d.r, d.s, &d.total, nil)
	}
	return roundEnd(err, n, k)
}

// roundEnd is the error of a round that read n of k samples and ended
// with err: ErrFlushed is how a round ends, and then n must be k.
func roundEnd(err error, n, k int) error {
	if errors.Is(err, perfbuf.ErrFlushed) {
		err = nil
	}
	return checkCount(err, n, k)
}

func (d *readerDrain) sum() uint64 { return d.total }
func (d *readerDrain) close()      { d.r.Close() }

// readUntilFlushed reads samples until ErrFlushed (readSamples with no
// limit).
func readUntilFlushed(r *perfbuf.Reader, s []perfbuf.Sample, total *uint64, check func(*perfbuf.Sample) error) (int, error) {
	n, err := readSamples(r, s, -1, total, check)
	if errors.Is(err, perfbuf.ErrFlushed) {
		err = nil
	}
	return n, err
}

// read is ReadInto into s[0] when s holds one Sample, else ReadBatch into s:
// it returns the records read.
func read(r *perfbuf.Reader, s []perfbuf.Sample) (int, error) {
	if len(s) == 1 {
		if err := r.ReadInto(&s[0]); err != nil {
			return 0, err
		}
		return 1, nil
	}
	return r.ReadBatch(s)
}

// readSamples reads up to limit samples (negative: no limit), with
// ReadInto into one Sample, or with ReadBatch into several, summing their
// bytes into total, and returns how many it read and the error that ended
// it. check, if set, sees each sample. A lost record is an error: the rings
// were sized not to lose.
func readSamples(r *perfbuf.Reader, s []perfbuf.Sample, limit int, total *uint64, check func(*perfbuf.Sample) error) (int, error) {
	if len(s) == 1 && check == nil {
		return readInto(r, &s[0], limit, total)
	}
	n := 0
	for n != limit {
		if limit >= 0 {
			s = s[:min(len(s), limit-n)]
		}
		got, err := read(r, s)
		for i := range s[:got] {
			if s[i].Type != perfbuf.RecordSample {
				return n, notSample(s[i].CPU, s[i].Type, s[i].Lost)
			}
			if check != nil {
				if err := check(&s[i]); err != nil {
					return n, err
				}
			}
			*total += cref.ReadAll(s[i].Data)
			n++
		}
		if err != nil {
			return n, err
		}
	}
	return n, nil
}

// readInto is readSamples with ReadInto into one Sample and no check: the
// loop a consumer of ReadInto writes, as ciliumDrain's is cilium/ebpf's.
func readInto(r *perfbuf.Reader, s *perfbuf.Sample, limit int, total *uint64) (int, error) {
	n := 0
	for ; n != limit; n++ {
		if err := r.ReadInto(s); err != nil {
			return n, err
		}
		if s.Type != perfbuf.RecordSample {
			return n, notSample(s.CPU, s.Type, s.Lost)
		}
		*total += cref.ReadAll(s.Data)
	}
	return n, nil
}

// notSample is the error of a drain that read a record of type typ, not a
// sample.
func notSample(cpu int, typ perfbuf.RecordType, lost uint64) error {
	return fmt.Errorf("cpu %d: record type %v (lost %d) in a ring sized not to lose", cpu, typ, lost)
}

// readRecord reads every byte of a zero-copy record: Data, and Wrapped when
// the payload straddles the ring's end (libbpf hands its callback such a
// record copied into one buffer, so the C reference makes one call). The
// drains' functions write it out, cref.ReadAll(rec.Data) + readWrapped(rec),
// so that the read is inlined into them as the C reference's
// cref_read_all is into its callback (readRecord is too large to be
// inlined: one more call a record, which C does not make).
func readRecord(rec *perfbuf.Record) uint64 { return cref.ReadAll(rec.Data) + readWrapped(rec) }

// readWrapped reads rec.Wrapped, empty but for a payload that straddles a
// perf ring's end: out of line (readAll).
func readWrapped(rec *perfbuf.Record) uint64 {
	if len(rec.Wrapped) == 0 {
		return 0
	}
	return readAll(rec.Wrapped)
}

// readAll is cref.ReadAll out of line.
//
//go:noinline
func readAll(p []byte) uint64 { return cref.ReadAll(p) }

// ciliumPerfDrain: the peer, cilium/ebpf's perf.Reader.ReadInto into one
// reused Record, k times a round. It opens rings of its own on every CPU
// and puts them in the map; it reads only rings that epoll reported
// ready, so each wakes on its first sample (WakeupEvents 1, as on its
// users' defaults), during the untimed fill.
type ciliumPerfDrain struct {
	fillOne
	m     *ebpf.Map
	r     *perf.Reader
	rec   perf.Record
	total uint64
}

func openCiliumPerf(base fillOne, cfg DrainConfig) (drainer, error) {
	m, err := ciliumMap(base.e.Events.FileDescriptor())
	if err != nil {
		return nil, err
	}
	r, err := perf.NewReaderWithOptions(m, RingBytes(cfg.Pages), perf.ReaderOptions{WakeupEvents: 1})
	if err != nil {
		m.Close()
		return nil, fmt.Errorf("cilium/ebpf perf reader: %w", err)
	}
	return &ciliumPerfDrain{fillOne: base, m: m, r: r}, nil
}

func (d *ciliumPerfDrain) drain(k int) error {
	for i := range k {
		if err := d.r.ReadInto(&d.rec); err != nil {
			return fmt.Errorf("cilium/ebpf ReadInto after %d of %d: %w", i, k, err)
		}
		if d.rec.LostSamples != 0 {
			return fmt.Errorf("cilium/ebpf ReadInto after %d of %d: %d samples lost", i, k, d.rec.LostSamples)
		}
		d.total += cref.ReadAll(d.rec.RawSample)
	}
	return nil
}

func (d *ciliumPerfDrain) sum() uint64 { return d.total }

func (d *ciliumPerfDrain) close() {
	d.r.Close()
	d.m.Close()
}
