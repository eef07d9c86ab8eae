// SPDX-License-Identifier: Apache-2.0

package ring

// The BPF ring buffer kind's parse (ringbuf.go): the record at a position,
// the reads over a head snapshot, and the skip past a corruption.

import (
	"fmt"
	"sync/atomic"
	"unsafe"
)

// What the record at a position is (see at).
const (
	atEnd     = iota // the head snapshot: no record
	atBusy           // reserved, not committed
	atBad            // its length runs past the head snapshot
	atDiscard        // discarded by the program
	atSample         // a sample
)

// at is the parse of the record at pos, a position in [cursor, head] on the record grid:
// what it is, its header and its size with header and padding. Pure: it changes nothing.
// A busy header is checked as any other: __bpf_ringbuf_reserve writes its length before it
// publishes producer_pos past the record, and bpf_ringbuf_commit clears the busy bit in the
// same exchange that sets the discard bit, so a busy record that runs past the head
// snapshot, or one busy and discarded at once, cannot be the kernel's.
func (r *RingBuf) at(pos uint64) (kind int, hdr uint32, size uint64) {
	if pos == r.head {
		return atEnd, 0, 0
	}
	hdr = r.loadHeader(pos)
	size = (uint64(hdr&bpfRingLenMask) + bpfRingHdrRound) &^ 7
	switch {
	case size > r.head-pos || hdr&bpfRingBusyBit != 0 && hdr&bpfRingDiscardBit != 0:
		return atBad, hdr, size
	case hdr&bpfRingBusyBit != 0:
		return atBusy, hdr, size
	case hdr&bpfRingDiscardBit != 0:
		return atDiscard, hdr, size
	}
	return atSample, hdr, size
}

// fill sets rec to the sample at pos. The payload is one piece: the record ends by the head
// snapshot, so within size-8 bytes of pos, and the second copy of the area continues the
// first.
func (r *RingBuf) fill(rec *Record, pos uint64, hdr uint32, size uint64) {
	off := pos&r.mask + bpfRingHdrSize
	end := off + uint64(hdr&bpfRingLenMask)
	rec.Type, rec.Ring, rec.CPU, rec.Pos, rec.Next = Sample, r.index, r.cpu, pos, pos+size
	rec.Data, rec.Wrapped, rec.Lost, rec.Key, rec.Late = r.data[off:end:end], nil, 0, 0, false
}

// Next parses the record at the cursor into rec and moves the cursor past it. It returns
// false, nil at the end of the head snapshot or at a record still busy (call Refresh or
// Begin for more), and false with a *CorruptError for a record or positions that cannot be
// valid; the cursor stays and next keeps returning that error until SkipCorrupt. Discarded
// records are skipped and counted (discarded), never returned. rec is left alone when next
// returns false.
//
// rec.Data aliases ring memory until consumer_pos is committed past rec.Next.
func (r *RingBuf) Next(rec *Record) (bool, error) {
	// The common record, a committed sample not counted yet, as Each's loop takes it.
	if pos := r.cursor; pos != r.head && r.corrupt == nil && int64(pos-r.counted) >= 0 {
		if p, n, size := r.plainAt(unsafe.Pointer(unsafe.SliceData(r.data)), pos, r.head); size != 0 {
			r.cursor = pos + size
			rec.Type, rec.Ring, rec.CPU, rec.Wrapped, rec.Lost, rec.Key, rec.Late = Sample, r.index, r.cpu, nil, 0, 0, false
			r.take(rec, p, pos, n, size)
			return true, nil
		}
	}
	return r.next(rec)
}

// NextCopy is Next's common record copied straight into c (as SetCopy
// would copy it), without a Record between: it returns the bytes the
// record took in the ring, or 0 when the next record is not a committed
// sample not counted yet (Next's to parse, the careful way). The cursor
// is past the record: it is delivered once c holds it.
func (r *RingBuf) NextCopy(c *Copy) uint64 {
	pos := r.cursor
	if pos == r.head || r.corrupt != nil || int64(pos-r.counted) < 0 {
		return 0
	}
	p, n, size := r.plainAt(unsafe.Pointer(unsafe.SliceData(r.data)), pos, r.head)
	if size == 0 {
		return 0
	}
	r.cursor = pos + size
	r.counts.Samples++
	r.counts.Bytes += n
	c.Data = CopyData(c.Data, unsafe.Slice((*byte)(unsafe.Add(p, bpfRingHdrSize)), n))
	c.setPlain(r.index, r.cpu)
	return size
}

