// SPDX-License-Identifier: Apache-2.0

package perfbuf

// Tests of the Reader: its core (reads, Close, deadlines, Flush, stats,
// corruption reports) with both policies, the fullest-first policy, its
// read forms (ReadInto, ReadBatch, Consume), its commits, and the gauges
// and counts every owner reports. The ordered merge has its own file,
// ordered_test.go.

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io/fs"
	"math"
	"math/rand"
	"os"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/perfbuf/perfbuf/internal/kernel"
	"github.com/perfbuf/perfbuf/internal/owner"
	"github.com/perfbuf/perfbuf/internal/ringtest"
	"golang.org/x/sys/unix"
)

func readN(t *testing.T, r *Reader, n int) []Sample {
	t.Helper()
	var out []Sample
	for len(out) < n {
		var s Sample
		if err := r.ReadInto(&s); err != nil {
			t.Fatalf("read %d of %d: %v", len(out), n, err)
		}
		out = append(out, s)
	}
	return out
}

// readFlushed reads until ErrFlushed and returns how many records it read.
func readFlushed(t *testing.T, r *Reader) int {
	t.Helper()
	var s Sample
	for n := 0; ; n++ {
		err := r.ReadInto(&s)
		if errors.Is(err, ErrFlushed) {
			return n
		}
		if err != nil {
			t.Fatal(err)
		}
	}
}

// readUntilFlushed reads r until ErrFlushed with ReadInto or Each (mode),
// and returns the records and the errors met on the way: reads go
// on after each error but ErrFlushed, and fail the test after 10 of them.
func readUntilFlushed(t *testing.T, r *Reader, mode string) ([]Sample, []error) {
	t.Helper()
	var got []Sample
	var errs []error
	add := func(err error) bool {
		if errors.Is(err, ErrFlushed) {
			return false
		}
		if errs = append(errs, err); len(errs) > 10 {
			t.Fatalf("%s: errors %v", mode, errs)
		}
		return true
	}
	switch mode {
	case "ReadInto":
		for {
			var s Sample
			if err := r.ReadInto(&s); err != nil {
				if !add(err) {
					return got, errs
				}
				continue
			}
			got = append(got, s)
		}
	case "ReadBatch":
		batch := make([]Sample, 7)
		for {
			k, err := r.ReadBatch(batch)
			if err != nil {
				if !add(err) {
					return got, errs
				}
				continue
			}
			for _, s := range batch[:k] {
				s.Data = bytes.Clone(s.Data)
				got = append(got, s)
			}
		}
	case "Each", "Batches":
		for {
			err := eachIn(r, mode, context.Background(), func(rec *Record) error {
				got = append(got, Sample{CPU: rec.CPU, Type: rec.Type, Data: rec.AppendTo(nil), Lost: rec.Lost, Key: rec.Key, Late: rec.Late})
				return nil
			})
			if !add(err) {
				return got, errs
			}
		}
	}
	t.Fatalf("no read mode %q", mode)
	return nil, nil
}

func keyOf(s Sample) uint64 { return binary.NativeEndian.Uint64(s.Data) }

func seqOf(data []byte) uint64 { return binary.NativeEndian.Uint64(data[8:]) }

// within runs fn on another goroutine and fails the test if it has not
// returned within 5s: a deadlock fails rather than hangs the suite.
func within(t *testing.T, what string, fn func()) {
	t.Helper()
	done := make(chan struct{})
	go func() {
		defer close(done)
		fn()
	}()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatalf("%s: still blocked after 5s", what)
	}
}

// The fullest ring is drained first, whatever its index; with a budget,
// turns alternate.
func TestReaderFullestFirst(t *testing.T) {
	f := newFakeRings(t, 2, 4096)
	recSize := len(ringtest.PerfSample(payload(0, 0, 32)))
	r := f.reader(t, ReaderOptions{})
	setBudget(r, 4*recSize, 4*recSize) // four records a turn
	for _, fuller := range []int{1, 0} {
		other := 1 - fuller
		for i := 0; i < 2; i++ {
			f.emit(t, other, 0, uint64(i), 32)
		}
		for i := 0; i < 6; i++ {
			f.emit(t, fuller, 0, uint64(i), 32)
		}
		var cpus []int
		for _, s := range readN(t, r, 8) {
			cpus = append(cpus, s.CPU)
		}
		// Pass 1: the fuller ring (6 records) first, 4 of them; then the
		// other's 2. Pass 2: the fuller's last 2.
		want := []int{fuller, fuller, fuller, fuller, other, other, fuller, fuller}
		if fmt.Sprint(cpus) != fmt.Sprint(want) {
			t.Errorf("ring %d fuller: drain order %v, want %v", fuller, cpus, want)
		}
	}
	r.Flush()
	if n := readFlushed(t, r); n != 0 {
		t.Errorf("%d records after all were read", n)
	}
	st := r.Stats()
	for i, s := range st.Rings {
		if s.CPU != i || s.Samples != 8 || s.Bytes != 8*36 {
			t.Errorf("ring %d stats %+v, want 8 samples of 36 bytes", i, s)
		}
	}
	if len(st.Rings) != 2 || st.Samples != 16 || st.Bytes != 16*36 {
		t.Errorf("stats %+v, want 16 samples of 36 bytes in the sums", st)
	}
}

// ReadInto reuses the Sample: no allocation per record.
func TestReaderReadIntoAllocs(t *testing.T) {
	f := newFakeRings(t, 2, 1<<16)
	r := f.reader(t, ReaderOptions{})
	var s Sample
	seq := uint64(0)
	rec := ringtest.PerfSample(payload(0, 0, 64))
	allocs := testing.AllocsPerRun(1000, func() {
		f.rings[seq%2].MustWrite(t, rec)
		seq++
		if err := r.ReadInto(&s); err != nil {
			t.Fatal(err)
		}
	})
	if allocs != 0 {
		t.Errorf("%.1f allocations per ReadInto", allocs)
	}
}

// Close from another goroutine ends a blocked read at once; so does a
// deadline, and a read after Close fails at once.
func TestReaderCloseAndDeadline(t *testing.T) {
	f := newFakeRings(t, 2, 4096)
	r := f.reader(t, ReaderOptions{MaxLatency: -1})

	r.SetDeadline(time.Now().Add(20 * time.Millisecond))
	var s Sample
	if err := r.ReadInto(&s); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("read past the deadline: %v", err)
	}
	r.SetDeadline(time.Time{})

	done := make(chan error, 1)
	go func() { done <- r.ReadInto(&s) }()
	time.Sleep(10 * time.Millisecond) // let it block; correctness does not depend on it
	r.Close()
	select {
	case err := <-done:
		if !errors.Is(err, os.ErrClosed) {
			t.Fatalf("blocked read after Close: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("read still blocked 5s after Close")
	}
	if err := r.ReadInto(&s); !errors.Is(err, os.ErrClosed) {
		t.Errorf("read after Close: %v", err)
	}
	if err := r.Each(context.Background(), func(*Record) error { return nil }); !errors.Is(err, os.ErrClosed) {
		t.Errorf("Each after Close: %v", err)
	}
	if err := r.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	r.Flush() // does nothing once closed
	r.SetDeadline(time.Now())
}

// A read waiting for another goroutine's read in progress is blocked too:
// Close ends it at once, while the read in progress is still in its fn.
func TestReaderCloseEndsQueuedRead(t *testing.T) {
	for _, ordered := range []bool{false, true} {
		f := newFakeRings(t, 2, 4096)
		var r *Reader
		if ordered {
			r = f.ordered(t, Order{MaxDelay: time.Hour})
		} else {
			r = f.reader(t, ReaderOptions{MaxLatency: -1})
		}
		f.emit(t, 0, 1, 1, 16)
		f.emit(t, 1, 2, 2, 16)
		r.Flush()
		started, release := make(chan struct{}), make(chan struct{})
		eachDone := make(chan error, 1)
		go func() {
			calls := 0
			eachDone <- r.Each(context.Background(), func(*Record) error {
				if calls++; calls == 1 {
					close(started)
					<-release
				}
				return nil
			})
		}()
		<-started
		queued := make(chan error, 1)
		go func() { queued <- r.ReadInto(new(Sample)) }()
		time.Sleep(20 * time.Millisecond) // let it queue; correctness does not depend on it
		r.Close()
		select {
		case err := <-queued:
			if !errors.Is(err, os.ErrClosed) {
				t.Errorf("ordered %v: queued read after Close: %v", ordered, err)
			}
		case <-time.After(2 * time.Second):
			t.Errorf("ordered %v: queued read still blocked 2s after Close", ordered)
		}
		close(release)
		within(t, "Each after Close", func() {
			if err := <-eachDone; !errors.Is(err, os.ErrClosed) {
				t.Errorf("ordered %v: Each after Close: %v", ordered, err)
			}
		})
		select {
		case <-queued: // (drained if the Close above timed out)
		default:
		}
	}
}

// A record that raises no wakeup (below WakeupEvents) is still delivered,
// after MaxLatency.
func TestReaderMaxLatency(t *testing.T) {
	for _, latency := range []time.Duration{5 * time.Millisecond, -1} {
		f := newFakeRings(t, 2, 4096)
		r := f.reader(t, ReaderOptions{MaxLatency: latency})
		start := time.Now()
		r.SetDeadline(start.Add(300 * time.Millisecond))
		written := make(chan struct{})
		go func() {
			defer close(written)
			time.Sleep(20 * time.Millisecond) // let the read block first
			f.rings[1].Write(ringtest.PerfSample(payload(0, 7, 16)))
			f.rings[1].Publish() // and raise no wakeup
		}()
		var s Sample
		err := r.ReadInto(&s)
		if latency > 0 && (err != nil || s.CPU != 1 || seqOf(s.Data) != 7) {
			t.Errorf("MaxLatency %v: %v, cpu %d; want the record", latency, err, s.CPU)
		}
		// Without MaxLatency nothing looks at the ring before the
		// deadline's timeout ends the wait.
		if latency < 0 && time.Since(start) < 300*time.Millisecond {
			t.Errorf("no MaxLatency: read returned (%v) before the deadline with no wakeup", err)
		}
		<-written
	}
}

// Flush delivers what the rings hold, then ErrFlushed; Close counts what
// is left as Left.
func TestReaderFlushAndDiscard(t *testing.T) {
	f := newFakeRings(t, 2, 4096)
	r := f.reader(t, ReaderOptions{MaxLatency: -1})
	for i := 0; i < 5; i++ {
		f.emit(t, i%2, 0, uint64(i), 40)
	}
	r.Flush()
	if n := readFlushed(t, r); n != 5 {
		t.Errorf("flush delivered %d records, want 5", n)
	}
	f.emit(t, 0, 0, 9, 40)
	r.Close()
	st := r.Stats()
	if d := st.Rings[0].Left; d != 1 || st.Left != 1 {
		t.Errorf("left %d samples at Close, want 1", d)
	}
	if st.Rings[0].Samples != 3 || st.Rings[1].Samples != 2 || st.Rings[1].Left != 0 || st.Samples != 5 {
		t.Errorf("stats %+v", st)
	}
}

// Close counts as Left what was not delivered, not what was delivered
// but not yet committed: a read returns in the middle of a fullest-first
// turn, and an ordered Reader commits a ring once a sixteenth of it was
// delivered.
func TestCloseDiscardsUndelivered(t *testing.T) {
	for _, how := range []string{"fullest/ReadInto", "fullest/Each", "ordered/ReadInto", "ordered/Each"} {
		t.Run(how, func(t *testing.T) {
			policy, mode, _ := strings.Cut(how, "/")
			f := newFakeRings(t, 2, 4096)
			var r *Reader
			if policy == "fullest" {
				r = f.reader(t, ReaderOptions{MaxLatency: -1})
			} else {
				r = f.ordered(t, Order{MaxDelay: time.Hour})
			}
			for seq := uint64(0); seq < 5; seq++ {
				f.emit(t, 0, seq, seq, 40)
			}
			r.Flush()
			if mode == "ReadInto" {
				var s Sample
				if err := r.ReadInto(&s); err != nil {
					t.Fatal(err)
				}
			} else {
				stop := errors.New("one is enough")
				if err := r.Each(context.Background(), func(*Record) error { return stop }); err != stop {
					t.Fatal(err)
				}
			}
			r.Close()
			st := r.Stats().Rings[0]
			if st.Left != 4 || st.Samples != 1 {
				t.Errorf("stats %+v; want 1 sample, and the 4 records not delivered left", st)
			}
		})
	}
}

// Each stops when its context is cancelled; a ReadInto loop reads on into
// one Sample until its deadline.
func TestReaderEachAndReadInto(t *testing.T) {
	f := newFakeRings(t, 2, 4096)
	f.cpus = []int{3, 7} // buffer indexes are not CPU numbers
	r := f.reader(t, ReaderOptions{MaxLatency: -1})
	for i := 0; i < 4; i++ {
		f.emit(t, i%2, 0, uint64(i), 24)
	}
	ctx, cancel := context.WithCancel(context.Background())
	n := 0
	err := r.Each(ctx, func(rec *Record) error {
		// Sequence i went to ring i%2.
		if rec.Type != RecordSample || rec.CPU != f.cpus[seqOf(rec.Data)%2] || rec.Key != 0 || rec.Late {
			t.Errorf("record %d: %+v", n, rec)
		}
		n++
		if n == 4 {
			cancel()
		}
		return nil
	})
	if !errors.Is(err, context.Canceled) || n != 4 {
		t.Errorf("Each: %d records, %v", n, err)
	}

	for i := 0; i < 3; i++ {
		f.emit(t, 0, 0, uint64(i), 24)
	}
	r.SetDeadline(time.Now().Add(50 * time.Millisecond))
	n = 0
	var s Sample
	var err2 error
	for err2 = r.ReadInto(&s); err2 == nil; err2 = r.ReadInto(&s) {
		if seqOf(s.Data) != uint64(n) || s.CPU != 3 {
			t.Errorf("ReadInto: record %d has seq %d, cpu %d", n, seqOf(s.Data), s.CPU)
		}
		n++
	}
	if n != 3 || !errors.Is(err2, os.ErrDeadlineExceeded) {
		t.Errorf("ReadInto: %d records, last error %v", n, err2)
	}
	if st := r.Stats(); st.Rings[0].CPU != 3 || st.Rings[1].CPU != 7 || st.Samples != 7 {
		t.Errorf("stats %+v, want CPUs 3 and 7, 7 samples", st)
	}
}

// Lost records come through with their count and CPU.
func TestReaderLost(t *testing.T) {
	f := newFakeRings(t, 1, 256)
	for seq := uint64(0); seq < 10; seq++ {
		f.rings[0].Write(ringtest.PerfSample(payload(0, seq, 40)))
	}
	f.rings[0].Publish()
	r := f.reader(t, ReaderOptions{})
	var got, lost uint64
	var s Sample
	for got < 5 || lost == 0 { // 4 fit, 6 are lost, then the one written below
		if err := r.ReadInto(&s); err != nil {
			t.Fatal(err)
		}
		switch s.Type {
		case RecordSample:
			got++
		case RecordLost:
			lost += s.Lost
		}
		if got == 4 && lost == 0 {
			// Room again: the next write carries the LOST record.
			f.rings[0].MustWrite(t, ringtest.PerfSample(payload(0, 99, 8)))
		}
	}
	// Stats are published when a ring's turn ends: end it.
	r.SetDeadline(time.Now().Add(10 * time.Millisecond))
	if err := r.ReadInto(&s); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatal(err)
	}
	if st := r.Stats(); st.Rings[0].Lost != lost || lost != 6 || st.Rings[0].Samples != 5 || st.Lost != lost {
		t.Errorf("lost %d, stats %+v", lost, st)
	}
}

