// SPDX-License-Identifier: Apache-2.0

package ring

// The perf ring kind: one CPU's perf ring, read in place. The memory is a
// struct perf_event_mmap_page header page followed by a power-of-two data
// area, as libbpf's perf_buffer__buffer() or perfbuf's own opener
// (internal/kernel) map it. Its loads and stores of data_head and data_tail,
// its parse and its wake rule are here; the cursor over them is cursor.go's.

import (
	"encoding/binary"
	"fmt"
	"os"
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Sizes of the records' fixed parts (include/uapi/linux/perf_event.h).
const (
	recHeaderSize    = 8                     // struct perf_event_header { u32 type; u16 misc; u16 size; }
	recSampleMinSize = recHeaderSize + 8     // header, u32 size, padded to 8
	recSampleDataOff = recHeaderSize + 4     // the raw payload follows the u32 size
	recLostSize      = recHeaderSize + 8 + 8 // header, u64 id, u64 lost
)

// Perf reads one perf ring. One goroutine uses it at a time; the producer is the
// kernel, which writes records and data_head while the reader reads them and writes
// data_tail.
//
// Reading works with a cursor and a head snapshot: Begin takes both (cursor = data_tail,
// head = data_head); parsing goes from the cursor up to the snapshot and never beyond it, so
// a fast producer cannot keep a reader busy forever; commit publishes data_tail, handing the
// space back to the kernel.
//
// Nothing read from the ring is trusted: a record that cannot be valid gives a
// *CorruptError, never a panic or an access outside the ring, and stays pending (sticky)
// until SkipCorrupt.
//
// The invariant of the cursor (in ring order, wrap-safe), tail <= cursor <= head <=
// tail+len(data), is kept by snapshot and SkipCorrupt; parsing relies on it to stay inside
// data. The counts are exact: counted moves with every record counted.
type Perf struct {
	Cursor
	page *unix.PerfEventMmapPage
	data []byte // the data area; len is a power of two
	// base is &data[0], where plainRoom and take start from: loads through it need no
	// bounds checks beyond plainAt's.
	base unsafe.Pointer
	mask uint64 // len(data)-1

	// With a position error pending (Cursor.badPos), badAt is the invalid head snapshot, and
	// behind says it was behind the tail: SkipCorrupt resyncs the tail to it.
	badAt  uint64
	behind bool
}

// NewPerf builds a reader over a mapped perf ring. base points at the
// perf_event_mmap_page and dataSize is the size of the data area (what perf_buffer__buffer
// reports). The data area starts at base+Data_offset, or one page after base on kernels that
// leave Data_offset 0. The mapping must outlive the ring and every Record it returned.
//
// Errors wrap os.ErrInvalid.
func NewPerf(cpu int, base unsafe.Pointer, dataSize int) (*Perf, error) {
	if base == nil {
		return nil, fmt.Errorf("new perf ring cpu %d: nil base: %w", cpu, os.ErrInvalid)
	}
	if err := checkRingSize(cpu, dataSize); err != nil {
		return nil, err
	}
	// The kernel fills data_offset and data_size when it sets the page up, before the mmap
	// returns (perf_mmap -> perf_event_init_userpage), and never changes them: plain reads.
	page := (*unix.PerfEventMmapPage)(base)
	off := page.Data_offset
	if off == 0 {
		off = uint64(os.Getpagesize())
	}
	if off < uint64(unsafe.Sizeof(*page)) || off%8 != 0 {
		return nil, fmt.Errorf("new perf ring cpu %d: data offset %d inside the header page: %w", cpu, off, os.ErrInvalid)
	}
	if page.Data_size != 0 && page.Data_size != uint64(dataSize) {
		return nil, fmt.Errorf("new perf ring cpu %d: data size %d, header says %d: %w", cpu, dataSize, page.Data_size, os.ErrInvalid)
	}
	// The data area is part of the same mapping, off bytes after the header page; the caller
	// (perf_buffer__buffer) vouches that dataSize bytes are mapped there.
	data := unsafe.Slice((*byte)(unsafe.Add(base, off)), dataSize)
	return NewPerfFromParts(cpu, page, data)
}

// NewPerfFromParts builds a reader over a header page and a data area given separately;
// tests use it with Go memory. len(data) must be a power of two, at least 8.
func NewPerfFromParts(cpu int, page *unix.PerfEventMmapPage, data []byte) (*Perf, error) {
	if page == nil {
		return nil, fmt.Errorf("new perf ring cpu %d: nil header page: %w", cpu, os.ErrInvalid)
	}
	if err := checkRingSize(cpu, len(data)); err != nil {
		return nil, err
	}
	r := &Perf{
		page: page,
		data: data[:len(data):len(data)],
		base: unsafe.Pointer(unsafe.SliceData(data)),
		mask: uint64(len(data) - 1),
	}
	r.init(cpu, uint64(len(data)), fmt.Sprintf("perf ring cpu %d", cpu), r, r.loadTail())
	return r, nil
}

func checkRingSize(cpu, n int) error {
	if n < 8 || n&(n-1) != 0 {
		return fmt.Errorf("new perf ring cpu %d: data size %d is not a power of two >= 8: %w", cpu, n, os.ErrInvalid)
	}
	return nil
}

// loadHead loads data_head. The load is atomic (acquire): it pairs with the kernel's
// smp_store_release of data_head in perf_output_put_handle, so the record bytes below the
// returned head are visible once it returns (libbpf: smp_load_acquire in ring_buffer_read_head).
func (r *Perf) loadHead() uint64 {
	return atomic.LoadUint64(&r.page.Data_head)
}

// Cur returns the ring's cursor.
func (r *Perf) Cur() *Cursor { return &r.Cursor }

// View returns a new reader of the ring's memory (see Kind).
func (r *Perf) View() (Ring, error) {
	v, err := NewPerfFromParts(r.cpu, r.page, r.data)
	if err != nil {
		return nil, err
	}
	v.SetIndex(r.index)
	return v, nil
}

// Progress is data_head, for the wait.
func (r *Perf) Progress() uint64 { return r.loadHead() }

// loadTail loads data_tail, the position up to which the reader has released the ring.
func (r *Perf) loadTail() uint64 {
	// Pairs with our own StoreUint64 in store; the kernel only reads data_tail.
	return atomic.LoadUint64(&r.page.Data_tail)
}

// positions loads data_tail and data_head (the cursor's memory).
func (r *Perf) positions() (consumer, producer uint64) { return r.loadTail(), r.loadHead() }

// Begin starts a read: the cursor goes back to data_tail and the head snapshot is taken
// afresh. Records read but not committed are read again. An invalid head (behind the tail,
// moved backwards, unaligned, or more than size() past the tail) is a pending CorruptError.
func (r *Perf) Begin() {
	r.tail = r.loadTail()
	r.cursor = r.tail
	if !r.snapshot() {
		r.head = r.cursor // nothing to read past a bad head
	}
}

// Refresh takes a new head snapshot and keeps the cursor.
func (r *Perf) Refresh() { r.snapshot() }

// snapshot loads data_head into r.head if it is valid; otherwise it records a CorruptError
// (unless one is pending) and leaves r.head alone.
func (r *Perf) snapshot() bool {
	h := r.loadHead()
	var reason string
	switch {
	case r.ignoring && h == r.ignored && r.corrupt == nil:
		return false // passed over already (SkipCorrupt): nothing new
	case int64(h-r.tail) < 0:
		reason = fmt.Sprintf("head %d behind tail %d", h, r.tail)
	case int64(h-r.head) < 0:
		reason = fmt.Sprintf("head moved backwards from %d to %d", r.head, h)
	case h-r.tail > uint64(len(r.data)):
		reason = fmt.Sprintf("head %d more than the %d-byte ring past tail %d", h, len(r.data), r.tail)
	case h&7 != 0:
		reason = fmt.Sprintf("head %d not 8-aligned", h)
	default:
		r.head = h
		r.badPos, r.ignoring = false, false // the head is sane again
		r.counts.MaxFill = max(r.counts.MaxFill, int(h-r.tail))
		return true
	}
	if r.corrupt == nil {
		r.failPos(r.cursor, h, reason)
		r.badAt, r.behind = h, int64(h-r.tail) < 0
	}
	return false
}

// Quiet reports that the cursor is at the head snapshot, no error is pending and data_head
// has not moved since the snapshot: nothing to parse, and nothing for Refresh to do. It is
// the cheap test that an ordered Reader makes of a quiet ring, once per record for every
// ring without one.
func (r *Perf) Quiet() bool {
	// Acquire; pairs with the kernel's smp_store_release of data_head (see loadHead). A head
	// that moved, or an invalid one, is left to Refresh.
	return r.cursor == r.head && r.corrupt == nil && atomic.LoadUint64(&r.page.Data_head) == r.head
}

// Reached reports whether a reader whose oldest record not delivered is at oldest has
// delivered everything below to, a head snapshot taken earlier (a Flush's): oldest is at or
// past it, or to is an invalid head that SkipCorrupt passed over, no record boundary. Not
// with an error pending, nor with data_head behind data_tail as the memory holds them (to
// may then lie below oldest without a record delivered): that is recorded as the pending
// error, as Begin would, so that the policy's next look at the ring (quiet is false with an
// error) meets and reports it.
func (r *Perf) Reached(oldest, to uint64) bool {
	if r.corrupt != nil || !(int64(oldest-to) >= 0 || r.ignoring && to == r.ignored) {
		return false
	}
	// Once per ring and flush (a ring reached is not asked again), not per record.
	if t, h := r.positions(); int64(h-t) < 0 {
		r.failPos(r.cursor, h, fmt.Sprintf("head %d behind tail %d", h, t))
		r.badAt, r.behind = h, true
		return false
	}
	return true
}

// Stalled is false: a perf ring's records below the head are all written.
func (r *Perf) Stalled() bool { return false }

// Settle is what must hold before the ring's reader sleeps, and reports whether it may.
// A perf ring wakes its reader by wakeup_events or the watermark whatever data_tail says,
// and the wait compares data_head with what it saw (internal/wait): nothing to settle.
func (r *Perf) Settle() bool { return true }

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
		rec.CPU, rec.Ring = r.cpu, r.index
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
	c.Data = copyData(c.Data, unsafe.Slice((*byte)(unsafe.Add(p, recSampleDataOff)), n))
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
//   - after the record during which stop became true (its owner was closed): nil.
//
// It does not commit. Plain samples (plainAt) are taken in line, loaded through the ring's base
// pointer, and copied in line into a sink's Into, with no call per record but fn's (or the
// sink's Sample, or memmove for a payload not of 16 to 64 bytes: copyData); every other record
// goes through parseRest.
func (r *Perf) Each(rec *Record, limit uint64, stop *atomic.Bool, fn func(*Record) error, s *Sink) (int, uint64, error) {
	from := r.cursor
	rec.CPU, rec.Ring = r.cpu, r.index
	k := 0
	for {
		if r.cursor-from >= limit {
			return k, r.cursor - from, nil
		}
		p, room := r.plainRoom()
		pos := r.cursor
		end := pos + room                          // the records must end by here
		stop0 := pos + min(room, limit-(pos-from)) // and start before here
		for int64(stop0-pos) > 0 {
			size, n := plainAt(p, end-pos)
			if size == 0 {
				break
			}
			pos, p = r.take(rec, p, size, n)
			k++
			// fn's way goes back to the loop's head on its own: joined with
			// the copy's (which makes no call) before one look at stop, it
			// reloaded six spilled values after fn's call in place of two,
			// and raw Drain took 5-10 % longer a 16-byte record (issue 31).
			if s == nil {
				if err := fn(rec); err != nil || stop.Load() {
					return k, r.cursor - from, err
				}
				continue
			}
			if s.Sample != nil {
				s.Sample(r.cpu, rec.Data)
			} else {
				c := &s.Into[s.N]
				c.Data = copyData(c.Data, rec.Data)
				c.setPlain(r.index, r.cpu)
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

// take delivers the plain sample at the cursor, at p, that plainAt checked into rec and moves
// the cursor past it. It returns the new cursor and where it points in the ring: the next
// record's p for plainAt.
func (r *Perf) take(rec *Record, p unsafe.Pointer, size, n uint64) (uint64, unsafe.Pointer) {
	pos := r.cursor
	next := pos + size
	rec.Type, rec.Pos, rec.Next, rec.Lost = Sample, pos, next, 0
	rec.Data, rec.Wrapped = unsafe.Slice((*byte)(unsafe.Add(p, recSampleDataOff)), n), nil
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

// storeConsumer stores data_tail (the cursor's memory): the reader's own, whatever from is.
func (r *Perf) storeConsumer(_, pos uint64) bool {
	// Release; pairs with the kernel's READ_ONCE(data_tail) + smp_mb() in perf_output_begin:
	// our reads of the records before pos happen before the kernel reuses their space
	// (libbpf: smp_store_release in ring_buffer_write_tail).
	atomic.StoreUint64(&r.page.Data_tail, pos)
	return true
}

// SkipCorrupt is the way on after a CorruptError: it gives up everything up to the head
// snapshot, commits data_tail there, clears the error and returns the number of bytes
// skipped; the counts take the corruption and the bytes. Records parsed but not committed
// are released too (not counted as skipped), also those that Begin would read again before
// the corrupt one. Without a pending error it discards what is pending, counted as skipped.
//
// An invalid head snapshot is the header page's, not the records': SkipCorrupt passes over
// that data_head value, skipping nothing, and reading goes on once the kernel writes
// data_head again (a head too far ahead, unaligned or moved backwards would otherwise make
// the reader skip genuine records). A head behind the tail says the tail moved: the reader
// resynchronises with the head, committing it as the tail; the bytes between count as
// skipped, as every form of reading reports it.
func (r *Perf) SkipCorrupt() uint64 {
	if r.corrupt != nil {
		r.counts.Corrupt++
	}
	if r.badPos && !r.behind {
		r.ignored, r.ignoring = r.badAt, true
		r.corrupt, r.badPos = nil, false
		return 0
	}
	target := r.head
	if r.badPos {
		target = r.badAt
	}
	from := r.cursor
	if r.corrupt != nil && !r.badPos && int64(r.corrupt.Pos-from) > 0 {
		from = r.corrupt.Pos // the records before it are good (Begin went back)
	}
	skipped := min(target-from, uint64(len(r.data)))
	r.counts.CorruptBytes += skipped
	r.corrupt, r.badPos, r.badAt, r.behind = nil, false, 0, false
	r.cursor, r.head, r.counted = target, target, target
	if target != r.tail {
		r.store(target)
	}
	return skipped
}

// Left counts the samples and lost samples in the ring from oldest, where the reader's
// undelivered records start, up to data_head: what Close leaves unread. It parses without
// moving the cursor or counting; a corrupt record ends the count. A perf ring holds no
// discarded records: discarded is 0.
func (r *Perf) Left(oldest uint64) (samples, lost, discarded uint64) {
	tail, cursor, head, counted, counts, corrupt, badPos := r.tail, r.cursor, r.head, r.counted, r.counts, r.corrupt, r.badPos
	if t := r.loadTail(); int64(t-oldest) > 0 {
		oldest = t // a RawBuffer over the ring read further
	}
	r.tail, r.cursor, r.head, r.counted, r.corrupt, r.badPos = oldest, oldest, oldest, oldest, nil, false
	if r.snapshot() {
		var rec Record
		for ok, _ := r.Next(&rec); ok; ok, _ = r.Next(&rec) {
			if rec.Type == Sample {
				samples++
			} else {
				lost += rec.Lost
			}
		}
	}
	r.tail, r.cursor, r.head, r.counted, r.counts, r.corrupt, r.badPos = tail, cursor, head, counted, counts, corrupt, badPos
	return samples, lost, 0
}
