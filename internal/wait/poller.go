// SPDX-License-Identifier: Apache-2.0

// Package wait holds what the owners of rings share to wait and to stop:
// the wait on the rings' wakeups in the netpoller (poller.go), the
// lifetime that lets Close run while calls are in progress (lifetime.go),
// and the finding of a call from inside a callback that would wait for
// itself (reentry.go).
package wait

// The poller: waiting for the rings' wakeups, and waking a wait from
// another goroutine.
//
// A waiter's epoll set holds every ring's perf event. The set's own
// descriptor is pollable, and it is registered with the Go
// runtime's netpoller (os.NewFile on a non-blocking descriptor): a blocked
// Wait parks its goroutine, the thread and its P go on with other work, and
// the wait's timeout is the descriptor's read deadline, one runtime timer
// per waiter. A wakeup costs the thread that polls the netpoller one
// switch, as C's epoll_wait does.
//
// A wait blocked in epoll_wait on its own thread (libbpf's way, and
// cilium/ebpf's) was built and measured beside it (docs/performance.md,
// "A quiet reader"): 2.5-5 context switches a wakeup. A goroutine that
// goes from one system call to the next never passes the scheduler, so
// after 10 ms sysmon takes it for a long runner and retakes its P at every
// wait, and each wakeup then wakes sysmon as well (exitsyscall). With a
// runtime.Gosched every 5 ms it made 1.1 switches a wakeup at 3,000 a
// second but 2.1 at 300 (the Gosched wakes another thread, and sysmon,
// awake while a P is in a system call, ticks every 10 ms).
// (A timerfd in the set, for the timeout, was tried: re-arming it woke the
// set, a wasted wakeup on every wait; docs/performance.md.)
//
// A ring buffer's poll is level-triggered: its map is readable while the
// producer position differs from the consumer's, so also while a reader
// holds records without committing them (the ordered Reader's window, a
// raw view between Next and Commit). That does not make a wait spin: the
// runtime's epoll holds the set edge-triggered, so only a ring's wakeup
// raises a new event, and a wait ends by the rings' progress, not their
// readiness (TestWaiterHeldRecordNoSpin).
//
// The set's readiness cannot say which ring, nor even that one is ready by
// the time a waiter looks: perf_poll clears a ring's readiness when it is
// polled (atomic_xchg(&rb->poll, 0) in kernel/events/core.c), and the
// runtime's epoll polls the set, so the rings in it, before it reports the
// set readable; and the netpoller forgets an event that came while nobody
// waited (RawConn.Read resets the descriptor's readiness before it looks).
// So the waiter tells by the rings' state: it keeps the data_head it last
// saw of each ring (ring.progress: a ring buffer's also says whether the
// record at its consumer position is busy, whose commit moves no position
// but wakes the reader), and a wait ends when one has moved, at once or
// after an event. A head that moves without a wakeup (below WakeupEvents) ends the
// next wait, not the current one.

import (
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/perfbuf/perfbuf/internal/ring"
	"golang.org/x/sys/unix"
)

