// SPDX-License-Identifier: Apache-2.0

package perfbuf

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/perfbuf/perfbuf/internal/ring"
	"github.com/perfbuf/perfbuf/internal/ringtest"
)

func fakeCollect(t *testing.T, b *RawBuffer) []Record {
	t.Helper()
	var recs []Record
	for {
		var rec Record
		ok, err := b.Next(&rec)
		if err != nil {
			t.Fatal(err)
		}
		if !ok {
			return recs
		}
		recs = append(recs, rec)
	}
}

func TestRawEmpty(t *testing.T) {
	f := ringtest.NewPerf(4096)
	b := perfReader(t, f)
	b.Begin()
	if b.perf().Pending() != 0 || b.Used() != 0 || b.Size() != 4096 || b.CPU() != 1 {
		t.Fatalf("pending %d used %d size %d cpu %d", b.perf().Pending(), b.Used(), b.Size(), b.CPU())
	}
	var rec Record
	if ok, err := b.Next(&rec); ok || err != nil {
		t.Fatalf("Next on an empty ring = %v, %v", ok, err)
	}
	n, err := b.Drain(func(*Record) error { t.Fatal("callback on an empty ring"); return nil })
	if n != 0 || err != nil {
		t.Fatalf("Drain = %d, %v", n, err)
	}
	if s := b.Stats(); s != (Stats{CPU: 1}) {
		t.Fatalf("stats %+v", s)
	}
}

func TestRawOneRecord(t *testing.T) {
	f := ringtest.NewPerf(4096)
	b := perfReader(t, f)
	payload := ringtest.Pattern(13, 1)
	f.MustWrite(t, ringtest.PerfSample(payload))

	b.Begin()
	if b.perf().Pending() != 32 {
		t.Fatalf("pending %d, want 32", b.perf().Pending())
	}
	var rec Record
	ok, err := b.Next(&rec)
	if !ok || err != nil {
		t.Fatalf("Next = %v, %v", ok, err)
	}
	if rec.Type != RecordSample || rec.CPU != 1 || rec.Pos != 0 || rec.Next != 32 {
		t.Fatalf("record %+v", rec)
	}
	// 13 bytes are padded to round_up(13+4, 8)-4 = 20.
	if rec.Len() != 20 || !bytes.Equal(rec.Data, ringtest.PerfPadded(payload)) || len(rec.Wrapped) != 0 {
		t.Fatalf("payload %x (wrapped %x)", rec.Data, rec.Wrapped)
	}
	if b.perf().Cur().Pos() != 32 || b.perf().Pending() != 0 || b.perf().Cur().Tail() != 0 || f.Page.Data_tail != 0 {
		t.Fatalf("cursor %d pending %d tail %d (data_tail %d)", b.perf().Cur().Pos(), b.perf().Pending(), b.perf().Cur().Tail(), f.Page.Data_tail)
	}
	if ok, err := b.Next(&rec); ok || err != nil {
		t.Fatalf("Next past the head = %v, %v", ok, err)
	}
	if err := b.Commit(rec.Next); err != nil {
		t.Fatal(err)
	}
	if b.perf().Cur().Tail() != 32 || f.Page.Data_tail != 32 || b.Used() != 0 {
		t.Fatalf("tail %d used %d", b.perf().Cur().Tail(), b.Used())
	}
	if s := b.Stats(); s != (Stats{CPU: 1, Samples: 1, Bytes: 20, MaxFill: 32}) {
		t.Fatalf("stats %+v", s)
	}
}

func TestRawMany(t *testing.T) {
	f := ringtest.NewPerf(1 << 16)
	b := perfReader(t, f)
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
	n, err := b.Drain(func(rec *Record) error {
		got = append(got, rec.AppendTo(nil))
		return nil
	})
	if n != 300 || err != nil {
		t.Fatalf("Drain = %d, %v", n, err)
	}
	for i := range want {
		if !bytes.Equal(got[i], want[i]) {
			t.Fatalf("record %d: %x, want %x", i, got[i], want[i])
		}
	}
	if b.perf().Cur().Tail() != f.Head {
		t.Fatalf("tail %d, want %d", b.perf().Cur().Tail(), f.Head)
	}
}

