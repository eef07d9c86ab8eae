// SPDX-License-Identifier: Apache-2.0

package kernel

// BPF_MAP_CREATE for the maps perfbuf makes itself: the ring buffers of an
// array of ring buffers and the array that holds them (package bpfbuffer).

import (
	"fmt"

	"golang.org/x/sys/unix"
)

// mapCreateAttr is the head of union bpf_attr's BPF_MAP_CREATE struct, up
// to map_name (include/uapi/linux/bpf.h): the fields every kernel since
// 4.15 reads. The kernel treats the fields after it (map_ifindex,
// btf_fd, ..., map_extra) as zero.
type mapCreateAttr struct {
	mapType    uint32
	keySize    uint32
	valueSize  uint32
	maxEntries uint32
	mapFlags   uint32
	innerMapFD uint32
	_          uint32 // numa_node
	mapName    [unix.BPF_OBJ_NAME_LEN]byte
}

// createMap makes the map a describes (BPF_MAP_CREATE) and returns its
// descriptor, close-on-exec as every bpf(2) descriptor, which the caller
// closes. name is cut to the kernel's 15 characters (BPF_OBJ_NAME_LEN
// with its NUL); the kernel takes letters, digits, '_' and '.'.
func createMap(a mapCreateAttr, name string) (int, error) {
	copy(a.mapName[:unix.BPF_OBJ_NAME_LEN-1], name)
	return bpf(unix.BPF_MAP_CREATE, &a)
}

// CreateRingBuf makes a BPF_MAP_TYPE_RINGBUF of size bytes (a power of two
// pages) named name, with the map flags flags, and returns its descriptor.
// The kernel's errno comes wrapped: EINVAL for a size or flag it refuses,
// EPERM without CAP_BPF or, on kernels before 5.11, when the ring would
// pass RLIMIT_MEMLOCK (the caller says which), ENOMEM.
func CreateRingBuf(name string, size, flags uint32) (int, error) {
	fd, err := createMap(mapCreateAttr{mapType: unix.BPF_MAP_TYPE_RINGBUF, maxEntries: size, mapFlags: flags}, name)
	if err != nil {
		return -1, fmt.Errorf("create ring buffer %q of %d bytes: %w", name, size, err)
	}
	return fd, nil
}

// CreatePerfEventArray makes a BPF_MAP_TYPE_PERF_EVENT_ARRAY of entries
// slots (one a CPU, by CPU number) named name, and returns its
// descriptor. Its slots are empty: a reader fills them. The kernel's errno
// comes wrapped: EPERM without CAP_BPF, E2BIG past its limit, ENOMEM.
func CreatePerfEventArray(name string, entries uint32) (int, error) {
	a := mapCreateAttr{mapType: unix.BPF_MAP_TYPE_PERF_EVENT_ARRAY, keySize: 4, valueSize: 4, maxEntries: entries}
	fd, err := createMap(a, name)
	if err != nil {
		return -1, fmt.Errorf("create perf event array %q of %d slots: %w", name, entries, err)
	}
	return fd, nil
}

// CreateArrayOfMaps makes a BPF_MAP_TYPE_ARRAY_OF_MAPS of entries slots
// named name, whose inner maps are like the map innerFD (the kernel takes
// its type, sizes and flags as the template, and keeps no reference to
// it), and returns its descriptor. Its slots are empty; UpdateSlot fills
// one. The kernel's errno comes wrapped: EINVAL for an inner map type it
// does not allow in an array of maps (a ring buffer before 5.10 among
// them), EPERM, ENOMEM.
func CreateArrayOfMaps(name string, entries uint32, innerFD int) (int, error) {
	a := mapCreateAttr{
		mapType:    unix.BPF_MAP_TYPE_ARRAY_OF_MAPS,
		keySize:    4,
		valueSize:  4, // a map descriptor on update, an ID on lookup
		maxEntries: entries,
		innerMapFD: uint32(innerFD),
	}
	fd, err := createMap(a, name)
	if err != nil {
		return -1, fmt.Errorf("create array of maps %q of %d slots: %w", name, entries, err)
	}
	return fd, nil
}
