// SPDX-License-Identifier: Apache-2.0

package ring

// What a ring gives: a Record parsed in place, its counts, and the error of
// a record or position that cannot be valid. The root package re-exports
// Record, RecordType and CorruptError under its own names.

import (
	"encoding/binary"
	"errors"
	"fmt"
	"unsafe"
)

// RecordType classifies a delivered record.
type RecordType uint8

const (
	// Sample is a sample: the output of bpf_perf_event_output or a ring
	// buffer record (PERF_RECORD_SAMPLE).
	Sample RecordType = iota + 1
	// Lost is a count of samples the kernel dropped because a perf ring
	// was full (PERF_RECORD_LOST).
	Lost
)

// String returns "sample" or "lost".
func (t RecordType) String() string {
	switch t {
	case Sample:
		return "sample"
	case Lost:
		return "lost"
	}
	return fmt.Sprintf("RecordType(%d)", uint8(t))
}

// Record is one record of a ring, parsed in place: a sample (Data, Wrapped)
// or a count of lost samples (Lost). Records of other types are never
// delivered: every way of reading skips them, counted in Other.
type Record struct {
	Type RecordType
	Ring int    // the ring's buffer index
	CPU  int    // the CPU whose ring holds the record; -1 for a ring shared by CPUs
	Pos  uint64 // ring position where the record starts
	Next uint64 // ring position just after the record

	// Data and Wrapped hold a sample's payload, zero-copy. Wrapped is the
	// part that continues at the ring's start when the payload straddles
	// a perf ring's end, and is empty otherwise (always, for a ring
	// buffer). Both are nil for lost records.
	//
	// Both alias ring memory: they are valid until the consumer position
	// is committed past Next; after that the kernel may overwrite them.
	// Copy what must outlive that, for example with AppendTo.
	//
	// A perf ring pads the payload so that records stay 8-byte aligned: an
	// n-byte bpf_perf_event_output yields round_up(n+4, 8)-4 bytes, the
	// last ones unspecified. The payload must carry its own length (or be
	// of a fixed size).
	Data, Wrapped []byte

	Lost uint64 // samples lost, for a Lost record

	// Key and Late are set by an ordered reader: the key the sample was
	// ordered by, and whether it came after a sample with a larger key. A
	// Recorder's perf samples carry in Key their time of output on
	// CLOCK_MONOTONIC, which policy.MergeByKey merges a snapshot by.
	Key  uint64
	Late bool
}

// Len returns the payload's length, len(Data)+len(Wrapped).
func (r *Record) Len() int { return len(r.Data) + len(r.Wrapped) }

// AppendTo appends the payload to dst as one slice and returns the result;
// it does not allocate when cap(dst)-len(dst) >= r.Len().
func (r *Record) AppendTo(dst []byte) []byte {
	dst = append(dst, r.Data...)
	if len(r.Wrapped) > 0 {
		dst = append(dst, r.Wrapped...)
	}
	return dst
}

// Copy is a record copied out of the ring: the root package's Sample.
type Copy struct {
	Ring int
	CPU  int
	Type RecordType // Sample or Lost
	// Data is a copy of the payload (padded as Record's); a copy into a
	// Copy reuses its capacity.
	Data []byte
	Lost uint64 // for a Lost record
	// Key and Late are set by an ordered reader: see Record.
	Key  uint64
	Late bool
}

// SetCopy fills c with rec, copying the payload into the memory c.Data
// already has when it is large enough. (Field by field: a composite literal
// is built on the stack and copied in wide loads that stall on the narrow
// stores before them. A function, not a method: the root package's Sample
// is a Copy, and gains no method.)
func SetCopy(c *Copy, rec *Record) {
	if len(rec.Wrapped) == 0 {
		c.Data = CopyData(c.Data, rec.Data)
	} else {
		c.Data = rec.AppendTo(c.Data[:0])
	}
	c.Ring, c.CPU, c.Type, c.Lost, c.Key, c.Late = rec.Ring, rec.CPU, rec.Type, rec.Lost, rec.Key, rec.Late
}

