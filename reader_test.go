package perfbuf

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"iter"
	"math/rand"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// fakeRings are fake perf rings with an eventfd each standing in for the
// perf event's fd: a producer signals it after publishing, as the kernel's
// wakeup makes the perf fd readable.
type fakeRings struct {
	rings []*fakeRing
	fds   []int
}

func newFakeRings(t testing.TB, n, size int) *fakeRings {
	t.Helper()
	f := &fakeRings{}
	for i := 0; i < n; i++ {
		f.rings = append(f.rings, newFakeRing(size))
		fd, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
		if err != nil {
			t.Fatal(err)
		}
		f.fds = append(f.fds, fd)
		t.Cleanup(func() { unix.Close(fd) })
	}
	return f
}

// raw returns RawBuffers over the rings, CPU i for ring i.
func (f *fakeRings) raw(t testing.TB) []*RawBuffer {
	t.Helper()
	var out []*RawBuffer
	for i, r := range f.rings {
		b, err := newRawBufferFromParts(i, r.page, r.data)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, b)
	}
	return out
}

// wake makes ring i's fd readable.
func (f *fakeRings) wake(i int) {
	var one [8]byte
	binary.NativeEndian.PutUint64(one[:], 1)
	unix.Write(f.fds[i], one[:])
}

// drainWake makes ring i's fd unreadable again (the kernel's perf_poll
// does this when it reports the ring).
func (f *fakeRings) drainWake(i int) {
	var b [8]byte
	unix.Read(f.fds[i], b[:])
}

func (f *fakeRings) reader(t testing.TB, opts ReaderOptions) *Reader {
	t.Helper()
	r := &Reader{roundRobin: opts.RoundRobin}
	if err := r.init(f.raw(t), f.fds, opts); err != nil {
		t.Fatal(err)
	}
	r.setSource(r)
	t.Cleanup(func() { r.Close() })
	return r
}

func (f *fakeRings) ordered(t testing.TB, opts OrderedOptions) *OrderedReader {
	t.Helper()
	o, err := newOrdered(opts)
	if err != nil {
		t.Fatal(err)
	}
	if err := o.init(f.raw(t), f.fds, opts.ReaderOptions); err != nil {
		t.Fatal(err)
	}
	o.setup()
	t.Cleanup(func() { o.Close() })
	return o
}

// payload is a sample carrying a key and a sequence number.
func payload(key, seq uint64, size int) []byte {
	p := make([]byte, max(size, 16))
	binary.NativeEndian.PutUint64(p, key)
	binary.NativeEndian.PutUint64(p[8:], seq)
	for i := 16; i < len(p); i++ {
		p[i] = byte(seq) + byte(i)
	}
	return p
}

func (f *fakeRings) emit(t testing.TB, ring int, key, seq uint64, size int) {
	t.Helper()
	f.rings[ring].mustWrite(t, fakeSample(payload(key, seq, size)))
}

