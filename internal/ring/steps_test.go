// SPDX-License-Identifier: Apache-2.0

package ring

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"unsafe"

	"github.com/perfbuf/perfbuf/internal/ringtest"
)

// next is the root's Batch.Next, the step over a run (the root's own tests
// run it over both kinds): written again here, so that this package's
// tests drive the loops as a caller does.
func (s *Steps) next() bool {
	pos := s.Pos
	p := unsafe.Add(s.Base, pos&s.Mask)
	h := atomic.LoadUint64((*uint64)(p))
	n := uint64(atomic.LoadUint32((*uint32)(unsafe.Add(p, s.LenOff))))
	size := (n + s.Pad) &^ 7
	if size > s.End-pos || (h^size<<HeaderSizeShift)&s.HMask != s.HType {
		return false
	}
	s.N = n
	s.Pos += size
	s.Acc += n + 1<<AccShift
	return true
}

// record is the root's Batch.Record.
func (s *Steps) record() *Record {
	if s.One != nil {
		return s.One
	}
	pos := s.Pos - (s.N+s.Pad)&^7
	p := unsafe.Add(s.Base, uintptr(pos&s.Mask)+s.DataOff)
	s.Rec.Data = unsafe.Slice((*byte)(p), s.N)
	s.Rec.Pos, s.Rec.Next = pos, s.Pos
	if s.KeyEnd != 0 {
		s.Rec.Key = binary.NativeEndian.Uint64(unsafe.Slice((*byte)(unsafe.Add(p, s.KeyEnd-8)), 8))
	}
	return &s.Rec
}

// first is the root's check before a run is handed out: ErrNoRun when the
// step does not take its first record.
func (s *Steps) first() error {
	pos, acc := s.Pos, s.Acc
	ok := s.next()
	s.Pos, s.Acc = pos, acc
	if !ok {
		return ErrNoRun
	}
	return nil
}

// stepsSink returns a sink whose runs go to fn, record by record, as the
// root's Batches hands them to a caller's loop; fn's error ends the loop.
func stepsSink(fn func(*Record) error) *Sink {
	s := &Sink{Steps: new(Steps)}
	s.Yield = func(st *Steps) error {
		if err := st.first(); err != nil {
			return err
		}
		for st.next() {
			if err := fn(st.record()); err != nil {
				return err
			}
		}
		return nil
	}
	return s
}

// stepsLog is what a loop into Steps delivered: each record's payload and
// positions, and how: in a run (Steps.Next) or one at a time (the
// function).
type stepsLog struct {
	runs, inRuns, alone int
	recs                []string
}

// stepsSink returns a sink whose runs the log takes whole.
func (l *stepsLog) sink() *Sink {
	s := &Sink{Steps: new(Steps)}
	s.Yield = func(st *Steps) error {
		if err := st.first(); err != nil {
			return err
		}
		l.runs++
		for st.next() {
			l.inRuns++
			l.add(st.record())
		}
		return nil
	}
	return s
}

func (l *stepsLog) fn(rec *Record) error {
	l.alone++
	l.add(rec)
	return nil
}

func (l *stepsLog) add(rec *Record) {
	l.recs = append(l.recs, fmt.Sprintf("%v %d-%d cpu %d ring %d %x lost %d key %d", rec.Type, rec.Pos, rec.Next, rec.CPU, rec.Ring, rec.AppendTo(nil), rec.Lost, rec.Key))
}

