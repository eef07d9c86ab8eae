// SPDX-License-Identifier: Apache-2.0

package ring

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/perfbuf/perfbuf/internal/ringtest"
	"golang.org/x/sys/unix"
)

// fakeReader returns a reader of the fake ring f.
func fakeReader(t testing.TB, f *ringtest.RingBuf) *RingBuf {
	t.Helper()
	r, err := NewRingBufFromParts(-1, &f.Pos[0], &f.Pos[1], f.Data)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// collect reads every record of r up to the head snapshot with Next, without committing:
// a perf ring's or a ring buffer's.
func collect(t *testing.T, r Ring) []Record {
	t.Helper()
	var recs []Record
	for {
		var rec Record
		ok, err := r.Next(&rec)
		if err != nil {
			t.Fatal(err)
		}
		if !ok {
			return recs
		}
		recs = append(recs, rec)
	}
}

func TestBPFRingNew(t *testing.T) {
	var c, p uint64
	mem := make([]uint64, 4)
	data := unsafe.Slice((*byte)(unsafe.Pointer(&mem[0])), 32)
	for _, tc := range []struct {
		name       string
		c, p       *uint64
		data       []byte
		wantReason string
	}{
		{"nil consumer", nil, &p, data[:16], "nil position"},
		{"nil producer", &c, nil, data[:16], "nil position"},
		{"small", &c, &p, data[:8], "not twice a power of two"},
		{"odd", &c, &p, data[:15], "not twice a power of two"},
		{"not a power of two", &c, &p, data[:24], "not twice a power of two"},
		{"unaligned", &c, &p, data[4:20], "not 8-aligned"},
	} {
		_, err := NewRingBufFromParts(-1, tc.c, tc.p, tc.data)
		if !errors.Is(err, os.ErrInvalid) || !strings.Contains(err.Error(), tc.wantReason) {
			t.Errorf("%s: %v", tc.name, err)
		}
	}
	r, err := NewRingBufFromParts(3, &c, &p, data)
	if err != nil || r.Size() != 16 || r.CPU() != 3 {
		t.Fatalf("16-byte ring: %v", err)
	}
	if _, err := NewRingBuf(-1, -1, 4096+1); !errors.Is(err, os.ErrInvalid) {
		t.Errorf("newBPFRing with a bad size: %v", err)
	}
	if _, err := NewRingBuf(-1, -1, os.Getpagesize()); !errors.Is(err, unix.EBADF) {
		t.Errorf("newBPFRing on fd -1: %v", err)
	}
}

func TestBPFRingEmpty(t *testing.T) {
	f := ringtest.NewRingBuf(4096)
	r := fakeReader(t, f)
	r.Begin()
	var rec Record
	if ok, err := r.Next(&rec); ok || err != nil {
		t.Fatalf("next on an empty ring = %v, %v", ok, err)
	}
	n, _, err := r.Each(&rec, ^uint64(0), nil, func(*Record) error { t.Fatal("fn on an empty ring"); return nil }, nil)
	if n != 0 || err != nil {
		t.Fatalf("each = %d, %v", n, err)
	}
	if r.Pending() != 0 || r.Used() != 0 || r.Size() != 4096 || !r.Quiet() || r.Peek(0, &rec) {
		t.Fatalf("pending %d used %d size %d quiet %v", r.Pending(), r.Used(), r.Size(), r.Quiet())
	}
	if s := *r.Counts(); s != (Counts{}) || r.counts.Discarded != 0 {
		t.Fatalf("stats %+v, discarded %d", s, r.counts.Discarded)
	}
}

func TestBPFRingOneRecord(t *testing.T) {
	f := ringtest.NewRingBuf(4096)
	r := fakeReader(t, f)
	payload := ringtest.Pattern(13, 1)
	f.Output(t, payload)

	if r.Quiet() || r.Used() != 24 {
		t.Fatalf("quiet %v used %d with a record", r.Quiet(), r.Used())
	}
	r.Begin()
	if r.Pending() != 24 {
		t.Fatalf("pending %d, want 24 (13 + 8 rounded up to 8)", r.Pending())
	}
	var rec Record
	ok, err := r.Next(&rec)
	if !ok || err != nil {
		t.Fatalf("next = %v, %v", ok, err)
	}
	if rec.Type != Sample || rec.CPU != -1 || rec.Pos != 0 || rec.Next != 24 || rec.Wrapped != nil || rec.Lost != 0 {
		t.Fatalf("record %+v", rec)
	}
	if !bytes.Equal(rec.Data, payload) || cap(rec.Data) != len(payload) {
		t.Fatalf("payload %x (cap %d), want %x: exactly the sample, no padding", rec.Data, cap(rec.Data), payload)
	}
	if &rec.Data[0] != &f.Data[8] {
		t.Fatal("Data is not the ring's memory")
	}
	if ok, err := r.Next(&rec); ok || err != nil {
		t.Fatalf("next past the record = %v, %v", ok, err)
	}
	if f.Pos[0] != 0 || r.Pos() != 24 {
		t.Fatalf("consumer_pos %d before commit, cursor %d", f.Pos[0], r.Pos())
	}
	r.CommitCursor()
	if f.Pos[0] != 24 || r.Used() != 0 {
		t.Fatalf("consumer_pos %d after commit, used %d", f.Pos[0], r.Used())
	}
	if s := *r.Counts(); s.Samples != 1 || s.Bytes != 13 || s.MaxFill != 24 {
		t.Fatalf("stats %+v", s)
	}
}

func TestBPFRingRounding(t *testing.T) {
	f := ringtest.NewRingBuf(4096)
	r := fakeReader(t, f)
	var want []uint64
	for n := range 18 {
		want = append(want, f.Output(t, ringtest.Pattern(n, byte(n))))
	}
	r.Begin()
	recs := collect(t, r)
	if len(recs) != 18 {
		t.Fatalf("%d records, want 18", len(recs))
	}
	for n, rec := range recs {
		if rec.Pos != want[n] || rec.Next-rec.Pos != uint64((n+8+7)/8*8) || !bytes.Equal(rec.Data, ringtest.Pattern(n, byte(n))) {
			t.Errorf("%d-byte sample: %d..%d %x", n, rec.Pos, rec.Next, rec.Data)
		}
	}
}

// TestBPFRingMany reads many records of every size over several laps of a small ring with
// next and with each, committing at different points.
func TestBPFRingMany(t *testing.T) {
	for _, useEach := range []bool{false, true} {
		t.Run(fmt.Sprintf("each=%v", useEach), func(t *testing.T) {
			f := ringtest.NewRingBufAt(256, ^uint64(0)-1023) // positions wrap 2^64 too
			r := fakeReader(t, f)
			seq, got := 0, 0
			for round := 0; got < 500; round++ {
				for {
					n := (seq * 7) % 60
					pos, ok := f.Reserve(n)
					if !ok {
						break
					}
					f.Write(pos, ringtest.Pattern(n, byte(seq)))
					f.Commit(pos, false)
					seq++
				}
				r.Begin()
				check := func(rec *Record) error {
					n := (got * 7) % 60
					if !bytes.Equal(rec.Data, ringtest.Pattern(n, byte(got))) {
						return fmt.Errorf("sample %d: %x", got, rec.Data)
					}
					got++
					return nil
				}
				if useEach {
					if _, _, err := r.Each(&Record{}, ^uint64(0), nil, check, nil); err != nil {
						t.Fatal(err)
					}
				} else {
					for _, rec := range collect(t, r) {
						if err := check(&rec); err != nil {
							t.Fatal(err)
						}
					}
				}
				if r.Pending() != 0 || got != seq {
					t.Fatalf("round %d: pending %d, %d of %d", round, r.Pending(), got, seq)
				}
				r.CommitCursor()
			}
			if s := r.Counts(); s.Samples != uint64(got) || s.MaxFill > 248 {
				t.Fatalf("stats %+v for %d", s, got)
			}
		})
	}
}

// TestBPFRingWrap: a sample that runs past the area's end is read as one piece from the
// second copy, zero-copy.
func TestBPFRingWrap(t *testing.T) {
	for _, start := range []uint64{64 - 8, 64 - 16, 64 - 24, 1<<40 + 48} {
		f := ringtest.NewRingBufAt(64, start)
		r := fakeReader(t, f)
		payload := ringtest.Pattern(40, 3) // 48 bytes with its header: wraps unless it starts at 0
		f.Output(t, payload)
		r.Begin()
		var rec Record
		if ok, err := r.Next(&rec); !ok || err != nil {
			t.Fatalf("start %d: next = %v, %v", start, ok, err)
		}
		off := start & 63
		if !bytes.Equal(rec.Data, payload) || rec.Wrapped != nil || &rec.Data[0] != &f.Data[off+8] || rec.Next != start+48 {
			t.Fatalf("start %d: %+v", start, rec)
		}
		r.CommitCursor()
		// Two more, over the end of the area again for some starts.
		f.Output(t, ringtest.Pattern(4, 4))
		f.Output(t, ringtest.Pattern(20, 5))
		r.Begin()
		recs := collect(t, r)
		if len(recs) != 2 || !bytes.Equal(recs[0].Data, ringtest.Pattern(4, 4)) || !bytes.Equal(recs[1].Data, ringtest.Pattern(20, 5)) {
			t.Fatalf("start %d, second lap: %v", start, recs)
		}
	}
}

func TestBPFRingBusy(t *testing.T) {
	f := ringtest.NewRingBuf(4096)
	r := fakeReader(t, f)
	f.Output(t, ringtest.Pattern(8, 1))
	a, _ := f.Reserve(16) // busy
	f.Write(a, ringtest.Pattern(16, 2))
	b, _ := f.Reserve(24)
	f.Write(b, ringtest.Pattern(24, 3))
	f.Commit(b, false) // committed behind a busy one: out of order, as two CPUs do

	r.Begin()
	recs := collect(t, r)
	if len(recs) != 1 || r.Pos() != a || r.Pending() == 0 {
		t.Fatalf("%d records, cursor %d, pending %d; want 1 record, the cursor at the busy one %d", len(recs), r.Pos(), r.Pending(), a)
	}
	var rec Record
	if r.Peek(a, &rec) || r.Peek(b, &rec) == false {
		t.Fatal("peek: the busy record, or the committed one behind it")
	}
	n, _, err := r.Each(&rec, ^uint64(0), nil, func(*Record) error { t.Fatal("fn at a busy record"); return nil }, nil)
	if n != 0 || err != nil {
		t.Fatalf("each at a busy record = %d, %v", n, err)
	}
	f.Commit(a, false)
	recs = collect(t, r)
	if len(recs) != 2 || recs[0].Pos != a || recs[1].Pos != b || !bytes.Equal(recs[1].Data, ringtest.Pattern(24, 3)) {
		t.Fatalf("after the commit: %v", recs)
	}
}

func TestBPFRingDiscard(t *testing.T) {
	f := ringtest.NewRingBuf(4096)
	r := fakeReader(t, f)
	a, _ := f.Reserve(8)
	f.Commit(a, true)
	f.Output(t, ringtest.Pattern(5, 1))
	for range 3 {
		p, _ := f.Reserve(100)
		f.Commit(p, true)
	}
	last := f.Output(t, ringtest.Pattern(6, 2))
	d, _ := f.Reserve(1)
	f.Commit(d, true) // a discarded record at the end

	r.Begin()
	var rec Record
	if !r.Peek(0, &rec) || rec.Pos != 16 || r.counts.Discarded != 0 {
		t.Fatalf("peek over a discarded record: %+v, discarded %d", rec, r.counts.Discarded)
	}
	recs := collect(t, r)
	if len(recs) != 2 || recs[0].Pos != 16 || recs[1].Pos != last || r.counts.Discarded != 5 || r.Pending() != 0 {
		t.Fatalf("records %v, discarded %d, pending %d", recs, r.counts.Discarded, r.Pending())
	}
	// Read again (not committed): not counted again.
	r.Begin()
	if n, _, err := r.Each(&rec, ^uint64(0), nil, func(*Record) error { return nil }, nil); n != 2 || err != nil {
		t.Fatalf("each again = %d, %v", n, err)
	}
	if s := r.Counts(); s.Samples != 2 || s.Bytes != 11 || r.counts.Discarded != 5 {
		t.Fatalf("stats %+v, discarded %d after a second read", s, r.counts.Discarded)
	}
	r.CommitCursor()
	if f.Pos[0] != f.Prod {
		t.Fatalf("consumer_pos %d, want %d: discarded records are committed too", f.Pos[0], f.Prod)
	}
}

// TestBPFRingReadAgain: begin goes back to consumer_pos; records read but not committed are
// read again by each's careful path, then the fast path takes over, each counted once.
func TestBPFRingReadAgain(t *testing.T) {
	f := ringtest.NewRingBuf(4096)
	r := fakeReader(t, f)
	for i := range 6 {
		f.Output(t, ringtest.Pattern(10+i, byte(i)))
	}
	r.Begin()
	var rec Record
	for range 3 {
		if ok, _ := r.Next(&rec); !ok {
			t.Fatal("next")
		}
	}
	_ = r.Commit(rec.Pos) // keep the third one
	r.Begin()
	var got []int
	n, _, err := r.Each(&rec, ^uint64(0), nil, func(rec *Record) error {
		got = append(got, len(rec.Data))
		return nil
	}, nil)

	if n != 4 || err != nil || fmt.Sprint(got) != "[12 13 14 15]" {
		t.Fatalf("each = %d, %v: %v", n, err, got)
	}
	if s := r.Counts(); s.Samples != 6 || s.Bytes != 10+11+12+13+14+15 {
		t.Fatalf("stats %+v", s)
	}
}

func TestBPFRingCommit(t *testing.T) {
	f := ringtest.NewRingBufAt(4096, 800)
	r := fakeReader(t, f)
	p0 := f.Output(t, ringtest.Pattern(8, 1))  // 800..816
	p1 := f.Output(t, ringtest.Pattern(16, 2)) // 816..840
	f.Output(t, ringtest.Pattern(16, 3))       // 840..864
	r.Begin()
	var rec Record
	r.Next(&rec)
	r.Next(&rec) // cursor 840
	for _, bad := range []uint64{792, 0, 864, 841, 820, ^uint64(0)} {
		if err := r.Commit(bad); !errors.Is(err, os.ErrInvalid) || f.Pos[0] != 800 {
			t.Errorf("commit(%d) = %v, consumer_pos %d", bad, err, f.Pos[0])
		}
	}
	if err := r.Commit(p0); err != nil || f.Pos[0] != p0 {
		t.Fatalf("commit(tail) = %v, %d", err, f.Pos[0])
	}
	if err := r.Commit(p1); err != nil || f.Pos[0] != p1 {
		t.Fatalf("commit(%d) = %v, %d", p1, err, f.Pos[0])
	}
	if err := r.Commit(p0); !errors.Is(err, os.ErrInvalid) {
		t.Fatalf("commit backwards = %v", err)
	}
	if err := r.Commit(840); err != nil || f.Pos[0] != 840 {
		t.Fatalf("commit(cursor) = %v, %d", err, f.Pos[0])
	}
	err := r.Commit(1000)
	if err == nil || err.Error() != "commit BPF ring buffer to 1000: past the cursor 840: invalid argument" {
		t.Fatalf("error text %q", err)
	}
}

func TestBPFRingPeek(t *testing.T) {
	f := ringtest.NewRingBuf(4096)
	r := fakeReader(t, f)
	p0 := f.Output(t, ringtest.Pattern(3, 1))
	p1 := f.Output(t, ringtest.Pattern(30, 2))
	r.Begin()
	var rec Record
	if !r.Peek(p1, &rec) || rec.Pos != p1 || !bytes.Equal(rec.Data, ringtest.Pattern(30, 2)) {
		t.Fatalf("peek(%d): %+v", p1, rec)
	}
	if r.Pos() != p0 || r.Counts().Samples != 0 {
		t.Fatal("peek moved the cursor or counted")
	}
	for _, bad := range []uint64{p1 + 4, p1 + 40 + 8, ^uint64(0) - 7} {
		if r.Peek(bad, &rec) {
			t.Errorf("peek(%d) outside [cursor, head] or off the grid", bad)
		}
	}
	r.Next(&rec)
	if r.Peek(p0, &rec) {
		t.Error("peek behind the cursor")
	}
	if r.Peek(r.head, &rec) {
		t.Error("peek at the head")
	}
	// A corrupt record is not peeked at, and peek records no error.
	f.Pos[1] += 8
	f.Put(f.Prod, []byte{64, 0, 0, 0}) // 64 bytes: past the producer
	r.Refresh()
	if r.Peek(p1+40, &rec) || r.corrupt != nil {
		t.Fatal("peek at a corrupt record")
	}
}

func TestBPFRingEachLimitStop(t *testing.T) {
	f := ringtest.NewRingBuf(4096)
	r := fakeReader(t, f)
	for i := range 10 {
		f.Output(t, ringtest.Pattern(8, byte(i))) // 16 bytes each
	}
	r.Begin()
	var rec Record
	count := func(*Record) error { return nil }
	// Records that start within 40 bytes: at 0, 16, 32.
	if n, used, err := r.Each(&rec, 40, nil, count, nil); n != 3 || used != 48 || err != nil || r.Pos() != 48 {
		t.Fatalf("limit 40: %d, %d bytes, %v, cursor %d", n, used, err, r.Pos())
	}
	if n, _, err := r.Each(&rec, 0, nil, count, nil); n != 0 || err != nil {
		t.Fatalf("limit 0: %d, %v", n, err)
	}
	var stop atomic.Bool
	n, _, err := r.Each(&rec, ^uint64(0), &stop, func(rec *Record) error {
		if rec.Pos == 64 {
			stop.Store(true)
		}
		return nil
	}, nil)

	if n != 2 || err != nil || r.Pos() != 80 {
		t.Fatalf("stop: %d, %v, cursor %d", n, err, r.Pos())
	}
	stop.Store(false)
	boom := errors.New("boom")
	n, _, err = r.Each(&rec, ^uint64(0), &stop, func(rec *Record) error {
		if rec.Pos == 112 {
			return boom
		}
		return nil
	}, nil)

	if n != 3 || err != boom || r.Pos() != 128 {
		t.Fatalf("fn error: %d, %v, cursor %d", n, err, r.Pos())
	}
	if s := r.Counts(); s.Samples != 8 {
		t.Fatalf("stats %+v", s)
	}
	// The same on the careful path (records read again after begin).
	r.Begin()
	stop.Store(false)
	n, _, err = r.Each(&rec, 40, &stop, count, nil)
	if n != 3 || err != nil {
		t.Fatalf("careful path, limit 40: %d, %v", n, err)
	}
	n, _, err = r.Each(&rec, ^uint64(0), &stop, func(rec *Record) error { stop.Store(rec.Pos == 64); return nil }, nil)
	if n != 2 || err != nil {
		t.Fatalf("careful path, stop: %d, %v", n, err)
	}
	n, _, err = r.Each(&rec, ^uint64(0), nil, func(rec *Record) error { return boom }, nil)
	if n != 1 || err != boom || r.Pos() != 96 {
		t.Fatalf("careful path, fn error: %d, %v", n, err)
	}
}

// TestBPFRingCorrupt: every position or record that cannot be the kernel's is a
// *CorruptError with its reason, sticky until skipCorrupt, which gets past it.
func TestBPFRingCorrupt(t *testing.T) {
	const size = 256
	for _, tc := range []struct {
		name   string
		setup  func(f *ringtest.RingBuf, r *RingBuf) // after two good records at 0 and 16
		reason string
		good   int    // good records before the error
		pos    uint64 // CorruptError.Pos
		to     uint64 // consumer_pos after SkipCorrupt
		after  int    // records read after it, one more output included
	}{
		{"length past the producer", func(f *ringtest.RingBuf, r *RingBuf) {
			p := f.Output(t, ringtest.Pattern(8, 9))
			f.Put(p, ringtest.U32(9)) // 24 bytes with its header, 16 written
		}, "record length 9 (24 bytes with header and padding) past producer position 48", 2, 32, 48, 1},
		{"huge length", func(f *ringtest.RingBuf, r *RingBuf) {
			p := f.Output(t, ringtest.Pattern(8, 9))
			binary.NativeEndian.PutUint32(f.Data[p:], bpfRingLenMask)
		}, "past producer position", 2, 32, 48, 1},
		// The producer positions that no producer could have written: consumer_pos stays
		// where this reader put it, and reading goes on from there once the producer
		// writes its position again.
		{"producer behind the consumer", func(f *ringtest.RingBuf, r *RingBuf) {
			f.Output(t, nil) // an 8-byte record: 32 to 40
			r.Begin()
			collect(t, r)
			r.CommitCursor() // this reader read up to 40
			f.Pos[1] = 32
		}, "consumer position 40 past producer position 32", 0, 40, 40, 1},
		{"producer a ring ahead", func(f *ringtest.RingBuf, r *RingBuf) {
			f.Pos[1] = size
		}, "producer position 256 a full 256-byte ring or more past consumer position 0", 0, 0, 0, 3},
		{"producer unaligned", func(f *ringtest.RingBuf, r *RingBuf) {
			f.Pos[1] = 36
		}, "producer position 36 not 8-aligned", 0, 0, 0, 3},
		// The consumer positions that the kernel's producer shows wrong: on from it.
		{"consumer unaligned", func(f *ringtest.RingBuf, r *RingBuf) {
			f.Pos[0], r.tail = 4, 4
		}, "consumer position 4 not 8-aligned", 0, 4, 32, 1},
		{"consumer changed by someone else", func(f *ringtest.RingBuf, r *RingBuf) {
			r.fresh = false // a reader that moved consumer_pos before
			f.Pos[0] = 16
		}, "consumer position changed from 0 to 16 by another writer", 0, 16, 32, 1},
		{"consumer more than a ring behind", func(f *ringtest.RingBuf, r *RingBuf) {
			f.Pos[0], r.tail = ^uint64(0)-479, ^uint64(0)-479 // 512 bytes behind
		}, "producer position 32 a full 256-byte ring or more past consumer position 18446744073709551136", 0, ^uint64(0) - 479, 32, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, useEach := range []bool{false, true} {
				f := ringtest.NewRingBuf(size)
				r := fakeReader(t, f)
				f.Output(t, ringtest.Pattern(4, 1))
				f.Output(t, ringtest.Pattern(5, 2))
				tc.setup(f, r)
				r.Begin()
				var rec Record
				var err error
				good := 0
				if useEach {
					good, _, err = r.Each(&rec, ^uint64(0), nil, func(*Record) error { return nil }, nil)
				} else {
					for {
						var ok bool
						if ok, err = r.Next(&rec); !ok {
							break
						}
						good++
					}
				}
				var ce *CorruptError
				if !errors.As(err, &ce) || !errors.Is(err, ErrCorrupt) || !strings.Contains(ce.Reason, tc.reason) ||
					ce.Pos != tc.pos || ce.CPU != -1 || good != tc.good {
					t.Fatalf("each %v: %d good, %v; want %d good, %q at %d", useEach, good, err, tc.good, tc.reason, tc.pos)
				}
				// Sticky, for next, each and peek; settle will not sleep on it; commit goes nowhere.
				if ok, err2 := r.Next(&rec); ok || err2 != err {
					t.Fatalf("next after the error = %v, %v", ok, err2)
				}
				if n, _, err2 := r.Each(&rec, ^uint64(0), nil, func(*Record) error { return nil }, nil); n != 0 || err2 != err {
					t.Fatalf("each after the error = %d, %v", n, err2)
				}
				r.Begin()
				if ok, err2 := bpfSkipGood(r, &rec, tc.good); ok || err2 != err {
					t.Fatalf("after begin: %v, %v", ok, err2)
				}
				if r.Settle() || r.Quiet() {
					t.Fatal("settle or quiet with an error pending")
				}
				resync := tc.to == f.Pos[1]
				want := min(f.Pos[1]-ce.Pos, size)
				if int64(f.Pos[1]-ce.Pos) < 0 || !resync {
					want = 0
				}
				skipped := r.SkipCorrupt()
				if st := r.Counts(); skipped != want || st.Corrupt != 1 || st.CorruptBytes != want {
					t.Fatalf("skipCorrupt = %d (want %d), stats %+v", skipped, want, st)
				}
				if f.Pos[0] != tc.to || r.Pending() != 0 {
					t.Fatalf("after skipCorrupt: consumer_pos %d (want %d), producer_pos %d, pending %d", f.Pos[0], tc.to, f.Pos[1], r.Pending())
				}
				if resync {
					f.Prod = f.Pos[1] // on from there: the producer goes on where it is
				} else { // an ignored producer_pos: nothing new until it moves
					r.Begin()
					if ok, err := r.Next(&rec); ok || err != nil || !r.Settle() {
						t.Fatalf("at the ignored producer position: %v, %v", ok, err)
					}
				}
				p := f.Output(t, ringtest.Pattern(7, 7))
				r.Begin()
				if recs := collect(t, r); len(recs) != tc.after || recs[0].Pos != tc.to || recs[len(recs)-1].Pos != p {
					t.Fatalf("after skipCorrupt: %v", recs)
				}
				r.CommitCursor()
				if !r.Settle() || r.Counts().Corrupt != 1 {
					t.Fatal("not settled after the recovery")
				}
			}
		})
	}
}