func readN(t *testing.T, r interface{ ReadInto(*Sample) error }, n int) []Sample {
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
func readFlushed(t *testing.T, r interface{ ReadInto(*Sample) error }) int {
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

func keyOf(s Sample) uint64 { return binary.NativeEndian.Uint64(s.Data) }

// The fullest ring is drained first; with a budget, turns alternate.
func TestReaderFullestFirst(t *testing.T) {
	f := newFakeRings(t, 2, 4096)
	for i := 0; i < 2; i++ {
		f.emit(t, 0, 0, uint64(i), 32)
	}
	for i := 0; i < 6; i++ {
		f.emit(t, 1, 0, uint64(i), 32)
	}
	recSize := len(fakeSample(payload(0, 0, 32)))
	r := f.reader(t, ReaderOptions{Budget: 4 * recSize}) // four records a turn
	var cpus []int
	for _, s := range readN(t, r, 8) {
		cpus = append(cpus, s.CPU)
	}
	// Pass 1: ring 1 (6 records) first, 4 of them; then ring 0's 2.
	// Pass 2: ring 1's last 2.
	want := []int{1, 1, 1, 1, 0, 0, 1, 1}
	if fmt.Sprint(cpus) != fmt.Sprint(want) {
		t.Errorf("drain order %v, want %v", cpus, want)
	}

	for i := 0; i < 6; i++ {
		f.emit(t, 1, 0, uint64(i), 32)
	}
	for i := 0; i < 2; i++ {
		f.emit(t, 0, 0, uint64(i), 32)
	}
	rr := f.reader(t, ReaderOptions{Budget: 4 * recSize, RoundRobin: true})
	r.Close()
	cpus = cpus[:0]
	for _, s := range readN(t, rr, 8) {
		cpus = append(cpus, s.CPU)
	}
	if want := []int{0, 0, 1, 1, 1, 1, 1, 1}; fmt.Sprint(cpus) != fmt.Sprint(want) {
		t.Errorf("round-robin order %v, want %v", cpus, want)
	}
}

// ReadInto reuses the Sample: no allocation per record.
func TestReaderReadIntoAllocs(t *testing.T) {
	f := newFakeRings(t, 2, 1<<16)
	r := f.reader(t, ReaderOptions{})
	var s Sample
	seq := uint64(0)
	rec := fakeSample(payload(0, 0, 64))
	allocs := testing.AllocsPerRun(1000, func() {
		f.rings[seq%2].mustWrite(t, rec)
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
	if err := r.Close(); err != nil {
		t.Errorf("second Close: %v", err)
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
		go func() {
			time.Sleep(20 * time.Millisecond) // let the read block first
			f.emit(t, 1, 0, 7, 16)            // and raise no wakeup
		}()
		var s Sample
		err := r.ReadInto(&s)
		if latency > 0 && err != nil {
			t.Errorf("MaxLatency %v: %v, want the record", latency, err)
		}
		// Without MaxLatency nothing looks at the ring before the
		// deadline's timeout ends the wait.
		if latency < 0 && time.Since(start) < 300*time.Millisecond {
			t.Errorf("no MaxLatency: read returned (%v) before the deadline with no wakeup", err)
		}
	}
}

// Flush delivers what the rings hold, then ErrFlushed; Close counts what
// is left as Discarded.
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
	if d := r.Stats()[0].Discarded; d != uint64(len(fakeSample(payload(0, 9, 40)))) {
		t.Errorf("discarded %d bytes at Close", d)
	}
}

// Close counts as Discarded what was not delivered, not what was delivered
// but not yet committed: a read returns in the middle of a Reader's turn,
// and an OrderedReader commits a ring once a sixteenth of it was delivered.
func TestCloseDiscardsUndelivered(t *testing.T) {
	recSize := uint64(len(fakeSample(payload(0, 0, 40))))
	for _, how := range []string{"Reader.ReadInto", "Reader.Each", "OrderedReader.ReadInto", "OrderedReader.Each"} {
		t.Run(how, func(t *testing.T) {
			f := newFakeRings(t, 2, 4096)
			var r interface {
				ReadInto(*Sample) error
				Each(context.Context, func(*Record, *Sample) error) error
				Flush()
				Close() error
				Stats() []ReaderStats
			}
			if strings.HasPrefix(how, "Reader") {
				r = f.reader(t, ReaderOptions{MaxLatency: -1})
			} else {
				r = f.ordered(t, OrderedOptions{MaxDelay: time.Hour})
			}
			for seq := uint64(0); seq < 5; seq++ {
				f.emit(t, 0, seq, seq, 40)
			}
			r.Flush()
			if strings.HasSuffix(how, "ReadInto") {
				var s Sample
				if err := r.ReadInto(&s); err != nil {
					t.Fatal(err)
				}
			} else {
				stop := errors.New("one is enough")
				if err := r.Each(context.Background(), func(*Record, *Sample) error { return stop }); err != stop {
					t.Fatal(err)
				}
			}
			r.Close()
			if d := r.Stats()[0].Discarded; d != 4*recSize {
				t.Errorf("discarded %d bytes, want the 4 records not delivered (%d)", d, 4*recSize)
			}
		})
	}
}

// Each stops when its context is cancelled; All iterates with one Sample.
func TestReaderEachAndAll(t *testing.T) {
	f := newFakeRings(t, 2, 4096)
	r := f.reader(t, ReaderOptions{MaxLatency: -1})
	for i := 0; i < 4; i++ {
		f.emit(t, i%2, 0, uint64(i), 24)
	}
	ctx, cancel := context.WithCancel(context.Background())
	n := 0
	err := r.Each(ctx, func(rec *Record, meta *Sample) error {
		if rec.Type != RecordSample || meta.CPU != n%2 && meta.CPU != 1-n%2 {
			t.Errorf("record %d: %+v", n, meta)
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
	ctx, cancel = context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	n = 0
	var lastErr error
	for s, err := range r.All(ctx) {
		if err != nil {
			lastErr = err
			continue
		}
		if binary.NativeEndian.Uint64(s.Data[8:]) != uint64(n) {
			t.Errorf("All: record %d has seq %d", n, binary.NativeEndian.Uint64(s.Data[8:]))
		}
		n++
	}
	if n != 3 || !errors.Is(lastErr, context.DeadlineExceeded) {
		t.Errorf("All: %d records, last error %v", n, lastErr)
	}
}

// Lost records come through with their count and CPU.
func TestReaderLost(t *testing.T) {
	f := newFakeRings(t, 1, 256)
	for seq := uint64(0); seq < 10; seq++ {
		f.rings[0].write(fakeSample(payload(0, seq, 40)))
	}
	f.rings[0].publish()
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
			f.rings[0].mustWrite(t, fakeSample(payload(0, 99, 8)))
		}
	}
	// Stats are published when a ring's turn ends: end it.
	r.SetDeadline(time.Now().Add(10 * time.Millisecond))
	if err := r.ReadInto(&s); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatal(err)
	}
	if st := r.Stats()[0]; st.Lost != lost || lost != 6 || st.Samples != 5 {
		t.Errorf("lost %d, stats %+v", lost, st)
	}
}

// Producers race the reader on every ring, waking it as the kernel does:
// every record arrives once, in order per ring, intact.
func TestReaderRace(t *testing.T) {
	const rings = 2
	n := 200000
	if testing.Short() || raceEnabled() {
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
				if f.rings[i].write(fakeSample(payload(0, seq, 16+rng.Intn(300)))) {
					seq++
					f.rings[i].publish()
					if seq%16 == 0 {
						f.wake(i) // like WakeupEvents 16
					}
				} else {
					f.rings[i].lost = 0 // a full ring: wait, do not lose
					f.rings[i].publish()
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
		seq := binary.NativeEndian.Uint64(s.Data[8:])
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

// The OrderedReader merges rings by key; with every ring holding records
// (rule 1), nothing waits for MaxDelay.
func TestOrderedMerge(t *testing.T) {
	for _, mode := range []string{"ReadInto", "Each"} {
		t.Run(mode, func(t *testing.T) {
			const rings, n = 3, 600
			f := newFakeRings(t, rings, 1<<15)
			rng := rand.New(rand.NewSource(1))
			var keys [rings]uint64
			for seq := 0; seq < n; seq++ {
				i := rng.Intn(rings)
				keys[i] += uint64(rng.Intn(50)) // equal keys too, across rings and within one
				f.emit(t, i, keys[i], uint64(seq), 16+rng.Intn(64))
			}
			// A last record on each ring with a key above all others lets
			// rule 1 release everything before it.
			for i := 0; i < rings; i++ {
				f.emit(t, i, 1<<40, uint64(n+i), 16)
			}
			o := f.ordered(t, OrderedOptions{MaxDelay: time.Hour})
			o.SetDeadline(time.Now().Add(10 * time.Second)) // nothing may wait on MaxDelay
			var got []Sample
			if mode == "ReadInto" {
				got = readN(t, o, n)
			} else {
				stop := errors.New("enough")
				err := o.Each(context.Background(), func(rec *Record, meta *Sample) error {
					s := *meta
					s.Data = rec.AppendTo(nil)
					if got = append(got, s); len(got) == n {
						return stop
					}
					return nil
				})
				if err != stop {
					t.Fatalf("Each: %v after %d records", err, len(got))
				}
			}
			seen := map[uint64]bool{}
			for j, s := range got {
				if j > 0 && (s.Key < got[j-1].Key || s.Late) {
					t.Fatalf("record %d: key %d after %d (late %v)", j, s.Key, got[j-1].Key, s.Late)
				}
				if s.Key != keyOf(s) {
					t.Fatalf("record %d: Key %d, payload says %d", j, s.Key, keyOf(s))
				}
				seq := binary.NativeEndian.Uint64(s.Data[8:])
				if seen[seq] {
					t.Fatalf("seq %d delivered twice", seq)
				}
				seen[seq] = true
			}
		})
	}
}

// An idle ring holds nothing back forever: a record is released after
// MaxDelay (rule 3) or once a key MaxDelay later is seen (rule 2). A
// record that then arrives behind a released key is late.
func TestOrderedIdleRingAndLate(t *testing.T) {
	for _, drop := range []bool{false, true} {
		t.Run(fmt.Sprintf("drop=%v", drop), func(t *testing.T) {
			f := newFakeRings(t, 2, 1<<14)
			o := f.ordered(t, OrderedOptions{MaxDelay: 20 * time.Millisecond, KeyWindow: 1000, DropLate: drop})
			f.emit(t, 0, 100, 0, 16)
			o.SetDeadline(time.Now().Add(10 * time.Second))
			got := readN(t, o, 1) // rule 3: after ~20 ms
			if got[0].Key != 100 {
				t.Fatalf("first key %d", got[0].Key)
			}
			f.emit(t, 0, 5000, 1, 16) // released by rule 2 once 7000 is seen
			f.emit(t, 0, 7000, 2, 16) // the newest: released by rule 3
			f.emit(t, 1, 50, 3, 16)   // behind 100, already released: late
			want, wantLate := []uint64{50, 5000, 7000}, []bool{true, false, false}
			if drop {
				want, wantLate = []uint64{5000, 7000}, []bool{false, false} // 50 dropped
			}
			var keys []uint64
			var late []bool
			for len(keys) < len(want) {
				var s Sample
				if err := o.ReadInto(&s); err != nil {
					t.Fatal(err)
				}
				keys, late = append(keys, s.Key), append(late, s.Late)
			}
			if fmt.Sprint(keys) != fmt.Sprint(want) || fmt.Sprint(late) != fmt.Sprint(wantLate) {
				t.Errorf("keys %v late %v, want %v %v", keys, late, want, wantLate)
			}
			st := o.Stats()[1]
			if st.Late != 1 || (drop && st.Dropped != 1) || (!drop && st.Dropped != 0) {
				t.Errorf("ring 1 stats %+v", st)
			}
		})
	}
}

// Rule 2 with an idle ring: the reader parses ahead of a ring's front to
// find a key KeyWindow later, and releases the front then, without waiting
// for MaxDelay; the newest record stays held.
func TestOrderedKeyWindowLookAhead(t *testing.T) {
	f := newFakeRings(t, 2, 1<<14)
	o := f.ordered(t, OrderedOptions{MaxDelay: time.Hour, KeyWindow: 1000})
	for seq, key := range []uint64{5000, 5500, 6000, 7000} {
		f.emit(t, 0, key, uint64(seq), 16)
	}
	o.SetDeadline(time.Now().Add(10 * time.Second))
	got := readN(t, o, 3) // 7000 - 1000 = 6000: everything up to 6000 goes
	for j, want := range []uint64{5000, 5500, 6000} {
		if got[j].Key != want || got[j].Late {
			t.Fatalf("record %d: key %d late %v, want %d", j, got[j].Key, got[j].Late, want)
		}
	}
	o.SetDeadline(time.Now().Add(20 * time.Millisecond))
	var s Sample
	if err := o.ReadInto(&s); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("read: key %d, %v; want 7000 held", s.Key, err)
	}
	if st := o.Stats()[0]; st.Samples != 3 || st.Late != 0 {
		t.Errorf("stats %+v", st)
	}
	// Written after the reader's last head snapshot: the look-ahead takes a
	// new one to find it.
	f.emit(t, 0, 8500, 4, 16)
	o.SetDeadline(time.Now().Add(10 * time.Second))
	if got := readN(t, o, 1); got[0].Key != 7000 {
		t.Errorf("key %d, want 7000", got[0].Key)
	}
}

// Rule 2 counts the key that ends a run of Each: the run notes it for its
// ring only, and the merge must still count it among the newest keys.
// Ring 0's run stops at 500 (beyond ring 2's 3); once ring 2 is empty, ring
// 1's 5 goes by rule 2 because of that 500, while the 500 itself waits.
func TestOrderedRunNewest(t *testing.T) {
	f := newFakeRings(t, 3, 4096)
	o := f.ordered(t, OrderedOptions{MaxDelay: time.Hour, KeyWindow: 100})
	f.emit(t, 0, 1, 0, 16)
	f.emit(t, 0, 500, 1, 16)
	f.emit(t, 1, 5, 2, 16)
	f.emit(t, 2, 3, 3, 16)
	o.SetDeadline(time.Now().Add(50 * time.Millisecond))
	var keys []uint64
	err := o.Each(context.Background(), func(rec *Record, meta *Sample) error {
		keys = append(keys, meta.Key)
		return nil
	})
	if !errors.Is(err, os.ErrDeadlineExceeded) || fmt.Sprint(keys) != "[1 3 5]" {
		t.Errorf("Each: %v, keys %v; want [1 3 5] and the deadline (500 held)", err, keys)
	}
}

// Rule 3 with an idle ring: records that the reader first saw together are
// due together, MaxDelay later, not one MaxDelay after another. And the
// marks that date them do not pile up.
func TestOrderedMaxDelayBacklog(t *testing.T) {
	f := newFakeRings(t, 2, 1<<16)
	const delay = 50 * time.Millisecond
	o := f.ordered(t, OrderedOptions{MaxDelay: delay, KeyWindow: 1 << 62})
	const n = 100
	for seq := uint64(0); seq < n; seq++ {
		f.emit(t, 0, 10+seq, seq, 24)
	}
	start := time.Now()
	o.SetDeadline(start.Add(n * delay / 2)) // one MaxDelay after another would take n*delay
	readN(t, o, n)
	if took := time.Since(start); took < delay {
		t.Errorf("released after %v, before MaxDelay %v", took, delay)
	}
	// Records written one at a time while the reader waits, each in a new
	// head snapshot: each is held MaxDelay (less the marks' grain of
	// MaxDelay/32) from when it was written, or longer. The marks that date
	// them are merged: about one per MaxDelay/32 of records waiting, where
	// there would be one per head snapshot (m of them) without merging.
	const m = 400
	const maxMarks = 32 + 8
	written := map[uint64]time.Time{}
	read := n
	check := func(s Sample) {
		read++
		seq := binary.NativeEndian.Uint64(s.Data[8:])
		if held := time.Since(written[seq]); held < delay-delay/32 {
			t.Fatalf("record %d released after %v, MaxDelay is %v", seq, held, delay)
		}
	}
	for seq := uint64(n); seq < n+m; seq++ {
		written[seq] = time.Now()
		f.emit(t, 0, 10+seq, seq, 24)
		var s Sample
		o.SetDeadline(time.Now().Add(200 * time.Microsecond))
		if err := o.ReadInto(&s); err == nil {
			check(s)
		} else if !errors.Is(err, os.ErrDeadlineExceeded) {
			t.Fatal(err)
		}
	}
	for i := range o.rs {
		if k := len(o.rs[i].marks); k > maxMarks {
			t.Errorf("ring %d holds %d marks", i, k)
		}
	}
	o.SetDeadline(time.Now().Add(10 * time.Second))
	for read < n+m {
		var s Sample
		if err := o.ReadInto(&s); err != nil {
			t.Fatal(err)
		}
		check(s)
	}
	for i := range o.rs {
		if k := len(o.rs[i].marks); k > maxMarks {
			t.Errorf("ring %d holds %d marks", i, k)
		}
	}
}

// Holding records fills rings: past HighWater the reader releases instead
// of letting the ring overflow.
func TestOrderedHighWater(t *testing.T) {
	f := newFakeRings(t, 2, 4096)
	o := f.ordered(t, OrderedOptions{MaxDelay: time.Hour, HighWater: 1024})
	seq := uint64(0)
	for f.rings[0].space() > 1024 {
		f.emit(t, 0, 10+seq, seq, 40)
		seq++
	}
	o.SetDeadline(time.Now().Add(10 * time.Second))
	got := readN(t, o, int(seq)-1024/56)
	for j := 1; j < len(got); j++ {
		if got[j].Key < got[j-1].Key {
			t.Fatalf("out of order at %d", j)
		}
	}
	if used := o.rings[0].Used(); used > 2048 {
		t.Errorf("ring still holds %d bytes after releasing past high water", used)
	}
}

// Producers on both rings with timestamps race the ordered reader: output
// is in key order, nothing lost or duplicated, late records counted.
func TestOrderedRace(t *testing.T) {
	n := 50000
	if testing.Short() || raceEnabled() {
		n = 5000
	}
	f := newFakeRings(t, 2, 1<<14)
	o := f.ordered(t, OrderedOptions{ReaderOptions: ReaderOptions{MaxLatency: time.Millisecond}, MaxDelay: 5 * time.Millisecond})
	epoch := time.Now()
	var clock sync.Mutex // keys from one clock, as bpf_ktime_get_ns
	now := func() uint64 {
		clock.Lock()
		defer clock.Unlock()
		return uint64(time.Since(epoch))
	}
	var wg sync.WaitGroup
	for i := 0; i < 2; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			for seq := uint64(0); seq < uint64(n); {
				if f.rings[i].write(fakeSample(payload(now(), seq, 24))) {
					seq++
					f.rings[i].publish()
				} else {
					f.rings[i].lost = 0
					time.Sleep(20 * time.Microsecond)
				}
			}
		}(i)
	}
	next := [2]uint64{}
	var last uint64
	late := 0
	var s Sample
	o.SetDeadline(time.Now().Add(60 * time.Second))
	for total := 0; total < 2*n; total++ {
		if err := o.ReadInto(&s); err != nil {
			t.Fatalf("after %d: %v", total, err)
		}
		seq := binary.NativeEndian.Uint64(s.Data[8:])
		if seq != next[s.CPU] {
			t.Fatalf("ring %d: seq %d, want %d", s.CPU, seq, next[s.CPU])
		}
		next[s.CPU]++
		if s.Late {
			late++
		} else {
			if s.Key < last {
				t.Fatalf("key %d after %d, not marked late", s.Key, last)
			}
			last = s.Key
		}
	}
	wg.Wait()
	st := o.Stats()
	if int(st[0].Late+st[1].Late) != late {
		t.Errorf("stats count %d late, saw %d", st[0].Late+st[1].Late, late)
	}
	t.Logf("%d records, %d late", 2*n, late)
}

// readRound publishes what the fake rings hold, flushes r and, with the
// timer running, reads until the Flush ends the round: with ReadInto into
// s, or with Each and a callback that does nothing (Each) or reads every
// byte of each sample (EachSum).
func readRound(b *testing.B, f *fakeRings, r interface {
	ReadInto(*Sample) error
	Each(context.Context, func(*Record, *Sample) error) error
	Flush()
}, mode string, s *Sample) {
	for _, ring := range f.rings {
		ring.publish()
	}
	r.Flush()
	b.StartTimer()
	switch mode {
	case "ReadInto":
		for r.ReadInto(s) == nil {
		}
	case "Each":
		r.Each(context.Background(), func(*Record, *Sample) error { return nil })
	case "EachSum":
		r.Each(context.Background(), func(rec *Record, m *Sample) error {
			if m.Type != RecordSample {
				return errStop
			}
			benchSink += sumPayload(rec.Data)
			if len(rec.Wrapped) > 0 {
				benchSink += sumPayload(rec.Wrapped)
			}
			return nil
		})
	}
}

// benchRingSize is the fake rings' size in the reader benchmarks: perfbuf's
// default (64 pages), so that two rings fit in a core's L2 cache as the
// real ones do.
const benchRingSize = 64 << 12

// BenchmarkReaderReadInto measures a Reader's cost per record over two fake
// rings already filled (no kernel): ReadInto, Each and EachSum (see
// readRound), at two sizes. The OrderedReader's benchmark uses the same
// rings and records.
func BenchmarkReaderReadInto(b *testing.B) {
	for _, mode := range []string{"ReadInto", "Each", "EachSum"} {
		for _, size := range []int{16, 64} {
			b.Run(fmt.Sprintf("%s/size=%d", mode, size), func(b *testing.B) {
				f := newFakeRings(b, 2, benchRingSize)
				r := f.reader(b, ReaderOptions{MaxLatency: -1})
				rec := fakeSample(payload(0, 0, size))
				per := (benchRingSize - 4096) / len(rec)
				var s Sample
				b.ReportAllocs()
				b.ResetTimer()
				for done := 0; done < b.N; done += 2 * per {
					b.StopTimer()
					for i := 0; i < 2*per; i++ {
						f.rings[i%2].write(rec)
					}
					readRound(b, f, r, mode, &s)
				}
				b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N), "ns/record")
			})
		}
	}
}

// Reads from several goroutines take turns: every record is delivered once,
// and Close wakes a read blocked in the wait and the reads queued behind it.
func TestReaderConcurrentReads(t *testing.T) {
	f := newFakeRings(t, 2, 1<<16)
	r := f.reader(t, ReaderOptions{MaxLatency: time.Millisecond})
	const n = 3000
	for seq := uint64(0); seq < n; seq++ {
		f.rings[seq%2].write(fakeSample(payload(0, seq, 24)))
	}
	f.rings[0].publish()
	f.rings[1].publish()
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
				seen[binary.NativeEndian.Uint64(s.Data[8:])]++
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

// BenchmarkOrderedReadInto measures the OrderedReader's cost per record over
// two filled fake rings whose keys interleave, so that rule 1 releases each
// (the Flush of each round only releases its last record): ReadInto and
// Each, at two sizes, with the rings taking turns every record (run=1, the
// merge's worst case) or every 32 (as the real drain benchmark fills them).
func BenchmarkOrderedReadInto(b *testing.B) {
	for _, mode := range []string{"ReadInto", "Each"} {
		for _, size := range []int{16, 64} {
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
	o := f.ordered(b, OrderedOptions{MaxDelay: time.Hour})
	per := (benchRingSize - 4096) / len(fakeSample(payload(0, 0, size)))
	recs := make([][]byte, 2*per)
	for i := range recs {
		recs[i] = fakeSample(payload(0, uint64(i), size))
	}
	key := uint64(0)
	var s Sample
	b.ReportAllocs()
	b.ResetTimer()
	for done := 0; done < b.N; done += 2 * per {
		b.StopTimer()
		for i, rec := range recs {
			key++
			binary.NativeEndian.PutUint64(rec[recSampleDataOff:], key)
			f.rings[i/run%2].write(rec)
		}
		readRound(b, f, o, mode, &s)
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N), "ns/record")
}

// BenchmarkOrderedManyRings measures the merge's cost per record as the
// number of rings grows (a machine's CPU count): with Each over rings of
// 64 KiB, 64-byte samples whose keys go round the busy rings one record at
// a time, so that every record is a new pick. With every ring busy, rule 1
// releases each record; with two busy, the idle rings hold it back until
// rule 2 releases it, the look-ahead having found a key KeyWindow larger.
func BenchmarkOrderedManyRings(b *testing.B) {
	for _, n := range []int{2, 8, 64} {
		for _, busy := range slices.Compact([]int{2, n}) {
			b.Run(fmt.Sprintf("rings=%d/busy=%d", n, busy), func(b *testing.B) {
				const size = 16 << 12
				f := newFakeRings(b, n, size)
				o := f.ordered(b, OrderedOptions{MaxDelay: time.Hour, KeyWindow: 64})
				rec := fakeSample(payload(0, 0, 64))
				per := (size - 4096) / len(rec) * busy
				key := uint64(0)
				var s Sample
				b.ReportAllocs()
				b.ResetTimer()
				for done := 0; done < b.N; done += per {
					b.StopTimer()
					for i := 0; i < per; i++ {
						key++
						binary.NativeEndian.PutUint64(rec[recSampleDataOff:], key)
						f.rings[i%busy].write(rec)
					}
					readRound(b, f, o, "Each", &s)
				}
				b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N), "ns/record")
			})
		}
	}
}

// A corrupt record in one ring: the OrderedReader delivers the records held
// before it intact (the ring's space is not handed back under them), skips
// the rest of that ring's snapshot (counted), and goes on with what is
// written after.
func TestOrderedCorrupt(t *testing.T) {
	f := newFakeRings(t, 2, 4096)
	o := f.ordered(t, OrderedOptions{MaxDelay: time.Hour})
	for seq := uint64(0); seq < 3; seq++ {
		f.emit(t, 0, 10+seq, seq, 200)
	}
	f.rings[0].mustWrite(t, fakeRecord(unix.PERF_RECORD_SAMPLE, 0, make([]byte, 8))) // size 0
	// Parse ahead and hold the three (ring 1 is empty: nothing releases
	// them), hitting the corrupt record.
	o.SetDeadline(time.Now().Add(20 * time.Millisecond))
	var s Sample
	if err := o.ReadInto(&s); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("read: %v, want the deadline (records held)", err)
	}
	// A producer fills whatever space the reader handed back.
	for f.rings[0].write(fakeSample(payload(0, 99, 200))) {
	}
	f.rings[0].lost = 0
	f.rings[0].publish()
	o.Flush()
	o.SetDeadline(time.Now().Add(5 * time.Second))
	got := readN(t, o, 3)
	for j, s := range got {
		if seq := binary.NativeEndian.Uint64(s.Data[8:]); seq != uint64(j) {
			t.Fatalf("record %d: seq %d: overwritten while held", j, seq)
		}
		for k := 16; k < 200; k++ {
			if s.Data[k] != byte(j)+byte(k) {
				t.Fatalf("record %d byte %d overwritten while held", j, k)
			}
		}
	}
	readFlushed(t, o) // the rest; the ring is usable again
	if st := o.Stats()[0]; st.CorruptBytes == 0 {
		t.Errorf("corrupt bytes not counted: %+v", st)
	}
	f.emit(t, 0, 1000, 7, 200)
	f.emit(t, 1, 1001, 8, 200)
	o.Flush()
	after := readN(t, o, 2)
	if after[0].Key != 1000 || after[1].Key != 1001 {
		t.Errorf("after the skip: keys %d, %d", after[0].Key, after[1].Key)
	}
}