// next is Next for every record: the careful way.
func (r *RingBuf) next(rec *Record) (bool, error) {
	for {
		if r.blocked() {
			return false, r.corrupt
		}
		pos := r.cursor
		kind, hdr, size := r.at(pos)
		switch kind {
		case atEnd, atBusy:
			return false, nil
		case atBad:
			r.badRecord(pos, hdr, size)
			return false, r.corrupt
		}
		count := int64(pos-r.counted) >= 0 // (see counted)
		r.cursor = pos + size
		if kind == atDiscard {
			if count {
				r.counts.Discarded++
			}
			continue
		}
		r.fill(rec, pos, hdr, size)
		if count {
			r.counts.Samples++
			r.counts.Bytes += uint64(len(rec.Data))
		}
		return true, nil
	}
}

// plainAt is the fast parse of the record at pos, a position in [cursor, head) on the record
// grid with no error pending, base being &data[0]: where it starts in the area, its payload's
// length and its size with header and padding, for a committed sample (neither busy nor
// discarded) that ends by head; size 0 for any other record, which next and at parse the
// careful way. It loads through base without bounds checks: the invariants keep pos&mask <=
// size-8 for the header, and a sample that ends by head ends within 2*size.
func (r *RingBuf) plainAt(base unsafe.Pointer, pos, head uint64) (p unsafe.Pointer, n, size uint64) {
	p = unsafe.Add(base, pos&r.mask)
	// Acquire: pairs with the xchg of hdr->len in bpf_ringbuf_commit (see loadHeader).
	hdr := atomic.LoadUint32((*uint32)(p))
	n = uint64(hdr & bpfRingLenMask)
	size = (n + bpfRingHdrRound) &^ 7
	if hdr&(bpfRingBusyBit|bpfRingDiscardBit) != 0 || size > head-pos {
		return p, 0, 0
	}
	return p, n, size
}

// take delivers the sample at pos, at p in the area, that plainAt checked, into rec (whose
// Type, Ring, CPU and the rest are set already), and counts it; the cursor is past it.
func (r *RingBuf) take(rec *Record, p unsafe.Pointer, pos, n, size uint64) {
	rec.Data, rec.Pos, rec.Next = unsafe.Slice((*byte)(unsafe.Add(p, bpfRingHdrSize)), n), pos, pos+size
	r.counts.Samples++
	r.counts.Bytes += n
}

// badRecord records a corrupt record at pos, whose header at found atBad.
func (r *RingBuf) badRecord(pos uint64, hdr uint32, size uint64) {
	var reason string
	if hdr&bpfRingBusyBit != 0 && hdr&bpfRingDiscardBit != 0 {
		reason = fmt.Sprintf("record header %#x busy and discarded at once", hdr)
	} else {
		what := "record"
		if hdr&bpfRingBusyBit != 0 {
			what = "busy record"
		}
		reason = fmt.Sprintf("%s length %d (%d bytes with header and padding) past producer position %d",
			what, hdr&bpfRingLenMask, size, r.head)
	}
	r.fail(pos, size, reason)
}

// Peek parses the sample at pos, a record boundary between the cursor and the head
// snapshot, into rec without moving the cursor and without counting it: a look ahead.
// Discarded records are skipped as next skips them, so rec.Pos may lie past pos. It returns
// false at the end of the snapshot, at a busy record, for a record that cannot be valid
// (next reports it once the cursor gets there), with an error pending at pos, and for a pos
// off the record grid between the cursor and the head.
func (r *RingBuf) Peek(pos uint64, rec *Record) bool {
	if int64(pos-r.cursor) < 0 || int64(r.head-pos) < 0 || pos&7 != 0 {
		return false
	}
	for {
		if r.corrupt != nil && (r.badPos || int64(pos-r.corrupt.Pos) >= 0) {
			return false
		}
		kind, hdr, size := r.at(pos)
		switch kind {
		case atSample:
			r.fill(rec, pos, hdr, size)
			return true
		case atDiscard:
			pos += size
		default:
			return false
		}
	}
}

