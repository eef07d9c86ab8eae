// SPDX-License-Identifier: Apache-2.0

package perfbuf

// RawBuffer's contract over a fake perf ring: what Begin, Next, Commit,
// Drain, SkipCorrupt, Stats and Release promise a user; the views of
// view.go; the raw views of ring buffers fuzzed and raced. The parse under
// them is internal/ring's (perf_test.go, perf_fuzz_test.go,
// perf_race_test.go).

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"reflect"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/perfbuf/perfbuf/internal/ringtest"
)

// One record through Begin, Next and Commit: the record, the bytes waiting,
// the stats, Commit's refusal of a position that is no record boundary, and
// Begin after a Commit taking in what was written since.
func TestRawBuffer(t *testing.T) {
	f := ringtest.NewPerfAt(4096, 8192)
	b := perfReader(t, f)
	// Size and Fill were 0 in a RawBuffer's Stats (its Size and Used
	// methods said them).
	if st := b.Stats(); !reflect.DeepEqual(st, Stats{CPU: 1, Size: 4096}) {
		t.Fatalf("empty: stats %+v; want CPU 1, Size 4096, nothing else", st)
	}
	f.MustWrite(t, ringtest.PerfSample([]byte("abcdefghijklm"))) // 13 bytes, padded to 20: 32 in the ring
	if fill := b.Stats().Fill; fill != 32 || f.Page.Data_tail != 8192 {
		t.Fatalf("Fill %d, data_tail %d; want 32, 8192", fill, f.Page.Data_tail)
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
		t.Fatal("Next read past the snapshot without Begin")
	}
	b.Begin()
	if ok, err := b.Next(&rec); !ok || err != nil || rec.Type != RecordLost || rec.Lost != 3 || rec.Pos != 8192+32 {
		t.Fatalf("after Begin: %v, %v, %+v", ok, err, rec)
	}
	if st := b.Stats(); !reflect.DeepEqual(st, Stats{CPU: 1, Samples: 1, Bytes: 20, Lost: 3, MaxFill: 32, Fill: 24, Size: 4096}) {
		t.Fatalf("stats %+v", st)
	}
}

// A corrupt record through the public API: Drain delivers and commits the
// records before it and returns a *CorruptError that matches ErrCorrupt and
// says where and what; Next returns it again until SkipCorrupt, which
// returns the bytes skipped and Stats counts.
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
	if c := f.Page.Data_tail; c != 4096+16 || b.Stats().Fill != 16 {
		t.Fatalf("data_tail %d, Fill %d; want the records before the corrupt one committed", c, b.Stats().Fill)
	}
	if ok, err2 := b.Next(new(Record)); ok || err2 != err {
		t.Fatalf("Next after the error = %v, %v; want the same error", ok, err2)
	}
	if skipped := b.SkipCorrupt(); skipped != 16 {
		t.Fatalf("SkipCorrupt = %d, want 16", skipped)
	}
	if st := b.Stats(); st.Corrupt != 1 || st.Samples != 1 || st.Fill != 0 {
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
	if n := b.SkipCorrupt(); n != 0 {
		t.Errorf("SkipCorrupt after Release skipped %d bytes", n)
	}
	if st := b.Stats(); st.Size != 4096 || st.Fill != 0 || st.CPU != 1 || st.Samples != 1 || st.Bytes != 4 {
		t.Errorf("after Release: stats %+v, want Size 4096, Fill 0, CPU 1 and the 1 sample read before", st)
	}
	// The ring itself is left alone: the second record was not read.
	if f.Page.Data_tail != 16 {
		t.Errorf("data_tail %d after Release, want 16", f.Page.Data_tail)
	}
}

// event8 has 8-byte fields: 8-aligned, so a perf ring's payload (at 4 mod
// 8) is copied, a ring buffer's is read in place.
type event8 struct {
	TS  uint64
	Seq uint32
	CPU uint32
}

// event4 has 4-byte fields at most: in place on both kinds.
type event4 struct {
	Seq  uint32
	Kind uint16
	Pad  uint16
	Comm [8]byte
}

// eventPayload is the bytes of an event8 {ts, seq, cpu}, then tail more.
func eventPayload(ts uint64, seq, cpu uint32, tail int) []byte {
	p := binary.NativeEndian.AppendUint64(nil, ts)
	p = binary.NativeEndian.AppendUint32(p, seq)
	p = binary.NativeEndian.AppendUint32(p, cpu)
	return append(p, make([]byte, tail)...)
}

