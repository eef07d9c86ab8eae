// SPDX-License-Identifier: Apache-2.0

package perfbuf

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
)

// TestBPFRingRace runs producer goroutines that follow the kernel's protocol against a
// reader that parses, commits and sleeps concurrently, as the core will: begin, each
// (limited to a quarter ring), commit, and, when there was nothing, settle and sleep until a
// wakeup. The producers reserve under a lock (the kernel's rb->spinlock) with a busy header,
// write the sample outside it, then commit or discard it, out of order across producers, and
// wake the reader only when consumer_pos is at the record they commit. Every sample carries
// a sequence number, given in reservation order, and a pattern derived from it; the reader
// checks that every sample arrives once, in order, intact, and that the discarded ones are
// counted. A lost wakeup leaves the reader asleep: the test fails after 10 s of it.
func TestBPFRingRace(t *testing.T) {
	total := uint64(1_000_000)
	if raceEnabled() {
		total = 200_000
	}
	if testing.Short() {
		total /= 10
	}
	f := newFakeBPFRing(64 << 10)
	r := f.reader(t)
	wake := make(chan struct{}, 1) // the ring's epoll readiness
	f.onWake = func() {
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
		limit     = uint64(r.size() / 4)
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
		if k > raceMaxBody || len(d) != 12+k {
			return fmt.Errorf("sequence %d: %d pattern bytes in a %d-byte sample", seq, k, len(d))
		}
		off := racePatternOff(seq)
		if !bytes.Equal(d[12:], racePattern[off:off+uint64(k)]) {
			return fmt.Errorf("sequence %d: sample differs", seq)
		}
		want++
		received++
		return nil
	}
	for received+r.discarded() < total {
		r.begin()
		n, _, err := r.each(&rec, limit, nil, check)
		r.commitCursor()
		drains++
		if err != nil {
			t.Fatalf("after %d samples: %v", received, err)
		}
		if n > 0 || !r.settle() {
			continue
		}
		sleeps++
		start := time.Now()
		select {
		case <-wake:
			if r.used() == 0 {
				spurious++ // a wakeup for a record read before the sleep
			}
		case <-time.After(asleepFor):
			t.Fatalf("lost wakeup: asleep %v after %d samples; consumer_pos %d producer_pos %d, used %d",
				time.Since(start), received, atomic.LoadUint64(&f.pos[0]), atomic.LoadUint64(&f.pos[1]), r.used())
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %d samples", received)
		}
	}
	for want < total && bpfRaceDiscarded(want) {
		want++
		discards++
	}
	if received+discards != total || r.discarded() != discards {
		t.Fatalf("received %d + discarded %d (counted %d), want %d", received, discards, r.discarded(), total)
	}
	st := r.counts()
	if st.Samples != received || st.Corrupt != 0 || st.MaxFill > r.size()-8 {
		t.Fatalf("stats %+v; received %d", st, received)
	}
	t.Logf("%d samples, %d discarded, %d drains, %d sleeps (%d woken with nothing to read), %d wakeups raised",
		received, discards, drains, sleeps, spurious, f.wakes.Load())
}

// bpfRaceDiscarded: the producers discard every eleventh sample.
func bpfRaceDiscarded(seq uint64) bool { return seq%11 == 5 }

// bpfRaceProducer reserves, writes and commits samples (sequence numbers taken in
// reservation order, shared with the other producers) until total are out. It waits for
// room when the ring is full (the kernel would drop the sample), and sometimes holds a
// reservation while it reserves another, so commits come out of order.
func bpfRaceProducer(f *fakeBPFRing, lock *sync.Mutex, nextSeq *uint64, total, id uint64, stop *atomic.Bool, deadline time.Time) error {
	rng := rand.New(rand.NewPCG(id, total))
	var held []uint64 // reserved, not committed
	buf := make([]byte, 12+raceMaxBody)
	commitHeld := func() {
		for _, pos := range held {
			seq := binary.NativeEndian.Uint64(f.data[(pos+8)&(f.size-1):])
			f.commit(pos, bpfRaceDiscarded(seq))
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
		k := rng.IntN(raceMaxBody + 1)
		lock.Lock()
		seq := *nextSeq
		if seq >= total {
			lock.Unlock()
			commitHeld()
			return nil
		}
		pos, ok := f.reserve(12 + k)
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
		off := racePatternOff(seq)
		copy(d[12:], racePattern[off:off+uint64(k)])
		f.write(pos, d)
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
