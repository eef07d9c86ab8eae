// SPDX-License-Identifier: Apache-2.0

package ring

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"os"
	"sync/atomic"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/perfbuf/perfbuf/internal/ringtest"
)

// perfRef is a record as a reader delivers it, for comparison with the
// reference parser's.
type perfRef struct {
	typ       RecordType
	pos, next uint64
	payload   []byte
	lost      uint64
}

// perfRefs is ringtest.ParsePerf's reading as a reader delivers it: records
// of other types left out.
func perfRefs(mem []byte, tail, head uint64) (recs []perfRef, corruptAt uint64, corrupt bool) {
	refs, corruptAt, corrupt := ringtest.ParsePerf(mem, tail, head)
	for _, r := range refs {
		switch r.Type {
		case unix.PERF_RECORD_SAMPLE:
			recs = append(recs, perfRef{Sample, r.Pos, r.Next, r.Payload, 0})
		case unix.PERF_RECORD_LOST:
			recs = append(recs, perfRef{Lost, r.Pos, r.Next, nil, r.Lost})
		}
	}
	return recs, corruptAt, corrupt
}

// fuzzPerfRing lays records out from ring position start in a ring of the
// given size and returns the ring's bytes and the head.
func fuzzPerfRing(size int, start uint64, recs ...[]byte) ([]byte, uint64) {
	f := ringtest.NewPerfAt(size, start)
	for _, r := range recs {
		f.Put(r)
	}
	return f.Data, f.Head
}

