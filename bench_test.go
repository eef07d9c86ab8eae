// SPDX-License-Identifier: Apache-2.0

package perfbuf

// Benchmarks: every mode against libbpf's names, the raw views, the
// Reader's forms by sample size, and the cost per record against the
// number of rings ("At C's cost": any number of rings): fullest-first and ordered, ReadInto and Each, over 2 to
// 512 fake rings (no kernel), with the records spread evenly or all on one
// ring. A policy's cost per record, amortised over a round, must grow no
// faster than log(rings): a look at every ring once per round is paid for
// by the round's records, a look at every ring once per record is not.

import (
	"context"
	"encoding/binary"
	"fmt"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/perfbuf/perfbuf/internal/ring"
	"github.com/perfbuf/perfbuf/internal/ringtest"
	"golang.org/x/sys/unix"
)

const (
	// manyRingSize is each fake ring's size: 64 KiB, so that 512 of them
	// (32 MiB) can be allocated, and what a round writes (even: 10 KiB a
	// ring, 5 MiB at 512 rings) fits in the last-level cache.
	manyRingSize = 64 << 10
	// manyPerRing is the records each ring holds in an even round: the
	// same at every ring count, so that a round's records grow with it.
	manyPerRing = 128
	// manySkewed is the records of a skewed round, all on the last ring
	// (the others idle): the same total at every ring count. 40 KiB: below
	// the ordered merge's HighWater (three quarters of a ring), so that
	// rule 4 never releases.
	manySkewed = 512
	// manyPayload is each sample's payload: the key (a timestamp) at
	// offset 0, then a sequence number and filler; 80-byte records.
	manyPayload = 64
	// manyWindow is the ordered-window variant's rule 2 window, in
	// records: its keys go up by windowStep a record.
	manyWindow = 64
	// windowStep is a key step for an Order of MaxDelay an hour such that
	// rule 2's window (an hour in nanoseconds) is manyWindow steps.
	windowStep = uint64(time.Hour) / manyWindow
)

// BenchmarkReaderRings measures ns per record by ring count, for:
//
//   - fullest: the default policy; each round is published, flushed and
//     read until ErrFlushed (ReadInto) or until Each returns it.
//   - ordered: Options.Order, key at offset 0, MaxDelay an hour, read as
//     fullest is: rule 1 releases while every ring has a front (even), the
//     Flush (rule 5) when the others are idle (skewed).
//   - ordered-window: the same with keys windowStep apart and no Flush: a
//     deadline in the past ends each read once it would wait. Idle rings
//     hold every record back until the look-ahead has seen a key 64
//     records larger (rule 2); what is held at the end of a round goes in
//     the next one.
//
// even: manyPerRing records on each ring, keys going round the rings one
// record at a time as timestamps would. skewed: manySkewed records on the
// last ring, the others idle. ns/record is the drain's time (the fill is
// untimed) over the records delivered.
func BenchmarkReaderRings(b *testing.B) {
	for _, pol := range []string{"fullest", "ordered", "ordered-window"} {
		for _, form := range []string{"ReadInto", "Each"} {
			for _, dist := range []string{"even", "skewed"} {
				for _, n := range []int{2, 8, 32, 128, 512} {
					name := fmt.Sprintf("%s/%s/%s/rings=%d", pol, form, dist, n)
					b.Run(name, func(b *testing.B) { benchRings(b, pol, form, dist, n) })
				}
			}
		}
	}
}

func benchRings(b *testing.B, pol, form, dist string, n int) {
	f := newFakeRings(b, n, manyRingSize)
	var opts ReaderOptions
	switch pol {
	case "fullest":
		opts.MaxLatency = -1
	case "ordered":
		opts.Order = &Order{MaxDelay: time.Hour}
	case "ordered-window":
		opts.Order = &Order{MaxDelay: time.Hour}
	}
	r := f.reader(b, opts)
	flush := pol != "ordered-window"
	if !flush {
		r.SetDeadline(time.Now().Add(-time.Hour)) // read what is released, then return
	}

	rings := roundRings(dist, n)
	rec := ringtest.PerfSample(payload(0, 0, manyPayload))
	step := uint64(1)
	if !flush {
		step = windowStep
	}

	delivered := 0
	key := uint64(0)
	b.ReportAllocs()
	b.ResetTimer()
	for delivered < b.N {
		b.StopTimer()
		for _, i := range rings {
			key += step // timestamps: increasing across the rings
			binary.NativeEndian.PutUint64(rec[ring.PerfSampleDataOff:], key)
			if !f.rings[i].Write(rec) {
				b.Fatalf("ring %d full", i)
			}
		}
		for _, ring := range f.rings {
			ring.Publish()
		}
		if flush {
			r.Flush()
		}
		b.StartTimer()
		n := drainRound(r, form)
		delivered += n
		if flush && n != len(rings) {
			b.Fatalf("delivered %d records of %d", n, len(rings))
		}
	}
	b.StopTimer()
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(delivered), "ns/record")
}

