// SPDX-License-Identifier: Apache-2.0

package ring

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"unsafe"

	"github.com/perfbuf/perfbuf/internal/ringtest"
	"golang.org/x/sys/unix"
)

// perfReader returns a reader of the fake perf ring f, CPU 1.
func perfReader(t testing.TB, f *ringtest.Perf) *Perf {
	t.Helper()
	r, err := NewPerfFromParts(1, f.Page, f.Data)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// perfDrain is what a raw Drain does: Begin, Each to the snapshot's end,
// one commit past what it delivered.
func perfDrain(r *Perf, fn func(*Record) error) (int, error) {
	r.Begin()
	var stop atomic.Bool
	n, _, err := r.Each(new(Record), math.MaxUint64, &stop, fn, nil)
	r.CommitCursor()
	return n, err
}

func nop(*Record) error { return nil }

func TestPerfNew(t *testing.T) {
	page := new(unix.PerfEventMmapPage)
	for _, n := range []int{0, 4, 12, 1000} {
		if _, err := NewPerfFromParts(0, page, make([]byte, n)); !errors.Is(err, os.ErrInvalid) {
			t.Errorf("data size %d: %v", n, err)
		}
		if _, err := NewPerf(0, unsafe.Pointer(page), n); !errors.Is(err, os.ErrInvalid) {
			t.Errorf("NewPerf, data size %d: %v", n, err)
		}
	}
	if _, err := NewPerfFromParts(0, nil, make([]byte, 64)); !errors.Is(err, os.ErrInvalid) {
		t.Errorf("nil page: %v", err)
	}
	if _, err := NewPerf(0, nil, 64); !errors.Is(err, os.ErrInvalid) {
		t.Errorf("nil base: %v", err)
	}
}

// NewPerf over one block of memory laid out as the kernel maps it.
func TestPerfNewFromMapping(t *testing.T) {
	pageSize := os.Getpagesize()
	for _, dataOffset := range []uint64{0, uint64(pageSize), 2048} {
		// One Go block laid out like the mapping: the header page, then the data area.
		// uint64s keep the header 8-aligned for its atomics.
		mem := make([]uint64, (pageSize+4096)/8)
		base := unsafe.Pointer(&mem[0])
		page := (*unix.PerfEventMmapPage)(base)
		page.Data_offset = dataOffset
		r, err := NewPerf(3, base, 4096)
		if err != nil {
			t.Fatalf("data offset %d: %v", dataOffset, err)
		}
		off := dataOffset
		if off == 0 {
			off = uint64(pageSize)
		}
		raw := unsafe.Slice((*byte)(base), pageSize+4096)
		rec := ringtest.PerfSample([]byte("hello"))
		copy(raw[off:], rec)
		// Publish as the kernel does: release store of data_head after the record bytes.
		atomic.StoreUint64(&page.Data_head, uint64(len(rec)))
		var got []byte
		if n, err := perfDrain(r, func(rec *Record) error { got = rec.AppendTo(nil); return nil }); n != 1 || err != nil {
			t.Fatalf("data offset %d: drain = %d, %v", dataOffset, n, err)
		}
		if string(got[:5]) != "hello" || page.Data_tail != uint64(len(rec)) || r.CPU() != 3 || r.Name() != "perf ring cpu 3" {
			t.Fatalf("data offset %d: got %q, tail %d, cpu %d, name %q", dataOffset, got, page.Data_tail, r.CPU(), r.Name())
		}
	}
	mem := make([]uint64, (pageSize+4096)/8)
	page := (*unix.PerfEventMmapPage)(unsafe.Pointer(&mem[0]))
	page.Data_offset = 64 // inside the header
	if _, err := NewPerf(0, unsafe.Pointer(&mem[0]), 4096); !errors.Is(err, os.ErrInvalid) || !strings.Contains(err.Error(), "inside the header page") {
		t.Errorf("data offset 64: %v", err)
	}
	page.Data_offset, page.Data_size = 0, 8192
	if _, err := NewPerf(0, unsafe.Pointer(&mem[0]), 4096); !errors.Is(err, os.ErrInvalid) || !strings.Contains(err.Error(), "header says 8192") {
		t.Errorf("data size mismatch: %v", err)
	}
}

func TestPerfEmpty(t *testing.T) {
	f := ringtest.NewPerf(4096)
	r := perfReader(t, f)
	r.Begin()
	if r.Pending() != 0 || r.Used() != 0 || r.Size() != 4096 || r.CPU() != 1 || !r.Quiet() || r.Stalled() || !r.Settle() {
		t.Fatalf("pending %d used %d size %d cpu %d quiet %v", r.Pending(), r.Used(), r.Size(), r.CPU(), r.Quiet())
	}
	var rec Record
	if ok, err := r.Next(&rec); ok || err != nil {
		t.Fatalf("Next on an empty ring = %v, %v", ok, err)
	}
	if r.Peek(0, &rec) {
		t.Fatal("Peek on an empty ring")
	}
	if c := new(Copy); r.NextCopy(c) != 0 {
		t.Fatal("NextCopy on an empty ring")
	}
	n, _, err := r.Each(&rec, math.MaxUint64, new(atomic.Bool), func(*Record) error { t.Fatal("fn on an empty ring"); return nil }, nil)
	if n != 0 || err != nil {
		t.Fatalf("Each = %d, %v", n, err)
	}
	if s := *r.Counts(); s != (Counts{}) {
		t.Fatalf("counts %+v", s)
	}
	if s, l, d := r.Left(0); s != 0 || l != 0 || d != 0 {
		t.Fatalf("Left = %d, %d, %d", s, l, d)
	}
}

func TestPerfOneRecord(t *testing.T) {
	f := ringtest.NewPerf(4096)
	r := perfReader(t, f)
	r.SetIndex(2)
	payload := ringtest.Pattern(13, 1)
	f.MustWrite(t, ringtest.PerfSample(payload))
	if r.Quiet() || r.Used() != 32 || r.Progress() != 32 || r.LoadHead() != 32 {
		t.Fatalf("quiet %v used %d progress %d with a record", r.Quiet(), r.Used(), r.Progress())
	}

	r.Begin()
	if r.Pending() != 32 {
		t.Fatalf("pending %d, want 32", r.Pending())
	}
	var rec Record
	ok, err := r.Next(&rec)
	if !ok || err != nil {
		t.Fatalf("Next = %v, %v", ok, err)
	}
	if rec.Type != Sample || rec.CPU != 1 || rec.Ring != 2 || rec.Pos != 0 || rec.Next != 32 {
		t.Fatalf("record %+v", rec)
	}
	// 13 bytes are padded to round_up(13+4, 8)-4 = 20.
	if rec.Len() != 20 || !bytes.Equal(rec.Data, ringtest.PerfPadded(payload)) || len(rec.Wrapped) != 0 {
		t.Fatalf("payload %x (wrapped %x)", rec.Data, rec.Wrapped)
	}
	if &rec.Data[0] != &f.Data[12] {
		t.Fatal("payload is not zero-copy")
	}
	if r.Pos() != 32 || r.Pending() != 0 || r.Tail() != 0 || f.Page.Data_tail != 0 || !r.Quiet() {
		t.Fatalf("cursor %d pending %d tail %d (data_tail %d)", r.Pos(), r.Pending(), r.Tail(), f.Page.Data_tail)
	}
	if ok, err := r.Next(&rec); ok || err != nil {
		t.Fatalf("Next past the head = %v, %v", ok, err)
	}
	if err := r.Commit(rec.Next); err != nil {
		t.Fatal(err)
	}
	if r.Tail() != 32 || f.Page.Data_tail != 32 || r.Used() != 0 {
		t.Fatalf("tail %d used %d", r.Tail(), r.Used())
	}
	if s := *r.Counts(); s != (Counts{Samples: 1, Bytes: 20, MaxFill: 32}) {
		t.Fatalf("counts %+v", s)
	}
}

func TestPerfMany(t *testing.T) {
	f := ringtest.NewPerf(1 << 16)
	r := perfReader(t, f)
	var want [][]byte
	for i := range 300 {
		p := ringtest.Pattern(i%97, byte(i))
		want = append(want, ringtest.PerfPadded(p))
		if !f.Write(ringtest.PerfSample(p)) {
			t.Fatal("ring full")
		}
	}
	f.Publish()
	var got [][]byte
	n, err := perfDrain(r, func(rec *Record) error {
		got = append(got, rec.AppendTo(nil))
		return nil
	})
	if n != 300 || err != nil {
		t.Fatalf("drain = %d, %v", n, err)
	}
	for i := range want {
		if !bytes.Equal(got[i], want[i]) {
			t.Fatalf("record %d: %x, want %x", i, got[i], want[i])
		}
	}
	if r.Tail() != f.Head || f.Page.Data_tail != f.Head {
		t.Fatalf("tail %d, want %d", r.Tail(), f.Head)
	}
}

// Positions keep growing through many laps of a small ring; records wrap in every way.
func TestPerfWrapLaps(t *testing.T) {
	f := ringtest.NewPerfAt(256, 1<<40)
	r := perfReader(t, f)
	seq := 0
	var buf []byte
	for lap := range 200 {
		var want [][]byte
		for {
			p := ringtest.Pattern((seq*13)%60, byte(seq))
			if !f.Write(ringtest.PerfSample(p)) {
				f.Lost = 0
				break
			}
			want = append(want, ringtest.PerfPadded(p))
			seq++
		}
		f.Publish()
		i := 0
		_, err := perfDrain(r, func(rec *Record) error {
			buf = rec.AppendTo(buf[:0])
			if !bytes.Equal(buf, want[i]) {
				t.Fatalf("lap %d record %d: %x, want %x", lap, i, buf, want[i])
			}
			i++
			return nil
		})
		if err != nil || i != len(want) {
			t.Fatalf("lap %d: %d of %d records, %v", lap, i, len(want), err)
		}
	}
}

// A record that straddles the ring's end: the header in the last bytes, the
// payload split in two, the u32 size the ring's first word.
func TestPerfStraddles(t *testing.T) {
	t.Run("header in last bytes", func(t *testing.T) {
		// Start 8 bytes before the end: the header fills the ring's last 8 bytes and the
		// u32 size and payload continue at the start.
		f := ringtest.NewPerfAt(128, 128*5-8)
		r := perfReader(t, f)
		payload := ringtest.Pattern(20, 9)
		f.MustWrite(t, ringtest.PerfSample(payload))
		r.Begin()
		var rec Record
		if ok, err := r.Next(&rec); !ok || err != nil {
			t.Fatalf("Next = %v, %v", ok, err)
		}
		if !bytes.Equal(rec.Data, ringtest.PerfPadded(payload)) || len(rec.Wrapped) != 0 {
			t.Fatalf("payload %x wrapped %x", rec.Data, rec.Wrapped)
		}
		// The payload sits right after the u32 size at the start of the ring.
		if &rec.Data[0] != &f.Data[4] {
			t.Fatal("payload is not zero-copy")
		}
	})
	t.Run("size field wraps", func(t *testing.T) {
		// The record starts 8 bytes before the end with an empty payload: the u32 size
		// is the first word of the ring and the payload is empty.
		f := ringtest.NewPerfAt(64, 64-8)
		r := perfReader(t, f)
		f.MustWrite(t, ringtest.PerfSample(nil)) // raw size 4: record 16
		r.Begin()
		var rec Record
		if ok, err := r.Next(&rec); !ok || err != nil {
			t.Fatalf("Next = %v, %v", ok, err)
		}
		if rec.Len() != 4 || rec.Next != 64+8 {
			t.Fatalf("record %+v", rec)
		}
	})
	for _, start := range []uint64{128 - 16, 128 - 24, 128 - 32, 128 - 40} {
		t.Run(fmt.Sprintf("payload from %d", start), func(t *testing.T) {
			f := ringtest.NewPerfAt(128, 1024+start)
			r := perfReader(t, f)
			payload := ringtest.Pattern(44, 3) // raw size 44: record 56 bytes
			f.MustWrite(t, ringtest.PerfSample(payload))
			r.Begin()
			var rec Record
			if ok, err := r.Next(&rec); !ok || err != nil {
				t.Fatalf("Next = %v, %v", ok, err)
			}
			first := int(128 - start - 12)
			if len(rec.Data) != first || len(rec.Wrapped) != 44-first || rec.Len() != 44 {
				t.Fatalf("data %d wrapped %d", len(rec.Data), len(rec.Wrapped))
			}
			if &rec.Wrapped[0] != &f.Data[0] || &rec.Data[0] != &f.Data[start+12] {
				t.Fatal("payload is not zero-copy")
			}
			buf := make([]byte, 0, 64)
			out := rec.AppendTo(buf[:0])
			if !bytes.Equal(out, payload) || &out[0] != &buf[:1][0] {
				t.Fatalf("AppendTo = %x", out)
			}
			if allocs := testing.AllocsPerRun(100, func() { buf = rec.AppendTo(buf[:0]) }); allocs != 0 {
				t.Fatalf("AppendTo into a big enough buffer: %v allocs", allocs)
			}
			// A straddling sample is no plain one: NextCopy leaves it to Next.
			r.Begin()
			if r.NextCopy(new(Copy)) != 0 || r.Pos() != r.Tail() {
				t.Fatal("NextCopy took a sample that straddles the end")
			}
		})
	}
}

func TestPerfLostAndUnknown(t *testing.T) {
	f := ringtest.NewPerf(1024)
	r := perfReader(t, f)
	f.MustWrite(t, ringtest.PerfSample([]byte("a")))
	f.MustWrite(t, ringtest.PerfLost(7, 42))
	f.MustWrite(t, ringtest.PerfRecord(unix.PERF_RECORD_THROTTLE, 24, make([]byte, 16)))
	f.MustWrite(t, ringtest.PerfLost(7, 8))
	f.MustWrite(t, ringtest.PerfRecord(1234, 8, nil))
	f.MustWrite(t, ringtest.PerfSample([]byte("b")))

	r.Begin()
	recs := collect(t, r)
	// Records of other types are skipped, counted.
	types := []RecordType{Sample, Lost, Lost, Sample}
	if len(recs) != len(types) {
		t.Fatalf("%d records", len(recs))
	}
	for i, rec := range recs {
		if rec.Type != types[i] || rec.CPU != 1 {
			t.Fatalf("record %d is %v on cpu %d, want %v", i, rec.Type, rec.CPU, types[i])
		}
		if rec.Type != Sample && (rec.Data != nil || rec.Wrapped != nil) {
			t.Fatalf("record %d (%v) has a payload", i, rec.Type)
		}
	}
	if recs[1].Lost != 42 || recs[2].Lost != 8 {
		t.Fatalf("records %+v", recs)
	}
	want := Counts{Samples: 2, Bytes: 8, Lost: 50, Other: 2, MaxFill: int(f.Head)}
	if s := *r.Counts(); s != want {
		t.Fatalf("counts %+v, want %+v", s, want)
	}
	// Read again after Begin: the same records, counted once.
	r.Begin()
	if again := collect(t, r); len(again) != len(recs) || *r.Counts() != want {
		t.Fatalf("read again: %d records, counts %+v", len(again), *r.Counts())
	}
	// Left counts what is there from a position on, moving nothing.
	if s, l, d := r.Left(0); s != 2 || l != 50 || d != 0 || r.Pos() != f.Head || *r.Counts() != want {
		t.Fatalf("Left(0) = %d, %d, %d; cursor %d counts %+v", s, l, d, r.Pos(), *r.Counts())
	}
	if s, l, _ := r.Left(recs[2].Pos); s != 1 || l != 8 {
		t.Fatalf("Left(%d) = %d, %d", recs[2].Pos, s, l)
	}
}

// The fake producer reports lost samples the way the kernel does.
func TestPerfLostFromFullRing(t *testing.T) {
	f := ringtest.NewPerf(256)
	r := perfReader(t, f)
	p := ringtest.Pattern(52, 0) // 64-byte records
	for f.Write(ringtest.PerfSample(p)) {
	}
	f.Write(ringtest.PerfSample(p)) // two lost
	f.Publish()
	if _, err := perfDrain(r, nop); err != nil {
		t.Fatal(err)
	}
	f.MustWrite(t, ringtest.PerfSample(p))
	r.Begin()
	recs := collect(t, r)
	if len(recs) != 2 || recs[0].Type != Lost || recs[0].Lost != 2 || recs[1].Type != Sample {
		t.Fatalf("records %+v", recs)
	}
	if s := r.Counts(); s.Samples != 4 || s.Lost != 2 {
		t.Fatalf("counts %+v", s)
	}
}

// A ring exactly full (head = tail + size) is valid.
func TestPerfFullRing(t *testing.T) {
	f := ringtest.NewPerf(256)
	for range 8 {
		f.Put(ringtest.PerfSample(make([]byte, 20)))
	}
	f.Publish()
	r := perfReader(t, f)
	if n, err := perfDrain(r, nop); n != 8 || err != nil || r.Counts().MaxFill != 256 {
		t.Fatalf("drain = %d, %v; counts %+v", n, err, r.Counts())
	}
}

// Begin reads what was not committed again, counted once; Peek looks
// ahead without moving or counting; Refresh keeps the cursor.
func TestPerfReadAgain(t *testing.T) {
	f := ringtest.NewPerf(1024)
	r := perfReader(t, f)
	for i := range 5 {
		f.MustWrite(t, ringtest.PerfSample(ringtest.Pattern(i*8, byte(i))))
	}
	r.Begin()
	first := collect(t, r)
	if len(first) != 5 || r.Tail() != 0 {
		t.Fatalf("%d records, tail %d", len(first), r.Tail())
	}
	r.Begin()
	var rec Record
	for i, w := range first {
		if !r.Peek(w.Pos, &rec) || rec.Pos != w.Pos || rec.Next != w.Next || !bytes.Equal(rec.Data, w.Data) {
			t.Fatalf("Peek(%d) = %+v, want record %d", w.Pos, rec, i)
		}
	}
	if r.Pos() != 0 || r.Peek(f.Head, &rec) || r.Peek(f.Head+8, &rec) {
		t.Fatalf("Peek moved the cursor to %d, or read at or past the head", r.Pos())
	}
	second := collect(t, r)
	if len(second) != 5 {
		t.Fatalf("re-read %d records", len(second))
	}
	for i := range first {
		if first[i].Pos != second[i].Pos || !bytes.Equal(first[i].Data, second[i].Data) {
			t.Fatalf("record %d differs on re-read", i)
		}
	}
	if r.Peek(first[0].Pos, &rec) {
		t.Fatal("Peek behind the cursor")
	}
	// Commit the first two, then Begin re-reads from the third.
	if err := r.Commit(first[1].Next); err != nil {
		t.Fatal(err)
	}
	r.Begin()
	third := collect(t, r)
	if len(third) != 3 || third[0].Pos != first[2].Pos {
		t.Fatalf("after committing two: %d records from %d", len(third), third[0].Pos)
	}
	if s := r.Counts(); s.Samples != 5 {
		t.Fatalf("counts %+v", s)
	}

	f.MustWrite(t, ringtest.PerfSample([]byte("two")))
	if r.Quiet() {
		t.Fatal("quiet with a record past the snapshot")
	}
	if got := collect(t, r); len(got) != 0 {
		t.Fatalf("read %d records past the snapshot", len(got))
	}
	r.Refresh()
	got := collect(t, r)
	if len(got) != 1 || string(got[0].Data[:3]) != "two" {
		t.Fatalf("after Refresh: %+v", got)
	}
}

func TestPerfCommitRules(t *testing.T) {
	f := ringtest.NewPerfAt(1024, 4096)
	r := perfReader(t, f)
	for range 4 {
		f.MustWrite(t, ringtest.PerfSample(make([]byte, 20))) // 32-byte records
	}
	r.Begin()
	var rec Record
	r.Next(&rec)
	r.Next(&rec) // cursor at 4096+64, head snapshot at 4096+128
	f.MustWrite(t, ringtest.PerfSample(nil))

	for _, c := range []struct {
		pos    uint64
		reason string
	}{
		{4096 - 32, "backwards from tail 4096"},
		{4096 + 160, "past the cursor 4160"}, // past the head snapshot too
		{4096 + 96, "past the cursor 4160"},  // within the snapshot
		{4096 + 4, "not 8-aligned"},
	} {
		err := r.Commit(c.pos)
		prefix := fmt.Sprintf("commit perf ring cpu 1 to %d: ", c.pos)
		if !errors.Is(err, os.ErrInvalid) || !strings.HasPrefix(err.Error(), prefix) || !strings.Contains(err.Error(), c.reason) {
			t.Fatalf("Commit(%d) = %v, want os.ErrInvalid, %q", c.pos, err, prefix+c.reason)
		}
		if f.Page.Data_tail != 4096 || r.Tail() != 4096 {
			t.Fatalf("Commit(%d) wrote data_tail %d (tail %d)", c.pos, f.Page.Data_tail, r.Tail())
		}
	}
	if err := r.Commit(4096); err != nil {
		t.Fatalf("Commit(tail) = %v", err)
	}
	if err := r.Commit(4096 + 32); err != nil || f.Page.Data_tail != 4096+32 {
		t.Fatalf("Commit(first record) = %v, tail %d", err, f.Page.Data_tail)
	}
	if err := r.Commit(4096 + 64); err != nil || f.Page.Data_tail != 4096+64 {
		t.Fatalf("Commit(cursor) = %v, tail %d", err, f.Page.Data_tail)
	}
	want := "commit perf ring cpu 1 to 4128: backwards from tail 4160: invalid argument"
	if err := r.Commit(4096 + 32); !errors.Is(err, os.ErrInvalid) || err.Error() != want {
		t.Fatalf("Commit backwards = %q, want %q", err, want)
	}
	// CommitCursor commits everything parsed, and nothing when that is the tail.
	r.CommitCursor()
	if f.Page.Data_tail != 4096+64 {
		t.Fatalf("CommitCursor at the tail stored %d", f.Page.Data_tail)
	}
	r.Next(&rec)
	r.CommitCursor()
	if f.Page.Data_tail != 4096+96 || r.Tail() != 4096+96 {
		t.Fatalf("CommitCursor stored %d (tail %d)", f.Page.Data_tail, r.Tail())
	}
}

// Each delivers the records that start within limit bytes of where it began,
// plain samples and others alike (read again after Begin or not), and stops
// after the record during which stop became true, or at fn's error. It does
// not commit.
func TestPerfEach(t *testing.T) {
	f := ringtest.NewPerf(1024)
	for range 3 {
		f.MustWrite(t, ringtest.PerfSample(make([]byte, 20))) // 32 bytes: at 0, 32, 64
	}
	f.MustWrite(t, ringtest.PerfLost(1, 2)) // at 96, 24 bytes
	for range 2 {
		f.MustWrite(t, ringtest.PerfSample(make([]byte, 20))) // at 120, 152
	}
	var pos []uint64
	fn := func(rec *Record) error { pos = append(pos, rec.Pos); return nil }
	var r *Perf
	for _, c := range []struct {
		limit uint64
		want  string
	}{
		{0, "[]"}, {1, "[0]"}, {32, "[0]"}, {33, "[0 32]"}, {96, "[0 32 64]"}, {97, "[0 32 64 96]"},
		{121, "[0 32 64 96 120]"}, {math.MaxUint64, "[0 32 64 96 120 152]"},
	} {
		for _, again := range []bool{false, true} { // fresh, then read again after Begin
			if !again {
				r = perfReader(t, f)
			}
			r.Begin()
			pos = pos[:0]
			var rec Record
			k, used, err := r.Each(&rec, c.limit, new(atomic.Bool), fn, nil)
			if fmt.Sprint(pos) != c.want || k != len(pos) || err != nil {
				t.Errorf("limit %d (again %v): %d records at %v, %v; want %s", c.limit, again, k, pos, err, c.want)
			}
			if used != r.Pos() {
				t.Errorf("limit %d (again %v): Each says %d bytes, the cursor moved %d", c.limit, again, used, r.Pos())
			}
			if f.Page.Data_tail != 0 {
				t.Fatalf("Each committed to %d", f.Page.Data_tail)
			}
		}
	}
	if st := r.Counts(); st.Samples != 5 || st.Lost != 2 {
		t.Errorf("counts %+v: records read again were counted again", st)
	}

	var stop atomic.Bool
	r = perfReader(t, f)
	pos = pos[:0]
	r.Begin()
	k, _, err := r.Each(new(Record), math.MaxUint64, &stop, func(rec *Record) error {
		pos = append(pos, rec.Pos)
		if rec.Pos == 32 {
			stop.Store(true)
		}
		return nil
	}, nil)
	if k != 2 || err != nil || fmt.Sprint(pos) != "[0 32]" || r.Pos() != 64 {
		t.Errorf("stopped during the second record: %d records at %v, %v, cursor %d; want 2, cursor 64", k, pos, err, r.Pos())
	}
	// Stopped during the lost record, which the slow path delivers.
	stop.Store(false)
	k, _, err = r.Each(new(Record), math.MaxUint64, &stop, func(rec *Record) error {
		stop.Store(rec.Type == Lost)
		return nil
	}, nil)
	if k != 2 || err != nil || r.Pos() != 120 {
		t.Errorf("stopped during the lost record: %d records, %v, cursor %d; want 2, cursor 120", k, err, r.Pos())
	}

	// fn's error stops Each after that record, plain or not, and is returned.
	errStop := errors.New("stop")
	for _, at := range []uint64{64, 96} {
		r = perfReader(t, f)
		r.Begin()
		k, used, err := r.Each(new(Record), math.MaxUint64, new(atomic.Bool), func(rec *Record) error {
			if rec.Pos == at {
				return errStop
			}
			return nil
		}, nil)
		if err != errStop || r.Pos() != used || k != int(at/32)+1 {
			t.Errorf("fn failing at %d: %d records, cursor %d, %v", at, k, r.Pos(), err)
		}
	}
}

// Each's snapshot bounds it: a producer as fast as the reader cannot keep it
// busy forever.
func TestPerfEachBoundedBySnapshot(t *testing.T) {
	f := ringtest.NewPerf(1 << 16)
	r := perfReader(t, f)
	f.MustWrite(t, ringtest.PerfSample(nil))
	n, err := perfDrain(r, func(*Record) error {
		f.MustWrite(t, ringtest.PerfSample(nil)) // one new record per record read
		return nil
	})
	if n != 1 || err != nil {
		t.Fatalf("drain = %d, %v", n, err)
	}
}

// The loop's copies into a sink, in batches, are what SetCopy makes of
// Next's records; a sample function can stop the loop; NextCopy copies one
// plain sample and leaves the others to Next.
func TestPerfSinks(t *testing.T) {
	f := ringtest.NewPerfAt(256, 192)
	for _, rec := range [][]byte{
		ringtest.PerfSample(ringtest.Pattern(4, 1)),  // at 192, plain
		ringtest.PerfLost(3, 9),                      // at 208
		ringtest.PerfSample(ringtest.Pattern(40, 2)), // at 232: the payload straddles the end
		ringtest.PerfSample(ringtest.Pattern(20, 3)), // at 288, plain
		ringtest.PerfSample(ringtest.Pattern(60, 4)), // at 320, plain
		ringtest.PerfSample(ringtest.Pattern(36, 5)), // at 392, plain
	} {
		f.MustWrite(t, rec)
	}
	r := perfReader(t, f)
	var all []Record
	r.Begin()
	all = append(all, collect(t, r)...)
	if len(all) != 6 || len(all[2].Wrapped) == 0 {
		t.Fatalf("%d records; the third wrapped %d", len(all), len(all[2].Wrapped))
	}
	var want []Copy
	for _, rec := range all {
		var c Copy
		SetCopy(&c, &rec)
		want = append(want, c)
	}

	for _, batch := range []int{1, 2, 3, 7} {
		r := perfReader(t, f)
		r.Begin()
		var got []Copy
		for calls := 0; len(got) < len(all); calls++ {
			if calls > len(all) {
				t.Fatalf("batch %d: no progress after %d copies", batch, len(got))
			}
			s := &Sink{Into: make([]Copy, batch), Room: 1 << 20}
			k, _, err := r.Each(new(Record), math.MaxUint64, new(atomic.Bool), nil, s)
			if err != nil || k != s.N {
				t.Fatalf("batch %d: %d records, %d copies, %v", batch, k, s.N, err)
			}
			got = append(got, s.Into[:s.N]...)
		}
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Fatalf("batch %d: copies %v, want %v", batch, got, want)
		}
	}
	// Stop after a sample the sample function took.
	var stop atomic.Bool
	r = perfReader(t, f)
	r.Begin()
	s := &Sink{Sample: func(int, []byte) { stop.Store(true) }}
	if k, _, _ := r.Each(new(Record), math.MaxUint64, &stop, nop, s); k != 1 {
		t.Fatalf("stopped by the sample function: %d records", k)
	}

	// NextCopy: one plain sample, then 0 for the lost record (Next's).
	r = perfReader(t, f)
	r.Begin()
	var c Copy
	if n := r.NextCopy(&c); n != 16 || fmt.Sprint(c) != fmt.Sprint(want[0]) {
		t.Fatalf("NextCopy = %d, %v; want %v", n, c, want[0])
	}
	if r.NextCopy(&c) != 0 || r.Pos() != all[1].Pos {
		t.Fatal("NextCopy took the lost record")
	}
	if st := r.Counts(); st.Samples != 1 || st.Bytes != 4 {
		t.Fatalf("counts %+v after a copy", st)
	}
}

