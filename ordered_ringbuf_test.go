// SPDX-License-Identifier: Apache-2.0

package perfbuf

// Tests of the ordered Reader over BPF ring buffers (policy.NewWindow): the
// records copied out into a window, each ring committed up to its oldest
// copy not delivered; the release rules over copies; the ledger with
// records held.

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand"
	"os"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/perfbuf/perfbuf/internal/ringtest"
)

// ordered returns an ordered Reader over the fake ring buffers, closed when
// the test ends; oneWriter[i] says ring i is one CPU's (rule 1).
func (f *fakeBPFRings) ordered(t testing.TB, ord Order, oneWriter ...bool) *Reader {
	t.Helper()
	p, err := (&ReaderOptions{Order: &ord}).plan()
	if err != nil {
		t.Fatal(err)
	}
	r := newReader(f.core(t, oneWriter...), p)
	t.Cleanup(func() { r.Close() })
	return r
}

// emit outputs a sample with key and seq (16 bytes, then size-16 more) to
// ring i.
func (f *fakeBPFRings) emit(t testing.TB, i int, key, seq uint64, size int) {
	t.Helper()
	f.rings[i].Output(t, payload(key, seq, size))
}

// flushAll flushes o and returns what it reads until ErrFlushed.
func flushAll(t *testing.T, o *Reader) []Sample {
	t.Helper()
	o.SetDeadline(time.Now().Add(10 * time.Second))
	o.Flush()
	var got []Sample
	for {
		var s Sample
		err := o.ReadInto(&s)
		if errors.Is(err, ErrFlushed) {
			return got
		}
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, s)
	}
}

// readReleased reads what o releases, each read given wait to deliver,
// until one delivers nothing.
func readReleased(t *testing.T, o *Reader, wait time.Duration) []Sample {
	t.Helper()
	var got []Sample
	for {
		o.SetDeadline(time.Now().Add(wait))
		var s Sample
		err := o.ReadInto(&s)
		if errors.Is(err, os.ErrDeadlineExceeded) {
			return got
		}
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, s)
	}
}

// keys returns the samples' keys.
func keys(got []Sample) []uint64 {
	var k []uint64
	for _, s := range got {
		k = append(k, s.Key)
	}
	return k
}

// A ring buffer written by several CPUs holds its records in the order they
// were reserved: the window sorts them (here released by rule 3).
func TestOrderedRingBufSorts(t *testing.T) {
	f := newFakeBPFRings(t, 1, 4096)
	o := f.ordered(t, Order{MaxDelay: 20 * time.Millisecond})
	for seq, key := range []uint64{50, 30, 40, 10, 20} {
		f.emit(t, 0, key, uint64(seq), 16)
	}
	o.SetDeadline(time.Now().Add(10 * time.Second))
	got := readN(t, o, 5)
	if fmt.Sprint(keys(got)) != "[10 20 30 40 50]" {
		t.Fatalf("keys %v", keys(got))
	}
	for _, s := range got {
		if s.Late || s.Key != keyOf(s) {
			t.Fatalf("sample %+v", s)
		}
	}
}

// Rule 1 over rings of one CPU each: a key goes as soon as every ring has
// shown one at least as large, without waiting for MaxDelay; over a shared
// ring it does not apply.
func TestOrderedRingBufOneWriter(t *testing.T) {
	for _, one := range []bool{true, false} {
		t.Run(fmt.Sprintf("oneWriter=%v", one), func(t *testing.T) {
			f := newFakeBPFRings(t, 2, 4096)
			o := f.ordered(t, Order{MaxDelay: time.Hour}, one, one)
			for seq, key := range []uint64{1, 3, 5} {
				f.emit(t, 0, key, uint64(seq), 16)
			}
			for seq, key := range []uint64{2, 4} {
				f.emit(t, 1, key, uint64(10+seq), 16)
			}
			got := readReleased(t, o, 100*time.Millisecond)
			want := "[1 2 3 4]" // 5 waits for ring 1 to show a key >= 5
			if !one {
				want = "[]"
			}
			if fmt.Sprint(keys(got)) != want {
				t.Fatalf("keys %v, want %s", keys(got), want)
			}
			if !one {
				return
			}
			f.emit(t, 1, 6, 20, 16)
			o.SetDeadline(time.Now().Add(10 * time.Second))
			if got := readN(t, o, 1); got[0].Key != 5 {
				t.Fatalf("then key %d", got[0].Key)
			}
		})
	}
}

