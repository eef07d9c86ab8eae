// SPDX-License-Identifier: Apache-2.0

package ringtest

import (
	"encoding/binary"
	"sync/atomic"
	"testing"

	"golang.org/x/sys/unix"
)

// Perf is a perf ring in Go memory with a producer that follows the kernel's
// protocol (kernel/events/ring_buffer.c): check the space against data_tail,
// write the record at the producer's private head, then publish data_head
// with a release store.
type Perf struct {
	Page *unix.PerfEventMmapPage
	Data []byte
	Head uint64 // the producer's private head (kernel: rb->head)
	Lost uint64 // samples dropped for lack of space and not yet reported
}

// NewPerf returns an empty perf ring of size bytes, a power of two.
func NewPerf(size int) *Perf {
	return &Perf{Page: new(unix.PerfEventMmapPage), Data: make([]byte, size)}
}

// NewPerfAt starts the ring at position pos (data_head = data_tail = pos).
func NewPerfAt(size int, pos uint64) *Perf {
	f := NewPerf(size)
	f.Head = pos
	f.Page.Data_head, f.Page.Data_tail = pos, pos
	return f
}

// Space is the kernel's CIRC_SPACE(head, tail, size): it leaves one byte
// unused, so with 8-byte records the ring never fills completely.
func (f *Perf) Space() uint64 {
	// Pairs with the reader's StoreUint64 of data_tail (kernel: READ_ONCE +
	// smp_mb in perf_output_begin).
	tail := atomic.LoadUint64(&f.Page.Data_tail)
	return (tail - f.Head - 1) & uint64(len(f.Data)-1)
}

// Put writes raw bytes at the producer's head, wrapping at the ring's end.
// No space check, no publish.
func (f *Perf) Put(p []byte) {
	off := int(f.Head & uint64(len(f.Data)-1))
	n := copy(f.Data[off:], p)
	copy(f.Data, p[n:])
	f.Head += uint64(len(p))
}

// Publish makes everything written so far visible to the reader.
func (f *Perf) Publish() {
	// Release, like smp_store_release(&user_page->data_head) in
	// perf_output_put_handle.
	atomic.StoreUint64(&f.Page.Data_head, f.Head)
}

// Write writes one record if it fits, as perf_output_begin does; otherwise
// it counts a lost sample. Pending lost samples are reported first with a
// PERF_RECORD_LOST in the same reservation. It does not publish.
func (f *Perf) Write(rec []byte) bool {
	need := uint64(len(rec))
	if f.Lost > 0 {
		need += 24
	}
	if f.Space() < need {
		f.Lost++
		return false
	}
	if f.Lost > 0 {
		f.Put(PerfLost(0, f.Lost))
		f.Lost = 0
	}
	f.Put(rec)
	return true
}

// MustWrite writes and publishes one record.
func (f *Perf) MustWrite(t testing.TB, rec []byte) {
	t.Helper()
	if !f.Write(rec) {
		t.Fatalf("no room for a %d-byte record", len(rec))
	}
	f.Publish()
}

// PerfSample encodes a PERF_RECORD_SAMPLE carrying payload, padded as the
// kernel pads bpf_perf_event_output data: raw size round_up(n+4, 8)-4.
func PerfSample(payload []byte) []byte {
	raw := (len(payload)+4+7)&^7 - 4
	rec := make([]byte, 8+4+raw)
	binary.NativeEndian.PutUint32(rec[0:], unix.PERF_RECORD_SAMPLE)
	binary.NativeEndian.PutUint16(rec[6:], uint16(len(rec)))
	binary.NativeEndian.PutUint32(rec[8:], uint32(raw))
	copy(rec[12:], payload)
	return rec
}

// PerfLost encodes a PERF_RECORD_LOST.
func PerfLost(id, lost uint64) []byte {
	rec := make([]byte, 24)
	binary.NativeEndian.PutUint32(rec[0:], unix.PERF_RECORD_LOST)
	binary.NativeEndian.PutUint16(rec[6:], 24)
	binary.NativeEndian.PutUint64(rec[8:], id)
	binary.NativeEndian.PutUint64(rec[16:], lost)
	return rec
}

// PerfRecord encodes a record of any type with the given body; size is the
// header's size field, which need not match.
func PerfRecord(typ uint32, size uint16, body []byte) []byte {
	rec := make([]byte, 8+len(body))
	binary.NativeEndian.PutUint32(rec[0:], typ)
	binary.NativeEndian.PutUint16(rec[6:], size)
	copy(rec[8:], body)
	return rec
}

// PerfPadded returns payload padded with zeros as the kernel pads it.
func PerfPadded(payload []byte) []byte {
	out := make([]byte, (len(payload)+4+7)&^7-4)
	copy(out, payload)
	return out
}