// roundRings returns the rings of a round's records, in the order they are
// written: even or skewed (see BenchmarkReaderRings).
func roundRings(dist string, n int) []int {
	var rings []int
	if dist == "even" {
		for j := 0; j < manyPerRing; j++ {
			for i := 0; i < n; i++ {
				rings = append(rings, i)
			}
		}
	} else {
		for j := 0; j < manySkewed; j++ {
			rings = append(rings, n-1)
		}
	}
	return rings
}

// BenchmarkReaderRingBufs measures the ordered Reader over fake BPF ring
// buffers of one writer each (the window: policy.NewWindow), ns per record
// by ring count, rounds as BenchmarkReaderRings' ordered ReadInto and Each
// (a Flush each round), even and skewed. The records are copied into the
// window and out again: a copy more than over perf rings.
func BenchmarkReaderRingBufs(b *testing.B) {
	for _, form := range []string{"ReadInto", "Each"} {
		for _, dist := range []string{"even", "skewed"} {
			for _, n := range []int{2, 8, 32, 128, 512} {
				name := fmt.Sprintf("ordered/%s/%s/rings=%d", form, dist, n)
				b.Run(name, func(b *testing.B) { benchRingBufs(b, form, dist, n) })
			}
		}
	}
}

func benchRingBufs(b *testing.B, form, dist string, n int) {
	f := newFakeBPFRings(b, n, manyRingSize)
	one := make([]bool, n)
	for i := range one {
		one[i] = true
	}
	r := f.ordered(b, Order{MaxDelay: time.Hour}, one...)
	rings := roundRings(dist, n)
	p := payload(0, 0, manyPayload)
	delivered := 0
	key := uint64(0)
	b.ReportAllocs()
	b.ResetTimer()
	for delivered < b.N {
		b.StopTimer()
		for _, i := range rings {
			key++
			binary.NativeEndian.PutUint64(p, key)
			f.rings[i].Output(b, p)
		}
		r.Flush()
		b.StartTimer()
		n := drainRound(r, form)
		delivered += n
		if n != len(rings) {
			b.Fatalf("delivered %d records of %d", n, len(rings))
		}
	}
	b.StopTimer()
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(delivered), "ns/record")
}

// drainRound reads a round with form, ReadInto, ReadBatch (64) or Each, until the read
// returns (ErrFlushed, or the deadline), and returns the records delivered.
func drainRound(r *Reader, form string) int { return drainWriting(r, form, 0, nil) }

// drainWriting is drainRound with a producer in the loop: after each of the
// first more records read, write writes one.
func drainWriting(r *Reader, form string, more int, write func()) int {
	n := 0
	switch form {
	case "ReadInto":
		var s Sample
		for r.ReadInto(&s) == nil {
			if n++; n <= more {
				write()
			}
		}
	case "ReadBatch":
		batch := make([]Sample, 64)
		for {
			k, err := r.ReadBatch(batch)
			if err != nil {
				break
			}
			for range k {
				if n++; n <= more {
					write()
				}
			}
		}
	case "Each":
		r.Each(context.Background(), func(*Record) error {
			if n++; n <= more {
				write()
			}
			return nil
		})
	}
	return n
}