// Producers race the reader on every ring, waking it as the kernel does:
// every record arrives once, in order per ring, intact.
func TestReaderRace(t *testing.T) {
	const rings = 2
	n := 200000
	if testing.Short() || ringtest.RaceEnabled() {
		n = 20000
	}
	f := newFakeRings(t, rings, 1<<14)
	r := f.reader(t, ReaderOptions{MaxLatency: time.Millisecond})
	var wg sync.WaitGroup
	stop := make(chan struct{})
	for i := 0; i < rings; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			rng := rand.New(rand.NewSource(int64(i)))
			for seq := uint64(0); seq < uint64(n); {
				select {
				case <-stop:
					return
				default:
				}
				if f.rings[i].Write(ringtest.PerfSample(payload(0, seq, 16+rng.Intn(300)))) {
					seq++
					f.rings[i].Publish()
					if seq%16 == 0 {
						f.wake(i) // like WakeupEvents 16
					}
				} else {
					f.rings[i].Lost = 0 // a full ring: wait, do not lose
					f.rings[i].Publish()
					time.Sleep(10 * time.Microsecond)
				}
			}
		}(i)
	}
	next := make([]uint64, rings)
	var s Sample
	deadline := time.Now().Add(60 * time.Second)
	for total := 0; total < rings*n; total++ {
		r.SetDeadline(deadline)
		if err := r.ReadInto(&s); err != nil {
			close(stop)
			wg.Wait()
			t.Fatalf("after %d records: %v", total, err)
		}
		f.drainWake(s.CPU)
		seq := seqOf(s.Data)
		if seq != next[s.CPU] {
			t.Fatalf("ring %d: seq %d, want %d", s.CPU, seq, next[s.CPU])
		}
		for j := 16; j < len(s.Data) && j < 40; j++ {
			if s.Data[j] != byte(seq)+byte(j) && s.Data[j] != 0 {
				t.Fatalf("ring %d seq %d: byte %d corrupt", s.CPU, seq, j)
			}
		}
		next[s.CPU]++
	}
	close(stop)
	wg.Wait()
}

// Reads from several goroutines take turns: every record is delivered once,
// and Close wakes a read blocked in the wait and the reads queued behind it.
func TestReaderConcurrentReads(t *testing.T) {
	f := newFakeRings(t, 2, 1<<16)
	r := f.reader(t, ReaderOptions{MaxLatency: time.Millisecond})
	const n = 3000
	for seq := uint64(0); seq < n; seq++ {
		f.rings[seq%2].Write(ringtest.PerfSample(payload(0, seq, 24)))
	}
	f.rings[0].Publish()
	f.rings[1].Publish()
	var mu sync.Mutex
	seen := map[uint64]int{}
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	for g := 0; g < 4; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var s Sample
			for {
				if err := r.ReadInto(&s); err != nil {
					errs <- err
					return
				}
				mu.Lock()
				seen[seqOf(s.Data)]++
				done := len(seen) == n
				mu.Unlock()
				if done {
					r.Close()
				}
			}
		}()
	}
	finished := make(chan struct{})
	go func() { wg.Wait(); close(finished) }()
	select {
	case <-finished:
	case <-time.After(10 * time.Second):
		r.Close()
		t.Fatal("reads still blocked 10s on")
	}
	close(errs)
	for err := range errs {
		if !errors.Is(err, os.ErrClosed) {
			t.Errorf("read: %v", err)
		}
	}
	for seq := uint64(0); seq < n; seq++ {
		if seen[seq] != 1 {
			t.Fatalf("seq %d delivered %d times", seq, seen[seq])
		}
	}
}

// Reader.Each reports a corrupt record once, as a *CorruptError, after
// skipping past it (counted), goes on at the next call, and stops when fn
// closes the reader.
func TestReaderEachCorruptAndClose(t *testing.T) {
	f := newFakeRings(t, 1, 4096)
	r := f.reader(t, ReaderOptions{MaxLatency: -1})
	f.emit(t, 0, 0, 0, 32)                                                                     // 48 bytes
	f.rings[0].MustWrite(t, ringtest.PerfRecord(unix.PERF_RECORD_SAMPLE, 12, make([]byte, 8))) // size not a multiple of 8
	r.SetDeadline(time.Now().Add(50 * time.Millisecond))
	var seqs []uint64
	fn := func(rec *Record) error {
		seqs = append(seqs, seqOf(rec.Data))
		return nil
	}
	err := r.Each(context.Background(), fn)
	var ce *CorruptError
	if !errors.As(err, &ce) || !errors.Is(err, ErrCorrupt) || ce.CPU != 0 || ce.Pos != 48 || ce.Reason != "record size 12 not a multiple of 8" || len(seqs) != 1 {
		t.Fatalf("Each: %v, seqs %v; want the corrupt record at 48 after seq 0", err, seqs)
	}
	if st := r.Stats().Rings[0]; st.Samples != 1 || st.Corrupt != 1 {
		t.Errorf("stats %+v; want 1 sample, 1 corruption", st)
	}
	// Reported once: the next call goes on, and finds nothing.
	if err := r.Each(context.Background(), fn); !errors.Is(err, os.ErrDeadlineExceeded) || len(seqs) != 1 {
		t.Fatalf("Each after the report: %v, seqs %v", err, seqs)
	}
	f.emit(t, 0, 0, 1, 32)
	f.emit(t, 0, 0, 2, 32)
	r.SetDeadline(time.Now().Add(5 * time.Second))
	err = r.Each(context.Background(), func(rec *Record) error {
		seqs = append(seqs, seqOf(rec.Data))
		r.Close()
		return nil
	})
	if !errors.Is(err, os.ErrClosed) || fmt.Sprint(seqs) != "[0 1]" {
		t.Errorf("Each with Close from fn: %v, seqs %v", err, seqs)
	}
	if st := r.Stats(); st.Samples != 2 || st.Corrupt != 1 || st.Left != 1 || st.Rings[0].Left != 1 {
		t.Errorf("stats after Close %+v; want 2 samples, 1 corruption, 1 sample left", st)
	}
}

// A corrupt ring among good ones: every read form delivers every good
// record, reports the corruption once as a *CorruptError and goes on; the
// Stats count it (Corrupt), on its ring.
func TestReaderCorruptReportedOnce(t *testing.T) {
	for _, policy := range []string{"fullest", "ordered"} {
		for _, mode := range []string{"ReadInto", "Each", "Batches"} {
			t.Run(policy+"/"+mode, func(t *testing.T) {
				f := newFakeRings(t, 2, 4096)
				var r *Reader
				if policy == "ordered" {
					r = f.ordered(t, Order{MaxDelay: time.Hour})
				} else {
					r = f.reader(t, ReaderOptions{MaxLatency: -1})
				}
				f.emit(t, 0, 1, 0, 16) // 32 bytes each
				f.emit(t, 0, 2, 1, 16)
				f.rings[0].MustWrite(t, ringtest.PerfRecord(unix.PERF_RECORD_SAMPLE, 0, make([]byte, 8))) // at 64, 16 bytes: size 0
				for seq := uint64(2); seq < 5; seq++ {
					f.emit(t, 1, seq+1, seq, 16)
				}
				r.Flush()
				r.SetDeadline(time.Now().Add(10 * time.Second))
				got, errs := readUntilFlushed(t, r, mode)
				var seqs []uint64
				for _, s := range got {
					seqs = append(seqs, seqOf(s.Data))
				}
				slices.Sort(seqs)
				if fmt.Sprint(seqs) != "[0 1 2 3 4]" {
					t.Errorf("delivered %v, want [0 1 2 3 4]", seqs)
				}
				var ce *CorruptError
				if len(errs) != 1 || !errors.As(errs[0], &ce) || !errors.Is(errs[0], ErrCorrupt) || ce.CPU != 0 || ce.Pos != 64 || ce.Reason != "record size 0" {
					t.Fatalf("errors %v; want one *CorruptError, ring 0 at 64", errs)
				}
				st := r.Stats()
				if r := st.Rings; r[0].Samples != 2 || r[0].Corrupt != 1 || r[1].Samples != 3 || r[1].Corrupt != 0 || st.Corrupt != 1 {
					t.Errorf("stats %+v", st)
				}
				// Reading goes on with what is written after.
				f.emit(t, 0, 10, 5, 16)
				f.emit(t, 1, 11, 6, 16)
				r.Flush()
				got, errs = readUntilFlushed(t, r, mode)
				if len(got) != 2 || len(errs) != 0 {
					t.Errorf("after the report: %d records, errors %v; want 2, none", len(got), errs)
				}
				if st := r.Stats(); st.Rings[0].Samples != 3 || st.Rings[0].Corrupt != 1 || st.Samples != 7 || st.Corrupt != 1 {
					t.Errorf("stats %+v", st)
				}
			})
		}
	}
}