// A ring buffer's committed samples go in runs, stepped through in place;
// a discarded record is skipped, and the busy one ends the loop. The same
// records, positions and counts as the loop with a function.
func TestStepsRingBuf(t *testing.T) {
	f := ringtest.NewRingBuf(4096)
	for i := range 40 {
		f.Output(t, ringtest.Pattern(1+i*7%100, byte(i)))
		if i == 20 {
			pos, _ := f.Reserve(8)
			f.Commit(pos, true) // discarded
		}
	}
	busy, _ := f.Reserve(16) // never committed
	f.Output(t, []byte{1})   // behind the busy one
	_ = busy

	var want, got stepsLog
	r := fakeReader(t, f)
	r.Begin()
	n, _, err := r.Each(new(Record), ^uint64(0), nil, want.fn, nil)
	if err != nil || n != 40 {
		t.Fatalf("each: %d, %v", n, err)
	}
	r2 := fakeReader(t, f)
	r2.Begin()
	n2, _, err := r2.Each(new(Record), ^uint64(0), nil, got.fn, got.sink())
	if err != nil || n2 != 40 || strings.Join(got.recs, "\n") != strings.Join(want.recs, "\n") {
		t.Fatalf("steps: %d, %v:\n%s\nwant\n%s", n2, err, strings.Join(got.recs, "\n"), strings.Join(want.recs, "\n"))
	}
	if got.runs != 2 || got.inRuns != 40 || got.alone != 0 {
		t.Errorf("%d runs of %d records, %d alone; want the 40 in 2 runs (before and after the discarded one)", got.runs, got.inRuns, got.alone)
	}
	if *r2.Counts() != *r.Counts() || r2.Pos() != r.Pos() {
		t.Errorf("steps counted %+v at %d, each %+v at %d", *r2.Counts(), r2.Pos(), *r.Counts(), r.Pos())
	}
}

// An ordered run (a sink with KeyEnd) in Steps: its samples whose keys
// rise within [Lo, Hi] go in runs with their keys, and the loop stops
// where the loop with a function stops (a key out of bounds, a sample too
// short for its key), with the same records, keys, Lo, counts and cursor.
func TestStepsKeyed(t *testing.T) {
	const lo, hi = 5, 100
	for _, tc := range []struct {
		name string
		keys []int // -1: a sample too short to hold its key; -2: key 20 in a record larger than keyedMax
		runs int   // runs stepped (the last record before the head goes alone)
		// alone: records taken alone (after one larger than keyedMax, the
		// next one too: the loop tries no run until it took a small one)
		alone int
	}{
		{"above Hi", []int{5, 6, 6, 9, 40, 41, 101, 50, 60}, 1, 0},
		{"below the last", []int{7, 8, 9, 9, 8, 10, 11}, 1, 0},
		{"below Lo first", []int{4, 6, 7}, 0, 0},
		{"too short", []int{6, 7, 8, -1, 9, 10}, 1, 0},
		{"to the head", []int{6, 7, 8, 9, 10, 11}, 1, 1},
		{"a large record", []int{6, 7, 8, -2, 21, 22, 23}, 2, 3},
	} {
		payload := func(i, key int) []byte {
			switch key {
			case -1:
				return []byte{1, 2, 3, 4}
			case -2:
				return append(binary.NativeEndian.AppendUint64(nil, 20), make([]byte, keyedMax)...)
			}
			b := binary.NativeEndian.AppendUint64(nil, uint64(key))
			return append(b, ringtest.Pattern(1+i*5%30, byte(i))...)
		}
		check := func(t *testing.T, each func(fn func(*Record) error, s *Sink) (int, error), counts func() string) {
			t.Helper()
			var want, got stepsLog
			ws, gs := &Sink{KeyEnd: 8, Lo: lo, Hi: hi}, got.sink()
			gs.KeyEnd, gs.Lo, gs.Hi = 8, lo, hi
			n, err := each(want.fn, ws)
			wantCounts := counts()
			n2, err2 := each(got.fn, gs)
			if err != nil || err2 != nil || n != n2 || gs.Lo != ws.Lo || strings.Join(got.recs, "\n") != strings.Join(want.recs, "\n") {
				t.Fatalf("steps: %d, %v, Lo %d:\n%s\nwant %d, %v, Lo %d:\n%s", n2, err2, gs.Lo, strings.Join(got.recs, "\n"), n, err, ws.Lo, strings.Join(want.recs, "\n"))
			}
			if got.runs != tc.runs || got.alone != tc.alone || got.inRuns+got.alone != n {
				t.Errorf("%d runs of %d records, %d alone; want %d runs, %d alone", got.runs, got.inRuns, got.alone, tc.runs, tc.alone)
			}
			if c := counts(); c != wantCounts {
				t.Errorf("steps counted %s, each %s", c, wantCounts)
			}
		}
		t.Run("ringbuf/"+tc.name, func(t *testing.T) {
			f := ringtest.NewRingBuf(4096)
			for i, key := range tc.keys {
				f.Output(t, payload(i, key))
			}
			var r *RingBuf
			check(t, func(fn func(*Record) error, s *Sink) (int, error) {
				r = fakeReader(t, f)
				r.Begin()
				n, _, err := r.Each(new(Record), ^uint64(0), nil, fn, s)
				return n, err
			}, func() string { return fmt.Sprintf("%+v at %d", *r.Counts(), r.Pos()) })
		})
		t.Run("perf/"+tc.name, func(t *testing.T) {
			var r *Perf
			check(t, func(fn func(*Record) error, s *Sink) (int, error) {
				f := ringtest.NewPerfAt(4096, 1<<32) // the same records each time
				for i, key := range tc.keys {
					f.MustWrite(t, ringtest.PerfSample(payload(i, key)))
				}
				r = perfReader(t, f)
				r.Begin()
				n, _, err := r.Each(new(Record), ^uint64(0), new(atomic.Bool), fn, s)
				return n, err
			}, func() string { return fmt.Sprintf("%+v at %d", *r.Counts(), r.Pos()) })
		})
	}
}

