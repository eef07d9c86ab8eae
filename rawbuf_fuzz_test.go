// SPDX-License-Identifier: Apache-2.0

package perfbuf

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"os"
	"slices"
	"sync/atomic"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/perfbuf/perfbuf/internal/ring"
	"github.com/perfbuf/perfbuf/internal/ringtest"
)

// refRecord is what the reference parser expects Next to return.
type refRecord struct {
	typ       RecordType
	pos, next uint64
	payload   []byte
	lost      uint64
}

// ringtest.HostBigEndian: the host stores the most significant byte first.

// refParse is a slow, independent reading of the mem format: byte by byte with explicit
// wrapping. It returns the records from tail up to head and, if something is corrupt, the
// position where reading stops.
func refParse(mem []byte, tail, head uint64) (recs []refRecord, corruptAt uint64, corrupt bool) {
	size := uint64(len(mem))
	at := func(pos uint64) byte { return mem[pos%size] }
	// word reads n bytes at pos as an unsigned integer in the host's byte order, which the
	// kernel writes records in.
	word := func(pos uint64, n int) uint64 {
		var v uint64
		for i := range n {
			b := uint64(at(pos + uint64(i)))
			if ringtest.HostBigEndian {
				v = v<<8 | b
			} else {
				v |= b << (8 * i)
			}
		}
		return v
	}
	u16 := func(pos uint64) uint64 { return word(pos, 2) }
	u32 := func(pos uint64) uint64 { return word(pos, 4) }
	u64 := func(pos uint64) uint64 { return word(pos, 8) }

	if int64(head-tail) < 0 || head-tail > size || head%8 != 0 {
		return nil, tail, true
	}
	for pos := tail; pos != head; {
		if pos%8 != 0 {
			return recs, pos, true
		}
		typ, n := u32(pos), u16(pos+6)
		if n == 0 || n%8 != 0 || n > head-pos {
			return recs, pos, true
		}
		r := refRecord{typ: recordOther, pos: pos, next: pos + n}
		switch typ {
		case unix.PERF_RECORD_SAMPLE:
			if n < 16 || u32(pos+8)+12 > n {
				return recs, pos, true
			}
			r.typ = RecordSample
			r.payload = make([]byte, u32(pos+8))
			for i := range r.payload {
				r.payload[i] = at(pos + 12 + uint64(i))
			}
		case unix.PERF_RECORD_LOST:
			if n < 24 {
				return recs, pos, true
			}
			r.typ, r.lost = RecordLost, u64(pos+16)
		}
		recs = append(recs, r)
		pos += n
	}
	return recs, 0, false
}

// recordOther marks the reference's records of other types, which no reader delivers.
const recordOther RecordType = 0xff

// fuzzRing lays records out from mem position start in a mem of the given size and returns
// the mem's bytes and the head.
func fuzzRing(size int, start uint64, recs ...[]byte) ([]byte, uint64) {
	f := ringtest.NewPerfAt(size, start)
	for _, r := range recs {
		f.Put(r)
	}
	return f.Data, f.Head
}