// Close called from an Each function or a ReadInto loop makes that call the
// last: no fn call follows, also within a fullest-first turn and an ordered
// run (RawBuffer.each stops after the record during which the owner was
// closed), and the records not delivered are counted as Left.
func TestReaderCloseFromEach(t *testing.T) {
	for _, policy := range []string{"fullest", "ordered"} {
		for _, mode := range []string{"Each", "Batches", "ReadInto"} {
			for _, closeAt := range []int{1, 3} {
				t.Run(fmt.Sprintf("%s/%s/%d", policy, mode, closeAt), func(t *testing.T) {
					f := newFakeRings(t, 2, 4096)
					var r *Reader
					if policy == "ordered" {
						r = f.ordered(t, Order{MaxDelay: time.Hour})
					} else {
						r = f.reader(t, ReaderOptions{MaxLatency: -1})
					}
					const n = 40
					for seq := uint64(0); seq < n; seq++ {
						f.emit(t, 0, 1+seq, seq, 16)
					}
					// Ring 1's front lies beyond them all: rule 1 releases
					// ring 0's records in one run.
					f.emit(t, 1, 1<<40, n, 16)
					r.SetDeadline(time.Now().Add(5 * time.Second))
					calls, after := 0, 0
					closed := false
					call := func() {
						if closed {
							after++
						}
						if calls++; calls == closeAt {
							r.Close()
							closed = true
						}
					}
					var err error
					if mode == "Each" || mode == "Batches" {
						err = r.Each(context.Background(), func(*Record) error { call(); return nil })
					} else {
						var s Sample
						for err = r.ReadInto(&s); err == nil; err = r.ReadInto(&s) {
							call()
						}
					}
					if !errors.Is(err, os.ErrClosed) || calls != closeAt || after != 0 {
						t.Errorf("%v after %d calls (%d after Close); want os.ErrClosed after %d", err, calls, after, closeAt)
					}
					st := r.Stats()
					if got := st.Rings[0].Samples + st.Rings[1].Samples; got != uint64(closeAt) || st.Samples != got {
						t.Errorf("stats count %d samples delivered, want %d: %+v", got, closeAt, st)
					}
					if d := st.Rings[0].Left + st.Rings[1].Left; d != n+1-uint64(closeAt) || st.Left != d {
						t.Errorf("left %d samples, want the %d records not delivered: %+v", d, n+1-closeAt, st)
					}
				})
			}
		}
	}
}

// Close from another goroutine ends a Reader.Each blocked on empty rings
// with os.ErrClosed. (Each used to check for Close only between records: on
// empty rings it went on waiting, and the wake that Close leaves set made
// the wait return at once, forever.)
func TestReaderEachCloseWhileBlocked(t *testing.T) {
	f := newFakeRings(t, 2, 4096)
	r := f.reader(t, ReaderOptions{MaxLatency: -1})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel() // ends the spinning Each (it does check ctx)
	done := make(chan error, 1)
	go func() {
		done <- r.Each(ctx, func(*Record) error { return nil })
	}()
	time.Sleep(20 * time.Millisecond) // let it block
	r.Close()
	select {
	case err := <-done:
		if !errors.Is(err, os.ErrClosed) {
			t.Fatalf("Each after Close: %v", err)
		}
	case <-time.After(2 * time.Second):
		t.Fatal("Reader.Each still running 2s after Close")
	}
}

// ErrFlushed comes once every record that was in the rings when Flush was
// called has been delivered, also while a producer keeps writing (one
// record per record read here). It used to come only when the rings were
// empty, so never, and the heads it waited for were taken then, not at the
// Flush.
func TestFlushEndsUnderSteadyProducer(t *testing.T) {
	for _, ordered := range []bool{false, true} {
		t.Run(fmt.Sprintf("ordered=%v", ordered), func(t *testing.T) {
			f := newFakeRings(t, 1, 1<<16)
			var r *Reader
			if ordered {
				r = f.ordered(t, Order{MaxDelay: time.Hour})
			} else {
				r = f.reader(t, ReaderOptions{MaxLatency: -1})
			}
			f.emit(t, 0, 1, 0, 16) // the only record there at Flush time
			r.Flush()
			r.SetDeadline(time.Now().Add(5 * time.Second))
			var s Sample
			for n := 0; n < 100; n++ {
				err := r.ReadInto(&s)
				if errors.Is(err, ErrFlushed) {
					return
				}
				if err != nil {
					t.Fatal(err)
				}
				f.emit(t, 0, uint64(n+2), uint64(n+1), 16) // steady producer
			}
			t.Fatalf("no ErrFlushed after 100 reads; only 1 record was in the ring at Flush")
		})
	}
}

// A ring whose data_head is invalid (here: more than the ring past the
// tail) gets a turn, so that the Reader skips it, reports it once and counts
// it, and a Flush then completes. It used to get none (nothing pending after
// Begin): the ring stayed stuck, nothing was counted, and a read during a
// Flush spun past its deadline.
func TestReaderBadHead(t *testing.T) {
	f := newFakeRings(t, 1, 1024)
	f.emit(t, 0, 0, 0, 16)
	atomic.StoreUint64(&f.rings[0].Page.Data_head, 4096) // tail 0: more than the ring
	r := f.reader(t, ReaderOptions{MaxLatency: time.Millisecond})
	r.SetDeadline(time.Now().Add(30 * time.Millisecond))
	var s Sample
	err := r.ReadInto(&s)
	var ce *CorruptError
	if !errors.As(err, &ce) || ce.Reason != "head 4096 more than the 1024-byte ring past tail 0" {
		t.Fatalf("first read: %v; want the bad head reported", err)
	}
	// The head is passed over, not taken: the sample below it is genuine.
	if st := r.Stats().Rings[0]; st.Corrupt != 1 || f.rings[0].Page.Data_tail != 0 {
		t.Errorf("invalid head taken: stats %+v, tail %d", st, f.rings[0].Page.Data_tail)
	}
	if err := r.ReadInto(&s); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Errorf("second read: %v; want the deadline (reported once, nothing new)", err)
	}

	// A Flush that took the bad head ends: nothing can be read up to it.
	r.Flush()
	r.SetDeadline(time.Now().Add(100 * time.Millisecond))
	done := make(chan error, 1)
	go func() { done <- r.ReadInto(&s) }()
	select {
	case err := <-done:
		if !errors.Is(err, ErrFlushed) {
			t.Errorf("read after Flush: %v, want ErrFlushed", err)
		}
	case <-time.After(2 * time.Second):
		r.Close() // ends the spinning read
		<-done
		t.Fatalf("ReadInto after Flush still running 2s on, 1.9s past its deadline")
	}

	// The producer's next write brings data_head back: both samples arrive.
	f.emit(t, 0, 0, 1, 16)
	r.SetDeadline(time.Now().Add(time.Second))
	for seq := uint64(0); seq < 2; seq++ {
		if err := r.ReadInto(&s); err != nil || binary.NativeEndian.Uint64(s.Data[8:]) != seq {
			t.Fatalf("read seq %d: %v, %x", seq, err, s.Data)
		}
	}
	r.SetDeadline(time.Now().Add(20 * time.Millisecond))
	if err := r.ReadInto(&s); !errors.Is(err, os.ErrDeadlineExceeded) { // ends the turn: stats published
		t.Fatalf("last read: %v", err)
	}
	if st := r.Stats().Rings[0]; st.Samples != 2 || st.Corrupt != 1 {
		t.Errorf("stats %+v", st)
	}
}

// A context cancelled as the read returns: the wake it triggers may run
// after Close has freed the waiter, so it must go through the lifetime
// (poke) and do nothing then. It used to write to the closed eventfd's
// number; the race detector sees that (make test runs with -race).
func TestEachCtxCancelRacesClose(t *testing.T) {
	if !ringtest.RaceEnabled() {
		t.Skip("shows a data race: needs -race")
	}
	for k := 0; k < 200; k++ {
		f := newFakeRings(t, 1, 4096)
		r := f.reader(t, ReaderOptions{MaxLatency: -1})
		ctx, cancel := context.WithCancel(context.Background())
		go cancel()
		_ = r.Each(ctx, func(*Record) error { return nil })
		r.Close()
	}
}

// refRecord is what the reference parser reads, as a reader delivers it.
type refRecord struct {
	typ       RecordType
	pos, next uint64
	payload   []byte
	lost      uint64
}

// recordOther marks the reference's records of other types, which no reader delivers.
const recordOther RecordType = 0xff

// refParse is ringtest.ParsePerf's reading of a perf ring, as refRecords.
func refParse(mem []byte, tail, head uint64) ([]refRecord, uint64, bool) {
	refs, at, corrupt := ringtest.ParsePerf(mem, tail, head)
	var recs []refRecord
	for _, r := range refs {
		typ := recordOther
		switch r.Type {
		case unix.PERF_RECORD_SAMPLE:
			typ = RecordSample
		case unix.PERF_RECORD_LOST:
			typ = RecordLost
		}
		recs = append(recs, refRecord{typ, r.Pos, r.Next, r.Payload, r.Lost})
	}
	return recs, at, corrupt
}

// refRings fills two rings of size bytes, starting at random positions (so
// that records wrap), with random records: samples of 0 to 300 bytes, lost
// records and records of another type. It returns them with what the
// reference parser reads from each.
func refRings(t *testing.T, rnd *rand.Rand, size int) (*fakeRings, [][]refRecord) {
	t.Helper()
	f := newFakeRings(t, 2, size)
	want := make([][]refRecord, 2)
	for i := range f.rings {
		ring := ringtest.NewPerfAt(size, uint64(rnd.Intn(size/8))*8+uint64(rnd.Intn(3))*uint64(size))
		tail := ring.Head
		for seq := 0; ; seq++ {
			var rec []byte
			switch k := rnd.Intn(10); {
			case k == 0:
				rec = ringtest.PerfLost(uint64(seq), uint64(rnd.Intn(100)+1))
			case k == 1:
				rec = ringtest.PerfRecord(unix.PERF_RECORD_THROTTLE, 16, make([]byte, 8))
			default:
				rec = ringtest.PerfSample(payload(0, uint64(seq), rnd.Intn(300)))
			}
			if !ring.Write(rec) {
				break
			}
		}
		ring.Publish()
		f.rings[i] = ring
		var corrupt bool
		want[i], _, corrupt = refParse(bytes.Clone(ring.Data), tail, ring.Head)
		if corrupt {
			t.Fatal("the reference finds a valid ring corrupt")
		}
	}
	return f, want
}