// keyedSame checks an ordered run into Steps against the same run with a
// function (the fuzz targets): each runs a fresh reader's loop over the
// same ring with sink s (KeyEnd, Lo and Hi set), and returns what it
// delivered and the reader's counts and position. The caller of Steps
// moves on after 1 to 3 records of a run (the rest come in the next). The
// same records with their keys, error, Lo, counts and position.
func keyedSame(t *testing.T, keyEnd, lo, hi, moveOn uint64, each func(fn func(*Record) error, s *Sink) (int, string, error)) {
	t.Helper()
	var want, got []string
	add := func(l *[]string) func(*Record) error {
		return func(rec *Record) error {
			*l = append(*l, fmt.Sprintf("%v %d-%d %x key %d", rec.Type, rec.Pos, rec.Next, rec.AppendTo(nil), rec.Key))
			return nil
		}
	}
	ws := &Sink{KeyEnd: keyEnd, Lo: lo, Hi: hi}
	n, state, err := each(add(&want), ws)
	gs := &Sink{KeyEnd: keyEnd, Lo: lo, Hi: hi, Steps: new(Steps)}
	gs.Yield = func(st *Steps) error {
		if err := st.first(); err != nil {
			return err
		}
		for j := uint64(0); st.next(); j++ {
			add(&got)(st.record())
			if j == moveOn%3 {
				break
			}
		}
		return nil
	}
	n2, state2, err2 := each(add(&got), gs)
	if n2 != n || fmt.Sprint(err2) != fmt.Sprint(err) || gs.Lo != ws.Lo || state2 != state || fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("keyed run [%d, %d] ending at %d into steps: %d, %v, Lo %d, %s:\n%v\nwith a function: %d, %v, Lo %d, %s:\n%v",
			lo, hi, keyEnd, n2, err2, gs.Lo, state2, got, n, err, ws.Lo, state, want)
	}
}

// A perf ring's plain samples go in runs; a lost record, a sample that
// straddles the ring's end and one within 16 bytes of it go one at a time
// through the function, in their places.
func TestStepsPerf(t *testing.T) {
	const size = 1024
	f, f2 := ringtest.NewPerfAt(size, 1<<32), ringtest.NewPerfAt(size, 1<<32) // the same records in each
	var want, got stepsLog
	r, r2 := perfReader(t, f), perfReader(t, f2)
	for round := range 3 {
		for i := range 12 {
			for _, f := range []*ringtest.Perf{f, f2} {
				f.MustWrite(t, ringtest.PerfSample(ringtest.Pattern(4+(i+round)*13%60, byte(i))))
				if i == 5 {
					f.MustWrite(t, ringtest.PerfLost(7, uint64(round+1)))
				}
			}
		}
		if _, err := perfDrain(r, want.fn); err != nil {
			t.Fatal(err)
		}
		r2.Begin()
		var stop atomic.Bool
		if _, _, err := r2.Each(new(Record), ^uint64(0), &stop, got.fn, got.sink()); err != nil {
			t.Fatal(err)
		}
		r2.CommitCursor()
	}
	if strings.Join(got.recs, "\n") != strings.Join(want.recs, "\n") {
		t.Fatalf("steps:\n%s\nwant\n%s", strings.Join(got.recs, "\n"), strings.Join(want.recs, "\n"))
	}
	if got.alone < 3 || got.inRuns < 30 || got.inRuns+got.alone != len(want.recs) {
		t.Errorf("%d records in %d runs, %d alone, of %d; want the lost ones and those at the ring's end alone", got.inRuns, got.runs, got.alone, len(want.recs))
	}
	if *r2.Counts() != *r.Counts() {
		t.Errorf("steps counted %+v, each %+v", *r2.Counts(), *r.Counts())
	}
}