// The records the window holds keep their ring's space up to the oldest
// not delivered: a reader killed holding them leaves them in the ring for
// the next one (docs/failures.md). The kernel raises no wakeup meanwhile,
// and the read still returns by its deadline (it neither spins nor
// sleeps past it); once the copies keep more than half the ring, rule 4
// releases them, so that the ring never fills behind held records.
func TestOrderedRingBufKeepsSpaceOfCopies(t *testing.T) {
	f := newFakeBPFRings(t, 1, 4096)
	o := f.ordered(t, Order{MaxDelay: time.Hour})
	// Twice the ring's size in all, every record held by rules 1 to 3
	// (one shared ring: only rule 3, an hour, would release one), and
	// read every 16 records, 384 bytes, before the ring is an eighth full
	// (rule 4's hot ring).
	const n = 2 * 4096 / 32
	seen := map[uint64]bool{}
	for seq := range uint64(n) {
		if seq%16 == 0 {
			o.SetDeadline(time.Now().Add(20 * time.Millisecond))
			for {
				var s Sample
				err := o.ReadInto(&s)
				if errors.Is(err, os.ErrDeadlineExceeded) {
					break
				}
				if err != nil || seen[s.Key] {
					t.Fatalf("read: %v, %+v (again: %v)", err, s, seen[s.Key])
				}
				seen[s.Key] = true
			}
			if c := f.rings[0].Pos[0]; seq == 16 && c != 0 {
				t.Fatalf("after the read: consumer_pos %d; want 0, the oldest copy's", c)
			}
		}
		f.emit(t, 0, n-seq, seq, 16) // (keys falling: all of them held; fails when the ring has no room)
	}
	if len(seen) == 0 {
		t.Fatal("rule 4 released nothing: the ring could not have filled")
	}
	for _, s := range flushAll(t, o) {
		if seen[s.Key] {
			t.Fatalf("key %d delivered twice", s.Key)
		}
		seen[s.Key] = true
	}
	if len(seen) != n {
		t.Fatalf("delivered %d of %d", len(seen), n)
	}
	if c, p := f.rings[0].Pos[0], f.rings[0].Pos[1]; c != p {
		t.Fatalf("after the flush: consumer_pos %d, producer_pos %d", c, p)
	}
}

// A blocked ordered Reader whose window holds copies waits: their ring's
// consumer_pos stays at the oldest copy, so the kernel would wake no one
// for the ring's next records, and the read sleeps on its timers (here its
// deadline) rather than read again and again. The spin is seen in the CPU
// time of the reading thread alone (see TestOrderedWaitsForTheSmallest).
func TestOrderedRingBufHeldWaits(t *testing.T) {
	hostScheduled(t)
	for _, latency := range []time.Duration{0, -1} {
		t.Run(fmt.Sprintf("MaxLatency=%v", latency), func(t *testing.T) {
			f := newFakeBPFRings(t, 1, 4096)
			o := f.reader(t, ReaderOptions{MaxLatency: latency, Order: &Order{MaxDelay: time.Hour}})
			for seq, key := range []uint64{30, 10, 20} {
				f.emit(t, 0, key, uint64(seq), 16)
			}
			runtime.LockOSThread() // the read runs on this thread: its CPU time is the read's
			defer runtime.UnlockOSThread()
			o.SetDeadline(time.Now().Add(100 * time.Millisecond))
			cpu0, wall0 := threadCPU(), time.Now()
			var s Sample
			err := o.ReadInto(&s)
			cpu, wall := threadCPU()-cpu0, time.Since(wall0)
			if !errors.Is(err, os.ErrDeadlineExceeded) {
				t.Fatalf("read: key %d, %v; want the copies held", s.Key, err)
			}
			if c := f.rings[0].Pos[0]; c != 0 {
				t.Fatalf("consumer_pos %d; want 0, the oldest copy's", c)
			}
			if cpu > wall/3 {
				t.Errorf("blocked read used %v of its thread's CPU in %v (busy-waiting)", cpu, wall)
			}
		})
	}
}