// The ring's loop into a sink on a perf ring: limit, stop (Close during a
// record), a full batch, Room, lost records copied, a sample that
// straddles the ring's end copied in one piece, and a sample function that
// takes the samples in one piece while the loop's function gets the rest.
func TestPerfEachSink(t *testing.T) {
	f := ringtest.NewPerfAt(256, 128)
	f.MustWrite(t, ringtest.PerfSample(ringtest.Pattern(20, 1))) // at 128, 32 bytes
	f.MustWrite(t, ringtest.PerfLost(1, 7))                      // at 160, 24 bytes
	f.MustWrite(t, ringtest.PerfSample(ringtest.Pattern(44, 2))) // at 184, 56 bytes
	f.MustWrite(t, ringtest.PerfSample(ringtest.Pattern(36, 3))) // at 240: 4 bytes, then 32 at the start
	f.MustWrite(t, ringtest.PerfSample(ringtest.Pattern(4, 4)))  // at 288
	want := "[sample 20 1 lost 7 sample 44 2 sample 36 3 sample 4 4]"
	show := func(c *Copy) string {
		if c.Type == Lost {
			return fmt.Sprintf("lost %d", c.Lost)
		}
		return fmt.Sprintf("sample %d %d", len(c.Data), c.Data[0]) // Pattern's first byte is its seed
	}
	run := func(s *Sink, limit uint64, stop *atomic.Bool) (string, []int) {
		b := perfReader(t, f)
		b.Begin()
		var out []string
		var ks []int
		for {
			s.N, s.Room = 0, 1<<20
			k, _, err := b.Each(new(Record), limit-(b.Pos()-128), stop, func(*Record) error {
				t.Fatal("the function called with a copying sink")
				return nil
			}, s)
			if err != nil {
				t.Fatal(err)
			}
			for i := range s.Into[:s.N] {
				out = append(out, show(&s.Into[i]))
			}
			ks = append(ks, k)
			if !s.Full() || b.Pos()-128 >= limit {
				return fmt.Sprint(out), ks
			}
		}
	}
	for _, n := range []int{1, 2, 5, 64} {
		if got, ks := run(&Sink{Into: make([]Copy, n)}, 1<<20, new(atomic.Bool)); got != want {
			t.Errorf("batches of %d: %s in calls %v, want %s", n, got, ks, want)
		}
	}
	if got, ks := run(&Sink{Into: make([]Copy, 64)}, 57, new(atomic.Bool)); got != "[sample 20 1 lost 7 sample 44 2]" || fmt.Sprint(ks) != "[3]" {
		t.Errorf("limit 57: %s in calls %v", got, ks)
	}
	var stop atomic.Bool
	stop.Store(true) // closed during the first record
	if got, _ := run(&Sink{Into: make([]Copy, 64)}, 1<<20, &stop); got != "[sample 20 1]" {
		t.Errorf("stop: %s", got)
	}
	// Room: the loop stops after the record that uses it up.
	b := perfReader(t, f)
	b.Begin()
	s := Sink{Into: make([]Copy, 64), Room: 21}
	if k, _, err := b.Each(new(Record), 1<<20, new(atomic.Bool), nil, &s); k != 3 || s.N != 3 || err != nil || !s.Full() {
		t.Errorf("room 21: %d records, %d copies, %v", k, s.N, err) // 20 bytes, a lost record, 44
	}

	var seen []string
	b = perfReader(t, f)
	b.Begin()
	sampleSink := Sink{Sample: func(cpu int, data []byte) {
		seen = append(seen, fmt.Sprintf("sample %d cpu %d", len(data), cpu))
	}}
	k, _, err := b.Each(new(Record), 1<<20, new(atomic.Bool), func(rec *Record) error {
		seen = append(seen, fmt.Sprintf("fn %v %d+%d", rec.Type, len(rec.Data), len(rec.Wrapped)))
		return nil
	}, &sampleSink)
	c := b.CPU()
	if k != 5 || err != nil || fmt.Sprint(seen) != fmt.Sprintf("[sample 20 cpu %d fn lost 0+0 sample 44 cpu %d fn sample 4+32 sample 4 cpu %d]", c, c, c) {
		t.Errorf("sample function: %d, %v, %v", k, err, seen)
	}
}