// Each is THE loop that delivers samples. It parses records from the cursor and delivers
// each sample, the cursor already past it, while records start within limit bytes of where it
// began: to fn, or with a sink (not nil) to the sink, which passes on to fn only what it does
// not take (see Sink); discarded records are skipped and counted. It returns how many samples
// it delivered and how many bytes the cursor moved, and stops
//   - at the end of the head snapshot, at a record still busy, or at limit: nil;
//   - when fn returns an error: that error (the record counts as delivered);
//   - after the copy that fills the sink's Into (Sink.Full): nil;
//   - at a corrupt record or positions: the *CorruptError (the cursor stays on the record);
//   - after the record during which stop (if not nil) became true: nil;
//   - in an ordered run (a sink with KeyEnd), before a sample whose key the run does not take,
//     and at once on the careful path (records read again, an error pending): nil.
//
// It does not commit, allocates nothing and makes no call per record but fn's (or the sink's
// Sample, or memmove for a payload not of 16 to 64 bytes: CopyData): the common record, a
// sample not read before, is parsed and copied in line (the rest goes through next). rec's Data
// aliases ring memory until consumer_pos is committed past rec.Next; fn must not call the
// ring's methods.
func (r *RingBuf) Each(rec *Record, limit uint64, stop *atomic.Bool, fn func(*Record) error, s *Sink) (int, uint64, error) {
	from := r.cursor
	k := 0
	// Records read again after Begin (counted already) and pending errors: the careful way.
	for int64(r.counted-r.cursor) > 0 || r.corrupt != nil {
		if r.cursor-from >= limit || s.inRun() { // a run ends before these
			return k, r.cursor - from, nil
		}
		ok, err := r.Next(rec)
		if !ok {
			return k, r.cursor - from, err
		}
		k++
		if full, err := s.put(rec, fn); err != nil || full {
			return k, r.cursor - from, err
		}
		if stop != nil && stop.Load() {
			return k, r.cursor - from, nil
		}
	}
	// The fast loop: plainAt for each record, at for the others (busy, discarded, corrupt).
	// The invariants hold (no error pending) and nothing from the cursor on was counted.
	rec.Type, rec.Ring, rec.CPU, rec.Wrapped, rec.Lost, rec.Key, rec.Late = Sample, r.index, r.cpu, nil, 0, 0, false
	base, head := unsafe.Pointer(unsafe.SliceData(r.data)), r.head
	for pos := r.cursor; pos != head && pos-from < limit; pos = r.cursor {
		if s.stepping() && (!s.inRun() || rec.tookSmall(pos)) {
			if took, err := r.stepRun(s, base, pos, limit-(pos-from)); err != ErrNoRun {
				k += took
				if err != nil || took == 0 || stop != nil && stop.Load() {
					return k, r.cursor - from, err // (none taken: the caller moved on)
				}
				continue
			}
		}
		p, n, size := r.plainAt(base, pos, head)
		if size == 0 {
			switch kind, hdr, size := r.at(pos); kind { // (not atEnd: pos != head)
			case atDiscard:
				r.cursor = pos + size // and counted with it
				r.counts.Discarded++
				continue
			case atBad:
				r.badRecord(pos, hdr, size)
				return k, r.cursor - from, r.corrupt
			}
			return k, r.cursor - from, nil // not committed yet: records are consumed in order
		}
		if s.inRun() {
			key, ok := s.runKey(unsafe.Slice((*byte)(unsafe.Add(p, bpfRingHdrSize)), n))
			if !ok {
				return k, r.cursor - from, nil // the run ends before it
			}
			s.Lo, rec.Key = key, key
		}
		r.cursor = pos + size // and counted with it (see Begin)
		r.take(rec, p, pos, n, size)
		k++
		if s.takesAll() {
			if err := fn(rec); err != nil {
				return k, r.cursor - from, err
			}
		} else if s.Sample != nil {
			s.Sample(r.cpu, rec.Data)
		} else {
			c := &s.Into[s.N]
			c.Data = CopyData(c.Data, rec.Data)
			c.setPlain(r.index, r.cpu)
			c.Key = rec.Key // a run's (else 0)
			if s.Took(len(rec.Data)) {
				return k, r.cursor - from, nil
			}
		}
		if stop != nil && stop.Load() {
			return k, r.cursor - from, nil
		}
	}
	return k, r.cursor - from, nil
}

