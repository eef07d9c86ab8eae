package perfbuf

// Opening a BPF ring buffer map (BPF_MAP_TYPE_RINGBUF): its one ring,
// mapped in pure Go (ringbuf.go), with the checks on the options that apply
// to it, and the claim that makes one reader per map in this process. The
// owner core (core.go) owns a ringBufSource as it owns a perf event array's
// rings.

import (
	"fmt"
	"os"
	"sync"

	"golang.org/x/sys/unix"
)

// ringBufSource is a BPF ring buffer map opened for reading.
type ringBufSource struct {
	name     string
	mapID    uint32 // claimed until close
	fd       int    // the caller's descriptor: EpollFD's set polls it
	ring     *bpfRing
	failures *failureMap

	epMu sync.Mutex
	epfd int // EpollFD's set, made when first asked for; -1 before
}

// openRingBuf opens the ring buffer map fd, whose info checkMap returned.
// Of the ring settings only MaxSampleSize applies: a ring buffer's size is
// its max_entries, fixed when its object loads, and when it wakes its
// reader is the BPF program's choice (BPF_RB_NO_WAKEUP,
// BPF_RB_FORCE_WAKEUP). Errors: os.ErrInvalid for the others,
// ErrSampleTooLarge, ErrMapInUse, the failure map's, and the mmap's errno.
func openRingBuf(fd int, info mapDesc, ro ringOptions, failures Map) (_ *ringBufSource, err error) {
	switch {
	case ro.ringBytes != 0:
		return nil, fmt.Errorf("ring buffer %q: RingBytes does not apply: its size is the map's max_entries (%d), set before the object loads: %w", info.name, info.maxEntries, os.ErrInvalid)
	case ro.wakeupEvents != 0 || ro.wakeupBytes != 0:
		return nil, fmt.Errorf("ring buffer %q: WakeupEvents and WakeupBytes do not apply: the BPF program's flags say when a ring buffer wakes its reader: %w", info.name, os.ErrInvalid)
	case ro.maxSampleSize < 0:
		return nil, fmt.Errorf("ring buffer %q: max sample size %d is negative: %w", info.name, ro.maxSampleSize, os.ErrInvalid)
	case ro.maxSampleSize > 0 && (uint64(ro.maxSampleSize)+bpfRingHdrRound)&^7 > uint64(info.maxEntries)-8:
		// __bpf_ringbuf_reserve keeps a record (its 8-byte header
		// included, rounded up to 8 bytes) and everything unread below
		// the ring's size: a record takes at most size-8 bytes.
		return nil, fmt.Errorf("ring buffer %q: max sample size %d does not fit the %d-byte ring with its 8-byte header: %w",
			info.name, ro.maxSampleSize, info.maxEntries, ErrSampleTooLarge)
	}
	fails, err := openFailureMap(failures)
	if err != nil {
		return nil, err
	}
	if !claimMap(info.id) {
		fails.close()
		return nil, fmt.Errorf("map %q (id %d): %w", info.name, info.id, ErrMapInUse)
	}
	rb, err := newBPFRing(-1, fd, int(info.maxEntries))
	if err != nil {
		unclaimMap(info.id)
		fails.close()
		return nil, fmt.Errorf("ring buffer %q: %w", info.name, err)
	}
	return &ringBufSource{name: info.name, mapID: info.id, fd: fd, ring: rb, failures: fails, epfd: -1}, nil
}

// perfRings returns the one ring; a wait polls the map's descriptor, which
// the kernel makes readable while the ring holds records.
func (s *ringBufSource) perfRings() ([]ring, []int) { return []ring{s.ring}, []int{s.fd} }

// A ring buffer is every CPU's: no CPU coming online needs a ring.
func (s *ringBufSource) cpusPending() bool                   { return false }
func (s *ringBufSource) addNew(func(ring, int) error) error { return nil }

// view returns a new reader over the same mapping, with positions of its own.
func (s *ringBufSource) view(i int) (ring, error) {
	r := s.ring
	v, err := newBPFRingFromParts(r.cpu, r.consumer, r.producer, r.data)
	if err != nil {
		return nil, err
	}
	v.setIndex(i)
	return v, nil
}

// epollFD returns an epoll set over the map's descriptor (libbpf's
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
	ev := unix.EpollEvent{Events: unix.EPOLLIN, Fd: int32(s.fd)}
	if err := unix.EpollCtl(epfd, unix.EPOLL_CTL_ADD, s.fd, &ev); err != nil {
		unix.Close(epfd)
		return -1, fmt.Errorf("add ring buffer %q to epoll: %w", s.name, err)
	}
	s.epfd = epfd
	return epfd, nil
}

// unlink: a ring buffer cannot be taken out of its map; a program keeps
// writing into it until it sees the reader gone. What Close counts as left
// is what was in the ring when it looked.
func (s *ringBufSource) unlink() {}

// close unmaps the ring and frees the rest.
func (s *ringBufSource) close() {
	_ = s.ring.close()
	s.epMu.Lock()
	if s.epfd >= 0 {
		unix.Close(s.epfd)
		s.epfd = -1
	}
	s.epMu.Unlock()
	unclaimMap(s.mapID)
	s.failures.close()
}

func (s *ringBufSource) failureCounters() *failureMap { return s.failures }