// bpfSkipGood reads n good records, then one more.
func bpfSkipGood(r *RingBuf, rec *Record, n int) (bool, error) {
	for range n {
		if ok, err := r.Next(rec); !ok {
			return ok, err
		}
	}
	return r.Next(rec)
}

// TestBPFRingMovedBack: a producer position behind the previous snapshot is
// passed over; the records before the snapshot are read once it is valid again.
func TestBPFRingMovedBack(t *testing.T) {
	f := ringtest.NewRingBuf(256)
	r := fakeReader(t, f)
	f.Output(t, ringtest.Pattern(4, 1))
	f.Output(t, ringtest.Pattern(4, 2))
	r.Begin()
	f.Pos[1] = 16
	r.Refresh()
	var rec Record
	_, err := r.Next(&rec)
	var ce *CorruptError
	if !errors.As(err, &ce) || ce.Reason != "producer position 16 moved back from 32" {
		t.Fatalf("next = %v", err)
	}
	if r.SkipCorrupt() != 0 || f.Pos[0] != 0 {
		t.Fatalf("skipCorrupt: consumer_pos %d", f.Pos[0])
	}
	p := f.Output(t, ringtest.Pattern(4, 3))
	r.Begin()
	if recs := collect(t, r); len(recs) != 3 || recs[0].Pos != 0 || recs[2].Pos != p {
		t.Fatalf("after the producer wrote again: %v", recs)
	}
}

