// SPDX-License-Identifier: Apache-2.0

// Package wait holds what the owners of rings share to wait and to stop:
// the wait on the rings' wakeups in epoll (poller.go), the
// lifetime that lets Close run while calls are in progress (lifetime.go),
// and the finding of a call from inside a callback that would wait for
// itself (reentry.go).
package wait

// The poller: waiting for the rings' wakeups, and waking a wait from
// another goroutine.
//
// A waiter's epoll set holds every ring's descriptor (its perf event, or
// its ring buffer map) and an eventfd of its own. A wait blocks its thread
// in epoll_wait on the set, as libbpf's C consumer and cilium/ebpf do, its
// timeout the epoll_wait timeout; another goroutine ends it by writing the
// eventfd (Wake: Close, Flush, a new deadline, a context's cancellation, a
// CPU coming online). It was a wait in the Go runtime's netpoller (the set
// registered with os.NewFile, a read deadline for the timeout): there a
// wakeup went through the scheduler's search for work (findRunnable: the
// timers, the run queues of every P, the netpoller), parked and readied
// the goroutine and, with a timer, woke a second thread, where a thread
// blocked in the system call returns from it and goes on (exitsyscall takes
// its P back). docs/performance.md, "A quiet reader", has the figures.
//
// Every descriptor is in the set edge-triggered (EPOLLET): epoll reports a
// ring once for each wakeup its kernel raises, not for as long as it is
// readable. A ring buffer's poll is level-triggered (readable while the
// producer position differs from the consumer's), so a reader that holds
// records without committing them (the ordered Reader's window, a raw view
// between Next and Commit) would find the set readable at once, wait after
// wait, and spin; a perf event's poll clears its readiness when polled, as
// an edge would. The eventfd is never read: each write is an edge.
//
// The set's events do not say that a ring is ready by the time a waiter
// looks: another epoll set over the same perf event (a caller's own loop
// over EpollFD, libbpf's) may take its readiness first, and an event that
// came while the waiter drained is reported after the records it announced
// were read. So the waiter tells by the rings' state: it keeps the
// data_head it last saw of each ring (ring.progress: a ring buffer's also
// says whether the record at its consumer position is busy, whose commit
// moves no position but wakes the reader), and a wait ends when one has
// moved, at once or after an event. A head that moves without a wakeup
// (below WakeupEvents) ends the next wait, not the current one.

import (
	"encoding/binary"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
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
	epfd  int      // the set
	// fdMu guards efd against Close: a Wake after Close must not write a
	// descriptor number the process may have reused.
	fdMu   sync.Mutex
	efd    int               // the eventfd in the set, Wake's; -1 after Close
	events []unix.EpollEvent // the turn's holder's, for epoll_wait
	woken  atomic.Bool       // Wake was called since the last ClearWake
	// turn is held by the goroutine waiting on the set: waits take turns
	// (concurrent Polls), so that a ring's event ends one of them.
	turn    chan struct{}
	closing chan struct{} // closed by wake(true): waits for a turn end
	closed  atomic.Bool
	freed   bool // close was called (for tests)

	// armed is the deadline the turn's holder waited for last (the zero
	// time: none), which later waits keep when it suits them
	// (setDeadline), unless it expired (armedOK false) or a wake came
	// since (wakes, counted by each wake, is no longer armedAt).
	armed   time.Time
	armedOK bool
	armedAt uint64
	wakes   atomic.Uint64
	sets    int // deadlines set by waits (for tests)

	// parked is set by a wait about to block in epoll_wait: a ring's event
	// from then on ends it as a wakeup. wakeups counts the blocked waits a
	// ring's event ended (Wakeups); polls, the returns from a blocking
	// epoll_wait (for tests: a set that stays readable would spin).
	parked  atomic.Bool
	wakeups atomic.Uint64
	polls   atomic.Uint64
	yielded time.Time // the turn's holder's last runtime.Gosched
}

// eventfdOne is what Wake writes: 1, as eventfd's native-endian uint64.
var eventfdOne = func() (b [8]byte) {
	binary.NativeEndian.PutUint64(b[:], 1)
	return b
}()

// eventsPerWait is how many events one epoll_wait takes; the rest stay
// in the set for the next (a wait looks at every ring anyway).
const eventsPerWait = 16

// New returns a Waiter over no ring yet (see AddRing).
func New() (*Waiter, error) {
	w := &Waiter{turn: make(chan struct{}, 1), closing: make(chan struct{}), efd: -1,
		events: make([]unix.EpollEvent, eventsPerWait)}
	epfd, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("create epoll: %w", err)
	}
	w.epfd = epfd
	// Non-blocking: a write at the counter's limit (2^64-2 wakes) fails
	// rather than block the waker; the edge it would raise is pending.
	efd, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
	if err != nil {
		unix.Close(epfd)
		return nil, fmt.Errorf("create eventfd: %w", err)
	}
	w.efd = efd
	if err := w.add(efd); err != nil {
		w.Close()
		return nil, fmt.Errorf("add eventfd to epoll: %w", err)
	}
	return w, nil
}

