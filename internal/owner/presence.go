// SPDX-License-Identifier: Apache-2.0

package owner

// Which readers of a failure map's ring buffers are alive, in every
// process, for its reader key (failuremap.go): liveness that the kernel
// keeps, so that a reader killed without Close leaves nothing behind.
//
// Each reader holds a read lock on byte 0 of a lock file of perfbuf's own,
// one per failure map: /run/perfbuf/failures-<map ID>. The locks are open file
// description locks (fcntl F_OFD_SETLK): they belong to the reader's own
// open of the file, so two readers in one process exclude each other as
// two processes do, and the kernel drops a reader's lock when its file is
// closed, at Close or when its process ends, however it ends.
//
//   - A reader joins by taking its read lock, then marks the key open.
//   - A reader that leaves (Close, Pause) asks for the write lock without
//     waiting: the kernel grants it only if no other reader holds a read
//     lock. Granted, it is the last reader: it marks the key closed while
//     it holds the write lock, so that no reader joins between its look and
//     its mark. Refused, another reader is alive and the key stays open.
//
// A reader that joins while another marks the key closed waits for the
// write lock to go (one update of the key), polling for at most
// joinTimeout: nothing waits without a bound. The lock file is no file that
// other programs use (a BPF map's descriptor is the kernel's one anonymous
// inode, shared with every eventfd, epoll set and timerfd of the host).
//
// Map IDs are the kernel's, unique while the map exists, and /run is empty
// at boot: a lock file outlives its map only until then, and is never
// removed (removing it would let a reader that opened the old file and one
// that creates a new one miss each other). Readers in containers that
// share a pinned map share /run/perfbuf too (docs/failures.md).

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"golang.org/x/sys/unix"
)

// defaultLockDir holds the lock files (a failureMap's lockDir, which
// tests set to a folder of their own). Every process that reads a map must
// use the same one.
const defaultLockDir = "/run/perfbuf"

// joinTimeout bounds a join's wait for a leaving reader's write lock,
// which is held for one update of the reader key.
const joinTimeout = 2 * time.Second

// presence is one reader's open of a failure map's lock file.
type presence struct {
	file *os.File
}

// joinPresence opens the lock file of the failure map with ID id and takes
// a read lock on it. The caller marks the key open after it returns.
func joinPresence(dir string, id uint32) (*presence, error) {
	file, err := openLockFile(dir, fmt.Sprintf("failures-%d", id))
	if err != nil {
		return nil, fmt.Errorf("reader lock: %w", err)
	}
	path := file.Name()
	p := &presence{file: file}
	deadline := time.Now().Add(joinTimeout)
	for pause := 50 * time.Microsecond; ; pause = min(2*pause, 10*time.Millisecond) {
		err := p.lock(unix.F_RDLCK)
		if err == nil {
			return p, nil
		}
		if !conflict(err) || time.Now().After(deadline) {
			file.Close()
			return nil, fmt.Errorf("reader lock %s: take a read lock: %w", path, err)
		}
		time.Sleep(pause)
	}
}

// alone takes the write lock if no other reader holds a read lock, and
// reports whether it did. While it is held no reader joins: the caller
// marks the key closed, then calls share or leave.
func (p *presence) alone() (bool, error) {
	switch err := p.lock(unix.F_WRLCK); {
	case err == nil:
		return true, nil
	case conflict(err):
		return false, nil
	default:
		return false, fmt.Errorf("reader lock %s: ask for the write lock: %w", p.file.Name(), err)
	}
}

// share turns the write lock that alone took back into a read lock,
// without a moment unlocked (a change of an OFD lock's type is atomic).
func (p *presence) share() error {
	if err := p.lock(unix.F_RDLCK); err != nil {
		return fmt.Errorf("reader lock %s: return to a read lock: %w", p.file.Name(), err)
	}
	return nil
}

// leave closes the lock file, which drops its lock.
func (p *presence) leave() {
	p.file.Close()
}

// conflict reports whether err is F_OFD_SETLK's for another open's lock:
// EAGAIN, or EACCES, which POSIX allows too.
func conflict(err error) bool { return err == unix.EAGAIN || err == unix.EACCES }

// lock sets this open's lock on byte 0 to typ (setLock).
func (p *presence) lock(typ int16) error { return setLock(p.file, typ) }

// openLockFile opens the lock file name in dir, creating both if need be.
// Its errors are os.OpenFile's and os.MkdirAll's (*os.PathError, naming the
// path).
func openLockFile(dir, name string) (*os.File, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	return os.OpenFile(filepath.Join(dir, name), os.O_RDWR|os.O_CREATE, 0o600)
}

// setLock sets file's open file description lock on byte 0 to typ, without
// waiting: EAGAIN (or EACCES: conflict) if another open's lock conflicts.
func setLock(file *os.File, typ int16) error {
	lk := unix.Flock_t{Type: typ, Whence: 0, Start: 0, Len: 1}
	for {
		err := unix.FcntlFlock(file.Fd(), unix.F_OFD_SETLK, &lk)
		if err != unix.EINTR {
			return err
		}
	}
}

// A ring buffer's consumer lock: one reader at a time consumes a ring
// buffer map, in every process (issue 47, item 3). Two consumers of one
// ring would each take the other's commits for corruption.
//
// The lock is a write lock on byte 0 of a lock file of perfbuf's own, one
// per ring buffer map, ringbuf-<map ID> in the same folder as the failure
// maps' (defaultLockDir), taken without waiting (F_OFD_SETLK). It is an
// open file description lock, as presence's: the kernel drops it when the
// reader's file is closed, at Close or when its process ends, however it
// ends. A reader that finds it held maps the ring but leaves it alone until
// the lock is its (ringbufmaps.go: the takeover). The holder drops it only
// after its last commit of consumer_pos (core.free: the commits, then the
// source's close), so that the next reader starts at the first record not
// delivered.
//
// Where the file cannot be had for want of permission (a reader without
// write access to /run, given a map descriptor), the reader reads without
// the lock, as readers before it did (docs/failures.md).

// consumerLock is one reader's open of a ring buffer map's lock file.
type consumerLock struct {
	file *os.File
}

// openConsumerLock opens the lock file of the ring buffer map with ID id in
// dir, without locking it. It returns nil and no error where permission is
// refused (EACCES, EPERM, EROFS): the reader then reads without the lock.
func openConsumerLock(dir string, id uint32) (*consumerLock, error) {
	file, err := openLockFile(dir, fmt.Sprintf("ringbuf-%d", id))
	switch {
	case err == nil:
		return &consumerLock{file: file}, nil
	case errors.Is(err, unix.EACCES), errors.Is(err, unix.EPERM), errors.Is(err, unix.EROFS):
		return nil, nil
	default:
		return nil, fmt.Errorf("consumer lock: %w", err)
	}
}

// try takes the lock if no other reader holds it, and reports whether this
// reader holds it now (taking it again is no error).
func (l *consumerLock) try() (bool, error) {
	switch err := setLock(l.file, unix.F_WRLCK); {
	case err == nil:
		return true, nil
	case conflict(err):
		return false, nil
	default:
		return false, fmt.Errorf("consumer lock %s: %w", l.file.Name(), err)
	}
}

// release closes the lock file, which drops the lock; nil does nothing.
func (l *consumerLock) release() {
	if l != nil {
		l.file.Close()
	}
}