// A full window releases its smallest key early rather than lose a record
// (rule 4): a record that comes later with a smaller key is Late, counted,
// and delivered; the ledger is exact.
func TestOrderedRingBufWindowFull(t *testing.T) {
	f := newFakeBPFRings(t, 1, 4096)
	// 16-byte payloads take 16 bytes of the window each: 4 fit.
	o := f.ordered(t, Order{MaxDelay: time.Hour, HighWater: 64})
	for seq, key := range []uint64{10, 20, 30, 40, 50, 5} {
		f.emit(t, 0, key, uint64(seq), 16)
	}
	o.SetDeadline(time.Now().Add(10 * time.Second))
	got := readN(t, o, 2)
	if fmt.Sprint(keys(got)) != "[10 20]" || got[0].Late || got[1].Late {
		t.Fatalf("early: %v", got)
	}
	o.Flush()
	n := readFlushed(t, o)
	st := o.Stats()[0]
	if n != 4 || st.Samples != 6 || st.Late != 1 || st.Left != 0 {
		t.Fatalf("flushed %d, stats %+v", n, st)
	}
}

// A burst that came while the reader waited is copied and ordered, however
// full it left the ring: the hot ring is for a reader the producers outpace.
func TestOrderedRingBufBurstOrdered(t *testing.T) {
	f := newFakeBPFRings(t, 1, 4096)
	o := f.ordered(t, Order{MaxDelay: 20 * time.Millisecond})
	want := burstKeys(40) // 2,880 bytes of 4,096
	for seq, key := range want {
		f.emit(t, 0, key, uint64(seq), 64)
	}
	o.SetDeadline(time.Now().Add(10 * time.Second))
	inOrder(t, readN(t, o, len(want)), want)
}

// burstKeys returns n keys as two CPUs' records come in one ring buffer,
// each second one 15 below its place: 100, 95, 120, 115, ...
func burstKeys(n int) []uint64 {
	var k []uint64
	for seq := range uint64(n) {
		key := 100 + seq*10
		if seq%2 == 1 {
			key -= 15
		}
		k = append(k, key)
	}
	return k
}

// inOrder fails the test unless got holds the keys of want sorted, none
// Late.
func inOrder(t *testing.T, got []Sample, want []uint64) {
	t.Helper()
	for _, s := range got {
		if s.Late {
			t.Fatalf("late: %v", keys(got))
		}
	}
	sorted := slices.Sorted(slices.Values(want))
	if fmt.Sprint(keys(got)) != fmt.Sprint(sorted) {
		t.Fatalf("keys %v\nwant %v", keys(got), sorted)
	}
}

// A burst that came below the ring's wakeup threshold while the reader was
// parked (commits that raised no wakeup), found when the wait timed out:
// the reader waited, so the burst is copied and ordered, not read hot. A
// wait that returned at once because the ring had moved would have made
// the ring hot.
func TestOrderedRingBufBurstWithoutWakeup(t *testing.T) {
	f := newFakeBPFRings(t, 1, 4096)
	o := f.ordered(t, Order{MaxDelay: 20 * time.Millisecond})
	type result struct {
		s   Sample
		err error
	}
	done := make(chan result, 1)
	o.SetDeadline(time.Now().Add(300 * time.Millisecond))
	go func() {
		var s Sample
		err := o.ReadInto(&s)
		done <- result{s, err}
	}()
	for w := o.r.C.W; !w.Parked(); time.Sleep(time.Millisecond) {
		select {
		case res := <-done:
			t.Fatalf("read returned %v before the burst", res.err)
		default:
		}
	}
	want := burstKeys(40) // 2,880 bytes of 4,096, no wakeup
	for seq, key := range want {
		p := payload(key, uint64(seq), 64)
		pos, ok := f.rings[0].Reserve(len(p))
		if !ok {
			t.Fatal("no room")
		}
		f.rings[0].Write(pos, p)
		f.rings[0].CommitMissed(pos)
	}
	var got []Sample
	res := <-done
	switch {
	case res.err == nil:
		got = append(got, res.s)
	case !errors.Is(res.err, os.ErrDeadlineExceeded):
		t.Fatal(res.err)
	}
	o.SetDeadline(time.Now().Add(10 * time.Second))
	inOrder(t, append(got, readN(t, o, len(want)-len(got))...), want)
}

