// SPDX-License-Identifier: Apache-2.0

package perfbuf

// RawBuffer's contract over a fake perf ring: what Begin, Next, Commit,
// Drain, SkipCorrupt, Stats and Release promise a user. The parse under
// them is internal/ring's (perf_test.go, perf_fuzz_test.go,
// perf_race_test.go).

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/perfbuf/perfbuf/internal/ringtest"
)

// One record through Begin, Next and Commit: the record, the positions,
// the stats, and Commit's refusal of a position that is no record boundary.
func TestRawBuffer(t *testing.T) {
	f := ringtest.NewPerfAt(4096, 8192)
	b := perfReader(t, f)
	if b.Size() != 4096 || b.CPU() != 1 || b.Used() != 0 || b.Stats() != (Stats{CPU: 1}) {
		t.Fatalf("empty: size %d cpu %d used %d stats %+v", b.Size(), b.CPU(), b.Used(), b.Stats())
	}
	f.MustWrite(t, ringtest.PerfSample([]byte("abcdefghijklm"))) // 13 bytes, padded to 20: 32 in the ring
	if c, p := b.Positions(); c != 8192 || p != 8192+32 || b.Used() != 32 {
		t.Fatalf("Positions = %d, %d, used %d; want 8192, 8224, 32", c, p, b.Used())
	}
	b.Begin()
	var rec Record
	if ok, err := b.Next(&rec); !ok || err != nil {
		t.Fatalf("Next = %v, %v", ok, err)
	}
	if rec.Type != RecordSample || rec.CPU != 1 || rec.Pos != 8192 || rec.Next != 8192+32 || rec.Len() != 20 || string(rec.Data[:13]) != "abcdefghijklm" {
		t.Fatalf("record %+v", rec)
	}
	if ok, err := b.Next(&rec); ok || err != nil {
		t.Fatalf("Next past the snapshot = %v, %v", ok, err)
	}
	want := "commit perf ring cpu 1 to 8196: not 8-aligned: invalid argument"
	if err := b.Commit(8192 + 4); !errors.Is(err, os.ErrInvalid) || err.Error() != want {
		t.Fatalf("Commit(8196) = %v, want %q", err, want)
	}
	if err := b.Commit(8192 + 64); !errors.Is(err, os.ErrInvalid) || f.Page.Data_tail != 8192 {
		t.Fatalf("Commit past the cursor = %v, data_tail %d", err, f.Page.Data_tail)
	}
	if err := b.Commit(rec.Next); err != nil || f.Page.Data_tail != rec.Next {
		t.Fatalf("Commit(%d) = %v, data_tail %d", rec.Next, err, f.Page.Data_tail)
	}
	f.MustWrite(t, ringtest.PerfLost(0, 3))
	if ok, _ := b.Next(&rec); ok {
		t.Fatal("Next read past the snapshot without Refresh")
	}
	b.Refresh()
	if ok, err := b.Next(&rec); !ok || err != nil || rec.Type != RecordLost || rec.Lost != 3 {
		t.Fatalf("after Refresh: %v, %v, %+v", ok, err, rec)
	}
	if st := b.Stats(); st != (Stats{CPU: 1, Samples: 1, Bytes: 20, Lost: 3, MaxFill: 32}) {
		t.Fatalf("stats %+v", st)
	}
}

// A corrupt record through the public API: Drain delivers and commits the
// records before it and returns a *CorruptError that matches ErrCorrupt and
// says where and what; Next returns it again until SkipCorrupt, which Stats
// counts.
func TestRawCorrupt(t *testing.T) {
	f := ringtest.NewPerfAt(8192, 4096)
	b := perfReader(t, f)
	f.MustWrite(t, ringtest.PerfSample(nil))
	f.MustWrite(t, ringtest.PerfRecord(9, 0, make([]byte, 8)))
	n, err := b.Drain(func(*Record) error { return nil })
	var ce *CorruptError
	if n != 1 || !errors.Is(err, ErrCorrupt) || !errors.As(err, &ce) || ce.Pos != 4096+16 || ce.CPU != 1 || !strings.Contains(ce.Reason, "record size 0") {
		t.Fatalf("Drain = %d, %v", n, err)
	}
	want := "read ring 0 (cpu 1) at 4112: record size 0: corrupt ring record"
	if err.Error() != want {
		t.Fatalf("error %q, want %q", err, want)
	}
	if c, _ := b.Positions(); c != 4096+16 {
		t.Fatalf("data_tail %d, want the records before the corrupt one committed", c)
	}
	if ok, err2 := b.Next(new(Record)); ok || err2 != err {
		t.Fatalf("Next after the error = %v, %v; want the same error", ok, err2)
	}
	if skipped := b.SkipCorrupt(); skipped != 16 {
		t.Fatalf("SkipCorrupt = %d, want 16", skipped)
	}
	if st := b.Stats(); st.Corrupt != 1 || st.CorruptBytes != 16 || st.Samples != 1 {
		t.Fatalf("stats %+v", st)
	}
	f.MustWrite(t, ringtest.PerfSample(nil))
	if n, err := b.Drain(func(*Record) error { return nil }); n != 1 || err != nil {
		t.Fatalf("Drain after SkipCorrupt = %d, %v", n, err)
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
	if f.Page.Data_tail != 16*4 {
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