// AddRing watches one more ring, whose pollable descriptor is fd (its perf
// event, or its ring buffer map). A wait in progress on another goroutine
// watches it from then on.
func (w *Waiter) AddRing(rb ring.Waker, fd int) error {
	if err := w.add(fd); err != nil {
		return fmt.Errorf("add ring to epoll: %w", err)
	}
	w.mu.Lock()
	w.rings = append(w.rings, rb)
	w.seen = append(w.seen, rb.Progress())
	w.mu.Unlock()
	return nil
}

// add puts fd in the set, edge-triggered (see the top of this file).
func (w *Waiter) add(fd int) error {
	ev := unix.EpollEvent{Events: unix.EPOLLIN | unix.EPOLLET, Fd: int32(fd)}
	return unix.EpollCtl(w.epfd, unix.EPOLL_CTL_ADD, fd, &ev)
}

// Wake makes the current wait return, and every later one until clearWake;
// for Close (closing), it also ends the waits for a turn, for good.
//
// It sets woken, then writes the eventfd, which ends a wait blocked in
// epoll_wait; a wait looks at woken after each epoll_wait returns (and
// before the first), so either it sees woken or the write ends its
// epoll_wait. The write's event stays in the set until a wait takes it:
// a wake with no wait in progress costs the next wait one epoll_wait that
// returns at once.
func (w *Waiter) Wake(closing bool) {
	w.woken.Store(true)
	w.wakes.Add(1)
	w.fdMu.Lock()
	if w.efd >= 0 {
		_, _ = unix.Write(w.efd, eventfdOne[:]) // EAGAIN at the counter's limit: an edge is pending
	}
	w.fdMu.Unlock()
	if closing && !w.closed.Swap(true) {
		close(w.closing)
	}
}

// WakeOpen is wake(false) unless l, the owner's lifetime, is closed (and
// the set perhaps gone): for wakes from other goroutines that may come
// after Close (a CPU coming online, a context's cancellation, a deadline).
func (w *Waiter) WakeOpen(l *Lifetime) {
	if l.Enter("") == nil {
		w.Wake(false)
		l.Exit()
	}
}

// ClearWake takes back a wake that was not Close's.
func (w *Waiter) ClearWake() { w.woken.Store(false) }

// Wait blocks until a ring's data_head has moved since the waiter last
// looked, or wake was called, or timeout passes (negative: no limit; zero:
// do not block). With a slack it may end up to slack after the timeout, or
// before it, at a deadline an earlier wait set (setDeadline); without one,
// up to a millisecond after it (epoll_wait's unit). It reports whether it
// ended for the rings or a wake, or timed out with a head moved (records
// below the wakeup threshold).
//
// Waits take turns on the set (concurrent Polls): the timeout counts from
// the call, so a wait for another's turn to end comes out of it.
func (w *Waiter) Wait(timeout, slack time.Duration) (bool, error) {
	if w.woken.Load() {
		return true, nil
	}
	var deadline time.Time
	if timeout > 0 {
		deadline = time.Now().Add(timeout)
	}
	if ok, ended := w.takeTurn(timeout); !ok {
		return ended, nil
	}
	defer w.endTurn()
	if w.moved() {
		return true, nil
	}
	if timeout == 0 || w.woken.Load() {
		return w.woken.Load(), nil
	}
	var now time.Time // (not the call's: the wait for a turn took some)
	if timeout > 0 {
		now = time.Now()
	}
	w.setDeadline(now, deadline, slack) // the zero time for no timeout
	for {
		n, expired, err := w.epollWait()
		if err != nil {
			return false, err
		}
		if w.woken.Load() {
			w.moved() // what came below the wakeup threshold goes with it
			return true, nil
		}
		if n > 0 && w.moved() {
			w.wakeups.Add(1) // blocked, and a ring moved
			return true, nil
		}
		if expired {
			w.armedOK = false
			return w.moved(), nil
		}
		// An event whose records were read already, another set's taking
		// of a perf event's readiness, a wake taken back, or an
		// epoll_wait ended before its time: wait on.
	}
}

// takeTurn takes the set for a wait of timeout, waiting for another
// wait's turn to end within it. ok reports whether the turn was taken; if
// not, ended is what the wait returns (Close's wake ended it).
func (w *Waiter) takeTurn(timeout time.Duration) (ok, ended bool) {
	select {
	case w.turn <- struct{}{}:
		return true, false
	default:
	}
	if timeout == 0 {
		return false, false // another goroutine waits: it will look
	}
	var expired <-chan time.Time
	if timeout > 0 {
		t := time.NewTimer(timeout)
		defer t.Stop()
		expired = t.C
	}
	select {
	case w.turn <- struct{}{}:
		return true, false
	case <-expired:
		return false, false
	case <-w.closing:
		return false, true
	}
}

// endTurn ends the turn's holder's wait.
func (w *Waiter) endTurn() {
	w.parked.Store(false)
	<-w.turn
}