// The window is made at NewReader with room for a full ring's copies: the
// first intake of a flood, here two thirds of a 256 KiB ring in 64-byte
// samples, allocates nothing, where growing the window started garbage
// collections that held the intake, and the ring, for milliseconds. Nor
// do the intakes after it (each made a method value).
func TestOrderedRingBufIntakesAllocate(t *testing.T) {
	if raceDetector {
		t.Skip("allocations are counted without -race (make test-nocgo)")
	}
	// The counts are the process's: an allocation of the runtime's or of
	// another test's goroutine may fall between (once in about twenty
	// runs of the package). An intake that allocates does in every try.
	var failed string
	for try := 0; try < 3; try++ {
		if failed = intakeAllocations(t); failed == "" {
			return
		}
	}
	t.Error(failed)
}

// intakeAllocations is a try of TestOrderedRingBufIntakesAllocate: what it
// found wrong, or "".
func intakeAllocations(t *testing.T) string {
	const size = 256 << 10
	f := newFakeBPFRings(t, 1, size)
	ord := Order{MaxDelay: time.Hour, KeyWindow: 1 << 40} // nothing released
	o := f.ordered(t, ord)
	empty := newFakeBPFRings(t, 1, size).ordered(t, ord)
	// A read that does not wait (its deadline past) takes the ring in and
	// releases nothing; beside it, the same reads of an empty ring: their
	// errors' allocations.
	mallocs := func(o *Reader, reads int, fill func()) uint64 {
		o.SetDeadline(time.Unix(1, 0))
		s := Sample{Data: make([]byte, 0, 64)}
		var before, after runtime.MemStats
		m := uint64(0)
		for range reads {
			fill()
			runtime.ReadMemStats(&before)
			err := o.ReadInto(&s)
			runtime.ReadMemStats(&after)
			if !errors.Is(err, os.ErrDeadlineExceeded) {
				t.Fatalf("read: %v, key %d", err, s.Key)
			}
			m += after.Mallocs - before.Mallocs
		}
		return m
	}
	n := 0
	emit := func(k int) {
		for range k {
			f.emit(t, 0, uint64(1000+n), uint64(n), 64)
			n++
		}
	}
	failed := ""
	base := mallocs(empty, 1, func() {})
	// A quarter of the ring, then 50 intakes of 10: the copies span less
	// than half of it, past which rule 4 releases (the window keeps the
	// space of what it holds).
	if m := mallocs(o, 1, func() { emit((size / 4) / 72) }); m > base+2 {
		failed = fmt.Sprintf("the first intake of %d samples made %d allocations, a read of an empty ring %d", n, m, base)
	}
	// All taken in and held: nothing delivered, and the ring's space kept
	// for the copies not delivered (a successor would deliver them).
	if st := o.Stats()[0]; st.Fill != n*72 || st.Samples != 0 || st.Held == 0 {
		t.Fatalf("not all taken in and held (%d bytes of copies): %+v", n*72, st)
	}
	const reads = 50
	base = mallocs(empty, reads, func() {})
	if m := mallocs(o, reads, func() { emit(10) }); m > base+2 && failed == "" {
		failed = fmt.Sprintf("%d intakes of 10 samples made %d allocations, %d reads of an empty ring %d", reads, m, reads, base)
	}
	if got := flushAll(t, o); len(got) != n || got[0].Key != 1000 {
		t.Fatalf("flushed %d samples, want %d", len(got), n)
	}
	return failed
}

