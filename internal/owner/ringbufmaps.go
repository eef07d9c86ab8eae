// SPDX-License-Identifier: Apache-2.0

package owner

// Opening BPF ring buffer maps (BPF_MAP_TYPE_RINGBUF): one map or several,
// or an array of maps whose inner maps are ring buffers; each ring mapped
// in pure Go (ringbuf.go). With the checks on the options that apply to
// ring buffers, and the claim that makes one reader per map in this
// process. The owner core (owner.go) owns a ringBufSource as it owns a perf
// event array's rings.
//
// One reader consumes a ring buffer at a time, in every process: each ring
// has a consumer lock (presence.go), tried once at opening. A ring whose
// lock another reader holds is mapped but not read: it waits in the
// takeover, which tries its lock again every takeoverPoll and, when it wins
// it (the other reader closed or died), wakes the owner, whose next read
// adds the ring (addNew) at the consumer position the other reader left, as
// a perf event array's owner adds the ring of a CPU that came online.

import (
	"errors"
	"fmt"
	"os"
	"slices"
	"sync"
	"syscall"

	"github.com/perfbuf/perfbuf/internal/cpus"
	"github.com/perfbuf/perfbuf/internal/kernel"
	"github.com/perfbuf/perfbuf/internal/ring"
	"golang.org/x/sys/unix"
)

// ringBufSource is a set of BPF ring buffers opened for one reader.
type ringBufSource struct {
	rings []*ring.RingBuf
	fds   []int    // ring i's map descriptor, one in owned: a wait polls it
	names []string // ring i's map name
	// one[i]: ring i is the ring of one CPU (ordered reads, rule 1)
	one      []bool
	ids      []uint32 // claimed until close
	owned    []int    // descriptors opened here (maps' duplicates, inner maps), closed at close
	failures *failureMap
	// lockDir holds the consumer locks (defaultLockDir; tests set their
	// own). locks[i] is ring i's, nil for a ring read without one (no
	// permission for the lock file).
	lockDir string
	locks   []*consumerLock
	// bytes is the size of every ring mapped, those waiting for their
	// lock too.
	bytes int
	// tk holds the rings whose consumer lock another reader holds.
	tk takeover
	// grace waits, once the last reader's Close has marked the reader key
	// closed, for the outputs that passed the mark: rcuGrace.
	grace func()

	// epMu guards epfd, and the appends to fds after opening (addNew)
	// against epollFD.
	epMu sync.Mutex
	epfd int // EpollFD's set, made when first asked for; -1 before
}

// mapArg is a map given to openRingBufs: its descriptor and checkMap's info.
type mapArg struct {
	fd   int
	info mapDesc
}

// openRingBufs opens the ring buffers of maps: each a ring buffer, or an
// array of maps whose slots hold ring buffers (every slot that holds one,
// in slot order; empty slots are passed over). The options are checked
// against every ring buffer, those in the slots too (checkRingBuf), before
// any is claimed or mapped; the failure map's reader mark is written last.
//
// Errors: checkRingBuf's, ErrMapInUse, the failure map's, EPERM to open an
// inner map without CAP_SYS_ADMIN, and the mmap's errno.
func openRingBufs(maps []mapArg, ro RingOptions, failures Map) (_ *ringBufSource, err error) {
	s := &ringBufSource{epfd: -1, grace: rcuGrace, lockDir: defaultLockDir}
	defer func() {
		if err != nil {
			s.close()
		}
	}()
	var bufs []mapArg
	for _, m := range maps {
		if m.info.typ != mapTypeArrayOfMaps {
			if err := ro.checkRingBuf(m.info); err != nil {
				return nil, err
			}
			fd, err := ownMap(m.fd, m.info)
			if err != nil {
				return nil, fmt.Errorf("ring buffer %q: %w", m.info.name, err)
			}
			s.owned = append(s.owned, fd)
			bufs = append(bufs, mapArg{fd, m.info})
			s.one = append(s.one, false)
			continue
		}
		inner, err := s.inner(m, ro)
		if err != nil {
			return nil, err
		}
		bufs = append(bufs, inner...)
		one := oneCPUPerSlot(m.info)
		for range inner {
			s.one = append(s.one, one)
		}
	}
	if len(bufs) == 0 {
		return nil, fmt.Errorf("no ring buffer in the maps given (an array of maps with every slot empty?): %w", os.ErrInvalid)
	}
	if s.failures, err = openFailureMap(failures); err != nil {
		return nil, err
	}
	for _, b := range bufs {
		if err := s.add(b.fd, b.info); err != nil {
			return nil, err
		}
	}
	if err := s.lock(); err != nil {
		return nil, err
	}
	// Counted as a reader last: a NewReader that fails leaves the mark as
	// it was.
	if err := s.failures.openReader(); err != nil {
		return nil, err
	}
	return s, nil
}

