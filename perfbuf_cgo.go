//go:build cgo

package perfbuf

// This file and perfbuf_helpers.{c,h} are the only places that use cgo:
// libbpf opens, maps and frees the rings. Nothing here reads a record and
// nothing calls back into Go.

/*
#cgo !perfbuf_static pkg-config: libbpf
#cgo perfbuf_static LDFLAGS: -l:libbpf.a -lelf -lz
#include <stdlib.h>
#include <bpf/bpf.h>
#include <bpf/libbpf.h>
#include "perfbuf_helpers.h"
*/
import "C"

import (
	"syscall"
	"unsafe"
)

// The map types New checks for, against libbpf's definitions.
var (
	_ [C.BPF_MAP_TYPE_PERF_EVENT_ARRAY - mapTypePerfEventArray]struct{}
	_ [mapTypePerfEventArray - C.BPF_MAP_TYPE_PERF_EVENT_ARRAY]struct{}
	_ [C.BPF_MAP_TYPE_PERCPU_ARRAY - mapTypePerCPUArray]struct{}
	_ [C.BPF_MAP_TYPE_RINGBUF - mapTypeRingBuf]struct{}
	_ [C.BPF_MAP_TYPE_ARRAY_OF_MAPS - mapTypeArrayOfMaps]struct{}
	_ [mapTypeArrayOfMaps - C.BPF_MAP_TYPE_ARRAY_OF_MAPS]struct{}
	_ [mapTypeRingBuf - C.BPF_MAP_TYPE_RINGBUF]struct{}
	_ [mapTypePerCPUArray - C.BPF_MAP_TYPE_PERCPU_ARRAY]struct{}
)

// cBuffer owns the libbpf perf_buffer.
type cBuffer struct {
	pb *C.struct_perf_buffer
}

// errnoErr turns libbpf's negative errno into a syscall.Errno.
func errnoErr(ret C.int) error {
	return syscall.Errno(-ret)
}

func openC(fd int, cfg ringConfig, cpus []int32) (*cBuffer, error) {
	// libbpf reads cpus only during the call (it keeps no pointer to it),
	// and cgo pins Go memory passed to C for the call's duration; the
	// config struct lives in C memory because it holds that pointer.
	ccfg := (*C.struct_perfbuf_config)(C.calloc(1, C.sizeof_struct_perfbuf_config))
	defer C.free(unsafe.Pointer(ccfg))
	ccpus := (*C.int)(C.calloc(C.size_t(len(cpus)), C.sizeof_int))
	defer C.free(unsafe.Pointer(ccpus))
	copy(unsafe.Slice((*int32)(unsafe.Pointer(ccpus)), len(cpus)), cpus)
	ccfg.page_cnt = C.size_t(cfg.pages)
	ccfg.wakeup_events = C.uint64_t(cfg.wakeupEvents)
	ccfg.wakeup_bytes = C.uint64_t(cfg.wakeupBytes)
	ccfg.cpu_cnt = C.int(len(cpus))
	ccfg.cpus = ccpus
	var cerr C.int
	pb := C.perfbuf_open(C.int(fd), ccfg, &cerr)
	if pb == nil {
		return nil, errnoErr(cerr)
	}
	return &cBuffer{pb: pb}, nil
}

func (c *cBuffer) close() { C.perf_buffer__free(c.pb) }

func (c *cBuffer) bufferCount() int { return int(C.perf_buffer__buffer_cnt(c.pb)) }

func (c *cBuffer) bufferFD(i int) int { return int(C.perf_buffer__buffer_fd(c.pb, C.size_t(i))) }

func (c *cBuffer) epollFD() int { return int(C.perf_buffer__epoll_fd(c.pb)) }

// ring returns ring i's mapping (perf_buffer__buffer): base points at its
// perf_event_mmap_page, and size bytes of data follow the header page.
func (c *cBuffer) ring(i int) (unsafe.Pointer, int, error) {
	var base unsafe.Pointer
	var size C.size_t
	if ret := C.perf_buffer__buffer(c.pb, C.int(i), &base, &size); ret < 0 {
		return nil, 0, errnoErr(ret)
	}
	return base, int(size), nil
}

func mapInfo(fd int) (mapDesc, error) {
	var d C.struct_perfbuf_map_desc
	var name [C.BPF_OBJ_NAME_LEN]C.char
	if ret := C.perfbuf_map_info(C.int(fd), &d, &name[0], C.size_t(len(name))); ret < 0 {
		return mapDesc{}, errnoErr(ret)
	}
	return mapDesc{
		id:         uint32(d.id),
		typ:        uint32(d._type),
		keySize:    uint32(d.key_size),
		valueSize:  uint32(d.value_size),
		maxEntries: uint32(d.max_entries),
		name:       C.GoString(&name[0]),
	}, nil
}

// mapTypeName names a map type as libbpf does ("hash", "perf_event_array").
func mapTypeName(t uint32) string {
	if s := C.libbpf_bpf_map_type_str(C.enum_bpf_map_type(t)); s != nil {
		return C.GoString(s)
	}
	return "unknown"
}

// lookupPerCPU reads key of the per-CPU array fd into out
// (BPF_MAP_LOOKUP_ELEM): every possible CPU's value, in CPU order, each
// rounded up to 8 bytes. out must hold them all; the kernel writes them
// there during the call (cgo pins out, which holds no Go pointer).
func lookupPerCPU(fd int, key uint32, out []uint64) error {
	k := C.uint32_t(key)
	if ret := C.bpf_map_lookup_elem(C.int(fd), unsafe.Pointer(&k), unsafe.Pointer(&out[0])); ret < 0 {
		return errnoErr(ret)
	}
	return nil
}

// innerMapID reads slot key of the array of maps fd (BPF_MAP_LOOKUP_ELEM):
// from user space, the ID of the map in the slot. An empty slot is ENOENT.
func innerMapID(fd int, key uint32) (uint32, error) {
	k, id := C.uint32_t(key), C.uint32_t(0)
	if ret := C.bpf_map_lookup_elem(C.int(fd), unsafe.Pointer(&k), unsafe.Pointer(&id)); ret < 0 {
		return 0, errnoErr(ret)
	}
	return uint32(id), nil
}

// mapFDByID opens the map with ID id (BPF_MAP_GET_FD_BY_ID, which needs
// CAP_SYS_ADMIN): a descriptor the caller closes.
func mapFDByID(id uint32) (int, error) {
	fd := C.bpf_map_get_fd_by_id(C.uint32_t(id))
	if fd < 0 {
		return -1, errnoErr(fd)
	}
	return int(fd), nil
}

// updatePerCPU writes vals, every possible CPU's value in CPU order as
// lookupPerCPU reads them, to key of the per-CPU array fd
// (BPF_MAP_UPDATE_ELEM; cgo pins vals for the call).
func updatePerCPU(fd int, key uint32, vals []uint64) error {
	k := C.uint32_t(key)
	if ret := C.bpf_map_update_elem(C.int(fd), unsafe.Pointer(&k), unsafe.Pointer(&vals[0]), C.BPF_ANY); ret < 0 {
		return errnoErr(ret)
	}
	return nil
}