// FuzzPerfParse reads arbitrary bytes as a perf ring with arbitrary data_tail
// and data_head: Next must never panic, loop or read outside the ring; it
// must return exactly what the reference parser finds, then a CorruptError
// where the reference stops; SkipCorrupt must get past it. Each, alone and
// into sinks, must deliver the same records, and Commit take exactly the
// record boundaries between the tail and the cursor.
func FuzzPerfParse(f *testing.F) {
	add := func(mem []byte, tail, head, commit uint64) { f.Add(mem, tail, head, commit) }
	payload := func(n int) []byte { return ringtest.Pattern(n, byte(n)) }
	sample, lost, record := ringtest.PerfSample, ringtest.PerfLost, ringtest.PerfRecord

	mem, head := fuzzPerfRing(256, 0, sample(payload(5)), lost(1, 3), record(42, 16, make([]byte, 8)), sample(payload(40)))
	add(mem, 0, head, 32)
	mem, head = fuzzPerfRing(128, 1<<32+96, sample(payload(60))) // payload straddles the end
	add(mem, 1<<32+96, head, head)
	mem, head = fuzzPerfRing(64, 56, sample(payload(3))) // header in the last 8 bytes
	add(mem, 56, head, 0)
	mem, head = fuzzPerfRing(64, ^uint64(0)-15, sample(payload(20))) // positions wrap 2^64
	add(mem, ^uint64(0)-15, head, head)
	mem, head = fuzzPerfRing(64, 0, sample(payload(8)), sample(payload(8)), sample(payload(8)), sample(payload(8)))
	add(mem, 0, head, 64) // full ring
	mem, head = fuzzPerfRing(64, 0, record(9, 0, make([]byte, 8)))
	add(mem, 0, head, 0)
	mem, head = fuzzPerfRing(64, 0, record(9, 16, []byte{200, 0, 0, 0, 0, 0, 0, 0}))
	add(mem, 0, head, 8)
	mem, head = fuzzPerfRing(256, 0, record(9, 24, []byte{13, 0, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12})) // 13 > 24-12
	add(mem, 0, head, 0)
	mem, head = fuzzPerfRing(64, 0, record(2, 16, make([]byte, 8)))
	add(mem, 0, head, 16)
	add(make([]byte, 64), 4, 16, 0)  // unaligned tail
	add(make([]byte, 64), 0, 200, 0) // head too far
	add(make([]byte, 64), 64, 8, 0)  // head behind tail
	add(make([]byte, 3), 0, 8, 8)    // shorter than the smallest ring

	f.Fuzz(func(t *testing.T, content []byte, tail, head, commit uint64) {
		// The ring is the largest power of two of content, from 8 bytes to 1 KiB: small
		// rings keep the fuzzer (and its minimizer) fast, and header sizes up to 64 KiB
		// still test the "larger than the ring" path.
		size := 8
		for size*2 <= len(content) && size < 1<<10 {
			size *= 2
		}
		mem := make([]byte, size)
		copy(mem, content)
		want, corruptAt, corrupt := perfRefs(bytes.Clone(mem), tail, head)

		page := &unix.PerfEventMmapPage{Data_tail: tail, Data_head: head}
		r, err := NewPerfFromParts(0, page, mem)
		if err != nil {
			t.Fatal(err)
		}
		r.Begin()
		var rec Record
		var got []Record
		var nextErr error
		for i := 0; ; i++ {
			if i > size/8+1 {
				t.Fatalf("more than %d records from a %d-byte ring", i, size)
			}
			ok, err := r.Next(&rec)
			if err != nil {
				nextErr = err
				break
			}
			if !ok {
				break
			}
			checkFuzzPerfRecord(t, mem, &rec, tail)
			got = append(got, rec)
		}
		if len(got) != len(want) {
			t.Fatalf("%d records, reference %d", len(got), len(want))
		}
		for i, g := range got {
			w := want[i]
			p := g.AppendTo(nil)
			if g.Type != w.typ || g.Pos != w.pos || g.Next != w.next || g.Lost != w.lost || !bytes.Equal(p, w.payload) {
				t.Fatalf("record %d: %+v, reference %+v", i, g, w)
			}
		}
		if corrupt != (nextErr != nil) {
			t.Fatalf("error %v, reference corrupt %v", nextErr, corrupt)
		}

		// Each (its own loop for the plain samples) visits the same records, then the
		// same error, and a drain commits up to where it stopped.
		page2 := &unix.PerfEventMmapPage{Data_tail: tail, Data_head: head}
		r2, _ := NewPerfFromParts(0, page2, mem)
		var drained []perfRef
		_, drainErr := perfDrain(r2, func(g *Record) error {
			checkFuzzPerfRecord(t, mem, g, tail)
			drained = append(drained, perfRef{g.Type, g.Pos, g.Next, g.AppendTo([]byte{}), g.Lost})
			return nil
		})
		// (fmt prints a nil slice and an empty one alike.)
		if fmt.Sprint(drained) != fmt.Sprint(want) || (drainErr != nil) != corrupt {
			t.Fatalf("drain: %v, %v; reference %v, corrupt %v", drained, drainErr, want, corrupt)
		}
		// The loop into sinks: copies, as ReadBatch makes them, in batches of 1 to 7
		// copies and up to ~100 bytes of room, each call going on where the last stopped;
		// and a libbpf-style sample function, which takes the samples in one piece (the
		// loop's function gets the others). The same records, then the same error.
		sinkRun := func(s *Sink, fn func(*Record) error) ([]perfRef, error) {
			pr, _ := NewPerfFromParts(0, &unix.PerfEventMmapPage{Data_tail: tail, Data_head: head}, mem)
			pr.Begin()
			var out []perfRef
			var stop atomic.Bool
			for calls := 0; ; calls++ {
				if calls > size/8+2 {
					t.Fatalf("more than %d calls of the loop into a sink from a %d-byte ring", calls, size)
				}
				s.N, s.Room = 0, 1+int(commit%97)
				k, _, err := pr.Each(new(Record), math.MaxUint64, &stop, fn, s)
				for _, c := range s.Into[:s.N] {
					out = append(out, perfRef{c.Type, 0, 0, bytes.Clone(c.Data), c.Lost})
				}
				if s.Into != nil && k != s.N {
					t.Fatalf("the loop into a sink: %d records, %d copies", k, s.N)
				}
				if err != nil || !s.Full() {
					return out, err
				}
			}
		}
		noPos := make([]perfRef, len(want))
		for i, w := range want {
			noPos[i] = perfRef{w.typ, 0, 0, w.payload, w.lost}
		}
		copies, copyErr := sinkRun(&Sink{Into: make([]Copy, 1+commit%7)}, nil)
		if fmt.Sprint(copies) != fmt.Sprint(noPos) || fmt.Sprint(copyErr) != fmt.Sprint(nextErr) {
			t.Fatalf("copies: %v, %v; reference %v, %v", copies, copyErr, noPos, nextErr)
		}
		var viaSample []perfRef
		sampleSink := &Sink{Sample: func(cpu int, data []byte) {
			viaSample = append(viaSample, perfRef{Sample, 0, 0, bytes.Clone(data), 0})
		}}
		rest, sampleErr := sinkRun(sampleSink, func(g *Record) error {
			if g.Type == Sample && len(g.Wrapped) == 0 {
				t.Fatalf("a sample in one piece at %d passed to the function, not the sink's Sample", g.Pos)
			}
			viaSample = append(viaSample, perfRef{g.Type, 0, 0, g.AppendTo([]byte{}), g.Lost})
			return nil
		})
		if fmt.Sprint(viaSample) != fmt.Sprint(noPos) || rest != nil || fmt.Sprint(sampleErr) != fmt.Sprint(nextErr) {
			t.Fatalf("sample function: %v, %v; reference %v, %v", viaSample, sampleErr, noPos, nextErr)
		}

		// The loop into Steps: plain samples a run at a time, stepped through in
		// place, the caller moving on after 1 to 3 of them (the rest come in the
		// next run); the function gets every other record. The same records, with
		// their positions, then the same error, and the counts of Next's reader.
		var stepped []perfRef
		take := func(g *Record) {
			checkFuzzPerfRecord(t, mem, g, tail)
			stepped = append(stepped, perfRef{g.Type, g.Pos, g.Next, g.AppendTo([]byte{}), g.Lost})
		}
		stepSink := &Sink{Steps: new(Steps)}
		stepSink.Yield = func(st *Steps) error {
			if err := st.first(); err != nil {
				return err
			}
			for j := uint64(0); st.next(); j++ {
				if g := st.record(); g.Type != Sample || len(g.Wrapped) != 0 {
					t.Fatalf("a run's record at %d: %+v, want a sample in one piece", g.Pos, g)
				}
				take(st.record())
				if j == commit%3 {
					break
				}
			}
			return nil
		}
		pr, _ := NewPerfFromParts(0, &unix.PerfEventMmapPage{Data_tail: tail, Data_head: head}, mem)
		pr.Begin()
		_, _, stepErr := pr.Each(new(Record), math.MaxUint64, new(atomic.Bool), func(g *Record) error { take(g); return nil }, stepSink)
		if fmt.Sprint(stepped) != fmt.Sprint(want) || fmt.Sprint(stepErr) != fmt.Sprint(nextErr) {
			t.Fatalf("steps: %v, %v; reference %v, %v", stepped, stepErr, want, nextErr)
		}
		if got, ref := *pr.Counts(), *r.Counts(); got != ref {
			t.Fatalf("steps counted %+v, Next %+v", got, ref)
		}

		// An ordered run into Steps, keys ending at 8 to 15 in the payload,
		// against the same run with a function.
		keyedSame(t, 8+commit%8, tail%50, ^uint64(0)>>(commit%4*16), commit/4, func(fn func(*Record) error, s *Sink) (int, string, error) {
			r, _ := NewPerfFromParts(0, &unix.PerfEventMmapPage{Data_tail: tail, Data_head: head}, mem)
			r.Begin()
			n, _, err := r.Each(new(Record), math.MaxUint64, new(atomic.Bool), fn, s)
			return n, fmt.Sprintf("%+v at %d", *r.Counts(), r.Pos()), err
		})

		end := head
		if corrupt {
			end = corruptAt
		}
		if page2.Data_tail != end {
			t.Fatalf("drain committed %d, want %d", page2.Data_tail, end)
		}
		if corrupt {
			var ce *CorruptError
			if !errors.Is(nextErr, ErrCorrupt) || !errors.As(nextErr, &ce) || ce.Pos != corruptAt {
				t.Fatalf("error %v, reference corrupt at %d", nextErr, corruptAt)
			}
			if ok, err := r.Next(&rec); ok || err != nextErr {
				t.Fatalf("Next after the error = %v, %v", ok, err)
			}
			r.SkipCorrupt()
			// A record's corruption skips to the head. An invalid head is passed
			// over (the tail stays, nothing is skipped), unless it is behind the
			// tail: then the reader resynchronises with it.
			wantTail := head
			if !validPerfHead(tail, head, size) && int64(head-tail) >= 0 {
				wantTail = tail
			}
			if st := r.Counts(); r.Tail() != wantTail || r.Pending() != 0 || st.Corrupt != 1 || st.CorruptBytes > uint64(size) ||
				(wantTail == tail && st.CorruptBytes != 0) {
				t.Fatalf("after SkipCorrupt: tail %d (want %d) head %d pending %d counts %+v", r.Tail(), wantTail, head, r.Pending(), st)
			}
			if ok, err := r.Next(&rec); ok || err != nil {
				t.Fatalf("Next after SkipCorrupt = %v, %v", ok, err)
			}
			return
		}

		// Commit takes positions from the tail up to the cursor, 8-aligned; anything else
		// is refused and leaves data_tail alone.
		err = r.Commit(commit)
		d := commit - tail
		valid := d <= r.Pos()-tail && (commit%8 == 0 || commit == tail)
		if valid != (err == nil) {
			t.Fatalf("Commit(%d) with tail %d cursor %d: %v", commit, tail, r.Pos(), err)
		}
		if err != nil && (!errors.Is(err, os.ErrInvalid) || page.Data_tail != tail) {
			t.Fatalf("refused Commit(%d): %v, tail %d", commit, err, page.Data_tail)
		}
		if err == nil && page.Data_tail != commit {
			t.Fatalf("Commit(%d) stored %d", commit, page.Data_tail)
		}
	})
}