// BenchmarkReaderFlood measures a Reader's cost per record under a flood,
// ordered beside fullest-first ("plain"), in each copying form and Each,
// as the CPU time of the reading
// thread (cpu-ns/record; a host busy with other work moves it less than
// ns/record). Each round writes 4,096 records of 64 bytes, then reads
// what may go (a deadline in the past); what an ordered read holds back
// goes in a later round.
//
//   - perf: two perf rings, one writer each, keys going round the rings one
//     record at a time as two CPUs' timestamps do: rule 1 releases, record
//     by record (the in-place merge, ordered.go).
//   - ringbuf: one ring buffer shared by CPUs, keys in the order of the
//     records, MaxDelay a nanosecond: rule 3 releases every copy once taken
//     in (the window, window.go).
//     The ring, 4 MiB, is never more than an eighth full.
//   - ringbuf, plain-behind and ordered-behind: a producer in the loop,
//     a record written for each of the round's first 4,096 read, on a ring
//     of 1 MiB. The writes' cost is in the figure, alike for both. The
//     ordered Reader finds the ring past an eighth at an intake while it
//     delivers: the window's hot ring, read in place (rule 4).
//   - ringbuf, plain-full and ordered-full: each round fills a ring of
//     1 MiB to seven eighths, then reads it: the ordered Reader finds it
//     past three quarters after a wait and reads it hot, with no writer
//     in the figure.
func BenchmarkReaderFlood(b *testing.B) {
	for _, kind := range []string{"perf", "ringbuf"} {
		for _, pol := range []string{"plain", "ordered", "plain-behind", "ordered-behind", "plain-full", "ordered-full"} {
			if strings.Contains(pol, "-") && kind != "ringbuf" {
				continue
			}
			for _, form := range []string{"ReadInto", "ReadBatch", "Each"} {
				b.Run(kind+"/"+pol+"/"+form, func(b *testing.B) { benchFlood(b, kind, pol, form) })
			}
		}
	}
}

func benchFlood(b *testing.B, kind, pol, form string) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	perRound := 4096 // 320 KiB of 80-byte records
	if strings.HasSuffix(pol, "-full") {
		perRound = (1 << 20) / 8 * 7 / 80
	}
	var (
		r     *Reader
		write func(key uint64)
	)
	p := payload(0, 0, manyPayload)
	if kind == "perf" {
		f := newFakeRings(b, 2, 1<<20)
		var opts ReaderOptions
		if pol == "ordered" {
			opts.Order = &Order{MaxDelay: time.Hour}
		}
		r = f.reader(b, opts)
		rec := ringtest.PerfSample(p)
		write = func(key uint64) {
			binary.NativeEndian.PutUint64(rec[ring.PerfSampleDataOff:], key)
			if w := f.rings[key%2]; !w.Write(rec) {
				b.Fatal("ring full")
			} else if key%uint64(perRound) == 0 {
				f.rings[0].Publish()
				f.rings[1].Publish()
			}
		}
	} else {
		size := 4 << 20
		if strings.Contains(pol, "-") {
			size = 1 << 20
		}
		f := newFakeBPFRings(b, 1, size)
		if strings.HasPrefix(pol, "ordered") {
			r = f.ordered(b, Order{MaxDelay: time.Nanosecond}, false)
		} else {
			r = f.reader(b, ReaderOptions{})
		}
		write = func(key uint64) {
			binary.NativeEndian.PutUint64(p, key)
			// (Not Output: its t.Helper walks the stack, which cost more
			// than the read in the behind rows.)
			pos, ok := f.rings[0].Reserve(len(p))
			if !ok {
				b.Fatal("ring full")
			}
			f.rings[0].Write(pos, p)
			f.rings[0].Commit(pos, false)
		}
	}
	key := uint64(0)
	delivered := 0
	var cpu time.Duration
	b.ReportAllocs()
	b.ResetTimer()
	for delivered < b.N {
		b.StopTimer()
		for range perRound {
			key++
			write(key)
		}
		r.SetDeadline(time.Unix(1, 0))
		b.StartTimer()
		more := 0
		if strings.HasSuffix(pol, "-behind") {
			more = perRound
		}
		c0 := threadCPU()
		n := drainWriting(r, form, more, func() { key++; write(key) })
		cpu += threadCPU() - c0
		b.StopTimer()
		delivered += n
		if n == 0 {
			b.Fatal("delivered nothing")
		}
		b.StartTimer()
	}
	b.StopTimer()
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(delivered), "ns/record")
	b.ReportMetric(float64(cpu.Nanoseconds())/float64(delivered), "cpu-ns/record")
}