// Reader.Each goes past a corrupt record (counted) and stops when fn closes
// the reader.
func TestReaderEachCorruptAndClose(t *testing.T) {
	f := newFakeRings(t, 1, 4096)
	r := f.reader(t, ReaderOptions{MaxLatency: -1})
	f.emit(t, 0, 0, 0, 32)
	f.rings[0].mustWrite(t, fakeRecord(unix.PERF_RECORD_SAMPLE, 12, make([]byte, 8))) // size not a multiple of 8
	r.SetDeadline(time.Now().Add(50 * time.Millisecond))
	var seqs []uint64
	err := r.Each(context.Background(), func(rec *Record, meta *Sample) error {
		seqs = append(seqs, binary.NativeEndian.Uint64(rec.Data[8:]))
		return nil
	})
	if !errors.Is(err, os.ErrDeadlineExceeded) || len(seqs) != 1 {
		t.Fatalf("Each: %v, seqs %v", err, seqs)
	}
	if st := r.Stats()[0]; st.CorruptBytes == 0 {
		t.Errorf("corrupt bytes not counted: %+v", st)
	}
	f.emit(t, 0, 0, 1, 32)
	f.emit(t, 0, 0, 2, 32)
	r.SetDeadline(time.Now().Add(5 * time.Second))
	err = r.Each(context.Background(), func(rec *Record, meta *Sample) error {
		seqs = append(seqs, binary.NativeEndian.Uint64(rec.Data[8:]))
		r.Close()
		return nil
	})
	if !errors.Is(err, os.ErrClosed) || fmt.Sprint(seqs) != "[0 1]" {
		t.Errorf("Each with Close from fn: %v, seqs %v", err, seqs)
	}
}

