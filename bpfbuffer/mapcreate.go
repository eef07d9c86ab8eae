// SPDX-License-Identifier: Apache-2.0

package bpfbuffer

// The maps Prepare makes itself, through libbpfgo (libbpf's
// bpf_map_create and bpf_map_update_elem): a ring buffer in overwrite mode,
// the ring buffers of an array of ring buffers and the array that holds
// them, and the probe's ring buffer. libbpfgo declares no map flags and no
// inner map in an object, so these are made before load and libbpf reuses
// them.

import (
	"errors"
	"fmt"
	"syscall"
	"unsafe"

	"github.com/aquasecurity/libbpfgo"
)

// createRingBuf makes a BPF_MAP_TYPE_RINGBUF of size bytes (a power of two
// pages) named name, with the map flags flags, and returns its descriptor,
// which the caller closes. The kernel's errno comes wrapped: EINVAL for a
// size or flag it refuses, EPERM without CAP_BPF or, on kernels before
// 5.11, when the ring would pass RLIMIT_MEMLOCK, ENOMEM.
func createRingBuf(name string, size, flags uint32) (int, error) {
	m, err := libbpfgo.CreateMap(libbpfgo.MapTypeRingbuf, name, 0, 0, int(size), &libbpfgo.BPFMapCreateOpts{MapFlags: flags})
	if err != nil {
		return -1, fmt.Errorf("create ring buffer %q of %d bytes: %w", name, size, errnoOf(err))
	}
	return m.FileDescriptor(), nil
}

// createArrayOfMaps makes a BPF_MAP_TYPE_ARRAY_OF_MAPS of entries slots
// named name, whose inner maps are like the map innerFD (the kernel takes
// its type, sizes and flags as the template, and keeps no reference to
// it), and returns it. Its slots are empty; updateSlot fills one. The
// kernel's errno comes wrapped: EINVAL or ENOTSUPP for an inner map type
// it does not allow in an array of maps (a ring buffer before 5.10 among
// them), EPERM, ENOMEM.
func createArrayOfMaps(name string, entries uint32, innerFD int) (*libbpfgo.BPFMapLow, error) {
	// Values are a map descriptor on update, an ID on lookup.
	m, err := libbpfgo.CreateMap(libbpfgo.MapTypeArrayOfMaps, name, 4, 4, int(entries), &libbpfgo.BPFMapCreateOpts{InnerMapFD: uint32(innerFD)})
	if err != nil {
		return nil, fmt.Errorf("create array of maps %q of %d slots: %w", name, entries, errnoOf(err))
	}
	return m, nil
}

// updateSlot stores the map descriptor value at key of the array of maps
// m. The error is the kernel's errno, wrapped.
func updateSlot(m *libbpfgo.BPFMapLow, key uint32, value int) error {
	v := uint32(value)
	if err := m.Update(unsafe.Pointer(&key), unsafe.Pointer(&v)); err != nil {
		return fmt.Errorf("update map slot %d: %w", key, errnoOf(err))
	}
	return nil
}

// errnoOf returns the errno that libbpfgo's err wraps, so that the
// caller's message says what was made; err itself if it wraps none.
func errnoOf(err error) error {
	var errno syscall.Errno
	if errors.As(err, &errno) {
		return errno
	}
	return err
}
