// SPDX-License-Identifier: Apache-2.0

// Package ringtest holds fake rings for tests: memory written as the kernel
// writes it, with producers that follow the kernel's protocol, for the ring
// kinds' tests and the readers' above them. It imports nothing of perfbuf's.
package ringtest

import (
	"encoding/binary"
	"sync/atomic"
	"testing"
	"unsafe"
)

// The record header's bits (include/uapi/linux/bpf.h).
const (
	BusyBit    = 1 << 31 // BPF_RINGBUF_BUSY_BIT
	DiscardBit = 1 << 30 // BPF_RINGBUF_DISCARD_BIT
)

// RingBuf is a BPF ring buffer in Go memory with a producer that follows the
// kernel's protocol (kernel/bpf/ringbuf.c): __bpf_ringbuf_reserve checks the
// space against consumer_pos, writes a busy header and publishes producer_pos
// with a release store; bpf_ringbuf_commit clears the busy bit with an atomic
// exchange and wakes the reader only when consumer_pos equals the record's
// position. The data area is twice the ring's size, its halves kept equal, as
// the kernel's double mapping keeps them.
type RingBuf struct {
	Pos  *[2]uint64 // consumer_pos, producer_pos
	Data []byte     // 2*Size bytes, 8-aligned
	Size uint64
	Prod uint64 // the producer's producer_pos (kernel: rb->producer_pos, under rb->spinlock)

	Wakes  atomic.Int64 // wakeups raised (commits that found consumer_pos at their record)
	OnWake func()       // called for each wakeup, if set
}

// NewRingBuf returns an empty ring buffer of size bytes, a power of two.
func NewRingBuf(size int) *RingBuf {
	mem := make([]uint64, size/4) // 2*size bytes, 8-aligned
	return &RingBuf{
		Pos:  new([2]uint64),
		Data: unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(mem))), 2*size),
		Size: uint64(size),
	}
}

// NewRingBufAt starts the ring at position pos (consumer_pos = producer_pos = pos).
func NewRingBufAt(size int, pos uint64) *RingBuf {
	f := NewRingBuf(size)
	f.Pos[0], f.Pos[1], f.Prod = pos, pos, pos
	return f
}

// Put writes p at ring position pos, in both copies of the area.
func (f *RingBuf) Put(pos uint64, p []byte) {
	off := pos & (f.Size - 1)
	n := copy(f.Data[off:f.Size], p)
	copy(f.Data[off+f.Size:], p[:n])
	copy(f.Data, p[n:])
	copy(f.Data[f.Size:], p[n:])
}

// Reserve is __bpf_ringbuf_reserve: room for an n-byte sample, its header
// busy. It returns the record's position, or false when the ring has no room.
func (f *RingBuf) Reserve(n int) (uint64, bool) {
	size := (uint64(n) + 15) &^ 7
	// Pairs with the reader's store of consumer_pos (kernel: smp_load_acquire).
	cons := atomic.LoadUint64(&f.Pos[0])
	if f.Prod+size-cons > f.Size-1 {
		return 0, false
	}
	pos := f.Prod
	f.Put(pos, binary.NativeEndian.AppendUint32(nil, uint32(n)|BusyBit))
	f.Put(pos+4, make([]byte, 4)) // pg_off
	f.Prod += size
	// Release, as the kernel's smp_store_release(&rb->producer_pos).
	atomic.StoreUint64(&f.Pos[1], f.Prod)
	return pos, true
}

// Write writes a reserved record's sample (no header).
func (f *RingBuf) Write(pos uint64, payload []byte) { f.Put(pos+8, payload) }

// Commit is bpf_ringbuf_commit (discard: bpf_ringbuf_discard) with no flags:
// it clears the busy bit with an atomic exchange, then wakes the reader if
// consumer_pos is at the record.
func (f *RingBuf) Commit(pos uint64, discard bool) {
	off := f.clearBusy(pos, discard)
	// Kernel: cons_pos = smp_load_acquire(&rb->consumer_pos) & rb->mask; wake if == rec_pos.
	if atomic.LoadUint64(&f.Pos[0])&(f.Size-1) == off {
		f.Wakes.Add(1)
		if f.OnWake != nil {
			f.OnWake()
		}
	}
}

// CommitForce is bpf_ringbuf_commit with BPF_RB_FORCE_WAKEUP: it clears the
// busy bit and wakes the reader wherever consumer_pos is.
func (f *RingBuf) CommitForce(pos uint64) {
	f.clearBusy(pos, false)
	f.Wakes.Add(1)
	if f.OnWake != nil {
		f.OnWake()
	}
}

// CommitMissed clears a reserved record's busy bit as bpf_ringbuf_commit
// does, and raises no wakeup: a commit whose look at consumer_pos came before
// the reader stored it up to the record.
func (f *RingBuf) CommitMissed(pos uint64) { f.clearBusy(pos, false) }

// clearBusy clears the busy bit of the record at pos (discard: sets the
// discard bit) and returns its offset.
func (f *RingBuf) clearBusy(pos uint64, discard bool) uint64 {
	off := pos & (f.Size - 1)
	p := (*uint32)(unsafe.Pointer(&f.Data[off]))
	hdr := atomic.LoadUint32(p) &^ BusyBit // only the producer writes a busy header
	if discard {
		hdr |= DiscardBit
	}
	// The second copy first (never read as a header, but the reader may free
	// the space as soon as it sees the first).
	binary.NativeEndian.PutUint32(f.Data[off+f.Size:], hdr)
	// Go's atomic store is sequentially consistent: the kernel's xchg (a
	// full barrier).
	atomic.StoreUint32(p, hdr)
	return off
}

// Output is bpf_ringbuf_output: reserve, write, commit.
func (f *RingBuf) Output(t testing.TB, payload []byte) uint64 {
	t.Helper()
	pos, ok := f.Reserve(len(payload))
	if !ok {
		t.Fatalf("no room for a %d-byte sample", len(payload))
	}
	f.Write(pos, payload)
	f.Commit(pos, false)
	return pos
}