// A model check of the merge. Three small rings are written at random,
// with keys from one clock as timestamps are; rings fill up and lose
// samples, and ring 2's records are often stamped a while before they are
// written, as a delayed CPU's are. They are read with ReadInto and with
// Each in turns, with Flush now and then (which releases what waits), and
// with stalls in which the reader is away and the rings overflow. The key
// window and the flushes let larger keys go before ring 2's records, which
// then come late. Checked: each ring's samples come in
// its order, each once; a sample that never comes was reported lost or
// dropped as late; a sample is marked late exactly when a larger key went
// before it; the counts add up to what was written.
//
// Under rule 1 alone (no key window, no high water, no Flush until the end)
// nothing may come late: then every record is checked to go in key order.
//
// With more rings (9 here; 3 to 9 when fuzzed) the merge's heap is deeper
// and more rings are idle at a time.
func TestOrderedModel(t *testing.T) {
	for _, mode := range []string{"rules", "drop", "rule1"} {
		for _, rings := range []int{3, 9} {
			for seed := int64(1); seed <= 3; seed++ {
				t.Run(fmt.Sprintf("%s/rings=%d/seed=%d", mode, rings, seed), func(t *testing.T) {
					orderedModel(t, mode, rings, seed)
				})
			}
		}
	}
}