// Each over a hot ring with no copy in the window runs the ring's own loop
// (eachHot): keys and Late as record by record, a late record dropped with
// DropLate, counted either way; the ledger exact.
func TestOrderedRingBufHotEach(t *testing.T) {
	for _, drop := range []bool{false, true} {
		t.Run(fmt.Sprintf("DropLate=%v", drop), func(t *testing.T) {
			f := newFakeBPFRings(t, 1, 4096)
			o := f.ordered(t, Order{MaxDelay: time.Hour, KeyWindow: 1000, DropLate: drop})
			f.emit(t, 0, 10, 0, 64) // goes by rule 2
			f.emit(t, 0, 1100, 1, 64)
			o.SetDeadline(time.Now().Add(10 * time.Second))
			if got := readN(t, o, 1); got[0].Key != 10 {
				t.Fatalf("first %d", got[0].Key)
			}
			want := []uint64{1100}        // the window's copy, then the ring's records
			for seq := range uint64(30) { // 2,160 bytes of 4,096
				key := 1200 + seq*10
				if seq == 20 {
					key = 1150 // after 1,390: late
				}
				f.emit(t, 0, key, 2+seq, 64)
				if key != 1150 || !drop {
					want = append(want, key)
				}
			}
			var got []uint64
			o.SetDeadline(time.Now().Add(20 * time.Millisecond))
			err := o.Each(context.Background(), func(rec *Record) error {
				if rec.Key != binary.NativeEndian.Uint64(rec.Data) || rec.Late != (rec.Key == 1150) {
					t.Fatalf("record key %d, late %v", rec.Key, rec.Late)
				}
				got = append(got, rec.Key)
				return nil
			})
			if !errors.Is(err, os.ErrDeadlineExceeded) {
				t.Fatal(err)
			}
			if fmt.Sprint(got) != fmt.Sprint(want) {
				t.Fatalf("keys %v\nwant %v", got, want)
			}
			o.Close()
			st := o.Stats()[0]
			dropped := uint64(0)
			if drop {
				dropped = 1
			}
			if st.Samples+st.Dropped != 32 || st.Late != 1 || st.Dropped != dropped || st.Left != 0 {
				t.Fatalf("stats %+v", st)
			}
		})
	}
}

// Close while a hot ring's next record is parsed and a copy went before
// it: the record parsed is still the ring's, counted Left, not delivered.
func TestOrderedRingBufHotCloseLedger(t *testing.T) {
	f := newFakeBPFRings(t, 1, 4096)
	o := f.ordered(t, Order{MaxDelay: time.Hour, KeyWindow: 1000})
	for seq, key := range []uint64{10, 1100, 600} { // 10 goes by rule 2
		f.emit(t, 0, key, uint64(seq), 64)
	}
	o.SetDeadline(time.Now().Add(10 * time.Second))
	if got := readN(t, o, 1); got[0].Key != 10 {
		t.Fatalf("first %d", got[0].Key)
	}
	const hot = 30 // 2,160 bytes of 4,096
	for seq := range uint64(hot) {
		f.emit(t, 0, 700+seq, 3+seq, 64)
	}
	if got := readN(t, o, 1); got[0].Key != 600 { // the copy before 700, parsed
		t.Fatalf("second %d", got[0].Key)
	}
	o.Close()
	st := o.Stats()[0]
	if st.Samples != 2 || st.Left != hot+1 || st.Bytes != 128 {
		t.Fatalf("after Close: samples %d (%d bytes), left %d; %d emitted", st.Samples, st.Bytes, st.Left, 3+hot)
	}
}