// TestBPFRingSkipKeepsConsumer: after a producer position that no producer could
// have written, SkipCorrupt never stores it as consumer_pos. One behind what the
// reader read used to move consumer_pos back (records delivered twice); one a ring
// or more ahead used to put consumer_pos past the kernel's producer, which then
// refused every output as full. The reader keeps its position, commits what it
// parsed, and reads on from there, each record once, when the producer writes again.
func TestBPFRingSkipKeepsConsumer(t *testing.T) {
	const size = 256
	for _, tc := range []struct {
		name   string
		lie    func(p uint64) uint64 // the bad producer_pos, from the kernel's
		commit bool                  // the reader committed what it read before the lie
		reason string
	}{
		{"behind, committed", func(p uint64) uint64 { return p - 16 }, true, "past producer position"},
		{"behind, not committed", func(p uint64) uint64 { return p - 16 }, false, "moved back"},
		{"back to the start", func(p uint64) uint64 { return 0 }, true, "past producer position"},
		{"a ring ahead", func(p uint64) uint64 { return p + size }, true, "a full 256-byte ring or more"},
		{"a ring ahead, not committed", func(p uint64) uint64 { return p + size }, false, "a full 256-byte ring or more"},
		{"far ahead", func(p uint64) uint64 { return p + 1<<40 }, true, "a full 256-byte ring or more"},
		{"unaligned", func(p uint64) uint64 { return p + 4 }, true, "not 8-aligned"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := ringtest.NewRingBufAt(size, 1<<20)
			r := fakeReader(t, f)
			var delivered []uint64
			start := r.Begin
			read := func() error {
				start()
				for {
					var rec Record
					ok, err := r.Next(&rec)
					if err != nil || !ok {
						return err
					}
					delivered = append(delivered, rec.Pos)
				}
			}
			for i := range 3 {
				f.Output(t, ringtest.Pattern(4, byte(i)))
			}
			if err := read(); err != nil {
				t.Fatal(err)
			}
			if tc.commit {
				r.CommitCursor()
			}
			if !tc.commit {
				// Records parsed and not committed, as a RawBuffer holds them: a new
				// snapshot, not a Begin, meets the lie.
				start = r.Refresh
			}
			kernel := f.Pos[1]
			f.Pos[1] = tc.lie(kernel)
			err := read()
			var ce *CorruptError
			if !errors.As(err, &ce) || !strings.Contains(ce.Reason, tc.reason) {
				t.Fatalf("read at the bad producer position: %v; want %q", err, tc.reason)
			}
			if skipped := r.SkipCorrupt(); skipped != 0 || f.Pos[0] != kernel {
				t.Errorf("skipCorrupt = %d, consumer_pos %d; want 0, %d (what the reader read)", skipped, f.Pos[0], kernel)
			}
			// Passed over: the ring reads as empty while producer_pos keeps that value.
			if err := read(); err != nil || !r.Settle() || !r.Quiet() {
				t.Fatalf("at the passed-over producer position: %v", err)
			}
			// The kernel reserves again (it checks its own position against
			// consumer_pos) and publishes its producer_pos.
			pos, ok := f.Reserve(4)
			if !ok {
				t.Fatalf("the producer refused as full: consumer_pos %d, producer %d", f.Pos[0], f.Prod)
			}
			f.Write(pos, ringtest.Pattern(4, 9))
			f.Commit(pos, false)
			if err := read(); err != nil {
				t.Fatal(err)
			}
			if fmt.Sprint(delivered) != fmt.Sprint([]uint64{1 << 20, 1<<20 + 16, 1<<20 + 32, pos}) {
				t.Fatalf("delivered %v; want each record once", delivered)
			}
			if st := r.Counts(); st.Corrupt != 1 || st.CorruptBytes != 0 || st.Samples != 4 {
				t.Fatalf("stats %+v", st)
			}
		})
	}
}

