// SPDX-License-Identifier: Apache-2.0

// Privileged selftests of the Reader, fullest-first and ordered, over real
// rings: readers.bpf.c emits on a chosen CPU through BPF_PROG_TEST_RUN.
package readers

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/perfbuf/perfbuf"
	"github.com/perfbuf/perfbuf/selftest/internal/bpftest"
)

const obj = "bpf/readers.bpf.o"

// newReader opens a Reader on f's map, closed at cleanup if not before. Its
// deadline, a minute away, bounds every read of the tests.
func newReader(t *testing.T, f *bpftest.Fixture, opts perfbuf.ReaderOptions) *perfbuf.Reader {
	t.Helper()
	r, err := perfbuf.NewReader(f.Events, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	r.SetDeadline(time.Now().Add(time.Minute))
	return r
}

// readAll reads into c until a read fails; it returns that error.
func readAll(r *perfbuf.Reader, c *bpftest.Collector) error {
	var s perfbuf.Sample
	for {
		if err := r.ReadInto(&s); err != nil {
			return err
		}
		switch s.Type {
		case perfbuf.RecordSample:
			c.Sample(s.CPU, s.Data)
		case perfbuf.RecordLost:
			c.LostFn(s.CPU, s.Lost)
		}
	}
}

// flushAndRead ends a load: one small sample per CPU (so the kernel writes
// the LOST record it holds back), then Flush and read until ErrFlushed.
func flushAndRead(t *testing.T, f *bpftest.Fixture, r *perfbuf.Reader, c *bpftest.Collector) {
	t.Helper()
	// Make room first: the flush sample must fit.
	r.Flush()
	if err := readAll(r, c); !errors.Is(err, perfbuf.ErrFlushed) {
		t.Fatalf("read: %v", err)
	}
	for _, cpu := range f.CPUs {
		f.Emit(t, cpu, 1, 8, 0)
	}
	r.Flush()
	if err := readAll(r, c); !errors.Is(err, perfbuf.ErrFlushed) {
		t.Fatalf("read: %v", err)
	}
}

// A Reader over overloaded rings accounts for every sample.
func TestReaderAccounting(t *testing.T) {
	f := bpftest.Setup(t, obj)
	r := newReader(t, f, perfbuf.ReaderOptions{Options: perfbuf.Options{RingBytes: 1 << 12}})
	c := bpftest.NewCollector()
	for round := 0; round < 10; round++ {
		for _, cpu := range f.CPUs {
			f.Emit(t, cpu, 200, 24, 100)
		}
		r.Flush()
		if err := readAll(r, c); !errors.Is(err, perfbuf.ErrFlushed) {
			t.Fatal(err)
		}
	}
	flushAndRead(t, f, r, c)
	c.CheckAccounting(t, f)
	stats := r.Stats()
	c.CheckStats(t, stats.Rings)
	for i, st := range stats.Rings {
		if st.Lost == 0 || st.Left != 0 || st.Corrupt != 0 {
			t.Errorf("ring %d: stats %+v; want samples lost, none left or corrupt", i, st)
		}
	}
	var samples, lost uint64
	for _, cpu := range f.CPUs {
		samples, lost = samples+uint64(c.Samples[cpu]), lost+c.Lost[cpu]
	}
	if stats.Samples != samples || stats.Lost < lost || stats.Left != 0 || stats.Corrupt != 0 {
		t.Errorf("sums %+v; delivered %d samples, %d lost", stats, samples, lost)
	}
}

// Close counts what is left in the rings as Discarded, in bytes: records
// the Reader has not delivered, also those it parsed ahead (the ordered one
// does), and nothing it delivered: with ReadInto, or with Each, whose
// function's error stops it after the record it failed on, which counts as
// delivered.
func TestReaderCloseDiscards(t *testing.T) {
	f := bpftest.Setup(t, obj)
	const n, read, size = 20, 5, 40 // 56-byte records
	cpu := f.CPUs[0]
	errEnough := errors.New("enough")
	for _, ordered := range []bool{false, true} {
		for _, each := range []bool{false, true} {
			name := fmt.Sprintf("ordered %v, each %v", ordered, each)
			opts := perfbuf.ReaderOptions{Options: perfbuf.Options{RingBytes: 1 << 12}}
			if ordered {
				opts.Order = &perfbuf.Order{KeyOffset: 8, MaxDelay: time.Millisecond}
			}
			r := newReader(t, f, opts)
			f.Emit(t, cpu, n, size, 0)
			c := bpftest.NewCollector()
			r.SetDeadline(time.Now().Add(5 * time.Second))
			if each {
				got := 0
				err := r.Each(context.Background(), func(rec *perfbuf.Record) error {
					c.Sample(rec.CPU, rec.AppendTo(nil))
					if got++; got == read {
						return errEnough
					}
					return nil
				})
				if !errors.Is(err, errEnough) {
					t.Fatalf("%s: Each: %v", name, err)
				}
			} else {
				var s perfbuf.Sample
				for range read {
					if err := r.ReadInto(&s); err != nil {
						t.Fatalf("%s: %v", name, err)
					}
					c.Sample(s.CPU, s.Data)
				}
			}
			r.Close()
			c.Check(t)
			stats := r.Stats()
			c.CheckStats(t, stats.Rings)
			if stats.Left != n-read {
				t.Errorf("%s: %d samples left at Close in all, want %d", name, stats.Left, n-read)
			}
			for _, st := range stats.Rings {
				var want uint64
				if st.CPU == cpu {
					want = n - read
				}
				if st.Left != want {
					t.Errorf("%s: cpu %d: %d samples left at Close, want %d",
						name, st.CPU, st.Left, want)
				}
			}
		}
	}
}

// With WakeupEvents 64, ten samples raise no wakeup (libbpf#438): without
// MaxLatency the Reader sees them only when its deadline ends the wait;
// with it, they come within MaxLatency.
func TestReaderMaxLatencyRealWakeups(t *testing.T) {
	f := bpftest.Setup(t, obj)
	for _, latency := range []time.Duration{-1, 10 * time.Millisecond} {
		r := newReader(t, f, perfbuf.ReaderOptions{Options: perfbuf.Options{RingBytes: bpftest.RingBytes(4), WakeupEvents: 64}, MaxLatency: latency})
		got := make(chan error, 1)
		go func() {
			var s perfbuf.Sample
			got <- r.ReadInto(&s)
		}()
		// The read waits first: one that looked after the outputs would
		// find them without a wakeup.
		if !bpftest.Parked("perfbuf.(*Reader).ReadInto", 30*time.Second) {
			t.Fatal("the read never waited")
		}
		f.Emit(t, f.CPUs[0], 10, 32, 0)
		// Without MaxLatency nothing may end the wait: a second is only
		// how long it is watched. With it, 30 s is a hang, not a bound.
		watch := 30 * time.Second
		if latency < 0 {
			watch = time.Second
		}
		select {
		case err := <-got:
			if latency < 0 {
				t.Errorf("without MaxLatency, a read returned (%v) with no wakeup", err)
			} else if err != nil {
				t.Errorf("MaxLatency %v: %v", latency, err)
			}
		case <-time.After(watch):
			if latency > 0 {
				t.Errorf("MaxLatency %v: nothing after %v", latency, watch)
			}
		}
		r.Close()
		if latency < 0 {
			if err := <-got; !errors.Is(err, os.ErrClosed) {
				t.Errorf("blocked read after Close: %v", err)
			}
		}
	}
}

// Within its latency budget (here 50 ms) a Reader of a perf event array is
// not woken by the kernel below half a ring (the events' watermark): the
// samples come by its timer, and no parked wait ends for a ring's wakeup,
// whenever they come. Without a budget (MaxLatency -1) a sample that comes
// while the reader waits wakes it: the samples come 20 ms apart, so that
// it waits for most of them.
func TestReaderBudgetRealWakeups(t *testing.T) {
	f := bpftest.Setup(t, obj)
	const n = 20
	for _, latency := range []time.Duration{50 * time.Millisecond, -1} {
		r := newReader(t, f, perfbuf.ReaderOptions{MaxLatency: latency})
		r.SetDeadline(time.Now().Add(30 * time.Second))
		read := make(chan error, 1)
		go func() {
			var s perfbuf.Sample
			for range n {
				if err := r.ReadInto(&s); err != nil {
					read <- err
					return
				}
			}
			read <- nil
		}()
		for range n {
			time.Sleep(20 * time.Millisecond)
			f.Emit(t, f.CPUs[0], 1, 32, 0)
		}
		if err := <-read; err != nil {
			t.Fatalf("MaxLatency %v: %v", latency, err)
		}
		woken := r.Stats().Wakeups
		r.Close()
		t.Logf("MaxLatency %v: %d samples, %d waits ended by a ring's wakeup", latency, n, woken)
		switch {
		case latency > 0 && woken != 0:
			t.Errorf("MaxLatency %v: %d wakeups below the watermark, want 0", latency, woken)
		case latency < 0 && woken == 0:
			t.Errorf("no budget: no wakeup for %d samples 20 ms apart", n)
		}
	}
}

// skewed runs one CPU emitting far more than each of the others into small
// rings while a Reader drains concurrently, and returns the samples lost per
// CPU.
func skewed(t *testing.T, f *bpftest.Fixture) map[int]uint64 {
	t.Helper()
	r := newReader(t, f, perfbuf.ReaderOptions{Options: perfbuf.Options{RingBytes: bpftest.RingBytes(2), WakeupEvents: 8}})
	defer r.Close() // the next run reads the map: one reader at a time
	before := f.Stats(t)
	c := bpftest.NewCollector()
	done := make(chan error, 1)
	go func() { done <- readAll(r, c) }()
	// One producer: a burst of 64 on the first CPU, 4 on each other one,
	// round after round. (A producer per CPU would keep every core busy in
	// test runs and starve the reader of any core.)
	for i := 0; i < skewRounds; i++ {
		for k, cpu := range f.CPUs {
			burst := uint64(skewSmall)
			if k == 0 {
				burst = skewBig
			}
			f.Emit(t, cpu, burst*uint64(bpftest.Scale()), 64, 0) // as many more on larger pages
		}
	}
	r.Flush()
	if err := <-done; !errors.Is(err, perfbuf.ErrFlushed) {
		t.Fatal(err)
	}
	flushAndRead(t, f, r, c)
	c.Check(t)
	after := f.Stats(t)
	lost := map[int]uint64{}
	for _, cpu := range f.CPUs {
		emitted, failed := after[cpu].Emitted-before[cpu].Emitted, after[cpu].Failed-before[cpu].Failed
		if uint64(c.Samples[cpu]) != emitted || c.Lost[cpu] != failed {
			t.Errorf("cpu %d: received %d lost %d; kernel emitted %d failed %d", cpu, c.Samples[cpu], c.Lost[cpu], emitted, failed)
		}
		lost[cpu] = c.Lost[cpu]
	}
	return lost
}

const (
	skewRounds = 400
	skewBig    = 64 // samples a round on the first CPU
	skewSmall  = 4  // on each other CPU
)

// The fullest-first Reader under a skewed load, on every CPU's ring: it
// must account exactly; the losses are reported, not asserted: they depend
// on scheduling.
func TestFullestFirstSkewed(t *testing.T) {
	f := bpftest.Setup(t, obj)
	if len(f.CPUs) < 2 {
		t.Skip("needs two CPUs: a busy ring and a quiet one")
	}
	const runs = 3
	lost := map[int]uint64{}
	for i := 0; i < runs; i++ {
		for cpu, n := range skewed(t, f) {
			lost[cpu] += n
		}
	}
	var sum uint64
	for _, cpu := range f.CPUs {
		sum += lost[cpu]
	}
	t.Logf("%d rings, lost over %d runs of %d samples on cpu %d and %d on each other: %d %v",
		len(f.CPUs), runs, skewRounds*skewBig, f.CPUs[0], skewRounds*skewSmall, sum, lost)
}

// Samples emitted concurrently on every CPU come out of the ordered Reader
// in timestamp order, each once, none lost; late ones are counted.
func TestOrderedRealTimestamps(t *testing.T) {
	f := bpftest.Setup(t, obj)
	o := newReader(t, f, perfbuf.ReaderOptions{
		Options: perfbuf.Options{
			RingBytes:    bpftest.RingBytes(256),
			WakeupEvents: 16,
		},
		Order: &perfbuf.Order{KeyOffset: 8, MaxDelay: 20 * time.Millisecond},
	})
	c := bpftest.NewCollector()
	var mu sync.Mutex
	var last uint64
	late, disorder := 0, 0
	done := make(chan error, 1)
	go func() {
		var s perfbuf.Sample
		for {
			if err := o.ReadInto(&s); err != nil {
				done <- err
				return
			}
			if s.Type != perfbuf.RecordSample {
				continue
			}
			c.Sample(s.CPU, s.Data)
			ts := binary.NativeEndian.Uint64(s.Data[8:])
			mu.Lock()
			switch {
			case s.Key != ts:
				disorder++
			case s.Late:
				late++
			case ts < last:
				disorder++
			default:
				last = ts
			}
			mu.Unlock()
		}
	}()
	var wg sync.WaitGroup
	for _, cpu := range f.CPUs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 200; i++ {
				if err := f.TryEmit(cpu, 20, 48, 0); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	o.Flush()
	if err := <-done; !errors.Is(err, perfbuf.ErrFlushed) {
		t.Fatal(err)
	}
	c.CheckAccounting(t, f)
	st := o.Stats()
	c.CheckStats(t, st.Rings)
	total := 0
	for _, n := range c.Samples {
		total += n
	}
	t.Logf("%d samples from %d CPUs in order, %d late (stats: %d)", total, len(f.CPUs), late, st.Late)
	if disorder != 0 {
		t.Errorf("%d samples out of order without the late mark", disorder)
	}
	if int(st.Late) != late || st.Lost != 0 {
		t.Errorf("stats: %d late, %d lost; saw %d late", st.Late, st.Lost, late)
	}
}
