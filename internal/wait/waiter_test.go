// SPDX-License-Identifier: Apache-2.0

package wait

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/perfbuf/perfbuf/internal/ringtest"
	"golang.org/x/sys/unix"
)

// newTestWaiter returns a Waiter over one fake ring, whose pollable
// descriptor is an eventfd: readable while its count is not zero, as a
// ring buffer's map is while the producer position differs from the
// consumer's (level-triggered).
func newTestWaiter(t *testing.T) (*Waiter, *fakeWaker, int) {
	t.Helper()
	w, err := New()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(w.Close)
	rb, efd := new(fakeWaker), ringtest.EventFD(t)
	if err := w.AddRing(rb, efd); err != nil {
		t.Fatal(err)
	}
	return w, rb, efd
}

// signal makes efd readable (and keeps it so: nothing reads it), and
// raises a wakeup.
func signal(t *testing.T, efd int) {
	t.Helper()
	if _, err := unix.Write(efd, []byte{1, 0, 0, 0, 0, 0, 0, 0}); err != nil {
		t.Fatal(err)
	}
}

// A ring that stays readable while its reader holds records (a ring
// buffer's poll is level-triggered: the ordered Reader's window, a raw
// view between Next and Commit) does not make the wait spin: with no new
// record, a wait looks at the rings a bounded number of times, not once
// per return of epoll, until its timeout.
func TestWaiterHeldRecordNoSpin(t *testing.T) {
	w, rb, efd := newTestWaiter(t)
	rb.head.Add(8)
	signal(t, efd)
	if ev, err := w.Wait(time.Minute, 0); err != nil || !ev {
		t.Fatalf("wait for the record: %v, %v", ev, err)
	}
	// The record is held, not consumed: efd stays readable.
	from := rb.looks.Load()
	for range 5 {
		if ev, err := w.Wait(20*time.Millisecond, 0); err != nil || ev {
			t.Fatalf("wait with the record held: %v, %v; want a timeout", ev, err)
		}
	}
	// Per wait: the look before the netpoller, the netpoller's first, and
	// at most one for an edge that came before the wait; a spin would
	// look thousands of times in 20 ms.
	if looks := rb.looks.Load() - from; looks > 5*4 {
		t.Errorf("%d looks at the ring in 5 waits that timed out", looks)
	}
	if n := w.Wakeups(); n != 0 {
		t.Errorf("%d wakeups without a new record", n)
	}
	// A new record's wakeup still ends a wait.
	done := make(chan error)
	go func() {
		ev, err := w.Wait(-1, 0)
		if err == nil && !ev {
			t.Error("the wait ended without the record")
		}
		done <- err
	}()
	waitParked(t, w)
	rb.head.Add(8)
	signal(t, efd)
	if err := waitDone(t, done); err != nil {
		t.Fatal(err)
	}
}

// Close's wake ends a wait blocked with no timeout, and the waits for its
// turn; a wake that is not Close's ends the wait once, until cleared.
func TestWaiterWakeEndsWait(t *testing.T) {
	w, _, _ := newTestWaiter(t)
	done := make(chan error, 2)
	for range 2 { // one in the netpoller, one waiting for its turn
		go func() {
			ev, err := w.Wait(-1, 0)
			if err == nil && !ev {
				t.Error("a woken wait reported no wake")
			}
			done <- err
		}()
	}
	waitParked(t, w)
	w.Wake(false)
	if err := waitDone(t, done); err != nil {
		t.Fatal(err)
	}
	// Woken until cleared: the second wait returns too.
	if err := waitDone(t, done); err != nil {
		t.Fatal(err)
	}
	w.ClearWake()
	for range 2 {
		go func() {
			_, err := w.Wait(-1, 0)
			done <- err
		}()
	}
	waitParked(t, w)
	w.Wake(true)
	for range 2 {
		if err := waitDone(t, done); err != nil {
			t.Fatal(err)
		}
	}
	if ev, err := w.Wait(-1, 0); err != nil || !ev {
		t.Errorf("a wait after Close's wake: %v, %v", ev, err)
	}
}

// A wait with a timeout and nothing to wake it times out, reporting no
// event.
func TestWaiterTimeout(t *testing.T) {
	w, _, _ := newTestWaiter(t)
	start := time.Now()
	if ev, err := w.Wait(5*time.Millisecond, 0); err != nil || ev {
		t.Fatalf("wait: %v, %v; want a timeout", ev, err)
	}
	if took := time.Since(start); took < 5*time.Millisecond {
		t.Errorf("the wait ended after %v, before its timeout", took)
	}
}

// A ring added while a wait is blocked ends it with its first wakeup.
func TestWaiterAddRingWhileWaiting(t *testing.T) {
	w, _, _ := newTestWaiter(t)
	done := make(chan error)
	go func() {
		ev, err := w.Wait(-1, 0)
		if err == nil && !ev {
			t.Error("the wait ended without an event")
		}
		done <- err
	}()
	waitParked(t, w)
	rb2, efd2 := new(fakeWaker), ringtest.EventFD(t)
	if err := w.AddRing(rb2, efd2); err != nil {
		t.Fatal(err)
	}
	rb2.head.Add(8)
	signal(t, efd2)
	if err := waitDone(t, done); err != nil {
		t.Fatal(err)
	}
	if n := w.Wakeups(); n != 1 {
		t.Errorf("%d wakeups, want 1", n)
	}
}

// waitParked waits, within a timeout, until a wait looked at the rings in
// the netpoller: a ring's event from then on ends it.
func waitParked(t *testing.T, w *Waiter) {
	t.Helper()
	for end := time.Now().Add(10 * time.Second); !w.Parked(); time.Sleep(time.Millisecond) {
		if time.Now().After(end) {
			t.Fatal("the wait never parked")
		}
	}
}

// A wake from another goroutine (WakeOpen: a CPU coming online, a
// context's end, a ring buffer's takeover won) holds no owner's free past
// Close: with only such wakes under way, Close returns with the owner
// freed, and a wake after that ends nothing. (WakeOpen entered the
// lifetime: a Close that met it returned before free, which then ran on
// the waking goroutine; a process that exited after Close left its reader
// key open, TestHandover's lost ledger on a loaded 5.10 guest.)
func TestWakeOpenHoldsNoFree(t *testing.T) {
	w, _, _ := newTestWaiter(t)
	rounds := 2000
	if testing.Short() {
		rounds = 200
	}
	for round := range rounds {
		var l Lifetime
		var freed atomic.Bool
		l.Free = func() { freed.Store(true) }
		stop, woke := make(chan struct{}), make(chan struct{})
		done := make(chan struct{})
		go func() {
			defer close(done)
			for k := 0; ; k++ {
				select {
				case <-stop:
					return
				default:
				}
				w.WakeOpen(&l)
				if k == 0 {
					close(woke)
				}
			}
		}()
		<-woke
		l.Close(func() {})
		if !freed.Load() {
			t.Fatalf("round %d: Close returned before the owner was freed, a wake under way", round)
		}
		close(stop)
		<-done
	}
}