// A consumer_pos that another consumer wrote is a position error for Refresh,
// as for Begin, and a commit does not write over it: it becomes that error
// (a commit used to store its own position over the other consumer's, so
// that the records that consumer took were delivered again, unreported).
// SkipCorrupt then takes the ring on from producer_pos.
func TestBPFRingAnotherConsumer(t *testing.T) {
	for _, step := range []string{"Refresh", "Commit", "Settle"} {
		t.Run(step, func(t *testing.T) {
			f := ringtest.NewRingBuf(256)
			r := fakeReader(t, f)
			for i := range 4 {
				f.Output(t, ringtest.Pattern(8, byte(i))) // 16 bytes each
			}
			r.Begin()
			var rec Record
			if ok, err := r.Next(&rec); !ok || err != nil {
				t.Fatalf("next = %v, %v", ok, err)
			}
			if step == "Settle" {
				r.CommitCursor()
			}
			atomic.StoreUint64(&f.Pos[0], 48) // another consumer took the records at 16 and 32
			switch step {
			case "Refresh":
				r.Refresh()
			case "Commit":
				if err := r.Commit(rec.Next); err != nil {
					t.Fatal(err)
				}
				if c := atomic.LoadUint64(&f.Pos[0]); c != 48 {
					t.Fatalf("consumer_pos %d after the commit: written over the other consumer's 48", c)
				}
			case "Settle":
				if r.Settle() {
					t.Fatal("settled over a consumer_pos another consumer wrote")
				}
			}
			_, err := r.Next(&rec)
			var ce *CorruptError
			if !errors.As(err, &ce) || ce.Reason != "consumer position changed from "+fmt.Sprint(r.Tail())+" to 48 by another writer" {
				t.Fatalf("next = %v; want consumer_pos changed by another writer", err)
			}
			r.SkipCorrupt()
			if c, p := atomic.LoadUint64(&f.Pos[0]), atomic.LoadUint64(&f.Pos[1]); c != 64 || p != 64 || r.Pos() != 64 || r.Tail() != 64 {
				t.Fatalf("after SkipCorrupt: consumer_pos %d, producer_pos %d, cursor %d, tail %d", c, p, r.Pos(), r.Tail())
			}
		})
	}
}

