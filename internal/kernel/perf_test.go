// SPDX-License-Identifier: Apache-2.0

package kernel

import (
	"errors"
	"os"
	"syscall"
	"testing"
	"unsafe"

	"github.com/perfbuf/perfbuf/internal/ringtest"
	"golang.org/x/sys/unix"
)

// The event is libbpf's perf_buffer__new's: a BPF output software event
// with raw samples, one per period, woken by events or by a watermark.
func TestBPFOutputAttr(t *testing.T) {
	for _, tc := range []struct {
		name       string
		c          PerfConfig
		watermark  bool
		wakeup     uint32
		readFormat uint64
	}{
		{"events", PerfConfig{Pages: 8, PageSize: 4096, WakeupEvents: 3}, false, 3, 0},
		{"watermark", PerfConfig{Pages: 8, PageSize: 4096, WakeupEvents: 1, WakeupBytes: 5000}, true, 5000, 0},
		{"count lost", PerfConfig{Pages: 8, PageSize: 4096, WakeupEvents: 1, CountLost: true}, false, 1, unix.PERF_FORMAT_LOST},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := BPFOutputAttr(tc.c)
			if a.Type != unix.PERF_TYPE_SOFTWARE || a.Config != unix.PERF_COUNT_SW_BPF_OUTPUT ||
				a.Sample_type != unix.PERF_SAMPLE_RAW || a.Sample != 1 {
				t.Errorf("attr %+v: want the BPF output event with raw samples, period 1", a)
			}
			if a.Size != uint32(unsafe.Sizeof(unix.PerfEventAttr{})) {
				t.Errorf("size %d, want %d", a.Size, unsafe.Sizeof(unix.PerfEventAttr{}))
			}
			if got := a.Bits&unix.PerfBitWatermark != 0; got != tc.watermark || a.Bits&^unix.PerfBitWatermark != 0 {
				t.Errorf("bits %#x: watermark %v, want %v and no other bit (the event starts enabled: IOC_ENABLE is harmless)", a.Bits, got, tc.watermark)
			}
			if a.Wakeup != tc.wakeup {
				t.Errorf("wakeup %d, want %d", a.Wakeup, tc.wakeup)
			}
			if a.Read_format != tc.readFormat {
				t.Errorf("read_format %#x, want %#x", a.Read_format, tc.readFormat)
			}
		})
	}
	// Time: each sample's time on CLOCK_MONOTONIC before its raw data.
	a := BPFOutputAttr(PerfConfig{Pages: 8, PageSize: 4096, WakeupEvents: 1, Time: true})
	if a.Sample_type != unix.PERF_SAMPLE_RAW|unix.PERF_SAMPLE_TIME || a.Bits != unix.PerfBitUseClockID || a.Clockid != unix.CLOCK_MONOTONIC {
		t.Errorf("time: sample_type %#x, bits %#x, clockid %d; want raw and time, use_clockid, CLOCK_MONOTONIC", a.Sample_type, a.Bits, a.Clockid)
	}
}

// A configuration the kernel would refuse or misread is refused before
// anything is opened, with os.ErrInvalid.
func TestOpenPerfRingsInvalid(t *testing.T) {
	ok := PerfConfig{Pages: 2, PageSize: 4096, WakeupEvents: 1}
	fds := ringtest.OpenFDs(t)
	for _, tc := range []struct {
		name string
		c    PerfConfig
		cpus []int32
	}{
		{"pages not a power of two", PerfConfig{Pages: 3, PageSize: 4096, WakeupEvents: 1}, []int32{0}},
		{"no pages", PerfConfig{PageSize: 4096, WakeupEvents: 1}, []int32{0}},
		{"page size", PerfConfig{Pages: 2, PageSize: 4000, WakeupEvents: 1}, []int32{0}},
		{"ring too large", PerfConfig{Pages: 1 << 62, PageSize: 4096, WakeupEvents: 1}, []int32{0}},
		{"no wakeup", PerfConfig{Pages: 2, PageSize: 4096}, []int32{0}},
		{"wakeup events past int32", PerfConfig{Pages: 2, PageSize: 4096, WakeupEvents: 1 << 31}, []int32{0}},
		{"watermark past the ring", PerfConfig{Pages: 2, PageSize: 4096, WakeupBytes: 8192}, []int32{0}},
		{"negative watermark", PerfConfig{Pages: 2, PageSize: 4096, WakeupEvents: 1, WakeupBytes: -1}, []int32{0}},
		{"no cpu", ok, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, err := OpenPerfRings(-1, tc.c, tc.cpus)
			if p != nil || !errors.Is(err, os.ErrInvalid) {
				t.Fatalf("OpenPerfRings: %v, %v; want os.ErrInvalid", p, err)
			}
		})
	}
	if err := ok.Check(); err != nil {
		t.Errorf("%+v: %v", ok, err)
	}
	if now := ringtest.OpenFDs(t); now != fds {
		t.Errorf("%d descriptors open, %d before", now, fds)
	}
}