// TestReaderMatchesReference: whatever the mix of records, Reader.Each and
// ReadInto deliver from each ring exactly what the reference parser reads
// there, in order, and count it: plain samples through RawBuffer.each's
// inner loop, the others (samples that wrap, lost and other records)
// through parseRest, across the ends of budgets (each's limit), with an fn
// that stops Each now and then.
func TestReaderMatchesReference(t *testing.T) {
	errPause := errors.New("pause")
	for seed := 0; seed < 60; seed++ {
		for _, mode := range []string{"Each", "Batches", "ReadInto"} {
			rnd := rand.New(rand.NewSource(int64(seed)))
			f, ref := refRings(t, rnd, []int{512, 1024, 4096}[seed%3])
			// The readers skip records of other types.
			want := make([][]refRecord, len(ref))
			for i, recs := range ref {
				for _, w := range recs {
					if w.typ != recordOther {
						want[i] = append(want[i], w)
					}
				}
			}
			r := f.reader(t, ReaderOptions{MaxLatency: -1})
			if budget := []int{0, 1, 24, 100, 700}[seed%5]; budget > 0 {
				setBudget(r, budget, max(budget/3, 1)) // 0: the defaults
			}
			got := make([][]refRecord, 2)
			add := func(cpu int, typ RecordType, rec *Record, data []byte, lost uint64) {
				rr := refRecord{typ: typ, payload: bytes.Clone(data), lost: lost}
				if rec != nil {
					rr.pos, rr.next = rec.Pos, rec.Next
				}
				got[cpu] = append(got[cpu], rr)
			}
			r.Flush()
			var err error
			switch mode {
			case "Each", "Batches":
				pause := rnd.Intn(20) + 1
				for err == nil || err == errPause {
					n := 0
					err = eachIn(r, mode, context.Background(), func(rec *Record) error {
						if rec.Key != 0 || rec.Late {
							t.Fatalf("fullest-first record with key %d, late %v", rec.Key, rec.Late)
						}
						add(rec.CPU, rec.Type, rec, rec.AppendTo(nil), rec.Lost)
						if n++; n == pause {
							return errPause
						}
						return nil
					})
				}
			case "ReadInto":
				var s Sample
				for err = r.ReadInto(&s); err == nil; err = r.ReadInto(&s) {
					add(s.CPU, s.Type, nil, s.Data, s.Lost)
				}
			}
			if !errors.Is(err, ErrFlushed) {
				t.Fatalf("seed %d %s: %v", seed, mode, err)
			}
			st := r.Stats()
			var all Stats // the sums of the reference's counts
			for i := range want {
				if len(got[i]) != len(want[i]) {
					t.Fatalf("seed %d %s: ring %d: %d records, reference %d", seed, mode, i, len(got[i]), len(want[i]))
				}
				var samples, nbytes, lost uint64
				for j, w := range want[i] {
					g := got[i][j]
					if mode == "ReadInto" {
						g.pos, g.next = w.pos, w.next // ReadInto has no positions
					}
					if g.typ != w.typ || g.pos != w.pos || g.next != w.next || g.lost != w.lost || !slices.Equal(g.payload, w.payload) {
						t.Fatalf("seed %d %s: ring %d record %d: %+v, reference %+v", seed, mode, i, j, g, w)
					}
					if w.typ == RecordSample {
						samples++
						nbytes += uint64(len(w.payload))
					}
					lost += w.lost
				}
				if s := st.Rings[i]; s.CPU != i || s.Samples != samples || s.Bytes != nbytes || s.Lost != lost || s.Corrupt != 0 {
					t.Fatalf("seed %d %s: ring %d stats %+v; reference %d samples, %d bytes, %d lost", seed, mode, i, s, samples, nbytes, lost)
				}
				all.Samples, all.Bytes, all.Lost = all.Samples+samples, all.Bytes+nbytes, all.Lost+lost
			}
			if st.Samples != all.Samples || st.Bytes != all.Bytes || st.Lost != all.Lost || st.Corrupt != 0 {
				t.Fatalf("seed %d %s: stats %+v; reference %d samples, %d bytes, %d lost", seed, mode, st, all.Samples, all.Bytes, all.Lost)
			}
		}
	}
}

// A turn ends once it has read its budget of bytes, in every read form,
// also when Each is stopped by its fn within a turn and called again: three
// records a turn here, the rings taking turns.
func TestReaderTurnsAcrossPauses(t *testing.T) {
	rec := ringtest.PerfSample(payload(0, 0, 40))
	for _, mode := range []string{"ReadInto", "Each", "Batches"} {
		for pause := 1; pause <= 7; pause++ {
			f := newFakeRings(t, 2, 4096)
			for seq := 0; seq < 9; seq++ {
				f.rings[0].MustWrite(t, rec)
				f.rings[1].MustWrite(t, rec)
			}
			r := f.reader(t, ReaderOptions{MaxLatency: -1})
			setBudget(r, 3*len(rec)-1, 3*len(rec)-1)
			r.Flush()
			var cpus []int
			var err error
			switch mode {
			case "ReadInto":
				var s Sample
				for err = r.ReadInto(&s); err == nil; err = r.ReadInto(&s) {
					cpus = append(cpus, s.CPU)
				}
			case "Each", "Batches":
				errPause := errors.New("pause")
				for err = errPause; err == errPause; {
					n := 0
					err = eachIn(r, mode, context.Background(), func(rec *Record) error {
						cpus = append(cpus, rec.CPU)
						if n++; n == pause {
							return errPause
						}
						return nil
					})
				}
			}
			want := "[0 0 0 1 1 1 0 0 0 1 1 1 0 0 0 1 1 1]"
			if !errors.Is(err, ErrFlushed) || fmt.Sprint(cpus) != want {
				t.Fatalf("%s, pausing every %d: %v, order %v; want ErrFlushed, %s", mode, pause, err, cpus, want)
			}
		}
	}
}

// A read called from inside an Each function fails with ErrReentrant: it used to wait for the read running it, forever.
func TestReadFromCallbackReentrant(t *testing.T) {
	for _, ordered := range []bool{false, true} {
		newR := func(f *fakeRings) *Reader {
			if ordered {
				return f.ordered(t, Order{})
			}
			return f.reader(t, ReaderOptions{})
		}
		f := newFakeRings(t, 2, 4096)
		r := newR(f)
		nested := map[string]func() error{
			"ReadInto": func() error { var s Sample; return r.ReadInto(&s) },
			"Each": func() error {
				return r.Each(context.Background(), func(*Record) error { return nil })
			},
		}
		for name, call := range nested {
			f.emit(t, 0, 1, 1, 16)
			f.emit(t, 1, 2, 2, 16)
			r.Flush()
			var got error
			within(t, fmt.Sprintf("ordered %v: %s inside Each", ordered, name), func() {
				r.Each(context.Background(), func(*Record) error {
					got = call()
					return errStop
				})
			})
			if !errors.Is(got, ErrReentrant) {
				t.Errorf("ordered %v: %s inside Each: %v, want ErrReentrant", ordered, name, got)
			}
		}
		// Another goroutine's read still waits for the one in progress.
		r.Close()
		f = newFakeRings(t, 2, 4096)
		r = newR(f)
		f.emit(t, 0, 10, 10, 16)
		f.emit(t, 1, 11, 11, 16)
		started, release := make(chan struct{}), make(chan struct{})
		go r.Each(context.Background(), func(*Record) error {
			close(started)
			<-release
			return errStop
		})
		select {
		case <-started:
		case <-time.After(5 * time.Second):
			t.Fatalf("ordered %v: Each delivered nothing", ordered)
		}
		waited := make(chan error, 1)
		go func() { waited <- r.ReadInto(new(Sample)) }()
		select {
		case err := <-waited:
			t.Errorf("ordered %v: read on another goroutine returned %v while Each ran", ordered, err)
		case <-time.After(50 * time.Millisecond):
		}
		close(release)
		within(t, "read after Each", func() {
			if err := <-waited; err != nil {
				t.Errorf("ordered %v: waiting read: %v", ordered, err)
			}
		})
	}
}

// Each with a nil function fails with os.ErrInvalid: it used to panic.
func TestEachNilFunc(t *testing.T) {
	for _, ordered := range []bool{false, true} {
		f := newFakeRings(t, 1, 4096)
		f.emit(t, 0, 1, 1, 16)
		var r *Reader
		if ordered {
			r = f.ordered(t, Order{})
		} else {
			r = f.reader(t, ReaderOptions{})
		}
		if err := r.Each(context.Background(), nil); !errors.Is(err, os.ErrInvalid) {
			t.Errorf("ordered %v: Each(nil): %v, want os.ErrInvalid", ordered, err)
		}
	}
}

// Past the deadline, a read delivers what it can without waiting, then
// fails: a fullest-first Reader every record in the rings, an ordered one
// those its release rule lets go, not one it holds back (see SetDeadline).
func TestDeadlinePastDeliversWhatIsReady(t *testing.T) {
	for _, ordered := range []bool{false, true} {
		f := newFakeRings(t, 2, 4096)
		var r *Reader
		if ordered {
			r = f.ordered(t, Order{MaxDelay: time.Hour})
		} else {
			r = f.reader(t, ReaderOptions{})
		}
		f.emit(t, 0, 5, 1, 16)
		f.emit(t, 0, 7, 2, 16)
		f.emit(t, 1, 6, 3, 16)
		r.SetDeadline(time.Now().Add(-time.Second))
		want := 3 // fullest-first: all
		if ordered {
			want = 2 // 5 and 6 by rule 1; 7 waits for ring 1's next key
		}
		var s Sample
		for i := 0; i < want; i++ {
			if err := r.ReadInto(&s); err != nil {
				t.Fatalf("ordered %v: read %d past the deadline: %v", ordered, i, err)
			}
		}
		if err := r.ReadInto(&s); !errors.Is(err, os.ErrDeadlineExceeded) {
			t.Errorf("ordered %v: read %d past the deadline: %v, want os.ErrDeadlineExceeded", ordered, want, err)
		}
	}
}

// Both policies skip records of types other than sample and lost, as
// Sample.Type promises, and count them as nothing: not samples, not lost,
// not corrupt. (They were handed out as recordOther.)
func TestReadersSkipOtherRecords(t *testing.T) {
	for _, ordered := range []bool{false, true} {
		f := newFakeRings(t, 1, 1<<12)
		var r *Reader
		if ordered {
			r = f.ordered(t, Order{})
		} else {
			r = f.reader(t, ReaderOptions{})
		}
		f.emit(t, 0, 1, 0, 16)
		f.rings[0].MustWrite(t, ringtest.PerfRecord(unix.PERF_RECORD_THROTTLE, 16, make([]byte, 8)))
		f.rings[0].MustWrite(t, ringtest.PerfRecord(unix.PERF_RECORD_UNTHROTTLE, 16, make([]byte, 8)))
		f.emit(t, 0, 2, 1, 16)
		r.Flush()
		var types []RecordType
		var s Sample
		err := r.ReadInto(&s)
		for ; err == nil; err = r.ReadInto(&s) {
			types = append(types, s.Type)
		}
		if !errors.Is(err, ErrFlushed) {
			t.Fatalf("ordered %v: %v", ordered, err)
		}
		if fmt.Sprint(types) != "[sample sample]" {
			t.Errorf("ordered %v: read %v, want two samples", ordered, types)
		}
		if st := r.Stats(); st.Samples != 2 || st.Lost != 0 || st.Corrupt != 0 || st.Rings[0].Samples != 2 {
			t.Errorf("ordered %v: stats %+v, want 2 samples and nothing else", ordered, st)
		}
	}
}

// ReadBatch over the fullest-first policy copies inside the ring's loop
// (ring.Sink): its contracts on both kinds, over fake rings.

// batchKind is one kind of fake ring for the ReadBatch tests: a Reader over
// one ring, emit writing a sample of n bytes carrying seq, corrupt writing a
// record that cannot be valid.
type batchKind struct {
	name    string
	open    func(t *testing.T) (r *Reader, emit func(seq uint64, n int), corrupt func())
	seqOf   func(data []byte) uint64
	padding func(n int) int // the payload length a Sample of an n-byte sample has
}