// TestBPFRingSettle checks settle's contract case by case.
func TestBPFRingSettle(t *testing.T) {
	type ring struct {
		f *ringtest.RingBuf
		r *RingBuf
	}
	setup := func() ring {
		f := ringtest.NewRingBuf(4096)
		return ring{f, fakeReader(t, f)}
	}
	drain := func(x ring) {
		x.r.Begin()
		if _, _, err := x.r.Each(&Record{}, ^uint64(0), nil, func(*Record) error { return nil }, nil); err != nil && !errors.Is(err, ErrCorrupt) {
			t.Fatal(err)
		}
		x.r.CommitCursor()
	}
	for _, tc := range []struct {
		name string
		run  func(x ring) // leaves the ring for settle
		want bool
	}{
		{"empty", func(x ring) { x.r.Begin() }, true},
		{"drained and committed", func(x ring) { x.f.Output(t, []byte{1}); drain(x) }, true},
		{"at a busy record", func(x ring) { x.f.Reserve(8); drain(x) }, true},
		{"committed behind a busy one", func(x ring) {
			x.f.Reserve(8)
			p, _ := x.f.Reserve(8)
			x.f.Commit(p, false)
			drain(x)
		}, true},
		{"parsed, not committed", func(x ring) {
			x.f.Output(t, []byte{1})
			x.r.Begin()
			collect(t, x.r)
		}, false},
		{"committed partly", func(x ring) {
			x.f.Output(t, []byte{1})
			x.f.Output(t, []byte{2})
			x.r.Begin()
			recs := collect(t, x.r)
			_ = x.r.Commit(recs[0].Next)
		}, false},
		{"not parsed", func(x ring) { x.r.Begin(); x.f.Output(t, []byte{1}); x.r.Refresh() }, false},
		{"reserved after the snapshot", func(x ring) { drain(x); x.f.Reserve(8) }, false},
		{"committed after the snapshot", func(x ring) { drain(x); x.f.Output(t, []byte{1}) }, false},
		{"busy record committed since", func(x ring) {
			p, _ := x.f.Reserve(8)
			drain(x)
			x.f.Commit(p, false)
		}, false},
		{"busy record discarded since", func(x ring) {
			p, _ := x.f.Reserve(8)
			drain(x)
			x.f.Commit(p, true)
		}, false},
		{"error pending", func(x ring) {
			x.f.Output(t, []byte{1})
			x.f.Put(16, ringtest.U32(64)) // 72 bytes with its header, 8 published
			x.f.Pos[1] += 8
			drain(x)
		}, false},
	} {
		x := setup()
		tc.run(x)
		tail := x.r.tail
		if got := x.r.Settle(); got != tc.want {
			t.Errorf("%s: settle = %v, want %v", tc.name, got, tc.want)
		}
		if x.f.Pos[0] != tail {
			t.Errorf("%s: consumer_pos %d, want the tail %d", tc.name, x.f.Pos[0], tail)
		}
	}

	// Someone else wrote consumer_pos: an error, and no sleep.
	x := setup()
	x.f.Output(t, []byte{1})
	drain(x)
	x.f.Pos[0] = 0
	if x.r.Settle() {
		t.Fatal("settle with consumer_pos changed by another writer")
	}
	var rec Record
	if _, err := x.r.Next(&rec); !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), "by another writer") {
		t.Fatalf("next = %v", err)
	}
}

// TestBPFRingUsedQuiet: used loads both positions afresh and clamps; quiet sees a moved
// producer position.
func TestBPFRingUsedQuiet(t *testing.T) {
	f := ringtest.NewRingBuf(256)
	r := fakeReader(t, f)
	f.Output(t, ringtest.Pattern(10, 1))
	if r.Used() != 24 || r.Quiet() {
		t.Fatalf("used %d, quiet %v", r.Used(), r.Quiet())
	}
	r.Begin()
	collect(t, r)
	if !r.Quiet() {
		t.Fatal("not quiet at the head")
	}
	f.Pos[1] = 1000
	if r.Used() != 256 || r.Quiet() {
		t.Fatalf("used %d (want clamped to 256), quiet %v", r.Used(), r.Quiet())
	}
	f.Pos[0] = 2000
	if r.Used() != 0 {
		t.Fatalf("used %d with consumer_pos past producer_pos", r.Used())
	}
}

// TestBPFRingClose: close switches to memory of its own (an empty ring) and may be called
// again.
func TestBPFRingClose(t *testing.T) {
	f := ringtest.NewRingBuf(256)
	r := fakeReader(t, f)
	f.Output(t, ringtest.Pattern(10, 1))
	for range 2 {
		if err := r.Close(); err != nil {
			t.Fatal(err)
		}
	}
	r.Begin()
	var rec Record
	if ok, err := r.Next(&rec); ok || err != nil || r.Used() != 0 || !r.Settle() {
		t.Fatalf("after close: %v, %v", ok, err)
	}
	if f.Pos[0] != 0 {
		t.Fatal("close wrote consumer_pos")
	}
}

// wakeModel is the deterministic test of the wake rule. A reader loop (begin, each, commit,
// settle, sleep) runs against a producer script whose steps (reserve, commit, discard) are
// interleaved with the reader at every point where the kernel's accesses can fall between
// the reader's: before begin, between each and the commit, between the commit and settle,
// inside settle between its store of consumer_pos and its second look (settleHook), and
// while the reader sleeps. A sleeping reader wakes only on a wakeup raised after settle's
// store (stricter than the kernel, whose epoll also reports a ring with data when a wakeup
// came earlier). The model fails when the reader sleeps and the script ends with a sample
// readable (committed, not behind a busy record) that no wakeup announced.
type wakeOp struct {
	op  byte // 'r' reserve, 'c' commit, 'd' discard
	rec int  // which record (in reservation order)
}

type wakeModel struct {
	script []wakeOp
	// settle is the rule under test; hold makes the first drain deliver its records but
	// commit none (a policy that holds records for ordering, say).
	settle func(r *RingBuf) bool
	hold   bool
}

