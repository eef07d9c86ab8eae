// SPDX-License-Identifier: Apache-2.0

package snapshot

import (
	"errors"
	"io"
	"testing"
	"unsafe"
)

func TestBPFEmpty(t *testing.T) {
	f := newFakeRB(256)
	s, err := BPF(f.ring(), make([]byte, 256), nil, BPFOptions{})
	if err != nil || len(s.Records) != 0 || s.Counts != (Counts{}) || s.End != 0 {
		t.Fatalf("empty ring: %+v, %v", s, err)
	}
}

// Records come back oldest first, exactly as long as written; busy and discarded ones are
// skipped and counted.
func TestBPFRecords(t *testing.T) {
	f := newFakeRB(512)
	f.output(t, payload(0, 13))
	s, err := BPF(f.ring(), make([]byte, 512), nil, BPFOptions{})
	if err != nil {
		t.Fatal(err)
	}
	wantSamples(t, s, []uint64{0})
	if len(s.Records[0].Data) != 13 || s.Records[0].Pos != 0 || s.End != 24 {
		t.Errorf("record of %d bytes at %d, end %d; want 13 at 0, end 24", len(s.Records[0].Data), s.Records[0].Pos, s.End)
	}
	d, _ := f.reserve(20)
	f.write(d, payload(1, 20))
	f.commit(d, true)
	f.output(t, payload(2, 40))
	busy, _ := f.reserve(16) // never committed
	f.write(busy, payload(3, 16))
	f.output(t, payload(4, 9))
	s, err = BPF(f.ring(), make([]byte, 512), nil, BPFOptions{})
	if err != nil {
		t.Fatal(err)
	}
	wantSamples(t, s, []uint64{0, 2, 4})
	if s.Counts != (Counts{Busy: 1, Discarded: 1}) {
		t.Errorf("counts %+v, want one busy, one discarded", s.Counts)
	}
	// The consumer position starts the snapshot when it is past overwrite_pos.
	f.cons = 24
	s, _ = BPF(f.ring(), make([]byte, 512), nil, BPFOptions{})
	wantSamples(t, s, []uint64{2, 4})
}

// A record across the ring's end comes back whole.
func TestBPFWrap(t *testing.T) {
	f := newFakeRB(128)
	for i := range uint64(5) {
		f.output(t, payload(i, 30)) // 40 bytes each: the fourth crosses 128
	}
	// 200 bytes written to a 128-byte ring: overwrite_pos moved past records 0-2 (the
	// fifth needed 200-127 bytes freed).
	s, err := BPF(f.ring(), make([]byte, 256), nil, BPFOptions{})
	if err != nil {
		t.Fatal(err)
	}
	wantSamples(t, s, []uint64{2, 3, 4})
	if s.Records[1].Pos != 120 {
		t.Errorf("record 3 at %d, want 120 (across the end)", s.Records[1].Pos)
	}
}

// A ring overwritten many times: the records from overwrite_pos to producer_pos.
func TestBPFOverwrittenMany(t *testing.T) {
	const size = 4096
	f := newFakeRB(size)
	var pos []uint64
	for i := range uint64(10000) {
		pos = append(pos, f.output(t, payload(i, 9+int(i*53%200))))
	}
	over := f.producer[2]
	first := 0
	for pos[first] != over {
		first++
	}
	s, err := BPF(f.ring(), make([]byte, size), nil, BPFOptions{})
	if err != nil {
		t.Fatal(err)
	}
	wantSamples(t, s, seqs(uint64(first), 10000))
	if s.Counts != (Counts{}) {
		t.Errorf("counts %+v", s.Counts)
	}
}

// Without overwrite mode, the same parser reads from consumer_pos.
func TestBPFNotOverwriting(t *testing.T) {
	f := newFakeRB(256)
	f.overMode = false
	for i := range uint64(4) {
		f.output(t, payload(i, 20))
	}
	s, _ := BPF(f.ring(), make([]byte, 256), nil, BPFOptions{})
	wantSamples(t, s, seqs(0, 4))
}

func TestBPFNoRoom(t *testing.T) {
	f := newFakeRB(1024)
	for i := range uint64(6) {
		f.output(t, payload(i, 40))
	}
	busy, _ := f.reserve(100) // skipped: not in the count of what fits
	f.write(busy, payload(99, 100))
	s, err := BPF(f.ring(), make([]byte, 3*40+39), nil, BPFOptions{})
	if err != nil {
		t.Fatal(err)
	}
	wantSamples(t, s, []uint64{3, 4, 5})
	if s.NoRoom != 3 || s.Busy != 1 {
		t.Errorf("counts %+v, want 3 with no room, 1 busy", s.Counts)
	}
	s, err = BPF(f.ring(), make([]byte, 39), nil, BPFOptions{})
	var short *ShortBufferError
	if !errors.As(err, &short) || !errors.Is(err, io.ErrShortBuffer) || short.Need != 40 {
		t.Errorf("39-byte buffer: %v, want a *ShortBufferError needing 40", err)
	}
	// Every record was left out, and is counted: as Perf counts them.
	if len(s.Records) != 0 || s.NoRoom != 6 || s.Busy != 1 {
		t.Errorf("39-byte buffer: %d records, counts %+v; want none, 6 with no room, 1 busy", len(s.Records), s.Counts)
	}
}

