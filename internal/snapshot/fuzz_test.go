// SPDX-License-Identifier: Apache-2.0

package snapshot

import (
	"errors"
	"io"
	"testing"
	"unsafe"
)

// fuzzRing is the data area of a fuzz run: 256 bytes from the input, zero past it.
func fuzzRing(in []byte) []byte {
	data := ringData(256)
	copy(data, in)
	return data
}

// inBuf reports whether p lies inside buf.
func inBuf(p, buf []byte) bool {
	if len(p) == 0 {
		return true
	}
	b := uintptr(unsafe.Pointer(unsafe.SliceData(buf)))
	q := uintptr(unsafe.Pointer(unsafe.SliceData(p)))
	return q >= b && q+uintptr(len(p)) <= b+uintptr(len(buf))
}

// Any ring bytes and head: no panic, no error but a short buffer, every record inside
// the caller's buffer and inside the ring's window, oldest first (positions decreasing).
func FuzzPerf(f *testing.F) {
	fp := newFakePerf(256)
	fp.sample(payload(1, 20))
	fp.lost(3)
	fp.sample(payload(2, 50))
	f.Add(fp.data, fp.head, uint64(0), uint16(256), false)
	f.Add(fp.data, fp.head, fp.head+32, uint16(40), false)
	f.Add([]byte{9, 0, 0, 0, 0, 0, 8, 0}, uint64(1<<64-8), uint64(0), uint16(0), false)
	ft := newFakePerf(256) // a Recorder's: samples with their time
	ft.timedSample(5, payload(1, 20))
	ft.lost(3)
	ft.timedSample(9, payload(2, 50))
	f.Add(ft.data, ft.head, uint64(0), uint16(256), true)
	f.Fuzz(func(t *testing.T, in []byte, head, from uint64, bufLen uint16, timed bool) {
		data := fuzzRing(in)
		buf := make([]byte, bufLen)
		s, err := Perf(PerfRing{Head: &head, Data: data}, buf, nil, PerfOptions{From: from, Time: timed})
		if err != nil && !errors.Is(err, io.ErrShortBuffer) {
			t.Fatalf("error %v", err)
		}
		used := 0
		for i, r := range s.Records {
			if !inBuf(r.Data, buf) {
				t.Fatalf("record %d outside the buffer", i)
			}
			used += len(r.Data)
			if r.Pos-head >= 256 {
				t.Fatalf("record %d at %d, outside the window from head %d", i, r.Pos, head)
			}
			// A lost record goes before the output it was written with, just above it
			// (its own size: 24 bytes, more with sample_id_all).
			lostPair := i > 0 && s.Records[i-1].Type == PerfRecordLost && r.Pos == s.Records[i-1].Pos+uint64(s.Records[i-1].size)
			if i > 0 && !after(s.Records[i-1].Pos, r.Pos) && !lostPair {
				t.Fatalf("record %d at %d after one at %d: not oldest first", i, r.Pos, s.Records[i-1].Pos)
			}
			if r.Type != PerfRecordSample && r.Type != PerfRecordLost {
				t.Fatalf("record of type %d returned", r.Type)
			}
		}
		if used > len(buf) {
			t.Fatalf("%d bytes of records in a %d-byte buffer", used, len(buf))
		}
	})
}

// Any ring bytes and positions: no panic, every record inside the buffer, between the
// start and producer_pos, in order, without overlaps.
func FuzzBPF(f *testing.F) {
	rb := newFakeRB(256)
	for i := range uint64(9) {
		rb.output(f, payload(i, 20+int(i)))
	}
	f.Add(rb.data, rb.cons, rb.producer[0], rb.producer[2], uint64(0), uint16(256))
	f.Add(rb.data, uint64(0), uint64(64), uint64(0), uint64(8), uint16(30))
	f.Fuzz(func(t *testing.T, in []byte, cons, prod, over, from uint64, bufLen uint16) {
		data := fuzzRing(in)
		page := [3]uint64{prod, 0, over}
		buf := make([]byte, bufLen)
		r := BPFRingAt(unsafe.Pointer(&cons), unsafe.Pointer(&page), data)
		s, err := BPF(r, buf, nil, BPFOptions{From: from})
		if err != nil && !errors.Is(err, io.ErrShortBuffer) {
			t.Fatalf("error %v", err)
		}
		var end uint64
		for i, rec := range s.Records {
			if !inBuf(rec.Data, buf) {
				t.Fatalf("record %d outside the buffer", i)
			}
			if prod-rec.Pos > 256 || rec.Pos == prod {
				t.Fatalf("record %d at %d, not below producer_pos %d", i, rec.Pos, prod)
			}
			if i > 0 && after(end, rec.Pos) {
				t.Fatalf("record %d at %d overlaps the one before, which ends at %d", i, rec.Pos, end)
			}
			end = rec.Pos + uint64(rbRecordSize(len(rec.Data)))
			if after(end, prod) {
				t.Fatalf("record %d ends at %d, past producer_pos %d", i, end, prod)
			}
		}
	})
}