// Positions keep growing through many laps of a small ring; records wrap in every way.
func TestRawWrapLaps(t *testing.T) {
	f := ringtest.NewPerfAt(256, 1<<40)
	b := perfReader(t, f)
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
		_, err := b.Drain(func(rec *Record) error {
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

func TestRawHeaderInLastBytes(t *testing.T) {
	// Start 8 bytes before the end: the header fills the ring's last 8 bytes and the u32
	// size and payload continue at the start.
	f := ringtest.NewPerfAt(128, 128*5-8)
	b := perfReader(t, f)
	payload := ringtest.Pattern(20, 9)
	f.MustWrite(t, ringtest.PerfSample(payload))
	b.Begin()
	var rec Record
	if ok, err := b.Next(&rec); !ok || err != nil {
		t.Fatalf("Next = %v, %v", ok, err)
	}
	if !bytes.Equal(rec.Data, ringtest.PerfPadded(payload)) || len(rec.Wrapped) != 0 {
		t.Fatalf("payload %x wrapped %x", rec.Data, rec.Wrapped)
	}
	// The payload sits right after the u32 size at the start of the ring.
	if &rec.Data[0] != &f.Data[4] {
		t.Fatal("payload is not zero-copy")
	}
}

func TestRawPayloadStraddles(t *testing.T) {
	for _, start := range []uint64{128 - 16, 128 - 24, 128 - 32, 128 - 40} {
		f := ringtest.NewPerfAt(128, 1024+start)
		b := perfReader(t, f)
		payload := ringtest.Pattern(44, 3) // raw size 44: record 56 bytes
		f.MustWrite(t, ringtest.PerfSample(payload))
		b.Begin()
		var rec Record
		if ok, err := b.Next(&rec); !ok || err != nil {
			t.Fatalf("start %d: Next = %v, %v", start, ok, err)
		}
		first := int(128 - start - 12)
		if len(rec.Data) != first || len(rec.Wrapped) != 44-first || rec.Len() != 44 {
			t.Fatalf("start %d: data %d wrapped %d", start, len(rec.Data), len(rec.Wrapped))
		}
		if &rec.Wrapped[0] != &f.Data[0] || &rec.Data[0] != &f.Data[start+12] {
			t.Fatalf("start %d: payload is not zero-copy", start)
		}
		buf := make([]byte, 0, 64)
		out := rec.AppendTo(buf[:0])
		if !bytes.Equal(out, payload) || &out[0] != &buf[:1][0] {
			t.Fatalf("start %d: AppendTo = %x", start, out)
		}
		if allocs := testing.AllocsPerRun(100, func() { buf = rec.AppendTo(buf[:0]) }); allocs != 0 {
			t.Fatalf("AppendTo into a big enough buffer: %v allocs", allocs)
		}
	}
}

func TestRawSizeFieldWraps(t *testing.T) {
	// The record starts 8 bytes before the end with an empty payload: the u32 size is the
	// first word of the ring and the payload is empty.
	f := ringtest.NewPerfAt(64, 64-8)
	b := perfReader(t, f)
	f.MustWrite(t, ringtest.PerfSample(nil)) // raw size 4: record 16
	b.Begin()
	var rec Record
	if ok, err := b.Next(&rec); !ok || err != nil {
		t.Fatalf("Next = %v, %v", ok, err)
	}
	if rec.Len() != 4 || rec.Next != 64+8 {
		t.Fatalf("record %+v", rec)
	}
}

func TestRawLostAndUnknown(t *testing.T) {
	f := ringtest.NewPerf(1024)
	b := perfReader(t, f)
	f.MustWrite(t, ringtest.PerfSample([]byte("a")))
	f.MustWrite(t, ringtest.PerfLost(7, 42))
	f.MustWrite(t, ringtest.PerfRecord(unix.PERF_RECORD_THROTTLE, 24, make([]byte, 16)))
	f.MustWrite(t, ringtest.PerfLost(7, 8))
	f.MustWrite(t, ringtest.PerfRecord(1234, 8, nil))
	f.MustWrite(t, ringtest.PerfSample([]byte("b")))

	b.Begin()
	recs := fakeCollect(t, b)
	// Records of other types are skipped, counted.
	types := []RecordType{RecordSample, RecordLost, RecordLost, RecordSample}
	if len(recs) != len(types) {
		t.Fatalf("%d records", len(recs))
	}
	for i, r := range recs {
		if r.Type != types[i] {
			t.Fatalf("record %d is %v, want %v", i, r.Type, types[i])
		}
		if r.Type != RecordSample && (r.Data != nil || r.Wrapped != nil) {
			t.Fatalf("record %d (%v) has a payload", i, r.Type)
		}
	}
	if recs[1].Lost != 42 || recs[2].Lost != 8 {
		t.Fatalf("records %+v", recs)
	}
	want := Stats{CPU: 1, Samples: 2, Bytes: 8, Lost: 50, Other: 2, MaxFill: int(f.Head)}
	if s := b.Stats(); s != want {
		t.Fatalf("stats %+v, want %+v", s, want)
	}
}

// The fake producer reports lost samples the way the kernel does.
func TestRawLostFromFullRing(t *testing.T) {
	f := ringtest.NewPerf(256)
	b := perfReader(t, f)
	p := ringtest.Pattern(52, 0) // 64-byte records
	for f.Write(ringtest.PerfSample(p)) {
	}
	f.Write(ringtest.PerfSample(p)) // two lost
	f.Publish()
	if _, err := b.Drain(func(*Record) error { return nil }); err != nil {
		t.Fatal(err)
	}
	f.MustWrite(t, ringtest.PerfSample(p))
	b.Begin()
	recs := fakeCollect(t, b)
	if len(recs) != 2 || recs[0].Type != RecordLost || recs[0].Lost != 2 || recs[1].Type != RecordSample {
		t.Fatalf("records %+v", recs)
	}
	if s := b.Stats(); s.Samples != 4 || s.Lost != 2 {
		t.Fatalf("stats %+v", s)
	}
}

func TestRawPeekThenBeginAgain(t *testing.T) {
	f := ringtest.NewPerf(1024)
	b := perfReader(t, f)
	for i := range 5 {
		f.MustWrite(t, ringtest.PerfSample(ringtest.Pattern(i*8, byte(i))))
	}
	b.Begin()
	first := fakeCollect(t, b)
	if len(first) != 5 || b.perf().Cur().Tail() != 0 {
		t.Fatalf("%d records, tail %d", len(first), b.perf().Cur().Tail())
	}
	b.Begin()
	second := fakeCollect(t, b)
	if len(second) != 5 {
		t.Fatalf("re-read %d records", len(second))
	}
	for i := range first {
		if first[i].Pos != second[i].Pos || !bytes.Equal(first[i].Data, second[i].Data) {
			t.Fatalf("record %d differs on re-read", i)
		}
	}
	// Commit the first two, then Begin re-reads from the third.
	if err := b.Commit(first[1].Next); err != nil {
		t.Fatal(err)
	}
	b.Begin()
	third := fakeCollect(t, b)
	if len(third) != 3 || third[0].Pos != first[2].Pos {
		t.Fatalf("after committing two: %d records from %d", len(third), third[0].Pos)
	}
	// Records read again are counted once.
	if s := b.Stats(); s.Samples != 5 {
		t.Fatalf("stats %+v", s)
	}
}

func TestRawRefresh(t *testing.T) {
	f := ringtest.NewPerf(1024)
	b := perfReader(t, f)
	f.MustWrite(t, ringtest.PerfSample([]byte("one")))
	b.Begin()
	f.MustWrite(t, ringtest.PerfSample([]byte("two")))
	if got := fakeCollect(t, b); len(got) != 1 {
		t.Fatalf("read %d records past the snapshot", len(got))
	}
	b.Refresh()
	got := fakeCollect(t, b)
	if len(got) != 1 || string(got[0].Data[:3]) != "two" {
		t.Fatalf("after Refresh: %+v", got)
	}
}

func TestRawCommitRules(t *testing.T) {
	f := ringtest.NewPerfAt(1024, 4096)
	b := perfReader(t, f)
	for range 4 {
		f.MustWrite(t, ringtest.PerfSample(make([]byte, 20))) // 32-byte records
	}
	b.Begin()
	var rec Record
	b.Next(&rec)
	b.Next(&rec) // cursor at 4096+64, head snapshot at 4096+128
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
		err := b.Commit(c.pos)
		prefix := fmt.Sprintf("commit perf ring cpu 1 to %d: ", c.pos)
		if !errors.Is(err, os.ErrInvalid) || !strings.HasPrefix(err.Error(), prefix) || !strings.Contains(err.Error(), c.reason) {
			t.Fatalf("Commit(%d) = %v, want os.ErrInvalid, %q", c.pos, err, prefix+c.reason)
		}
		if f.Page.Data_tail != 4096 || b.perf().Cur().Tail() != 4096 {
			t.Fatalf("Commit(%d) wrote data_tail %d (tail %d)", c.pos, f.Page.Data_tail, b.perf().Cur().Tail())
		}
	}
	if err := b.Commit(4096); err != nil {
		t.Fatalf("Commit(tail) = %v", err)
	}
	if err := b.Commit(4096 + 32); err != nil || f.Page.Data_tail != 4096+32 {
		t.Fatalf("Commit(first record) = %v, tail %d", err, f.Page.Data_tail)
	}
	if err := b.Commit(4096 + 64); err != nil || f.Page.Data_tail != 4096+64 {
		t.Fatalf("Commit(cursor) = %v, tail %d", err, f.Page.Data_tail)
	}
	if err := b.Commit(4096 + 32); !errors.Is(err, os.ErrInvalid) {
		t.Fatalf("Commit backwards = %v", err)
	}
	want := "commit perf ring cpu 1 to 4128: backwards from tail 4160: invalid argument"
	if err := b.Commit(4096 + 32); err.Error() != want {
		t.Fatalf("error %q, want %q", err, want)
	}
}

func TestRawDrainCommitsOnce(t *testing.T) {
	f := ringtest.NewPerf(4096)
	b := perfReader(t, f)
	for i := range 10 {
		f.MustWrite(t, ringtest.PerfSample(ringtest.Pattern(i, 0)))
	}
	n, err := b.Drain(func(rec *Record) error {
		if f.Page.Data_tail != 0 {
			t.Fatalf("data_tail moved to %d during the drain", f.Page.Data_tail)
		}
		return nil
	})
	if n != 10 || err != nil || f.Page.Data_tail != f.Head {
		t.Fatalf("Drain = %d, %v; tail %d, want %d", n, err, f.Page.Data_tail, f.Head)
	}
}

// fn's error stops Drain, which returns it; the record fn failed on counts as received and is
// committed with those before it, and the next Drain starts after it.
func TestRawDrainStopsOnError(t *testing.T) {
	f := ringtest.NewPerf(4096)
	b := perfReader(t, f)
	for i := range 10 {
		f.MustWrite(t, ringtest.PerfSample(ringtest.Pattern(4, byte(i)))) // 16-byte records
	}
	errStop := errors.New("stop")
	var seen []uint64
	n, err := b.Drain(func(rec *Record) error {
		seen = append(seen, rec.Pos)
		if rec.Pos == 16*3 {
			return errStop
		}
		return nil
	})
	if n != 4 || err != errStop || fmt.Sprint(seen) != "[0 16 32 48]" {
		t.Fatalf("Drain = %d, %v, saw %v; want 4, errStop, [0 16 32 48]", n, err, seen)
	}
	if f.Page.Data_tail != 16*4 || b.perf().Cur().Tail() != 16*4 {
		t.Fatalf("data_tail %d after the stop, want %d (up to and including the failed record)", f.Page.Data_tail, 16*4)
	}
	if s := b.Stats(); s.Samples != 4 || s.Bytes != 4*4 {
		t.Fatalf("stats %+v after the stop, want 4 samples", s)
	}
	seen = seen[:0]
	n, err = b.Drain(func(rec *Record) error {
		seen = append(seen, rec.Pos)
		return nil
	})
	if n != 6 || err != nil || seen[0] != 16*4 || f.Page.Data_tail != f.Head {
		t.Fatalf("rest: Drain = %d, %v from %v; tail %d", n, err, seen, f.Page.Data_tail)
	}
	// The same for records that are not plain samples (a lost record, a sample that wraps):
	// each takes them in parseRest.
	f = ringtest.NewPerfAt(128, 128-32)
	b = perfReader(t, f)
	f.MustWrite(t, ringtest.PerfLost(1, 5))
	f.MustWrite(t, ringtest.PerfSample(ringtest.Pattern(20, 1))) // 32 bytes from 120: wraps
	f.MustWrite(t, ringtest.PerfSample(nil))
	var types []RecordType
	n, err = b.Drain(func(rec *Record) error {
		types = append(types, rec.Type)
		if rec.Type == RecordSample {
			return errStop
		}
		return nil
	})
	if n != 2 || err != errStop || fmt.Sprint(types) != "[lost sample]" || f.Page.Data_tail != 128-32+24+32 {
		t.Fatalf("Drain = %d, %v, %v; data_tail %d", n, err, types, f.Page.Data_tail)
	}
}

// A nil fn is refused without touching the ring.
func TestRawDrainNil(t *testing.T) {
	f := ringtest.NewPerf(4096)
	f.MustWrite(t, ringtest.PerfSample(nil))
	b := perfReader(t, f)
	if n, err := b.Drain(nil); n != 0 || !errors.Is(err, os.ErrInvalid) {
		t.Fatalf("Drain(nil) = %d, %v; want os.ErrInvalid", n, err)
	}
	if f.Page.Data_tail != 0 || b.Stats().Samples != 0 {
		t.Fatalf("Drain(nil) read the ring: data_tail %d, stats %+v", f.Page.Data_tail, b.Stats())
	}
}

func TestRawDrainBoundedBySnapshot(t *testing.T) {
	f := ringtest.NewPerf(1 << 16)
	b := perfReader(t, f)
	f.MustWrite(t, ringtest.PerfSample(nil))
	n, err := b.Drain(func(rec *Record) error {
		// A producer as fast as the reader: one new record per record read.
		f.MustWrite(t, ringtest.PerfSample(nil))
		return nil
	})
	if n != 1 || err != nil {
		t.Fatalf("Drain = %d, %v", n, err)
	}
}

func TestRawDrainAllocs(t *testing.T) {
	f := ringtest.NewPerf(1 << 16)
	b := perfReader(t, f)
	for i := range 50 {
		f.Write(ringtest.PerfSample(make([]byte, i*7)))
	}
	f.Write(ringtest.PerfLost(1, 2))
	f.Write(ringtest.PerfRecord(77, 8, nil))
	f.Publish()
	var sum int
	fn := func(rec *Record) error { sum += rec.Len(); return nil }
	allocs := testing.AllocsPerRun(100, func() {
		// Hand the same records to the reader again by rewinding data_tail (the reader's
		// word; no producer runs here).
		atomic.StoreUint64(&f.Page.Data_tail, 0)
		if n, err := b.Drain(fn); n != 51 || err != nil { // the record of type 77 is skipped
			t.Fatalf("Drain = %d, %v", n, err)
		}
	})
	if allocs != 0 {
		t.Fatalf("Drain of 51 records: %v allocs", allocs)
	}
}

// fakeCorruptCase writes records that no kernel writes.
type fakeCorruptCase struct {
	name   string
	at     uint64   // ring offset where the records start
	recs   [][]byte // good records, then the bad one
	reason string
}

func fakeCorruptCases() []fakeCorruptCase {
	sample := func(n uint32, size uint16) []byte {
		body := make([]byte, int(size)-8)
		binary.NativeEndian.PutUint32(body, n)
		return ringtest.PerfRecord(unix.PERF_RECORD_SAMPLE, size, body)
	}
	return []fakeCorruptCase{
		{"size 0", 0, [][]byte{ringtest.PerfRecord(9, 0, make([]byte, 8))}, "record size 0"},
		{"size not multiple of 8", 0, [][]byte{ringtest.PerfRecord(9, 12, make([]byte, 8))}, "not a multiple of 8"},
		{"size larger than ring", 0, [][]byte{ringtest.PerfRecord(99, 2048, make([]byte, 8))}, "larger than the 1024-byte ring"},
		{"size past head", 0, [][]byte{ringtest.PerfRecord(99, 32, make([]byte, 8))}, "past the head"},
		{"sample size does not fit", 0, [][]byte{sample(21, 32)}, "sample size 21 does not fit record size 32"},
		{"sample over 64 KiB", 0, [][]byte{sample(70000, 32)}, "overflowed the u16"},
		{"sample without size", 0, [][]byte{ringtest.PerfRecord(9, 8, nil)}, "too short for its size field"},
		{"lost record short", 0, [][]byte{ringtest.PerfRecord(2, 16, make([]byte, 8))}, "lost record size 16 shorter than 24"},
		{"after good records", 48, [][]byte{ringtest.PerfSample(nil), ringtest.PerfSample(make([]byte, 20)), ringtest.PerfRecord(9, 0, make([]byte, 8))}, "record size 0"},
		{"wrapped sample size", 1024 - 8, [][]byte{sample(9, 16)}, "sample size 9 does not fit"},
	}
}

func TestRawCorrupt(t *testing.T) {
	for _, c := range fakeCorruptCases() {
		t.Run(c.name, func(t *testing.T) {
			f := ringtest.NewPerfAt(1024, 1<<20+c.at)
			bad := f.Head
			for i, r := range c.recs {
				if i == len(c.recs)-1 {
					bad = f.Head
				}
				f.Put(r)
			}
			f.Publish()
			b := perfReader(t, f)
			good := 0
			n, err := b.Drain(func(*Record) error { good++; return nil })
			var ce *CorruptError
			if !errors.Is(err, ErrCorrupt) || !errors.As(err, &ce) {
				t.Fatalf("Drain = %d, %v", n, err)
			}
			if !strings.Contains(ce.Reason, c.reason) || ce.CPU != 1 || ce.Pos != bad {
				t.Fatalf("error %+v, want %q at %d", ce, c.reason, bad)
			}
			if n != len(c.recs)-1 || good != n || b.perf().Cur().Tail() != bad {
				t.Fatalf("%d good records, tail %d", n, b.perf().Cur().Tail())
			}
			// Sticky: Next and Drain keep returning the same error.
			var rec Record
			for range 3 {
				if ok, err2 := b.Next(&rec); ok || err2 != err {
					t.Fatalf("Next after the error = %v, %v", ok, err2)
				}
			}
			b.Begin()
			if _, err2 := b.Drain(func(*Record) error { return nil }); !errors.Is(err2, ErrCorrupt) {
				t.Fatalf("Drain after the error = %v", err2)
			}
			// SkipCorrupt gets past it, and reading goes on.
			head := f.Head
			if skipped := b.SkipCorrupt(); skipped != head-ce.Pos {
				t.Fatalf("skipped %d, want %d", skipped, head-ce.Pos)
			}
			if st := b.Stats(); b.perf().Cur().Tail() != head || f.Page.Data_tail != head || st.Corrupt != 1 || st.CorruptBytes != head-ce.Pos || b.perf().Pending() != 0 {
				t.Fatalf("after SkipCorrupt: tail %d, stats %+v", b.perf().Cur().Tail(), st)
			}
			f.MustWrite(t, ringtest.PerfSample([]byte("ok")))
			var got string
			n, err = b.Drain(func(rec *Record) error { got = string(rec.Data[:2]); return nil })
			if n != 1 || err != nil || got != "ok" {
				t.Fatalf("after SkipCorrupt: Drain = %d, %v, %q", n, err, got)
			}
			if st := b.Stats(); st.Corrupt != 1 || st.Samples != uint64(len(c.recs)) {
				t.Fatalf("after SkipCorrupt: stats %+v", st)
			}
		})
	}
}

func TestRawCorruptErrorMessage(t *testing.T) {
	f := ringtest.NewPerfAt(8192, 4096)
	f.Put(ringtest.PerfRecord(9, 0, make([]byte, 8)))
	f.Publish()
	b := perfReader(t, f)
	b.Begin()
	_, err := b.Next(new(Record))
	want := "read ring 0 (cpu 1) at 4096: record size 0: corrupt ring record"
	if err == nil || err.Error() != want {
		t.Fatalf("error %q, want %q", err, want)
	}
}

func TestRawCorruptCursor(t *testing.T) {
	f := ringtest.NewPerf(1024)
	f.MustWrite(t, ringtest.PerfSample(nil))
	f.MustWrite(t, ringtest.PerfSample(nil))
	f.Page.Data_tail = 4 // a tail the reader never wrote
	b := perfReader(t, f)
	b.Begin()
	_, err := b.Next(new(Record))
	var ce *CorruptError
	if !errors.As(err, &ce) || ce.Reason != "cursor not 8-aligned" {
		t.Fatalf("Next = %v", err)
	}
	if b.SkipCorrupt() != 28 || b.perf().Cur().Tail() != 32 || b.Stats().Corrupt != 1 {
		t.Fatalf("tail %d, stats %+v after SkipCorrupt", b.perf().Cur().Tail(), b.Stats())
	}
}

func TestRawCorruptHead(t *testing.T) {
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
			b := perfReader(t, f)
			f.MustWrite(t, ringtest.PerfSample(nil))
			f.Page.Data_head = c.head
			n, err := b.Drain(func(*Record) error { return nil })
			var ce *CorruptError
			if n != 0 || !errors.As(err, &ce) || !errors.Is(err, ErrCorrupt) || !strings.Contains(ce.Reason, c.reason) {
				t.Fatalf("Drain = %d, %v", n, err)
			}
			if b.perf().Pending() != 0 || b.perf().Cur().Tail() != 4096 {
				t.Fatalf("pending %d, tail %d", b.perf().Pending(), b.perf().Cur().Tail())
			}
			b.SkipCorrupt()
			st := b.Stats()
			if c.name == "behind tail" {
				// The tail is what moved: SkipCorrupt resynchronises with the head.
				if b.perf().Cur().Tail() != c.head || st.Corrupt != 1 || st.CorruptBytes > 1024 {
					t.Fatalf("after SkipCorrupt: tail %d, stats %+v", b.perf().Cur().Tail(), st)
				}
			} else if b.perf().Cur().Tail() != 4096 || st.Corrupt != 1 || st.CorruptBytes != 0 {
				// A bad head is passed over, and nothing below it is skipped.
				t.Fatalf("after SkipCorrupt: tail %d, stats %+v", b.perf().Cur().Tail(), st)
			}
			if c.name != "behind tail" {
				if n, err := b.Drain(func(*Record) error { return nil }); n != 0 || err != nil {
					t.Fatalf("Drain while data_head keeps the bad value = %d, %v", n, err)
				}
			}
			// The next real record brings the kernel's head back; at most one more
			// SkipCorrupt gets the reader going again.
			f.MustWrite(t, ringtest.PerfSample(nil))
			got := 0
			for range 2 {
				var k int
				k, err = b.Drain(func(*Record) error { return nil })
				got += k
				if err == nil {
					break
				}
				b.SkipCorrupt()
			}
			if err != nil || b.perf().Cur().Tail() != f.Head {
				t.Fatalf("no recovery: %v, tail %d head %d", err, b.perf().Cur().Tail(), f.Head)
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

func TestRawHeadBackwards(t *testing.T) {
	f := ringtest.NewPerf(1024)
	b := perfReader(t, f)
	for range 4 {
		f.MustWrite(t, ringtest.PerfSample(nil))
	}
	b.Begin()
	var rec Record
	b.Next(&rec)
	f.Page.Data_head = 16 // from 64 back to 16, not behind the tail
	b.Refresh()
	if _, err := b.Next(&rec); !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), "moved backwards from 64 to 16") {
		t.Fatalf("Next = %v", err)
	}
}

func TestRawFullRing(t *testing.T) {
	// A ring exactly full (head = tail + size) is valid.
	f := ringtest.NewPerf(256)
	for range 8 {
		f.Put(ringtest.PerfSample(make([]byte, 20)))
	}
	f.Publish()
	b := perfReader(t, f)
	if n, err := b.Drain(func(*Record) error { return nil }); n != 8 || err != nil {
		t.Fatalf("Drain = %d, %v", n, err)
	}
}

func TestRawSkipCorruptWithoutError(t *testing.T) {
	f := ringtest.NewPerf(1024)
	b := perfReader(t, f)
	f.MustWrite(t, ringtest.PerfSample(nil))
	b.Begin()
	if n := b.SkipCorrupt(); n != 16 || b.perf().Cur().Tail() != 16 {
		t.Fatalf("SkipCorrupt = %d, tail %d", n, b.perf().Cur().Tail())
	}
	if s := b.Stats(); s.Samples != 0 || s.Corrupt != 0 || s.CorruptBytes != 16 {
		t.Fatalf("stats %+v", s)
	}
}

func TestRawNewValidation(t *testing.T) {
	page := new(unix.PerfEventMmapPage)
	for _, n := range []int{0, 4, 12, 1000} {
		if _, err := ring.NewPerfFromParts(0, page, make([]byte, n)); !errors.Is(err, os.ErrInvalid) {
			t.Errorf("data size %d: %v", n, err)
		}
	}
	if _, err := ring.NewPerfFromParts(0, nil, make([]byte, 64)); !errors.Is(err, os.ErrInvalid) {
		t.Errorf("nil page: %v", err)
	}
	if _, err := ring.NewPerf(0, nil, 64); !errors.Is(err, os.ErrInvalid) {
		t.Errorf("nil base: %v", err)
	}
}

// newPerfRing over one block of memory laid out as the kernel maps it.
func TestRawNewFromMapping(t *testing.T) {
	pageSize := os.Getpagesize()
	for _, dataOffset := range []uint64{0, uint64(pageSize), 2048} {
		// One Go block laid out like the mapping: the header page, then the data area.
		// uint64s keep the header 8-aligned for its atomics.
		mem := make([]uint64, (pageSize+4096)/8)
		base := unsafe.Pointer(&mem[0])
		page := (*unix.PerfEventMmapPage)(base)
		page.Data_offset = dataOffset
		r, err := ring.NewPerf(3, base, 4096)
		if err != nil {
			t.Fatalf("data offset %d: %v", dataOffset, err)
		}
		b := newRawBuffer(r, nil)
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
		if n, err := b.Drain(func(rec *Record) error { got = rec.AppendTo(nil); return nil }); n != 1 || err != nil {
			t.Fatalf("data offset %d: Drain = %d, %v", dataOffset, n, err)
		}
		if string(got[:5]) != "hello" || page.Data_tail != uint64(len(rec)) || b.CPU() != 3 {
			t.Fatalf("data offset %d: got %q, tail %d", dataOffset, got, page.Data_tail)
		}
	}
	mem := make([]uint64, (pageSize+4096)/8)
	page := (*unix.PerfEventMmapPage)(unsafe.Pointer(&mem[0]))
	page.Data_offset = 64 // inside the header
	if _, err := ring.NewPerf(0, unsafe.Pointer(&mem[0]), 4096); !errors.Is(err, os.ErrInvalid) {
		t.Errorf("data offset 64: %v", err)
	}
	page.Data_offset, page.Data_size = 0, 8192
	if _, err := ring.NewPerf(0, unsafe.Pointer(&mem[0]), 4096); !errors.Is(err, os.ErrInvalid) {
		t.Errorf("data size mismatch: %v", err)
	}
}

func TestRecordTypeString(t *testing.T) {
	if RecordSample.String() != "sample" || RecordLost.String() != "lost" || RecordType(9).String() != "RecordType(9)" {
		t.Fatal("RecordType.String")
	}
}

// After a corrupt record, Begin reads the good records before it again,
// and SkipCorrupt counts only the corrupt part as skipped, not the records
// that Begin went back over. (A pending error used to stop Next at any
// position, and SkipCorrupt counted from the cursor.)
func TestRawBeginAfterCorrupt(t *testing.T) {
	f := ringtest.NewPerf(1024)
	b := perfReader(t, f)
	f.MustWrite(t, ringtest.PerfSample(make([]byte, 20))) // 32 bytes
	f.MustWrite(t, ringtest.PerfSample(make([]byte, 20))) // 32 bytes
	f.MustWrite(t, ringtest.PerfRecord(9, 0, make([]byte, 8)))
	b.Begin()
	var rec Record
	for k := 0; k < 2; k++ {
		if ok, err := b.Next(&rec); !ok || err != nil {
			t.Fatal(ok, err)
		}
	}
	if _, err := b.Next(&rec); !errors.Is(err, ErrCorrupt) {
		t.Fatal(err)
	}
	b.Begin() // "Records read but not committed are read again"
	if ok, err := b.Next(&rec); !ok {
		t.Errorf("after Begin, the good record at the tail is not read again: %v", err)
	}
	b.Begin()
	if skipped := b.SkipCorrupt(); skipped != 16 {
		t.Errorf("SkipCorrupt skipped %d bytes; the corrupt part is 16 (the 64 before it are good records)", skipped)
	}
}

// A released RawBuffer fails its reads with os.ErrClosed: it used to read
// as an empty ring. Release hands the ring back once, and keeps Size and
// Stats.
func TestRawReleased(t *testing.T) {
	f := ringtest.NewPerf(4096)
	f.MustWrite(t, ringtest.PerfSample([]byte("abcd")))
	b := perfReader(t, f)
	if n, err := b.Drain(func(*Record) error { return nil }); n != 1 || err != nil {
		t.Fatalf("Drain = %d, %v", n, err)
	}
	f.MustWrite(t, ringtest.PerfSample([]byte("efgh")))
	handed := 0
	b.hand = func() { handed++ } // what PerfBuffer.Buffer sets
	b.Release()
	b.Release() // idempotent
	if handed != 1 {
		t.Errorf("Release handed the ring back %d times, want 1", handed)
	}
	var rec Record
	if ok, err := b.Next(&rec); ok || !errors.Is(err, os.ErrClosed) {
		t.Errorf("Next after Release: %v, %v; want os.ErrClosed", ok, err)
	}
	if _, err := b.Drain(func(*Record) error { return nil }); !errors.Is(err, os.ErrClosed) {
		t.Errorf("Drain after Release: %v, want os.ErrClosed", err)
	}
	if err := b.Commit(8); !errors.Is(err, os.ErrClosed) {
		t.Errorf("Commit after Release: %v, want os.ErrClosed", err)
	}
	b.Begin()
	b.Refresh()
	if n := b.SkipCorrupt(); n != 0 {
		t.Errorf("SkipCorrupt after Release skipped %d bytes", n)
	}
	if b.Size() != 4096 || b.Used() != 0 || b.CPU() != 1 {
		t.Errorf("after Release: Size %d Used %d CPU %d; want 4096 0 1", b.Size(), b.Used(), b.CPU())
	}
	if st := b.Stats(); st.Samples != 1 || st.Bytes != 4 || st.CPU != 1 {
		t.Errorf("after Release: stats %+v, want the 1 sample read before", st)
	}
	// The ring itself is left alone: the second record was not read.
	if f.Page.Data_tail != 16 {
		t.Errorf("data_tail %d after Release, want 16", f.Page.Data_tail)
	}
}

// each, the loop behind Drain, callback mode and the readers, delivers the records that start
// within limit bytes of where it began, plain samples and others alike (read again after
// Begin or not), and stops after the record during which its owner was closed. It does not
// commit.
func TestRawEach(t *testing.T) {
	f := ringtest.NewPerf(1024)
	for range 3 {
		f.MustWrite(t, ringtest.PerfSample(make([]byte, 20))) // 32 bytes: at 0, 32, 64
	}
	f.MustWrite(t, ringtest.PerfLost(1, 2)) // at 96, 24 bytes
	for range 2 {
		f.MustWrite(t, ringtest.PerfSample(make([]byte, 20))) // at 120, 152
	}
	var pos []uint64
	fn := func(r *Record) error { pos = append(pos, r.Pos); return nil }
	b := perfReader(t, f)
	for _, c := range []struct {
		limit uint64
		want  string
	}{
		{0, "[]"}, {1, "[0]"}, {32, "[0]"}, {33, "[0 32]"}, {96, "[0 32 64]"}, {97, "[0 32 64 96]"},
		{121, "[0 32 64 96 120]"}, {math.MaxUint64, "[0 32 64 96 120 152]"},
	} {
		for _, again := range []bool{false, true} { // fresh, then read again after Begin
			if !again {
				b = perfReader(t, f)
			}
			b.Begin()
			pos = pos[:0]
			var rec Record
			k, used, err := b.perf().Each(&rec, c.limit, &b.stop, fn, nil)
			if fmt.Sprint(pos) != c.want || k != len(pos) || err != nil {
				t.Errorf("limit %d (again %v): %d records at %v, %v; want %s", c.limit, again, k, pos, err, c.want)
			}
			if used != b.perf().Pos() {
				t.Errorf("limit %d (again %v): each says %d bytes, the cursor moved %d", c.limit, again, used, b.perf().Pos())
			}
			if f.Page.Data_tail != 0 {
				t.Fatalf("each committed to %d", f.Page.Data_tail)
			}
		}
	}
	if st := b.Stats(); st.Samples != 5 || st.Lost != 2 {
		t.Errorf("stats %+v: records read again were counted again", st)
	}

	var stop atomic.Bool
	b = perfReader(t, f)
	pos = pos[:0]
	b.Begin()
	k, _, err := b.perf().Each(new(Record), math.MaxUint64, &stop, func(r *Record) error {
		pos = append(pos, r.Pos)
		if r.Pos == 32 {
			stop.Store(true)
		}
		return nil
	}, nil)

	if k != 2 || err != nil || fmt.Sprint(pos) != "[0 32]" || b.perf().Cur().Pos() != 64 {
		t.Errorf("closed during the second record: %d records at %v, %v, cursor %d; want 2, cursor 64", k, pos, err, b.perf().Cur().Pos())
	}
}

// Positions are data_tail and data_head as the header page holds them.
func TestRawPositions(t *testing.T) {
	f := ringtest.NewPerfAt(1024, 4096)
	b := perfReader(t, f)
	f.MustWrite(t, ringtest.PerfSample([]byte("abc")))
	if c, p := b.Positions(); c != 4096 || p != 4096+16 {
		t.Fatalf("Positions = %d, %d; want 4096, 4112", c, p)
	}
	if _, err := b.Drain(func(*Record) error { return nil }); err != nil {
		t.Fatal(err)
	}
	if c, p := b.Positions(); c != 4112 || p != 4112 {
		t.Fatalf("after Drain: Positions = %d, %d; want 4112, 4112", c, p)
	}
}