// threadCPU returns the calling thread's CPU time.
func threadCPU() time.Duration {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_THREAD_CPUTIME_ID, &ts); err != nil {
		panic(err)
	}
	return time.Duration(ts.Nano())
}

// Benchmarks of PerfBuffer's callback mode over a fake ring (no kernel).

// BenchmarkPerfBufferConsume measures callback mode's cost per sample: a
// Consume that hands every sample of a full 256 KiB ring to a SampleFunc
// that reads it, at four payload sizes (the ring of BenchmarkRawDrain).
func BenchmarkPerfBufferConsume(b *testing.B) {
	for _, payload := range []int{16, 64, 256, 1024} {
		b.Run(strconv.Itoa(payload), func(b *testing.B) {
			ring, perLap := benchRing(b, payload)
			f := newFakeRings(b, 1, 8)
			f.rings[0] = ring
			var sum uint64
			pb := f.perfBuffer(b, func(_ int, data []byte) { sum += ringtest.Sum(data) }, nil)
			size := uint64(len(ring.Data))
			samples := 0
			var elapsed time.Duration
			b.ReportAllocs()
			b.ResetTimer()
			for samples < b.N {
				// The next lap, the same full ring (see benchDrain).
				atomic.StoreUint64(&ring.Page.Data_head, atomic.LoadUint64(&ring.Page.Data_tail)+size)
				start := time.Now()
				n, err := pb.Consume()
				elapsed += time.Since(start)
				if n != perLap || err != nil {
					b.Fatalf("Consume = %d, %v; want %d samples", n, err, perLap)
				}
				samples += n
			}
			b.StopTimer()
			ringtest.Sink += sum
			st := pb.Stats().Rings[0]
			b.ReportMetric(float64(elapsed.Nanoseconds())/float64(samples), "ns/sample")
			b.ReportMetric(float64(st.Bytes)/elapsed.Seconds()/1e6, "MB/s")
		})
	}
}

// benchRing fills a 256 KiB ring completely (head = tail + size) with samples of the given
// payload size, plus one record of another type that pads the ring to exactly its size.
// Every lap of the ring then holds the same records at the same offsets, so the benchmark
// hands the reader a full ring again by moving data_head one ring size on.
func benchRing(b *testing.B, payload int) (*ringtest.Perf, int) {
	const size = 256 << 10
	f := ringtest.NewPerf(size)
	rec := ringtest.PerfSample(make([]byte, payload))
	for i := range rec[12:] {
		rec[12+i] = byte(i)
	}
	n := 0
	for f.Head+uint64(len(rec)) <= size-8 {
		f.Put(rec)
		n++
	}
	if pad := size - f.Head; pad > 0 {
		f.Put(ringtest.PerfRecord(unix.PERF_RECORD_THROTTLE, uint16(pad), make([]byte, pad-8)))
	}
	if f.Head != size {
		b.Fatalf("ring filled to %d", f.Head)
	}
	return f, n
}

func BenchmarkRawDrain(b *testing.B) {
	for _, mode := range []string{"zerocopy", "copy"} {
		for _, payload := range []int{16, 64, 256, 1024} {
			b.Run(mode+"/"+strconv.Itoa(payload), func(b *testing.B) {
				benchDrain(b, mode == "copy", payload)
			})
		}
	}
}

