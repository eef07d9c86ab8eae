package perfbuf

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"testing"
	"unsafe"
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
			if hostBigEndian {
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
		if h&(1<<31) != 0 {
			return recs, pos, "busy"
		}
		n := uint64(h & (1<<30 - 1))
		sz := (n + 8 + 7) / 8 * 8
		if sz > prod-pos {
			return recs, pos, "corrupt"
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
	f := newFakeBPFRingAt(size, start)
	for _, op := range ops {
		n, discard := op, false
		if n >= 1<<20 {
			n, discard = n-1<<20, true
		}
		busy := n < 0
		if busy {
			n = -n
		}
		pos, ok := f.reserve(n)
		if !ok {
			panic("fuzz seed does not fit")
		}
		f.write(pos, fakePattern(n, byte(n)))
		if !busy {
			f.commit(pos, discard)
		}
	}
	return bytes.Clone(f.data[:size]), f.prod
}

// fuzzBPFReader builds a reader over ring (mirrored into a fresh 2*size area) at the
// given positions.
func fuzzBPFReader(t *testing.T, ring []byte, cons, prod uint64) (*bpfRing, *[2]uint64, []byte) {
	size := len(ring)
	mem := make([]uint64, size/4)
	data := unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(mem))), 2*size)
	copy(data, ring)
	copy(data[size:], ring)
	pos := &[2]uint64{cons, prod}
	r, err := newBPFRingFromParts(-1, &pos[0], &pos[1], data)
	if err != nil {
		t.Fatal(err)
	}
	return r, pos, data
}

// FuzzBPFRingParse reads arbitrary bytes as a BPF ring buffer with arbitrary positions: next
// and each must never panic, loop or read outside the area; they must return exactly what
// the reference parser finds, stop without error at a busy record and with a CorruptError
// where the reference finds corruption; skipCorrupt must get past it; commit must take
// exactly the valid positions; each must honour its limit.
func FuzzBPFRingParse(f *testing.F) {
	add := func(ring []byte, cons, prod uint64, limit uint16, commit uint64) {
		f.Add(ring, cons, prod, limit, commit)
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

	f.Fuzz(func(t *testing.T, content []byte, cons, prod uint64, limit uint16, commit uint64) {
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
		r.begin()
		var got []refBPFRecord
		var nextErr error
		for i := 0; ; i++ {
			if i > size/8+1 {
				t.Fatalf("more than %d records from a %d-byte ring", i, size)
			}
			var rec Record
			ok, err := r.next(&rec)
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
		if fmt.Sprint(got) != fmt.Sprint(samples) || int(r.discarded()) != discards {
			t.Fatalf("next: %v, %d discarded; reference %v, %d discarded", got, r.discarded(), samples, discards)
		}
		if (stop == "corrupt") != (nextErr != nil) || r.cursorPos() != at && stop != "corrupt" {
			t.Fatalf("next stopped at %d with %v; reference at %d: %s", r.cursorPos(), nextErr, at, stop)
		}
		if st := r.counts(); st.Samples != uint64(len(samples)) {
			t.Fatalf("stats %+v for %d samples", st, len(samples))
		}

		// each, within limit: the records that start within limit bytes of cons.
		r2, _, data2 := fuzzBPFReader(t, ring, cons, prod)
		r2.begin()
		var got2 []refBPFRecord
		var rec Record
		n, _, eachErr := r2.each(&rec, uint64(limit), nil, func(rec *Record) error {
			checkFuzzBPFRecord(t, data2, rec)
			got2 = append(got2, refBPFRecord{rec.Pos, rec.Next, false, bytes.Clone(rec.Data)})
			return nil
		})
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
		if n != len(got2) || fmt.Sprint(got2) != fmt.Sprint(within) || int(r2.discarded()) != wantDiscards {
			t.Fatalf("each with limit %d: %d, %v, %d discarded; reference %v, %d discarded", limit, n, got2, r2.discarded(), within, wantDiscards)
		}
		if wantCorrupt != (eachErr != nil) || (eachErr != nil && eachErr.Error() != fmt.Sprint(nextErr)) {
			t.Fatalf("each with limit %d: %v; next: %v", limit, eachErr, nextErr)
		}

		// peek at every record boundary sees the sample next saw there (or the next one).
		r3, _, _ := fuzzBPFReader(t, ring, cons, prod)
		r3.begin()
		for i, w := range want {
			var rec Record
			ok := r3.peek(w.pos, &rec)
			j := i
			for j < len(want) && want[j].discard {
				j++
			}
			if ok != (j < len(want)) || ok && (rec.Pos != want[j].pos || !bytes.Equal(rec.Data, want[j].payload)) {
				t.Fatalf("peek(%d) = %v %+v; reference %v", w.pos, ok, rec, want[j:])
			}
		}
		if r3.cursorPos() != cons && stop != "corrupt" || r3.counts().Samples != 0 || r3.corrupt != nil && stop != "corrupt" {
			t.Fatal("peek moved the cursor, counted or recorded an error")
		}

		if stop == "corrupt" {
			var ce *CorruptError
			if !errors.Is(nextErr, ErrCorrupt) || !errors.As(nextErr, &ce) || ce.Pos != at {
				t.Fatalf("error %v, reference corrupt at %d", nextErr, at)
			}
			if ok, err := r.next(&rec); ok || err != nextErr || r.settle() {
				t.Fatalf("after the error: next = %v, %v", ok, err)
			}
			skipped := r.skipCorrupt()
			if st := r.counts(); st.Corrupt != 1 || st.CorruptBytes != skipped || skipped > uint64(size) ||
				pos[0] != prod&^7 || r.pending() != 0 {
				t.Fatalf("after skipCorrupt: skipped %d, consumer_pos %d (producer_pos %d), pending %d, stats %+v",
					skipped, pos[0], prod, r.pending(), st)
			}
			r.begin()
			if ok, err := r.next(&rec); ok || err != nil || !r.settle() {
				t.Fatalf("next after skipCorrupt = %v, %v", ok, err)
			}
			return
		}

		// settle: true exactly when the reader stopped at the head or at a busy record and
		// has committed everything.
		if r.settle() != (r.cursorPos() == cons) {
			t.Fatalf("settle with the cursor at %d, consumer_pos %d", r.cursorPos(), cons)
		}
		r.commitCursor()
		if !r.settle() || pos[0] != at {
			t.Fatalf("settle at %d (%s), consumer_pos %d", at, stop, pos[0])
		}

		// commit takes positions from cons up to the cursor, 8-aligned; anything else is
		// refused and leaves consumer_pos alone.
		r4, pos4, _ := fuzzBPFReader(t, ring, cons, prod)
		r4.begin()
		for {
			if ok, _ := r4.next(&rec); !ok {
				break
			}
		}
		err := r4.commit(commit)
		valid := commit-cons <= r4.cursorPos()-cons && commit%8 == 0 || commit == cons
		if valid != (err == nil) {
			t.Fatalf("commit(%d) with consumer %d, cursor %d: %v", commit, cons, r4.cursorPos(), err)
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
	if rec.Pos%8 != 0 || rec.Next-rec.Pos != (n+15)&^7 || rec.Next-rec.Pos >= size || rec.Wrapped != nil || rec.Type != RecordSample {
		t.Fatalf("record %+v", rec)
	}
	if n > 0 && &rec.Data[0] != &data[off+8] || off+8+n > uint64(len(data)) || uint64(cap(rec.Data)) != n {
		t.Fatalf("payload at %d, %d bytes, not where the record is", rec.Pos, n)
	}
}
