// SPDX-License-Identifier: Apache-2.0

package snapshot

import (
	"encoding/binary"
	"sync/atomic"
	"testing"
	"unsafe"
)

// ringData returns a data area of size bytes, 8-byte aligned (it is a []uint64's memory).
func ringData(size int) []byte {
	words := make([]uint64, size/8)
	return unsafe.Slice((*byte)(unsafe.Pointer(&words[0])), size)
}

// storeWords writes rec (a multiple of 8 bytes) into data at ring offset off, wrapping,
// with atomic word stores, as the kernel's writes look to the parsers' atomic loads.
func storeWords(data []byte, off uint64, rec []byte) {
	mask := uint64(len(data) - 1)
	for i := 0; i < len(rec); i += 8 {
		atomic.StoreUint64((*uint64)(unsafe.Pointer(&data[off&mask])), binary.NativeEndian.Uint64(rec[i:]))
		off += 8
	}
}

// payload returns n bytes (at least 9, at most 255) that carry seq and n: seq in the
// first 8, n in the ninth, then byte i = i*7 + seq.
func payload(seq uint64, n int) []byte {
	p := make([]byte, n)
	binary.NativeEndian.PutUint64(p, seq)
	p[8] = byte(n)
	for i := 9; i < n; i++ {
		p[i] = byte(i*7) + byte(seq)
	}
	return p
}

// checkPayload reports whether p starts with payload(seq, n) for the seq and n it
// carries (the kernel may have padded it past n), and that seq.
func checkPayload(p []byte) (uint64, bool) {
	if len(p) < 9 || len(p) < int(p[8]) {
		return 0, false
	}
	seq := binary.NativeEndian.Uint64(p)
	for i := 9; i < int(p[8]); i++ {
		if p[i] != byte(i*7)+byte(seq) {
			return seq, false
		}
	}
	return seq, true
}

// fakePerf is a backward perf ring written as the kernel writes one (__perf_output_begin
// with backward: head -= size; the record at the new head; then data_head published).
type fakePerf struct {
	head uint64
	data []byte
}

func newFakePerf(size int) *fakePerf { return &fakePerf{data: ringData(size)} }

func (f *fakePerf) ring() PerfRing { return PerfRing{Head: &f.head, Data: f.data} }

// record writes a record of type typ with body (a multiple of 8 bytes).
func (f *fakePerf) record(typ uint32, body []byte) {
	rec := make([]byte, perfHeaderSize+len(body))
	binary.NativeEndian.PutUint32(rec[0:], typ)
	binary.NativeEndian.PutUint16(rec[6:], uint16(len(rec)))
	copy(rec[8:], body)
	head := atomic.LoadUint64(&f.head) - uint64(len(rec))
	storeWords(f.data, head, rec)
	atomic.StoreUint64(&f.head, head) // after the record: perf_output_put_handle
}

// sample writes a PERF_RECORD_SAMPLE with raw data p, padded as the kernel pads it: its
// u32 size is round_up(len(p)+4, 8)-4.
func (f *fakePerf) sample(p []byte) {
	raw := (len(p)+4+7)&^7 - 4
	body := make([]byte, 4+raw)
	binary.NativeEndian.PutUint32(body, uint32(raw))
	copy(body[4:], p)
	f.record(PerfRecordSample, body)
}

// timedSample writes a PERF_RECORD_SAMPLE of PERF_SAMPLE_TIME | PERF_SAMPLE_RAW: the
// time, then the raw data p padded as sample pads it.
func (f *fakePerf) timedSample(time uint64, p []byte) {
	raw := (len(p)+4+7)&^7 - 4
	body := make([]byte, 12+raw)
	binary.NativeEndian.PutUint64(body, time)
	binary.NativeEndian.PutUint32(body[8:], uint32(raw))
	copy(body[12:], p)
	f.record(PerfRecordSample, body)
}

// lost writes a PERF_RECORD_LOST of n samples, alone. (The kernel writes one only with
// the next output: lostThen.)
func (f *fakePerf) lost(n uint64) {
	body := make([]byte, 16)
	binary.NativeEndian.PutUint64(body[8:], n)
	f.record(PerfRecordLost, body)
}

