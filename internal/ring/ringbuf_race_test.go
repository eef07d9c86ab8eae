// SPDX-License-Identifier: Apache-2.0

package ring

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/perfbuf/perfbuf/internal/ringtest"
)

// TestBPFRingRace runs producer goroutines that follow the kernel's protocol against a
// reader that parses, commits and sleeps concurrently, as the core will: begin, each
// (limited to a quarter ring), commit, and, when there was nothing, settle and sleep until a
// wakeup. The producers reserve under a lock (the kernel's rb->spinlock) with a busy header,
// write the sample outside it, then commit or discard it, out of order across producers, and
// wake the reader only when consumer_pos is at the record they commit. Every sample carries
// a sequence number, given in reservation order, and a pattern derived from it; the reader
// checks that every sample arrives once, in order, intact, and that the discarded ones are
// counted. A lost wakeup leaves the reader asleep: the test fails after 10 s of it. With
// HoldBack the reader's commits that reach the head keep the last record's start as
// consumer_pos, so the producers raise wakeups only at a settle (which releases it): a
// record delivered again, or one whose wakeup the release loses, fails it as well.
func TestBPFRingRace(t *testing.T) {
	for _, hold := range []bool{false, true} {
		for _, steps := range []string{"none", "runs", "keyed"} {
			t.Run(fmt.Sprintf("HoldBack=%v/steps=%v", hold, steps), func(t *testing.T) { bpfRingRace(t, hold, steps) })
		}
	}
}

// bpfRingRace is TestBPFRingRace with Each's function, or with the
// samples in runs (steps "runs"), stepped through as the root's Batch
// does, or in an ordered run's (steps "keyed": the key is the sequence
// number, which rises in the ring's order, with no bound).
func bpfRingRace(t *testing.T, hold bool, steps string) {
	total := uint64(1_000_000)
	if ringtest.RaceEnabled() {
		total = 200_000
	}
	if testing.Short() {
		total /= 10
	}
	f := ringtest.NewRingBuf(64 << 10)
	r := fakeReader(t, f)
	r.HoldBack = hold
	wake := make(chan struct{}, 1) // the ring's epoll readiness
	f.OnWake = func() {
		select {
		case wake <- struct{}{}:
		default:
		}
	}
	deadline := time.Now().Add(90 * time.Second) // bounds every wait below
	var (
		lock    sync.Mutex // rb->spinlock
		nextSeq uint64
		stop    atomic.Bool
		wg      sync.WaitGroup
		errs    = make(chan error, 2)
	)
	for p := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs <- bpfRaceProducer(f, &lock, &nextSeq, total, uint64(p), &stop, deadline)
		}()
	}
	defer func() {
		stop.Store(true)
		wg.Wait()
		for range 2 {
			if err := <-errs; err != nil {
				t.Error(err)
			}
		}
	}()

	var (
		want      uint64 // next sequence number expected
		received  uint64
		discards  uint64
		sleeps    int
		spurious  int
		drains    int
		rec       Record
		limit     = uint64(r.Size() / 4)
		asleepFor = 10 * time.Second
	)
	check := func(rec *Record) error {
		d := rec.Data
		if len(d) < 12 {
			return fmt.Errorf("sample of %d bytes at %d", len(d), rec.Pos)
		}
		seq := binary.NativeEndian.Uint64(d)
		k := int(binary.NativeEndian.Uint32(d[8:]))
		for want < seq && bpfRaceDiscarded(want) {
			want++
			discards++
		}
		if seq != want || bpfRaceDiscarded(seq) {
			return fmt.Errorf("sequence %d, want %d, at %d", seq, want, rec.Pos)
		}
		if k > ringtest.RaceMaxBody || len(d) != 12+k {
			return fmt.Errorf("sequence %d: %d pattern bytes in a %d-byte sample", seq, k, len(d))
		}
		off := ringtest.RacePatternOff(seq)
		if !bytes.Equal(d[12:], ringtest.RacePattern[off:off+uint64(k)]) {
			return fmt.Errorf("sequence %d: sample differs", seq)
		}
		want++
		received++
		return nil
	}
	var sink *Sink
	if steps != "none" {
		sink = stepsSink(check)
	}
	if steps == "keyed" {
		sink.KeyEnd, sink.Hi = 8, ^uint64(0)
	}
	for received+r.counts.Discarded < total {
		r.Begin()
		n, _, err := r.Each(&rec, limit, nil, check, sink)
		r.CommitCursor()
		drains++
		if err != nil {
			t.Fatalf("after %d samples: %v", received, err)
		}
		if n > 0 || !r.Settle() {
			continue
		}
		sleeps++
		start := time.Now()
		select {
		case <-wake:
			if r.Used() == 0 {
				spurious++ // a wakeup for a record read before the sleep
			}
		case <-time.After(asleepFor):
			t.Fatalf("lost wakeup: asleep %v after %d samples; consumer_pos %d producer_pos %d, used %d",
				time.Since(start), received, atomic.LoadUint64(&f.Pos[0]), atomic.LoadUint64(&f.Pos[1]), r.Used())
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %d samples", received)
		}
	}
	for want < total && bpfRaceDiscarded(want) {
		want++
		discards++
	}
	if received+discards != total || r.counts.Discarded != discards {
		t.Fatalf("received %d + discarded %d (counted %d), want %d", received, discards, r.counts.Discarded, total)
	}
	st := r.Counts()
	if st.Samples != received || st.Corrupt != 0 || st.MaxFill > r.Size()-8 {
		t.Fatalf("stats %+v; received %d", st, received)
	}
	t.Logf("%d samples, %d discarded, %d drains, %d sleeps (%d woken with nothing to read), %d wakeups raised",
		received, discards, drains, sleeps, spurious, f.Wakes.Load())
}