// viewOf is NewView that fails the test.
func viewOf[T any](t *testing.T) View[T] {
	t.Helper()
	v, err := NewView[T]()
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// inPlace reports whether p points into data.
func inPlace[T any](p *T, data []byte) bool {
	a, b := uintptr(unsafe.Pointer(p)), uintptr(unsafe.Pointer(unsafe.SliceData(data)))
	return a >= b && a < b+uintptr(len(data))
}

// Over a perf ring an 8-aligned type is copied (its payload starts at 4 mod
// 8), a 4-aligned one is read in place; over a ring buffer both are in
// place. Either way the values are the payload's, and a longer payload is
// read from its start.
func TestViewRecordPlaces(t *testing.T) {
	v8, v4 := viewOf[event8](t), viewOf[event4](t)
	check := func(t *testing.T, rec *Record, want8, want4 bool) {
		t.Helper()
		var buf8 event8
		e, err := v8.Record(rec, &buf8)
		if err != nil {
			t.Fatal(err)
		}
		if e.TS != 7 || e.Seq != 3 || e.CPU != 1 {
			t.Errorf("event8 %+v, want {7 3 1}", *e)
		}
		if got := inPlace(e, rec.Data); got != want8 || !got && e != &buf8 {
			t.Errorf("event8 in place %v, want %v (a copy in buf)", got, want8)
		}
		var buf4 event4
		f, err := v4.Record(rec, &buf4)
		if err != nil {
			t.Fatal(err)
		}
		if want := binary.NativeEndian.Uint32(rec.Data); f.Seq != want {
			t.Errorf("event4 seq %d, want %d (the first 4 bytes)", f.Seq, want)
		}
		if got := inPlace(f, rec.Data); got != want4 {
			t.Errorf("event4 in place %v, want %v", got, want4)
		}
	}
	t.Run("perf", func(t *testing.T) {
		f := newFakeRings(t, 1, 4096)
		r := f.reader(t, ReaderOptions{})
		f.emit0(t, eventPayload(7, 3, 1, 24))
		eachOne(t, r, func(rec *Record) { check(t, rec, false, true) })
	})
	t.Run("ring buffer", func(t *testing.T) {
		f := newFakeBPFRings(t, 1, 4096)
		r := f.reader(t, ReaderOptions{})
		f.rings[0].Output(t, eventPayload(7, 3, 1, 24))
		eachOne(t, r, func(rec *Record) { check(t, rec, true, true) })
	})
}

// emit0 writes payload as a sample to ring 0 and wakes the reader.
func (f *fakeRings) emit0(t testing.TB, payload []byte) {
	t.Helper()
	f.rings[0].MustWrite(t, ringtest.PerfSample(payload))
	f.wake(0)
}

// eachOne runs fn on the next record r delivers, within a minute.
func eachOne(t *testing.T, r *Reader, fn func(*Record)) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	done := errors.New("done")
	if err := r.Each(ctx, func(rec *Record) error { fn(rec); return done }); err != done {
		t.Fatalf("Each: %v", err)
	}
}

// A payload that straddles a perf ring's end is copied whole, the part at
// the ring's start after the part at its end.
func TestViewRecordWrapped(t *testing.T) {
	v := viewOf[event4](t)
	f := newFakeRings(t, 1, 256)
	// The record starts 16 bytes before the end: its payload 4 before.
	f.rings[0] = ringtest.NewPerfAt(256, 256-16)
	r := f.reader(t, ReaderOptions{})
	payload := eventPayload(0, 0, 0, 4)
	copy(payload, []byte{1, 2, 3, 4, 5, 6, 0, 0, 'b', 'a', 's', 'h'})
	f.emit0(t, payload)
	eachOne(t, r, func(rec *Record) {
		if len(rec.Wrapped) == 0 {
			t.Fatalf("the record did not wrap: data %d bytes", len(rec.Data))
		}
		var buf event4
		e, err := v.Record(rec, &buf)
		if err != nil {
			t.Fatal(err)
		}
		want := event4{Seq: binary.NativeEndian.Uint32([]byte{1, 2, 3, 4}), Kind: binary.NativeEndian.Uint16([]byte{5, 6}), Comm: [8]byte{'b', 'a', 's', 'h'}}
		if e != &buf || *e != want {
			t.Errorf("wrapped: %+v (copy %v), want %+v in buf", *e, e == &buf, want)
		}
	})
}

