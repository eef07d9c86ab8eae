// SPDX-License-Identifier: Apache-2.0

package perfbuf

// What the rings deliver: Record, in place, and Sample, a copy.

import "github.com/perfbuf/perfbuf/internal/ring"

// RecordType classifies a delivered record: [RecordSample] or [RecordLost].
type RecordType = ring.RecordType

const (
	// RecordSample is a sample: the output of bpf_perf_event_output, or a
	// ring buffer's record.
	RecordSample = ring.Sample
	// RecordLost is a count of samples a full perf ring dropped.
	RecordLost = ring.Lost
)

// Record is one record of a ring, parsed in place (zero-copy). Its fields:
//
//	Type       RecordSample or RecordLost
//	Ring, CPU  the ring's buffer index and CPU (-1 for a ring shared by CPUs)
//	Pos, Next  the ring positions where it starts and just after it
//	Data       the sample's payload; Wrapped, its part at the ring's start
//	           when it straddles a perf ring's end (empty otherwise)
//	Lost       the samples lost, for RecordLost
//	Key, Late  with Order: the sample's key, and whether it came late
//
// Data and Wrapped alias ring memory: they are valid until the ring is
// committed past Next (a Reader and callback mode commit after the function
// they called returns). Copy what you keep, with Len and AppendTo. A perf
// ring pads a payload so that records stay 8-byte aligned (an n-byte
// bpf_perf_event_output yields round_up(n+4, 8)-4 bytes): a payload must
// carry its own length.
type Record = ring.Record

// Sample is a copy of a record, as ReadInto, ReadBatch and All deliver it.
//
//	Ring, CPU  as Record's
//	Type       RecordSample or RecordLost
//	Data       a copy of the payload (padded as Record's); ReadInto and
//	           ReadBatch reuse its capacity
//	Lost       the samples lost, for RecordLost
//	Key, Late  with Order: see Record
type Sample = ring.Copy

// copySample fills s with rec, copying the payload into the memory s.Data
// already has when it is large enough.
func copySample(s *Sample, rec *Record) { ring.SetCopy(s, rec) }
