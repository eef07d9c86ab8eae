// SPDX-License-Identifier: Apache-2.0

package snapshot

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"slices"
	"testing"
)

// wantSamples checks that s holds samples with exactly the seqs of want, in order, each
// intact.
func wantSamples(t *testing.T, s Snapshot, want []uint64) {
	t.Helper()
	var got []uint64
	for _, r := range s.Records {
		if r.Type != PerfRecordSample && r.Type != 0 {
			got = append(got, 1<<63|r.Lost)
			continue
		}
		seq, ok := checkPayload(r.Data)
		if !ok {
			t.Fatalf("record at %d (seq %d) torn: % x", r.Pos, seq, r.Data)
		}
		got = append(got, seq)
	}
	if len(got) != len(want) {
		t.Fatalf("records %v, want %v (counts %+v)", got, want, s.Counts)
	}
	for i := range got {
		if got[i] != want[i] {
			t.Fatalf("records %v, want %v (counts %+v)", got, want, s.Counts)
		}
	}
}

func seqs(from, to uint64) []uint64 {
	var s []uint64
	for i := from; i < to; i++ {
		s = append(s, i)
	}
	return s
}

func TestPerfEmpty(t *testing.T) {
	f := newFakePerf(256)
	s, err := Perf(f.ring(), make([]byte, 256), nil, PerfOptions{})
	if err != nil || len(s.Records) != 0 || s.Counts != (Counts{}) || s.End != 0 {
		t.Fatalf("empty ring: %+v, %v", s, err)
	}
}

// One sample, then several: oldest first, the payload as written (padded by the kernel).
func TestPerfRecords(t *testing.T) {
	f := newFakePerf(512)
	f.sample(payload(0, 25))
	s, err := Perf(f.ring(), make([]byte, 512), nil, PerfOptions{})
	if err != nil {
		t.Fatal(err)
	}
	wantSamples(t, s, []uint64{0})
	if n := len(s.Records[0].Data); n != 28 { // round_up(25+4, 8)-4
		t.Errorf("payload %d bytes, want the kernel's padded 28", n)
	}
	if s.End != f.head || s.Records[0].Pos != f.head {
		t.Errorf("end %d, record at %d; want data_head %d", s.End, s.Records[0].Pos, f.head)
	}
	f.lostThen(7, payload(1, 9))
	f.sample(payload(2, 64))
	s, err = Perf(f.ring(), make([]byte, 512), nil, PerfOptions{})
	if err != nil {
		t.Fatal(err)
	}
	wantSamples(t, s, []uint64{0, 1<<63 | 7, 1, 2})
	if s.Counts != (Counts{}) {
		t.Errorf("counts %+v, want none", s.Counts)
	}
}

// With PerfOptions.Time each sample's time comes back in Time and its raw data after
// it, also across the ring's end; a sample too short to hold both is a corruption.
func TestPerfTime(t *testing.T) {
	f := newFakePerf(256)
	for i := range uint64(6) { // records of 40 bytes: the ring's end is crossed
		f.timedSample(1000+i, payload(i, 20))
	}
	// A lost record carries no time (sample_id_all is off); written right after
	// a sample, it is taken for the lost record written with it (lostThen).
	f.lost(3)
	s, err := Perf(f.ring(), make([]byte, 256), nil, PerfOptions{Time: true})
	if err != nil {
		t.Fatal(err)
	}
	if n := len(s.Records); n != 6 {
		t.Fatalf("%d records, want the 5 whole samples and the lost record", n)
	}
	samples := slices.Concat(s.Records[:4], s.Records[5:])
	for k, r := range samples {
		seq, ok := checkPayload(r.Data)
		if !ok || seq != uint64(k+1) || r.Time != 1000+seq || len(r.Data) != 20 {
			t.Errorf("sample %d: seq %d (%v), time %d, %d bytes; want seq %d at time %d, 20 bytes", k, seq, ok, r.Time, len(r.Data), k+1, 1001+k)
		}
	}
	if r := s.Records[4]; r.Type != PerfRecordLost || r.Lost != 3 || r.Time != 0 {
		t.Errorf("record 4 %+v, want a lost record of 3", r)
	}
	g := newFakePerf(256)
	g.record(PerfRecordSample, make([]byte, 8)) // a time, no room for the size
	if s, _ := Perf(g.ring(), make([]byte, 256), nil, PerfOptions{Time: true}); !s.Corrupt || len(s.Records) != 0 {
		t.Errorf("an 8-byte timed sample: %+v, want a corruption", s)
	}
}