// run runs the script with k[i] steps at the reader's i-th interleaving point (none past
// k's end, but while the reader sleeps). It returns an error for a lost wakeup or a wrong
// delivery, and whether the run reached every point k names (false: it ended first).
func (m wakeModel) run(k []int) (error, bool) {
	f := ringtest.NewRingBuf(256)
	r, err := NewRingBufFromParts(-1, &f.Pos[0], &f.Pos[1], f.Data)
	if err != nil {
		return err, false
	}
	var pos []uint64
	step := 0
	runSteps := func(n int) {
		for ; n > 0 && step < len(m.script); n-- {
			s := m.script[step]
			step++
			switch s.op {
			case 'r':
				p, ok := f.Reserve(8)
				if !ok {
					panic("ring full")
				}
				f.Write(p, []byte{byte(s.rec), 0, 0, 0, 0, 0, 0, 0})
				pos = append(pos, p)
			case 'c', 'd':
				f.Commit(pos[s.rec], s.op == 'd')
			}
		}
	}
	point := 0
	interleave := func() { // the steps at the next interleaving point
		if point < len(k) {
			runSteps(k[point])
		}
		point++
	}
	var got []int
	var delivered uint64 // the end of the last record delivered
	wakeAt := int64(-1)  // f.Wakes at settle's store
	r.SettleHook = func() { wakeAt = f.Wakes.Load(); interleave() }
	held := m.hold
	for round := 0; ; round++ {
		if round > 4*len(m.script)+8 {
			return fmt.Errorf("reader did not finish: steps %d of %d, got %v", step, len(m.script), got), true
		}
		interleave()
		r.Begin()
		if _, _, err := r.Each(&Record{}, ^uint64(0), nil, func(rec *Record) error {
			if rec.Pos >= delivered {
				got = append(got, int(rec.Data[0]))
				delivered = rec.Next
			}
			return nil
		}, nil); err != nil {
			return err, true
		}
		interleave()
		if held {
			held = false // delivered, not committed: read again next time
		} else {
			r.CommitCursor()
		}
		interleave()
		if step == len(m.script) && r.cursor == r.tail && r.Quiet() {
			break // all done
		}
		wakeAt = -1
		if !m.settle(r) {
			continue
		}
		if wakeAt < 0 {
			return fmt.Errorf("settle returned true without its store"), true
		}
		// Asleep: the producer goes on. A wakeup since the store ends the sleep.
		for f.Wakes.Load() == wakeAt && step < len(m.script) {
			runSteps(1)
		}
		if f.Wakes.Load() == wakeAt {
			if readable := bpfReadable(f, r); readable >= 0 {
				return fmt.Errorf("lost wakeup: sample %d readable at %d, the reader asleep (got %v)", readable, r.cursor, got), true
			}
			if step == len(m.script) {
				break // nothing more will come
			}
		}
	}
	// Every committed sample arrived once, in reservation order.
	var want []int
	for i := range pos {
		if kind, _, _ := bpfAtRing(f, pos[i]); kind == atSample {
			want = append(want, i)
		}
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		return fmt.Errorf("got %v, want %v", got, want), true
	}
	return nil, point >= len(k)
}

// bpfAtRing reads the record at pos as the fake's producer left it.
func bpfAtRing(f *ringtest.RingBuf, pos uint64) (int, uint32, uint64) {
	hdr := binary.NativeEndian.Uint32(f.Data[pos&(f.Size-1):])
	switch {
	case hdr&bpfRingBusyBit != 0:
		return atBusy, hdr, 0
	case hdr&bpfRingDiscardBit != 0:
		return atDiscard, hdr, (uint64(hdr&bpfRingLenMask) + 15) &^ 7
	}
	return atSample, hdr, (uint64(hdr&bpfRingLenMask) + 15) &^ 7
}

// bpfReadable returns the sample the reader could read next from its cursor (skipping
// discarded records, stopping at a busy one), or -1.
func bpfReadable(f *ringtest.RingBuf, r *RingBuf) int {
	for p := r.cursor; p != f.Prod; {
		kind, _, size := bpfAtRing(f, p)
		switch kind {
		case atBusy:
			return -1
		case atSample:
			return int(f.Data[(p+8)&(f.Size-1)])
		}
		p += size
	}
	return -1
}

// explore runs every schedule of the script (every split of its steps over the
// interleaving points) and returns the first failure.
func (m wakeModel) explore() (int, error) {
	schedules := 0
	var rec func(k []int) error
	rec = func(k []int) error {
		left := len(m.script)
		for _, n := range k {
			left -= n
		}
		for n := 0; n <= left; n++ {
			kk := append(k[:len(k):len(k)], n)
			schedules++
			err, used := m.run(kk)
			if err != nil {
				return fmt.Errorf("schedule %v: %w", kk, err)
			}
			if used && n < left {
				if err := rec(kk); err != nil {
					return err
				}
			}
		}
		return nil
	}
	return schedules, rec(nil)
}

var wakeScripts = [][]wakeOp{
	{{'r', 0}, {'c', 0}},
	{{'r', 0}, {'c', 0}, {'r', 1}, {'c', 1}},
	{{'r', 0}, {'r', 1}, {'c', 1}, {'c', 0}},
	{{'r', 0}, {'r', 1}, {'c', 0}, {'c', 1}},
	{{'r', 0}, {'d', 0}, {'r', 1}, {'c', 1}},
	{{'r', 0}, {'r', 1}, {'c', 1}, {'d', 0}},
	{{'r', 0}, {'r', 1}, {'r', 2}, {'c', 2}, {'c', 0}, {'d', 1}}, // last: 150,000 schedules
}

func TestBPFRingWakeRule(t *testing.T) {
	total := 0
	scripts := wakeScripts
	if testing.Short() || ringtest.RaceEnabled() {
		scripts = scripts[:len(scripts)-1]
	}
	for _, hold := range []bool{false, true} {
		for _, script := range scripts {
			m := wakeModel{script: script, settle: (*RingBuf).Settle, hold: hold}
			n, err := m.explore()
			if err != nil {
				t.Errorf("hold %v, script %v: %v", hold, script, err)
			}
			total += n
		}
	}
	t.Logf("%d schedules", total)
}

// TestBPFRingWakeRuleCatches shows that the model finds the lost wakeups of settle rules
// that leave out a condition: the test of the real rule can fail.
func TestBPFRingWakeRuleCatches(t *testing.T) {
	for _, tc := range []struct {
		name   string
		settle func(r *RingBuf) bool
		hold   bool
	}{
		// Sleeping with records parsed but not committed: the kernel wakes no one.
		{"without tail == cursor", func(r *RingBuf) bool {
			r.store(r.tail)
			r.SettleHook()
			return !r.moved(r.loadProducer()) && (r.cursor == r.head || r.loadHeader(r.cursor)&bpfRingBusyBit != 0)
		}, true},
		// Trusting the drain's view of the record at the cursor: a commit that came
		// while consumer_pos was still behind it raised no wakeup.
		{"without the second look at the header", func(r *RingBuf) bool {
			r.store(r.tail)
			r.SettleHook()
			return r.tail == r.cursor && !r.moved(r.loadProducer())
		}, false},
		// Trusting the head snapshot: a record reserved and committed after it, while
		// consumer_pos was still behind it, raised no wakeup.
		{"without the second look at producer_pos", func(r *RingBuf) bool {
			r.store(r.tail)
			r.SettleHook()
			return r.tail == r.cursor && (r.cursor == r.head || r.loadHeader(r.cursor)&bpfRingBusyBit != 0)
		}, false},
	} {
		found := false
		for _, script := range wakeScripts {
			if _, err := (wakeModel{script: script, settle: tc.settle, hold: tc.hold}).explore(); err != nil {
				t.Logf("%s: %v", tc.name, err)
				found = true
				break
			}
		}
		if !found {
			t.Errorf("%s: no lost wakeup found", tc.name)
		}
	}
}

// bpfBenchRing fills a 256 KiB ring so that each half holds the same samples of the given
// size, plus one discarded record that pads the half: the benchmark hands the reader half a
// ring at a time (a whole one would be more than the kernel ever publishes) by moving
// producer_pos on.
func bpfBenchRing(b *testing.B, payload int) (*ringtest.RingBuf, int) {
	const size = 256 << 10
	f := ringtest.NewRingBuf(size)
	p := make([]byte, payload)
	for i := range p {
		p[i] = byte(i)
	}
	rec := (uint64(payload) + 15) &^ 7
	n := 0
	for half := range 2 {
		end := uint64(half+1) * size / 2
		f.Prod = uint64(half) * size / 2
		n = 0
		for f.Prod+rec <= end-8 {
			pos, _ := f.Reserve(payload)
			f.Write(pos, p)
			f.Commit(pos, false)
			f.Pos[0] = f.Prod // as if read
			n++
		}
		pad := end - f.Prod - 8
		pos, _ := f.Reserve(int(pad))
		f.Commit(pos, true)
		f.Pos[0] = f.Prod
	}
	if f.Prod != size {
		b.Fatalf("ring filled to %d", f.Prod)
	}
	f.Pos[0], f.Pos[1] = 0, 0
	return f, n
}

// BenchmarkBPFRingEach drains fake ring buffers with Each: a function that
// reads every byte (fn), or a Sink that copies 64 records at a time and a
// second pass over the copies that reads every byte (copy: ReadBatch's
// loop).
func BenchmarkBPFRingEach(b *testing.B) {
	for _, mode := range []string{"fn", "copy"} {
		for _, payload := range []int{16, 64, 256, 1024} {
			b.Run(fmt.Sprintf("%s/%d", mode, payload), func(b *testing.B) {
				benchBPFRingEach(b, payload, mode == "copy")
			})
		}
	}
}