// A misaligned payload of an 8-aligned type is copied whole whatever T's
// size: below 16 bytes and above 64 (not in line) as within them (16-byte
// moves in line), from a payload longer than T, and the bytes after T in
// buf are not written.
func TestViewCopySizes(t *testing.T) {
	testViewCopy[uint64](t)
	testViewCopy[[2]uint64](t)
	testViewCopy[[5]uint64](t)
	testViewCopy[[8]uint64](t)
	testViewCopy[[9]uint64](t)
}

func testViewCopy[T any](t *testing.T) {
	t.Helper()
	v := viewOf[T](t)
	size := int(unsafe.Sizeof(*new(T)))
	mem := make([]uint64, size/8+3)
	all := unsafe.Slice((*byte)(unsafe.Pointer(&mem[0])), len(mem)*8)
	for i := range all {
		all[i] = byte(i + 1)
	}
	data := all[4 : 4+size+4] // at 4 mod 8, 4 bytes longer than T
	buf := make([]T, 2)       // buf[1] must stay zero
	got := unsafe.Slice((*byte)(unsafe.Pointer(&buf[0])), 2*size)
	check := func(form string, e *T, err error) {
		t.Helper()
		if err != nil || e != &buf[0] || !bytes.Equal(got[:size], data[:size]) || !bytes.Equal(got[size:], make([]byte, size)) {
			t.Errorf("%d-byte %T, %s: %v, copy %v; got % x, want % x then zeros", size, *new(T), form, err, e == &buf[0], got, data[:size])
		}
		buf[0] = *new(T)
	}
	e, err := v.Record(&Record{Type: RecordSample, Data: data}, &buf[0])
	check("Record", e, err)
	e, err = v.Sample(&Sample{Type: RecordSample, Data: data}, &buf[0])
	check("Sample", e, err)
}

// A payload shorter than the type, and a lost record, are errors that say
// why; a View not made by NewView is refused.
func TestViewRecordShort(t *testing.T) {
	v := viewOf[event8](t)
	var buf event8
	rec := &Record{Type: RecordSample, Data: make([]byte, 12)}
	if _, err := v.Record(rec, &buf); !errors.Is(err, os.ErrInvalid) || !strings.Contains(err.Error(), "a 12-byte payload is shorter than its 16 bytes") {
		t.Errorf("short record: %v", err)
	}
	if _, err := v.Record(&Record{Type: RecordLost, Lost: 3}, &buf); !errors.Is(err, os.ErrInvalid) || !strings.Contains(err.Error(), "lost record") {
		t.Errorf("lost record: %v", err)
	}
	s := &Sample{Type: RecordSample, Data: make([]byte, 8)}
	if _, err := v.Sample(s, &buf); !errors.Is(err, os.ErrInvalid) || !strings.Contains(err.Error(), "a 8-byte payload is shorter than its 16 bytes") {
		t.Errorf("short sample: %v", err)
	}
	var zero View[event8]
	if _, err := zero.Record(&Record{Type: RecordSample, Data: make([]byte, 16)}, &buf); !errors.Is(err, os.ErrInvalid) {
		t.Errorf("zero View, record: %v", err)
	}
	if _, err := zero.Sample(&Sample{Type: RecordSample, Data: make([]byte, 16)}, &buf); !errors.Is(err, os.ErrInvalid) {
		t.Errorf("zero View, sample: %v", err)
	}
}

// A copy (Sample) is read in place when its Data is aligned for the type,
// copied otherwise.
func TestViewSample(t *testing.T) {
	v := viewOf[event8](t)
	mem := make([]uint64, 4)
	aligned := unsafe.Slice((*byte)(unsafe.Pointer(&mem[0])), 32)
	copy(aligned, eventPayload(7, 3, 1, 0))
	var buf event8
	s := &Sample{Type: RecordSample, Data: aligned[:20]}
	if e, err := v.Sample(s, &buf); err != nil || !inPlace(e, s.Data) || e.TS != 7 {
		t.Errorf("aligned: %+v, %v; want {7 3 1} in place", e, err)
	}
	copy(aligned[4:], eventPayload(8, 4, 2, 0))
	s.Data = aligned[4:24]
	if e, err := v.Sample(s, &buf); err != nil || e != &buf || *e != (event8{8, 4, 2}) {
		t.Errorf("misaligned: %+v, %v; want {8 4 2} in buf", e, err)
	}
}

