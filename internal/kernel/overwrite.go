// SPDX-License-Identifier: Apache-2.0

package kernel

// The kernel's side of overwritable rings (a flight recorder): backward perf rings,
// paused for a read, and BPF ring buffers in overwrite mode. internal/snapshot parses
// what they hold.

import (
	"errors"
	"fmt"
	"os"
	"unsafe"

	"golang.org/x/sys/unix"
)

// BackwardAttr is BPFOutputAttr's event with write_backward set (kernel 4.7): the kernel
// writes each record below the previous one, from data_head down, and, in a ring mapped
// read-only, overwrites the oldest records rather than wait for a reader.
func BackwardAttr(c PerfConfig) unix.PerfEventAttr {
	attr := BPFOutputAttr(c)
	attr.Bits |= unix.PerfBitWriteBackward
	return attr
}

// OpenBackwardRings opens a backward ring (BackwardAttr) on each of cpus, maps it
// read-only (PROT_READ: the kernel then overwrites, rb->overwrite, and ignores
// data_tail), enables it and stores it at the CPU's key of the perf event array mapFD,
// as OpenPerfRings does; its errors are OpenPerfRings'. The rings wake the epoll set as
// c says: the kernel counts a backward ring's samples and bytes as a forward one's. Read
// a ring with internal/snapshot's Perf while it is paused (PauseOutput, then WaitWriters).
func OpenBackwardRings(mapFD int, c PerfConfig, cpus []int32) (*PerfRings, error) {
	return openRings(mapFD, c, cpus, BackwardAttr(c), unix.PROT_READ)
}

// PauseOutput pauses (true) or resumes (false) the output of the perf event fd to its
// ring: PERF_EVENT_IOC_PAUSE_OUTPUT (kernel 4.7). While paused, the kernel refuses every
// output to the ring (bpf_perf_event_output fails with ENOSPC) and counts it; after the
// resume, the ring's next record is a PERF_RECORD_LOST with that count. A pause does not
// wait for outputs already past its check: WaitWriters does. The error wraps the
// kernel's errno (EINVAL: a ring of no pages).
func PauseOutput(fd int, pause bool) error {
	arg := 0
	if pause {
		arg = 1
	}
	if err := unix.IoctlSetInt(fd, unix.PERF_EVENT_IOC_PAUSE_OUTPUT, arg); err != nil {
		verb := "resume"
		if pause {
			verb = "pause"
		}
		return fmt.Errorf("%s perf ring output: %w", verb, err)
	}
	return nil
}

// Pause pauses or resumes ring j's output (PauseOutput).
func (p *PerfRings) Pause(j int, pause bool) error { return PauseOutput(p.rings[j].fd, pause) }

// MapFlagRBOverwrite is BPF_F_RB_OVERWRITE (include/uapi/linux/bpf.h, kernel 6.19), the
// map flag of a BPF ring buffer in overwrite mode: MapInfo.Flags carries it.
const MapFlagRBOverwrite = 1 << 19

// ProbeRingOverwrite reports whether this kernel makes BPF ring buffers in overwrite
// mode: it creates one of a page and closes it. On kernels before 6.19 the kernel refuses
// the flag with EINVAL: the error wraps errors.ErrUnsupported and the errno. Other
// errors (EPERM without CAP_BPF) are wrapped as they come.
func ProbeRingOverwrite() error {
	a := mapCreateAttr{
		mapType:    unix.BPF_MAP_TYPE_RINGBUF,
		maxEntries: uint32(os.Getpagesize()),
		mapFlags:   MapFlagRBOverwrite,
	}
	fd, err := createMap(a, "perfbuf_probe")
	if errors.Is(err, unix.EINVAL) {
		return fmt.Errorf("create ring buffer in overwrite mode (BPF_F_RB_OVERWRITE needs kernel 6.19 or later): %w: %w", errors.ErrUnsupported, err)
	}
	if err != nil {
		return fmt.Errorf("create ring buffer in overwrite mode: %w", err)
	}
	unix.Close(fd)
	return nil
}

// RingMapping is a BPF ring buffer's pages mapped read-only: the consumer page, the
// producer page and the data area (mapped twice by the kernel, one after the other).
type RingMapping struct {
	cons, prod []byte
	size       int
}

// MapRingBuffer maps the BPF ring buffer fd, of size data bytes (its max_entries),
// read-only: its consumer page, and its producer page with the data area. Reading does
// not consume: the consumer position stays where it is. The mapping holds the map alive
// until Close, whenever fd is closed. The error wraps the kernel's errno.
func MapRingBuffer(fd, size int) (*RingMapping, error) {
	page := os.Getpagesize()
	if size <= 0 || size%page != 0 || size&(size-1) != 0 {
		return nil, fmt.Errorf("map ring buffer: size %d is not a power-of-two multiple of the page size: %w", size, os.ErrInvalid)
	}
	cons, err := unix.Mmap(fd, 0, page, unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("map ring buffer consumer page: %w", err)
	}
	prod, err := unix.Mmap(fd, int64(page), page+2*size, unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		unix.Munmap(cons)
		return nil, fmt.Errorf("map ring buffer producer page and data: %w", err)
	}
	return &RingMapping{cons: cons, prod: prod, size: size}, nil
}

// Consumer points at the consumer page (consumer_pos at its start). Valid until Close.
func (m *RingMapping) Consumer() unsafe.Pointer { return unsafe.Pointer(&m.cons[0]) }

// Producer points at the producer page: producer_pos at its start, then the positions
// internal/snapshot's offsets name. Valid until Close.
func (m *RingMapping) Producer() unsafe.Pointer { return unsafe.Pointer(&m.prod[0]) }

// Data returns the data area's first mapping, size bytes. Valid until Close.
func (m *RingMapping) Data() []byte {
	page := len(m.prod) - 2*m.size
	return m.prod[page : page+m.size : page+m.size]
}

// Close unmaps the pages.
func (m *RingMapping) Close() error {
	if m.cons == nil {
		return nil
	}
	err := errors.Join(unix.Munmap(m.cons), unix.Munmap(m.prod))
	m.cons, m.prod = nil, nil
	if err != nil {
		return fmt.Errorf("unmap ring buffer: %w", err)
	}
	return nil
}

// Version returns the running kernel's major and minor version (uname's release, as
// "6.18.3-amd64"): tests tell by it what the kernel must support.
func Version() (major, minor int, err error) {
	var u unix.Utsname
	if err := unix.Uname(&u); err != nil {
		return 0, 0, fmt.Errorf("uname: %w", err)
	}
	release := unix.ByteSliceToString(u.Release[:])
	if _, err := fmt.Sscanf(release, "%d.%d", &major, &minor); err != nil {
		return 0, 0, fmt.Errorf("parse kernel release %q: %w", release, err)
	}
	return major, minor, nil
}
