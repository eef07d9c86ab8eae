// SPDX-License-Identifier: Apache-2.0

package owner

// The two openers of a perf event array's rings, behind one contract:
// libbpf's perf_buffer (perfbuf_cgo.go), and perfbuf's own
// (internal/kernel), used in a build without cgo or with the tag
// perfbuf_nolibbpf, and where libbpf refuses: every perf_buffer__new* of
// libbpf (through 1.7 and its master) reads /sys/devices/system/cpu/online
// into 128 bytes and fails with E2BIG when the list is longer (128 CPUs
// with every other one offline: 201 bytes), whichever CPUs it is asked
// for. Both open the same event (kernel.BPFOutputAttr), map it, store it in
// the map at the CPU's key and enable it; the rings are read the same way
// (internal/ring) whichever opened them.

import (
	"errors"
	"syscall"
	"unsafe"

	"github.com/perfbuf/perfbuf/internal/kernel"
)

// PerfEvents is one opening of rings: ring j, of bufferCount, is the CPU
// it was opened for, cpus[j] of openPerfEvents; the map's slot for that CPU
// holds its event. close disables, unmaps and closes, and leaves emptying
// the slots to rings.release (libbpf's perf_buffer__free deletes them by
// key again, through a descriptor that release made no map's).
type PerfEvents interface {
	BufferCount() int
	BufferFD(j int) int
	// EpollFD is an epoll set over the opening's rings, closed with it.
	EpollFD() int
	// Ring returns ring j's mapping: base points at its
	// perf_event_mmap_page, and size bytes of data follow the header page.
	Ring(j int) (base unsafe.Pointer, size int, err error)
	Close()
}

var _ PerfEvents = goEvents{}

// OpenLibbpf opens rings through libbpf's perf_buffer, with the
// settings cfg: the root's perfbuf_cgo.go sets it, the one file that
// uses cgo, and a build without libbpf (no cgo, or the tag
// perfbuf_nolibbpf) leaves it nil. Tests replace it.
var OpenLibbpf func(fd int, cfg kernel.PerfConfig, cpus []int32) (PerfEvents, error)

// openGoEvents opens rings through perfbuf's own opener; tests replace
// it.
var openGoEvents = func(fd int, cfg RingConfig, cpus []int32) (PerfEvents, error) {
	p, err := kernel.OpenPerfRings(fd, cfg.kernel(), cpus)
	if err != nil {
		return nil, err
	}
	return goEvents{p}, nil
}

// openPerfEvents opens a ring on each of cpus and stores it in the perf
// event array fd at the CPU's key: through libbpf, and where libbpf
// refuses with E2BIG (a long online list), when the selftests force it
// (kernel.ForcePerfRings), or in a build without libbpf, through
// perfbuf's own opener. Errors: the kernel's errno, a syscall.Errno,
// wrapped or not.
func openPerfEvents(fd int, cfg RingConfig, cpus []int32) (PerfEvents, error) {
	if OpenLibbpf != nil && !kernel.ForcePerfRings.Load() {
		ev, err := OpenLibbpf(fd, cfg.kernel(), cpus)
		if !errors.Is(err, syscall.E2BIG) {
			return ev, err
		}
		// libbpf opened nothing: it reads the online list before it
		// opens a ring. A key past max_entries, the kernel's E2BIG, is
		// not asked for (ringCPUs), and is E2BIG again below.
	}
	return openGoEvents(fd, cfg, cpus)
}

// kernel is c for the kernel package's opener.
func (c RingConfig) kernel() kernel.PerfConfig {
	return kernel.PerfConfig{Pages: c.Pages, PageSize: c.PageSize, WakeupEvents: c.WakeupEvents, WakeupBytes: c.WakeupBytes,
		CountLost: kernel.FormatLost()} // Close reads what the rings refused (owner.go)
}

// goEvents are rings that perfbuf opened itself.
type goEvents struct{ p *kernel.PerfRings }

func (g goEvents) BufferCount() int   { return g.p.Count() }
func (g goEvents) BufferFD(j int) int { return g.p.FD(j) }
func (g goEvents) EpollFD() int       { return g.p.EpollFD() }
func (g goEvents) Close()             { _ = g.p.Close() }

func (g goEvents) Ring(j int) (unsafe.Pointer, int, error) {
	base, size := g.p.Ring(j)
	return base, size, nil
}