// oneCPUPerSlot reports whether an array of ring buffers has a slot for
// every possible CPU: then, laid out as bpf/perfbuf.bpf.h lays out a ring
// per CPU (CPU c writes slot c / cpus_per_ring), each ring is one CPU's.
// A ring buffer map alone, or an array with fewer slots, is taken as
// written by several CPUs. Unknown possible CPUs: several.
func oneCPUPerSlot(info mapDesc) bool {
	possible, err := cpus.Possible()
	return err == nil && len(possible) > 0 && uint64(info.maxEntries) > uint64(slices.Max(possible))
}

// add maps the ring buffer fd, a descriptor in s.owned, and claims it.
func (s *ringBufSource) add(fd int, info mapDesc) error {
	if info.typ != mapTypeRingBuf {
		return fmt.Errorf("map %q has type %s (%d), with ring buffers: %w", info.name, kernel.MapTypeName(info.typ), info.typ, ErrMapType)
	}
	if slices.Contains(s.ids, info.id) || !claimMap(info.id) {
		return fmt.Errorf("%v (id %d): %w", info, info.id, ErrMapInUse)
	}
	s.ids = append(s.ids, info.id)
	rb, err := ring.NewRingBuf(-1, fd, int(info.maxEntries))
	if err != nil {
		return fmt.Errorf("ring buffer %q: %w", info.name, err)
	}
	rb.Cur().SetIndex(len(s.rings))
	s.rings, s.fds, s.names = append(s.rings, rb), append(s.fds, fd), append(s.names, info.name)
	return nil
}

// lock tries each ring's consumer lock in lockDir, once. A ring whose lock
// another reader holds leaves the rings for the takeover. Errors: the lock
// file's (not for want of permission: that ring is read without a lock),
// naming its path.
func (s *ringBufSource) lock() error {
	n := 0 // rings kept
	for i, rb := range s.rings {
		s.bytes += rb.Cur().Size()
		l, err := openConsumerLock(s.lockDir, s.ids[i])
		won := true
		if err == nil && l != nil {
			if won, err = l.try(); err != nil {
				l.release()
			}
		}
		if err != nil {
			err = fmt.Errorf("ring buffer %q: %w", s.names[i], err)
			// close closes the rings kept and those not looked at yet.
			s.rings, s.fds = append(s.rings[:n], s.rings[i:]...), append(s.fds[:n], s.fds[i:]...)
			s.names, s.one = append(s.names[:n], s.names[i:]...), append(s.one[:n], s.one[i:]...)
			return err
		}
		if !won {
			s.tk.rings = append(s.tk.rings, waitingRing{rb: rb, fd: s.fds[i], name: s.names[i], oneWriter: s.one[i], lock: l})
			continue
		}
		s.rings[n], s.fds[n], s.names[n], s.one[n] = rb, s.fds[i], s.names[i], s.one[i]
		s.locks = append(s.locks, l)
		n++
	}
	s.rings, s.fds, s.names, s.one = s.rings[:n], s.fds[:n], s.names[:n], s.one[:n]
	return nil
}

// inner opens the ring buffers in the slots of the array of maps m and
// checks ro against each. Each descriptor it opens is the source's own
// (s.owned); the array itself is read here only, through the caller's
// descriptor, and not kept. From user space a lookup in an array of maps
// gives the inner map's ID, and only BPF_MAP_GET_FD_BY_ID turns it into a
// descriptor; that needs CAP_SYS_ADMIN (CAP_BPF is not enough).
func (s *ringBufSource) inner(m mapArg, ro RingOptions) ([]mapArg, error) {
	var bufs []mapArg
	for key := range m.info.maxEntries {
		id, err := kernel.InnerMapID(m.fd, key)
		if errors.Is(err, syscall.ENOENT) {
			continue // an empty slot
		}
		if err != nil {
			return nil, fmt.Errorf("array of maps %q: %w", m.info.name, err)
		}
		fd, err := kernel.MapFDByID(id)
		if err != nil {
			if errors.Is(err, os.ErrPermission) {
				return nil, fmt.Errorf("array of maps %q: slot %d: %w (BPF_MAP_GET_FD_BY_ID needs CAP_SYS_ADMIN; or pass the inner maps themselves, as the map and Options.Maps)", m.info.name, key, err)
			}
			return nil, fmt.Errorf("array of maps %q: slot %d: %w", m.info.name, key, err)
		}
		s.owned = append(s.owned, fd)
		info, err := bpfMapInfo(fd, fd, ErrMapType)
		if err == nil {
			err = ro.checkRingBuf(info)
		}
		if err != nil {
			return nil, fmt.Errorf("array of maps %q: slot %d: %w", m.info.name, key, err)
		}
		bufs = append(bufs, mapArg{fd, info})
	}
	return bufs, nil
}

