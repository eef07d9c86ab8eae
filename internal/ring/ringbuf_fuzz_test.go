// SPDX-License-Identifier: Apache-2.0

package ring

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"testing"
	"unsafe"

	"github.com/perfbuf/perfbuf/internal/ringtest"
)

// refBPFRecord is what the reference parser finds: a sample or a discarded record.
type refBPFRecord struct {
	pos, next uint64
	discard   bool
	payload   []byte
}

// refBPFParse is a slow, independent reading of the BPF ring buffer format: byte by byte,
// wrapping explicitly at the end of a ring given once (not mirrored). It returns the records
// from consumer position cons up to producer position prod, where it stopped and why: "end",
// "busy" (a record not committed) or "corrupt".
func refBPFParse(ring []byte, cons, prod uint64) (recs []refBPFRecord, at uint64, stop string) {
	size := uint64(len(ring))
	u32 := func(pos uint64) uint32 {
		var v uint32
		for i := range uint64(4) {
			b := uint32(ring[(pos+i)%size])
			if ringtest.HostBigEndian {
				v = v<<8 | b
			} else {
				v |= b << (8 * i)
			}
		}
		return v
	}
	if cons%8 != 0 || prod%8 != 0 || int64(prod-cons) < 0 || prod-cons >= size {
		return nil, cons, "corrupt"
	}
	for pos := cons; pos != prod; {
		h := u32(pos)
		n := uint64(h & (1<<30 - 1))
		sz := (n + 8 + 7) / 8 * 8
		// The kernel writes a busy record's length before it publishes producer_pos past
		// it, and never sets the discard bit on a busy record.
		if sz > prod-pos || h&(1<<31) != 0 && h&(1<<30) != 0 {
			return recs, pos, "corrupt"
		}
		if h&(1<<31) != 0 {
			return recs, pos, "busy"
		}
		r := refBPFRecord{pos: pos, next: pos + sz, discard: h&(1<<30) != 0}
		if !r.discard {
			r.payload = make([]byte, n)
			for i := range r.payload {
				r.payload[i] = ring[(pos+8+uint64(i))%size]
			}
		}
		recs = append(recs, r)
		pos += sz
	}
	return recs, prod, "end"
}

// fuzzBPFRing lays out a ring of size bytes from ring position start with the fake producer:
// each op is a payload length, negative for a record left busy, with 1<<20 added for a
// discarded one. It returns the ring's first copy and producer_pos.
func fuzzBPFRing(size int, start uint64, ops ...int) ([]byte, uint64) {
	f := ringtest.NewRingBufAt(size, start)
	for _, op := range ops {
		n, discard := op, false
		if n >= 1<<20 {
			n, discard = n-1<<20, true
		}
		busy := n < 0
		if busy {
			n = -n
		}
		pos, ok := f.Reserve(n)
		if !ok {
			panic("fuzz seed does not fit")
		}
		f.Write(pos, ringtest.Pattern(n, byte(n)))
		if !busy {
			f.Commit(pos, discard)
		}
	}
	return bytes.Clone(f.Data[:size]), f.Prod
}

// fuzzBPFReader builds a reader over ring (mirrored into a fresh 2*size area) at the
// given positions.
func fuzzBPFReader(t *testing.T, ring []byte, cons, prod uint64) (*RingBuf, *[2]uint64, []byte) {
	size := len(ring)
	mem := make([]uint64, size/4)
	data := unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(mem))), 2*size)
	copy(data, ring)
	copy(data[size:], ring)
	pos := &[2]uint64{cons, prod}
	r, err := NewRingBufFromParts(-1, &pos[0], &pos[1], data)
	if err != nil {
		t.Fatal(err)
	}
	return r, pos, data
}