// Waiter blocks until one of a set of rings signals a wakeup, a timeout
// passes, or another goroutine wakes it (Close, Flush, a new deadline).
type Waiter struct {
	// mu guards rings and seen: rings are added (addRing) by the owner's
	// drains, which a wait on another goroutine does not exclude.
	mu    sync.Mutex
	rings []ring.Waker
	seen  []uint64 // rings[i].Progress() (its data_head) when the waiter last looked
	epfd  int      // the set; file owns it
	file  *os.File // the epoll set, in the netpoller; closing it closes the set
	rc    syscall.RawConn
	// ready is wait's function for rc.Read, made once: a func literal
	// passed there would escape, an allocation a wait.
	ready func(uintptr) bool
	woken atomic.Bool // Wake was called since the last ClearWake
	// turn is held by the goroutine waiting in the netpoller: the set's
	// read deadline is one, so waits on it take turns (concurrent Polls).
	turn    chan struct{}
	closing chan struct{} // closed by wake(true): waits for a turn end
	closed  atomic.Bool
	freed   bool // close was called (for tests)

	// armed is the read deadline the turn's holder set last (the zero
	// time: none), which later waits keep when it suits them (setDeadline),
	// unless it expired (armedOK false) or a wake moved it (wakes, counted
	// before each wake moves the deadline, is no longer armedAt).
	armed   time.Time
	armedOK bool
	armedAt uint64
	wakes   atomic.Uint64
	sets    int // deadlines set by waits (for tests)

	// looks counts the calls of ready in the turn's netpoller read: past
	// the first, the wait had parked. wakeups counts the parked waits a
	// ring's event ended (Wakeups); atOnce the waits that found a ring
	// moved and did not park (AtOnce).
	looks   atomic.Int32 // (atomic for Parked; one add a look, not a record)
	wakeups atomic.Uint64
	atOnce  atomic.Uint64
}

// New returns a Waiter over no ring yet (see AddRing).
func New() (*Waiter, error) {
	w := &Waiter{turn: make(chan struct{}, 1), closing: make(chan struct{})}
	w.ready = func(uintptr) bool {
		w.looks.Add(1)
		return w.woken.Load() || w.moved()
	}
	epfd, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("create epoll: %w", err)
	}
	if err := unix.SetNonblock(epfd, true); err != nil {
		unix.Close(epfd)
		return nil, fmt.Errorf("create epoll: %w", err)
	}
	// Non-blocking, so os.NewFile registers it with the netpoller; it
	// owns epfd from here on.
	w.file, w.epfd = os.NewFile(uintptr(epfd), "perfbuf epoll"), epfd
	if w.rc, err = w.file.SyscallConn(); err != nil {
		w.Close()
		return nil, fmt.Errorf("epoll set: %w", err)
	}
	// A descriptor the netpoller took has deadlines; one it refused
	// (never for epoll) would fail here with os.ErrNoDeadline.
	if err := w.file.SetReadDeadline(time.Time{}); err != nil {
		w.Close()
		return nil, fmt.Errorf("epoll set in the netpoller: %w", err)
	}
	return w, nil
}

// AddRing watches one more ring, whose pollable descriptor is fd (its perf
// event, or its ring buffer map). A ring that already holds records when
// it is added (one that rb's Positions says is not empty) counts as moved
// at the first look: it may be full already, and a full ring's producer
// moves no more, so that a wait that took its position as seen would never
// end for it.
func (w *Waiter) AddRing(rb ring.Waker, fd int) error {
	if err := w.add(w.epfd, fd); err != nil {
		return fmt.Errorf("add ring to epoll: %w", err)
	}
	seen := rb.Progress()
	if p, ok := rb.(positioner); ok {
		if consumer, producer := p.Positions(); consumer != producer && seen != consumer {
			seen = consumer // not the progress: the first look sees a move
		}
	}
	w.mu.Lock()
	w.rings = append(w.rings, rb)
	w.seen = append(w.seen, seen)
	w.mu.Unlock()
	return nil
}

// positioner is a ring that says its consumer and producer positions
// (ring.Cursor's Positions).
type positioner interface {
	Positions() (consumer, producer uint64)
}

func (w *Waiter) add(epfd, fd int) error {
	ev := unix.EpollEvent{Events: unix.EPOLLIN, Fd: int32(fd)}
	return unix.EpollCtl(epfd, unix.EPOLL_CTL_ADD, fd, &ev)
}