// A run the caller leaves part way (it moved on) goes on where it left:
// nothing is skipped, nothing delivered twice; a Yield that takes nothing
// ends the loop, and its error ends it with that error.
func TestStepsMovedOn(t *testing.T) {
	f := ringtest.NewRingBuf(4096)
	for i := range 30 {
		f.Output(t, []byte{byte(i), 0, 0, 0})
	}
	r := fakeReader(t, f)
	r.Begin()
	var seen []byte
	calls := 0
	s := &Sink{Steps: new(Steps)}
	s.Yield = func(st *Steps) error {
		if err := st.first(); err != nil {
			return err
		}
		calls++
		for j := 0; j < calls && st.next(); j++ { // 1, then 2, ... records
			seen = append(seen, st.record().Data[0])
		}
		return nil
	}
	alone := func(rec *Record) error { // the last record before the head
		seen = append(seen, rec.Data[0])
		return nil
	}
	n, _, err := r.Each(new(Record), ^uint64(0), nil, alone, s)
	if err != nil || n != 30 || len(seen) != 30 || calls != 8 {
		t.Fatalf("%d records, %v, %d calls, seen %v", n, err, calls, seen)
	}
	for i, b := range seen {
		if int(b) != i {
			t.Fatalf("record %d is %d: %v", i, b, seen)
		}
	}
	for i := range 3 {
		f.Output(t, []byte{byte(30 + i)})
	}
	r.CommitCursor()
	r.Begin()
	s.Yield = func(*Steps) error { return nil }
	if n, _, err := r.Each(new(Record), ^uint64(0), nil, alone, s); n != 0 || err != nil || r.Pos() != r.Tail() {
		t.Fatalf("a run taken in nothing: %d records, %v, cursor moved %d", n, err, r.Pos()-r.Tail())
	}
	errDone := fmt.Errorf("done")
	s.Yield = func(st *Steps) error { st.next(); return errDone }
	if n, _, err := r.Each(new(Record), ^uint64(0), nil, alone, s); n != 1 || err != errDone {
		t.Fatalf("a run that fails after one: %d records, %v", n, err)
	}
}

// StepOne makes a run of one record parsed the careful way: Next takes it
// once, and Record returns it as it was, lost or wrapped.
func TestStepOne(t *testing.T) {
	var s Steps
	for _, rec := range []Record{
		{Type: Lost, Ring: 2, CPU: 3, Pos: 8, Next: 32, Lost: 5},
		{Type: Sample, Ring: 1, CPU: 0, Pos: 1000, Next: 1040, Data: []byte{1, 2}, Wrapped: []byte{3}},
	} {
		StepOne(&s, &rec)
		if !s.next() {
			t.Fatalf("%+v: no record", rec)
		}
		if got := s.record(); got.Type != rec.Type || got.Pos != rec.Pos || got.Next != rec.Next || got.Lost != rec.Lost ||
			!bytes.Equal(got.AppendTo(nil), rec.AppendTo(nil)) || got.Ring != rec.Ring || got.CPU != rec.CPU {
			t.Fatalf("record %+v, want %+v", got, rec)
		}
		if s.next() {
			t.Fatalf("%+v: a second record", rec)
		}
	}
}