// NewView refuses types a ring cannot hold, naming the part.
func TestNewViewRefuses(t *testing.T) {
	type withPtr struct {
		A uint64
		P *int
	}
	type nested struct {
		X [2]struct{ S string }
	}
	for _, c := range []struct {
		err  error
		want string
	}{
		{viewErr[withPtr](), "withPtr.P is a *int"},
		{viewErr[nested](), "nested.X[0].S is a string"},
		{viewErr[[]byte](), "[]uint8 is a []uint8"},
		{viewErr[struct{}](), "a type of size 0"},
		{viewErr[map[int]int](), "is a map[int]int"},
	} {
		if !errors.Is(c.err, os.ErrInvalid) || !strings.Contains(c.err.Error(), c.want) {
			t.Errorf("%v; want os.ErrInvalid naming %q", c.err, c.want)
		}
	}
	if _, err := NewView[[4]uint32](); err != nil {
		t.Errorf("an array of numbers: %v", err)
	}
}

func viewErr[T any]() error { _, err := NewView[T](); return err }

// A view allocates nothing a record, in place or copied.
func TestViewAllocs(t *testing.T) {
	v8 := viewOf[event8](t)
	data := eventPayload(7, 3, 1, 4)
	inRing := &Record{Type: RecordSample, Data: data}
	misaligned := &Record{Type: RecordSample, Data: append(make([]byte, 4, 64), data...)[4:]}
	var buf event8
	var sum uint64
	if n := testing.AllocsPerRun(100, func() {
		e, _ := v8.Record(inRing, &buf)
		f, _ := v8.Record(misaligned, &buf)
		sum += e.TS + f.TS
	}); n != 0 {
		t.Errorf("%v allocations a run", n)
	}
}

// BenchmarkView measures a read of three fields of each record over two
// filled fake perf rings: decoded by hand (binary.NativeEndian, the
// cilium/ebpf idiom without its copy), through a View of a 4-aligned type
// (in place) and of an 8-aligned one (copied: a perf payload sits at 4
// mod 8); in Each's callback, and in the caller's own loop over Batches
// (batches/...), beside the batch alone (decode) and the batch plus one
// copy by hand (copy-decode: the payload copied into an event8, then read).
func BenchmarkView(b *testing.B) {
	v8, _ := NewView[event8]()
	v4, _ := NewView[event4]()
	var buf8 event8
	var buf4 event4
	for _, c := range []struct {
		name string
		fn   func(*Record) error
		loop func(*Batch) error // instead of fn: the caller's loop over a batch
	}{
		{"decode", func(rec *Record) error {
			ringtest.Sink += binary.NativeEndian.Uint64(rec.Data) + uint64(binary.NativeEndian.Uint32(rec.Data[8:])+binary.NativeEndian.Uint32(rec.Data[12:]))
			return nil
		}, nil},
		{"view4", func(rec *Record) error {
			e, err := v4.Record(rec, &buf4)
			if err != nil {
				return err
			}
			ringtest.Sink += uint64(e.Seq) + uint64(e.Kind) + uint64(e.Comm[0])
			return nil
		}, nil},
		{"view8-copy", func(rec *Record) error {
			e, err := v8.Record(rec, &buf8)
			if err != nil {
				return err
			}
			ringtest.Sink += e.TS + uint64(e.Seq+e.CPU)
			return nil
		}, nil},
		{"batches/decode", nil, func(bt *Batch) error {
			for bt.Next() {
				d := bt.Record().Data
				ringtest.Sink += binary.NativeEndian.Uint64(d) + uint64(binary.NativeEndian.Uint32(d[8:])+binary.NativeEndian.Uint32(d[12:]))
			}
			return nil
		}},
		{"batches/view4", nil, func(bt *Batch) error {
			for bt.Next() {
				e, err := v4.Record(bt.Record(), &buf4)
				if err != nil {
					return err
				}
				ringtest.Sink += uint64(e.Seq) + uint64(e.Kind) + uint64(e.Comm[0])
			}
			return nil
		}},
		{"batches/copy-decode", nil, func(bt *Batch) error { // the batch plus one copy of the record, by hand
			for bt.Next() {
				buf8 = event8{}
				copy(unsafe.Slice((*byte)(unsafe.Pointer(&buf8)), unsafe.Sizeof(buf8)), bt.Record().Data)
				ringtest.Sink += buf8.TS + uint64(buf8.Seq+buf8.CPU)
			}
			return nil
		}},
		{"batches/view8-copy", nil, func(bt *Batch) error {
			for bt.Next() {
				e, err := v8.Record(bt.Record(), &buf8)
				if err != nil {
					return err
				}
				ringtest.Sink += e.TS + uint64(e.Seq+e.CPU)
			}
			return nil
		}},
	} {
		b.Run(c.name, func(b *testing.B) {
			f := newFakeRings(b, 2, benchRingSize)
			r := f.reader(b, ReaderOptions{MaxLatency: -1})
			rec := ringtest.PerfSample(eventPayload(1, 2, 3, 0))
			per := (benchRingSize - 4096) / len(rec)
			b.ReportAllocs()
			b.ResetTimer()
			for done := 0; done < b.N; done += 2 * per {
				b.StopTimer()
				for i := 0; i < 2*per; i++ {
					f.rings[i%2].Write(rec)
				}
				for _, ring := range f.rings {
					ring.Publish()
				}
				r.Flush()
				b.StartTimer()
				if c.fn != nil {
					r.Each(context.Background(), c.fn)
					continue
				}
				for bt, err := range r.Batches(context.Background()) {
					if err != nil || c.loop(bt) != nil {
						break
					}
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N), "ns/record")
		})
	}
}