func benchDrain(b *testing.B, copying bool, payload int) {
	f, perLap := benchRing(b, payload)
	rb := perfReader(b, f)
	var sum uint64
	var buf []byte
	var fn func(rec *Record) error
	if copying {
		buf = make([]byte, 0, 2048)
		fn = func(rec *Record) error {
			buf = rec.AppendTo(buf[:0])
			sum += ringtest.Sum(buf)
			return nil
		}
	} else {
		fn = func(rec *Record) error {
			sum += ringtest.Sum(rec.Data)
			if len(rec.Wrapped) > 0 {
				sum += ringtest.Sum(rec.Wrapped)
			}
			return nil
		}
	}
	size := uint64(rb.Stats().Size)
	samples := 0
	var elapsed time.Duration
	b.ReportAllocs()
	b.ResetTimer()
	for samples < b.N {
		// Hand the reader the next lap, the same full ring: a release store of data_head as
		// the kernel's perf_output_put_handle does, for the acquire load in Begin.
		atomic.StoreUint64(&f.Page.Data_head, atomic.LoadUint64(&f.Page.Data_tail)+size)
		start := time.Now()
		n, err := rb.Drain(fn)
		elapsed += time.Since(start)
		if err != nil || n != perLap {
			b.Fatalf("Drain = %d, %v; want %d samples (the pad record is skipped)", n, err, perLap)
		}
		samples += perLap
	}
	b.StopTimer()
	ringtest.Sink += sum
	st := rb.Stats()
	if st.Samples != uint64(samples) {
		b.Fatalf("stats: %d samples, want %d", st.Samples, samples)
	}
	b.ReportMetric(float64(elapsed.Nanoseconds())/float64(samples), "ns/sample")
	// MB/s of payload as delivered, the kernel's padding included (68 bytes for a 64-byte sample).
	b.ReportMetric(float64(st.Bytes)/elapsed.Seconds()/1e6, "MB/s")
}

// Benchmarks of the Reader over fake rings (no kernel): fullest-first and
// ordered.

// readRound publishes what the fake rings hold and, with the timer running,
// reads until a Flush ends the round: with ReadInto into s, ReadBatch, or
// with Each or Batches and a loop that does nothing (Each) or reads every
// byte of each sample (EachSum, BatchesSum). The Flush is called once
// flushAt records were read (before the timer starts if flushAt is 0): an
// ordered Reader reads the records that its release rule lets go as it
// would without a Flush, whose path checks the flush's bounds a record.
func readRound(b *testing.B, f *fakeRings, r *Reader, mode string, s *Sample, flushAt int) {
	for _, ring := range f.rings {
		ring.Publish()
	}
	if flushAt == 0 {
		r.Flush()
	}
	count := flushCounter{r: r, at: flushAt}
	b.StartTimer()
	switch mode {
	case "ReadInto":
		for r.ReadInto(s) == nil {
			count.add(1)
		}
	case "ReadBatch":
		for {
			k, err := r.ReadBatch(batch[:])
			if err != nil {
				break
			}
			count.add(k)
		}
	case "Each":
		r.Each(context.Background(), func(*Record) error {
			count.add(1)
			return nil
		})
	case "EachSum":
		r.Each(context.Background(), func(rec *Record) error {
			if rec.Type != RecordSample {
				return errStop
			}
			ringtest.Sink += ringtest.Sum(rec.Data)
			if len(rec.Wrapped) > 0 {
				ringtest.Sink += ringtest.Sum(rec.Wrapped)
			}
			count.add(1)
			return nil
		})
	case "BatchesSum":
		for b, err := range r.Batches(context.Background()) {
			if err != nil {
				break
			}
			for b.Next() {
				rec := b.Record()
				if rec.Type != RecordSample {
					return
				}
				ringtest.Sink += ringtest.Sum(rec.Data)
				if len(rec.Wrapped) > 0 {
					ringtest.Sink += ringtest.Sum(rec.Wrapped)
				}
				count.add(1)
			}
		}
	}
}

// flushCounter counts the records a round read and flushes its reader once
// they reach at (0: never). A method of a concrete type, it is inlined into
// every form's loop, Each's functions included, where a closure captured by
// them was a call a record that the Batches loop inlined.
type flushCounter struct {
	r     *Reader
	n, at int
}

func (c *flushCounter) add(k int) {
	if c.n += k; c.n == c.at {
		c.r.Flush()
	}
}

// batch is ReadBatch's Samples in the benchmarks: their Data grows once.
var batch [64]Sample

// benchRingSize is the fake rings' size in the reader benchmarks: perfbuf's
// default (64 pages), so that two rings fit in a core's L2 cache as the
// real ones do.
const benchRingSize = 64 << 12