// FuzzBPFRingParse reads arbitrary bytes as a BPF ring buffer with arbitrary positions: next
// and each must never panic, loop or read outside the area; they must return exactly what
// the reference parser finds, stop without error at a busy record and with a CorruptError
// where the reference finds corruption (a busy header included); skipCorrupt must get past
// it; commit must take exactly the valid positions; each must honour its limit. Then the
// positions move to cons2 and prod2, backwards or anywhere: the reader's next look (quiet,
// reached, begin) must see it, and report a consumer_pos it did not write, or a producer_pos
// moved back, as a CorruptError.
func FuzzBPFRingParse(f *testing.F) {
	add := func(ring []byte, cons, prod uint64, limit uint16, commit uint64) {
		f.Add(ring, cons, prod, limit, commit, ^uint64(0), ^uint64(0))
	}
	addMoved := func(ring []byte, cons, prod uint64, cons2, prod2 uint64) {
		f.Add(ring, cons, prod, uint16(1000), cons, cons2, prod2)
	}
	ring, prod := fuzzBPFRing(256, 0, 5, 1<<20+3, 40, 0, 17)
	add(ring, 0, prod, 1000, 24)
	ring, prod = fuzzBPFRing(128, 1<<32+96, 60) // the sample runs past the area's end
	add(ring, 1<<32+96, prod, 1000, prod)
	ring, prod = fuzzBPFRing(64, 56, 3) // header in the last 8 bytes
	add(ring, 56, prod, 8, 0)
	ring, prod = fuzzBPFRing(64, ^uint64(0)-15, 20) // positions wrap 2^64
	add(ring, ^uint64(0)-15, prod, 1000, prod)
	ring, prod = fuzzBPFRing(128, 0, 8, -8, 8, 8) // a busy record with committed ones behind it
	add(ring, 0, prod, 1000, 16)
	ring, prod = fuzzBPFRing(128, 0, 8, 1<<20+8, 8, 8, 8, 8) // almost full, a discard inside
	add(ring, 0, prod, 40, 48)
	ring, prod = fuzzBPFRing(64, 0, 8, 8)
	add(ring, 0, prod+8, 1000, 0) // zero header past the records: a 0-byte sample
	ring[16] = 200
	add(ring, 0, prod+8, 1000, 0) // a length past the producer
	add(ring, 4, prod, 1000, 0)   // unaligned consumer
	add(ring, 0, prod+4, 1000, 0) // unaligned producer
	add(ring, 8, 0, 1000, 0)      // producer behind the consumer
	add(ring, 0, 64, 1000, 0)     // a full ring: more than the kernel publishes
	add(make([]byte, 3), 0, 8, 10, 8)
	ring, prod = fuzzBPFRing(128, 0, 8, -8, 8)
	busyLen := bytes.Clone(ring)
	copy(busyLen[16:], ringtest.U32(200|bpfRingBusyBit))
	add(busyLen, 0, prod, 1000, 16) // a busy record's length past the producer
	busyDiscard := bytes.Clone(ring)
	copy(busyDiscard[16:], ringtest.U32(8|bpfRingBusyBit|bpfRingDiscardBit))
	add(busyDiscard, 0, prod, 1000, 16) // busy and discarded at once
	ring, prod = fuzzBPFRing(128, 0, 8, 1<<20+8, 8)
	addMoved(ring, 0, prod, 0, prod-16)   // producer moved back
	addMoved(ring, 0, prod, 0, 0)         // producer back at the start
	addMoved(ring, 0, prod-16, 0, prod)   // producer moved on
	addMoved(ring, 0, prod, 8, prod)      // consumer written by someone else
	addMoved(ring, 0, prod-32, prod, 16)  // consumer ahead, producer behind it
	addMoved(ring, 16, prod, 0, prod)     // consumer moved back
	addMoved(ring, 0, 0, 16, 0)           // consumer ahead of an empty ring
	addMoved(ring, 0, prod, prod, prod+8) // consumer moved on, producer too
	ring, prod = fuzzBPFRing(128, 0, 8, -8, 8)
	addMoved(ring, 0, prod, 16, prod-16) // stalled at a busy record, producer moved back past it

	f.Fuzz(func(t *testing.T, content []byte, cons, prod uint64, limit uint16, commit, cons2, prod2 uint64) {
		// The ring is the largest power of two of content, from 8 bytes to 1 KiB.
		size := 8
		for size*2 <= len(content) && size < 1<<10 {
			size *= 2
		}
		ring := make([]byte, size)
		copy(ring, content)
		want, at, stop := refBPFParse(ring, cons, prod)
		var samples []refBPFRecord
		discards := 0
		for _, w := range want {
			if w.discard {
				discards++
			} else {
				samples = append(samples, w)
			}
		}

		// next, record by record.
		r, pos, data := fuzzBPFReader(t, ring, cons, prod)
		r.Begin()
		var got []refBPFRecord
		var nextErr error
		for i := 0; ; i++ {
			if i > size/8+1 {
				t.Fatalf("more than %d records from a %d-byte ring", i, size)
			}
			var rec Record
			ok, err := r.Next(&rec)
			if err != nil {
				nextErr = err
				break
			}
			if !ok {
				break
			}
			checkFuzzBPFRecord(t, data, &rec)
			got = append(got, refBPFRecord{rec.Pos, rec.Next, false, bytes.Clone(rec.Data)})
		}
		if fmt.Sprint(got) != fmt.Sprint(samples) || int(r.counts.Discarded) != discards {
			t.Fatalf("next: %v, %d discarded; reference %v, %d discarded", got, r.counts.Discarded, samples, discards)
		}
		if (stop == "corrupt") != (nextErr != nil) || r.Pos() != at && stop != "corrupt" {
			t.Fatalf("next stopped at %d with %v; reference at %d: %s", r.Pos(), nextErr, at, stop)
		}
		if st := r.Counts(); st.Samples != uint64(len(samples)) {
			t.Fatalf("stats %+v for %d samples", st, len(samples))
		}

		// NextCopy first, then Next where it takes nothing, as ReadInto reads: the same
		// samples, copies, positions and counts as Next alone.
		r6, _, _ := fuzzBPFReader(t, ring, cons, prod)
		r6.Begin()
		var got6 []refBPFRecord
		var err6 error
		for i := 0; i <= size/8+1; i++ {
			from := r6.Pos()
			var c Copy
			if n := r6.NextCopy(&c); n != 0 {
				if r6.Pos() != from+n || c.Type != Sample || c.CPU != -1 || c.Lost != 0 || c.Key != 0 || c.Late {
					t.Fatalf("copy %+v of %d bytes from %d, now at %d", c, n, from, r6.Pos())
				}
				got6 = append(got6, refBPFRecord{from, from + n, false, bytes.Clone(c.Data)})
				continue
			}
			var rec Record
			ok, err := r6.Next(&rec)
			if err6 = err; !ok {
				break
			}
			got6 = append(got6, refBPFRecord{rec.Pos, rec.Next, false, bytes.Clone(rec.Data)})
		}
		if fmt.Sprint(got6) != fmt.Sprint(got) || *r6.Counts() != *r.Counts() || fmt.Sprint(err6) != fmt.Sprint(nextErr) || r6.Pos() != r.Pos() {
			t.Fatalf("next after copies: %v, %+v, %v at %d; next alone %v, %+v, %v at %d", got6, *r6.Counts(), err6, r6.Pos(), got, *r.Counts(), nextErr, r.Pos())
		}

		// each, within limit: the records that start within limit bytes of cons.
		r2, _, data2 := fuzzBPFReader(t, ring, cons, prod)
		r2.Begin()
		var got2 []refBPFRecord
		var rec Record
		n, _, eachErr := r2.Each(&rec, uint64(limit), nil, func(rec *Record) error {
			checkFuzzBPFRecord(t, data2, rec)
			got2 = append(got2, refBPFRecord{rec.Pos, rec.Next, false, bytes.Clone(rec.Data)})
			return nil
		}, nil)

		var within []refBPFRecord
		wantDiscards, wantCorrupt := 0, stop == "corrupt" && at-cons < uint64(limit)
		for _, w := range want {
			if w.pos-cons >= uint64(limit) {
				wantCorrupt = false
				break
			}
			if w.discard {
				wantDiscards++
			} else {
				within = append(within, w)
			}
		}
		if n != len(got2) || fmt.Sprint(got2) != fmt.Sprint(within) || int(r2.counts.Discarded) != wantDiscards {
			t.Fatalf("each with limit %d: %d, %v, %d discarded; reference %v, %d discarded", limit, n, got2, r2.counts.Discarded, within, wantDiscards)
		}
		if wantCorrupt != (eachErr != nil) || (eachErr != nil && eachErr.Error() != fmt.Sprint(nextErr)) {
			t.Fatalf("each with limit %d: %v; next: %v", limit, eachErr, nextErr)
		}

		// each into a sink, within limit, as ReadBatch copies: the same samples, copied, in
		// batches of 1 to 7 copies and a few bytes to ~100 of room; each call stops after the
		// copy that fills the batch, and the next goes on from there.
		r5, _, _ := fuzzBPFReader(t, ring, cons, prod)
		r5.Begin()
		sink := Sink{Into: make([]Copy, 1+int(limit)%7)}
		var copied []refBPFRecord
		var copyErr error
		for calls := 0; ; calls++ {
			if calls > size/8+2 {
				t.Fatalf("more than %d copying calls from a %d-byte ring", calls, size)
			}
			if r5.Pos()-cons >= uint64(limit) {
				break
			}
			sink.N, sink.Room = 0, 1+int(limit)%97
			k, _, err := r5.Each(&rec, uint64(limit)-(r5.Pos()-cons), nil, nil, &sink)
			if k != sink.N {
				t.Fatalf("copying each: %d records, %d copies", k, sink.N)
			}
			for _, c := range sink.Into[:sink.N] {
				if c.Type != Sample || c.CPU != -1 || c.Lost != 0 || c.Key != 0 || c.Late {
					t.Fatalf("copy %+v", c)
				}
				copied = append(copied, refBPFRecord{0, 0, false, bytes.Clone(c.Data)})
			}
			if copyErr = err; err != nil || !sink.Full() {
				break
			}
		}
		var wantCopies []refBPFRecord
		for _, w := range within {
			wantCopies = append(wantCopies, refBPFRecord{0, 0, false, w.payload})
		}
		if fmt.Sprint(copied) != fmt.Sprint(wantCopies) || int(r5.counts.Discarded) != wantDiscards {
			t.Fatalf("copying each with limit %d: %v, %d discarded; reference %v, %d discarded", limit, copied, r5.counts.Discarded, wantCopies, wantDiscards)
		}
		if wantCorrupt != (copyErr != nil) || (copyErr != nil && copyErr.Error() != fmt.Sprint(nextErr)) {
			t.Fatalf("copying each with limit %d: %v; next: %v", limit, copyErr, nextErr)
		}

		// each into Steps, within limit: plain samples a run at a time, stepped
		// through in place, the caller moving on after 1 to 3 of them (the rest
		// come in the next run), the function taking the others: the same samples
		// with their positions, the same error and counts as each's.
		r7, _, data7 := fuzzBPFReader(t, ring, cons, prod)
		r7.Begin()
		var stepped []refBPFRecord
		take := func(g *Record) {
			checkFuzzBPFRecord(t, data7, g)
			stepped = append(stepped, refBPFRecord{g.Pos, g.Next, false, bytes.Clone(g.Data)})
		}
		stepSink := &Sink{Steps: new(Steps)}
		stepSink.Yield = func(st *Steps) error {
			if err := st.first(); err != nil {
				return err
			}
			for j := uint64(0); st.next(); j++ {
				take(st.record())
				if j == commit%3 {
					break
				}
			}
			return nil
		}
		k7, _, stepErr := r7.Each(&rec, uint64(limit), nil, func(g *Record) error { take(g); return nil }, stepSink)
		if k7 != len(stepped) || fmt.Sprint(stepped) != fmt.Sprint(within) || fmt.Sprint(stepErr) != fmt.Sprint(eachErr) || *r7.Counts() != *r2.Counts() || r7.Pos() != r2.Pos() {
			t.Fatalf("steps with limit %d: %d, %v, %v, %+v at %d; each: %v, %v, %+v at %d",
				limit, k7, stepped, stepErr, *r7.Counts(), r7.Pos(), got2, eachErr, *r2.Counts(), r2.Pos())
		}

		// An ordered run into Steps, keys ending at 8 to 15 in the payload,
		// against the same run with a function.
		keyedSame(t, 8+commit%8, uint64(cons)%50, ^uint64(0)>>(commit%4*16), commit/4, func(fn func(*Record) error, s *Sink) (int, string, error) {
			r, _, _ := fuzzBPFReader(t, ring, cons, prod)
			r.Begin()
			n, _, err := r.Each(new(Record), uint64(limit), nil, fn, s)
			return n, fmt.Sprintf("%+v at %d", *r.Counts(), r.Pos()), err
		})

		// peek at every record boundary sees the sample next saw there (or the next one).
		r3, _, _ := fuzzBPFReader(t, ring, cons, prod)
		r3.Begin()
		for i, w := range want {
			var rec Record
			ok := r3.Peek(w.pos, &rec)
			j := i
			for j < len(want) && want[j].discard {
				j++
			}
			if ok != (j < len(want)) || ok && (rec.Pos != want[j].pos || !bytes.Equal(rec.Data, want[j].payload)) {
				t.Fatalf("peek(%d) = %v %+v; reference %v", w.pos, ok, rec, want[j:])
			}
		}
		if r3.Pos() != cons && stop != "corrupt" || r3.Counts().Samples != 0 || r3.corrupt != nil && stop != "corrupt" {
			t.Fatal("peek moved the cursor, counted or recorded an error")
		}

		if stop == "corrupt" {
			var ce *CorruptError
			if !errors.Is(nextErr, ErrCorrupt) || !errors.As(nextErr, &ce) || ce.Pos != at {
				t.Fatalf("error %v, reference corrupt at %d", nextErr, at)
			}
			if ok, err := r.Next(&rec); ok || err != nextErr || r.Settle() {
				t.Fatalf("after the error: next = %v, %v", ok, err)
			}
			// On from producer_pos, unless no producer could have written it: the reader
			// took no positions as valid yet (they were wrong at opening, or a record was),
			// so only an unaligned one.
			skipTo := prod
			if prod%8 != 0 {
				skipTo = cons
			}
			skipped := r.SkipCorrupt()
			if st := r.Counts(); st.Corrupt != 1 || st.CorruptBytes != skipped || skipped > uint64(size) ||
				pos[0] != skipTo || r.Pending() != 0 {
				t.Fatalf("after skipCorrupt: skipped %d, consumer_pos %d (producer_pos %d), pending %d, stats %+v",
					skipped, pos[0], prod, r.Pending(), st)
			}
			r.Begin()
			if ok, err := r.Next(&rec); ok || err != nil || !r.Settle() {
				t.Fatalf("next after skipCorrupt = %v, %v", ok, err)
			}
			return
		}

		// settle: true exactly when the reader stopped at the head or at a busy record and
		// has committed everything.
		if r.Settle() != (r.Pos() == cons) {
			t.Fatalf("settle with the cursor at %d, consumer_pos %d", r.Pos(), cons)
		}
		r.CommitCursor()
		if !r.Settle() || pos[0] != at {
			t.Fatalf("settle at %d (%s), consumer_pos %d", at, stop, pos[0])
		}
		fuzzBPFMoved(t, r, pos, ring, at, prod, stop, cons2, prod2)

		// commit takes positions from cons up to the cursor, 8-aligned; anything else is
		// refused and leaves consumer_pos alone.
		r4, pos4, _ := fuzzBPFReader(t, ring, cons, prod)
		r4.Begin()
		for {
			if ok, _ := r4.Next(&rec); !ok {
				break
			}
		}
		err := r4.Commit(commit)
		valid := commit-cons <= r4.Pos()-cons && commit%8 == 0 || commit == cons
		if valid != (err == nil) {
			t.Fatalf("commit(%d) with consumer %d, cursor %d: %v", commit, cons, r4.Pos(), err)
		}
		if err != nil && (!errors.Is(err, os.ErrInvalid) || pos4[0] != cons) {
			t.Fatalf("refused commit(%d): %v, consumer_pos %d", commit, err, pos4[0])
		}
		if err == nil && pos4[0] != commit {
			t.Fatalf("commit(%d) stored %d", commit, pos4[0])
		}
	})
}

