// SPDX-License-Identifier: Apache-2.0

package ring

// Steps: a run of one ring's samples in place, which the caller's own loop
// steps through with no call a record (issue 49). Both kinds' loops set it
// up (Sink.Steps) over their plain samples and hand it out; every other
// record goes one at a time (StepOne). The step itself is the root
// package's Batch.Next, which holds these fields in their order: Go did
// not inline a method of this package's type into a program that imports
// only the root (issue 49, docs/performance.md).

import (
	"encoding/binary"
	"errors"
	"sync/atomic"
	"unsafe"
)

// Steps is a run of one ring's records, in place, in a format that one
// step serves for both kinds. A record is a u64 header h at its start and
// a u32 length n at LenOff; it takes size = (n + Pad) &^ 7 bytes, and the
// step takes it when size fits before End and (h ^ size<<HeaderSizeShift)
// & HMask == HType, h loaded in the host's byte order (steps_le.go,
// steps_be.go place the fields):
//   - a BPF ring buffer's: n is the header's len (LenOff 0; the busy and
//     discard bits make size too large), Pad is the 8-byte header plus 7,
//     and HMask keeps the busy and discard bits of h, which an acquire
//     load of h (pairing with the xchg of hdr->len in bpf_ringbuf_commit)
//     shows clear;
//   - a perf ring's: n is the u32 size of PERF_SAMPLE_RAW after the 8-byte
//     perf_event_header (LenOff 8), Pad is 12 plus 7, and HMask keeps h's
//     type and size: PERF_RECORD_SAMPLE, and the size the kernel wrote
//     equal to size (the kernel pads n so that 12+n is a multiple of 8).
//     The data was ordered by the acquire load of data_head that set End.
//
// The step reads h and n at Pos before it checks them against End, so the
// loop that sets a run keeps End where those reads stay in the ring's
// mapping and in what the producer published: 8 bytes (ring buffer) or 16
// (perf) before the head snapshot. Nothing read is trusted before it is
// checked against End.
type Steps struct {
	Base unsafe.Pointer // the ring's data area; Pos&Mask is an offset in it
	Mask uint64
	Pos  uint64 // the next record
	End  uint64 // the run's records end by here

	N   uint64 // the payload's length of the record the step took, which ends at Pos
	Acc uint64 // the step's count of the records it took: their number << 40 plus their N

	LenOff, DataOff uintptr
	Pad             uint64
	HMask, HType    uint64
	// KeyEnd, in an ordered run's Steps (keyed), is where each record's
	// u64 key ends in its payload, which Record sets as Key; 0 otherwise.
	KeyEnd uint64

	Rec   Record    // the run's fields, which the step's record takes
	One   *Record   // StepOne's record, if s is a run of it alone
	synth [4]uint64 // StepOne's header (never written: zero), which the step takes once
}

// AccShift is where Acc's count of records starts: below it, their bytes.
// A run spans at most maxRun bytes, so neither part overflows.
const AccShift = 40

// maxRun bounds a run's span: at most maxRun/8 records (2^24, the bits
// above AccShift) and maxRun bytes of payload (below 2^AccShift).
const maxRun = 1 << 27

// ErrNoRun is what a sink's Yield returns when the step does not take the
// run's first record: the loop takes that record the careful way.
var ErrNoRun = errors.New("ring: no run")

// The formats (see Steps).
const (
	stepsRingBufPad = bpfRingHdrSize + 7
	stepsPerfPad    = recSampleDataOff + 7
)

// ringBufRun sets s to a run of a ring buffer's samples from pos, each
// ending by end, in the data area at base (mapped twice, so that a record
// may run past its end and the step may read a header at end).
func (s *Steps) ringBufRun(base unsafe.Pointer, mask, pos, end uint64, index, cpu int) {
	s.Base, s.Mask, s.Pos, s.End = base, mask, pos, pos+min(end-pos, maxRun)
	s.ringBufFormat()
	s.sample(index, cpu)
}

// ringBufFormat sets the step's format to a ring buffer's (see Steps).
func (s *Steps) ringBufFormat() {
	s.LenOff, s.DataOff, s.Pad, s.HMask, s.HType, s.KeyEnd = 0, bpfRingHdrSize, stepsRingBufPad, stepsRingBufHMask, 0, 0
}

// perfRun sets s to a run of a perf ring's samples from pos, each ending by
// end, which lies 16 bytes or more before the ring's end: the step reads
// the header and the u32 after it at end, once the run is over.
func (s *Steps) perfRun(base unsafe.Pointer, mask, pos, end uint64, index, cpu int) {
	s.Base, s.Mask, s.Pos, s.End = base, mask, pos, pos+min(end-pos, maxRun)
	s.LenOff, s.DataOff, s.Pad, s.HMask, s.HType, s.KeyEnd = recHeaderSize, recSampleDataOff, stepsPerfPad, stepsPerfHMask, stepsPerfType, 0
	s.sample(index, cpu)
}