// opened returns the rings; a wait polls each map's descriptor, which
// the kernel makes readable while its ring holds records.
func (s *ringBufSource) opened() ([]ring.Kind, []int) {
	out := make([]ring.Kind, len(s.rings))
	for i, rb := range s.rings {
		out[i] = rb
	}
	return out, slices.Clone(s.fds)
}

// addNew adds the rings whose consumer lock the takeover won since the
// last call, each at the consumer position that the reader before left
// (Restart; what it holds is the owner's Found), and calls add with each.
// A ring buffer is every CPU's: no CPU coming online needs one.
func (s *ringBufSource) addNew(add func(ring.Kind, int) error) error {
	won, err := s.tk.take()
	for i, w := range won {
		w.rb.Restart()
		s.epMu.Lock()
		s.rings, s.fds, s.names = append(s.rings, w.rb), append(s.fds, w.fd), append(s.names, w.name)
		s.one, s.locks = append(s.one, w.oneWriter), append(s.locks, w.lock)
		if s.epfd >= 0 {
			ev := unix.EpollEvent{Events: unix.EPOLLIN, Fd: int32(w.fd)}
			if e := unix.EpollCtl(s.epfd, unix.EPOLL_CTL_ADD, w.fd, &ev); e != nil && err == nil {
				err = fmt.Errorf("add ring buffer %q to epoll: %w", w.name, e)
			}
		}
		s.epMu.Unlock()
		if e := add(w.rb, w.fd); e != nil {
			// Not the owner's: it goes back to the takeover, which tries
			// to add it again. (The ring's lock stays held: no other
			// reader reads it meanwhile.)
			s.epMu.Lock()
			n := len(s.rings) - 1
			s.rings, s.fds, s.names, s.one, s.locks = s.rings[:n], s.fds[:n], s.names[:n], s.one[:n], s.locks[:n]
			s.epMu.Unlock()
			s.tk.putBack(won[i:])
			return errors.Join(err, fmt.Errorf("take over ring buffer %q: %w", w.name, e))
		}
	}
	return err
}

// epollFD returns an epoll set over the maps' descriptors (libbpf's
// ring_buffer__epoll_fd), made on the first call and closed with the
// source: an owner that never asks holds none.
func (s *ringBufSource) epollFD() (int, error) {
	s.epMu.Lock()
	defer s.epMu.Unlock()
	if s.epfd >= 0 {
		return s.epfd, nil
	}
	epfd, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	if err != nil {
		return -1, fmt.Errorf("create epoll: %w", err)
	}
	for i, fd := range s.fds {
		ev := unix.EpollEvent{Events: unix.EPOLLIN, Fd: int32(fd)}
		if err := unix.EpollCtl(epfd, unix.EPOLL_CTL_ADD, fd, &ev); err != nil {
			unix.Close(epfd)
			return -1, fmt.Errorf("add ring buffer %q to epoll: %w", s.names[i], err)
		}
	}
	s.epfd = epfd
	return epfd, nil
}

// unlink: a ring buffer cannot be taken out of its map, but a program that
// writes through bpf/perfbuf.bpf.h sees the reader gone in its failure map
// and stops reserving once the last reader is gone (closeReader): after an
// RCU grace period (see rings.unlink), no output into the rings is
// running, and what is in them is final. While another reader is open
// (another process's, on a pinned map), and for other programs, outputs go
// on, and Close counts what was in the rings when it looked.
func (s *ringBufSource) unlink() {
	if last, err := s.failures.closeReader(); last && err == nil {
		s.grace()
	}
}

// close unmaps the rings and frees the rest. It drops the consumer locks
// after everything else but the claims: the owner committed what it
// delivered before (core.free), so the next reader starts there. The
// claims go last, so that a reader of this process opened meanwhile is
// refused (ErrMapInUse) until the locks are free too, rather than taking
// the claim and leaving its rings to the takeover.
func (s *ringBufSource) close() {
	s.tk.close()
	for _, rb := range s.rings {
		_ = rb.Close()
	}
	s.epMu.Lock()
	if s.epfd >= 0 {
		unix.Close(s.epfd)
		s.epfd = -1
	}
	s.epMu.Unlock()
	for _, fd := range s.owned {
		unix.Close(fd)
	}
	s.failures.close()
	for _, l := range s.locks {
		l.release()
	}
	for _, id := range s.ids {
		unclaimMap(id)
	}
}

func (s *ringBufSource) failureCounters() *failureMap { return s.failures }

// oneWriter reports whether one CPU alone writes ring i. By the reading
// goroutine, which also grows s.one (addNew).
func (s *ringBufSource) oneWriter(i int) bool { return s.one[i] }