func batchKinds() []batchKind {
	return []batchKind{{
		name: "perf",
		open: func(t *testing.T) (*Reader, func(uint64, int), func()) {
			f := newFakeRings(t, 1, 64<<10)
			r := f.reader(t, ReaderOptions{MaxLatency: -1})
			return r, func(seq uint64, n int) { f.emit(t, 0, seq, seq, n) },
				func() { f.rings[0].MustWrite(t, ringtest.PerfRecord(9, 0, make([]byte, 8))) } // size 0
		},
		seqOf:   seqOf,
		padding: func(n int) int { return (n+4+7)&^7 - 4 },
	}, {
		name: "ringbuf",
		open: func(t *testing.T) (*Reader, func(uint64, int), func()) {
			f := newFakeBPFRings(t, 1, 64<<10)
			r := f.reader(t, ReaderOptions{MaxLatency: -1})
			rb := f.rings[0]
			return r, func(seq uint64, n int) { rb.Output(t, payload(seq, seq, n)) },
				func() {
					pos := rb.Output(t, make([]byte, 8))
					rb.Put(pos, ringtest.U32(1<<20)) // a length past the producer
				}
		},
		seqOf:   seqOf,
		padding: func(n int) int { return n },
	}}
}

// A corrupt record in the middle of a batch: the records before it are
// copied and returned, the error is the next call's, the ring goes on past
// it. A full batch stops inside a ring's turn and the next call goes on
// from there, none twice, none skipped.
func TestReadBatchCorruptMidBatch(t *testing.T) {
	for _, k := range batchKinds() {
		t.Run(k.name, func(t *testing.T) {
			r, emit, corrupt := k.open(t)
			for seq := range uint64(10) {
				emit(seq, 24)
			}
			corrupt()
			batch := make([]Sample, 4)
			var got []uint64
			for _, want := range []int{4, 4, 2} {
				n, err := r.ReadBatch(batch)
				if n != want || err != nil {
					t.Fatalf("ReadBatch = %d, %v; want %d, nil", n, err, want)
				}
				for _, s := range batch[:n] {
					if s.Type != RecordSample || len(s.Data) != k.padding(24) || s.CPU != r.r.C.Rings[0].Cur().CPU() {
						t.Fatalf("sample %+v", s)
					}
					got = append(got, k.seqOf(s.Data))
				}
			}
			if fmt.Sprint(got) != "[0 1 2 3 4 5 6 7 8 9]" {
				t.Errorf("read %v", got)
			}
			if n, err := r.ReadBatch(batch); n != 0 || !errors.Is(err, ErrCorrupt) {
				t.Fatalf("ReadBatch at the corrupt record = %d, %v; want ErrCorrupt", n, err)
			}
			emit(10, 24)
			if n, err := r.ReadBatch(batch); n != 1 || err != nil || k.seqOf(batch[0].Data) != 10 {
				t.Fatalf("ReadBatch after the corruption = %d, %v", n, err)
			}
			if st := r.Stats().Rings[0]; st.Samples != 11 || st.Corrupt != 1 {
				t.Errorf("stats %+v; want 11 samples, 1 corruption", st)
			}
		})
	}
}

// A call copies about batchBytes of payload at most, at least one record:
// it stops after the record that reaches the cap. It allocates nothing once
// the Samples' memory is large enough.
func TestReadBatchBytesCap(t *testing.T) {
	for _, k := range batchKinds() {
		t.Run(k.name, func(t *testing.T) {
			r, emit, _ := k.open(t)
			const size = 3000 // three reach batchBytes
			for seq := range uint64(5) {
				emit(seq, size)
			}
			batch := make([]Sample, 64)
			for _, want := range []int{3, 2} {
				if n, err := r.ReadBatch(batch); n != want || err != nil {
					t.Fatalf("ReadBatch = %d, %v; want %d", n, err, want)
				}
			}
			emit(5, 20000) // larger than the cap: one record a call
			emit(6, 24)
			for _, want := range []uint64{5, 6} {
				if n, err := r.ReadBatch(batch); n != 1 || err != nil || k.seqOf(batch[0].Data) != want {
					t.Fatalf("ReadBatch = %d, %v; want seq %d alone", n, err, want)
				}
			}
			for seq := range uint64(128) { // AllocsPerRun's warm-up and its run
				emit(seq, 24)
			}
			allocs := testing.AllocsPerRun(1, func() {
				if n, err := r.ReadBatch(batch); n != 64 || err != nil {
					t.Fatalf("ReadBatch = %d, %v", n, err)
				}
			})
			if allocs != 0 {
				t.Errorf("%v allocations a batch of 64", allocs)
			}
			r.Close()
			if n, err := r.ReadBatch(batch); n != 0 || !errors.Is(err, os.ErrClosed) {
				t.Errorf("ReadBatch after Close = %d, %v", n, err)
			}
		})
	}
}

// ReadInto's common path over both kinds: the fullest-first policy's turn
// calls the turn's ring as its kind (policy.Fullest.Next), and the read
// leaves through wait.Lifetime.ExitExclusive's inlined common case.

// readIntoKind is one ring of a kind, read by a fullest-first Reader.
type readIntoKind struct {
	name string
	// open returns the Reader over one fake ring, put (a producer's
	// output of an 8-byte sample carrying seq: false when the ring is
	// full), and corrupt, which writes a record that cannot be valid and
	// returns its position and the reason the Reader gives.
	open func(t *testing.T) (r *Reader, put func(seq uint64) bool, corrupt func() (uint64, string))
}

var readIntoKinds = []readIntoKind{
	{"perf", func(t *testing.T) (*Reader, func(uint64) bool, func() (uint64, string)) {
		f := newFakeRings(t, 1, 4096)
		rb := f.rings[0]
		put := func(seq uint64) bool {
			if !rb.Write(ringtest.PerfSample(bpfPayload(seq))) {
				rb.Lost = 0 // full: the caller waits, nothing is lost
				return false
			}
			rb.Publish()
			f.wake(0)
			return true
		}
		corrupt := func() (uint64, string) {
			pos := rb.Head
			rb.MustWrite(t, ringtest.PerfRecord(unix.PERF_RECORD_SAMPLE, 12, make([]byte, 8)))
			rb.Publish()
			f.wake(0)
			return pos, "record size 12 not a multiple of 8"
		}
		return f.reader(t, ReaderOptions{MaxLatency: -1}), put, corrupt
	}},
	{"ringbuf", func(t *testing.T) (*Reader, func(uint64) bool, func() (uint64, string)) {
		f := newFakeBPFRings(t, 1, 4096)
		rb := f.rings[0]
		put := func(seq uint64) bool {
			p, ok := rb.Reserve(8)
			if ok {
				rb.Write(p, bpfPayload(seq))
				rb.Commit(p, false)
			}
			return ok
		}
		corrupt := func() (uint64, string) {
			p, _ := rb.Reserve(8)
			rb.Put(p, ringtest.U32(64)) // committed, its length past the producer
			return p, "record length 64"
		}
		return f.reader(t, ReaderOptions{MaxLatency: -1}), put, corrupt
	}},
}

// A corrupt record met in the middle of a turn, by ReadInto alone: the
// records before it come in order, the read that reaches it reports it
// once as a *CorruptError (counted), and the next reads go on past it.
func TestReadIntoCorruptInTurn(t *testing.T) {
	for _, kind := range readIntoKinds {
		t.Run(kind.name, func(t *testing.T) {
			r, put, corrupt := kind.open(t)
			for seq := range uint64(4) {
				put(seq)
			}
			pos, reason := corrupt()
			r.SetDeadline(time.Now().Add(50 * time.Millisecond))
			var got []uint64
			var err error
			within(t, "ReadInto up to the corrupt record", func() {
				for s := (Sample{}); err == nil; {
					if err = r.ReadInto(&s); err == nil {
						got = append(got, seq8(s.Data))
					}
				}
			})
			var ce *CorruptError
			if !errors.As(err, &ce) || ce.Pos != pos || !strings.HasPrefix(ce.Reason, reason) {
				t.Fatalf("ReadInto: %v; want a *CorruptError at %d: %q", err, pos, reason)
			}
			if fmt.Sprint(got) != "[0 1 2 3]" {
				t.Errorf("delivered %v before the error, want [0 1 2 3]", got)
			}
			if st := r.Stats().Rings[0]; st.Samples != 4 || st.Corrupt != 1 {
				t.Errorf("stats %+v; want 4 samples and the corruption counted", st)
			}
			// Reported once; what comes after is read.
			put(4)
			put(5)
			got, err = nil, nil
			r.SetDeadline(time.Now().Add(50 * time.Millisecond))
			within(t, "ReadInto past the corrupt record", func() {
				for s := (Sample{}); err == nil; {
					if err = r.ReadInto(&s); err == nil {
						got = append(got, seq8(s.Data))
					}
				}
			})
			if !errors.Is(err, os.ErrDeadlineExceeded) || fmt.Sprint(got) != "[4 5]" {
				t.Errorf("after the report: %v, %v; want [4 5], then the deadline", got, err)
			}
		})
	}
}

// Close racing ReadInto from two goroutines while a producer writes: both
// reads return os.ErrClosed, every sample is delivered once, each reader's
// in order, and the ledger is exact (Samples delivered, Samples + Left
// written). The two readers take turns (a read waiting for the other wakes
// at its exit), and the last one out frees.
func TestReadIntoCloseRace(t *testing.T) {
	for _, kind := range readIntoKinds {
		for _, delay := range []time.Duration{0, time.Millisecond, 20 * time.Millisecond} {
			t.Run(fmt.Sprint(kind.name, "/", delay), func(t *testing.T) {
				r, put, _ := kind.open(t)
				var stop atomic.Bool
				var written uint64
				producer := make(chan struct{})
				go func() {
					defer close(producer)
					for !stop.Load() {
						if put(written) {
							written++
						} else {
							runtime.Gosched() // full: wait for the readers
						}
					}
				}()
				var got [2][]uint64 // each reader's
				errs := make(chan error, 2)
				for g := range got {
					go func() {
						var s Sample
						for {
							if err := r.ReadInto(&s); err != nil {
								errs <- err
								return
							}
							got[g] = append(got[g], seq8(s.Data))
							runtime.Gosched() // let the other in
						}
					}()
				}
				time.Sleep(delay)
				stop.Store(true)
				<-producer
				r.Close()
				for range 2 {
					select {
					case err := <-errs:
						if !errors.Is(err, os.ErrClosed) {
							t.Errorf("ReadInto: %v, want os.ErrClosed", err)
						}
					case <-time.After(10 * time.Second):
						t.Fatal("ReadInto still running 10 s after Close")
					}
				}
				for g, seqs := range got {
					if !slices.IsSorted(seqs) {
						t.Errorf("reader %d: seqs out of order", g)
					}
				}
				all := slices.Sorted(slices.Values(append(got[0], got[1]...)))
				for i, seq := range all {
					if seq != uint64(i) {
						t.Fatalf("seq %d delivered where %d was due (each once, none skipped)", seq, i)
					}
				}
				st := r.Stats().Rings[0]
				if st.Samples != uint64(len(all)) || st.Samples+st.Left != written {
					t.Errorf("delivered %d of %d written; Stats %+v", len(all), written, st)
				}
				t.Logf("%d written, %d and %d read by the two readers", written, len(got[0]), len(got[1]))
			})
		}
	}
}

