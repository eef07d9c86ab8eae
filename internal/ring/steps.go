// SPDX-License-Identifier: Apache-2.0

package ring

// Steps: a run of one ring's samples in place, which the caller's own loop
// steps through with no call a record (issue 49). Both kinds' loops set it
// up (Sink.Steps) over their plain samples and hand it out; every other
// record goes one at a time (StepOne).

import (
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Steps is a run of one ring's samples, in place: Next takes the next one,
// Record returns it. Next is inlined into the caller's loop: it checks a
// sample's header in line and stops at any record it does not take (a
// record of another type, one still busy or discarded, one that does not
// end by the run's end), which the ring's loop then parses the careful way.
// Nothing read from the ring is trusted before it is checked against the
// run's bounds, which the ring's loop set within the memory it maps.
//
// One Next for both kinds: a record is a u64 header at its start h and a
// u32 length n at lenOff; it takes size = (n + pad) &^ 7 bytes, and is a
// sample the run takes when size fits before end and (h ^ size<<48) &
// hmask == htype:
//   - a BPF ring buffer's: n is the header's len (lenOff 0, the busy and
//     discard bits make size too large), pad is the 8-byte header plus 7,
//     and hmask keeps the busy and discard bits of h, which the acquire
//     load of h shows clear;
//   - a perf ring's: n is the u32 size of PERF_SAMPLE_RAW after the 8-byte
//     perf_event_header (lenOff 8), pad is 12 plus 7, and hmask keeps h's
//     type and size: PERF_RECORD_SAMPLE, and the size the kernel wrote
//     equal to size (the kernel pads n so that 12+n is a multiple of 8).
type Steps struct {
	base     unsafe.Pointer // the ring's data area; pos&mask is an offset in it
	mask     uint64
	pos, end uint64         // the next record, and where the run's records must end by
	cur      unsafe.Pointer // the record Next took
	n        uint64         // its payload's length

	lenOff       uintptr
	dataOff      uintptr
	pad          uint64
	hmask, htype uint64

	rec   Record    // what Record returns: the run's fields, and Data set by Record
	one   bool      // rec is StepOne's record, returned as it is
	synth [4]uint64 // StepOne's header, which Next takes once
}

// Next moves to the run's next record and reports whether there is one.
// (Its cost is at the inliner's budget: checked by TestStepsInline.)
func (s *Steps) Next() bool {
	pos := s.pos
	p := unsafe.Add(s.base, pos&s.mask)
	// Acquire, over a ring buffer: pairs with the xchg of hdr->len in
	// bpf_ringbuf_commit, so that a record whose busy bit is clear here
	// was written whole. A perf ring's data was ordered by the acquire
	// load of data_head that set the run's end.
	h := atomic.LoadUint64((*uint64)(p))
	n := uint64(*(*uint32)(unsafe.Add(p, s.lenOff)))
	size := (n + s.pad) &^ 7
	if size > s.end-pos || (h^size<<48)&s.hmask != s.htype {
		return false
	}
	s.cur, s.n = p, n
	s.pos += size
	return true
}

// Record returns the record Next took: valid until the next Next, its Data
// until the ring is committed past it, which happens once the caller has
// moved on from the run.
func (s *Steps) Record() *Record {
	if !s.one {
		s.rec.Data = unsafe.Slice((*byte)(unsafe.Add(s.cur, s.dataOff)), s.n)
		s.rec.Pos, s.rec.Next = s.pos-(s.n+s.pad)&^7, s.pos
	}
	return &s.rec
}

// The formats (see Steps).
const (
	stepsRingBufPad   = bpfRingHdrSize + 7
	stepsRingBufHMask = bpfRingBusyBit | bpfRingDiscardBit
	stepsPerfPad      = recSampleDataOff + 7
	stepsPerfHMask    = 0xffff_0000_ffff_ffff // perf_event_header's type and size
)

// ringBufRun sets s to a run of a ring buffer's samples from pos, each
// ending by end, in the data area at base (mapped twice, so that a record
// may run past its end), for the ring's index and cpu.
func (s *Steps) ringBufRun(base unsafe.Pointer, mask, pos, end uint64, index, cpu int) {
	s.base, s.mask, s.pos, s.end = base, mask, pos, end
	s.lenOff, s.dataOff, s.pad, s.hmask, s.htype = 0, bpfRingHdrSize, stepsRingBufPad, stepsRingBufHMask, 0
	s.sample(index, cpu)
}

// perfRun sets s to a run of a perf ring's samples from pos, each ending by
// end, which must lie 16 bytes or more before the ring's end: Next reads
// the header and the u32 after it at end, when the run is over.
func (s *Steps) perfRun(base unsafe.Pointer, mask, pos, end uint64, index, cpu int) {
	s.base, s.mask, s.pos, s.end = base, mask, pos, end
	s.lenOff, s.dataOff, s.pad, s.hmask, s.htype = recHeaderSize, recSampleDataOff, stepsPerfPad, stepsPerfHMask, unix.PERF_RECORD_SAMPLE
	s.sample(index, cpu)
}

// sample sets the run's fields of every record it returns.
func (s *Steps) sample(index, cpu int) {
	s.one = false
	s.rec = Record{Type: Sample, Ring: index, CPU: cpu}
}

// StepOne makes s a run of rec alone, a record the ring's loop parsed the
// careful way: Next takes it once (a ring buffer's empty sample in synth),
// and Record returns a copy of rec. (A function, not a method: the root
// package's Batch is a Steps, and gains no method.)
func StepOne(s *Steps, rec *Record) {
	s.rec, s.one = *rec, true
	s.synth = [4]uint64{}
	s.base, s.mask, s.pos, s.end = unsafe.Pointer(&s.synth), uint64(len(s.synth)*8-1), 0, bpfRingHdrSize
	s.lenOff, s.dataOff, s.pad, s.hmask, s.htype = 0, bpfRingHdrSize, stepsRingBufPad, stepsRingBufHMask, 0
}

// taken returns the samples Next took from position from on, and their
// payload bytes, for the ring's counts: the records read again, in the
// caller's cache now. It reads what Next checked; ring memory rewritten
// meanwhile (no kernel does) can make the counts wrong, never the reads.
func (s *Steps) taken(from uint64) (samples, bytes uint64) {
	for pos := from; int64(s.pos-pos) > 0; {
		n := uint64(*(*uint32)(unsafe.Add(s.base, uintptr(pos&s.mask)+s.lenOff)))
		samples++
		bytes += n
		pos += (n + s.pad) &^ 7 // at least 8
	}
	return samples, bytes
}

// first reports whether Next takes the run's first record, and leaves the
// run as it was: a loop hands out no empty run.
func (s *Steps) first() bool {
	pos := s.pos
	ok := s.Next()
	s.pos = pos
	return ok
}