// checkFuzzBPFRecord checks the bounds of one sample: its payload is ring memory, one
// piece from its header on, inside the double-mapped area.
func checkFuzzBPFRecord(t *testing.T, data []byte, rec *Record) {
	t.Helper()
	size := uint64(len(data) / 2)
	off := rec.Pos & (size - 1)
	n := uint64(len(rec.Data))
	if rec.Pos%8 != 0 || rec.Next-rec.Pos != (n+15)&^7 || rec.Next-rec.Pos >= size || rec.Wrapped != nil || rec.Type != Sample {
		t.Fatalf("record %+v", rec)
	}
	if n > 0 && &rec.Data[0] != &data[off+8] || off+8+n > uint64(len(data)) || uint64(cap(rec.Data)) != n {
		t.Fatalf("payload at %d, %d bytes, not where the record is", rec.Pos, n)
	}
}

// fuzzBPFMoved moves the positions of r, which read everything from its consumer position up
// to at (where it stopped: stop) and committed it, with prod the producer position it saw,
// to cons2 and prod2 (^0 for both: no move), as someone else or a broken producer might.
// The reader's next look must see every move: quiet is false, a Flush is not reached; a
// consumer_pos it did not write, or a producer_pos behind the one it saw, is a
// CorruptError; otherwise it reads what the reference finds from at to prod2.
func fuzzBPFMoved(t *testing.T, r *RingBuf, pos *[2]uint64, ring []byte, at, prod uint64, stop string, cons2, prod2 uint64) {
	t.Helper()
	if cons2 == ^uint64(0) && prod2 == ^uint64(0) {
		return
	}
	pos[0], pos[1] = cons2, prod2
	moved := cons2 != at || prod2 != prod
	if stop == "end" && r.Quiet() == moved {
		t.Fatalf("quiet = %v with the positions moved from %d, %d to %d, %d", r.Quiet(), at, prod, cons2, prod2)
	}
	bad := cons2 != at || int64(prod2-prod) < 0
	if bad && r.Reached(r.Pos(), prod) {
		t.Fatalf("reached with the positions moved from %d, %d to %d, %d", at, prod, cons2, prod2)
	}
	// A reader that has parsed nothing and never moved consumer_pos takes a consumer_pos
	// another reader can have left as its start (RingBuf.adopt): aligned, ahead of its own,
	// behind an aligned producer_pos by less than a ring. Then only a producer_pos behind the
	// one it saw is bad.
	if r.fresh && r.cursor == r.tail && r.corrupt == nil && (cons2|prod2)%8 == 0 && int64(cons2-at) > 0 &&
		int64(prod2-cons2) >= 0 && prod2-cons2 < uint64(len(ring)) {
		at = cons2
		bad = int64(prod2-max(prod, cons2)) < 0
	}
	want, _, stop2 := refBPFParse(ring, at, prod2)
	if bad {
		want, stop2 = nil, "corrupt"
	}
	r.Begin()
	var got []refBPFRecord
	var err error
	for i := 0; ; i++ {
		if i > len(ring)/8+1 {
			t.Fatalf("more than %d records from a %d-byte ring", i, len(ring))
		}
		var rec Record
		var ok bool
		if ok, err = r.Next(&rec); !ok {
			break
		}
		got = append(got, refBPFRecord{rec.Pos, rec.Next, false, bytes.Clone(rec.Data)})
	}
	var samples []refBPFRecord
	for _, w := range want {
		if !w.discard {
			samples = append(samples, w)
		}
	}
	if fmt.Sprint(got) != fmt.Sprint(samples) || (err != nil) != (stop2 == "corrupt") {
		t.Fatalf("positions moved from %d, %d to %d, %d: %v, %v; reference %v, %s", at, prod, cons2, prod2, got, err, samples, stop2)
	}
	if err != nil {
		// The reader goes on from prod2 if a producer can have written it: aligned, not
		// behind prod (producer_pos never moves back), less than a ring past the consumer
		// position, the reader's (at) or the other writer's if further. Else it keeps
		// its own, at, and reads nothing until producer_pos changes.
		consumer := at
		if int64(cons2-at) > 0 {
			consumer = cons2
		}
		skipTo := at
		if prod2%8 == 0 && int64(prod2-prod) >= 0 && (int64(prod2-consumer) < 0 || prod2-consumer < uint64(len(ring))) {
			skipTo = prod2
		}
		r.SkipCorrupt()
		if pos[0] != skipTo || r.Failed() {
			t.Fatalf("after skipCorrupt: consumer_pos %d (want %d), producer_pos %d", pos[0], skipTo, prod2)
		}
		r.Begin() // nothing new either way, and no error
		var rec Record
		if ok, err := r.Next(&rec); ok || err != nil || !r.Settle() {
			t.Fatalf("after skipCorrupt: next = %v, %v", ok, err)
		}
	}
}
