// SPDX-License-Identifier: Apache-2.0

package owner

// Pause and Resume of the owner core, over fake rings and a fake reader
// key: what each call does to the key, reads while paused, Pause and
// Resume racing reads, Close while paused, and the errors. The kernel's
// side is selftest/bpfbuffer's (TestReaderPause).

import (
	"errors"
	"os"
	"runtime"
	"strings"
	"sync"
	"testing"
)

// pausable returns an owner core over a fake ring whose source is ring
// buffers with a failure map of a reader key (key), counted open as
// openRingBufs counts it.
func pausable(t *testing.T, key *fakeReaderKey) (*Core, *fakeRings) {
	t.Helper()
	f, _ := fakeFailureMap([]int{0, 1})
	key.attach(f)
	if err := f.openReader(); err != nil {
		t.Fatal(err)
	}
	rings := newFakeRings(t, 1, 4096)
	c := rings.core(t, nil)
	c.src = &ringBufSource{epfd: -1, failures: f, grace: rcuGrace}
	return c, rings
}

// A Reader over ring buffers pauses through the reader key: Pause marks
// it closed, a second Pause does nothing, reads while paused deliver what
// is in the rings, Resume opens the key again (a second does nothing), and
// Close while paused leaves it closed. After Close, os.ErrClosed.
func TestReaderPauseKey(t *testing.T) {
	key := newFakeReaderKey(t, 2)
	want := func(step string, closed bool) {
		t.Helper()
		if c := key.closed(t); c != closed {
			t.Errorf("%s: key closed %v, want %v", step, c, closed)
		}
	}
	c, rings := pausable(t, key)
	p := defaultPlan
	r := NewReader(c, p)
	defer r.Close()
	want("open", false)
	rings.emit(t, 0, 0, 1, 16)
	for range 2 {
		if err := r.Pause(); err != nil {
			t.Fatal(err)
		}
		want("paused", true)
	}
	if n, err := r.Consume(func(*Record) error { return nil }); n != 1 || err != nil {
		t.Errorf("Consume while paused: %d, %v; want the record in the ring", n, err)
	}
	for range 2 {
		if err := r.Resume(); err != nil {
			t.Fatal(err)
		}
		want("resumed", false)
	}
	if err := r.Pause(); err != nil {
		t.Fatal(err)
	}
	r.Close()
	want("closed while paused", true)
	for _, call := range []func() error{r.Pause, r.Resume} {
		if err := call(); !errors.Is(err, os.ErrClosed) {
			t.Errorf("after Close: %v, want os.ErrClosed", err)
		}
	}
}

// Pause and Resume from one goroutine while another reads and a third
// reads Stats (run with -race): each call is whole, and the key ends as the
// last call left it.
func TestPerfBufferPauseRace(t *testing.T) {
	key := newFakeReaderKey(t, 2)
	c, rings := pausable(t, key)
	var got int
	pb := NewPerfBuffer(c, func(int, []byte) { got++ }, nil)
	defer pb.Close()
	const n = 50
	var wg sync.WaitGroup
	wg.Add(2)
	go func() {
		defer wg.Done()
		for range n {
			if err := pb.Pause(); err != nil {
				t.Error(err)
			}
			if err := pb.Resume(); err != nil {
				t.Error(err)
			}
		}
	}()
	go func() {
		defer wg.Done()
		for range n {
			pb.Stats()
		}
	}()
	for i := range n {
		rings.emit(t, 0, 0, uint64(i), 16)
		if _, err := pb.Consume(); err != nil {
			t.Fatal(err)
		}
	}
	wg.Wait()
	if closed := key.closed(t); got != n || closed {
		t.Errorf("%d delivered, key closed %v; want %d, open", got, closed, n)
	}
}

// Rings that are neither a perf event array's nor ring buffers with a
// reader key cannot be paused: errors.ErrUnsupported, naming the
// FailureMap, for both calls.
func TestPauseUnsupported(t *testing.T) {
	r := newFakeRings(t, 1, 4096).reader(t, nil, defaultPlan)
	for _, call := range []func() error{r.Pause, r.Resume} {
		if err := call(); !errors.Is(err, errors.ErrUnsupported) || !strings.Contains(err.Error(), "FailureMap") {
			t.Errorf("%v, want errors.ErrUnsupported naming FailureMap", err)
		}
	}
	key := newFakeReaderKey(t, 2)
	c, _ := pausable(t, key)
	c.src.(*ringBufSource).failures.reader = false // a map of one entry: no reader key
	r = NewReader(c, defaultPlan)
	defer r.Close()
	if err := r.Pause(); !errors.Is(err, errors.ErrUnsupported) {
		t.Errorf("a failure map without a reader key: %v, want errors.ErrUnsupported", err)
	}
}

