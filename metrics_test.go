// SPDX-License-Identifier: Apache-2.0

package perfbuf

import (
	"errors"
	"github.com/perfbuf/perfbuf/internal/owner"
	"os"
	"testing"
	"time"
)

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
// that a Flush, a deadline or a timeout ended.
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
		if got := r.Wakeups(); got != n {
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
	if got := r.Wakeups(); got != 2 {
		t.Errorf("Reader: %d wakeups after a Flush and a deadline, want 2", got)
	}
	r.Close()
	if got := r.Wakeups(); got != 2 {
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
	if got := pb.Wakeups(); got != 1 {
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
	if got := raw.Wakeups(); got != 1 {
		t.Errorf("Raw: %d wakeups, want 1", got)
	}
}

// Waiting is an upper bound of the oldest undelivered record's age, which
// the reader's commits and Stats calls keep close: it is at least the time
// since the record was written, and at most the time since a commit or a
// Stats call found the ring empty.
func TestStatsWaiting(t *testing.T) {
	f := newFakeRings(t, 1, 4096)
	r := f.reader(t, ReaderOptions{MaxLatency: -1})
	if w := r.Stats()[0].Waiting; w != 0 {
		t.Errorf("an empty ring: Waiting %v", w)
	}

	// A record not read: Waiting is at least its age.
	f.emit(t, 0, 0, 0, 16)
	written := time.Now()
	time.Sleep(2 * time.Millisecond)
	age := time.Since(written)
	if w := r.Stats()[0].Waiting; w < age {
		t.Errorf("Waiting %v, below the record's age %v", w, age)
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
	if w, since := r.Stats()[0].Waiting, time.Since(read); w == 0 || w > since {
		t.Errorf("Waiting %v after a commit %v ago found the ring empty", w, since)
	}

	// A Stats call that finds the ring empty bounds it too.
	r.Flush()
	readFlushed(t, r)
	time.Sleep(20 * time.Millisecond)
	looked := time.Now()
	if w := r.Stats()[0].Waiting; w != 0 {
		t.Errorf("an empty ring: Waiting %v", w)
	}
	f.emit(t, 0, 0, 2, 16)
	if w, since := r.Stats()[0].Waiting, time.Since(looked); w == 0 || w > since {
		t.Errorf("Waiting %v after a Stats call %v ago found the ring empty", w, since)
	}
	r.Close()
	if w := r.Stats()[0].Waiting; w != 0 {
		t.Errorf("after Close: Waiting %v", w)
	}
}

// An ordered Reader's Held is how long it has held back the record it
// holds, since it first saw it; 0 once delivered, and for the fullest-first
// Reader.
func TestStatsHeld(t *testing.T) {
	f := newFakeRings(t, 2, 4096)
	r := f.ordered(t, Order{MaxDelay: time.Hour})
	before := time.Now()
	f.emit(t, 0, 5, 0, 16) // held: ring 1 may yet output a smaller key (rule 1)
	r.SetDeadline(time.Now().Add(5 * time.Millisecond))
	var s Sample
	if err := r.ReadInto(&s); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("read: %v, want the deadline's error", err)
	}
	time.Sleep(2 * time.Millisecond)
	st := r.Stats()
	if h, since := st[0].Held, time.Since(before); h < 2*time.Millisecond || h > since {
		t.Errorf("Held %v, want at least 2ms and at most %v", h, since)
	}
	if st[0].Waiting < st[0].Held {
		t.Errorf("Waiting %v below Held %v", st[0].Waiting, st[0].Held)
	}
	if st[1].Held != 0 {
		t.Errorf("ring 1 holds nothing: Held %v", st[1].Held)
	}
	r.SetDeadline(time.Time{})
	r.Flush()
	if n := readFlushed(t, r); n != 1 {
		t.Fatalf("%d records read, want 1", n)
	}
	if h := r.Stats()[0].Held; h != 0 {
		t.Errorf("delivered: Held %v", h)
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
	if st[0].Waiting != 0 || st[1].Waiting < age {
		t.Errorf("Waiting %v and %v; want 0 and at least %v", st[0].Waiting, st[1].Waiting, age)
	}
	r.Flush()
	if n := readFlushed(t, r); n != 1 {
		t.Fatalf("%d records read, want 1", n)
	}
	if w := r.Stats()[1].Waiting; w != 0 {
		t.Errorf("delivered: Waiting %v", w)
	}
	if _, ok := f.rings[0].Reserve(8); !ok {
		t.Fatal("no room to reserve")
	}
	if w := r.Stats()[0].Waiting; w == 0 {
		t.Error("a reserved record: Waiting 0")
	}
}