// An opening that fails half way closes what it opened and empties the
// slots it stored: outputs there then fail, rather than fill a ring nobody
// reads. Here the second CPU cannot be opened (it does not exist), after
// the first one's ring is in the map. Needs CAP_BPF and CAP_PERFMON.
func TestOpenPerfRingsUndoes(t *testing.T) {
	m := perfEventArray(t)
	fds := ringtest.OpenFDs(t)
	c := PerfConfig{Pages: 1, PageSize: os.Getpagesize(), WakeupEvents: 1}
	p, err := OpenPerfRings(m.FD(), c, []int32{0, 1 << 20})
	if p != nil || err == nil {
		t.Fatalf("OpenPerfRings on cpu %d: %v, %v; want an error", 1<<20, p, err)
	}
	t.Logf("cpu %d: %v", 1<<20, err)
	if now := ringtest.OpenFDs(t); now != fds {
		t.Errorf("%d descriptors open after the failed opening, %d before", now, fds)
	}
	if err := DeleteSlot(m.FD(), 0); !errors.Is(err, syscall.ENOENT) {
		t.Errorf("slot 0 after the failed opening: delete: %v, want ENOENT (empty)", err)
	}
	// A map the update refuses: nothing stays open either.
	p, err = OpenPerfRings(-1, c, []int32{0})
	if p != nil || !errors.Is(err, syscall.EBADF) {
		t.Errorf("OpenPerfRings on descriptor -1: %v, %v; want EBADF", p, err)
	}
	if now := ringtest.OpenFDs(t); now != fds {
		t.Errorf("%d descriptors open after the failed opening, %d before", now, fds)
	}
}

// An opening maps every ring as the kernel set it up, stores its event in
// the map, and Close leaves the slots to the caller and closes the rest.
// Needs CAP_BPF and CAP_PERFMON.
func TestOpenPerfRings(t *testing.T) {
	m := perfEventArray(t)
	fds := ringtest.OpenFDs(t)
	page := os.Getpagesize()
	c := PerfConfig{Pages: 4, PageSize: page, WakeupEvents: 1}
	before := OpenedPerfRings()
	p, err := OpenPerfRings(m.FD(), c, []int32{0})
	if err != nil {
		t.Fatal(err)
	}
	if p.Count() != 1 || OpenedPerfRings()-before != 1 {
		t.Fatalf("%d rings, %d counted opened; want 1", p.Count(), OpenedPerfRings()-before)
	}
	base, size := p.Ring(0)
	hdr := (*unix.PerfEventMmapPage)(base)
	if size != 4*page || hdr.Data_size != uint64(size) || hdr.Data_offset != uint64(page) {
		t.Errorf("ring of %d bytes; header: %d bytes at %d; want %d at %d", size, hdr.Data_size, hdr.Data_offset, 4*page, page)
	}
	var ev [1]unix.EpollEvent
	if n, err := unix.EpollWait(p.EpollFD(), ev[:], 0); n != 0 || err != nil {
		t.Errorf("epoll set of an empty ring: %d ready, %v", n, err)
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	if now := ringtest.OpenFDs(t); now != fds {
		t.Errorf("%d descriptors open after Close, %d before", now, fds)
	}
	if err := DeleteSlot(m.FD(), 0); err != nil {
		t.Errorf("slot 0 after Close: delete: %v, want the ring stored there", err)
	}
}

// perfEventArray makes a perf event array of 2 entries, or skips (fails
// under CI) without the privileges.
func perfEventArray(t *testing.T) testMap {
	t.Helper()
	return newMap(t, mapCreateAttr{mapType: unix.BPF_MAP_TYPE_PERF_EVENT_ARRAY, keySize: 4, valueSize: 4, maxEntries: 2}, "")
}