// Corrupt records: a sticky *CorruptError at the record, the good records
// before it delivered; SkipCorrupt gets past it to the head, counted.
func TestPerfCorrupt(t *testing.T) {
	for _, c := range ringtest.PerfCorrupts() {
		t.Run(c.Name, func(t *testing.T) {
			f := ringtest.NewPerfAt(1024, 1<<20+c.At)
			bad := f.Head
			for i, rec := range c.Recs {
				if i == len(c.Recs)-1 {
					bad = f.Head
				}
				f.Put(rec)
			}
			f.Publish()
			r := perfReader(t, f)
			r.SetIndex(4)
			good := 0
			n, err := perfDrain(r, func(*Record) error { good++; return nil })
			var ce *CorruptError
			if !errors.Is(err, ErrCorrupt) || !errors.As(err, &ce) || !r.Failed() || !r.IsCorrupt(err) {
				t.Fatalf("drain = %d, %v", n, err)
			}
			if !strings.Contains(ce.Reason, c.Reason) || ce.CPU != 1 || ce.Ring != 4 || ce.Pos != bad {
				t.Fatalf("error %+v, want %q at %d", ce, c.Reason, bad)
			}
			if n != len(c.Recs)-1 || good != n || r.Tail() != bad {
				t.Fatalf("%d good records, tail %d", n, r.Tail())
			}
			// Sticky: Next and Each keep returning the same error, Quiet is false,
			// Peek and Reached see nothing, Left counts up to it.
			var rec Record
			for range 3 {
				if ok, err2 := r.Next(&rec); ok || err2 != err {
					t.Fatalf("Next after the error = %v, %v", ok, err2)
				}
			}
			if r.Quiet() || r.Peek(bad, &rec) || r.Reached(bad, bad) {
				t.Fatal("a ring with a pending error is quiet, peeked or reached")
			}
			if s, _, _ := r.Left(bad); s != 0 {
				t.Fatalf("Left counts %d samples past a corrupt record", s)
			}
			r.Begin()
			if _, err2 := perfDrain(r, nop); err2 != err {
				t.Fatalf("drain after the error = %v", err2)
			}
			// SkipCorrupt gets past it, and reading goes on.
			head := f.Head
			if skipped := r.SkipCorrupt(); skipped != head-ce.Pos {
				t.Fatalf("skipped %d, want %d", skipped, head-ce.Pos)
			}
			if st := r.Counts(); r.Tail() != head || f.Page.Data_tail != head || st.Corrupt != 1 || st.CorruptBytes != head-ce.Pos || r.Pending() != 0 || r.Failed() {
				t.Fatalf("after SkipCorrupt: tail %d, counts %+v", r.Tail(), st)
			}
			f.MustWrite(t, ringtest.PerfSample([]byte("ok")))
			var got string
			n, err = perfDrain(r, func(rec *Record) error { got = string(rec.Data[:2]); return nil })
			if n != 1 || err != nil || got != "ok" {
				t.Fatalf("after SkipCorrupt: drain = %d, %v, %q", n, err, got)
			}
			if st := r.Counts(); st.Corrupt != 1 || st.Samples != uint64(len(c.Recs)) {
				t.Fatalf("after SkipCorrupt: counts %+v", st)
			}
		})
	}
}

