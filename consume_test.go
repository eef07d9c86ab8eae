// SPDX-License-Identifier: Apache-2.0

package perfbuf

// Tests of the reads that do not wait (Reader.Consume), of what the
// options refuse, and of Poll's timeout when goroutines Poll together.

import (
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/perfbuf/perfbuf/internal/ringtest"
)

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
	if st := r.Stats(); st[0].Samples+st[1].Samples != 6 || st[0].Fill != 0 || st[1].Fill != 0 {
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
	forms := map[string]func(t *testing.T, f *fakeRings) (func() []Stats, error){
		"Consume": func(t *testing.T, f *fakeRings) (func() []Stats, error) {
			pb := f.perfBuffer(t, func(int, []byte) {}, nil)
			_, err := pb.Consume()
			return pb.Stats, err
		},
		"Drain": func(t *testing.T, f *fakeRings) (func() []Stats, error) {
			b := newRawBuffer(f.perf(t)[0], nil)
			_, err := b.Drain(func(*Record) error { return nil })
			if err != nil {
				b.SkipCorrupt()
			}
			return func() []Stats { return []Stats{b.Stats()} }, err
		},
	}
	// After a Flush too: the Reader and the ordered Reader used to find the
	// flush done (the tail past its head) without a look at the ring.
	for _, pol := range []string{"fullest", "ordered", "fullest+Flush", "ordered+Flush"} {
		for _, mode := range []string{"ReadInto", "ReadBatch", "Each", "Consume"} {
			forms[pol+"/"+mode] = func(t *testing.T, f *fakeRings) (func() []Stats, error) {
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
			if st := stats()[0]; st.Corrupt != 1 {
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
			for _, st := range r.Stats() {
				samples, lost = samples+st.Samples, lost+st.Lost
			}
			if samples != 40 || lost != 5 {
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
		for _, mode := range []string{"ReadInto", "ReadBatch", "Each", "Consume"} {
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
				if st := r.Stats()[0]; st.Corrupt != 1 {
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
	case "Each":
		err = r.Each(context.Background(), func(*Record) error { return nil })
	case "Consume":
		_, err = r.Consume(func(*Record) error { return nil })
	}
	return err
}