// stepRun hands the run of plain samples at pos to s's Yield (Sink.Steps),
// and moves the cursor past what the caller's step took: how many, and
// Yield's error, or ErrNoRun if the record at pos goes the way of Each's
// loop. The run's records start within left bytes of pos (a record that
// starts within them and ends past them is a run of its own), and end 8
// bytes before the snapshot's end: the step reads a header at the run's
// end once it is over, which must be a record's the producer published
// (the last record goes Each's way). Not in line in Each's loop, whose
// registers a run's code would take.
func (r *RingBuf) stepRun(s *Sink, base unsafe.Pointer, pos, left uint64) (int, error) {
	head := r.head
	end := head - 8
	if left < end-pos {
		end = pos + left
		if _, _, size := r.plainAt(base, pos, head); size > left && size <= head-8-pos {
			end = pos + size
		}
	}
	st := s.Steps
	st.ringBufRun(base, r.mask, pos, end, r.index, r.cpu)
	if err := s.yield(st); err != ErrNoRun {
		return r.tookRun(st, s), err
	}
	return 0, ErrNoRun
}

// SkipCorrupt is the way on after a CorruptError. It counts the error (Corrupt, once per
// error) and gives up what is pending. With a producer_pos (loaded afresh) that the kernel
// can have written, it gives up everything up to it, commits consumer_pos there, clears the
// error and returns the bytes skipped, counted in CorruptBytes; records parsed but not
// committed are released too (not counted as skipped). Without a pending error it discards
// what is pending, counted as skipped.
//
// Only the kernel writes producer_pos (its page is read-only to user space), so it is the
// position to resynchronise with when consumer_pos is what went wrong. But a producer_pos
// that no producer can have written is never stored as consumer_pos (see couldBe): storing
// one behind the reader's own position hands records out again, and one past the kernel's
// producer makes the kernel refuse every output as full (__bpf_ringbuf_reserve refuses a
// record that would end more than size-1 past consumer_pos). Then the reader keeps its own
// position: it commits the records it parsed (the cursor, or the consumer_pos it stored
// last if another writer moved the cursor), skips nothing, and passes over that
// producer_pos: snapshots see nothing new while producer_pos keeps that value, and reading
// goes on from the committed position once producer_pos is valid again.
func (r *RingBuf) SkipCorrupt() uint64 {
	if r.corrupt != nil {
		r.counts.Corrupt++
	}
	p := r.loadProducer()
	if !r.couldBe(p) {
		target := r.own
		if r.held {
			target = r.tail // the records held back were delivered
		}
		if r.tail == target && int64(r.cursor-target) > 0 && int64(r.seen-r.cursor) >= 0 {
			target = r.cursor // parsed from our own position, within what the producer wrote
		}
		r.ignored, r.ignoring = p, true
		r.corrupt, r.badPos = nil, false
		r.cursor, r.head = target, target
		if int64(r.counted-target) < 0 {
			r.counted = target
		}
		r.resync(target)
		return 0
	}
	from := r.cursor
	if r.corrupt != nil && !r.badPos && int64(r.corrupt.Pos-from) > 0 {
		from = r.corrupt.Pos // the records before it are good (Begin went back)
	}
	var skipped uint64
	if d := p - from; int64(d) > 0 {
		skipped = min(d, r.mask+1)
	}
	r.counts.CorruptBytes += skipped
	r.corrupt, r.badPos, r.ignoring = nil, false, false
	r.cursor, r.head, r.counted = p, p, p
	r.seen, r.sure = p, true
	r.resync(p)
	return skipped
}

// couldBe reports whether a producer can have written producer_pos p, as far as the reader
// knows: p is 8-aligned, not behind the last producer_pos taken as valid nor the
// consumer_pos this reader stored, and less than a ring past the further of that
// consumer_pos and the one in memory (another consumer's commits let the kernel go further).
// Before the reader took any positions as valid (they were wrong at opening) it knows
// nothing to check against, and any aligned p could be the kernel's.
func (r *RingBuf) couldBe(p uint64) bool {
	if p&7 != 0 {
		return false
	}
	if !r.sure {
		return true
	}
	lo, hi := r.seen, r.own
	if int64(r.own-lo) > 0 {
		lo = r.own
	}
	if c := atomic.LoadUint64(r.consumer); int64(c-hi) > 0 { // ours; pairs with store
		hi = c
	}
	return int64(p-lo) >= 0 && (int64(p-hi) < 0 || p-hi <= r.mask)
}