func orderedModel(t *testing.T, mode string, rings int, seed int64) {
	const size = 4096
	// More rings share the writes: more steps, and longer stalls, in
	// proportion, so that each ring still overflows now and then.
	steps, period := 4000*rings/3, 500*rings/3
	drop, rule1 := mode == "drop", mode == "rule1"
	opts := OrderedOptions{MaxDelay: time.Hour, KeyWindow: 500, DropLate: drop, HighWater: 3000}
	if rule1 {
		opts.KeyWindow, opts.HighWater = 1<<62, size
	}
	f := newFakeRings(t, rings, size)
	o := f.ordered(t, opts)
	rng := rand.New(rand.NewSource(seed))
	var (
		clock     uint64
		keys      = make([]uint64, rings)
		emitted   = make([]uint64, rings)          // samples written or lost
		lostSeqs  = make([]map[uint64]bool, rings) // samples that found the ring full
		want      = make([]uint64, rings)          // the next seq each ring may deliver
		delivered = make([]uint64, rings)
		lostSeen  = make([]uint64, rings) // counts of the lost records delivered
		lateSeen  int
		last      uint64 // the largest key delivered not late
		ending    bool   // the final Flush: rule 5 may release past ring 2
	)
	for i := range lostSeqs {
		lostSeqs[i] = map[uint64]bool{}
	}
	emit := func(i int, key uint64) {
		seq := emitted[i]
		emitted[i]++
		if !f.rings[i].write(fakeSample(payload(key, seq, 16))) {
			lostSeqs[i][seq] = true
		}
	}
	take := func(cpu int, typ RecordType, lost uint64, data []byte, key uint64, late bool) {
		if typ == RecordLost {
			lostSeen[cpu] += lost
			return
		}
		if k := keyOf(Sample{Data: data}); k != key {
			t.Fatalf("ring %d: Key %d, payload says %d", cpu, key, k)
		}
		seq := binary.NativeEndian.Uint64(data[8:])
		for ; want[cpu] < seq; want[cpu]++ { // skipped: lost, or dropped as late
			if !lostSeqs[cpu][want[cpu]] && !drop {
				t.Fatalf("ring %d: seq %d skipped, neither lost nor dropped", cpu, want[cpu])
			}
		}
		if seq != want[cpu] {
			t.Fatalf("ring %d: seq %d again or out of order (want %d)", cpu, seq, want[cpu])
		}
		want[cpu]++
		delivered[cpu]++
		if late != (key < last) {
			t.Fatalf("ring %d seq %d: key %d after %d, marked late %v", cpu, seq, key, last, late)
		}
		if late {
			lateSeen++
			if rule1 && !ending {
				t.Fatalf("ring %d seq %d: key %d late under rule 1 alone (after %d)", cpu, seq, key, last)
			}
		} else {
			last = key
		}
	}
	readInto := func() error {
		var s Sample
		err := o.ReadInto(&s)
		if err == nil {
			take(s.CPU, s.Type, s.Lost, s.Data, s.Key, s.Late)
		}
		return err
	}
	each := func(limit int) error {
		n := 0
		stop := errors.New("enough")
		err := o.Each(context.Background(), func(rec *Record, meta *Sample) error {
			take(meta.CPU, rec.Type, rec.Lost, rec.AppendTo(nil), meta.Key, meta.Late)
			if n++; n == limit {
				return stop
			}
			return nil
		})
		if err == stop {
			return nil
		}
		return err
	}
	drain := func() { // Flush, and read until it is done
		o.Flush()
		o.SetDeadline(time.Now().Add(10 * time.Second))
		for {
			var err error
			if rng.Intn(2) == 0 {
				err = readInto()
			} else {
				err = each(1 + rng.Intn(50))
			}
			if errors.Is(err, ErrFlushed) {
				return
			}
			if err != nil {
				t.Fatal(err)
			}
		}
	}
	for step := 0; step < steps; step++ {
		r := rng.Intn(100)
		if step%period >= period*4/5 {
			r %= 60 // a stall: the reader is away and the rings fill up
		}
		switch {
		case r < 60: // write a burst on one ring
			i := rng.Intn(rings)
			for n := 1 + rng.Intn(8); n > 0; n-- {
				clock += uint64(1 + rng.Intn(8))
				stamp := clock
				if i == 2 && rng.Intn(3) == 0 {
					stamp -= min(stamp, uint64(rng.Intn(800))) // the window is 500
				}
				keys[i] = max(keys[i], stamp) // a CPU's own records stay in order
				emit(i, keys[i])
			}
			f.rings[i].publish()
		case r < 95: // read what the release rule lets go now
			o.SetDeadline(time.Now()) // deliver what may go, then stop
			for {
				var err error
				if rng.Intn(2) == 0 {
					err = readInto()
				} else {
					err = each(1 + rng.Intn(20))
				}
				if errors.Is(err, os.ErrDeadlineExceeded) {
					break
				}
				if err != nil {
					t.Fatal(err)
				}
			}
		default:
			if !rule1 {
				drain()
			}
		}
	}
	// The end: deliver everything, then a last sample on each ring brings
	// the lost counts still pending (the kernel writes a lost record only
	// once a sample fits again).
	ending = true
	drain()
	for i := 0; i < rings; i++ {
		keys[i] = 1 << 60
		emit(i, keys[i])
		f.rings[i].publish()
	}
	drain()
	st := o.Stats()
	total, lostAll := 0, 0
	for i := 0; i < rings; i++ {
		lostAll += len(lostSeqs[i])
		lost := uint64(len(lostSeqs[i]))
		if lostSeen[i] != lost || st[i].Lost != lost {
			t.Errorf("ring %d: %d samples lost, lost records say %d, stats %d", i, lost, lostSeen[i], st[i].Lost)
		}
		if delivered[i]+lost+st[i].Dropped != emitted[i] || st[i].Samples != delivered[i]+st[i].Dropped {
			t.Errorf("ring %d: %d delivered + %d lost + %d dropped != %d written (stats %+v)",
				i, delivered[i], lost, st[i].Dropped, emitted[i], st[i])
		}
		total += int(emitted[i])
	}
	var late uint64
	for _, s := range st {
		late += s.Late
	}
	if drop && lateSeen != 0 || !drop && int(late) != lateSeen {
		t.Errorf("%d delivered late; stats count %d late", lateSeen, late)
	}
	t.Logf("%d written, %d lost, %d delivered late, %d late in all", total, lostAll, lateSeen, late)
	if lostAll == 0 || late == 0 && !rule1 {
		t.Error("the model lost nothing or had nothing late: it tests less than it should")
	}
}

