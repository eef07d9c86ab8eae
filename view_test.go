// SPDX-License-Identifier: Apache-2.0

package perfbuf

import (
	"context"
	"encoding/binary"
	"errors"
	"os"
	"strings"
	"testing"
	"time"
	"unsafe"

	"github.com/perfbuf/perfbuf/internal/ringtest"
)

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
		if f.Seq != 7 {
			t.Errorf("event4 seq %d, want 7 (the first 4 bytes)", f.Seq)
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

// BenchmarkView measures Each over two filled fake perf rings with the
// callback reading three fields of each record: decoded by hand
// (binary.NativeEndian, the cilium/ebpf idiom without its copy), through a
// View of a 4-aligned type (in place) and of an 8-aligned one (copied: a
// perf payload sits at 4 mod 8).
func BenchmarkView(b *testing.B) {
	v8, _ := NewView[event8]()
	v4, _ := NewView[event4]()
	var buf8 event8
	var buf4 event4
	for _, c := range []struct {
		name string
		fn   func(*Record) error
	}{
		{"decode", func(rec *Record) error {
			ringtest.Sink += binary.NativeEndian.Uint64(rec.Data) + uint64(binary.NativeEndian.Uint32(rec.Data[8:])+binary.NativeEndian.Uint32(rec.Data[12:]))
			return nil
		}},
		{"view4", func(rec *Record) error {
			e, err := v4.Record(rec, &buf4)
			if err != nil {
				return err
			}
			ringtest.Sink += uint64(e.Seq) + uint64(e.Kind) + uint64(e.Comm[0])
			return nil
		}},
		{"view8-copy", func(rec *Record) error {
			e, err := v8.Record(rec, &buf8)
			if err != nil {
				return err
			}
			ringtest.Sink += e.TS + uint64(e.Seq+e.CPU)
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
				r.Each(context.Background(), c.fn)
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N), "ns/record")
		})
	}
}