// bpfRaceDiscarded: the producers discard every eleventh sample.
func bpfRaceDiscarded(seq uint64) bool { return seq%11 == 5 }

// bpfRaceProducer reserves, writes and commits samples (sequence numbers taken in
// reservation order, shared with the other producers) until total are out. It waits for
// room when the ring is full (the kernel would drop the sample), and sometimes holds a
// reservation while it reserves another, so commits come out of order.
func bpfRaceProducer(f *ringtest.RingBuf, lock *sync.Mutex, nextSeq *uint64, total, id uint64, stop *atomic.Bool, deadline time.Time) error {
	rng := rand.New(rand.NewPCG(id, total))
	var held []uint64 // reserved, not committed
	buf := make([]byte, 12+ringtest.RaceMaxBody)
	commitHeld := func() {
		for _, pos := range held {
			seq := binary.NativeEndian.Uint64(f.Data[(pos+8)&(f.Size-1):])
			f.Commit(pos, bpfRaceDiscarded(seq))
		}
		held = held[:0]
	}
	for spins := 0; ; spins++ {
		if stop.Load() {
			return nil
		}
		if spins%1024 == 0 && time.Now().After(deadline) {
			return fmt.Errorf("producer %d timed out", id)
		}
		k := rng.IntN(ringtest.RaceMaxBody + 1)
		lock.Lock()
		seq := *nextSeq
		if seq >= total {
			lock.Unlock()
			commitHeld()
			return nil
		}
		pos, ok := f.Reserve(12 + k)
		if ok {
			*nextSeq++
		}
		lock.Unlock()
		if !ok {
			commitHeld() // our own reservations may be what holds the reader up
			runtime.Gosched()
			continue
		}
		d := buf[:12+k]
		binary.NativeEndian.PutUint64(d, seq)
		binary.NativeEndian.PutUint32(d[8:], uint32(k))
		off := ringtest.RacePatternOff(seq)
		copy(d[12:], ringtest.RacePattern[off:off+uint64(k)])
		f.Write(pos, d)
		held = append(held, pos)
		// Commit now, or after the next reservation (in either order).
		if len(held) > 1 || rng.IntN(4) != 0 {
			if len(held) > 1 && rng.IntN(2) == 0 {
				held[0], held[1] = held[1], held[0]
			}
			commitHeld()
		}
	}
}