func TestPerfCorruptMessage(t *testing.T) {
	f := ringtest.NewPerfAt(8192, 4096)
	f.Put(ringtest.PerfRecord(9, 0, make([]byte, 8)))
	f.Publish()
	r := perfReader(t, f)
	r.Begin()
	_, err := r.Next(new(Record))
	want := "read ring 0 (cpu 1) at 4096: record size 0: corrupt ring record"
	if err == nil || err.Error() != want {
		t.Fatalf("error %q, want %q", err, want)
	}
}

// A data_tail the reader never wrote, off the 8-byte alignment.
func TestPerfCorruptCursor(t *testing.T) {
	f := ringtest.NewPerf(1024)
	f.MustWrite(t, ringtest.PerfSample(nil))
	f.MustWrite(t, ringtest.PerfSample(nil))
	f.Page.Data_tail = 4
	r := perfReader(t, f)
	r.Begin()
	_, err := r.Next(new(Record))
	var ce *CorruptError
	if !errors.As(err, &ce) || ce.Reason != "cursor not 8-aligned" {
		t.Fatalf("Next = %v", err)
	}
	if r.SkipCorrupt() != 28 || r.Tail() != 32 || r.Counts().Corrupt != 1 {
		t.Fatalf("tail %d, counts %+v after SkipCorrupt", r.Tail(), r.Counts())
	}
}

