package bench

// Go handle on the C reference (cref.c). Only the benchmarks use it.

/*
#cgo pkg-config: libbpf
#include "cref.h"
*/
import "C"

import (
	"encoding/binary"
	"fmt"
	"syscall"
)

// CRef is the C reference reader over one perf event array.
type CRef struct{ r *C.struct_cref }

// OpenCRef opens libbpf's perf_buffer with the C sample callback.
func OpenCRef(mapFD, pages int) (*CRef, error) {
	var cerr C.int
	r := C.cref_open(C.int(mapFD), C.size_t(pages), &cerr)
	if r == nil {
		return nil, fmt.Errorf("open C reference: %w", syscall.Errno(-cerr))
	}
	return &CRef{r}, nil
}

// Consume drains every ring and returns the samples read.
func (c *CRef) Consume() (int, error) {
	n := C.cref_consume(c.r)
	if n < 0 {
		return 0, fmt.Errorf("consume with the C reference: %w", syscall.Errno(-n))
	}
	return int(n), nil
}

// Sum is the running sum of every byte read, so the reads cannot be elided.
func (c *CRef) Sum() uint64 { return uint64(C.cref_sum(c.r)) }

// Close frees the perf buffer.
func (c *CRef) Close() { C.cref_close(c.r) }

// ReadAll sums p the way cref_read_all does: 8 bytes at a time, then the
// tail. The Go benchmarks' callbacks call it so every mode reads each byte.
func ReadAll(p []byte) uint64 {
	var sum uint64
	i := 0
	for ; i+8 <= len(p); i += 8 {
		sum += binary.LittleEndian.Uint64(p[i:])
	}
	for ; i < len(p); i++ {
		sum += uint64(p[i])
	}
	return sum
}