// A read that ends a flush, or finds its deadline past, is how reads end
// in the normal course (a drain at shutdown, a poll with a deadline): it
// returns an error made once, which allocates nothing and says what was
// read, where fmt.Errorf took 3 allocations and 4-6 µs of CPU a read.
func TestReadIntoEndsAllocateNothing(t *testing.T) {
	for _, k := range readIntoKinds {
		t.Run(k.name, func(t *testing.T) {
			r, put, _ := k.open(t)
			var s Sample
			seq := uint64(0)
			flushRound := func() error {
				for range 4 {
					if !put(seq) {
						t.Fatalf("ring full at %d", seq)
					}
					seq++
				}
				r.Flush()
				for range 4 {
					if err := r.ReadInto(&s); err != nil {
						t.Fatal(err)
					}
				}
				return r.ReadInto(&s)
			}
			err := flushRound() // (s.Data grows here)
			if !errors.Is(err, ErrFlushed) || !strings.HasPrefix(err.Error(), "read ") {
				t.Fatalf("the read after a flush: %v, want ErrFlushed in the read's context", err)
			}
			// (Counted without -race, which allocates in the reads: make
			// test-nocgo.)
			if allocs := testing.AllocsPerRun(50, func() {
				if err := flushRound(); !errors.Is(err, ErrFlushed) {
					t.Fatal(err)
				}
			}); allocs != 0 && !raceDetector {
				t.Errorf("a flush's round, its ending read included: %v allocations, want 0", allocs)
			}

			r.SetDeadline(time.Now().Add(-time.Second))
			if err := r.ReadInto(&s); !errors.Is(err, os.ErrDeadlineExceeded) || !strings.HasPrefix(err.Error(), "read ") {
				t.Fatalf("a read past its deadline: %v, want os.ErrDeadlineExceeded in the read's context", err)
			}
			if allocs := testing.AllocsPerRun(50, func() {
				if err := r.ReadInto(&s); !errors.Is(err, os.ErrDeadlineExceeded) {
					t.Fatal(err)
				}
			}); allocs != 0 && !raceDetector {
				t.Errorf("a read past its deadline: %v allocations, want 0", allocs)
			}
		})
	}
}

// Tests of the reads that do not wait (Reader.Consume), of what the
// options refuse, and of Poll's timeout when goroutines Poll together.

// Consume delivers what is in the rings now and returns, without waiting
// and without an error at the end; records written later wait for the next
// call.
func TestReaderConsume(t *testing.T) {
	f := newFakeRings(t, 2, 4096)
	r := f.reader(t, ReaderOptions{MaxLatency: -1})
	var seqs []uint64
	fn := func(rec *Record) error { seqs = append(seqs, seqOf(rec.Data)); return nil }
	within(t, "Consume of empty rings", func() {
		if n, err := r.Consume(fn); n != 0 || err != nil {
			t.Errorf("Consume of empty rings = %d, %v", n, err)
		}
	})
	for seq := range uint64(5) {
		f.emit(t, int(seq%2), 0, seq, 24)
	}
	if n, err := r.Consume(fn); n != 5 || err != nil || len(seqs) != 5 {
		t.Fatalf("Consume = %d, %v (%v); want the 5 records", n, err, seqs)
	}
	if n, err := r.Consume(fn); n != 0 || err != nil {
		t.Fatalf("Consume again = %d, %v; want nothing", n, err)
	}
	f.emit(t, 1, 0, 5, 24)
	if n, err := r.Consume(fn); n != 1 || err != nil || seqs[5] != 5 {
		t.Fatalf("Consume after one more = %d, %v (%v)", n, err, seqs)
	}
	if st := r.Stats(); st.Samples != 6 || st.Rings[0].Samples+st.Rings[1].Samples != 6 || st.Fill != 0 {
		t.Errorf("stats %+v; want 6 samples, rings empty", st)
	}

	stop := errors.New("stop")
	f.emit(t, 0, 0, 6, 24)
	f.emit(t, 0, 0, 7, 24)
	if n, err := r.Consume(func(*Record) error { return stop }); n != 1 || err != stop {
		t.Errorf("Consume with fn failing = %d, %v; want 1, fn's error", n, err)
	}
	if _, err := r.Consume(nil); !errors.Is(err, os.ErrInvalid) {
		t.Errorf("Consume(nil): %v, want os.ErrInvalid", err)
	}
	var nested error
	if _, err := r.Consume(func(*Record) error {
		_, nested = r.Consume(fn)
		return nil
	}); err != nil || !errors.Is(nested, ErrReentrant) {
		t.Errorf("Consume from inside Consume: %v; outer %v", nested, err)
	}
	r.Close()
	if _, err := r.Consume(fn); !errors.Is(err, os.ErrClosed) {
		t.Errorf("Consume after Close: %v, want os.ErrClosed", err)
	}
}

// An ordered Reader's Consume delivers what the release rule lets go now
// and keeps the rest; after Flush it delivers everything, in key order.
func TestReaderConsumeOrdered(t *testing.T) {
	f := newFakeRings(t, 2, 4096)
	r := f.reader(t, ReaderOptions{MaxLatency: -1, Order: &Order{MaxDelay: time.Hour}})
	for k, key := range []uint64{10, 20, 30} {
		f.emit(t, 0, key, uint64(k), 24)
	}
	f.emit(t, 1, 25, 3, 24)
	var keys []uint64
	fn := func(rec *Record) error { keys = append(keys, rec.Key); return nil }
	// 10 and 20 go (ring 1 has shown 25); 25 goes (ring 0 has shown 30);
	// 30 waits for ring 1, which shows nothing after 25.
	if n, err := r.Consume(fn); n != 3 || err != nil || !slices.Equal(keys, []uint64{10, 20, 25}) {
		t.Fatalf("Consume = %d, %v, keys %v; want 10 20 25", n, err, keys)
	}
	r.Flush()
	if n, err := r.Consume(fn); n != 1 || err != nil || !slices.Equal(keys, []uint64{10, 20, 25, 30}) {
		t.Fatalf("Consume after Flush = %d, %v, keys %v; want 30", n, err, keys)
	}
	if n, err := r.Consume(fn); n != 0 || err != nil {
		t.Fatalf("Consume after the flush = %d, %v", n, err)
	}
}

// Consume allocates nothing, for either policy.
func TestReaderConsumeAllocs(t *testing.T) {
	for _, ord := range []*Order{nil, {MaxDelay: time.Nanosecond}} {
		f := newFakeRings(t, 2, 1<<16)
		r := f.reader(t, ReaderOptions{MaxLatency: -1, Order: ord})
		var sum int
		fn := func(rec *Record) error { sum += rec.Len(); return nil }
		var recs [8][]byte
		for i := range recs {
			recs[i] = ringtest.PerfSample(payload(uint64(i), uint64(i), 40))
		}
		allocs := testing.AllocsPerRun(50, func() {
			for i, rec := range recs {
				f.rings[i%2].Write(rec)
			}
			f.rings[0].Publish()
			f.rings[1].Publish()
			if n, err := r.Consume(fn); n != 8 || err != nil {
				t.Fatalf("ordered %v: Consume = %d, %v", ord != nil, n, err)
			}
		})
		if allocs != 0 {
			t.Errorf("ordered %v: Consume of 8 records: %v allocs", ord != nil, allocs)
		}
	}
}

// What cannot work is refused at NewReader, not met later as a panic: a key
// offset no sample reaches (KeyOffset+8 overflowed), and a nil context.
// A sample shorter than the key has key 0.
func TestReaderOptionsRefused(t *testing.T) {
	f := newFakeRings(t, 1, 4096)
	for _, off := range []int{1<<63 - 8, math.MaxInt, math.MaxInt - 7, maxKeyOffset - 7} {
		if _, err := f.newReader(t, ReaderOptions{Order: &Order{KeyOffset: off}}); !errors.Is(err, os.ErrInvalid) {
			t.Errorf("KeyOffset %d: %v, want os.ErrInvalid", off, err)
		}
	}
	for _, o := range []Options{{Maps: []Map{nil}}, {RingBytes: -1}, {MaxSampleSize: -1}} {
		if _, err := f.newReader(t, ReaderOptions{Options: o}); !errors.Is(err, os.ErrInvalid) {
			t.Errorf("NewReader with %+v: %v, want os.ErrInvalid", o, err)
		}
	}

	r := f.ordered(t, Order{KeyOffset: maxKeyOffset - 8, MaxDelay: time.Nanosecond})
	f.emit(t, 0, 7, 0, 16)
	var s Sample
	if err := r.ReadInto(&s); err != nil || s.Key != 0 {
		t.Errorf("a sample shorter than the key: %v, key %d; want key 0", err, s.Key)
	}
	//lint:ignore SA1012 a nil context is what is tested
	if err := r.Each(nil, func(*Record) error { return nil }); !errors.Is(err, os.ErrInvalid) {
		t.Errorf("Each(nil, fn): %v, want os.ErrInvalid", err)
	}
	if err := r.ReadInto(nil); !errors.Is(err, os.ErrInvalid) {
		t.Errorf("ReadInto(nil): %v, want os.ErrInvalid", err)
	}
}

// A Poll returns by its own timeout whatever other goroutines do: one that
// waits for another's turn on the wait counts that time in. (Poll(100ms)
// behind a Poll(200ms) came back after 200 ms.) Shown by order, which a
// loaded host keeps: each shorter Poll, started after the long one, returns
// before it; and none returns before its timeout.
func TestPollTimeoutConcurrent(t *testing.T) {
	f := newFakeRings(t, 2, 4096)
	pb := f.perfBuffer(t, func(int, []byte) {}, nil)
	timeouts := []time.Duration{600 * time.Millisecond, 100 * time.Millisecond, 20 * time.Millisecond, 250 * time.Millisecond}
	took := make([]time.Duration, len(timeouts))
	order := make([]int, len(timeouts)) // the rank in which each returned
	var returned atomic.Int32
	var wg sync.WaitGroup
	for i, d := range timeouts {
		wg.Add(1)
		go func() {
			defer wg.Done()
			start := time.Now()
			n, err := pb.Poll(d)
			took[i] = time.Since(start)
			order[i] = int(returned.Add(1))
			if n != 0 || err != nil {
				t.Errorf("Poll(%v) = %d, %v", d, n, err)
			}
		}()
		time.Sleep(5 * time.Millisecond) // the first one waits on the set, the others behind it
	}
	wg.Wait()
	for i, d := range timeouts {
		if took[i] < d {
			t.Errorf("Poll(%v) returned after %v, before its timeout", d, took[i])
		}
		if i > 0 && order[i] > order[0] {
			t.Errorf("Poll(%v) returned after the Poll(%v) whose turn it waited behind (after %v)", d, timeouts[0], took[i])
		}
	}
}

// A head behind the tail (the tail moved by someone else) is one rule for
// every form of reading: a CorruptError, counted, and the reader goes on
// from the head.
func TestHeadBehindTailEveryForm(t *testing.T) {
	forms := map[string]func(t *testing.T, f *fakeRings) (func() Stats, error){
		"Consume": func(t *testing.T, f *fakeRings) (func() Stats, error) {
			pb := f.perfBuffer(t, func(int, []byte) {}, nil)
			_, err := pb.Consume()
			return pb.Stats, err
		},
		"Drain": func(t *testing.T, f *fakeRings) (func() Stats, error) {
			b := newRawBuffer(f.perf(t)[0], nil)
			_, err := b.Drain(func(*Record) error { return nil })
			if err != nil {
				b.SkipCorrupt()
			}
			return b.Stats, err
		},
	}
	// After a Flush too: the Reader and the ordered Reader used to find the
	// flush done (the tail past its head) without a look at the ring.
	for _, pol := range []string{"fullest", "ordered", "fullest+Flush", "ordered+Flush"} {
		for _, mode := range []string{"ReadInto", "ReadBatch", "Each", "Batches", "Consume"} {
			forms[pol+"/"+mode] = func(t *testing.T, f *fakeRings) (func() Stats, error) {
				o := ReaderOptions{MaxLatency: -1}
				if strings.HasPrefix(pol, "ordered") {
					o.Order = &Order{MaxDelay: time.Nanosecond}
				}
				r := f.reader(t, o)
				r.SetDeadline(time.Now().Add(time.Second))
				if strings.HasSuffix(pol, "+Flush") {
					r.Flush()
				}
				return r.Stats, readOnce(r, mode)
			}
		}
	}
	for name, read := range forms {
		t.Run(name, func(t *testing.T) {
			f := newFakeRings(t, 1, 4096)
			f.emit(t, 0, 0, 0, 24)
			f.rings[0].Page.Data_tail = 4096 // past the head (a bug, another consumer)
			stats, err := read(t, f)
			var ce *CorruptError
			if !errors.As(err, &ce) || ce.Reason != fmt.Sprintf("head %d behind tail 4096", f.rings[0].Head) {
				t.Fatalf("%v, want a CorruptError for the head behind the tail", err)
			}
			if st := stats(); st.Corrupt != 1 {
				t.Errorf("stats %+v; want the corruption counted", st)
			}
			if tail := f.rings[0].Page.Data_tail; tail != f.rings[0].Head {
				t.Errorf("tail %d after the error, want the head %d", tail, f.rings[0].Head)
			}
		})
	}
}