// epollWait blocks in epoll_wait until an event or the armed deadline
// (none: no limit), and returns the number of events and whether the
// deadline has passed. Only the turn's holder calls it. Its thread stays
// in the system call; the Go runtime hands the thread's P to others only
// if work waits for it, or after 10 ms (sysmon's retake).
func (w *Waiter) epollWait() (n int, expired bool, err error) {
	msec := -1
	if !w.armed.IsZero() {
		left := time.Until(w.armed)
		if left <= 0 {
			return 0, true, nil
		}
		// Rounded up: never before the deadline.
		msec = int(min((left+time.Millisecond-1)/time.Millisecond, 1<<30))
	}
	w.parked.Store(true)
	// A pass through the scheduler (schedtick) every 5 ms, without which
	// sysmon takes the P of a goroutine that goes from one system call to
	// the next for 10 ms as a long runner's, and every wakeup after.
	if now := time.Now(); now.Sub(w.yielded) > 5*time.Millisecond {
		w.yielded = now
		runtime.Gosched()
	}
	n, err = unix.EpollWait(w.epfd, w.events, msec)
	w.polls.Add(1)
	if err == unix.EINTR {
		return 0, false, nil
	}
	if err != nil {
		return 0, false, fmt.Errorf("wait on epoll: %w", err)
	}
	return n, n == 0 && msec >= 0 && !time.Now().Before(w.armed), nil
}

// setDeadline arms a deadline by from+slack (the zero from: none), for the
// turn's holder. With a slack it keeps the deadline armed last if that
// one is still ahead and not later than from+slack, and no wake came
// since; it may then be earlier than from, and the wait end early. A
// reader that waits once a sample for a deadline a little later each time
// (the ordered Reader's rule 3) would otherwise have its timer fire once
// per due record; kept, it fires at most once a slack while samples come.
func (w *Waiter) setDeadline(now, from time.Time, slack time.Duration) {
	to := from
	if !from.IsZero() {
		to = from.Add(slack)
	}
	wakes := w.wakes.Load()
	if w.armedOK && w.armedAt == wakes && w.armed.IsZero() == from.IsZero() &&
		(from.IsZero() || slack > 0 && w.armed.After(now) && !w.armed.After(to)) {
		return
	}
	w.armed, w.armedOK, w.armedAt = to, true, wakes
	w.sets++
}

// WaitEvent blocks until the next wakeup of a ring after the call (not one
// before it, nor a head that moved without one), a wake, or timeout: a ring
// buffer's reader holding off its drain below its watermark (see
// Options.WakeupBytes), which the kernel, whose wakeups it thins, ends with
// a forced wakeup at the watermark. While another goroutine waits on the
// set it does not hold off. It takes the heads as they are at its end.
func (w *Waiter) WaitEvent(timeout time.Duration) error {
	if w.woken.Load() || timeout <= 0 {
		return nil
	}
	select {
	case w.turn <- struct{}{}:
	default:
		return nil
	}
	defer w.endTurn()
	now := time.Now()
	w.setDeadline(now, now.Add(timeout), 0)
	// The events already in the set came before the call: taken without
	// waiting, they do not end it.
	for {
		n, err := unix.EpollWait(w.epfd, w.events, 0)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return fmt.Errorf("wait on epoll: %w", err)
		}
		if n < len(w.events) {
			break
		}
	}
	for !w.woken.Load() {
		n, expired, err := w.epollWait()
		if err != nil {
			return err
		}
		if w.woken.Load() {
			break
		}
		if w.ringEvent(n) {
			w.wakeups.Add(1) // the ring's event after the call
			break
		}
		if expired {
			w.armedOK = false
			break
		}
	}
	w.moved()
	return nil
}

// ringEvent reports whether the first n events of the last epoll_wait
// name a ring (not the eventfd).
func (w *Waiter) ringEvent(n int) bool {
	for _, ev := range w.events[:n] {
		if int(ev.Fd) != w.efd {
			return true
		}
	}
	return false
}

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
// eventfd closed and does nothing.
func (w *Waiter) Close() {
	w.fdMu.Lock()
	if w.efd >= 0 {
		unix.Close(w.efd)
		w.efd = -1
	}
	if w.epfd >= 0 {
		unix.Close(w.epfd)
		w.epfd = -1
	}
	w.fdMu.Unlock()
	w.freed = true
}

// Wakeups counts the waits (Wait, WaitEvent) that blocked and were ended
// by a ring's event: not by a timeout or a wake (Close, Flush, a deadline,
// a CPU coming online). Any goroutine may call it, also after Close.
func (w *Waiter) Wakeups() uint64 { return w.wakeups.Load() }

// Woken reports whether Wake was called since the last ClearWake.
func (w *Waiter) Woken() bool { return w.woken.Load() }

// Freed reports whether Close was called; Sets counts the deadlines waits
// armed. Both for tests of the owners above.
func (w *Waiter) Freed() bool { return w.freed }
func (w *Waiter) Sets() int   { return w.sets }

// Parked reports whether a Wait is blocked in epoll_wait, or about to be:
// a ring's event from then on ends it as a wakeup. For tests.
func (w *Waiter) Parked() bool { return w.parked.Load() }

// Waiting reports whether a wait holds the turn (is in epoll_wait or
// about to be): for tests.
func (w *Waiter) Waiting() bool { return len(w.turn) > 0 }