// Wake makes the current wait return, and every later one until clearWake;
// for Close (closing), it also ends the waits for a turn, for good.
//
// It needs no descriptor of its own: it sets
// woken, then moves the set's read deadline into the past, which ends a
// Wait parked in the netpoller. A wait sets its own deadline before it
// looks at woken, and the deadline set last wins (the runtime's pollDesc
// lock orders them), so either the wait sees woken or the past deadline
// ends it.
func (w *Waiter) Wake(closing bool) {
	w.woken.Store(true)
	w.wakes.Add(1)
	_ = w.file.SetReadDeadline(aLongTimeAgo) // os.ErrClosed after close: nothing waits
	if closing && !w.closed.Swap(true) {
		close(w.closing)
	}
}

// aLongTimeAgo is a deadline in the past: it ends a wait at once.
var aLongTimeAgo = time.Unix(1, 0)

// WakeOpen is wake(false) unless l, the owner's lifetime, is closed: for
// wakes from other goroutines that may come after Close (a CPU coming
// online, a context's cancellation, a deadline, a ring buffer's takeover
// won). It enters no call of l, so that it never holds the owner's free
// past Close's return (a Close that met a call under way would return
// before free, which the call's exit would run later, or never if the
// process exits first). It needs none: a wake that races Close finds the
// set either open or closed, and the closed set's deadline fails with
// os.ErrClosed (the *os.File's own reference count orders it with the
// close), which ends nothing.
func (w *Waiter) WakeOpen(l *Lifetime) {
	if !l.Closed() {
		w.Wake(false)
	}
}

// ClearWake takes back a wake that was not Close's. (The next wait sets
// its deadline afresh.)
func (w *Waiter) ClearWake() { w.woken.Store(false) }

// Wait blocks until a ring's data_head has moved since the waiter last
// looked, or wake was called, or timeout passes (negative: no limit; zero:
// do not block). With a slack it may end up to slack after the timeout, or
// before it, at a deadline an earlier wait set (setDeadline); without
// one, up to sameDeadline (100 µs) either side of it. It reports
// whether it ended for the rings or a wake, or timed out with a head moved
// (records below the wakeup threshold).
//
// Waits take turns on the set (concurrent Polls): the timeout counts from
// the call, so a wait for another's turn to end comes out of it.
func (w *Waiter) Wait(timeout, slack time.Duration) (bool, error) {
	if w.woken.Load() {
		return true, nil
	}
	var start, deadline time.Time
	if timeout > 0 {
		start = time.Now()
		deadline = start.Add(timeout)
	}
	now := start
	select {
	case w.turn <- struct{}{}:
	default:
		if timeout == 0 {
			return false, nil // another goroutine waits: it will look
		}
		// Another goroutine waits on the set: wait for its turn to end,
		// within timeout.
		var expired <-chan time.Time
		if timeout > 0 {
			t := time.NewTimer(timeout)
			defer t.Stop()
			expired = t.C
		}
		select {
		case w.turn <- struct{}{}:
		case <-expired:
			return false, nil
		case <-w.closing:
			return true, nil
		}
		if timeout > 0 {
			now = time.Now() // the wait for a turn took some
			timeout = max(deadline.Sub(now), 0)
		}
	}
	defer func() {
		w.looks.Store(0)
		<-w.turn
	}()
	if w.moved() {
		w.atOnce.Add(1)
		return true, nil
	}
	if timeout == 0 || w.woken.Load() {
		return w.woken.Load(), nil
	}
	// Set before woken is looked at again: a wake moves it into the
	// past (see wake).
	w.setDeadline(now, deadline, slack) // the zero time for no timeout
	// The function runs at once, then after each event on the set.
	err := w.rc.Read(w.ready)
	if errors.Is(err, os.ErrDeadlineExceeded) {
		// A wake, or the timeout: what came below the wakeup threshold
		// goes with it.
		w.armedOK = false
		return w.moved() || w.woken.Load(), nil
	}
	if err != nil {
		return false, fmt.Errorf("wait on epoll: %w", err)
	}
	switch {
	case w.woken.Load(): // a wake: neither
	case w.looks.Load() > 1:
		w.wakeups.Add(1) // parked, and a ring moved
	default:
		w.atOnce.Add(1) // the netpoller's first look found a ring moved
	}
	return true, nil
}