// FuzzOrderedModel runs the model check of TestOrderedModel with seeds the
// fuzzer picks, in each of its modes: mode%3 picks the mode and mode/3 the
// number of rings, 3 to 9.
func FuzzOrderedModel(f *testing.F) {
	f.Add(int64(1), uint8(0))
	f.Add(int64(7), uint8(2))
	f.Add(int64(3), uint8(3*6+1))
	modes := []string{"rules", "drop", "rule1"}
	f.Fuzz(func(t *testing.T, seed int64, mode uint8) {
		orderedModel(t, modes[int(mode)%len(modes)], 3+int(mode)/len(modes)%7, seed)
	})
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
		done <- r.Each(ctx, func(*Record, *Sample) error { return nil })
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
	for _, kind := range []string{"Reader", "OrderedReader"} {
		t.Run(kind, func(t *testing.T) {
			f := newFakeRings(t, 1, 1<<16)
			var r interface {
				ReadInto(*Sample) error
				Flush()
				SetDeadline(time.Time)
			}
			if kind == "Reader" {
				r = f.reader(t, ReaderOptions{MaxLatency: -1})
			} else {
				r = f.ordered(t, OrderedOptions{MaxDelay: time.Hour})
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
// tail) gets a turn, so that the Reader skips it (counted), and a Flush
// then completes. It used to get none (nothing pending after Begin): the
// ring stayed stuck, nothing was counted, and a read during a Flush spun
// past its deadline.
func TestReaderBadHead(t *testing.T) {
	f := newFakeRings(t, 1, 1024)
	f.emit(t, 0, 0, 0, 16)
	atomic.StoreUint64(&f.rings[0].page.Data_head, 4096) // tail 0: more than the ring
	r := f.reader(t, ReaderOptions{MaxLatency: time.Millisecond})
	r.SetDeadline(time.Now().Add(30 * time.Millisecond))
	var s Sample
	err := r.ReadInto(&s)
	if !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("first read: %v", err)
	}
	st := r.Stats()[0]
	t.Logf("after a read: stats %+v, tail %d", st, f.rings[0].page.Data_tail)

	r.Flush()
	r.SetDeadline(time.Now().Add(100 * time.Millisecond))
	done := make(chan error, 1)
	go func() { done <- r.ReadInto(&s) }()
	select {
	case err := <-done:
		t.Logf("read after Flush: %v", err)
	case <-time.After(2 * time.Second):
		r.Close() // ends the spinning read
		<-done
		t.Fatalf("ReadInto after Flush still running 2s on, 1.9s past its deadline (CorruptBytes %d)", st.CorruptBytes)
	}
	if st.CorruptBytes == 0 {
		t.Errorf("invalid head never skipped: CorruptBytes 0, tail %d", f.rings[0].page.Data_tail)
	}
}

// A context cancelled as the read returns: the wake it triggers may run
// after Close has freed the waiter, so it must go through the lifetime
// (poke) and do nothing then. It used to write to the closed eventfd's
// number; the race detector sees that (make test runs with -race).
func TestEachCtxCancelRacesClose(t *testing.T) {
	if !raceEnabled() {
		t.Skip("shows a data race: needs -race")
	}
	for k := 0; k < 200; k++ {
		f := newFakeRings(t, 1, 4096)
		r := f.reader(t, ReaderOptions{MaxLatency: -1})
		ctx, cancel := context.WithCancel(context.Background())
		go cancel()
		_ = r.Each(ctx, func(*Record, *Sample) error { return nil })
		r.Close()
	}
}

// The OrderedReader's MaxFill counts the records already waiting in a ring
// when the reader is created (its first head snapshot).
func TestOrderedMaxFillAtStart(t *testing.T) {
	f := newFakeRings(t, 2, 4096)
	for seq := uint64(0); seq < 5; seq++ {
		f.emit(t, 0, 10+seq, seq, 40)
	}
	want := int(f.rings[0].head)
	o := f.ordered(t, OrderedOptions{MaxDelay: time.Hour})
	o.Flush()
	o.SetDeadline(time.Now().Add(5 * time.Second))
	if n := readFlushed(t, o); n != 5 {
		t.Fatalf("flushed %d records", n)
	}
	if st := o.Stats()[0]; st.MaxFill < want {
		t.Errorf("MaxFill %d, but %d bytes were waiting in the ring", st.MaxFill, want)
	}
}

// After data_head moved backwards (a corrupt head, resynchronised by
// SkipCorrupt), the OrderedReader's look-ahead starts again from the
// cursor. It used to resume where it had scanned to, beyond the new head,
// and parse unpublished memory with no bound: garbage there made it panic.
func TestOrderedHeadBackwards(t *testing.T) {
	f := newFakeRings(t, 2, 1024)
	o := f.ordered(t, OrderedOptions{MaxDelay: time.Hour, KeyWindow: 1 << 62})
	for seq := uint64(0); seq < 4; seq++ {
		f.emit(t, 0, 10+seq, seq, 16) // 32-byte records at 0, 32, 64, 96
	}
	// Garbage past the head (never published): a sample whose sizes do not
	// fit the 1024-byte ring.
	bad := f.rings[0].data[128:]
	binary.NativeEndian.PutUint32(bad[0:], unix.PERF_RECORD_SAMPLE)
	binary.NativeEndian.PutUint16(bad[6:], 65528)
	binary.NativeEndian.PutUint32(bad[8:], 65000)

	read := func(d time.Duration) (err error) {
		defer func() {
			if p := recover(); p != nil {
				err = fmt.Errorf("panic: %v", p)
			}
		}()
		o.SetDeadline(time.Now().Add(d))
		var s Sample
		return o.ReadInto(&s)
	}
	if err := read(20 * time.Millisecond); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("read 1: %v", err) // front 10 held, look-ahead scanned to 128
	}
	page := &f.rings[0].page.Data_head
	atomic.StoreUint64(page, 64) // head moves backwards (corrupt)
	if err := read(20 * time.Millisecond); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("read 2: %v", err)
	}
	o.Flush()
	if err := read(time.Second); err != nil {
		t.Fatalf("read 3: %v", err) // key 10 by rule 5
	}
	if err := read(time.Second); !errors.Is(err, ErrFlushed) {
		t.Fatalf("read 4: %v", err) // SkipCorrupt to 64
	}
	atomic.StoreUint64(page, 96) // a valid head again
	if err := read(20 * time.Millisecond); err != nil && !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("read 5: %v", err)
	}
}

// The OrderedReader counts lost samples as it delivers their lost record,
// as it counts samples: not when its look-ahead parses the record, while a
// sample before it is still held.
func TestOrderedLostCountedWhenDelivered(t *testing.T) {
	f := newFakeRings(t, 2, 4096)
	o := f.ordered(t, OrderedOptions{MaxDelay: time.Hour, KeyWindow: 1 << 62})
	f.emit(t, 0, 10, 0, 16)
	f.rings[0].mustWrite(t, fakeLost(0, 7))
	f.emit(t, 0, 20, 1, 16)
	// Ring 1 is empty: the 10 is held, and the look-ahead (rule 2) parses
	// the lost record behind it.
	o.SetDeadline(time.Now().Add(20 * time.Millisecond))
	var s Sample
	if err := o.ReadInto(&s); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("read: key %d, %v; want the 10 held", s.Key, err)
	}
	if st := o.Stats()[0]; st.Lost != 0 || st.Samples != 0 {
		t.Errorf("nothing delivered, stats count %d lost, %d samples", st.Lost, st.Samples)
	}
	o.Flush()
	o.SetDeadline(time.Now().Add(5 * time.Second))
	if n := readFlushed(t, o); n != 3 {
		t.Fatalf("flushed %d records, want 3", n)
	}
	if st := o.Stats()[0]; st.Lost != 7 || st.Samples != 2 {
		t.Errorf("all delivered, stats count %d lost, %d samples; want 7, 2", st.Lost, st.Samples)
	}
}