// ReadBatch copies what is there, up to the batch, in the order ReadInto
// delivers, and waits only when nothing is; an error met after records were
// copied comes with the next call; it allocates nothing once the Samples'
// memory is large enough.
func TestReaderReadBatch(t *testing.T) {
	for _, ord := range []*Order{nil, {MaxDelay: time.Nanosecond}} {
		f := newFakeRings(t, 2, 4096)
		r := f.reader(t, ReaderOptions{MaxLatency: -1, Order: ord})
		for seq := range uint64(10) {
			f.emit(t, int(seq%2), seq, seq, 24)
		}
		var batch [4]Sample
		var seqs []uint64
		for len(seqs) < 10 {
			n, err := r.ReadBatch(batch[:])
			if err != nil || n == 0 || n > 4 {
				t.Fatalf("ordered %v: ReadBatch = %d, %v", ord != nil, n, err)
			}
			for _, s := range batch[:n] {
				seqs = append(seqs, seqOf(s.Data))
			}
		}
		slices.Sort(seqs)
		if !slices.Equal(seqs, []uint64{0, 1, 2, 3, 4, 5, 6, 7, 8, 9}) {
			t.Errorf("ordered %v: read %v", ord != nil, seqs)
		}
		if n, err := r.ReadBatch(nil); n != 0 || err != nil {
			t.Errorf("ReadBatch(nil) = %d, %v", n, err)
		}
		// Blocks while nothing is there; a record ends it.
		got := make(chan int, 1)
		go func() { n, _ := r.ReadBatch(batch[:]); got <- n }()
		time.Sleep(5 * time.Millisecond)
		f.emit(t, 0, 100, 100, 24)
		f.wake(0)
		select {
		case n := <-got:
			if n != 1 {
				t.Errorf("ordered %v: blocked ReadBatch = %d, want 1", ord != nil, n)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("ReadBatch still blocked 5 s after a record")
		}
		allocs := testing.AllocsPerRun(20, func() {
			f.emit(t, 1, 200, 200, 24)
			if n, err := r.ReadBatch(batch[:]); n != 1 || err != nil {
				t.Fatalf("ReadBatch = %d, %v", n, err)
			}
		})
		if allocs > 2 { // fakeSample and payload: the test's own
			t.Errorf("ordered %v: %v allocs a call", ord != nil, allocs)
		}
	}
	// A corrupt ring after good records: the records first, the error next.
	f := newFakeRings(t, 1, 4096)
	r := f.reader(t, ReaderOptions{MaxLatency: -1})
	f.emit(t, 0, 0, 0, 24)
	f.rings[0].MustWrite(t, ringtest.PerfRecord(9, 0, make([]byte, 8)))
	var batch [4]Sample
	if n, err := r.ReadBatch(batch[:]); n != 1 || err != nil {
		t.Fatalf("ReadBatch before the corrupt record = %d, %v; want the good one", n, err)
	}
	if n, err := r.ReadBatch(batch[:]); n != 0 || !errors.Is(err, ErrCorrupt) {
		t.Fatalf("ReadBatch at the corrupt record = %d, %v; want ErrCorrupt", n, err)
	}
}

// ReadBatch goes through the policy's loop: batches that end inside a
// ring's turn, and turns that end inside a batch, deliver the records in
// the order Each does (lost records included), each once, with the counts
// of Stats; for every batch length, and with the ordered merge's runs.
func TestReaderReadBatchOrder(t *testing.T) {
	fill := func(f *fakeRings) {
		for seq := range uint64(40) {
			ring := 0
			if seq%3 == 0 {
				ring = 1
			}
			f.emit(t, ring, seq, seq, 24)
			if seq == 17 {
				f.rings[ring].MustWrite(t, ringtest.PerfLost(1, 5))
			}
		}
	}
	show := func(s *Sample) string {
		if s.Type == RecordLost {
			return fmt.Sprintf("lost %d on %d", s.Lost, s.Ring)
		}
		return fmt.Sprintf("%d on %d", seqOf(s.Data), s.Ring)
	}
	for _, ord := range []*Order{nil, {MaxDelay: time.Hour}} {
		f := newFakeRings(t, 2, 4096)
		r := f.reader(t, ReaderOptions{MaxLatency: -1, Order: ord})
		if ord == nil {
			setBudget(r, 100, 100) // turns of 3 records
		}
		fill(f)
		r.Flush()
		var want []string
		var s Sample
		if _, err := r.Consume(func(rec *Record) error {
			copySample(&s, rec)
			want = append(want, show(&s))
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		for _, n := range []int{1, 2, 3, 5, 64} {
			f := newFakeRings(t, 2, 4096)
			r := f.reader(t, ReaderOptions{MaxLatency: -1, Order: ord})
			if ord == nil {
				setBudget(r, 100, 100)
			}
			fill(f)
			r.Flush()
			batch := make([]Sample, n)
			var got []string
			for {
				k, err := r.ReadBatch(batch)
				for i := range batch[:k] {
					got = append(got, show(&batch[i]))
				}
				if errors.Is(err, ErrFlushed) {
					break
				}
				if err != nil || k == 0 || k > n {
					t.Fatalf("ordered %v, batch %d: ReadBatch = %d, %v", ord != nil, n, k, err)
				}
			}
			if !slices.Equal(got, want) {
				t.Errorf("ordered %v, batch %d: read\n%v\nwant (Consume)\n%v", ord != nil, n, got, want)
			}
			var samples, lost uint64
			st := r.Stats()
			for _, s := range st.Rings {
				samples, lost = samples+s.Samples, lost+s.Lost
			}
			if samples != 40 || lost != 5 || st.Samples != 40 || st.Lost != 5 {
				t.Errorf("ordered %v, batch %d: Stats count %d samples, %d lost; want 40, 5", ord != nil, n, samples, lost)
			}
		}
	}
}

// A tail moved past the head while the ring was quiet (read to its head),
// then a Flush: the read meets it and reports it, fullest or ordered; it does
// not find the flush done (the tail past the flush's head) nor go round
// without a look at the ring until its deadline.
func TestHeadBehindTailQuietFlush(t *testing.T) {
	for _, ord := range []*Order{nil, {MaxDelay: time.Nanosecond}} {
		for _, mode := range []string{"ReadInto", "ReadBatch", "Each", "Batches", "Consume"} {
			t.Run(fmt.Sprintf("ordered %v/%s", ord != nil, mode), func(t *testing.T) {
				f := newFakeRings(t, 1, 4096)
				r := f.reader(t, ReaderOptions{MaxLatency: -1, Order: ord})
				f.emit(t, 0, 1, 1, 24)
				r.SetDeadline(time.Now().Add(5 * time.Second))
				var s Sample
				if err := r.ReadInto(&s); err != nil {
					t.Fatal(err)
				}
				r.Flush() // delivers the ordered Reader's commit too
				if _, err := r.Consume(func(*Record) error { return nil }); err != nil {
					t.Fatal(err)
				}
				f.rings[0].Page.Data_tail = 4096 // past the head, the ring quiet
				r.Flush()
				var err error
				within(t, mode, func() { err = readOnce(r, mode) })
				var ce *CorruptError
				if !errors.As(err, &ce) || ce.Reason != fmt.Sprintf("head %d behind tail 4096", f.rings[0].Head) {
					t.Fatalf("%v, want a CorruptError for the head behind the tail", err)
				}
				if st := r.Stats(); st.Corrupt != 1 || st.Rings[0].Corrupt != 1 {
					t.Errorf("stats %+v; want the corruption counted", st)
				}
			})
		}
	}
}

// readOnce makes one read of r in mode (ReadInto, ReadBatch, Each or
// Consume), dropping what it delivers, and returns its error.
func readOnce(r *Reader, mode string) error {
	var err error
	switch mode {
	case "ReadInto":
		var s Sample
		err = r.ReadInto(&s)
	case "ReadBatch":
		_, err = r.ReadBatch(make([]Sample, 4))
	case "Each", "Batches":
		err = eachIn(r, mode, context.Background(), func(*Record) error { return nil })
	case "Consume":
		_, err = r.Consume(func(*Record) error { return nil })
	}
	return err
}

// A long read hands the ring's space back as it goes, a chunk
// (commitChunk) at a time: the kernel's producers see the ring full up to
// the committed position. Committed only at the end of a turn, a quarter
// of the ring, the space read lay idle while producers lost records
// (docs/performance.md, "Space handed back as it is read"). Every read
// form, both kinds, fullest first and ordered (over a ring buffer, a ring
// read in place, hot).
func TestLongReadCommitsAsItGoes(t *testing.T) {
	const size = 1 << 20
	const chunk = size / 32 // what a read delivers between commits from a ring of 1 MiB
	for _, kind := range []string{"perf", "ringbuf"} {
		for _, pol := range []string{"fullest", "ordered"} {
			for _, form := range []string{"ReadInto", "ReadBatch", "Each", "Batches"} {
				t.Run(kind+"/"+pol+"/"+form, func(t *testing.T) {
					var (
						r         *Reader
						committed func() uint64 // the consumer position
						recSize   uint64
					)
					var ord *Order
					if pol == "ordered" {
						ord = &Order{MaxDelay: time.Hour}
					}
					if kind == "perf" {
						f := newFakeRings(t, 1, size)
						recSize = 80 // header 8, size 4, 64 bytes, padded to 8
						for n := uint64(0); (n+1)*recSize < size/8*7; n++ {
							f.emit(t, 0, n, n, 64)
						}
						f.rings[0].Publish()
						r = f.reader(t, ReaderOptions{Order: ord, MaxLatency: -1})
						committed = func() uint64 { return atomic.LoadUint64(&f.rings[0].Page.Data_tail) }
					} else {
						f := newFakeBPFRings(t, 1, size)
						recSize = 72 // header 8, 64 bytes
						for n := uint64(0); (n+1)*recSize < size/8*7; n++ {
							f.emit(t, 0, n, n, 64)
						}
						if ord != nil {
							r = f.ordered(t, *ord)
						} else {
							r = f.reader(t, ReaderOptions{MaxLatency: -1})
						}
						committed = func() uint64 { return atomic.LoadUint64(&f.rings[0].Pos[0]) }
					}
					r.SetDeadline(time.Now().Add(10 * time.Second))
					// Delivered bytes not yet committed: at most a chunk and the
					// record being delivered.
					want := size / 2 / recSize
					delivered := uint64(0)
					check := func() {
						t.Helper()
						if behind := delivered*recSize - committed(); int64(behind) < 0 || behind > chunk+recSize {
							t.Fatalf("after %d records (%d bytes) the ring is committed to %d: %d bytes behind, more than a chunk of %d",
								delivered, delivered*recSize, committed(), behind, chunk)
						}
					}
					errEnough := errors.New("enough")
					switch form {
					case "ReadInto":
						var s Sample
						for ; delivered < want; delivered++ {
							check()
							if err := r.ReadInto(&s); err != nil {
								t.Fatal(err)
							}
						}
					case "ReadBatch":
						batch := make([]Sample, 64)
						for delivered < want {
							check()
							n, err := r.ReadBatch(batch)
							if err != nil {
								t.Fatal(err)
							}
							delivered += uint64(n)
						}
					case "Each", "Batches":
						err := eachIn(r, form, context.Background(), func(rec *Record) error {
							check()
							if delivered++; delivered == want {
								return errEnough
							}
							return nil
						})
						if !errors.Is(err, errEnough) {
							t.Fatal(err)
						}
					}
				})
			}
		}
	}
}

// parked waits, within a timeout, until the owner's wait looked at the
// rings in the netpoller: a ring's event from then on is a wakeup.
func parked(t *testing.T, c *owner.Core) {
	t.Helper()
	for end := time.Now().Add(10 * time.Second); !c.W.Parked(); time.Sleep(time.Millisecond) {
		if time.Now().After(end) {
			t.Fatal("the wait never parked")
		}
	}
}

// result waits, within a timeout, for a blocked call's error.
func result(t *testing.T, done chan error) error {
	t.Helper()
	select {
	case err := <-done:
		return err
	case <-time.After(10 * time.Second):
		t.Fatal("the call did not return")
		return nil
	}
}

// Each owner counts the blocked waits that a ring's event ended, not those
// that a Flush, a deadline or a timeout ended, in its Stats' Wakeups.
func TestWakeups(t *testing.T) {
	f := newFakeRings(t, 2, 4096)
	r := f.reader(t, ReaderOptions{MaxLatency: -1})
	done := make(chan error)
	var s Sample
	for n := uint64(1); n <= 2; n++ {
		go func() { done <- r.ReadInto(&s) }()
		parked(t, r.r.C)
		f.emit(t, 1, 0, n, 16)
		f.wake(1)
		if err := result(t, done); err != nil {
			t.Fatal(err)
		}
		f.drainWake(1)
		if got := r.Stats().Wakeups; got != n {
			t.Errorf("Reader: %d wakeups after %d events, want %d", got, n, n)
		}
	}
	go func() { done <- r.ReadInto(&s) }()
	parked(t, r.r.C)
	r.Flush()
	if err := result(t, done); !errors.Is(err, ErrFlushed) {
		t.Fatalf("read after Flush: %v", err)
	}
	go func() { done <- r.ReadInto(&s) }()
	parked(t, r.r.C)
	r.SetDeadline(time.Now())
	if err := result(t, done); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("read past the deadline: %v", err)
	}
	if got := r.Stats().Wakeups; got != 2 {
		t.Errorf("Reader: %d wakeups after a Flush and a deadline, want 2", got)
	}
	r.Close()
	if got := r.Stats().Wakeups; got != 2 {
		t.Errorf("Reader: %d wakeups after Close, want 2", got)
	}

	pf := newFakeRings(t, 2, 4096)
	pb := pf.perfBuffer(t, func(int, []byte) {}, nil)
	go func() { _, err := pb.Poll(-1); done <- err }()
	parked(t, pb.pb.C)
	pf.emit(t, 0, 0, 0, 16)
	pf.wake(0)
	if err := result(t, done); err != nil {
		t.Fatal(err)
	}
	if _, err := pb.Poll(time.Millisecond); err != nil { // a timeout
		t.Fatal(err)
	}
	if got := pb.Stats().Wakeups; got != 1 {
		t.Errorf("PerfBuffer: %d wakeups, want 1", got)
	}

	rf := newFakeRings(t, 2, 4096)
	raw := rf.raw(t)
	go func() { _, err := raw.Wait(-1, nil); done <- err }()
	parked(t, raw.r.C)
	rf.emit(t, 1, 0, 0, 16)
	rf.wake(1)
	if err := result(t, done); err != nil {
		t.Fatal(err)
	}
	if got := raw.Stats().Wakeups; got != 1 {
		t.Errorf("Raw: %d wakeups, want 1", got)
	}
	// The wakeups are the owner's, in the sums only.
	for name, st := range map[string]Stats{"Reader": r.Stats(), "PerfBuffer": pb.Stats(), "Raw": raw.Stats()} {
		for i, s := range st.Rings {
			if s.Wakeups != 0 {
				t.Errorf("%s: ring %d counts %d wakeups, want them in the sums only", name, i, s.Wakeups)
			}
		}
	}
}

// Waiting is an upper bound of the oldest undelivered record's age, which
// the reader's commits and Stats calls keep close: it is at least the time
// since the record was written, and at most the time since a commit or a
// Stats call found the ring empty.
func TestStatsWaiting(t *testing.T) {
	f := newFakeRings(t, 1, 4096)
	r := f.reader(t, ReaderOptions{MaxLatency: -1})
	if w := r.Stats().Rings[0].Waiting; w != 0 {
		t.Errorf("an empty ring: Waiting %v", w)
	}

	// A record not read: Waiting is at least its age.
	f.emit(t, 0, 0, 0, 16)
	written := time.Now()
	time.Sleep(2 * time.Millisecond)
	age := time.Since(written)
	if st := r.Stats(); st.Rings[0].Waiting < age || st.Waiting != st.Rings[0].Waiting {
		t.Errorf("Waiting %v (sums %v), below the record's age %v", st.Rings[0].Waiting, st.Waiting, age)
	}

	// The reader delivers it; the commit finds the ring empty. A record
	// written later waited at most since then, however long ago the ring
	// opened or a Stats call looked.
	time.Sleep(20 * time.Millisecond)
	r.Flush()
	read := time.Now()
	if n := readFlushed(t, r); n != 1 {
		t.Fatalf("%d records read, want 1", n)
	}
	f.emit(t, 0, 0, 1, 16)
	if w, since := r.Stats().Rings[0].Waiting, time.Since(read); w == 0 || w > since {
		t.Errorf("Waiting %v after a commit %v ago found the ring empty", w, since)
	}

	// A Stats call that finds the ring empty bounds it too.
	r.Flush()
	readFlushed(t, r)
	time.Sleep(20 * time.Millisecond)
	looked := time.Now()
	if w := r.Stats().Rings[0].Waiting; w != 0 {
		t.Errorf("an empty ring: Waiting %v", w)
	}
	f.emit(t, 0, 0, 2, 16)
	if w, since := r.Stats().Rings[0].Waiting, time.Since(looked); w == 0 || w > since {
		t.Errorf("Waiting %v after a Stats call %v ago found the ring empty", w, since)
	}
	r.Close()
	if w := r.Stats().Rings[0].Waiting; w != 0 {
		t.Errorf("after Close: Waiting %v", w)
	}
}

// A record an ordered Reader holds back waits: Waiting is at least its
// age, and at most the time since the ring was opened (found empty); 0 for
// a ring that holds nothing, and once delivered. The sums' Waiting is the
// longest.
func TestStatsWaitingOrdered(t *testing.T) {
	f := newFakeRings(t, 2, 4096)
	opened := time.Now()
	r := f.ordered(t, Order{MaxDelay: time.Hour})
	f.emit(t, 0, 5, 0, 16) // held: ring 1 may yet output a smaller key (rule 1)
	written := time.Now()
	r.SetDeadline(time.Now().Add(5 * time.Millisecond))
	var s Sample
	if err := r.ReadInto(&s); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("read: %v, want the deadline's error", err)
	}
	time.Sleep(2 * time.Millisecond)
	age := time.Since(written)
	st := r.Stats()
	if w, since := st.Rings[0].Waiting, time.Since(opened); w < age || w > since {
		t.Errorf("Waiting %v, want at least the held record's age %v and at most %v", w, age, since)
	}
	if st.Rings[1].Waiting != 0 || st.Waiting != st.Rings[0].Waiting {
		t.Errorf("ring 1 holds nothing: Waiting %v; sums' Waiting %v, want ring 0's", st.Rings[1].Waiting, st.Waiting)
	}
	r.SetDeadline(time.Time{})
	r.Flush()
	if n := readFlushed(t, r); n != 1 {
		t.Fatalf("%d records read, want 1", n)
	}
	if w := r.Stats().Waiting; w != 0 {
		t.Errorf("delivered: Waiting %v", w)
	}
}

// Waiting over ring buffers: per ring, from the consumer and producer
// positions; a record reserved and not yet submitted waits too.
func TestStatsWaitingRingBuf(t *testing.T) {
	f := newFakeBPFRings(t, 2, 4096)
	r := f.reader(t, ReaderOptions{MaxLatency: -1})
	f.rings[1].Output(t, bpfPayload(1))
	written := time.Now()
	time.Sleep(2 * time.Millisecond)
	age := time.Since(written)
	st := r.Stats()
	if st.Rings[0].Waiting != 0 || st.Rings[1].Waiting < age || st.Waiting != st.Rings[1].Waiting {
		t.Errorf("Waiting %v and %v (sums %v); want 0 and at least %v", st.Rings[0].Waiting, st.Rings[1].Waiting, st.Waiting, age)
	}
	r.Flush()
	if n := readFlushed(t, r); n != 1 {
		t.Fatalf("%d records read, want 1", n)
	}
	if w := r.Stats().Rings[1].Waiting; w != 0 {
		t.Errorf("delivered: Waiting %v", w)
	}
	if _, ok := f.rings[0].Reserve(8); !ok {
		t.Fatal("no room to reserve")
	}
	if w := r.Stats().Rings[0].Waiting; w == 0 {
		t.Error("a reserved record: Waiting 0")
	}
}

// Stats' Size is each ring's size, and their sum in the sums, also after
// Close.
func TestStatsSize(t *testing.T) {
	sizes := func(st Stats) []int {
		out := []int{st.Size}
		for _, s := range st.Rings {
			out = append(out, s.Size)
		}
		return out
	}
	f := newFakeRings(t, 2, 4096)
	r := f.reader(t, ReaderOptions{})
	if got := sizes(r.Stats()); !slices.Equal(got, []int{8192, 4096, 4096}) {
		t.Errorf("Stats' sizes (the sums' and each ring's) = %v, want [8192 4096 4096]", got)
	}
	r.Close()
	if got := sizes(r.Stats()); !slices.Equal(got, []int{8192, 4096, 4096}) {
		t.Errorf("Stats' sizes after Close = %v", got)
	}
}

// owner.CloseExact (the tests' word on whether the counts add up exactly
// at Close) is false before 6.0 (no PERF_FORMAT_LOST), and from 6.0 true
// on a kernel without nohz_full CPUs, whose
// /sys/devices/system/cpu/nohz_full lists none ("(null)" or no file):
// membarrier waits there, and so does the array of maps. On a nohz_full
// kernel only the array of maps waits (internal/kernel's
// TestWaitWritersMembarrierRefused; selftest/failures' TestNohzFull in a
// nohz_full guest of make vmtest).
func TestCloseExact(t *testing.T) {
	b, err := os.ReadFile("/sys/devices/system/cpu/nohz_full")
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		t.Fatal(err)
	}
	list := strings.TrimSpace(string(b))
	nohzFull := list != "" && list != "(null)"
	major, minor, err := kernel.Version()
	if err != nil {
		t.Fatal(err)
	}
	switch got := owner.CloseExact(); {
	case major < 6 && got:
		t.Errorf("CloseExact() = %v on kernel %d.%d, before PERF_FORMAT_LOST", got, major, minor)
	case major >= 6 && !got && !nohzFull:
		t.Errorf("CloseExact() = %v on kernel %d.%d without nohz_full CPUs (%q)", got, major, minor, list)
	}
}
