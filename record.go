// SPDX-License-Identifier: Apache-2.0

package perfbuf

// What the rings deliver: Record, in place, and Sample, a copy; and
// Order.Sort, which orders records read without an Order.

import (
	"encoding/binary"
	"sync/atomic"
	"unsafe"

	"github.com/perfbuf/perfbuf/internal/policy"
	"github.com/perfbuf/perfbuf/internal/ring"
)

// RecordType classifies a delivered record: [RecordSample] or [RecordLost].
type RecordType = ring.RecordType

const (
	// RecordSample is a sample: the output of bpf_perf_event_output, or a
	// ring buffer's record.
	RecordSample = ring.Sample
	// RecordLost is a count of samples a full perf ring dropped.
	RecordLost = ring.Lost
)

// Record is one record of a ring, in place: its Type, Ring and CPU (-1
// for a ring shared by CPUs), Pos and Next (its ring positions), Data (the
// payload; Wrapped, its part at a perf ring's start when it straddles the
// end), Lost (for RecordLost), Key and Late (with [Order]; a Recorder's
// perf sample: the bpf_ktime_get_ns time of its output). Data and
// Wrapped are valid until the ring is committed past Next: copy what you
// keep (Len, AppendTo). A perf ring pads payloads to 8 bytes minus 4.
type Record = ring.Record

// Batch is a batch of records in place, as [Reader.Batches] yields them.
type Batch struct {
	// The fields of ring.Steps, in its order (TestBatchLayout): the ring's
	// loop sets a run in a Batch through a *ring.Steps, and Next, the
	// step, reads them here, one selector each, within the inliner's
	// budget. ring.Steps says what they hold.
	base             unsafe.Pointer
	mask, pos, end   uint64
	n, acc           uint64
	lenOff, dataOff  uintptr
	pad, hmask, htyp uint64
	keyEnd           uint64
	rec              Record
	one              *Record
	synth            [4]uint64
}

// steps returns b as the ring's loop sets it: the same memory (Go's
// unsafe.Pointer rule 1: a *T1 to a *T2 of equivalent layout).
func (b *Batch) steps() *ring.Steps { return (*ring.Steps)(unsafe.Pointer(b)) }

// Next moves to the batch's next record and reports whether there is one.
// The compiler inlines it into the caller's loop.
func (b *Batch) Next() bool {
	// It checks the record's header in line and ends the batch at any
	// record it does not take, which then comes in a batch of its own.
	// Its cost is near the inliner's budget, 80 (TestBatchInline).
	p := unsafe.Add(b.base, b.pos&b.mask)
	// Acquire, over a ring buffer: pairs with the xchg of hdr->len in
	// bpf_ringbuf_commit, so that a record whose busy bit is clear here
	// was written whole. A perf ring's data was ordered by the acquire
	// load of data_head that set end.
	h := atomic.LoadUint64((*uint64)(p))
	n := uint64(atomic.LoadUint32((*uint32)(unsafe.Add(p, b.lenOff)))) // (a ring buffer's: h's low half)
	size := (n + b.pad) &^ 7
	if size > b.end-b.pos || (h^size<<ring.HeaderSizeShift)&b.hmask != b.htyp {
		return false
	}
	b.n = n
	b.pos += size
	b.acc += n + 1<<ring.AccShift // the ring's counts
	return true
}

// Record returns the record Next moved to: valid until the next Next, its
// Data until the loop moves on from the batch.
func (b *Batch) Record() *Record {
	if b.one != nil {
		return b.one
	}
	pos := b.pos - (b.n+b.pad)&^7
	p := unsafe.Add(b.base, uintptr(pos&b.mask)+b.dataOff)
	b.rec.Data = unsafe.Slice((*byte)(p), b.n)
	b.rec.Pos, b.rec.Next = pos, b.pos
	if b.keyEnd != 0 { // an ordered run's: the step took only payloads that hold the key
		b.rec.Key = binary.NativeEndian.Uint64(unsafe.Slice((*byte)(unsafe.Add(p, b.keyEnd-8)), 8))
	}
	return &b.rec
}

// first reports whether Next takes the batch's first record, and leaves
// the batch as it was: Batches yields no empty batch.
func (b *Batch) first() bool {
	pos, acc := b.pos, b.acc
	ok := b.Next()
	b.pos, b.acc = pos, acc
	return ok
}

// Sample is a copy of a record, as ReadInto and ReadBatch deliver it: its
// fields are Record's but for Pos, Next and Wrapped, and Data's memory is
// reused by the next read into it.
type Sample = ring.Copy

// copySample fills s with rec, copying the payload into the memory s.Data
// already has when it is large enough.
func copySample(s *Sample, rec *Record) { ring.SetCopy(s, rec) }

// Sort puts recs in nondecreasing order of the key at KeyOffset and sets
// each sample's Key to it, for records read without an order: a
// [Recorder.Snapshot] of ring buffers, which come ring after ring. Equal
// keys keep their order; a lost record keeps its place before the next
// record of its ring (else after its last). Sort uses KeyOffset alone; a
// sample too short to hold the key has key 0. It costs O(n log rings)
// where each ring's keys mostly rise, O(n log n) at worst.
func (ord Order) Sort(recs []Record) error {
	if err := ord.checkKeyOffset(); err != nil {
		return wrap("sort", err)
	}
	policy.SortByKey(recs, ord.KeyOffset)
	return nil
}
