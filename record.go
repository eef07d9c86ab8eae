// SPDX-License-Identifier: Apache-2.0

package perfbuf

// What the rings deliver: Record, in place, and Sample, a copy; and
// Order.Sort, which orders records read without an Order.

import (
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

// Batch is a batch of records in place, as [Reader.Batches] yields them:
// Next moves to its next record and reports whether there is one; Record
// returns that record, valid as Batches says.
type Batch = ring.Steps

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