// A blocked OrderedReader waits for the smallest front to be due (rule 3),
// the only one that can go next. It used to take the earliest due time of
// every front, so once a larger key was due it spun until the smallest was.
func TestOrderedWaitsForTheSmallest(t *testing.T) {
	f := newFakeRings(t, 3, 4096) // ring 2 stays idle: rule 1 never applies
	const delay = 200 * time.Millisecond
	o := f.ordered(t, OrderedOptions{MaxDelay: delay, KeyWindow: 1 << 62, ReaderOptions: ReaderOptions{MaxLatency: -1}})
	start := time.Now()
	f.emit(t, 1, 20, 0, 16)
	var s Sample
	o.SetDeadline(time.Now().Add(10 * time.Millisecond))
	if err := o.ReadInto(&s); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatal(err) // ring 1's 20 seen at ~0
	}
	time.Sleep(100*time.Millisecond - time.Since(start))
	f.emit(t, 0, 10, 1, 16) // a smaller key, seen at ~100 ms: due at ~300 ms
	o.SetDeadline(start.Add(290 * time.Millisecond))
	cpu0 := cpuTime(t)
	wall0 := time.Now()
	err := o.ReadInto(&s)
	cpu, wall := cpuTime(t)-cpu0, time.Since(wall0)
	if !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("read: key %d, %v", s.Key, err)
	}
	if cpu > wall/3 {
		t.Errorf("blocked read used %v of CPU in %v (busy-waiting)", cpu, wall)
	}
}

func cpuTime(t *testing.T) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		t.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
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
		ring := newFakeRingAt(size, uint64(rnd.Intn(size/8))*8+uint64(rnd.Intn(3))*uint64(size))
		tail := ring.head
		for seq := 0; ; seq++ {
			var rec []byte
			switch k := rnd.Intn(10); {
			case k == 0:
				rec = fakeLost(uint64(seq), uint64(rnd.Intn(100)+1))
			case k == 1:
				rec = fakeRecord(unix.PERF_RECORD_THROTTLE, 16, make([]byte, 8))
			default:
				rec = fakeSample(payload(0, uint64(seq), rnd.Intn(300)))
			}
			if !ring.write(rec) {
				break
			}
		}
		ring.publish()
		f.rings[i] = ring
		var corrupt bool
		want[i], _, corrupt = refParse(bytes.Clone(ring.data), tail, ring.head)
		if corrupt {
			t.Fatal("the reference finds a valid ring corrupt")
		}
	}
	return f, want
}

