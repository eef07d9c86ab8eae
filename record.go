// SPDX-License-Identifier: Apache-2.0

package perfbuf

// What the rings deliver: Record, in place, and Sample, a copy; and
// Order.Sort, which orders records read without an Order.

import (
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
	s ring.Steps
}

// Next moves to the batch's next record and reports whether there is one.
// It is inlined into the caller's loop: it checks the record's header in
// line, and ends the batch at any record it does not take, which comes
// in a batch of its own. (Its cost is at the inliner's budget: checked
// by TestBatchInline.)
func (b *Batch) Next() bool {
	s := &b.s
	pos := s.Pos
	p := unsafe.Add(s.Base, pos&s.Mask)
	// Acquire, over a ring buffer: pairs with the xchg of hdr->len in
	// bpf_ringbuf_commit, so that a record whose busy bit is clear here
	// was written whole. A perf ring's data was ordered by the acquire
	// load of data_head that set s.End (ring.Steps says the format).
	h := atomic.LoadUint64((*uint64)(p))
	n := uint64(*(*uint32)(unsafe.Add(p, s.LenOff)))
	size := (n + s.Pad) &^ 7
	if size > s.End-pos || (h^size<<48)&s.HMask != s.HType {
		return false
	}
	s.N = n
	s.Pos += size
	return true
}

// Record returns the record Next moved to: valid until the next Next, its
// Data until the loop moves on from the batch.
func (b *Batch) Record() *Record {
	s := &b.s
	if !s.One {
		pos := s.Pos - (s.N+s.Pad)&^7
		s.Rec.Data = unsafe.Slice((*byte)(unsafe.Add(s.Base, uintptr(pos&s.Mask)+s.DataOff)), s.N)
		s.Rec.Pos, s.Rec.Next = pos, s.Pos
	}
	return &s.Rec
}

// first reports whether Next takes the batch's first record, and leaves
// the batch as it was: Batches yields no empty batch.
func (b *Batch) first() bool {
	pos := b.s.Pos
	ok := b.Next()
	b.s.Pos = pos
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