// Fuzzing a Reader over several ring buffers (an array of ring buffers, a
// ring per CPU: issue 30, item 9): one ring of arbitrary bytes and
// positions among rings that a producer following the kernel's protocol
// wrote, some of them empty.

// FuzzReaderRingBufs reads rings 0..n-1 with one Reader; ring bad holds
// arbitrary bytes at arbitrary positions, each other ring counts[i]
// records (0: an empty ring), every third discarded. Consume must never
// panic, loop or hand out memory outside a ring; the only errors are
// *CorruptErrors of ring bad; every other ring's samples arrive once, in
// order, and its Stats after Close say so exactly (no corruption, nothing
// left, its discards counted). The bad ring's Stats count what it
// delivered. With n's top bit, the Reader is ordered (the window of
// copies: each good ring's keys, its seqs, rise), and each Consume
// follows a Flush.
//
// With move, another consumer stores a good ring's consumer_pos (a record
// boundary, behind or ahead of the reader's) before one of the first four
// Consumes: the read reports a *CorruptError of that ring ("by another
// writer"), once, and reads on (or, moved ahead while the reader had parsed
// nothing of that ring, takes it as its start: an upgrade's new reader); the ring's samples arrive at most once,
// in order, and none of those the other consumer took that the reader had
// not seen (past its last look at producer_pos). Every Consume runs
// under a deadline that it never meets: a read that spins (an ordered
// Flush that never ended) runs into it.
func FuzzReaderRingBufs(f *testing.F) {
	f.Add([]byte{}, uint8(2), uint8(0), uint64(0), uint64(0), []byte{3, 5}, uint8(0))
	f.Add(make([]byte, 64), uint8(4), uint8(3), uint64(4), uint64(64), []byte{0, 7, 1, 9}, uint8(0))
	f.Add([]byte{8, 0, 0, 0, 0, 0, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8}, uint8(3), uint8(1), uint64(0), uint64(16), []byte{2, 0, 4}, uint8(0))
	f.Add([]byte{0xff, 0xff, 0xff, 0x7f}, uint8(2), uint8(1), uint64(4096), uint64(8192), []byte{1, 1}, uint8(0))
	f.Add(make([]byte, 64), uint8(0x84), uint8(3), uint64(4), uint64(64), []byte{0, 7, 1, 9}, uint8(0))
	f.Add([]byte{8, 0, 0, 0, 0, 0, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8}, uint8(0x83), uint8(1), uint64(0), uint64(16), []byte{2, 0, 4}, uint8(0))
	f.Add(make([]byte, 64), uint8(0xc1), uint8(1), uint64(4), uint64(64), []byte{39, 38}, uint8(0))
	f.Add([]byte{0xff, 0xff, 0xff, 0x7f}, uint8(0xc2), uint8(2), uint64(0), uint64(1000), []byte{37, 39, 0}, uint8(0))
	f.Add(make([]byte, 64), uint8(0x81), uint8(0), uint64(0), uint64(0), []byte{0, 9}, uint8(0x03))    // ordered, forward over 2 records
	f.Add(make([]byte, 64), uint8(0x82), uint8(0), uint64(0), uint64(0), []byte{0, 9, 6}, uint8(0x10)) // ordered, back to the start
	f.Add(make([]byte, 64), uint8(0xc1), uint8(0), uint64(0), uint64(0), []byte{0, 30}, uint8(0x05))   // the hot ring, forward before the first read
	f.Add(make([]byte, 64), uint8(0xc1), uint8(0), uint64(0), uint64(0), []byte{0, 30}, uint8(0x2f))   // the hot ring, back
	f.Add(make([]byte, 64), uint8(0x01), uint8(0), uint64(0), uint64(0), []byte{0, 9}, uint8(0x03))    // fullest first, forward
	// Fullest first: the move while a pass is begun, after another ring's
	// error ended the Consume before ring 0's turn (a commit used to write
	// over the other consumer's position).
	f.Add([]byte("9"), uint8(0x39), uint8(1), uint64(0), uint64(64), []byte{121}, uint8(0x5d))
	f.Fuzz(func(t *testing.T, mem []byte, n, bad uint8, cons, prod uint64, counts []byte, move uint8) {
		// n: rings-1 in bits 0-1; bit 7 ordered; bit 6, rings of 1 KiB,
		// which 9 records or more fill past an eighth, and an ordered read
		// first without a Flush, MaxDelay 1 ns (rule 2's window: 1 key;
		// rule 3 at once), the second half of each ring's records written
		// from inside it (the window's hot ring: an intake while the
		// reader delivers).
		size := 4096
		if n&0x40 != 0 {
			size = 1024
		}
		rings := int(n%4) + 1
		badRing := int(bad) % rings
		fr := newFakeBPFRings(t, rings, size)
		want := make([][]uint64, rings)
		discards := make([]uint64, rings)
		starts := make([][]uint64, rings)         // each good ring's records' positions
		seqAt := make([]map[uint64]uint64, rings) // and their seqs
		write := func(i, from, to int) {
			rb := fr.rings[i]
			for j := from; j < to; j++ {
				seq := uint64(i)<<32 | uint64(j)
				p, ok := rb.Reserve(8)
				if !ok {
					t.Fatal("no room")
				}
				starts[i] = append(starts[i], p)
				if seqAt[i] == nil {
					seqAt[i] = map[uint64]uint64{}
				}
				seqAt[i][p] = seq
				rb.Write(p, bpfPayload(seq))
				discard := j%3 == 2
				rb.Commit(p, discard)
				if discard {
					discards[i]++
				} else {
					want[i] = append(want[i], seq)
				}
			}
		}
		ordered := n&0x80 != 0
		busy := ordered && n&0x40 != 0
		later := make([]int, rings)    // records written during the first read
		found := make([]uint64, rings) // and before it, at opening
		for i, rb := range fr.rings {
			if i == badRing {
				rb.Put(0, mem[:min(len(mem), size)])
				rb.Pos[0], rb.Pos[1], rb.Prod = cons, prod, prod
				continue
			}
			var c int
			if i < len(counts) {
				c = int(counts[i] % 40)
			}
			now := c
			if busy {
				now = c / 2
			}
			write(i, 0, now)
			later[i], found[i] = c, uint64(now)
		}
		writeLater := func() {
			for i := range later {
				if c := later[i]; c > 0 {
					write(i, c/2, c)
					later[i] = 0
				}
			}
		}
		var r *Reader
		switch {
		case busy:
			r = fr.ordered(t, Order{MaxDelay: time.Nanosecond})
		case ordered:
			r = fr.ordered(t, Order{MaxDelay: time.Hour})
		default:
			r = fr.reader(t, ReaderOptions{MaxLatency: -1})
			setBudget(r, 5*16, 2*16) // turns that end between records
		}
		// The other consumer: ring moved (a good one), before Consume
		// moveAt, to a record boundary picked by move's low bits.
		moved, moveAt := -1, int(move>>4)&3
		if move != 0 && rings > 1 {
			moved = (badRing + 1 + int(move>>6)%(rings-1)) % rings
		}
		var taken map[uint64]bool // seqs the other consumer took
		movedFrom, movedTo := uint64(0), uint64(0)
		got := make([][]uint64, rings)
		for call := 0; ; call++ {
			if call > 64 {
				t.Fatal("Consume still delivering or failing after 64 calls")
			}
			flush := ordered && (call > 0 || n&0x40 == 0)
			if busy && call > 0 {
				writeLater() // (if the first read delivered nothing)
			}
			if moved >= 0 && call == moveAt {
				rb := fr.rings[moved]
				movedFrom, movedTo = atomic.LoadUint64(&rb.Pos[0]), rb.Prod
				if k := int(move&15) % (len(starts[moved]) + 1); k < len(starts[moved]) {
					movedTo = starts[moved][k]
				}
				// The records the other consumer took that the reader has not
				// seen (past its head snapshot) are that consumer's alone;
				// those the reader saw, it may deliver too.
				seen := r.r.C.Rings[moved].Cur().Head()
				taken = map[uint64]bool{}
				for _, p := range starts[moved] {
					if seq, ok := seqAt[moved][p]; ok && int64(p-max(movedFrom, seen)) >= 0 && int64(p-movedTo) < 0 {
						taken[seq] = true
					}
				}
				atomic.StoreUint64(&rb.Pos[0], movedTo)
			}
			if flush {
				r.Flush() // (the window releases nothing else but a hot ring: shared rings, MaxDelay an hour)
			}
			r.SetDeadline(time.Now().Add(10 * time.Second)) // (never met, but by a spin)
			k, err := r.Consume(func(rec *Record) error {
				i := rec.Ring
				if i < 0 || i >= rings {
					t.Fatalf("record of ring %d", i)
				}
				if !ordered { // (the window hands out copies)
					checkInRing(t, fr.rings[i], rec.Data)
				}
				got[i] = append(got[i], seq8(rec.Data))
				if busy {
					writeLater()
				}
				return nil
			})
			var ce *CorruptError
			switch {
			case errors.Is(err, os.ErrDeadlineExceeded):
				t.Fatalf("Consume %d spins: %v", call, err)
			case err != nil && errors.As(err, &ce) && ce.Ring == moved && movedFrom != movedTo:
				if !strings.Contains(ce.Reason, "by another writer") {
					t.Fatalf("Consume: %v; want ring %d's consumer position changed by another writer", err, moved)
				}
			case err != nil && (!errors.As(err, &ce) || ce.Ring != badRing):
				t.Fatalf("Consume: %v; only ring %d may be corrupt", err, badRing)
			}
			if err == nil && k == 0 && (flush || !ordered) && (moved < 0 || call >= moveAt) {
				break
			}
		}
		if err := r.Close(); err != nil {
			t.Fatal(err)
		}
		for i, st := range r.Stats().Rings {
			if i == moved {
				// At most once, in order, none the other consumer took; the
				// move reported once; nothing left behind.
				k := 0
				for _, seq := range got[i] {
					for k < len(want[i]) && want[i][k] != seq {
						k++
					}
					if k == len(want[i]) || taken[seq] {
						t.Fatalf("ring %d (consumer_pos moved from %d to %d): delivered %v, want a part of %v without %v", i, movedFrom, movedTo, got[i], want[i], taken)
					}
					k++
				}
				// Reported once; or, moved forward while the reader had
				// parsed nothing of the ring, taken as its start (adopted).
				corrupt := uint64(0)
				if movedFrom != movedTo {
					corrupt = 1
				}
				adopted := int64(movedTo-movedFrom) > 0 && st.Corrupt == 0
				if st.Samples != uint64(len(got[i])) || st.Corrupt != corrupt && !adopted || st.Left != 0 {
					t.Errorf("ring %d (consumer_pos moved from %d to %d): delivered %d, Stats %+v; want %d corruption, nothing left", i, movedFrom, movedTo, len(got[i]), st, corrupt)
				}
				continue
			}
			if i == badRing {
				if st.Samples != uint64(len(got[i])) {
					t.Errorf("ring %d (arbitrary): delivered %d, Stats %+v", i, len(got[i]), st)
				}
				continue
			}
			if len(got[i]) != len(want[i]) {
				t.Fatalf("ring %d: delivered %v, want %v", i, got[i], want[i])
			}
			for j := range want[i] {
				if got[i][j] != want[i][j] {
					t.Fatalf("ring %d: delivered %v, want %v", i, got[i], want[i])
				}
			}
			if st.Samples != uint64(len(want[i])) || st.Discarded != discards[i] || st.Left != 0 || st.Corrupt != 0 || st.Found != found[i] {
				t.Errorf("ring %d: Stats %+v; want %d samples, %d discarded, %d found at opening, nothing left or corrupt", i, st, len(want[i]), discards[i], found[i])
			}
		}
	})
}