// A data_head that cannot be valid: behind data_tail, more than the ring
// past it, or unaligned. Nothing is read past it; SkipCorrupt passes it
// over (behind: resyncs the tail to it), and the next head the kernel
// writes gets the reader going again.
func TestPerfCorruptHead(t *testing.T) {
	cases := []struct {
		name   string
		head   uint64
		reason string
	}{
		{"behind tail", 4096 - 64, "behind tail"},
		{"more than the ring", 4096 + 2048, "more than the 1024-byte ring"},
		{"unaligned", 4096 + 36, "not 8-aligned"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			f := ringtest.NewPerfAt(1024, 4096)
			r := perfReader(t, f)
			f.MustWrite(t, ringtest.PerfSample(nil))
			f.Page.Data_head = c.head
			n, err := perfDrain(r, nop)
			var ce *CorruptError
			if n != 0 || !errors.As(err, &ce) || !errors.Is(err, ErrCorrupt) || !strings.Contains(ce.Reason, c.reason) {
				t.Fatalf("drain = %d, %v", n, err)
			}
			if r.Pending() != 0 || r.Tail() != 4096 || r.Quiet() {
				t.Fatalf("pending %d, tail %d", r.Pending(), r.Tail())
			}
			r.SkipCorrupt()
			st := r.Counts()
			if c.name == "behind tail" {
				// The tail is what moved: SkipCorrupt resynchronises with the head.
				if r.Tail() != c.head || st.Corrupt != 1 || st.CorruptBytes > 1024 {
					t.Fatalf("after SkipCorrupt: tail %d, counts %+v", r.Tail(), st)
				}
			} else {
				// A bad head is passed over, and nothing below it is skipped.
				if r.Tail() != 4096 || st.Corrupt != 1 || st.CorruptBytes != 0 {
					t.Fatalf("after SkipCorrupt: tail %d, counts %+v", r.Tail(), st)
				}
				if n, err := perfDrain(r, nop); n != 0 || err != nil {
					t.Fatalf("drain while data_head keeps the bad value = %d, %v", n, err)
				}
				if !r.Reached(4096, c.head) {
					t.Fatal("a head passed over is not reached")
				}
			}
			// The next real record brings the kernel's head back; at most one more
			// SkipCorrupt gets the reader going again.
			f.MustWrite(t, ringtest.PerfSample(nil))
			got := 0
			for range 2 {
				var k int
				k, err = perfDrain(r, nop)
				got += k
				if err == nil {
					break
				}
				r.SkipCorrupt()
			}
			if err != nil || r.Tail() != f.Head {
				t.Fatalf("no recovery: %v, tail %d head %d", err, r.Tail(), f.Head)
			}
			want := 2 // the sample below the bad head, and the new one
			if c.name == "behind tail" {
				want = 0 // the resync lands on what the kernel never wrote, skipped to the head
			}
			if got != want {
				t.Fatalf("%d samples after recovery, want %d", got, want)
			}
		})
	}
}