// Close does not wait for a Pause's grace period (nor a Resume waiting for
// the Pause): a blocked read returns os.ErrClosed, Close returns, and the
// rings are freed and the map unclaimed, all while the Pause still waits
// for its grace period.
// (The Pause used to wait inside the owner's lifetime: the rings were freed,
// and the map unclaimed, only when it and the Resume behind it returned, a
// second and more on a loaded host.) The Pause then returns, and the
// Resume finds the reader closed.
func TestCloseDuringPauseGrace(t *testing.T) {
	key := newFakeReaderKey(t, 2)
	c, _ := pausable(t, key)
	const id = 0xed9e5 // a map ID of the test's own: the source claims it, as openRingBufs would
	if !claimMap(id) {
		t.Fatal("map id claimed already")
	}
	c.src.(*ringBufSource).ids = []uint32{id}
	inGrace, release := make(chan struct{}), make(chan struct{})
	c.pause.grace = func() error {
		close(inGrace)
		<-release
		return nil
	}
	r, read := parkedRead(t, c)
	paused, resumed := make(chan error, 1), make(chan error, 1)
	go func() { paused <- r.Pause() }()
	within(t, "the pause reaches its grace period", func() { <-inGrace })
	go func() { resumed <- r.Resume() }()
	within(t, "Close", func() { r.Close() })
	within(t, "the read", func() {
		if err := <-read; !errors.Is(err, os.ErrClosed) {
			t.Errorf("read: %v, want os.ErrClosed", err)
		}
	})
	if !c.W.Freed() {
		t.Error("rings not freed while the pause waits for its grace period")
	}
	if !claimMap(id) {
		t.Error("map still claimed while the pause waits for its grace period: a new reader gets ErrMapInUse")
	} else {
		unclaimMap(id)
	}
	if !key.closed(t) {
		t.Error("key open; want closed")
	}
	close(release)
	within(t, "Pause and Resume", func() {
		if err := <-paused; err != nil {
			t.Errorf("Pause: %v", err)
		}
		if err := <-resumed; !errors.Is(err, os.ErrClosed) {
			t.Errorf("Resume: %v, want os.ErrClosed", err)
		}
	})
	if !key.closed(t) {
		t.Error("after the pause: key open; want closed")
	}
}

// A read blocked when Close comes returns os.ErrClosed without freeing:
// Close frees, and waits for the grace period after the reader key closes.
// (The read, the last call out, used to free, and so returned only after
// the grace period.)
func TestCloseFreesNotTheRead(t *testing.T) {
	key := newFakeReaderKey(t, 2)
	c, _ := pausable(t, key)
	inGrace, release := make(chan struct{}), make(chan struct{})
	c.src.(*ringBufSource).grace = func() {
		close(inGrace)
		<-release
	}
	r, read := parkedRead(t, c)
	closed := make(chan struct{})
	go func() {
		r.Close()
		close(closed)
	}()
	within(t, "free reaches its grace period", func() { <-inGrace })
	within(t, "the read, during free's grace period", func() {
		if err := <-read; !errors.Is(err, os.ErrClosed) {
			t.Errorf("read: %v, want os.ErrClosed", err)
		}
	})
	select {
	case <-closed:
		t.Error("Close returned before free's grace period ended: another call freed")
	default:
	}
	close(release)
	within(t, "Close", func() { <-closed })
	if !c.W.Freed() {
		t.Error("rings not freed")
	}
}

// parkedRead returns a Reader with default options over c, and the result
// of a ReadInto that it started and that parked in its wait.
func parkedRead(t *testing.T, c *Core) (*Reader, <-chan error) {
	t.Helper()
	p := defaultPlan
	r := NewReader(c, p)
	read := make(chan error, 1)
	go func() {
		var s Sample
		read <- r.ReadInto(&s)
	}()
	within(t, "the read parks", func() {
		for !c.W.Parked() {
			runtime.Gosched()
		}
	})
	return r, read
}