func TestBPFFrom(t *testing.T) {
	f := newFakeRB(1024)
	for i := range uint64(3) {
		f.output(t, payload(i, 16))
	}
	first, _ := BPF(f.ring(), make([]byte, 1024), nil, BPFOptions{})
	wantSamples(t, first, seqs(0, 3))
	f.output(t, payload(3, 16))
	s, _ := BPF(f.ring(), make([]byte, 1024), nil, BPFOptions{From: first.End})
	wantSamples(t, s, []uint64{3})
	s, _ = BPF(f.ring(), make([]byte, 1024), nil, BPFOptions{From: s.End})
	wantSamples(t, s, nil)
}

// Headers the kernel cannot write stop the walk, marked corrupt; positions it cannot hold
// end the snapshot.
func TestBPFCorrupt(t *testing.T) {
	for _, tc := range []struct {
		name string
		hdr  uint32
	}{
		{"past producer_pos", 200},
		{"busy and discarded", 16 | busyBit | discardBit},
		{"length bits past the ring", lenMask},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFakeRB(256)
			f.output(t, payload(0, 16))
			bad := f.output(t, payload(1, 16))
			f.output(t, payload(2, 16))
			*f.hdr(bad) = tc.hdr
			s, err := BPF(f.ring(), make([]byte, 256), nil, BPFOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if !s.Corrupt {
				t.Errorf("not corrupt: %+v", s.Counts)
			}
			wantSamples(t, s, []uint64{0})
		})
	}
	for _, tc := range []struct {
		name             string
		cons, prod, over uint64
	}{
		{"producer not 8-aligned", 0, 12, 0},
		{"start not 8-aligned", 4, 16, 0},
		{"more than the ring", 0, 512, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFakeRB(256)
			f.cons, f.producer[0], f.producer[2] = tc.cons, tc.prod, tc.over
			s, err := BPF(f.ring(), make([]byte, 256), nil, BPFOptions{})
			if err != nil || !s.Corrupt || len(s.Records) != 0 {
				t.Errorf("%+v, %v; want corrupt, nothing", s, err)
			}
		})
	}
	// overwrite_pos past producer_pos, for good: lapped, nothing read.
	f := newFakeRB(256)
	f.producer[0], f.producer[2] = 64, 128
	if s, err := BPF(f.ring(), make([]byte, 256), nil, BPFOptions{}); err != nil || !s.Lapped || len(s.Records) != 0 {
		t.Errorf("overwrite_pos past producer_pos: %+v, %v; want lapped", s, err)
	}
}

// The check: records that a producer overwrote between the copy and the check are
// dropped, whichever header the walk read. Settle runs the producer there.
func TestBPFOverwrittenDuringCopy(t *testing.T) {
	for _, tc := range []struct {
		name   string
		writes int // records of 40 bytes written during the snapshot
		want   []uint64
	}{
		{"none", 0, seqs(0, 6)},
		{"two", 2, seqs(2, 6)},
		{"all", 6, nil},
		{"laps", 20, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFakeRB(256)
			for i := range uint64(6) {
				f.output(t, payload(i, 32)) // 40 bytes each, 240 of 256
			}
			settle := func() error {
				for i := range tc.writes {
					f.output(t, payload(100+uint64(i), 32))
				}
				return nil
			}
			s, err := BPF(f.ring(), make([]byte, 512), nil, BPFOptions{Settle: settle})
			if err != nil {
				t.Fatal(err)
			}
			wantSamples(t, s, tc.want)
			if int(s.Overwritten) != 6-len(tc.want) || s.Corrupt {
				t.Errorf("counts %+v, want %d overwritten", s.Counts, 6-len(tc.want))
			}
		})
	}
	// A walk that read a header a producer had already overwritten: the chain it
	// followed does not pass through the new overwrite_pos, and nothing is returned.
	f := newFakeRB(256)
	for i := range uint64(6) {
		f.output(t, payload(i, 32))
	}
	p := f.ring()
	p.Overwrite = new(uint64) // the walk starts at 0, an overwritten header there
	*f.hdr(0) = 8             // a 16-byte record: the chain goes 0, 16, ...
	*f.hdr(16) = 8
	*f.hdr(32) = 200 - 8 // ... and stops past producer_pos
	settle := func() error { *p.Overwrite = 40; return nil }
	s, err := BPF(p, make([]byte, 512), nil, BPFOptions{Settle: settle})
	if err != nil {
		t.Fatal(err)
	}
	if len(s.Records) != 0 || s.Corrupt {
		t.Errorf("walk off the chain: %d records, counts %+v; want none, not corrupt", len(s.Records), s.Counts)
	}
	// Settle's error ends the snapshot.
	errSettle := errors.New("no grace period")
	if _, err := BPF(f.ring(), make([]byte, 512), nil, BPFOptions{Settle: func() error { return errSettle }}); !errors.Is(err, errSettle) {
		t.Errorf("settle error: %v", err)
	}
}

// The producer page's offsets, as the kernel's struct bpf_ringbuf lays them out.
func TestBPFRingAt(t *testing.T) {
	var cons uint64
	var page [512]uint64
	r := BPFRingAt(unsafe.Pointer(&cons), unsafe.Pointer(&page), ringData(64))
	if r.Consumer != &cons || r.Producer != &page[0] || r.Overwrite != &page[2] {
		t.Errorf("BPFRingAt: producer at word %d, overwrite at word %d; want 0 and 2",
			(uintptr(unsafe.Pointer(r.Producer))-uintptr(unsafe.Pointer(&page)))/8,
			(uintptr(unsafe.Pointer(r.Overwrite))-uintptr(unsafe.Pointer(&page)))/8)
	}
}
