// SPDX-License-Identifier: Apache-2.0

package owner

import (
	"errors"
	"slices"
	"syscall"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/perfbuf/perfbuf/internal/kernel"
)

// fakeEvents is an opening of rings in Go memory, one per CPU.
type fakeEvents struct {
	cpus   []int32
	mem    [][]byte // a header page, then 4 KiB of data
	closed bool
}

func newFakeEvents(cpus []int32) *fakeEvents {
	const page, size = 4096, 4096
	e := &fakeEvents{cpus: cpus}
	for range cpus {
		m := make([]byte, page+size)
		hdr := (*unix.PerfEventMmapPage)(unsafe.Pointer(&m[0]))
		hdr.Data_offset, hdr.Data_size = page, size
		e.mem = append(e.mem, m)
	}
	return e
}

func (e *fakeEvents) BufferCount() int   { return len(e.cpus) }
func (e *fakeEvents) BufferFD(j int) int { return 1000 + j }
func (e *fakeEvents) EpollFD() int       { return -1 }
func (e *fakeEvents) Close()             { e.closed = true }
func (e *fakeEvents) Ring(j int) (unsafe.Pointer, int, error) {
	return unsafe.Pointer(&e.mem[j][0]), len(e.mem[j]) - 4096, nil
}

// fakeOpeners replaces both openers for the test: libbpf's fails with
// libbpfErr (nil: opens fake rings); perfbuf's opens fake rings. It
// returns the calls each got, by the CPUs asked for.
func fakeOpeners(t *testing.T, libbpfErr error) (libbpf, own *[][]int32, opened *[]*fakeEvents) {
	t.Helper()
	oldL, oldG := OpenLibbpf, openGoEvents
	t.Cleanup(func() { OpenLibbpf, openGoEvents = oldL, oldG })
	libbpf, own, opened = new([][]int32), new([][]int32), new([]*fakeEvents)
	OpenLibbpf = func(fd int, cfg kernel.PerfConfig, cpus []int32) (PerfEvents, error) {
		*libbpf = append(*libbpf, slices.Clone(cpus))
		if libbpfErr != nil {
			return nil, libbpfErr
		}
		e := newFakeEvents(cpus)
		*opened = append(*opened, e)
		return e, nil
	}
	openGoEvents = func(fd int, cfg RingConfig, cpus []int32) (PerfEvents, error) {
		*own = append(*own, slices.Clone(cpus))
		e := newFakeEvents(cpus)
		*opened = append(*opened, e)
		return e, nil
	}
	return libbpf, own, opened
}

// openPerfEvents goes to perfbuf's own opener where libbpf refuses with
// E2BIG (its 128-byte read of the online list), and only there; the
// selftests' hook sends every opening to it, and so does a build without
// cgo, which has no libbpf opener.
func TestOpenPerfEventsFallback(t *testing.T) {
	cpus := []int32{0, 2, 4}
	for _, tc := range []struct {
		name      string
		libbpfErr error
		force     bool
		noLibbpf  bool  // a build without cgo
		wantErr   error // nil: opened
		wantOwn   bool  // by perfbuf's opener
	}{
		{"libbpf opens", nil, false, false, nil, false},
		{"long online list", syscall.E2BIG, false, false, nil, true},
		{"no privileges", syscall.EPERM, false, false, syscall.EPERM, false},
		{"bad map", syscall.EBADF, false, false, syscall.EBADF, false},
		{"forced", nil, true, false, nil, true},
		{"no cgo", nil, false, true, nil, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			libbpf, own, _ := fakeOpeners(t, tc.libbpfErr)
			if tc.force {
				kernel.ForcePerfRings.Store(true)
				t.Cleanup(func() { kernel.ForcePerfRings.Store(false) })
			}
			if tc.noLibbpf {
				OpenLibbpf = nil // fakeOpeners restores it
			}
			ev, err := openPerfEvents(7, RingConfig{Pages: 1, PageSize: 4096, WakeupEvents: 1}, cpus)
			if !errors.Is(err, tc.wantErr) || (err == nil) != (tc.wantErr == nil) {
				t.Fatalf("err %v, want %v", err, tc.wantErr)
			}
			if (ev == nil) != (err != nil) {
				t.Fatalf("opening %v with error %v", ev, err)
			}
			wantLibbpf := 1
			if tc.force || tc.noLibbpf {
				wantLibbpf = 0
			}
			wantOwn := 0
			if tc.wantOwn {
				wantOwn = 1
			}
			if len(*libbpf) != wantLibbpf || len(*own) != wantOwn {
				t.Fatalf("libbpf asked %d times, perfbuf's opener %d; want %d and %d", len(*libbpf), len(*own), wantLibbpf, wantOwn)
			}
			if wantOwn == 1 && !slices.Equal((*own)[0], cpus) {
				t.Errorf("perfbuf's opener asked for cpus %v, want %v", (*own)[0], cpus)
			}
		})
	}
}