func TestPerfHeadBackwards(t *testing.T) {
	f := ringtest.NewPerf(1024)
	r := perfReader(t, f)
	for range 4 {
		f.MustWrite(t, ringtest.PerfSample(nil))
	}
	r.Begin()
	var rec Record
	r.Next(&rec)
	f.Page.Data_head = 16 // from 64 back to 16, not behind the tail
	r.Refresh()
	if _, err := r.Next(&rec); !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), "moved backwards from 64 to 16") {
		t.Fatalf("Next = %v", err)
	}
	// Passed over: skipping nothing, the records below the snapshot stay.
	if n := r.SkipCorrupt(); n != 0 || r.Failed() {
		t.Fatalf("SkipCorrupt = %d", n)
	}
}

// Without an error pending, SkipCorrupt discards what is pending.
func TestPerfSkipCorruptWithoutError(t *testing.T) {
	f := ringtest.NewPerf(1024)
	r := perfReader(t, f)
	f.MustWrite(t, ringtest.PerfSample(nil))
	r.Begin()
	if n := r.SkipCorrupt(); n != 16 || r.Tail() != 16 {
		t.Fatalf("SkipCorrupt = %d, tail %d", n, r.Tail())
	}
	if s := r.Counts(); s.Samples != 0 || s.Corrupt != 0 || s.CorruptBytes != 16 {
		t.Fatalf("counts %+v", s)
	}
}