// Close counts the records the window holds as Left: delivered + left ==
// emitted, for any number read first.
func TestOrderedRingBufCloseLedger(t *testing.T) {
	const outputs = 20
	for _, read := range []int{0, 1, 7, outputs} {
		t.Run(fmt.Sprintf("read %d", read), func(t *testing.T) {
			f := newFakeBPFRings(t, 2, 4096)
			o := f.ordered(t, Order{MaxDelay: time.Hour}, true, true)
			for seq := range uint64(outputs) {
				f.emit(t, int(seq%2), seq, seq, 24)
			}
			// Rule 1 releases all but ring 1's last key, 19; a Flush the rest.
			if read == outputs {
				o.Flush()
			}
			o.SetDeadline(time.Now().Add(10 * time.Second))
			readN(t, o, read)
			o.Close()
			var samples, left uint64
			for _, st := range o.Stats() {
				samples, left = samples+st.Samples, left+st.Left
			}
			if samples != uint64(read) || samples+left != outputs {
				t.Fatalf("read %d: samples %d + left %d, %d outputs", read, samples, left, outputs)
			}
		})
	}
}

// A busy record (reserved, not committed) holds back only its own ring, as
// an empty one does: the other ring's keys above the busy ring's newest
// wait for its commit, or MaxDelay.
func TestOrderedRingBufBusy(t *testing.T) {
	f := newFakeBPFRings(t, 2, 4096)
	o := f.ordered(t, Order{MaxDelay: time.Hour}, true, true)
	f.emit(t, 0, 1, 0, 16)
	busy, ok := f.rings[0].Reserve(16)
	if !ok {
		t.Fatal("no room")
	}
	f.rings[0].Write(busy, payload(3, 1, 16))
	f.emit(t, 1, 2, 2, 16)
	f.emit(t, 1, 4, 3, 16)
	o.SetDeadline(time.Now().Add(10 * time.Second))
	if got := readN(t, o, 1); got[0].Key != 1 {
		t.Fatalf("first %d", got[0].Key)
	}
	o.SetDeadline(time.Now().Add(50 * time.Millisecond))
	var s Sample
	if err := o.ReadInto(&s); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("with ring 0 busy: %v, key %d", err, s.Key)
	}
	f.rings[0].Commit(busy, false) // wakes the reader: consumer_pos is at it
	f.emit(t, 0, 5, 4, 16)
	o.SetDeadline(time.Now().Add(10 * time.Second))
	if got := readN(t, o, 3); fmt.Sprint(keys(got)) != "[2 3 4]" {
		t.Fatalf("then %v", keys(got))
	}
}

// A model check: random keys on rings of one writer, every form of read,
// delivered in key order within what rule 1 allows, each exactly once.
func TestOrderedRingBufModel(t *testing.T) {
	for seed := range int64(20) {
		rng := rand.New(rand.NewSource(seed))
		rings := 1 + rng.Intn(4)
		f := newFakeBPFRings(t, rings, 1<<14)
		one := make([]bool, rings)
		for i := range one {
			one[i] = true
		}
		o := f.ordered(t, Order{MaxDelay: time.Hour}, one...)
		o.SetDeadline(time.Now().Add(10 * time.Second))
		next := make([]uint64, rings)
		var seq uint64
		var got []Sample
		for round := 0; round < 20; round++ {
			for k := rng.Intn(30); k > 0; k-- {
				i := rng.Intn(rings)
				next[i] += uint64(rng.Intn(5))
				f.emit(t, i, next[i], seq, 16+8*rng.Intn(4))
				seq++
			}
			// Every ring shows the round's bound: rule 1 releases all
			// keys below it.
			bound := uint64(round+1) * 1000
			for i := range rings {
				next[i] = bound
				f.emit(t, i, bound, seq, 16)
				seq++
			}
			got = append(got, readReleased(t, o, 5*time.Millisecond)...)
			if n := len(got); n == 0 || got[n-1].Key != bound {
				t.Fatalf("seed %d round %d: %d delivered, not up to %d", seed, round, n, bound)
			}
		}
		seen := map[uint64]bool{}
		for j, s := range got {
			if j > 0 && s.Key < got[j-1].Key || s.Late {
				t.Fatalf("seed %d: key %d after %d", seed, s.Key, got[j-1].Key)
			}
			if sq := binary.NativeEndian.Uint64(s.Data[8:]); seen[sq] {
				t.Fatalf("seed %d: seq %d twice", seed, sq)
			} else {
				seen[sq] = true
			}
		}
	}
}