// keyed makes s, a run just set, the ordered run that sink k delivers
// (Sink.KeyEnd): it ends s before the first record that the step would
// not take, whose payload is shorter than KeyEnd, or whose key is not in
// [lo, hi] with lo the key before it (a run's keys rise). It reads each
// record's header, length and key once, where the step will read them
// again (within End, as the step does), so that the step needs no key
// check: one that did would not fit the inliner's budget in the root's
// Batch.Next. It reports whether the run has a record.
func (s *Steps) keyed(k *Sink) bool {
	pos, lo := s.Pos, k.Lo
	for {
		p := unsafe.Add(s.Base, pos&s.Mask)
		// The step's loads and checks (Batch.Next). Acquire, over a ring
		// buffer: pairs with the xchg of hdr->len in bpf_ringbuf_commit
		// (a busy bit clear here: the record written whole). A perf ring's
		// data was ordered by the acquire load of data_head that set End.
		h := atomic.LoadUint64((*uint64)(p))
		n := uint64(atomic.LoadUint32((*uint32)(unsafe.Add(p, s.LenOff))))
		size := (n + s.Pad) &^ 7
		if size > s.End-pos || (h^size<<HeaderSizeShift)&s.HMask != s.HType || n < k.KeyEnd || size > keyedMax {
			break
		}
		key := s.keyAt(p, k.KeyEnd)
		if key < lo || key > k.Hi {
			break
		}
		lo, pos = key, pos+size
	}
	s.End, s.KeyEnd = pos, k.KeyEnd
	return pos != s.Pos
}

// keyedMax is the largest record, in ring bytes, that an ordered run
// walks (keyed): a larger one goes alone, and after it the ring's loop
// tries no run until it took a small one. Over small records a run costs
// less than a batch of one a record; over records of 256 bytes and more
// the runs' walks, and the tries that found no run, cost more
// (docs/performance.md, "Ordered runs in Batches").
const keyedMax = 128

// tookSmall reports whether an ordered run may start at pos after r, the
// ring loop's record: unless r, taken alone, ends at pos and spans more
// than keyedMax bytes. (Read from r where the loop needs it, not kept in
// a variable the loop would store for every record.)
func (r *Record) tookSmall(pos uint64) bool {
	return r.Next != pos || r.Next-r.Pos <= keyedMax
}

// keyAt reads the key that ends at keyEnd in the payload of the record at
// p, in the host's byte order (a perf payload is 4 bytes off alignment).
func (s *Steps) keyAt(p unsafe.Pointer, keyEnd uint64) uint64 {
	return binary.NativeEndian.Uint64(unsafe.Slice((*byte)(unsafe.Add(p, s.DataOff+uintptr(keyEnd-8))), 8))
}

// lastKey is the key of the last record a keyed run's step took, which
// ends at Pos (N, its payload's length, set by the step).
func (s *Steps) lastKey() uint64 {
	return s.keyAt(unsafe.Add(s.Base, (s.Pos-(s.N+s.Pad)&^7)&s.Mask), s.KeyEnd)
}

// sample sets the run's fields of every record it returns (Rec's whole,
// only on another ring: a run is set many times a turn).
func (s *Steps) sample(index, cpu int) {
	if s.Rec.Ring != index || s.Rec.CPU != cpu || s.Rec.Type != Sample {
		s.Rec = Record{Type: Sample, Ring: index, CPU: cpu}
	}
	s.One, s.Acc = nil, 0
}

// StepOne makes s a run of rec alone, a record the ring's loop parsed the
// careful way: the step takes it once (a ring buffer's empty sample in
// synth), and One is rec itself, not a copy: rec is the loop's, which it
// reuses only once the caller moved on from s (the run's lifetime), as
// Each's function is given it. (A function, not a method: the root
// package's Batch holds a Steps, and users see no method of it.)
func StepOne(s *Steps, rec *Record) {
	s.One = rec
	s.Base, s.Mask, s.Pos, s.End = unsafe.Pointer(&s.synth), uint64(len(s.synth)*8-1), 0, bpfRingHdrSize
	s.ringBufFormat()
}

// tookRun moves the cursor past the samples a run's step took (to st.Pos)
// and counts them from st.Acc, for both kinds' loops, and returns how many.
func (c *Cursor) tookRun(st *Steps, s *Sink) int {
	samples := st.Acc >> AccShift
	c.counted, c.cursor = st.Pos, st.Pos
	c.counts.Samples += samples
	c.counts.Bytes += st.Acc & (1<<AccShift - 1)
	if samples > 0 && st.KeyEnd != 0 {
		s.Lo = st.lastKey() // (see Sink.Steps)
	}
	return int(samples)
}