// setDeadline gives the set a read deadline by from+slack (the zero from:
// none), for the turn's holder. With a slack it keeps the deadline set last
// if that one is still ahead and not later than from+slack, and no wake
// may have moved it since; it may then be earlier than from, and the wait
// end early. Moving a runtime timer later costs the runtime's threads
// context switches (modtimer wakes one to look at timers again, and the
// netpoller and sysmon, asleep until the old time, wake for nothing),
// where letting it fire costs one wakeup: a reader that waits once a
// sample for a deadline a little later each time (the ordered Reader's
// rule 3) would move it once a sample. Kept, it fires at most once a slack
// while samples come.
//
// Without a slack it keeps a deadline within sameDeadline of from: the
// same deadline, which the caller turned into a timeout and the wait back
// into a time (a Reader's SetDeadline, a Poll until a time), each wait a
// few hundred ns later. Setting it again cost every wakeup about 3 % of the
// reader's CPU (os.File.SetReadDeadline, the runtime timer's modify).
func (w *Waiter) setDeadline(now, from time.Time, slack time.Duration) {
	to := from
	if !from.IsZero() {
		to = from.Add(slack)
	}
	wakes := w.wakes.Load()
	keep := w.armedOK && w.armedAt == wakes && w.armed.IsZero() == from.IsZero()
	if keep && !from.IsZero() {
		late := w.armed.Sub(to) // how much later than wanted the armed one is
		keep = w.armed.After(now) && (slack > 0 && late <= 0 || late.Abs() <= sameDeadline)
	}
	if keep {
		return
	}
	w.file.SetReadDeadline(to)
	w.armed, w.armedOK, w.armedAt = to, true, wakes
	w.sets++
}

// sameDeadline is how far apart two deadlines may be and be the same one
// (setDeadline): far above the time between a caller's clock reading and
// the wait's, far below any timeout a reader sets.
const sameDeadline = 100 * time.Microsecond

// moved reports whether a ring's data_head has moved since the last look,
// and takes the new heads. Only the goroutine that holds the turn, or the
// one wait that cannot block, calls it.
func (w *Waiter) moved() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	m := false
	for i, rb := range w.rings {
		if h := rb.Progress(); h != w.seen[i] {
			w.seen[i], m = h, true
		}
	}
	return m
}

// Close frees the set; no wait may be in progress. A later wake finds the
// file closed and does nothing.
func (w *Waiter) Close() {
	if w.file != nil {
		w.file.Close()
	}
	w.freed = true
}

// Wakeups counts the waits that blocked and were ended
// by a ring's event: not by a timeout or a wake (Close, Flush, a deadline,
// a CPU coming online). Any goroutine may call it, also after Close.
func (w *Waiter) Wakeups() uint64 { return w.wakeups.Load() }

// AtOnce counts the waits (Wait) that returned at once because a ring had
// moved: they did not park. A wait that parked and then timed out, a ring
// having moved below its wakeup threshold meanwhile, is not one.
func (w *Waiter) AtOnce() uint64 { return w.atOnce.Load() }

// Woken reports whether Wake was called since the last ClearWake.
func (w *Waiter) Woken() bool { return w.woken.Load() }

// Freed reports whether Close was called; Sets counts the deadlines waits
// set on the netpoller. Both for tests of the owners above.
func (w *Waiter) Freed() bool { return w.freed }
func (w *Waiter) Sets() int   { return w.sets }

// Parked reports whether a Wait looked at the rings in the netpoller: a
// ring's event from then on ends it as a wakeup. For tests.
func (w *Waiter) Parked() bool { return w.looks.Load() > 0 }

// Waiting reports whether a wait holds the turn (is in the netpoller or
// about to be): for tests.
func (w *Waiter) Waiting() bool { return len(w.turn) > 0 }
