// SPDX-License-Identifier: Apache-2.0

package kernel

// perfbuf's own opener of perf rings: what libbpf's perf_buffer__new_raw
// does for each CPU (tools/lib/bpf/libbpf.c, perf_buffer__open_cpu_buf and
// __perf_buffer__new), without its read of /sys/devices/system/cpu/online
// into 128 bytes, which fails with E2BIG on hosts whose online list is
// longer (128 CPUs with every other one offline: 201 bytes).

import (
	"errors"
	"fmt"
	"math"
	"math/bits"
	"os"
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"
)

// PerfConfig is the configuration of every ring of one opening, checked
// and with its defaults resolved by the caller (internal/owner's config.go);
// OpenPerfRings checks it again, before any descriptor is opened.
type PerfConfig struct {
	Pages        int // data pages per ring, a power of two
	PageSize     int // the host's page size
	WakeupEvents int // samples per wakeup, >= 1; ignored when WakeupBytes is set
	WakeupBytes  int // bytes per wakeup (a watermark); 0: wake by events
	// Paused opens each ring with its output paused (PauseOutput), before
	// it is stored in the map: no output reaches it unpaused.
	Paused bool
	// CountLost opens each ring's event with PERF_FORMAT_LOST (6.0:
	// FormatLost), so that LostSamples reads how many outputs it refused.
	CountLost bool
	// Time has each sample carry the time of its output on
	// CLOCK_MONOTONIC, the clock of bpf_ktime_get_ns (PERF_SAMPLE_TIME with
	// use_clockid: a u64 before the raw data's size), which
	// internal/snapshot's Perf reads with PerfOptions.Time; for backward
	// rings only: internal/ring parses raw samples alone.
	Time bool
}

// Check reports the first field of c the kernel would refuse, or would
// read other than as meant.
func (c PerfConfig) Check() error {
	switch {
	case c.PageSize <= 0 || bits.OnesCount(uint(c.PageSize)) != 1:
		return fmt.Errorf("page size %d is not a power of two: %w", c.PageSize, os.ErrInvalid)
	case c.Pages <= 0 || bits.OnesCount(uint(c.Pages)) != 1:
		return fmt.Errorf("ring pages %d is not a power of two: %w", c.Pages, os.ErrInvalid)
	case c.Pages > math.MaxInt/c.PageSize-1:
		return fmt.Errorf("ring of %d pages of %d bytes: %w", c.Pages, c.PageSize, os.ErrInvalid)
	case c.WakeupBytes < 0 || c.WakeupBytes >= c.Pages*c.PageSize || c.WakeupBytes > math.MaxUint32:
		return fmt.Errorf("wakeup bytes %d outside [0, %d): %w", c.WakeupBytes, c.Pages*c.PageSize, os.ErrInvalid)
	case c.WakeupBytes == 0 && (c.WakeupEvents < 1 || c.WakeupEvents > math.MaxInt32):
		// wakeup_events is a u32 the kernel compares as an int.
		return fmt.Errorf("wakeup events %d outside [1, %d]: %w", c.WakeupEvents, math.MaxInt32, os.ErrInvalid)
	}
	return nil
}

// BPFOutputAttr is the event behind each ring: the BPF output software
// event that bpf_perf_event_output writes to, with raw samples, as libbpf's
// perf_buffer__new opens it. The event wakes its readers every WakeupEvents
// samples, or, with WakeupBytes set, once that many bytes are in the ring.
// With CountLost, a read(2) of it returns its count of refused outputs
// (LostSamples).
func BPFOutputAttr(c PerfConfig) unix.PerfEventAttr {
	attr := unix.PerfEventAttr{
		Type:        unix.PERF_TYPE_SOFTWARE,
		Size:        uint32(unsafe.Sizeof(unix.PerfEventAttr{})),
		Config:      unix.PERF_COUNT_SW_BPF_OUTPUT,
		Sample:      1, // sample_period
		Sample_type: unix.PERF_SAMPLE_RAW,
	}
	if c.CountLost {
		attr.Read_format = unix.PERF_FORMAT_LOST
	}
	if c.Time {
		attr.Sample_type |= unix.PERF_SAMPLE_TIME
		attr.Bits |= unix.PerfBitUseClockID
		attr.Clockid = unix.CLOCK_MONOTONIC
	}
	if c.WakeupBytes > 0 {
		attr.Bits |= unix.PerfBitWatermark
		attr.Wakeup = uint32(c.WakeupBytes) // wakeup_watermark
	} else {
		attr.Wakeup = uint32(c.WakeupEvents) // wakeup_events
	}
	return attr
}

// PerfRings are perf rings opened by OpenPerfRings: ring j is CPU cpus[j]'s
// BPF output event, mapped, enabled and stored at key cpus[j] of the perf
// event array, and in an epoll set over them all. Its methods serve one
// goroutine at a time; Close ends it.
type PerfRings struct {
	epfd     int
	pageSize int
	rings    []perfRing
}

// perfRing is one CPU's event and its mapping.
type perfRing struct {
	fd  int
	mem []byte // the perf_event_mmap_page, then the data pages
}

// opened counts the rings OpenPerfRings opened in this process.
var opened atomic.Uint64

// OpenedPerfRings returns how many rings OpenPerfRings opened in this
// process: tests tell by it which opener opened their rings.
func OpenedPerfRings() uint64 { return opened.Load() }

