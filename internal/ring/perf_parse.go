// SPDX-License-Identifier: Apache-2.0

package ring

// The perf ring kind's parse (perf.go): the record at the cursor, the reads
// over a head snapshot, and the checks that find a corrupt record.

import (
	"encoding/binary"
	"fmt"
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Next parses the record at the cursor into rec and moves the cursor past it. It returns
// false, nil at the end of the head snapshot, and false with the *CorruptError when the
// record cannot be valid; then the cursor stays put and next keeps returning that error until
// SkipCorrupt. rec is left alone when next returns false. Records of other types than samples
// and lost records are skipped (counted in Other).
//
// The common record, a plain sample (plainAt), is taken as Each takes it; everything else
// goes through parseRest.
func (r *Perf) Next(rec *Record) (bool, error) {
	p, room := r.plainRoom()
	if size, n := plainAt(p, room); size != 0 {
		rec.Type, rec.CPU, rec.Ring, rec.Lost, rec.Wrapped = Sample, r.cpu, r.index, 0, nil
		r.take(rec, p, size, n)
		return true, nil
	}
	if r.parseRest(rec) {
		return true, nil
	}
	if r.blocked() {
		return false, r.corrupt
	}
	return false, nil
}

// NextCopy is Next's plain sample copied straight into c (as SetCopy would
// copy it), without a Record between: it returns the bytes the record took
// in the ring, or 0 for any other record (Next's). The cursor is past the
// record: it is delivered once c holds it.
func (r *Perf) NextCopy(c *Copy) uint64 {
	p, room := r.plainRoom()
	size, n := plainAt(p, room)
	if size == 0 {
		return 0
	}
	next := r.cursor + size
	r.counts.Samples++
	r.counts.Bytes += n
	r.counted, r.cursor = next, next
	c.Data = CopyData(c.Data, unsafe.Slice((*byte)(unsafe.Add(p, recSampleDataOff)), n))
	c.setPlain(r.index, r.cpu)
	return size
}

// parseRest is Next past the plain samples: a sample or lost record parseAny takes,
// skipping the records of other types.
func (r *Perf) parseRest(rec *Record) bool {
	for r.head != r.cursor && !r.blocked() {
		if ok, other := r.parseAny(rec); !ok {
			return false
		} else if !other {
			return true
		}
	}
	return false
}

// Each is the loop that delivers records: RawBuffer.Drain and every policy run it. It parses
// records from the cursor up to the head snapshot and delivers each, the cursor already past
// it, while they start within limit bytes of where it began: to fn, or with a sink (not nil)
// to the sink, which passes on to fn only what it does not take (see Sink). It returns how
// many records it delivered and how many bytes the cursor moved, and stops
//   - at the end of the snapshot, or past limit: nil;
//   - when fn returns an error: that error (the record counts as delivered);
//   - after the copy that fills the sink's Into (Sink.Full): nil;
//   - at a corrupt record: the *CorruptError (the cursor stays on it);
//   - after the record during which stop became true (its owner was closed): nil;
//   - in an ordered run (a sink with KeyEnd), before a sample whose key the run does not take
//     and before any record that is not a plain sample: nil (the cursor stays on it).
//
// It does not commit. Plain samples (plainAt) are taken in line, loaded through the ring's base
// pointer, and copied in line into a sink's Into, with no call per record but fn's (or the
// sink's Sample, or memmove for a payload not of 16 to 64 bytes: CopyData); every other record
// goes through parseRest.
func (r *Perf) Each(rec *Record, limit uint64, stop *atomic.Bool, fn func(*Record) error, s *Sink) (int, uint64, error) {
	from := r.cursor
	rec.CPU, rec.Ring, rec.Key = r.cpu, r.index, 0
	k := 0
	for {
		if r.cursor-from >= limit {
			return k, r.cursor - from, nil
		}
		p, room := r.plainRoom()
		pos := r.cursor
		end := pos + room                          // the records must end by here
		stop0 := pos + min(room, limit-(pos-from)) // and start before here
		// A plain sample's fields but Pos, Next and Data, set once for the
		// loop's samples (parseRest's records set them otherwise): stored
		// for each one, they were a third of take's stores.
		rec.Type, rec.Lost, rec.Wrapped, rec.Late = Sample, 0, nil, false
		stepping := s.stepping()
		for int64(stop0-pos) > 0 {
			if stepping && (!s.inRun() || rec.tookSmall(pos)) {
				if took, err := r.stepRun(s, p, pos, end, stop0); err != ErrNoRun {
					k += took
					if err != nil || took == 0 || stop.Load() {
						return k, r.cursor - from, err // (none taken: the caller moved on)
					}
					pos, p = r.cursor, unsafe.Add(r.base, r.cursor&r.mask)
					continue
				}
			}
			size, n := plainAt(p, end-pos)
			if size == 0 {
				break
			}
			if s.inRun() {
				key, ok := s.runKey(unsafe.Slice((*byte)(unsafe.Add(p, recSampleDataOff)), n))
				if !ok {
					return k, r.cursor - from, nil // the run ends before it
				}
				s.Lo, rec.Key = key, key
			}
			pos, p = r.take(rec, p, size, n)
			k++
			// fn's way goes back to the loop's head on its own: joined with
			// the copy's (which makes no call) before one look at stop, it
			// reloaded six spilled values after fn's call in place of two,
			// and raw Drain took 5-10 % longer a 16-byte record (issue 31).
			if s.takesAll() {
				if err := fn(rec); err != nil || stop.Load() {
					return k, r.cursor - from, err
				}
				continue
			}
			if s.Sample != nil {
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
			if stop.Load() {
				return k, r.cursor - from, nil
			}
		}
		if room > 0 && int64(stop0-pos) <= 0 {
			continue // the limit, or the ring's end: the piece after it is plain again
		}
		if s.inRun() {
			return k, r.cursor - from, nil // a run ends before any other record
		}
		if !r.parseRest(rec) {
			if r.blocked() {
				return k, r.cursor - from, r.corrupt
			}
			return k, r.cursor - from, nil
		}
		k++
		if full, err := s.put(rec, fn); err != nil || full {
			return k, r.cursor - from, err
		}
		if stop.Load() {
			return k, r.cursor - from, nil
		}
	}
}

// stepRun hands the run of plain samples at pos (at p) to s's Yield
// (Sink.Steps), and moves the cursor past what the caller's step took: how
// many, and Yield's error, or ErrNoRun if the record at pos goes the way
// of Each's loop. The run's records end by stop0 (a record that starts
// before it and ends past it is a run of its own) and by end, and 16 bytes
// or more before the ring's end and the head snapshot: the step reads a
// header and the u32 after it at the run's end once the run is over,
// which must be in the ring and published (the last record before the
// head goes Each's way). Not in line in Each's loop, whose registers a
// run's code would take.
func (r *Perf) stepRun(s *Sink, p unsafe.Pointer, pos, end, stop0 uint64) (int, error) {
	ringLeft, headLeft := r.mask+1-pos&r.mask, r.head-pos
	if ringLeft <= 16 || headLeft <= 16 {
		return 0, ErrNoRun
	}
	safe := min(end-pos, ringLeft-16, headLeft-16)
	span := min(stop0-pos, safe)
	if size, _ := plainAt(p, end-pos); size > span && size <= safe {
		span = size
	}
	st := s.Steps
	st.perfRun(r.base, r.mask, pos, pos+span, r.index, r.cpu)
	if err := s.yield(st); err != ErrNoRun {
		return r.tookRun(st, s), err
	}
	return 0, ErrNoRun
}

// plainRoom returns where the record at the cursor starts and how many bytes follow from
// there in one piece, up to the head snapshot or the ring's end, whichever comes first; or
// nil, 0 when the record is none of plainAt's: re-read after Begin (counted already), an
// error pending, or a cursor off the 8-byte alignment, which parseAny reports.
func (r *Perf) plainRoom() (unsafe.Pointer, uint64) {
	pos := r.cursor
	if r.counted != pos || r.corrupt != nil || pos&7 != 0 {
		return nil, 0
	}
	off := pos & r.mask
	return unsafe.Add(r.base, off), min(r.head-pos, uint64(len(r.data))-off)
}

// plainAt checks the record at p, with room bytes of the ring in one piece from p (see
// plainRoom), for a plain sample: a sample whose header, u32 size field and payload lie
// within those bytes. It returns the record's size and the payload's length, or 0, 0 for
// any other record. Its conditions are a subset of parseAny's checks, so both accept exactly
// the same records.
func plainAt(p unsafe.Pointer, room uint64) (size, n uint64) {
	if room < recSampleMinSize {
		return 0, 0 // the header and the size field would not fit
	}
	// The bytes below the head snapshot, so ordered after the acquire load of data_head
	// (kernel: smp_store_release in perf_output_put_handle). p is 8-aligned, and the header
	// and the size field lie within room. The kernel writes them in its own byte order.
	typ := *(*uint32)(p)                        // perf_event_header.type
	size = uint64(*(*uint16)(unsafe.Add(p, 6))) // perf_event_header.size
	n = uint64(*(*uint32)(unsafe.Add(p, recHeaderSize)))
	// size <= room: not past the head snapshot nor the ring's end; n+12 <= size with size a
	// multiple of 8: the payload fits the record, and size >= 16 (so not 0).
	if typ != unix.PERF_RECORD_SAMPLE || size&7 != 0 || size > room || n+recSampleDataOff > size {
		return 0, 0
	}
	return size, n
}

// take delivers the plain sample at the cursor, at p, that plainAt checked into rec, a sample
// with no Lost nor Wrapped (the caller sets those), and moves the cursor past it. It returns
// the new cursor and where it points in the ring: the next record's p for plainAt.
func (r *Perf) take(rec *Record, p unsafe.Pointer, size, n uint64) (uint64, unsafe.Pointer) {
	pos := r.cursor
	next := pos + size
	rec.Pos, rec.Next = pos, next
	rec.Data = unsafe.Slice((*byte)(unsafe.Add(p, recSampleDataOff)), n)
	r.counts.Samples++
	r.counts.Bytes += n
	r.counted, r.cursor = next, next
	// From the base: a pointer past the ring's end is not valid Go.
	return next, unsafe.Add(r.base, next&r.mask)
}

// Peek parses the record at pos, a record boundary between the cursor and the head
// snapshot, into rec without moving the cursor and without counting it: a look ahead. It
// returns false at the end of the snapshot, and for a record that cannot be valid, which
// Next reports once the cursor gets there.
func (r *Perf) Peek(pos uint64, rec *Record) bool {
	if int64(pos-r.cursor) < 0 || int64(r.head-pos) < 0 {
		return false // not between the cursor and the head: nothing to trust there
	}
	cursor, counted, counts, corrupt, badPos := r.cursor, r.counted, r.counts, r.corrupt, r.badPos
	r.cursor, r.counted = pos, pos
	ok, _ := r.Next(rec)
	r.cursor, r.counted, r.counts, r.corrupt, r.badPos = cursor, counted, counts, corrupt, badPos
	return ok
}

// parseAny parses any record at the cursor, checking everything; the caller has checked
// that there is a record (head != cursor) and no error pending at the cursor. It reports
// whether a record was parsed and whether it was of another type (skipped: counted, cursor
// past it, rec not filled in).
func (r *Perf) parseAny(rec *Record) (ok, other bool) {
	pos := r.cursor
	avail := r.head - pos
	if pos&7 != 0 {
		return r.bad(pos, 0, "cursor not 8-aligned"), false
	}
	data := r.data
	// The header never straddles the end: pos is 8-aligned and len(data) a multiple of 8.
	// The kernel writes records in its own byte order, as plainAt reads them.
	off := pos & r.mask
	hdr := data[off : off+recHeaderSize]
	typ := binary.NativeEndian.Uint32(hdr[0:4])
	size := uint64(binary.NativeEndian.Uint16(hdr[6:8]))
	// size-1 >= avail catches size 0 and size > avail in one compare.
	if size&7 != 0 || size-1 >= avail {
		return r.badSize(pos, size, avail), false
	}
	next := pos + size
	count := int64(pos-r.counted) >= 0

	switch typ {
	case unix.PERF_RECORD_SAMPLE:
		if size < recSampleMinSize {
			return r.bad(pos, size, fmt.Sprintf("sample record size %d too short for its size field", size)), false
		}
		// The u32 size is 8-aligned, so it never straddles, but it wraps to the ring's start
		// when the header ends the ring.
		o := (pos + recHeaderSize) & r.mask
		n := uint64(binary.NativeEndian.Uint32(data[o : o+4]))
		if n > size-recSampleDataOff {
			return r.badSample(pos, size, n), false
		}
		start := (pos + recSampleDataOff) & r.mask
		end := start + n
		if end <= uint64(len(data)) {
			rec.Data, rec.Wrapped = data[start:end:end], nil
		} else {
			rec.Data, rec.Wrapped = data[start:], data[:end-uint64(len(data)):end-uint64(len(data))]
		}
		rec.Type, rec.Lost = Sample, 0
		if count {
			r.counts.Samples++
			r.counts.Bytes += n
		}
	case unix.PERF_RECORD_LOST:
		if size < recLostSize {
			return r.bad(pos, size, fmt.Sprintf("lost record size %d shorter than %d", size, recLostSize)), false
		}
		// u64 lost at offset 16: 8-aligned, never straddles.
		o := (pos + 16) & r.mask
		lost := binary.NativeEndian.Uint64(data[o : o+8])
		rec.Type, rec.Lost, rec.Data, rec.Wrapped = Lost, lost, nil, nil
		if count {
			r.counts.Lost += lost
		}
	default:
		other = true
		if count {
			r.counts.Other++
		}
	}
	if count {
		r.counted = next
	}
	r.cursor = next
	if !other {
		rec.CPU, rec.Ring, rec.Pos, rec.Next, rec.Key, rec.Late = r.cpu, r.index, pos, next, 0, false
	}
	return true, other
}

// badSize explains a header size that failed parseAny's combined check.
func (r *Perf) badSize(pos, size, avail uint64) bool {
	var reason string
	switch {
	case size == 0:
		reason = "record size 0"
	case size&7 != 0:
		reason = fmt.Sprintf("record size %d not a multiple of 8", size)
	case size > uint64(len(r.data)):
		reason = fmt.Sprintf("record size %d larger than the %d-byte ring", size, len(r.data))
	default:
		reason = fmt.Sprintf("record size %d past the head (%d bytes pending)", size, avail)
	}
	return r.bad(pos, size, reason)
}

// badSample explains a sample whose u32 size does not fit its header size.
func (r *Perf) badSample(pos, size, n uint64) bool {
	reason := fmt.Sprintf("sample size %d does not fit record size %d", n, size)
	if n+recSampleDataOff > 0xffff {
		// perf_event_header.size is a u16: a bigger sample wraps it (cilium/ebpf#1633).
		reason += " (sample over 64 KiB overflowed the u16 header size)"
	}
	return r.bad(pos, size, reason)
}

// bad records a sticky CorruptError and returns false.
func (r *Perf) bad(pos, size uint64, reason string) bool {
	r.fail(pos, size, reason)
	return false
}
