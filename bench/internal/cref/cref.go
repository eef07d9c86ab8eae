// SPDX-License-Identifier: Apache-2.0

// Package cref is the C reference the benchmarks measure perfbuf against:
// libbpf's perf_buffer (Reader) and ring_buffer (RingReader) driven from C
// (cref.c), with a C sample callback that reads every byte. It is shared by
// bench/selftest and bench/perfbench.
package cref

// Only this file uses cgo in this package. Like perfbuf itself, it links
// the system libbpf through pkg-config, or the static one with the
// perfbuf_static tag, so that the reference runs the same libbpf as the
// package it is compared with.

/*
#cgo !perfbuf_static pkg-config: libbpf
#cgo perfbuf_static LDFLAGS: -l:libbpf.a -lelf -lz
#include <bpf/libbpf.h>
#include "cref.h"
*/
import "C"

import (
	"encoding/binary"
	"fmt"
	"syscall"
	"time"
)

// Reader is the C reference reader over one perf event array. It is not
// safe for concurrent use.
type Reader struct{ r *C.struct_cref }

// Open opens libbpf's perf_buffer over the map mapFD with pages data pages
// per CPU, waking up every wakeupEvents samples (0 means 1). Errors: a
// syscall.Errno from libbpf.
func Open(mapFD, pages, wakeupEvents int) (*Reader, error) {
	var cerr C.int
	r := C.cref_open(C.int(mapFD), C.size_t(pages), C.uint32_t(wakeupEvents), &cerr)
	if r == nil {
		return nil, fmt.Errorf("open C reference: %w", syscall.Errno(-cerr))
	}
	return &Reader{r}, nil
}

// Consume drains every ring (perf_buffer__consume) and returns the samples
// read.
func (c *Reader) Consume() (int, error) {
	n := C.cref_consume(c.r)
	if n < 0 {
		return 0, fmt.Errorf("consume with the C reference: %w", syscall.Errno(-n))
	}
	return int(n), nil
}

// Poll waits up to timeout (negative: no limit) for rings to be ready,
// drains them (perf_buffer__poll) and returns the samples read. The wait
// has libbpf's millisecond resolution: timeout is rounded up.
func (c *Reader) Poll(timeout time.Duration) (int, error) {
	ms := -1
	if timeout >= 0 {
		ms = int((timeout + time.Millisecond - 1) / time.Millisecond)
	}
	n := C.cref_poll(c.r, C.int(ms))
	if n < 0 {
		return 0, fmt.Errorf("poll with the C reference: %w", syscall.Errno(-n))
	}
	return int(n), nil
}

// Samples is the number of samples read since Open.
func (c *Reader) Samples() uint64 { return uint64(C.cref_samples(c.r)) }

// Lost is the number of samples the kernel reported lost since Open.
func (c *Reader) Lost() uint64 { return uint64(C.cref_lost(c.r)) }

// Sum is the running sum of every byte read, so the reads cannot be elided.
func (c *Reader) Sum() uint64 { return uint64(C.cref_sum(c.r)) }

// Close frees the perf buffer. It is idempotent.
func (c *Reader) Close() {
	C.cref_close(c.r)
	c.r = nil
}

// RingReader is the C reference reader over one BPF ring buffer: libbpf's
// ring_buffer. It is not safe for concurrent use.
type RingReader struct{ r *C.struct_cref_rb }

// OpenRing opens libbpf's ring_buffer over the BPF ring buffer mapFD.
// Errors: a syscall.Errno from libbpf.
func OpenRing(mapFD int) (*RingReader, error) {
	var cerr C.int
	r := C.cref_rb_open(C.int(mapFD), &cerr)
	if r == nil {
		return nil, fmt.Errorf("open C ring buffer reference: %w", syscall.Errno(-cerr))
	}
	return &RingReader{r}, nil
}

// Consume drains the ring (ring_buffer__consume) and returns the samples
// read.
func (c *RingReader) Consume() (int, error) {
	n := C.cref_rb_consume(c.r)
	if n < 0 {
		return 0, fmt.Errorf("consume with the C ring buffer reference: %w", syscall.Errno(-n))
	}
	return int(n), nil
}

// Poll waits up to timeout (negative: no limit; rounded up to a
// millisecond) for records, drains the ring (ring_buffer__poll) and returns
// the samples read.
func (c *RingReader) Poll(timeout time.Duration) (int, error) {
	ms := -1
	if timeout >= 0 {
		ms = int((timeout + time.Millisecond - 1) / time.Millisecond)
	}
	n := C.cref_rb_poll(c.r, C.int(ms))
	if n < 0 {
		return 0, fmt.Errorf("poll with the C ring buffer reference: %w", syscall.Errno(-n))
	}
	return int(n), nil
}

// Samples is the number of samples read since OpenRing.
func (c *RingReader) Samples() uint64 { return uint64(C.cref_rb_samples(c.r)) }

// Sum is the running sum of every byte read.
func (c *RingReader) Sum() uint64 { return uint64(C.cref_rb_sum(c.r)) }

// Close frees the ring buffer. It is idempotent.
func (c *RingReader) Close() {
	C.cref_rb_close(c.r)
	c.r = nil
}

// LibbpfVersion is the version of the libbpf linked in, such as "v1.4".
func LibbpfVersion() string { return C.GoString(C.libbpf_version_string()) }

// ReadAll sums p the way cref_read_all does: 8 bytes at a time, then the
// tail. The Go modes' benchmark callbacks call it so that every mode reads
// each byte once.
func ReadAll(p []byte) uint64 {
	var sum uint64
	ne := binary.NativeEndian
	for len(p) >= 32 {
		sum += ne.Uint64(p[0:8]) + ne.Uint64(p[8:16]) + ne.Uint64(p[16:24]) + ne.Uint64(p[24:32])
		p = p[32:]
	}
	for len(p) >= 8 {
		sum += ne.Uint64(p)
		p = p[8:]
	}
	for _, b := range p {
		sum += uint64(b)
	}
	return sum
}