// A record across the ring's end comes back whole; records of other types are counted.
func TestPerfWrap(t *testing.T) {
	f := newFakePerf(128)
	f.record(3, make([]byte, 8)) // PERF_RECORD_COMM, 16 bytes: head -16
	for i := range uint64(3) {
		f.sample(payload(i, 28)) // 40 bytes each: -56, -96, -136 crosses -128
	}
	s, err := Perf(f.ring(), make([]byte, 256), nil, PerfOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// Written: 136 bytes in a 128-byte ring; the window holds samples 2, 1, 0 (120
	// bytes) and half of the COMM record, partly overwritten.
	wantSamples(t, s, []uint64{0, 1, 2})
	if s.Corrupt || s.Other != 0 {
		t.Errorf("counts %+v: the partial oldest record is neither corrupt nor counted", s.Counts)
	}
	f2 := newFakePerf(128)
	f2.record(3, make([]byte, 8))
	f2.sample(payload(5, 28))
	s, _ = Perf(f2.ring(), make([]byte, 256), nil, PerfOptions{})
	wantSamples(t, s, []uint64{5})
	if s.Other != 1 {
		t.Errorf("other %d, want the COMM record", s.Other)
	}
}

// A ring overwritten many times holds the newest records that fit whole in its size.
func TestPerfOverwrittenMany(t *testing.T) {
	const size = 1024
	f := newFakePerf(size)
	var sizes []int
	for i := range uint64(5000) {
		n := 9 + int(i*37%100)
		f.sample(payload(i, n))
		sizes = append(sizes, perfSampleSize(n))
	}
	// The newest k records whose sizes add up to at most the ring's size.
	first, total := len(sizes), 0
	for first > 0 && total+sizes[first-1] <= size {
		first--
		total += sizes[first]
	}
	s, err := Perf(f.ring(), make([]byte, size), nil, PerfOptions{})
	if err != nil {
		t.Fatal(err)
	}
	wantSamples(t, s, seqs(uint64(first), 5000))
	if s.Corrupt {
		t.Errorf("corrupt: %+v", s.Counts)
	}
}

// A buffer too small for all keeps the newest, and says when the newest does not fit.
func TestPerfNoRoom(t *testing.T) {
	f := newFakePerf(1024)
	for i := range uint64(6) {
		f.sample(payload(i, 44)) // 48-byte bodies
	}
	s, err := Perf(f.ring(), make([]byte, 3*48+10), nil, PerfOptions{})
	if err != nil {
		t.Fatal(err)
	}
	wantSamples(t, s, []uint64{3, 4, 5})
	if s.NoRoom != 3 {
		t.Errorf("no room for %d, want 3", s.NoRoom)
	}
	_, err = Perf(f.ring(), make([]byte, 47), nil, PerfOptions{})
	var short *ShortBufferError
	if !errors.As(err, &short) || !errors.Is(err, io.ErrShortBuffer) || short.Need != 48 || short.Have != 47 {
		t.Errorf("47-byte buffer: %v, want a *ShortBufferError needing 48", err)
	}
}

// From: a second snapshot returns only what was written since the first.
func TestPerfFrom(t *testing.T) {
	f := newFakePerf(1024)
	for i := range uint64(3) {
		f.sample(payload(i, 16))
	}
	first, _ := Perf(f.ring(), make([]byte, 1024), nil, PerfOptions{})
	wantSamples(t, first, []uint64{0, 1, 2})
	f.sample(payload(3, 16))
	f.sample(payload(4, 16))
	s, err := Perf(f.ring(), make([]byte, 1024), nil, PerfOptions{From: first.End})
	if err != nil {
		t.Fatal(err)
	}
	wantSamples(t, s, []uint64{3, 4})
	s, _ = Perf(f.ring(), make([]byte, 1024), nil, PerfOptions{From: s.End})
	wantSamples(t, s, nil)
}

// Sizes the kernel cannot write stop the walk, marked corrupt, with the newer records kept.
func TestPerfCorrupt(t *testing.T) {
	for _, tc := range []struct {
		name  string
		write func(f *fakePerf)
	}{
		{"size 0", func(f *fakePerf) { f.record(9, nil); f.setSize(0) }},
		{"size not 8-aligned", func(f *fakePerf) { f.record(9, make([]byte, 8)); f.setSize(12) }},
		{"past what was written", func(f *fakePerf) { f.record(9, make([]byte, 8)); f.setSize(64) }},
		{"raw size past the record", func(f *fakePerf) {
			body := make([]byte, 16)
			binary.NativeEndian.PutUint32(body, 13)
			f.record(PerfRecordSample, body)
		}},
		{"lost too short", func(f *fakePerf) { f.record(PerfRecordLost, make([]byte, 8)) }},
		{"sample too short", func(f *fakePerf) { f.record(PerfRecordSample, nil) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFakePerf(256)
			f.sample(payload(0, 12))
			tc.write(f)
			f.sample(payload(1, 12))
			f.sample(payload(2, 12))
			s, err := Perf(f.ring(), make([]byte, 256), nil, PerfOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if !s.Corrupt {
				t.Errorf("not corrupt: %+v", s.Counts)
			}
			wantSamples(t, s, []uint64{1, 2})
		})
	}
	// A head the kernel cannot hold.
	f := newFakePerf(256)
	f.head = 1<<64 - 12
	if s, err := Perf(f.ring(), make([]byte, 256), nil, PerfOptions{}); err != nil || !s.Corrupt || len(s.Records) != 0 {
		t.Errorf("head -12: %+v, %v; want corrupt", s, err)
	}
	// Data areas the parser cannot read.
	for _, n := range []int{0, 4, 24} {
		if _, err := Perf(PerfRing{Head: &f.head, Data: ringData(32)[:n]}, nil, nil, PerfOptions{}); err == nil {
			t.Errorf("data of %d bytes: no error", n)
		}
	}
	if _, err := Perf(PerfRing{Head: &f.head, Data: ringData(64)[4:36]}, nil, nil, PerfOptions{}); err == nil {
		t.Error("misaligned data: no error")
	}
}

// setSize overwrites the newest record's header size.
func (f *fakePerf) setSize(n uint16) {
	mask := uint64(len(f.data) - 1)
	binary.NativeEndian.PutUint16(f.data[(f.head&mask)+6:], n)
}

// The records' bytes land in the caller's buffer, nowhere else.
func TestPerfIntoBuffer(t *testing.T) {
	f := newFakePerf(256)
	f.sample(payload(9, 20))
	buf := make([]byte, 100)
	s, err := Perf(f.ring(), buf, make([]Record, 0, 4), PerfOptions{})
	if err != nil {
		t.Fatal(err)
	}
	d := s.Records[0].Data
	if !bytes.Equal(d[:20], payload(9, 20)) || &buf[len(buf)-24+4] != &d[0] {
		t.Errorf("payload not at the end of the caller's buffer")
	}
}
