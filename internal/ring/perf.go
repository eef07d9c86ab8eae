// SPDX-License-Identifier: Apache-2.0

package ring

// The perf ring kind: one CPU's perf ring, read in place. The memory is a
// struct perf_event_mmap_page header page followed by a power-of-two data
// area, as libbpf's perf_buffer__buffer() or perfbuf's own opener
// (internal/kernel) map it. Its loads and stores of data_head and data_tail,
// its wake rule are here, its parse in perf_parse.go; the cursor over them
// is cursor.go's.

import (
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

// waiting is positions: a perf ring's reader holds nothing back.
func (r *Perf) waiting() (consumer, producer uint64) { return r.positions() }

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