// FuzzRawParse reads arbitrary bytes as a mem with arbitrary head and tail: Next must never
// panic, loop or read outside the mem; it must return exactly what the reference parser
// finds, then a CorruptError where the reference stops; SkipCorrupt must get past it.
func FuzzRawParse(f *testing.F) {
	add := func(mem []byte, tail, head, commit uint64) { f.Add(mem, tail, head, commit) }
	payload := func(n int) []byte { return ringtest.Pattern(n, byte(n)) }

	mem, head := fuzzRing(256, 0, ringtest.PerfSample(payload(5)), ringtest.PerfLost(1, 3), ringtest.PerfRecord(42, 16, make([]byte, 8)), ringtest.PerfSample(payload(40)))
	add(mem, 0, head, 32)
	mem, head = fuzzRing(128, 1<<32+96, ringtest.PerfSample(payload(60))) // payload straddles the end
	add(mem, 1<<32+96, head, head)
	mem, head = fuzzRing(64, 56, ringtest.PerfSample(payload(3))) // header in the last 8 bytes
	add(mem, 56, head, 0)
	mem, head = fuzzRing(64, ^uint64(0)-15, ringtest.PerfSample(payload(20))) // positions wrap 2^64
	add(mem, ^uint64(0)-15, head, head)
	mem, head = fuzzRing(64, 0, ringtest.PerfSample(payload(8)), ringtest.PerfSample(payload(8)), ringtest.PerfSample(payload(8)), ringtest.PerfSample(payload(8)))
	add(mem, 0, head, 64) // full mem
	mem, head = fuzzRing(64, 0, ringtest.PerfRecord(9, 0, make([]byte, 8)))
	add(mem, 0, head, 0)
	mem, head = fuzzRing(64, 0, ringtest.PerfRecord(9, 16, []byte{200, 0, 0, 0, 0, 0, 0, 0}))
	add(mem, 0, head, 8)
	mem, head = fuzzRing(256, 0, ringtest.PerfRecord(9, 24, []byte{13, 0, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12})) // 13 > 24-12
	add(mem, 0, head, 0)
	mem, head = fuzzRing(64, 0, ringtest.PerfRecord(2, 16, make([]byte, 8)))
	add(mem, 0, head, 16)
	add(make([]byte, 64), 4, 16, 0)  // unaligned tail
	add(make([]byte, 64), 0, 200, 0) // head too far
	add(make([]byte, 64), 64, 8, 0)  // head behind tail
	add(make([]byte, 3), 0, 8, 8)    // shorter than the smallest mem

	f.Fuzz(func(t *testing.T, content []byte, tail, head, commit uint64) {
		// The mem is the largest power of two of content, from 8 bytes to 1 KiB: small rings
		// keep the fuzzer (and its minimizer) fast, and header sizes up to 64 KiB still test
		// the "larger than the mem" path.
		size := 8
		for size*2 <= len(content) && size < 1<<10 {
			size *= 2
		}
		mem := make([]byte, size)
		copy(mem, content)
		want, corruptAt, corrupt := refParse(bytes.Clone(mem), tail, head)
		// Every way of reading skips records of other types.
		want = slices.DeleteFunc(want, func(r refRecord) bool { return r.typ == recordOther })

		page := new(unix.PerfEventMmapPage)
		page.Data_tail, page.Data_head = tail, head
		pr, err := ring.NewPerfFromParts(0, page, mem)
		if err != nil {
			t.Fatal(err)
		}
		b := newRawBuffer(pr, nil)
		b.Begin()
		var rec Record
		var got []Record
		var nextErr error
		for i := 0; ; i++ {
			if i > size/8+1 {
				t.Fatalf("more than %d records from a %d-byte mem", i, size)
			}
			ok, err := b.Next(&rec)
			if err != nil {
				nextErr = err
				break
			}
			if !ok {
				break
			}
			checkFuzzRecord(t, mem, &rec, tail)
			got = append(got, rec)
		}
		if len(got)*8 > size {
			t.Fatalf("%d records from a %d-byte mem", len(got), size)
		}
		if len(got) != len(want) {
			t.Fatalf("%d records, reference %d", len(got), len(want))
		}
		for i, r := range got {
			w := want[i]
			p := r.AppendTo(nil)
			if r.Type != w.typ || r.Pos != w.pos || r.Next != w.next || r.Lost != w.lost || !bytes.Equal(p, w.payload) {
				t.Fatalf("record %d: %+v, reference %+v", i, r, w)
			}
		}

		if corrupt != (nextErr != nil) {
			t.Fatalf("error %v, reference corrupt %v", nextErr, corrupt)
		}

		// Drain (its own loop for the plain samples) visits the same records, then the same
		// error, and commits up to where it stopped.
		page2 := &unix.PerfEventMmapPage{Data_tail: tail, Data_head: head}
		pr2, _ := ring.NewPerfFromParts(0, page2, mem)
		b2 := newRawBuffer(pr2, nil)
		var drained []refRecord
		_, drainErr := b2.Drain(func(r *Record) error {
			checkFuzzRecord(t, mem, r, tail)
			drained = append(drained, refRecord{r.Type, r.Pos, r.Next, r.AppendTo([]byte{}), r.Lost})
			return nil
		})
		// (fmt prints a nil slice and an empty one alike.)
		if fmt.Sprint(drained) != fmt.Sprint(want) || (drainErr != nil) != corrupt {
			t.Fatalf("Drain: %v, %v; reference %v, corrupt %v", drained, drainErr, want, corrupt)
		}
		// The ring's loop into sinks: copies, as ReadBatch makes them, in batches of 1 to 7
		// copies and up to ~100 bytes of room, each call going on where the last stopped;
		// and a libbpf-style sample function, which takes the samples in one piece (the
		// loop's function gets the others). The same records, then the same error.
		sinkRun := func(s *ring.Sink, fn func(*Record) error) ([]refRecord, error) {
			pr, _ := ring.NewPerfFromParts(0, &unix.PerfEventMmapPage{Data_tail: tail, Data_head: head}, mem)
			pr.Begin()
			var out []refRecord
			var stop atomic.Bool
			for calls := 0; ; calls++ {
				if calls > size/8+2 {
					t.Fatalf("more than %d calls of the loop into a sink from a %d-byte mem", calls, size)
				}
				s.N, s.Room = 0, 1+int(commit%97)
				k, _, err := pr.Each(new(Record), math.MaxUint64, &stop, fn, s)
				for _, c := range s.Into[:s.N] {
					out = append(out, refRecord{c.Type, 0, 0, bytes.Clone(c.Data), c.Lost})
				}
				if s.Into != nil && k != s.N {
					t.Fatalf("the loop into a sink: %d records, %d copies", k, s.N)
				}
				if err != nil || !s.Full() {
					return out, err
				}
			}
		}
		noPos := make([]refRecord, len(want))
		for i, w := range want {
			noPos[i] = refRecord{w.typ, 0, 0, w.payload, w.lost}
		}
		copies, copyErr := sinkRun(&ring.Sink{Into: make([]Sample, 1+commit%7)}, nil)
		if fmt.Sprint(copies) != fmt.Sprint(noPos) || fmt.Sprint(copyErr) != fmt.Sprint(nextErr) {
			t.Fatalf("copies: %v, %v; reference %v, %v", copies, copyErr, noPos, nextErr)
		}
		var viaSample []refRecord
		sampleSink := &ring.Sink{Sample: func(cpu int, data []byte) {
			viaSample = append(viaSample, refRecord{RecordSample, 0, 0, bytes.Clone(data), 0})
		}}
		rest, sampleErr := sinkRun(sampleSink, func(r *Record) error {
			if r.Type == RecordSample && len(r.Wrapped) == 0 {
				t.Fatalf("a sample in one piece at %d passed to the function, not the sink's Sample", r.Pos)
			}
			viaSample = append(viaSample, refRecord{r.Type, 0, 0, r.AppendTo([]byte{}), r.Lost})
			return nil
		})
		if fmt.Sprint(viaSample) != fmt.Sprint(noPos) || rest != nil || fmt.Sprint(sampleErr) != fmt.Sprint(nextErr) {
			t.Fatalf("sample function: %v, %v; reference %v, %v", viaSample, sampleErr, noPos, nextErr)
		}

		end := head
		if corrupt {
			end = corruptAt
		}
		if page2.Data_tail != end {
			t.Fatalf("Drain committed %d, want %d", page2.Data_tail, end)
		}
		if corrupt {
			var ce *CorruptError
			if !errors.Is(nextErr, ErrCorrupt) || !errors.As(nextErr, &ce) || ce.Pos != corruptAt {
				t.Fatalf("error %v, reference corrupt at %d", nextErr, corruptAt)
			}
			if ok, err := b.Next(&rec); ok || err != nextErr {
				t.Fatalf("Next after the error = %v, %v", ok, err)
			}
			b.SkipCorrupt()
			// A record's corruption skips to the head. An invalid head is passed
			// over (the tail stays, nothing is skipped), unless it is behind the
			// tail: then the reader resynchronises with it.
			wantTail := head
			if !validHead(tail, head, size) && int64(head-tail) >= 0 {
				wantTail = tail
			}
			if st := b.Stats(); b.perf().Cur().Tail() != wantTail || b.perf().Pending() != 0 || st.Corrupt != 1 || st.CorruptBytes > uint64(size) ||
				(wantTail == tail && st.CorruptBytes != 0) {
				t.Fatalf("after SkipCorrupt: tail %d (want %d) head %d pending %d stats %+v", b.perf().Cur().Tail(), wantTail, head, b.perf().Pending(), st)
			}
			if ok, err := b.Next(&rec); ok || err != nil {
				t.Fatalf("Next after SkipCorrupt = %v, %v", ok, err)
			}
			return
		}

		// Commit takes positions from the tail up to the cursor, 8-aligned; anything else is
		// refused and leaves data_tail alone.
		err = b.Commit(commit)
		d := commit - tail
		valid := d <= b.perf().Cur().Pos()-tail && (commit%8 == 0 || commit == tail)
		if valid != (err == nil) {
			t.Fatalf("Commit(%d) with tail %d cursor %d: %v", commit, tail, b.perf().Cur().Pos(), err)
		}
		if err != nil && (!errors.Is(err, os.ErrInvalid) || page.Data_tail != tail) {
			t.Fatalf("refused Commit(%d): %v, tail %d", commit, err, page.Data_tail)
		}
		if err == nil && page.Data_tail != commit {
			t.Fatalf("Commit(%d) stored %d", commit, page.Data_tail)
		}
	})
}