func benchBPFRingEach(b *testing.B, payload int, copying bool) {
	f, perHalf := bpfBenchRing(b, payload)
	r := fakeReader(b, f)
	var sum uint64
	fn := func(rec *Record) error {
		sum += ringtest.Sum(rec.Data)
		return nil
	}
	sink := Sink{Into: make([]Copy, 64)}
	half := uint64(r.Size() / 2)
	var rec Record
	samples := 0
	var elapsed time.Duration
	b.ReportAllocs()
	b.ResetTimer()
	for samples < b.N {
		// The next half ring: a release store of producer_pos, as __bpf_ringbuf_reserve's.
		atomic.StoreUint64(&f.Pos[1], r.tail+half)
		start := time.Now()
		r.Begin()
		n := 0
		var err error
		if copying {
			for k := -1; k != 0 && err == nil; {
				sink.N, sink.Room = 0, 8<<10
				k, _, err = r.Each(&rec, ^uint64(0), nil, nil, &sink)
				for i := range sink.Into[:sink.N] {
					sum += ringtest.Sum(sink.Into[i].Data)
				}
				n += k
			}
		} else {
			n, _, err = r.Each(&rec, ^uint64(0), nil, fn, nil)
		}
		r.CommitCursor()
		elapsed += time.Since(start)
		if err != nil || n != perHalf {
			b.Fatalf("each = %d, %v; want %d", n, err, perHalf)
		}
		samples += n
	}
	b.StopTimer()
	ringtest.Sink += sum
	st := r.Counts()
	if st.Samples != uint64(samples) {
		b.Fatalf("stats: %d samples, want %d", st.Samples, samples)
	}
	b.ReportMetric(float64(elapsed.Nanoseconds())/float64(samples), "ns/record")
	b.ReportMetric(float64(st.Bytes)/elapsed.Seconds()/1e6, "MB/s")
}

// TestBPFRingMmap maps a real BPF ring buffer map (root or CAP_BPF): the offsets, lengths
// and protections newBPFRing asks for are the kernel's; an empty ring reads as empty.
func TestBPFRingMmap(t *testing.T) {
	size := 4 * os.Getpagesize()
	// BPF_MAP_CREATE: union bpf_attr { u32 map_type, key_size, value_size, max_entries; ... }.
	attr := [16]uint32{27, 0, 0, uint32(size)} // BPF_MAP_TYPE_RINGBUF
	fd, _, errno := unix.Syscall(unix.SYS_BPF, 0, uintptr(unsafe.Pointer(&attr)), unsafe.Sizeof(attr))
	if errno != 0 {
		t.Skipf("cannot create a BPF ring buffer map: %v", errno)
	}
	defer unix.Close(int(fd))
	r, err := NewRingBuf(-1, int(fd), size)
	if err != nil {
		t.Fatal(err)
	}
	if r.Size() != size || len(r.data) != 2*size || r.Used() != 0 {
		t.Fatalf("size %d, data %d, used %d", r.Size(), len(r.data), r.Used())
	}
	r.Begin()
	var rec Record
	if ok, err := r.Next(&rec); ok || err != nil || !r.Settle() || !r.Quiet() {
		t.Fatalf("empty ring: %v, %v", ok, err)
	}
	// The double mapping: both copies are the same pages.
	if r.data[0] != r.data[size] || r.data[size-1] != r.data[2*size-1] {
		t.Fatal("copies differ")
	}
	// consumer_pos is ours to write (settle stored it); producer_pos is read-only.
	if m, err := unix.Mmap(int(fd), int64(os.Getpagesize()), os.Getpagesize(), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED); err == nil {
		_ = unix.Munmap(m)
		t.Error("the producer page mapped writable")
	}
	if r2, err := NewRingBuf(-1, int(fd), 2*size); err == nil {
		_ = r2.Close()
		t.Error("mapped past the map's end")
	}
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	if err := r.Close(); err != nil || r.Used() != 0 {
		t.Fatalf("second close: %v", err)
	}
}

// What the owner asks of a ring buffer beside a policy's reads: Progress
// (producer_pos, plus one while the record at consumer_pos is busy),
// Stalled and Reached at a busy record, Left up to the first busy record,
// and a View with positions of its own.
func TestBPFRingOwner(t *testing.T) {
	f := ringtest.NewRingBuf(4096)
	r := fakeReader(t, f)
	r.SetIndex(3)
	if r.Cur() != &r.Cursor {
		t.Fatal("Cur is not the ring's cursor")
	}
	f.Output(t, ringtest.Pattern(8, 1)) // 16 bytes at 0
	pos, ok := f.Reserve(8)             // busy at 16
	if !ok {
		t.Fatal("no room")
	}
	f.Write(pos, ringtest.Pattern(8, 2))
	if p := r.Progress(); p != 32 {
		t.Fatalf("Progress = %d, want 32 (the record at consumer_pos is committed)", p)
	}
	if s, l, d := r.Left(0); s != 1 || l != 0 || d != 0 {
		t.Fatalf("Left(0) = %d, %d, %d; want 1, 0, 0 (the busy record ends the count)", s, l, d)
	}
	r.Begin()
	if recs := collect(t, r); len(recs) != 1 {
		t.Fatalf("%d records before the busy one", len(recs))
	}
	r.CommitCursor()
	mark := r.LoadHead()
	if p := r.Progress(); p != mark+1 || !r.Stalled() {
		t.Fatalf("Progress = %d, stalled %v at a busy record; want %d, true", p, r.Stalled(), mark+1)
	}
	if !r.Reached(16, mark) {
		t.Fatal("not reached while stalled at the oldest record")
	}

	f.Commit(pos, true) // discarded
	if p := r.Progress(); p != mark || r.Stalled() || r.Reached(16, mark) {
		t.Fatalf("after the discard: Progress %d, stalled %v, reached %v", p, r.Stalled(), r.Reached(16, mark))
	}
	if s, _, d := r.Left(16); s != 0 || d != 1 {
		t.Fatalf("Left(16) = %d samples, %d discarded; want 0, 1", s, d)
	}

	v, err := r.View()
	if err != nil {
		t.Fatal(err)
	}
	v.Begin()
	if ok, err := v.Next(new(Record)); ok || err != nil || v.Cur().Index() != 3 || v.Cur().Counts().Discarded != 1 {
		t.Fatalf("view: Next = %v, %v; index %d, counts %+v", ok, err, v.Cur().Index(), v.Cur().Counts())
	}
	if r.Pos() != 16 {
		t.Fatalf("the view moved the owner's cursor to %d", r.Pos())
	}

	// consumer_pos past producer_pos, as another writer left it: nothing left,
	// and not reached.
	atomic.StoreUint64(&f.Pos[0], 40)
	if s, _, d := r.Left(16); s != 0 || d != 0 {
		t.Fatalf("Left with consumer_pos past producer_pos = %d, %d", s, d)
	}
	if r.Reached(mark, mark) {
		t.Fatal("reached with consumer_pos written by another")
	}
}