// BenchmarkReaderReadInto measures a Reader's cost per record over two fake
// rings already filled (no kernel): ReadInto, Each and EachSum (see
// readRound), at two sizes. The ordered Reader's benchmark uses the same
// rings and records.
func BenchmarkReaderReadInto(b *testing.B) {
	for _, mode := range []string{"ReadInto", "ReadBatch", "Each", "EachSum", "BatchesSum"} {
		for _, size := range []int{16, 64, 1024} {
			b.Run(fmt.Sprintf("%s/size=%d", mode, size), func(b *testing.B) {
				f := newFakeRings(b, 2, benchRingSize)
				r := f.reader(b, ReaderOptions{MaxLatency: -1})
				rec := ringtest.PerfSample(payload(0, 0, size))
				per := (benchRingSize - 4096) / len(rec)
				var s Sample
				b.ReportAllocs()
				b.ResetTimer()
				for done := 0; done < b.N; done += 2 * per {
					b.StopTimer()
					for i := 0; i < 2*per; i++ {
						f.rings[i%2].Write(rec)
					}
					readRound(b, f, r, mode, &s, 0)
				}
				b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N), "ns/record")
			})
		}
	}
}

// BenchmarkOrderedReadInto measures the ordered Reader's cost per record over
// two filled fake rings whose keys interleave, so that rule 1 releases each
// (the Flush of each round only releases its last record): ReadInto,
// ReadBatch, Each, EachSum and BatchesSum, at two sizes, with the rings taking turns every
// record (run=1, the merge's worst case) or every 32 (as the real drain benchmark fills them).
func BenchmarkOrderedReadInto(b *testing.B) {
	for _, mode := range []string{"ReadInto", "ReadBatch", "Each", "EachSum", "BatchesSum"} {
		for _, size := range []int{16, 64, 1024} {
			for _, run := range []int{1, 32} {
				b.Run(fmt.Sprintf("%s/size=%d/run=%d", mode, size, run), func(b *testing.B) {
					benchOrdered(b, mode, size, run)
				})
			}
		}
	}
}

func benchOrdered(b *testing.B, mode string, size, run int) {
	f := newFakeRings(b, 2, benchRingSize)
	o := f.ordered(b, Order{MaxDelay: time.Hour})
	// Whole pairs of runs that fit the rings, so that nothing is lost. The
	// last run waits for the other ring, which shows no larger key: the
	// round's Flush releases it.
	per := (benchRingSize - 4096) / len(ringtest.PerfSample(payload(0, 0, size)))
	recs := make([][]byte, per/run*2*run)
	for i := range recs {
		recs[i] = ringtest.PerfSample(payload(0, uint64(i), size))
	}
	key := uint64(0)
	var s Sample
	b.ReportAllocs()
	b.ResetTimer()
	for done := 0; done < b.N; done += len(recs) {
		b.StopTimer()
		for i, rec := range recs {
			key++
			binary.NativeEndian.PutUint64(rec[ring.PerfSampleDataOff:], key)
			if !f.rings[i/run%2].Write(rec) {
				b.Fatalf("record %d of %d: no room", i, len(recs))
			}
		}
		readRound(b, f, o, mode, &s, len(recs)-run)
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N), "ns/record")
}

// BenchmarkOrderedManyRings measures the merge's cost per record as the
// number of rings grows (a machine's CPU count): with Each over rings of
// 64 KiB, 64-byte samples whose keys go round the busy rings one record at
// a time, so that every record is a new pick. With every ring busy, rule 1
// releases each record; with two busy, the idle rings hold it back until
// rule 2 releases it, the look-ahead having found a key 64 records larger
// (keys windowStep apart).
func BenchmarkOrderedManyRings(b *testing.B) {
	for _, n := range []int{2, 8, 64} {
		for _, busy := range slices.Compact([]int{2, n}) {
			b.Run(fmt.Sprintf("rings=%d/busy=%d", n, busy), func(b *testing.B) {
				const size = 16 << 12
				f := newFakeRings(b, n, size)
				o := f.ordered(b, Order{MaxDelay: time.Hour})
				rec := ringtest.PerfSample(payload(0, 0, 64))
				per := (size - 4096) / len(rec) * busy
				key := uint64(0)
				var s Sample
				b.ReportAllocs()
				b.ResetTimer()
				for done := 0; done < b.N; done += per {
					b.StopTimer()
					for i := 0; i < per; i++ {
						key += windowStep
						binary.NativeEndian.PutUint64(rec[ring.PerfSampleDataOff:], key)
						f.rings[i%busy].Write(rec)
					}
					readRound(b, f, o, "Each", &s, 0)
				}
				b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N), "ns/record")
			})
		}
	}
}