// checkFuzzRecord checks the bounds of one record returned by Next.
// validHead reports whether the reader accepts head as a head snapshot over
// tail in a mem of size bytes.
func validHead(tail, head uint64, size int) bool {
	return int64(head-tail) >= 0 && head-tail <= uint64(size) && head&7 == 0
}

func checkFuzzRecord(t *testing.T, mem []byte, rec *Record, tail uint64) {
	t.Helper()
	size := uint64(len(mem))
	n := rec.Next - rec.Pos
	if n < 8 || n > size || n%8 != 0 || rec.Pos%8 != 0 || rec.Pos-tail > size || rec.Next-tail > size {
		t.Fatalf("record from %d to %d (tail %d, mem %d)", rec.Pos, rec.Next, tail, size)
	}
	if rec.Type != RecordSample {
		if rec.Data != nil || rec.Wrapped != nil {
			t.Fatalf("%v record with a payload", rec.Type)
		}
		return
	}
	if uint64(rec.Len()) > n-12 {
		t.Fatalf("payload %d in a %d-byte record", rec.Len(), n)
	}
	// Zero-copy: the payload is mem memory, from pos+12 on, wrapping once at most.
	if len(rec.Data) > 0 && &rec.Data[0] != &mem[(rec.Pos+12)%size] {
		t.Fatal("Data does not start at the payload")
	}
	if len(rec.Wrapped) > 0 && (&rec.Wrapped[0] != &mem[0] || len(rec.Data) == 0 || &rec.Data[len(rec.Data)-1] != &mem[size-1]) {
		t.Fatal("Wrapped does not continue Data at the start of the mem")
	}
}
