// SPDX-License-Identifier: Apache-2.0

package perfbuf

// What the rings deliver: Record, in place, and Sample, a copy.

import "fmt"

// RecordType classifies a delivered record.
type RecordType uint8

const (
	// RecordSample is a PERF_RECORD_SAMPLE: the output of bpf_perf_event_output.
	RecordSample RecordType = iota + 1
	// RecordLost is a PERF_RECORD_LOST: the kernel dropped samples because the ring was full.
	RecordLost
)

// String returns the record type's name.
func (t RecordType) String() string {
	switch t {
	case RecordSample:
		return "sample"
	case RecordLost:
		return "lost"
	}
	return fmt.Sprintf("RecordType(%d)", uint8(t))
}

// Record is one record of a ring, parsed in place. Records of other types than samples
// and lost records are never delivered: every way of reading skips them, counted in
// Stats.Other.
type Record struct {
	Type RecordType
	Ring int    // the ring's buffer index
	CPU  int    // the CPU whose ring holds the record
	Pos  uint64 // ring position where the record starts
	Next uint64 // ring position just after the record

	// Data and Wrapped hold a sample's payload, zero-copy. Data is the first part; Wrapped is
	// the part that continues at the start of the ring when the payload straddles the ring's
	// end, and is empty otherwise. Both are nil for lost records.
	//
	// Both alias ring memory: they are valid until data_tail is committed past Next (by
	// Commit, Drain or SkipCorrupt; a Reader and callback mode commit after the function
	// they called returns); after that the kernel may overwrite them. Copy what must outlive
	// that, for example with AppendTo.
	//
	// The kernel pads the payload so that the record stays 8-byte aligned: an n-byte
	// bpf_perf_event_output yields round_up(n+4, 8)-4 bytes, the last ones unspecified. The
	// payload must therefore carry its own length (or be of a fixed size).
	Data, Wrapped []byte

	Lost uint64 // number of samples lost, for RecordLost

	// Key and Late are set by a Reader with Options.Order: the key the sample was ordered
	// by, and whether it was delivered after a sample with a larger key.
	Key  uint64
	Late bool
}

// Len returns the payload length, len(Data)+len(Wrapped).
func (r *Record) Len() int {
	return len(r.Data) + len(r.Wrapped)
}

// AppendTo appends the payload to dst as one contiguous slice and returns the result. Pass
// buf[:0] to reuse a buffer: it does not allocate when cap(buf) >= r.Len().
func (r *Record) AppendTo(dst []byte) []byte {
	dst = append(dst, r.Data...)
	if len(r.Wrapped) > 0 {
		dst = append(dst, r.Wrapped...)
	}
	return dst
}

// Sample is a record as ReadInto and All deliver it: a copy of a sample, or a count of
// samples the kernel lost.
type Sample struct {
	Ring int
	CPU  int
	Type RecordType // RecordSample or RecordLost
	// Data is a copy of the payload (padded by the kernel: see Record). ReadInto reuses its
	// capacity.
	Data []byte
	Lost uint64 // for RecordLost
	// Key and Late are set with Options.Order: see Record.
	Key  uint64
	Late bool
}

// copySample fills s with rec, copying the payload into the memory s.Data already has when
// it is large enough. (Field by field: a composite literal is built on the stack and copied
// in wide loads that stall on the narrow stores before them.)
func copySample(s *Sample, rec *Record) {
	s.Data = rec.AppendTo(s.Data[:0])
	s.Ring, s.CPU, s.Type, s.Lost, s.Key, s.Late = rec.Ring, rec.CPU, rec.Type, rec.Lost, rec.Key, rec.Late
}