// Producers that follow the kernel's protocol write two ring buffers of one
// CPU each, keys from one clock, while an ordered Reader reads them and is
// closed at a random point once they are done: each ring's records come in
// its order, keys never fall but for those marked Late (counted), and
// delivered + left == written.
func TestOrderedRingBufRace(t *testing.T) {
	n := 20000
	if testing.Short() || ringtest.RaceEnabled() {
		n = 3000
	}
	for round := range 3 {
		f := newFakeBPFRings(t, 2, 1<<12)
		o := f.ordered(t, Order{MaxDelay: 5 * time.Millisecond}, true, true)
		epoch := time.Now()
		var clock sync.Mutex // keys from one clock, as bpf_ktime_get_ns
		var wg sync.WaitGroup
		for i := range 2 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for seq := uint64(0); seq < uint64(n); {
					clock.Lock()
					key := uint64(time.Since(epoch))
					pos, ok := f.rings[i].Reserve(24)
					clock.Unlock()
					if !ok {
						time.Sleep(20 * time.Microsecond)
						continue
					}
					f.rings[i].Write(pos, payload(key, seq, 24))
					f.rings[i].Commit(pos, false)
					seq++
				}
			}()
		}
		read := make(chan int)
		var next [2]uint64
		late := 0
		go func() {
			var last uint64
			var s Sample
			got := 0
			for o.ReadInto(&s) == nil {
				got++
				if seq := binary.NativeEndian.Uint64(s.Data[8:]); seq != next[s.Ring] {
					t.Errorf("ring %d: seq %d, want %d", s.Ring, seq, next[s.Ring])
				}
				next[s.Ring]++
				if s.Late {
					late++
				} else if s.Key < last {
					t.Errorf("key %d after %d, not marked late", s.Key, last)
				} else {
					last = s.Key
				}
			}
			read <- got
		}()
		wg.Wait()
		time.Sleep(time.Duration(rand.Intn(5000)) * time.Microsecond)
		o.Close()
		got := <-read
		var samples, left, lateStats uint64
		for _, st := range o.Stats() {
			samples, left, lateStats = samples+st.Samples, left+st.Left, lateStats+st.Late
		}
		if samples != uint64(got) || samples+left != uint64(2*n) || lateStats != uint64(late) {
			t.Fatalf("round %d: read %d; stats %d delivered + %d left of %d written, %d late (%d seen)",
				round, got, samples, left, 2*n, lateStats, late)
		}
		t.Logf("round %d: %d read, %d left at Close, %d late", round, got, left, late)
	}
}

// orderedReadOnce reads o once in one of the Reader's forms (ReadInto,
// ReadBatch, Each, Consume) and returns the keys delivered and the error.
// Each ends at its first error; Consume at the end of what it may deliver
// now (a running Flush's end included).
func orderedReadOnce(o *Reader, mode string) ([]uint64, error) {
	var got []uint64
	fn := func(rec *Record) error {
		got = append(got, rec.Key)
		return nil
	}
	switch mode {
	case "ReadInto":
		var s Sample
		err := o.ReadInto(&s)
		if err == nil {
			got = append(got, s.Key)
		}
		return got, err
	case "ReadBatch":
		s := make([]Sample, 2)
		n, err := o.ReadBatch(s)
		for _, s := range s[:n] {
			got = append(got, s.Key)
		}
		return got, err
	case "Each":
		err := o.Each(context.Background(), fn)
		return got, err
	}
	_, err := o.Consume(fn)
	return got, err
}

