package perfbuf

import (
	"encoding/binary"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
)

// lifetime lets Close run while calls are in progress on other goroutines
// (or on the same one, from a callback): calls enter and exit, Close marks
// the object closed, and whoever leaves last runs free. So nothing is
// unmapped or closed under a call that still uses it. It is lock-free: a
// call costs two atomic operations.
//
// Exclusive calls (a reader's reads) also exclude each other: the first
// takes busyBit in the same atomic operation, later ones wait for it.
type lifetime struct {
	state    atomic.Int64 // calls in progress, plus closedBit and busyBit
	freeOnce sync.Once
	free     func()

	// callbacks names the functions that run callbacks during exclusive
	// calls (see reentry.go): called from under one of them, an exclusive
	// call fails with ErrReentrant rather than wait.
	callbacks []string

	waiters atomic.Int32 // exclusive calls waiting for busyBit
	mu      sync.Mutex   // with cond: where they wait
	cond    *sync.Cond
}

const (
	closedBit = 1 << 62
	busyBit   = 1 << 61
)

// enter registers a call in progress; it fails once closed.
func (l *lifetime) enter(op string) error {
	for {
		s := l.state.Load()
		if s&closedBit != 0 {
			return fmt.Errorf("%s: %w", op, os.ErrClosed)
		}
		if l.state.CompareAndSwap(s, s+1) {
			return nil
		}
	}
}

// exit ends a call; the last one out after close frees.
func (l *lifetime) exit() {
	if l.state.Add(-1) == closedBit {
		l.freeOnce.Do(l.free)
	}
}

// enterExclusive is enter for a call that excludes other exclusive calls:
// it waits while one is in progress, unless it is called from inside a
// callback (see callbacks).
func (l *lifetime) enterExclusive(op string) error {
	for checked := false; ; {
		s := l.state.Load()
		switch {
		case s&closedBit != 0:
			return fmt.Errorf("%s: %w", op, os.ErrClosed)
		case s&busyBit == 0:
			if l.state.CompareAndSwap(s, (s+1)|busyBit) {
				return nil
			}
		case !checked && inCallback(l.callbacks):
			return fmt.Errorf("%s: %w", op, ErrReentrant)
		default:
			checked = true
			l.waitNotBusy()
		}
	}
}

// waitNotBusy blocks until busyBit is clear or l is closed.
func (l *lifetime) waitNotBusy() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.cond == nil {
		l.cond = sync.NewCond(&l.mu)
	}
	l.waiters.Add(1)
	defer l.waiters.Add(-1)
	// exitExclusive clears busyBit before it looks at waiters, and
	// broadcasts under mu: either it sees this waiter, or this loop sees
	// the bit clear.
	for s := l.state.Load(); s&busyBit != 0 && s&closedBit == 0; s = l.state.Load() {
		l.cond.Wait()
	}
}

// exitExclusive ends an exclusive call.
func (l *lifetime) exitExclusive() {
	s := l.state.Add(-(1 + busyBit))
	if l.waiters.Load() > 0 {
		l.mu.Lock()
		l.cond.Broadcast()
		l.mu.Unlock()
	}
	if s == closedBit {
		l.freeOnce.Do(l.free)
	}
}

// closed reports whether close was called.
func (l *lifetime) closed() bool { return l.state.Load()&closedBit != 0 }

// close marks l closed, runs wake (to interrupt blocked calls) and frees at
// once if no call is in progress. It reports false if l was closed already.
func (l *lifetime) close(wake func()) bool {
	for {
		s := l.state.Load()
		if s&closedBit != 0 {
			return false
		}
		// Close counts as a call until it has woken the others, so that
		// nothing is freed under wake.
		if l.state.CompareAndSwap(s, (s+1)|closedBit) {
			break
		}
	}
	wake()
	l.exit()
	return true
}

// wakeTag is the epoll data of a waiter's eventfd; rings use their index.
const wakeTag = -1

// waiter blocks in epoll_wait on a set of rings plus an eventfd that other
// goroutines write to interrupt the wait (Close, Flush, a new deadline).
type waiter struct {
	epfd   int
	wakefd int
}

// newWaiter watches fds, reporting fds[i] ready as index i.
func newWaiter(fds []int) (*waiter, error) {
	w := &waiter{epfd: -1, wakefd: -1}
	var err error
	if w.epfd, err = unix.EpollCreate1(unix.EPOLL_CLOEXEC); err != nil {
		return nil, fmt.Errorf("create epoll: %w", err)
	}
	if w.wakefd, err = unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK); err != nil {
		w.close()
		return nil, fmt.Errorf("create eventfd: %w", err)
	}
	if err := w.add(w.wakefd, wakeTag); err != nil {
		w.close()
		return nil, fmt.Errorf("add eventfd to epoll: %w", err)
	}
	for i, fd := range fds {
		if err := w.add(fd, int32(i)); err != nil {
			w.close()
			return nil, fmt.Errorf("add ring %d to epoll: %w", i, err)
		}
	}
	return w, nil
}

func (w *waiter) add(fd int, tag int32) error {
	ev := unix.EpollEvent{Events: unix.EPOLLIN, Fd: tag}
	return unix.EpollCtl(w.epfd, unix.EPOLL_CTL_ADD, fd, &ev)
}

// wake makes every current and future wait return until clearWake.
func (w *waiter) wake() {
	var one [8]byte
	binary.NativeEndian.PutUint64(one[:], 1)
	_, _ = unix.Write(w.wakefd, one[:]) // EAGAIN only if the counter is saturated: still readable
}

// clearWake resets the eventfd after a wake that was not Close.
func (w *waiter) clearWake() {
	var buf [8]byte
	_, _ = unix.Read(w.wakefd, buf[:]) // EAGAIN when not set: fine
}

// wait runs epoll_wait for up to timeout (negative: no limit, zero: do not
// block), retrying on EINTR with what is left.
func (w *waiter) wait(evs []unix.EpollEvent, timeout time.Duration) (int, error) {
	var deadline time.Time
	if timeout > 0 {
		deadline = time.Now().Add(timeout)
	}
	for {
		msec := -1 // block
		switch {
		case timeout == 0:
			msec = 0
		case timeout > 0:
			left := max(time.Until(deadline), 0)
			msec = int((left + time.Millisecond - 1) / time.Millisecond)
		}
		n, err := unix.EpollWait(w.epfd, evs, msec)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return 0, fmt.Errorf("epoll wait: %w", err)
		}
		return n, nil
	}
}

func (w *waiter) close() {
	if w.epfd >= 0 {
		unix.Close(w.epfd)
		w.epfd = -1
	}
	if w.wakefd >= 0 {
		unix.Close(w.wakefd)
		w.wakefd = -1
	}
}