// validPerfHead reports whether the reader accepts head as a head snapshot
// over tail in a ring of size bytes.
func validPerfHead(tail, head uint64, size int) bool {
	return int64(head-tail) >= 0 && head-tail <= uint64(size) && head&7 == 0
}

// checkFuzzPerfRecord checks the bounds of one record that Next or Each
// returned.
func checkFuzzPerfRecord(t *testing.T, mem []byte, rec *Record, tail uint64) {
	t.Helper()
	size := uint64(len(mem))
	n := rec.Next - rec.Pos
	if n < 8 || n > size || n%8 != 0 || rec.Pos%8 != 0 || rec.Pos-tail > size || rec.Next-tail > size {
		t.Fatalf("record from %d to %d (tail %d, ring %d)", rec.Pos, rec.Next, tail, size)
	}
	if rec.Type != Sample {
		if rec.Data != nil || rec.Wrapped != nil {
			t.Fatalf("%v record with a payload", rec.Type)
		}
		return
	}
	if uint64(rec.Len()) > n-12 {
		t.Fatalf("payload %d in a %d-byte record", rec.Len(), n)
	}
	// Zero-copy: the payload is ring memory, from pos+12 on, wrapping once at most.
	if len(rec.Data) > 0 && &rec.Data[0] != &mem[(rec.Pos+12)%size] {
		t.Fatal("Data does not start at the payload")
	}
	if len(rec.Wrapped) > 0 && (&rec.Wrapped[0] != &mem[0] || len(rec.Data) == 0 || &rec.Data[len(rec.Data)-1] != &mem[size-1]) {
		t.Fatal("Wrapped does not continue Data at the start of the ring")
	}
}