// checkInRing checks that data lies in rb's data area (both copies).
func checkInRing(t *testing.T, rb *ringtest.RingBuf, data []byte) {
	t.Helper()
	if len(data) == 0 {
		return
	}
	lo := uintptr(unsafe.Pointer(unsafe.SliceData(rb.Data)))
	p := uintptr(unsafe.Pointer(unsafe.SliceData(data)))
	if p < lo || p+uintptr(len(data)) > lo+uintptr(len(rb.Data)) {
		t.Fatalf("a record of %d bytes at %#x, outside the ring's area [%#x, %#x)", len(data), p, lo, lo+uintptr(len(rb.Data)))
	}
}

// Close racing a read over several ring buffers (an array of ring buffers,
// a ring per CPU: issue 30, item 9), and a Reader opened again over them.

// Producers follow the kernel's protocol on each of 4 ring buffers (a
// ring per CPU), every fifth record discarded, waiting for room when a
// ring is full, while a Reader's Each delivers; the producers stop (as the
// failure map's key stops them) and Close comes while Each runs, after a
// delay that varies. Per ring: every sample delivered is delivered once,
// in order; Samples + Discarded + Left are the records committed. A second
// Reader over the same rings then finds what the first left (Found),
// delivers it, and the two together deliver every sample once.
func TestRingBufsCloseRace(t *testing.T) {
	const rings = 4
	for _, delay := range []time.Duration{0, 50 * time.Microsecond, 500 * time.Microsecond, 2 * time.Millisecond} {
		t.Run(fmt.Sprint(delay), func(t *testing.T) {
			f := newFakeBPFRings(t, rings, 4096)
			var stop atomic.Bool
			committed := make([]uint64, rings) // records, discarded ones included
			samples := make([]uint64, rings)   // samples committed: seqs 0..samples-1 of ring i
			var producers sync.WaitGroup
			for i, rb := range f.rings {
				producers.Add(1)
				go func() {
					defer producers.Done()
					for j := uint64(0); !stop.Load(); j++ {
						p, ok := rb.Reserve(8)
						for ; !ok && !stop.Load(); p, ok = rb.Reserve(8) {
							runtime.Gosched() // full: wait for the reader
						}
						if !ok {
							return
						}
						discard := j%5 == 4
						rb.Write(p, bpfPayload(uint64(i)<<32|samples[i]))
						rb.Commit(p, discard)
						committed[i]++
						if !discard {
							samples[i]++
						}
					}
				}()
			}
			got := make([][]uint64, rings)
			deliver := func(rec *Record) error {
				got[rec.Ring] = append(got[rec.Ring], seq8(rec.Data))
				return nil
			}
			r := f.reader(t, ReaderOptions{MaxLatency: -1})
			done := make(chan error, 1)
			go func() { done <- r.Each(context.Background(), deliver) }()
			time.Sleep(delay)
			stop.Store(true)
			producers.Wait()
			r.Close()
			select {
			case err := <-done:
				if !errors.Is(err, os.ErrClosed) {
					t.Fatalf("Each: %v, want os.ErrClosed", err)
				}
			case <-time.After(10 * time.Second):
				t.Fatal("Each still running 10 s after Close")
			}
			st1 := r.Stats().Rings
			first := make([]int, rings)
			for i := range rings {
				first[i] = len(got[i])
				if st1[i].Samples != uint64(first[i]) || st1[i].Samples+st1[i].Discarded+st1[i].Left != committed[i] {
					t.Errorf("ring %d: delivered %d, %d committed, Stats %+v", i, first[i], committed[i], st1[i])
				}
			}

			r2 := f.reader(t, ReaderOptions{MaxLatency: -1})
			if _, err := r2.Consume(deliver); err != nil {
				t.Fatal(err)
			}
			if err := r2.Close(); err != nil {
				t.Fatal(err)
			}
			st2 := r2.Stats().Rings
			var total, left uint64
			for i := range rings {
				a, b := st1[i], st2[i]
				left += a.Left
				if b.Found < a.Left || b.Found-a.Left > a.Discarded || b.Samples != a.Left || b.Left != 0 {
					t.Errorf("ring %d: the first left %d (Stats %+v); the second found %d, delivered %d (Stats %+v)", i, a.Left, a, b.Found, b.Samples, b)
				}
				if uint64(len(got[i])) != samples[i] {
					t.Errorf("ring %d: delivered %d of %d samples", i, len(got[i]), samples[i])
				}
				for j, seq := range got[i] {
					if seq != uint64(i)<<32|uint64(j) {
						t.Fatalf("ring %d: sample %d is seq %#x, want %#x (once each, in order)", i, j, seq, uint64(i)<<32|uint64(j))
					}
				}
				total += committed[i]
			}
			t.Logf("Close after %v: %d records committed on %d rings, %d samples left to the second reader", delay, total, rings, left)
		})
	}
}