// lostThen writes a PERF_RECORD_LOST of n samples and a sample p, as the kernel writes
// them after refused outputs: one reservation, the lost record at its start, below the
// sample (__perf_output_begin with backward).
func (f *fakePerf) lostThen(n uint64, p []byte) {
	f.sample(p)
	f.lost(n)
}

// perfSampleSize is the ring bytes a sample of n bytes takes.
func perfSampleSize(n int) int { return perfHeaderSize + (n+4+7)&^7 }

// fakeRB is a BPF ring buffer in overwrite mode, written as __bpf_ringbuf_reserve and
// bpf_ringbuf_commit write one (kernel/bpf/ringbuf.c, 6.19), by one producer.
type fakeRB struct {
	cons     uint64
	producer [3]uint64 // producer_pos, pending_pos, overwrite_pos: the producer page
	data     []byte
	overMode bool
}

func newFakeRB(size int) *fakeRB { return &fakeRB{data: ringData(size), overMode: true} }

func (f *fakeRB) ring() BPFRing {
	return BPFRingAt(unsafe.Pointer(&f.cons), unsafe.Pointer(&f.producer), f.data)
}

func (f *fakeRB) mask() uint64 { return uint64(len(f.data) - 1) }

func (f *fakeRB) hdr(pos uint64) *uint32 {
	return (*uint32)(unsafe.Pointer(&f.data[pos&f.mask()]))
}

// reserve reserves n bytes and returns the record's position, or false where the kernel
// fails it: a record past a record still being written (pending_pos), or, without
// overwrite mode, past consumer_pos.
func (f *fakeRB) reserve(n int) (uint64, bool) {
	rlen := uint64(n+bpfHdrSize+7) &^ 7
	prod := atomic.LoadUint64(&f.producer[0])
	newProd := prod + rlen
	// pending_pos: past the committed records.
	pend := atomic.LoadUint64(&f.producer[1])
	for pend != prod && atomic.LoadUint32(f.hdr(pend))&busyBit == 0 {
		pend += (uint64(atomic.LoadUint32(f.hdr(pend))&lenMask) + bpfHdrSize + 7) &^ 7
	}
	atomic.StoreUint64(&f.producer[1], pend)
	if newProd-pend > f.mask() {
		return 0, false
	}
	if !f.overMode && newProd-atomic.LoadUint64(&f.cons) > f.mask() {
		return 0, false
	}
	if f.overMode {
		over := atomic.LoadUint64(&f.producer[2])
		for newProd-over > f.mask() {
			over += (uint64(atomic.LoadUint32(f.hdr(over))&lenMask) + bpfHdrSize + 7) &^ 7
		}
		atomic.StoreUint64(&f.producer[2], over) // WRITE_ONCE, before producer_pos
	}
	atomic.StoreUint32(f.hdr(prod), uint32(n)|busyBit)
	atomic.StoreUint64(&f.producer[0], newProd) // smp_store_release
	return prod, true
}

// write writes p into the record at pos (reserved for len(p) bytes).
func (f *fakeRB) write(pos uint64, p []byte) {
	padded := make([]byte, (len(p)+7)&^7)
	copy(padded, p)
	storeWords(f.data, pos+bpfHdrSize, padded)
}

// commit commits the record at pos, discarded or not (the xchg of bpf_ringbuf_commit).
func (f *fakeRB) commit(pos uint64, discard bool) {
	h := atomic.LoadUint32(f.hdr(pos)) &^ busyBit
	if discard {
		h |= discardBit
	}
	atomic.StoreUint32(f.hdr(pos), h)
}

// output reserves, writes and commits p, as bpf_ringbuf_output.
func (f *fakeRB) output(t testing.TB, p []byte) uint64 {
	t.Helper()
	pos, ok := f.reserve(len(p))
	if !ok {
		t.Fatalf("reserve %d bytes: refused", len(p))
	}
	f.write(pos, p)
	f.commit(pos, false)
	return pos
}

// rbRecordSize is the ring bytes a record of n bytes takes.
func rbRecordSize(n int) int { return (n + bpfHdrSize + 7) &^ 7 }
