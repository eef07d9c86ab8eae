// SPDX-License-Identifier: Apache-2.0

// Package snapshot copies the newest records of an overwritable ring, whole and oldest
// first, into memory the caller provides: a backward perf ring (perf_event_open with
// write_backward, mapped read-only: Perf) and a BPF ring buffer in overwrite mode
// (BPF_F_RB_OVERWRITE, kernel 6.19: BPFRing). It is pure: it reads ring memory through
// the positions and the data area it is given, so the tests drive it with fake rings in Go
// memory, and it opens, maps and pauses nothing (internal/kernel does).
//
// # Consistency
//
// A snapshot never hands out a record that a producer tore. Each parser loads the
// positions, copies the records with atomic loads, then loads a position again and drops
// every record whose bytes a producer may have reused meanwhile (counted in
// Counts.Overwritten). What the check needs from the producer differs by kind, and each
// parser's comment says it: a perf ring's writers must be settled, paused before the copy
// or waited for after it (PerfOptions.Settle); a BPF ring buffer may go on being written,
// with the settle step on weakly ordered hosts.
//
// Why atomic loads for the copy: the check is a load that must not be performed before
// the copy's loads. Go's atomic loads are acquire loads (LDAR on arm64, plain MOVs on x86,
// whose loads are not reordered with each other): no later load passes them, so the
// position loaded after the copy is at least as new as anything the copy saw. A plain
// copy (memmove) followed by an atomic load gives no such order on arm64.
package snapshot

import (
	"encoding/binary"
	"fmt"
	"io"
	"math/bits"
	"os"
	"sync/atomic"
	"unsafe"
)

// Record is one record a snapshot copied.
type Record struct {
	// Pos is the ring position of the record's header, in the ring's free-running count
	// (a perf ring's data_head count, a ring buffer's producer count).
	Pos uint64
	// Type is the perf record type (PerfRecordSample, PerfRecordLost); 0 for a ring
	// buffer's records.
	Type uint32
	// Data is the record's payload, in the caller's buffer: a perf sample's raw data (as
	// padded by the kernel: see perfbuf.Record), a ring buffer record's bytes (exactly
	// the length the program reserved or output). Nil for a lost record.
	Data []byte
	// Lost is a PERF_RECORD_LOST's count of samples the kernel refused.
	Lost uint64
	// Time is a perf sample's time of output, with PerfOptions.Time; else 0.
	Time uint64

	size uint32 // the payload's bytes in the ring (perf: the whole record's)
	kind uint8  // a ring buffer walk's: kindRecord, kindBusy, kindDiscard
}

// Next is the ring position just after the record: a perf record's Pos plus its size, a
// ring buffer record's Pos plus its header and payload rounded up to 8 bytes.
func (r *Record) Next() uint64 {
	if r.Type != 0 {
		return r.Pos + uint64(r.size)
	}
	return r.Pos + (uint64(r.size)+bpfHdrSize+7)&^7
}

// The perf record types a snapshot returns (include/uapi/linux/perf_event.h).
const (
	PerfRecordLost   = 2 // PERF_RECORD_LOST
	PerfRecordSample = 9 // PERF_RECORD_SAMPLE
)

// Counts say what a snapshot left out, and why.
type Counts struct {
	// Busy: ring buffer records reserved and not yet committed when the snapshot walked
	// past them. Skipped: their bytes may not be written yet.
	Busy uint64
	// Discarded: ring buffer records their program discarded (bpf_ringbuf_discard).
	Discarded uint64
	// Overwritten: records the snapshot copied, then found that a producer may have
	// reused their bytes while it copied. Dropped, never handed out.
	Overwritten uint64
	// NoRoom: older records left out because the buffer was full with newer ones.
	NoRoom uint64
	// Other: perf records of other types than samples and lost records.
	Other uint64
	// Corrupt says the walk stopped at a record that cannot be valid (a size the kernel
	// cannot write, or one running past what was written); older records are unknown.
	Corrupt bool
	// Lapped says the producers rewrote the whole ring while the snapshot loaded its
	// positions: nothing could be read.
	Lapped bool
}

// Snapshot is what a parser returns: the records, oldest first, and what it left out.
type Snapshot struct {
	Records []Record
	// End is the position the snapshot read up to (a perf ring's data_head, a ring
	// buffer's producer_pos): passed as the next snapshot's From, that snapshot returns
	// only records written after this one.
	End uint64
	Counts
}

// ShortBufferError is returned when the newest record alone does not fit in the buffer.
// It wraps io.ErrShortBuffer.
type ShortBufferError struct {
	Need int // bytes the newest record needs
	Have int // bytes the buffer has
}

func (e *ShortBufferError) Error() string {
	return fmt.Sprintf("snapshot: newest record needs %d bytes, buffer has %d: %v", e.Need, e.Have, io.ErrShortBuffer)
}

// Unwrap returns io.ErrShortBuffer.
func (e *ShortBufferError) Unwrap() error { return io.ErrShortBuffer }

// errRing is wrapped by the errors of a ring the parsers cannot read at all.
var errRing = os.ErrInvalid

// checkData says what is wrong with a data area, or nil: its size must be a power of two
// of at least 8 bytes, and it must start 8-aligned (the parsers load 8-byte words).
func checkData(data []byte) error {
	n := len(data)
	if n < 8 || bits.OnesCount(uint(n)) != 1 {
		return fmt.Errorf("snapshot: data area of %d bytes is not a power of two >= 8: %w", n, errRing)
	}
	if uintptr(unsafe.Pointer(&data[0]))&7 != 0 {
		return fmt.Errorf("snapshot: data area not 8-byte aligned: %w", errRing)
	}
	return nil
}

// word loads the 8-byte word at off (8-aligned, inside data) atomically.
func word(data []byte, off uint64) uint64 {
	return atomic.LoadUint64((*uint64)(unsafe.Pointer(&data[off])))
}

// copyWords copies n bytes of ring data starting at ring offset off (8-aligned) into
// dst[:n], wrapping at the ring's end, with one atomic load per 8-byte word (see the
// package comment for why atomic). The ring's size is a multiple of 8, so a word never
// straddles its end; the last word may hold padding past n, which is not copied.
func copyWords(dst []byte, data []byte, off uint64, n int) {
	mask := uint64(len(data) - 1)
	var w [8]byte
	for i := 0; i < n; i += 8 {
		binary.NativeEndian.PutUint64(w[:], word(data, off))
		copy(dst[i:n], w[:])
		off = (off + 8) & mask
	}
}

// after reports whether free-running position a is after b (wrap-safe).
func after(a, b uint64) bool { return int64(a-b) > 0 }
