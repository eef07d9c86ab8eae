// SPDX-License-Identifier: Apache-2.0

package wait

import (
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// fakeWaker is a ring whose producer position the test moves; looks
// counts the looks at it (Progress).
type fakeWaker struct {
	head  atomic.Uint64
	looks atomic.Int64
}

func (f *fakeWaker) Progress() uint64 {
	f.looks.Add(1)
	return f.head.Load()
}

func (f *fakeWaker) Settle() bool { return true }

// newWakerSet returns a Waiter over one fakeWaker, whose wakeup is an
// eventfd; all closed when the test ends.
func newWakerSet(t *testing.T) (*Waiter, int, *fakeWaker) {
	t.Helper()
	w, err := New()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(w.Close)
	efd, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(efd) })
	rb := new(fakeWaker)
	if err := w.AddRing(rb, efd); err != nil {
		t.Fatal(err)
	}
	return w, efd, rb
}

// Wakeups counts the waits that blocked and a ring's event ended: not a
// ring that moved before the wait, nor a timeout, nor a wake.
func TestWaiterWakeups(t *testing.T) {
	w, efd, rb := newWakerSet(t)
	clear := func() { // the eventfd read: the set is not readable any more
		var b [8]byte
		unix.Read(efd, b[:])
	}
	event := func() { // the producer: a record, then the wakeup
		rb.head.Add(8)
		if _, err := unix.Write(efd, []byte{1, 0, 0, 0, 0, 0, 0, 0}); err != nil {
			t.Error(err)
		}
	}
	check := func(what string, want uint64) {
		t.Helper()
		if got := w.Wakeups(); got != want {
			t.Errorf("%s: %d wakeups, want %d", what, got, want)
		}
	}

	// A ring that moved before the wait: it returns at once, no wakeup.
	event()
	if ev, err := w.Wait(time.Minute, 0); err != nil || !ev {
		t.Fatalf("wait: %v, %v", ev, err)
	}
	check("a ring moved before", 0)
	clear()

	// A timeout, and a wake: no wakeup.
	if _, err := w.Wait(time.Millisecond, 0); err != nil {
		t.Fatal(err)
	}
	check("a timeout", 0)
	done := make(chan error)
	from := rb.looks.Load()
	go func() { _, err := w.Wait(-1, 0); done <- err }()
	waitLooks(t, rb, from+2) // its look before the netpoller, and the netpoller's first
	w.Wake(false)
	if err := waitDone(t, done); err != nil {
		t.Fatal(err)
	}
	w.ClearWake()
	check("a wake", 0)

	// A blocked wait the ring's event ends: one wakeup, each time.
	for n := uint64(1); n <= 3; n++ {
		from := rb.looks.Load()
		go func() { _, err := w.Wait(-1, 0); done <- err }()
		waitLooks(t, rb, from+2)
		event()
		if err := waitDone(t, done); err != nil {
			t.Fatal(err)
		}
		clear()
		check("a ring's event", n)
	}
}

// waitLooks waits, within a timeout, until rb was looked at n times in
// all: a wait's second look is the netpoller's first, after which it parks.
func waitLooks(t *testing.T, rb *fakeWaker, n int64) {
	t.Helper()
	for end := time.Now().Add(10 * time.Second); rb.looks.Load() < n; time.Sleep(time.Millisecond) {
		if time.Now().After(end) {
			t.Fatal("the wait never looked at the ring")
		}
	}
}

// waitDone returns a wait's error, with a timeout.
func waitDone(t *testing.T, done chan error) error {
	t.Helper()
	select {
	case err := <-done:
		return err
	case <-time.After(10 * time.Second):
		t.Fatal("the wait did not end")
		return nil
	}
}

// AtOnce counts the waits that found a ring moved and did not park; a wait
// that parked, and timed out after a ring moved with no event (below its
// wakeup threshold), reports the move but is not one.
func TestWaiterAtOnce(t *testing.T) {
	w, _, rb := newWakerSet(t)
	check := func(what string, atOnce, wakeups uint64) {
		t.Helper()
		if got := w.AtOnce(); got != atOnce {
			t.Errorf("%s: %d at once, want %d", what, got, atOnce)
		}
		if got := w.Wakeups(); got != wakeups {
			t.Errorf("%s: %d wakeups, want %d", what, got, wakeups)
		}
	}

	rb.head.Add(8) // moved before the wait, no event
	if ev, err := w.Wait(time.Minute, 0); err != nil || !ev {
		t.Fatalf("wait: %v, %v", ev, err)
	}
	check("a ring moved before", 1, 0)

	// Parked, then the ring moves with no event: the timeout ends the
	// wait, which reports the move.
	done := make(chan error)
	var ev bool
	from := rb.looks.Load()
	go func() {
		var err error
		ev, err = w.Wait(200*time.Millisecond, 0)
		done <- err
	}()
	waitLooks(t, rb, from+2)
	rb.head.Add(8)
	if err := waitDone(t, done); err != nil || !ev {
		t.Fatalf("wait: %v, %v", ev, err)
	}
	check("a ring moved while parked", 1, 0)

	// A timeout with nothing moved: neither.
	if ev, err := w.Wait(time.Millisecond, 0); err != nil || ev {
		t.Fatalf("wait: %v, %v", ev, err)
	}
	check("a timeout", 1, 0)
}

// fullWaker is a ring that was full before the waiter took it: its
// producer position moves no more (every output is refused), and its
// consumer position is where the reader has not read yet.
type fullWaker struct{ consumer, producer uint64 }

func (f *fullWaker) Progress() uint64                       { return f.producer }
func (f *fullWaker) Settle() bool                           { return true }
func (f *fullWaker) Positions() (consumer, producer uint64) { return f.consumer, f.producer }

// A ring that holds records when it is added counts as moved at the first
// wait, whose caller then drains it: a ring already full moves no more,
// and its records would wait for ever. (A perf event array's reader whose
// rings filled between their slots' filling and AddRing delivered nothing
// in callback mode: Poll timed out again and again, selftest/crossproc's
// NewKilled about 1 run in 20.) An empty ring does not.
func TestWaiterRingFullWhenAdded(t *testing.T) {
	for _, tc := range []struct {
		name string
		rb   *fullWaker
		want bool
	}{
		{"full", &fullWaker{consumer: 0, producer: 8192}, true},
		{"empty", &fullWaker{consumer: 8192, producer: 8192}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w, err := New()
			if err != nil {
				t.Fatal(err)
			}
			defer w.Close()
			efd, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
			if err != nil {
				t.Fatal(err)
			}
			defer unix.Close(efd)
			if err := w.AddRing(tc.rb, efd); err != nil {
				t.Fatal(err)
			}
			ev, err := w.Wait(time.Millisecond, 0)
			if err != nil || ev != tc.want {
				t.Fatalf("first wait: %v, %v; want %v", ev, err, tc.want)
			}
			// Seen now: the next wait, with nothing new, times out.
			if ev, err := w.Wait(time.Millisecond, 0); err != nil || ev {
				t.Fatalf("second wait: %v, %v; want false", ev, err)
			}
		})
	}
}