// A reader that has parsed nothing and moved consumer_pos never takes the
// consumer_pos it finds as its start, when another reader can have left it
// (ahead, aligned, behind producer_pos): an agent's upgrade, where the new
// reader opened while the old one still read and committed. It delivers
// from there, with no error. Once it parsed a record, or for a position no
// reader leaves, the move is reported (another writer). (The new reader
// used to report the old one's commits as corruption.)
func TestBPFRingAdoptsPreviousReader(t *testing.T) {
	const size = 256
	read := func(r *RingBuf) (seqs []uint64, err error) {
		r.Begin()
		var rec Record
		for {
			ok, err := r.Next(&rec)
			if err != nil || !ok {
				r.CommitCursor()
				return seqs, err
			}
			seqs = append(seqs, uint64(rec.Data[0]))
		}
	}
	t.Run("fresh", func(t *testing.T) {
		f := ringtest.NewRingBuf(size)
		r := fakeReader(t, f) // opened at 0
		for i := range 3 {
			f.Output(t, ringtest.Pattern(8, byte(i)))
		}
		f.Pos[0] = 32 // the previous reader took two records of 16 bytes
		seqs, err := read(r)
		if err != nil || len(seqs) != 1 || seqs[0] != 2 {
			t.Fatalf("read %v, %v; want the third record alone, no error", seqs, err)
		}
		if f.Pos[0] != f.Pos[1] {
			t.Errorf("consumer_pos %d, producer_pos %d: want all committed", f.Pos[0], f.Pos[1])
		}
		f.Output(t, ringtest.Pattern(8, 3))
		f.Pos[0] += 16 // now a second consumer: the reader moved consumer_pos
		if _, err := read(r); !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), "by another writer") {
			t.Errorf("after the reader committed: %v, want another writer reported", err)
		}
	})
	for _, tc := range []struct {
		name string
		pos  func(f *ringtest.RingBuf) uint64
	}{
		{"back", func(*ringtest.RingBuf) uint64 { return 0 }},
		{"unaligned", func(*ringtest.RingBuf) uint64 { return 20 }},
		{"past producer_pos", func(f *ringtest.RingBuf) uint64 { return f.Pos[1] + 16 }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := ringtest.NewRingBuf(size)
			f.Output(t, ringtest.Pattern(8, 0))
			f.Pos[0] = 16 // opened after the first record was consumed
			r := fakeReader(t, f)
			f.Output(t, ringtest.Pattern(8, 1))
			f.Pos[0] = tc.pos(f)
			if _, err := read(r); !errors.Is(err, ErrCorrupt) {
				t.Errorf("consumer_pos moved to %d before the first read: %v, want a CorruptError", f.Pos[0], err)
			}
		})
	}
	t.Run("parsed", func(t *testing.T) {
		f := ringtest.NewRingBuf(size)
		r := fakeReader(t, f)
		f.Output(t, ringtest.Pattern(8, 0))
		f.Output(t, ringtest.Pattern(8, 1))
		r.Begin()
		var rec Record
		if ok, err := r.Next(&rec); !ok || err != nil {
			t.Fatalf("Next: %v, %v", ok, err)
		}
		f.Pos[0] = 16 // the record the reader parsed, taken by another
		r.Refresh()
		if ok, err := r.Next(&rec); ok || !errors.Is(err, ErrCorrupt) {
			t.Errorf("after a parse: %v, %v; want another writer reported", ok, err)
		}
	})
}

// Restart starts a reader afresh at the consumer_pos in the map, whatever
// the reader saw before: a reader that takes a ring over from another
// consumer (its consumer lock won) starts at that consumer's last commit.
// Positions the reader could not adopt at its first read (a move back; an
// error pending since it was made; a record parsed) are no error after a
// Restart.
func TestBPFRingRestart(t *testing.T) {
	const size = 256
	for _, tc := range []struct {
		name   string
		openAt uint64 // consumer_pos when the reader is made
		parse  bool   // the reader parses a record before
		at     uint64 // the other consumer's last commit
	}{
		{"moved", 0, false, 32},
		{"moved back", 32, false, 16},
		{"bad at opening", 20, false, 16},
		{"parsed", 0, true, 32},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := ringtest.NewRingBuf(size)
			for i := range 4 {
				f.Output(t, ringtest.Pattern(8, byte(i)))
			}
			f.Pos[0] = tc.openAt
			r := fakeReader(t, f)
			if tc.parse {
				r.Begin()
				var rec Record
				if ok, err := r.Next(&rec); !ok || err != nil {
					t.Fatalf("Next: %v, %v", ok, err)
				}
			}
			f.Pos[0] = tc.at
			r.Restart()
			if r.Failed() || r.Tail() != tc.at || r.Pos() != tc.at {
				t.Fatalf("after Restart: failed %v, tail %d, cursor %d; want no error, both %d", r.Failed(), r.Tail(), r.Pos(), tc.at)
			}
			if samples, _, _ := r.Left(r.Tail()); samples != 4-tc.at/16 {
				t.Errorf("Left %d, want %d", samples, 4-tc.at/16)
			}
			r.Begin()
			var rec Record
			for want := tc.at / 16; want < 4; want++ {
				if ok, err := r.Next(&rec); !ok || err != nil || rec.Data[0] != byte(want) {
					t.Fatalf("Next: %v, %v, %v; want record %d", ok, err, rec.Data, want)
				}
			}
			r.CommitCursor()
			if f.Pos[0] != f.Pos[1] {
				t.Errorf("consumer_pos %d, want %d", f.Pos[0], f.Pos[1])
			}
		})
	}
}

// HoldBack: a commit up to the head snapshot stores the start of the last record as
// consumer_pos, so that the producer's next commits wake nobody; Positions and Used show
// the record as delivered; Begin reads on after it, never delivering it again; a commit
// short of the head, Settle and Release store the tail. A discarded record last is held
// back as a sample is.
func TestBPFRingHoldBack(t *testing.T) {
	f := ringtest.NewRingBuf(4096)
	r := fakeReader(t, f)
	r.HoldBack = true
	seqs := func() []byte {
		t.Helper()
		r.Begin()
		var got []byte
		for _, rec := range collect(t, r) {
			got = append(got, rec.Data[0])
		}
		r.CommitCursor()
		return got
	}
	// shows checks consumer_pos, Held, and that Positions and Used show waiting bytes.
	shows := func(what string, consumer uint64, held bool, waiting int) {
		t.Helper()
		c, p := r.Positions()
		if got := atomic.LoadUint64(&f.Pos[0]); got != consumer || r.Held() != held || p-c != uint64(waiting) || r.Used() != waiting {
			t.Fatalf("%s: consumer_pos %d, held %v, Positions %d %d, Used %d; want consumer_pos %d, held %v, %d bytes waiting",
				what, got, r.Held(), c, p, r.Used(), consumer, held, waiting)
		}
	}

	f.Output(t, []byte{1})
	last := f.Output(t, []byte{2})
	if got := seqs(); string(got) != "\x01\x02" {
		t.Fatalf("first read %v", got)
	}
	shows("after the first read", last, true, 0)
	f.Output(t, []byte{3})
	f.Output(t, []byte{4})
	if w := f.Wakes.Load(); w != 1 {
		t.Fatalf("%d wakeups raised; want the first record's only", w)
	}
	if got := seqs(); string(got) != "\x03\x04" {
		t.Fatalf("the read after a hold: %v; want 3 4, none again", got)
	}
	if r.Quiet() != true {
		t.Error("a ring read to its end, a record held back, is not quiet")
	}

	// Settle stores the tail: the next record wakes the reader.
	if !r.Settle() {
		t.Fatal("Settle of a ring read to its end")
	}
	shows("after Settle", f.Prod, false, 0)
	f.Output(t, []byte{5})
	if w := f.Wakes.Load(); w != 2 {
		t.Fatalf("%d wakeups raised after Settle; want 2", w)
	}

	// A commit short of the head stores the tail; a discarded record last is held back.
	f.Output(t, []byte{6})
	r.Begin()
	var rec Record
	if ok, err := r.Next(&rec); !ok || err != nil || rec.Data[0] != 5 {
		t.Fatalf("Next: %v, %v, %v", ok, err, rec.Data)
	}
	r.CommitCursor()
	shows("after a commit short of the head", rec.Next, false, 16)
	pos, _ := f.Reserve(1)
	f.Commit(pos, true)
	if got := seqs(); string(got) != "\x06" {
		t.Fatalf("read %v; want 6", got)
	}
	shows("a discarded record last", pos, true, 0)

	// Release stores the tail; a ring whose consumer_pos another writer moved reports it.
	r.Release()
	shows("after Release", f.Prod, false, 0)
	f.Output(t, []byte{7})
	seqs()
	atomic.StoreUint64(&f.Pos[0], f.Prod)
	r.Release()
	if _, err := r.Next(&rec); !errors.Is(err, ErrCorrupt) {
		t.Errorf("Release over another writer's consumer_pos: %v; want a position error", err)
	}
}