// OpenPerfRings opens a ring on each of cpus, stores it in the perf event
// array mapFD at the CPU's key, and returns them. Ring j is cpus[j]'s. On
// an error nothing stays open and the slots it stored are emptied again;
// the error names the CPU and wraps the kernel's errno (EBADF, EINVAL for a
// descriptor that is not a perf event array, E2BIG for a key past its
// max_entries, ENODEV for an offline CPU, EACCES or EPERM without
// CAP_PERFMON or CAP_BPF) or os.ErrInvalid for a bad c or no CPU.
func OpenPerfRings(mapFD int, c PerfConfig, cpus []int32) (*PerfRings, error) {
	return openRings(mapFD, c, cpus, BPFOutputAttr(c), unix.PROT_READ|unix.PROT_WRITE)
}

// openRings opens OpenPerfRings' rings with attr, mapped with prot.
func openRings(mapFD int, c PerfConfig, cpus []int32, attr unix.PerfEventAttr, prot int) (_ *PerfRings, err error) {
	if err := c.Check(); err != nil {
		return nil, err
	}
	if len(cpus) == 0 {
		return nil, fmt.Errorf("open perf rings: no cpu: %w", os.ErrInvalid)
	}
	epfd, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("create epoll set: %w", err)
	}
	p := &PerfRings{epfd: epfd, pageSize: c.PageSize, rings: make([]perfRing, 0, len(cpus))}
	defer func() {
		if err != nil {
			for j := range p.rings {
				_ = DeleteSlot(mapFD, uint32(cpus[j])) // only what this call stored
			}
			p.Close()
		}
	}()
	for _, cpu := range cpus {
		if err := p.open(mapFD, &attr, prot, cpu, c); err != nil {
			return nil, fmt.Errorf("open perf ring on cpu %d: %w", cpu, err)
		}
	}
	return p, nil
}

// open opens cpu's ring and appends it, or closes what it opened.
func (p *PerfRings) open(mapFD int, attr *unix.PerfEventAttr, prot int, cpu int32, c PerfConfig) error {
	fd, err := unix.PerfEventOpen(attr, -1, int(cpu), -1, unix.PERF_FLAG_FD_CLOEXEC)
	if err != nil {
		return fmt.Errorf("perf_event_open: %w", err)
	}
	// The header page, then the data pages: writable for a reader that stores
	// data_tail there; read-only for an overwritable ring (the kernel decides
	// which by the mapping, perf_mmap's RING_BUFFER_WRITABLE).
	mem, err := unix.Mmap(fd, 0, (1+c.Pages)*c.PageSize, prot, unix.MAP_SHARED)
	if err != nil {
		unix.Close(fd)
		return fmt.Errorf("mmap: %w", err)
	}
	r := perfRing{fd: fd, mem: mem}
	if c.Paused { // (the ioctl needs the mapping: the ring it pauses)
		if err := PauseOutput(fd, true); err != nil {
			r.close()
			return err
		}
	}
	if err := unix.IoctlSetInt(fd, unix.PERF_EVENT_IOC_ENABLE, 0); err != nil {
		r.close()
		return fmt.Errorf("enable: %w", err)
	}
	// Stored before it joins the epoll set, as libbpf does; from here,
	// the caller's error path empties the slot.
	if err := UpdateSlot(mapFD, uint32(cpu), fd); err != nil {
		r.close()
		return err
	}
	p.rings = append(p.rings, r)
	ev := unix.EpollEvent{Events: unix.EPOLLIN, Fd: int32(fd)}
	if err := unix.EpollCtl(p.epfd, unix.EPOLL_CTL_ADD, fd, &ev); err != nil {
		return fmt.Errorf("add to epoll set: %w", err)
	}
	opened.Add(1)
	return nil
}

// Count returns the number of rings.
func (p *PerfRings) Count() int { return len(p.rings) }

// FD returns ring j's perf event descriptor, readable (EPOLLIN) when the
// ring reached its wakeup.
func (p *PerfRings) FD(j int) int { return p.rings[j].fd }

// EpollFD returns an epoll set over every ring's descriptor. It is closed
// with the rings.
func (p *PerfRings) EpollFD() int { return p.epfd }

// Ring returns ring j's mapping: base points at its perf_event_mmap_page,
// and size bytes of data follow the header page. Valid until Close.
func (p *PerfRings) Ring(j int) (base unsafe.Pointer, size int) {
	mem := p.rings[j].mem
	return unsafe.Pointer(&mem[0]), len(mem) - p.pageSize
}

// Close disables, unmaps and closes every ring and the epoll set. It does
// not empty the map's slots: the caller does, before, when outputs must
// stop finding these rings (a slot holds its event alive until emptied).
func (p *PerfRings) Close() error {
	var errs []error
	for _, r := range p.rings {
		errs = append(errs, r.close())
	}
	p.rings = nil
	if p.epfd >= 0 {
		errs = append(errs, unix.Close(p.epfd))
		p.epfd = -1
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("close perf rings: %w", err)
	}
	return nil
}

// close undoes open's steps for one ring: disable, unmap, close.
func (r perfRing) close() error {
	_ = unix.IoctlSetInt(r.fd, unix.PERF_EVENT_IOC_DISABLE, 0) // as libbpf; the close frees it anyway
	return errors.Join(unix.Munmap(r.mem), unix.Close(r.fd))
}

// ForcePerfRings makes perfbuf, when set, open every perf ring with
// OpenPerfRings, also where libbpf would open it: the selftests set it to
// check this opener on any host. Nothing else does.
var ForcePerfRings atomic.Bool