// An ordered Reader over ring buffers, one or an array of them, reports a
// consumer_pos another consumer moved as a *CorruptError, as the unordered
// forms do (docs/failures.md), in every form; a Flush then ends with what
// it held delivered, and a read with no deadline after it waits. The window
// used to look at producer_pos only: moved forward, the record the other
// consumer took was delivered again, unreported; moved back, every read
// after a Flush spun until its deadline (os.ErrDeadlineExceeded here), and
// without one for ever.
func TestOrderedRingBufConsumerMoved(t *testing.T) {
	for _, rings := range []int{1, 2} {
		for _, move := range []string{"back", "forward"} {
			for _, mode := range []string{"ReadInto", "ReadBatch", "Each", "Consume"} {
				t.Run(fmt.Sprintf("rings=%d/%s/%s", rings, move, mode), func(t *testing.T) {
					f := newFakeBPFRings(t, rings, 4096)
					o := f.ordered(t, Order{MaxDelay: time.Hour, KeyWindow: 1 << 62})
					want := []uint64{10, 11, 12}
					for seq, key := range []uint64{12, 10, 11} {
						f.emit(t, 0, key, uint64(seq), 16)
					}
					if rings > 1 {
						f.emit(t, 1, 13, 3, 16)
						want = append(want, 13)
					}
					o.SetDeadline(time.Now().Add(20 * time.Millisecond))
					if got, err := orderedReadOnce(o, mode); len(got) != 0 || err != nil && !errors.Is(err, os.ErrDeadlineExceeded) {
						t.Fatalf("first read: %v, %v; want the copies held", got, err)
					}
					r := f.rings[0]
					switch move {
					case "back": // another consumer moves it behind the reader's (its oldest copy's)
						atomic.StoreUint64(&r.Pos[0], atomic.LoadUint64(&r.Pos[0])-8)
					case "forward": // another consumer took the next record, 20
						f.emit(t, 0, 20, 4, 16)
						f.emit(t, 0, 21, 5, 16)
						atomic.StoreUint64(&r.Pos[0], atomic.LoadUint64(&r.Pos[0])+24)
					}
					o.Flush()
					var got []uint64
					var corrupt []error
					for call := 0; ; call++ {
						if call > 20 {
							t.Fatalf("no end of the flush after 20 reads: delivered %v, errors %v", got, corrupt)
						}
						// A generous deadline: every read here has its records
						// there, or an error to report; running into it is a spin.
						o.SetDeadline(time.Now().Add(10 * time.Second))
						keys, err := orderedReadOnce(o, mode)
						got = append(got, keys...)
						var ce *CorruptError
						if errors.As(err, &ce) {
							corrupt = append(corrupt, err)
							continue
						}
						if errors.Is(err, ErrFlushed) || err == nil && mode == "Consume" {
							break
						}
						if err != nil {
							t.Fatalf("read %d: %v (delivered %v, errors %v)", call, err, got, corrupt)
						}
					}
					var ce *CorruptError
					if len(corrupt) != 1 || !errors.As(corrupt[0], &ce) || ce.Ring != 0 || !strings.Contains(ce.Reason, "by another writer") {
						t.Fatalf("errors %v; want one CorruptError of ring 0: consumer position changed by another writer", corrupt)
					}
					if fmt.Sprint(got) != fmt.Sprint(want) {
						t.Fatalf("the flush delivered %v; want %v (20 was the other consumer's)", got, want)
					}
					if c, p := atomic.LoadUint64(&r.Pos[0]), atomic.LoadUint64(&r.Pos[1]); c != p {
						t.Fatalf("consumer_pos %d, producer_pos %d after the error", c, p)
					}
					// A read with no deadline waits, and the ring's next
					// record, flushed, ends it.
					if mode == "Consume" {
						return
					}
					r.Prod = r.Pos[1]
					o.SetDeadline(time.Time{})
					done := make(chan error, 1)
					var late []uint64
					go func() {
						var err error
						late, err = orderedReadOnce(o, mode)
						done <- err
					}()
					for give := time.Now().Add(10 * time.Second); !o.r.C.W.Waiting(); {
						select {
						case err := <-done:
							t.Fatalf("a read with no deadline returned %v, %v without waiting", late, err)
						default:
						}
						if time.Now().After(give) {
							t.Fatal("a read with no deadline never waits")
						}
						time.Sleep(time.Millisecond)
					}
					f.emit(t, 0, 30, 6, 16)
					o.Flush()
					within(t, "the read after the next record", func() {
						err := <-done
						if len(late) == 0 || late[0] != 30 || err != nil && !errors.Is(err, ErrFlushed) {
							t.Errorf("the read with no deadline: %v, %v; want 30", late, err)
						}
					})
				})
			}
		}
	}
}
