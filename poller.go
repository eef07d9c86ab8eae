package perfbuf

// The poller: waiting for rings to become readable, and waking a wait from
// another goroutine.

import (
	"encoding/binary"
	"fmt"
	"time"

	"golang.org/x/sys/unix"
)

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