// After a corrupt record, Begin reads the good records before it again,
// and SkipCorrupt counts only the corrupt part as skipped.
func TestPerfBeginAfterCorrupt(t *testing.T) {
	f := ringtest.NewPerf(1024)
	r := perfReader(t, f)
	f.MustWrite(t, ringtest.PerfSample(make([]byte, 20))) // 32 bytes
	f.MustWrite(t, ringtest.PerfSample(make([]byte, 20))) // 32 bytes
	f.MustWrite(t, ringtest.PerfRecord(9, 0, make([]byte, 8)))
	r.Begin()
	var rec Record
	for range 2 {
		if ok, err := r.Next(&rec); !ok || err != nil {
			t.Fatal(ok, err)
		}
	}
	if _, err := r.Next(&rec); !errors.Is(err, ErrCorrupt) {
		t.Fatal(err)
	}
	r.Begin() // "Records read but not committed are read again"
	if ok, err := r.Next(&rec); !ok {
		t.Errorf("after Begin, the good record at the tail is not read again: %v", err)
	}
	r.Begin()
	if skipped := r.SkipCorrupt(); skipped != 16 {
		t.Errorf("SkipCorrupt skipped %d bytes; the corrupt part is 16 (the 64 before it are good records)", skipped)
	}
}

// Reached: a reader whose oldest undelivered record is at oldest has
// delivered everything below a Flush's mark; not with data_head behind
// data_tail, which becomes the pending error.
func TestPerfReached(t *testing.T) {
	f := ringtest.NewPerfAt(1024, 4096)
	r := perfReader(t, f)
	f.MustWrite(t, ringtest.PerfSample(nil))
	mark := r.LoadHead()
	if r.Reached(4096, mark) || !r.Reached(mark, mark) || !r.Reached(mark+16, mark) {
		t.Fatal("Reached wrong about a record below the mark")
	}
	f.Page.Data_tail = 4096 + 64 // behind it is data_head
	if r.Reached(mark, mark) || !r.Failed() {
		t.Fatal("Reached with data_head behind data_tail")
	}
	if _, err := r.Next(new(Record)); !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), "behind tail") {
		t.Fatalf("Next after Reached found the positions bad = %v", err)
	}
}