// Sink is where a ring's loop (Ring.Each) puts the records when it is not
// a function of the caller's: copies into a batch (Into), or a plain
// sample's payload handed to a libbpf-style sample function (Sample). The
// loop does it in line, with no call a record but Sample's: a function per
// record is one more call, and a Go call spills every register the loop
// keeps (issue 31). One of Into and Sample is set, or neither: then the
// loop's function gets every record, and the sink only bounds a run.
type Sink struct {
	// Into receives copies, from Into[N] on; the loop stops after the copy
	// that fills it or brings Room to 0 or below.
	Into []Copy
	N    int // copies made
	Room int // payload bytes still to copy: at least one record is

	// Sample receives each sample whose payload is one piece, with the
	// ring's CPU; the loop's function gets every other record (lost
	// records, a payload that straddles a perf ring's end).
	Sample func(cpu int, data []byte)

	// KeyEnd, when not 0, makes the loop a run of an ordered merge
	// (internal/policy's ordered_run.go): it delivers a sample in one
	// piece whose u64 key (host byte order) ends at KeyEnd in the payload
	// and lies in [Lo, Hi], with Record.Key (Copy.Key) set and Lo raised
	// to it, and stops at any other record, leaving the cursor on it.
	KeyEnd uint64
	Lo, Hi uint64

	// Steps, when set, takes the loop's plain samples a run at a time
	// (with KeyEnd, those the ordered run delivers, keys in line: Steps'
	// keyed): the loop sets Steps over them and calls Yield, whose
	// caller steps through them in place (the root's Batch.Next), then
	// moves its cursor past the samples taken and counts them. A Yield
	// that returns ErrNoRun took nothing: the step does not take the run's
	// first record, which the loop then takes the careful way. The loop's
	// function (not nil) gets every record that is not in a run: the last
	// before the head snapshot among them, since the step reads the header
	// at the run's end. Yield's other errors end the loop, as fn's do.
	// After a keyed run, Lo is the key of the last sample the step took.
	Steps *Steps
	Yield func(*Steps) error
}

// stepping reports whether the loop hands its plain samples out as Steps.
func (s *Sink) stepping() bool { return s != nil && s.Steps != nil }

// yield hands run st, just set, to Yield, unless it is an ordered run
// whose first record the run may not take (Steps.keyed): ErrNoRun, and
// the loop takes that record its own way.
func (s *Sink) yield(st *Steps) error {
	if s.inRun() && !st.keyed(s) {
		return ErrNoRun
	}
	return s.Yield(st)
}

// runKey returns the key of a plain sample's payload data in a run (KeyEnd
// not 0) and whether the run delivers it. In line in both kinds' loops.
func (s *Sink) runKey(data []byte) (uint64, bool) {
	if uint64(len(data)) < s.KeyEnd {
		return 0, false // too short to hold the key: the merge takes it
	}
	key := binary.NativeEndian.Uint64(data[s.KeyEnd-8:])
	return key, key >= s.Lo && key <= s.Hi
}

// inRun reports whether the loop is a run of an ordered merge (KeyEnd set).
func (s *Sink) inRun() bool { return s != nil && s.KeyEnd != 0 }

// takesAll reports whether the loop's function gets every record: no sink,
// or one that only bounds a run.
func (s *Sink) takesAll() bool { return s == nil || s.Into == nil && s.Sample == nil }

// Full reports whether the loop stopped because Into is full, or Room
// used up.
func (s *Sink) Full() bool { return s != nil && s.Into != nil && (s.N == len(s.Into) || s.Room <= 0) }

// setPlain sets c's fields, but Data, for a plain sample (one piece) of
// ring index's CPU cpu: with CopyData, the copy of the kinds' fast loops
// and of their NextCopy. (Two calls, both inlined: one function would be
// over the inliner's budget, and a call in a ring's loop spills every
// register the loop keeps.)
func (c *Copy) setPlain(index, cpu int) {
	c.Ring, c.CPU, c.Type, c.Lost, c.Key, c.Late = index, cpu, Sample, 0, 0, false
}

// CopyData returns dst holding a copy of src, in dst's memory when it is
// large enough (else in memory appended). A payload of 16 to 64 bytes is
// copied in line (copySmall): a call to memmove spills the caller's
// registers, and cost ReadBatch and ReadInto 2-3 ns a 16- or 64-byte
// record (issue 31). Anything else goes to memmove. Inlined: its cost is
// the inliner's budget, which the case of 8 to 15 bytes too would exceed.
func CopyData(dst, src []byte) []byte {
	n := len(src)
	if uint(n-16) > smallCopy-16 || cap(dst) < n {
		return append(dst[:0], src...)
	}
	copySmall(unsafe.Pointer(unsafe.SliceData(dst)), unsafe.Pointer(unsafe.SliceData(src)), uintptr(n))
	return dst[:n]
}