// A ring opened for a CPU that came online, where libbpf refuses, comes
// from perfbuf's opener too; if adding it fails once it is open, openOne
// closes it and leaves it out of the rings.
func TestOpenOneFallback(t *testing.T) {
	_, own, opened := fakeOpeners(t, syscall.E2BIG)
	epfd, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(epfd)
	pipe := make([]int, 2)
	if err := unix.Pipe2(pipe, unix.O_CLOEXEC); err != nil {
		t.Fatal(err)
	}
	defer unix.Close(pipe[0])
	defer unix.Close(pipe[1])
	// The fake's descriptors are not open: the epoll add fails for them.
	r := &rings{mapFD: -1, cfg: RingConfig{Pages: 1, PageSize: 4096, WakeupEvents: 1}, epfd: epfd}
	if _, _, _, err := r.openOne(5); !errors.Is(err, syscall.EBADF) {
		t.Fatalf("openOne with an epoll add that fails: %v, want EBADF", err)
	}
	if len(*own) != 1 || !slices.Equal((*own)[0], []int32{5}) {
		t.Fatalf("perfbuf's opener asked for %v, want cpu 5 once", *own)
	}
	if len(r.cs) != 0 || !(*opened)[0].closed {
		t.Fatalf("after a failed add: %d openings kept, closed %v; want none kept, closed", len(r.cs), (*opened)[0].closed)
	}
	// Through a descriptor that epoll takes, the ring joins the rings.
	openGoEvents = func(fd int, cfg RingConfig, cpus []int32) (PerfEvents, error) {
		return pipeEvents{newFakeEvents(cpus), pipe[0]}, nil
	}
	rb, fd, src, err := r.openOne(5)
	if err != nil {
		t.Fatal(err)
	}
	if rb.CPU() != 5 || fd != pipe[0] || src.j != 0 || len(r.cs) != 1 {
		t.Fatalf("ring of cpu %d, fd %d, index %d, %d openings; want cpu 5, fd %d, index 0, 1", rb.CPU(), fd, src.j, len(r.cs), pipe[0])
	}
}

// pipeEvents are fake rings whose descriptor is fd.
type pipeEvents struct {
	*fakeEvents
	fd int
}

func (p pipeEvents) BufferFD(int) int { return p.fd }

// A configuration perfbuf checked is one the kernel package's opener takes.
func TestRingConfigKernel(t *testing.T) {
	for _, o := range []RingOptions{
		{},
		{RingBytes: 1 << 20, WakeupEvents: 7},
		{RingBytes: 8192, WakeupBytes: 4096},
	} {
		cfg, err := o.Config(4096, 1<<34)
		if err != nil {
			t.Fatal(err)
		}
		k := cfg.kernel()
		if k.Pages != cfg.Pages || k.PageSize != 4096 || k.WakeupEvents != cfg.WakeupEvents || k.WakeupBytes != o.WakeupBytes {
			t.Errorf("%+v: kernel config %+v", o, k)
		}
		if err := k.Check(); err != nil {
			t.Errorf("%+v: the kernel package refuses it: %v", o, err)
		}
	}
}