// Left counts from the tail the memory holds when a reader read further,
// and stops at a corrupt record.
func TestPerfLeft(t *testing.T) {
	f := ringtest.NewPerf(1024)
	r := perfReader(t, f)
	for range 3 {
		f.MustWrite(t, ringtest.PerfSample(nil)) // 16 bytes each
	}
	f.MustWrite(t, ringtest.PerfLost(0, 5))
	if s, l, _ := r.Left(0); s != 3 || l != 5 {
		t.Fatalf("Left(0) = %d, %d", s, l)
	}
	f.Page.Data_tail = 32 // another reader of the ring committed two
	if s, l, _ := r.Left(0); s != 1 || l != 5 {
		t.Fatalf("Left(0) with data_tail 32 = %d, %d", s, l)
	}
	f.MustWrite(t, ringtest.PerfRecord(9, 0, make([]byte, 8)))
	f.MustWrite(t, ringtest.PerfSample(nil))
	if s, l, _ := r.Left(32); s != 1 || l != 5 || r.Failed() {
		t.Fatalf("Left up to a corrupt record = %d, %d (failed %v)", s, l, r.Failed())
	}
	f.Page.Data_head = 8 // behind the tail: nothing counted
	if s, l, _ := r.Left(32); s != 0 || l != 0 || r.Failed() {
		t.Fatalf("Left with a bad head = %d, %d (failed %v)", s, l, r.Failed())
	}
}

// View is a second reader of the same memory, with positions of its own.
func TestPerfView(t *testing.T) {
	f := ringtest.NewPerf(1024)
	r := perfReader(t, f)
	r.SetIndex(5)
	f.MustWrite(t, ringtest.PerfSample([]byte("abc")))
	v, err := r.View()
	if err != nil {
		t.Fatal(err)
	}
	if v.Cur().Index() != 5 || v.Cur().CPU() != 1 {
		t.Fatalf("view index %d cpu %d", v.Cur().Index(), v.Cur().CPU())
	}
	v.Begin()
	var rec Record
	if ok, err := v.Next(&rec); !ok || err != nil || rec.Ring != 5 || string(rec.Data[:3]) != "abc" {
		t.Fatalf("view Next = %v, %v, %+v", ok, err, rec)
	}
	v.Cur().CommitCursor()
	if c, p := r.Positions(); c != 16 || p != 16 || r.Pos() != 0 {
		t.Fatalf("positions %d, %d, the owner's cursor %d", c, p, r.Pos())
	}
}