// smallCopy is the largest payload CopyData copies in line.
const smallCopy = 64

// copySmall copies n bytes, 16 <= n <= 64, from src to dst in two or four
// 16-byte moves: the first 16 bytes and the last 16, then, past 32, the
// next 16 and the 16 before the last (each pair overlapping when n is
// short of filling it). It reads and writes nothing outside the n bytes.
// (A loop of 16-byte moves was slower at 16 B and no faster at 64.)
func copySmall(dst, src unsafe.Pointer, n uintptr) {
	*(*[16]byte)(dst) = *(*[16]byte)(src)
	*(*[16]byte)(unsafe.Add(dst, n-16)) = *(*[16]byte)(unsafe.Add(src, n-16))
	if n > 32 {
		*(*[16]byte)(unsafe.Add(dst, 16)) = *(*[16]byte)(unsafe.Add(src, 16))
		*(*[16]byte)(unsafe.Add(dst, n-32)) = *(*[16]byte)(unsafe.Add(src, n-32))
	}
}

// Took counts a copy of n payload bytes made into Into[N], and reports
// whether Into is full after it: for the loops' copies, and a policy's
// function that copies (ReadBatch over an ordered policy).
func (s *Sink) Took(n int) bool {
	s.N++
	s.Room -= n
	return s.N == len(s.Into) || s.Room <= 0
}

// put delivers rec, not a plain sample of the kind's fast loop, to the
// sink, or to fn when the sink takes no such record. It returns fn's error,
// and whether the loop stops after it (Into full).
func (s *Sink) put(rec *Record, fn func(*Record) error) (stop bool, err error) {
	switch {
	case s == nil || s.Into == nil && (s.Sample == nil || rec.Type != Sample || len(rec.Wrapped) > 0):
		return false, fn(rec)
	case s.Into != nil:
		SetCopy(&s.Into[s.N], rec)
		return s.Took(rec.Len()), nil
	}
	s.Sample(rec.CPU, rec.Data)
	return false, nil
}

// Counts is what a ring parsed, each record counted once, the first time it
// is parsed.
type Counts struct {
	Samples      uint64 // samples parsed
	Bytes        uint64 // their payload bytes
	Lost         uint64 // samples lost records report (perf rings)
	Other        uint64 // records of other types, skipped (perf rings)
	Discarded    uint64 // records the program discarded, skipped (ring buffers)
	Corrupt      uint64 // corruptions got past (SkipCorrupt)
	CorruptBytes uint64 // bytes skipped past them
	MaxFill      int    // the most bytes a snapshot saw waiting
}

// ErrCorrupt is what every *CorruptError matches.
var ErrCorrupt = errors.New("corrupt ring record")

// CorruptError describes a ring record, or ring position, that cannot be
// valid.
type CorruptError struct {
	Ring   int    // the ring's buffer index
	CPU    int    // the ring's CPU, -1 for a ring shared by CPUs
	Pos    uint64 // the ring position of the bad record (the cursor), or the consumer position
	Size   uint64 // the record's size, or the bad producer position
	Reason string // what is wrong
}

// Error formats the error as "read ring 0 (cpu 1) at 4096: record size 0:
// corrupt ring record", or "read ring 2 at ..." for a ring shared by CPUs.
func (e *CorruptError) Error() string {
	if e.CPU < 0 {
		return fmt.Sprintf("read ring %d at %d: %s: %v", e.Ring, e.Pos, e.Reason, ErrCorrupt)
	}
	return fmt.Sprintf("read ring %d (cpu %d) at %d: %s: %v", e.Ring, e.CPU, e.Pos, e.Reason, ErrCorrupt)
}

// Unwrap returns ErrCorrupt.
func (e *CorruptError) Unwrap() error { return ErrCorrupt }

// PerfSampleSize is the space a perf sample of n bytes takes in a perf
// ring: the 8-byte perf_event_header, the u32 raw size, and the data padded
// to 8 bytes.
func PerfSampleSize(n int) int { return recHeaderSize + (n+4+7)&^7 }

// PerfSampleDataOff is where a perf sample's payload starts in its record.
const PerfSampleDataOff = recSampleDataOff

// PerfLostSize is the space a perf ring's lost record takes.
const PerfLostSize = recLostSize

// RingBufRecordSize is the space a record of n bytes takes in a ring
// buffer: its 8-byte header, the data, rounded up to 8 bytes.
func RingBufRecordSize(n uint64) uint64 { return (n + bpfRingHdrRound) &^ 7 }
