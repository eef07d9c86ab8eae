//go:build cgo

package perfbuf

// This file and perfbuf_helpers.{c,h} are the only places that use cgo.
// Nothing here calls back into Go: the C event callback copies records into
// an arena that perfbuf.go walks after the call returns.

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
)

// The arena format is shared with perfbuf_helpers.c: fail the build if the
// two sides disagree.
var (
	_ [C.PERFBUF_ENTRY_HDR - arenaEntryHdr]struct{}
	_ [arenaEntryHdr - C.PERFBUF_ENTRY_HDR]struct{}
	_ [C.PERFBUF_ENTRY_LOST - arenaEntryLost]struct{}
	_ [arenaEntryLost - C.PERFBUF_ENTRY_LOST]struct{}
	_ [C.PERFBUF_ENTRY_OTHER - arenaEntryOther]struct{}
	_ [arenaEntryOther - C.PERFBUF_ENTRY_OTHER]struct{}
	_ [C.PERFBUF_ENTRY_BAD - arenaEntryBad]struct{}
	_ [arenaEntryBad - C.PERFBUF_ENTRY_BAD]struct{}
	_ [C.BPF_MAP_TYPE_PERF_EVENT_ARRAY - mapTypePerfEventArray]struct{}
	_ [mapTypePerfEventArray - C.BPF_MAP_TYPE_PERF_EVENT_ARRAY]struct{}
)

// cBuffer owns the libbpf perf_buffer and the arena (both C memory).
type cBuffer struct {
	st    *C.struct_perfbuf_state
	arena []byte // aliases st->arena; written by C only during drain
}

// errnoErr turns libbpf's negative errno into a syscall.Errno.
func errnoErr(ret C.int) error {
	return syscall.Errno(-ret)
}

func openC(fd, pages, wakeupEvents, wakeupBytes int, cpus []int32, arenaCap, reserve int) (*cBuffer, error) {
	var cerr C.int
	// libbpf reads cpus only during the call (it keeps no pointer to it).
	st := C.perfbuf_open(C.int(fd), C.size_t(pages), C.uint64_t(wakeupEvents), C.uint64_t(wakeupBytes),
		C.int(len(cpus)), (*C.int)(unsafe.Pointer(&cpus[0])), C.size_t(arenaCap), C.size_t(reserve), &cerr)
	if st == nil {
		return nil, errnoErr(cerr)
	}
	return &cBuffer{
		st:    st,
		arena: unsafe.Slice((*byte)(unsafe.Pointer(st.arena)), int(st.arena_cap)),
	}, nil
}

func (c *cBuffer) close() { C.perfbuf_close(c.st) }

func (c *cBuffer) bufferCount() int { return int(C.perf_buffer__buffer_cnt(c.st.pb)) }

func (c *cBuffer) bufferFD(i int) int { return int(C.perf_buffer__buffer_fd(c.st.pb, C.size_t(i))) }

func (c *cBuffer) epollFD() int { return int(C.perf_buffer__epoll_fd(c.st.pb)) }

// drain fills the arena from rings idxs[pos:] and returns the bytes used and
// the position to resume from (len(idxs) when every ring was drained).
func (c *cBuffer) drain(idxs []int32, pos int) (used, next int, err error) {
	// The position lives in C memory: a Go out-parameter would escape to
	// the heap, an allocation per call.
	c.st.pos = C.int(pos)
	ret := C.perfbuf_drain(c.st, (*C.int32_t)(unsafe.Pointer(&idxs[0])), C.int(len(idxs)))
	if ret < 0 {
		err = errnoErr(ret)
	}
	return int(c.st.arena_len), int(c.st.pos), err
}

// ring returns ring i's mapping (perf_buffer__buffer): base points at its
// perf_event_mmap_page, and size bytes of data follow the header page.
func (c *cBuffer) ring(i int) (unsafe.Pointer, int, error) {
	var base unsafe.Pointer
	var size C.size_t
	if ret := C.perf_buffer__buffer(c.st.pb, C.int(i), &base, &size); ret < 0 {
		return nil, 0, errnoErr(ret)
	}
	return base, int(size), nil
}

func mapInfo(fd int) (mapDesc, error) {
	var id, typ, maxEntries C.uint32_t
	var name [C.BPF_OBJ_NAME_LEN]C.char
	if ret := C.perfbuf_map_info(C.int(fd), &id, &typ, &maxEntries, &name[0], C.size_t(len(name))); ret < 0 {
		return mapDesc{}, errnoErr(ret)
	}
	return mapDesc{id: uint32(id), typ: uint32(typ), maxEntries: uint32(maxEntries), name: C.GoString(&name[0])}, nil
}

// mapTypeName names a map type as libbpf does ("hash", "perf_event_array").
func mapTypeName(t uint32) string {
	if s := C.libbpf_bpf_map_type_str(C.enum_bpf_map_type(t)); s != nil {
		return C.GoString(s)
	}
	return "unknown"
}

// eventForTest runs the C event callback on rec, a whole perf record as
// libbpf hands it over, for buffer index idx, with an arena of arenaCap
// bytes that keeps reserve free, and returns the arena's entries and
// whether the callback asked to stop the pass. Tests of the C half use it.
func eventForTest(recs [][]byte, idx, arenaCap, reserve int) (entries []byte, stopped bool) {
	arena := C.malloc(C.size_t(arenaCap))
	defer C.free(arena)
	st := C.struct_perfbuf_state{
		arena:     (*C.uint8_t)(arena),
		arena_cap: C.size_t(arenaCap),
		reserve:   C.size_t(reserve),
		cur_idx:   C.int(idx),
	}
	for _, rec := range recs {
		p := C.CBytes(rec) // C memory: aligned as libbpf's records are
		ret := C.perfbuf_event_for_test(&st, p)
		C.free(p)
		if ret != C.LIBBPF_PERF_EVENT_CONT {
			stopped = true
			break
		}
	}
	return C.GoBytes(arena, C.int(st.arena_len)), stopped
}
