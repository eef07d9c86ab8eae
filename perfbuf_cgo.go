// SPDX-License-Identifier: Apache-2.0

//go:build cgo && !perfbuf_nolibbpf

package perfbuf

// This file and perfbuf_helpers.{c,h} are the only places that use cgo,
// for what libbpf gives: its perf_buffer opens, maps and frees a perf
// event array's rings. Nothing here reads a record and nothing calls back
// into Go; plain bpf(2) commands are made in Go (internal/kernel).
//
// The build tag perfbuf_nolibbpf leaves this file and the C helpers out
// of a cgo build, as CGO_ENABLED=0 does: perfbuf's own opener
// (internal/owner/perfopen.go) then opens every perf ring, and the
// binary links no libbpf. The tag names what it removes, as the
// toolchain's netgo and osusergo do; the default, with cgo, stays
// libbpf's perf_buffer.

/*
#cgo !perfbuf_static pkg-config: libbpf
#cgo perfbuf_static LDFLAGS: -l:libbpf.a -lelf -lz
#include <stdlib.h>
#include <bpf/libbpf.h>
#include "perfbuf_helpers.h"
*/
import "C"

import (
	"syscall"
	"unsafe"

	"github.com/perfbuf/perfbuf/internal/kernel"
	"github.com/perfbuf/perfbuf/internal/owner"
)

// cBuffer owns the libbpf perf_buffer.
type cBuffer struct {
	pb *C.struct_perf_buffer
}

// errnoErr turns libbpf's negative errno into a syscall.Errno.
func errnoErr(ret C.int) error {
	return syscall.Errno(-ret)
}

// init gives the owner (internal/owner/perfopen.go) libbpf's opener
// (openC).
func init() {
	owner.OpenLibbpf = func(fd int, cfg kernel.PerfConfig, cpus []int32) (owner.PerfEvents, error) {
		c, err := openC(fd, cfg, cpus)
		if err != nil {
			return nil, err // (not a nil *cBuffer in an interface)
		}
		return c, nil
	}
}

var _ owner.PerfEvents = (*cBuffer)(nil)

// openC opens a ring on each of cpus, stored at the CPU's key of the perf
// event array fd (perf_buffer__new_raw). The error is libbpf's errno.
// libbpf keeps fd, stores through it (so the slots are the file's behind
// fd: the reader's own, see slotFile), and deletes every slot by key
// through it in perf_buffer__free, also when the open fails part way;
// the owner's rings.release makes fd no map's before the free.
func openC(fd int, cfg kernel.PerfConfig, cpus []int32) (*cBuffer, error) {
	// libbpf reads cpus only during the call (it keeps no pointer to it),
	// and cgo pins Go memory passed to C for the call's duration; the
	// config struct lives in C memory because it holds that pointer.
	ccfg := (*C.struct_perfbuf_config)(C.calloc(1, C.sizeof_struct_perfbuf_config))
	defer C.free(unsafe.Pointer(ccfg))
	ccpus := (*C.int)(C.calloc(C.size_t(len(cpus)), C.sizeof_int))
	defer C.free(unsafe.Pointer(ccpus))
	copy(unsafe.Slice((*int32)(unsafe.Pointer(ccpus)), len(cpus)), cpus)
	ccfg.page_cnt = C.size_t(cfg.Pages)
	ccfg.wakeup_events = C.uint64_t(cfg.WakeupEvents)
	ccfg.wakeup_bytes = C.uint64_t(cfg.WakeupBytes)
	ccfg.cpu_cnt = C.int(len(cpus))
	ccfg.cpus = ccpus
	if cfg.CountLost {
		ccfg.count_lost = 1
	}
	var cerr C.int
	pb := C.perfbuf_open(C.int(fd), ccfg, &cerr)
	if pb == nil {
		return nil, errnoErr(cerr)
	}
	return &cBuffer{pb: pb}, nil
}

func (c *cBuffer) Close() { C.perf_buffer__free(c.pb) }

func (c *cBuffer) BufferCount() int { return int(C.perf_buffer__buffer_cnt(c.pb)) }

func (c *cBuffer) BufferFD(i int) int { return int(C.perf_buffer__buffer_fd(c.pb, C.size_t(i))) }

func (c *cBuffer) EpollFD() int { return int(C.perf_buffer__epoll_fd(c.pb)) }

// Ring returns ring i's mapping (perf_buffer__buffer): base points at its
// perf_event_mmap_page, and size bytes of data follow the header page.
func (c *cBuffer) Ring(i int) (unsafe.Pointer, int, error) {
	var base unsafe.Pointer
	var size C.size_t
	if ret := C.perf_buffer__buffer(c.pb, C.int(i), &base, &size); ret < 0 {
		return nil, 0, errnoErr(ret)
	}
	return base, int(size), nil
}