// TestReaderMatchesReference: whatever the mix of records, Reader.Each and
// ReadInto deliver from each ring exactly what the reference parser reads
// there, in order, and count it: plain samples through Each's batched loop,
// the others (samples that wrap, lost and other records) through Next,
// across the ends of budgets, with an fn that stops Each now and then.
func TestReaderMatchesReference(t *testing.T) {
	errPause := errors.New("pause")
	for seed := 0; seed < 60; seed++ {
		for _, mode := range []string{"Each", "ReadInto"} {
			rnd := rand.New(rand.NewSource(int64(seed)))
			f, ref := refRings(t, rnd, []int{512, 1024, 4096}[seed%3])
			// The readers skip records of other types, counting them.
			want, other := make([][]refRecord, len(ref)), make([]uint64, len(ref))
			for i, recs := range ref {
				for _, w := range recs {
					if w.typ == RecordOther {
						other[i]++
					} else {
						want[i] = append(want[i], w)
					}
				}
			}
			budget := []int{0, 1, 24, 100, 700}[seed%5]
			r := f.reader(t, ReaderOptions{Budget: budget, MaxLatency: -1})
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
			case "Each":
				pause := rnd.Intn(20) + 1
				for err == nil || err == errPause {
					n := 0
					err = r.Each(context.Background(), func(rec *Record, meta *Sample) error {
						if meta.Type != rec.Type || meta.Lost != rec.Lost {
							t.Fatalf("meta %+v for a %v record (lost %d)", meta, rec.Type, rec.Lost)
						}
						add(meta.CPU, rec.Type, rec, rec.AppendTo(nil), rec.Lost)
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
				if s := st[i]; s.Samples != samples || s.Bytes != nbytes || s.Lost != lost || s.Other != other[i] {
					t.Fatalf("seed %d %s: ring %d stats %+v; reference %d samples, %d bytes, %d lost, %d other", seed, mode, i, s, samples, nbytes, lost, other[i])
				}
			}
		}
	}
}

// A turn ends once it has read Budget bytes, in every read form, also when
// Each is stopped by its fn within a turn and called again: three records
// a turn here, the rings taking turns.
func TestReaderTurnsAcrossPauses(t *testing.T) {
	rec := fakeSample(payload(0, 0, 40))
	for _, mode := range []string{"ReadInto", "Each"} {
		for pause := 1; pause <= 7; pause++ {
			f := newFakeRings(t, 2, 4096)
			for seq := 0; seq < 9; seq++ {
				f.rings[0].mustWrite(t, rec)
				f.rings[1].mustWrite(t, rec)
			}
			r := f.reader(t, ReaderOptions{Budget: 3*len(rec) - 1, MaxLatency: -1})
			r.Flush()
			var cpus []int
			var err error
			switch mode {
			case "ReadInto":
				var s Sample
				for err = r.ReadInto(&s); err == nil; err = r.ReadInto(&s) {
					cpus = append(cpus, s.CPU)
				}
			case "Each":
				errPause := errors.New("pause")
				for err = errPause; err == errPause; {
					n := 0
					err = r.Each(context.Background(), func(_ *Record, meta *Sample) error {
						cpus = append(cpus, meta.CPU)
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

// OrderedReader.Each looks at ctx at least every 256 records, also within
// a run (a ring's records that go one after the other by rule 1): a
// context cancelled from fn ends Each before 256 more records.
func TestOrderedEachRunChecksContext(t *testing.T) {
	f := newFakeRings(t, 2, 1<<16)
	const n = 600
	for seq := uint64(0); seq < n; seq++ {
		f.emit(t, 0, 1+seq, seq, 16)
	}
	f.emit(t, 1, 1<<40, 0, 16) // the other ring's front lies beyond them all: one run
	o := f.ordered(t, OrderedOptions{KeyOffset: 0})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	got := 0
	err := o.Each(ctx, func(rec *Record, meta *Sample) error {
		if got++; got == 10 {
			cancel()
		}
		return nil
	})
	if !errors.Is(err, context.Canceled) || got >= 10+256 {
		t.Fatalf("Each: %v after %d records; want context.Canceled within 256 records of the cancel", err, got)
	}
}

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

// A read called from inside an Each function or an All loop fails with
// ErrReentrant: it used to wait for the read running it, forever.
func TestReadFromCallbackReentrant(t *testing.T) {
	type reader interface {
		ReadInto(*Sample) error
		Read() (*Sample, error)
		Each(context.Context, func(*Record, *Sample) error) error
		All(context.Context) iter.Seq2[*Sample, error]
	}
	for _, ordered := range []bool{false, true} {
		f := newFakeRings(t, 2, 4096)
		var r reader
		if ordered {
			r = f.ordered(t, OrderedOptions{})
		} else {
			r = f.reader(t, ReaderOptions{})
		}
		nested := map[string]func() error{
			"ReadInto": func() error { var s Sample; return r.ReadInto(&s) },
			"Read":     func() error { _, err := r.Read(); return err },
			"Each": func() error {
				return r.Each(context.Background(), func(*Record, *Sample) error { return nil })
			},
		}
		for name, call := range nested {
			f.emit(t, 0, 1, 1, 16)
			f.emit(t, 1, 2, 2, 16)
			r.(interface{ Flush() }).Flush()
			var got error
			within(t, fmt.Sprintf("ordered %v: %s inside Each", ordered, name), func() {
				r.Each(context.Background(), func(*Record, *Sample) error {
					got = call()
					return errStop
				})
			})
			if !errors.Is(got, ErrReentrant) {
				t.Errorf("ordered %v: %s inside Each: %v, want ErrReentrant", ordered, name, got)
			}
			within(t, fmt.Sprintf("ordered %v: %s inside All", ordered, name), func() {
				for _, err := range r.All(context.Background()) {
					if err == nil {
						got = call()
					}
					break
				}
			})
			if !errors.Is(got, ErrReentrant) {
				t.Errorf("ordered %v: %s inside All: %v, want ErrReentrant", ordered, name, got)
			}
		}
		// Another goroutine's read still waits for the one in progress.
		r.(interface{ Close() error }).Close()
		f = newFakeRings(t, 2, 4096)
		if ordered {
			r = f.ordered(t, OrderedOptions{})
		} else {
			r = f.reader(t, ReaderOptions{})
		}
		f.emit(t, 0, 10, 10, 16)
		f.emit(t, 1, 11, 11, 16)
		started, release := make(chan struct{}), make(chan struct{})
		go r.Each(context.Background(), func(*Record, *Sample) error {
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

// Each with a nil function fails with ErrInvalidOptions: it used to panic.
func TestEachNilFunc(t *testing.T) {
	f := newFakeRings(t, 1, 4096)
	f.emit(t, 0, 1, 1, 16)
	if err := f.reader(t, ReaderOptions{}).Each(context.Background(), nil); !errors.Is(err, ErrInvalidOptions) {
		t.Errorf("Reader.Each(nil): %v, want ErrInvalidOptions", err)
	}
	f = newFakeRings(t, 1, 4096)
	f.emit(t, 0, 1, 1, 16)
	if err := f.ordered(t, OrderedOptions{}).Each(context.Background(), nil); !errors.Is(err, ErrInvalidOptions) {
		t.Errorf("OrderedReader.Each(nil): %v, want ErrInvalidOptions", err)
	}
}

// Past the deadline, a read delivers what it can without waiting, then
// fails: a Reader every record in the rings, an OrderedReader those its
// release rule lets go, not one it holds back (see SetDeadline).
func TestDeadlinePastDeliversWhatIsReady(t *testing.T) {
	for _, ordered := range []bool{false, true} {
		f := newFakeRings(t, 2, 4096)
		var r interface {
			ReadInto(*Sample) error
			SetDeadline(time.Time)
		}
		if ordered {
			r = f.ordered(t, OrderedOptions{MaxDelay: time.Hour})
		} else {
			r = f.reader(t, ReaderOptions{})
		}
		f.emit(t, 0, 5, 1, 16)
		f.emit(t, 0, 7, 2, 16)
		f.emit(t, 1, 6, 3, 16)
		r.SetDeadline(time.Now().Add(-time.Second))
		want := 3 // Reader: all
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

// Both readers skip records of types other than sample and lost, as
// Sample.Type promises, and count them in Stats().Other. (They were handed
// out as RecordOther.)
func TestReadersSkipOtherRecords(t *testing.T) {
	for _, ordered := range []bool{false, true} {
		f := newFakeRings(t, 1, 1<<12)
		var r interface {
			ReadInto(*Sample) error
			Flush()
			Stats() []ReaderStats
		}
		if ordered {
			r = f.ordered(t, OrderedOptions{})
		} else {
			r = f.reader(t, ReaderOptions{})
		}
		f.emit(t, 0, 1, 0, 16)
		f.rings[0].mustWrite(t, fakeRecord(unix.PERF_RECORD_THROTTLE, 16, make([]byte, 8)))
		f.rings[0].mustWrite(t, fakeRecord(unix.PERF_RECORD_UNTHROTTLE, 16, make([]byte, 8)))
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
		if st := r.Stats()[0]; st.Other != 2 || st.Samples != 2 {
			t.Errorf("ordered %v: stats %+v, want 2 samples and 2 other", ordered, st)
		}
	}
}
