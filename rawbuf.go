package perfbuf

// This file reads one CPU's perf ring buffer directly, without cgo: the memory that libbpf's
// perf_buffer__buffer() returns, a struct perf_event_mmap_page header page followed by a
// power-of-two data area. It parses records in place and commits data_tail once per drain.

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"os"
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"
)

// RecordType classifies a perf ring record.
type RecordType uint8

const (
	// RecordSample is a PERF_RECORD_SAMPLE: the output of bpf_perf_event_output.
	RecordSample RecordType = iota + 1
	// RecordLost is a PERF_RECORD_LOST: the kernel dropped samples because the ring was full.
	RecordLost
	// RecordOther is any other record type. It is counted and skipped.
	RecordOther
)

// String returns the record type's name.
func (t RecordType) String() string {
	switch t {
	case RecordSample:
		return "sample"
	case RecordLost:
		return "lost"
	case RecordOther:
		return "other"
	}
	return fmt.Sprintf("RecordType(%d)", uint8(t))
}

// Record is one record of a perf ring, parsed in place.
type Record struct {
	Type    RecordType
	RawType uint32 // perf_event_header.type
	CPU     int    // the CPU whose ring holds the record
	Pos     uint64 // ring position where the record starts
	Next    uint64 // ring position just after the record

	// Data and Wrapped hold a sample's payload, zero-copy. Data is the first part; Wrapped is
	// the part that continues at the start of the ring when the payload straddles the ring's
	// end, and is empty otherwise. Both are nil for records that are not samples.
	//
	// Both alias ring memory: they are valid until data_tail is committed past Next (by
	// Commit, Drain or SkipCorrupt; a Reader commits after the function it called returns);
	// after that the kernel may overwrite them. Copy what must outlive that, for example with
	// AppendTo.
	//
	// The kernel pads the payload so that the record stays 8-byte aligned: an n-byte
	// bpf_perf_event_output yields round_up(n+4, 8)-4 bytes, the last ones unspecified. The
	// payload must therefore carry its own length (or be of a fixed size).
	Data, Wrapped []byte

	Lost uint64 // number of samples lost, for RecordLost

	// Key and Late are set by a Reader with ReaderOptions.Order: the key the sample was
	// ordered by, and whether it was delivered after a sample with a larger key.
	Key  uint64
	Late bool
}

// Len returns the payload length, len(Data)+len(Wrapped).
func (r *Record) Len() int {
	return len(r.Data) + len(r.Wrapped)
}

// AppendTo appends the payload to dst as one contiguous slice and returns the result. Pass
// buf[:0] to reuse a buffer: it does not allocate when cap(buf) >= r.Len().
func (r *Record) AppendTo(dst []byte) []byte {
	dst = append(dst, r.Data...)
	if len(r.Wrapped) > 0 {
		dst = append(dst, r.Wrapped...)
	}
	return dst
}

// CorruptError describes a perf ring record, or ring position, that cannot be valid.
type CorruptError struct {
	CPU    int    // the ring's CPU
	Pos    uint64 // ring position of the bad record (the cursor)
	Size   uint64 // the record's header size, or for a bad head the head snapshot
	Reason string // what is wrong
}

// Error formats the error as "read perf ring cpu 1 at 4096: record size 0: corrupt perf ring record".
func (e *CorruptError) Error() string {
	return fmt.Sprintf("read perf ring cpu %d at %d: %s: %v", e.CPU, e.Pos, e.Reason, ErrCorrupt)
}

// Unwrap returns ErrCorrupt.
func (e *CorruptError) Unwrap() error { return ErrCorrupt }

// Sizes of the records' fixed parts (include/uapi/linux/perf_event.h).
const (
	recHeaderSize    = 8                     // struct perf_event_header { u32 type; u16 misc; u16 size; }
	recSampleMinSize = recHeaderSize + 8     // header, u32 size, padded to 8
	recSampleDataOff = recHeaderSize + 4     // the raw payload follows the u32 size
	recLostSize      = recHeaderSize + 8 + 8 // header, u64 id, u64 lost
)

// RawBuffer reads one CPU's perf ring in place (raw mode: see PerfBuffer.Buffer).
//
// Concurrency: one goroutine reads a RawBuffer (all its methods, Stats included); the producer
// is the kernel, which writes records and data_head while the reader reads and writes
// data_tail. RawBuffer holds no lock and never blocks.
//
// Reading works with a cursor and a head snapshot. Begin takes both (cursor = data_tail,
// snapshot = data_head); Next parses records from the cursor up to the snapshot and never
// beyond it, so a fast producer cannot keep a reader busy forever; Commit publishes data_tail,
// handing the space back to the kernel. Drain does all three, committing once.
//
// The ring is memory that the kernel (or, in tests, anyone) writes, so nothing read from it is
// trusted: a record that cannot be valid gives a *CorruptError, never a panic or an access
// outside the ring. After a CorruptError, Next keeps returning it until SkipCorrupt is called.
type RawBuffer struct {
	cpu  int
	page *unix.PerfEventMmapPage
	data []byte // the data area; len is a power of two
	// base is &data[0], where plainRoom and take start from: loads through it need no
	// bounds checks beyond plainAt's (docs/performance.md has the measurements).
	base unsafe.Pointer
	mask uint64 // len(data)-1

	// Positions, free-running like the kernel's. Invariant (in ring order, wrap-safe):
	// tail <= cursor <= head <= tail+len(data); snapshot and SkipCorrupt keep it, and parsing
	// relies on it to stay inside data. Only this file touches them.
	tail   uint64 // last committed data_tail
	cursor uint64 // next record to parse
	head   uint64 // head snapshot

	// counted is the position up to which records were counted in stats, so that records
	// read again after Begin are not counted twice.
	counted uint64

	corrupt *CorruptError // sticky until SkipCorrupt
	badHead bool          // corrupt came from the latest head snapshot
	badPos  uint64        // the invalid head snapshot
	behind  bool          // it was behind the tail: SkipCorrupt resyncs the tail to it
	// ignored is an invalid data_head that SkipCorrupt passed over: snapshots see no new
	// records while data_head keeps that value, and go on once the kernel writes it again.
	ignored  uint64
	ignoring bool

	stats Stats

	rec Record // Drain's record, kept here so that Drain does not allocate

	// closed, if set, is the owning PerfBuffer's or Reader's lifetime: each stops after the
	// record during which it was closed, so that no callback runs after Close.
	closed *lifetime

	// skipOther: parse skips records of other types (counted in Other) instead of returning
	// them; set for callback mode's and the readers' rings, which deliver samples and lost
	// counts only.
	skipOther bool

	// An ordered Reader's run (see ordered.run): while keyed, each reads every sample's key,
	// the u64 at keyOff in Data, into Record.Key and delivers the sample only while the key
	// lies in [keyLo, keyHi], raising keyLo to it. Any other record ends the run: it is
	// parsed into the Record and the cursor moves past it, but it is not delivered (errHeld).
	keyed        bool
	keyOff       uint64
	keyLo, keyHi uint64

	onRelease func() // hands the ring back to its PerfBuffer; nil once released
	released  bool   // Release was called: the ring is gone
	size      int    // the ring's size, for Size after Release
}

// errHeld ends each at a record that an ordered run may not deliver (see RawBuffer.keyed).
// It never leaves the package.
var errHeld = errors.New("record held")

// newRawBuffer builds a reader over a mapped perf ring. base points at the
// perf_event_mmap_page and dataSize is the size of the data area (what perf_buffer__buffer
// reports). The data area starts at base+Data_offset, or one page after base on kernels that
// leave Data_offset 0. The mapping must outlive the RawBuffer and every Record it returned.
//
// Errors wrap os.ErrInvalid.
func newRawBuffer(cpu int, base unsafe.Pointer, dataSize int) (*RawBuffer, error) {
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
	return newRawBufferFromParts(cpu, page, data)
}

// newRawBufferFromParts builds a reader over a header page and a data area given separately;
// tests use it with Go memory. len(data) must be a power of two, at least 8.
func newRawBufferFromParts(cpu int, page *unix.PerfEventMmapPage, data []byte) (*RawBuffer, error) {
	if page == nil {
		return nil, fmt.Errorf("new perf ring cpu %d: nil header page: %w", cpu, os.ErrInvalid)
	}
	if err := checkRingSize(cpu, len(data)); err != nil {
		return nil, err
	}
	b := &RawBuffer{
		cpu:   cpu,
		page:  page,
		data:  data[:len(data):len(data)],
		base:  unsafe.Pointer(unsafe.SliceData(data)),
		mask:  uint64(len(data) - 1),
		stats: Stats{CPU: cpu},
	}
	b.tail = b.loadTail()
	b.cursor, b.head, b.counted = b.tail, b.tail, b.tail
	return b, nil
}

func checkRingSize(cpu, n int) error {
	if n < 8 || n&(n-1) != 0 {
		return fmt.Errorf("new perf ring cpu %d: data size %d is not a power of two >= 8: %w", cpu, n, os.ErrInvalid)
	}
	return nil
}

// CPU returns the CPU whose ring this is.
func (b *RawBuffer) CPU() int { return b.cpu }

// Size returns the size of the data area in bytes.
func (b *RawBuffer) Size() int {
	if b.released {
		return b.size
	}
	return len(b.data)
}

// loadHead loads data_head. The load is atomic (acquire): it pairs with the kernel's
// smp_store_release of data_head in perf_output_put_handle, so the record bytes below the
// returned head are visible once it returns (libbpf: smp_load_acquire in ring_buffer_read_head).
func (b *RawBuffer) loadHead() uint64 {
	return atomic.LoadUint64(&b.page.Data_head)
}

// loadTail loads data_tail, the position up to which the reader has released the ring.
func (b *RawBuffer) loadTail() uint64 {
	// Pairs with our own StoreUint64 in commit; the kernel only reads data_tail.
	return atomic.LoadUint64(&b.page.Data_tail)
}

// Used returns the ring's fill level: the bytes between data_tail and data_head, clamped to
// [0, Size()]. It loads both afresh and does not move the cursor.
func (b *RawBuffer) Used() int {
	tail := b.loadTail()
	d := b.loadHead() - tail
	if int64(d) < 0 {
		return 0
	}
	if d > uint64(len(b.data)) {
		return len(b.data)
	}
	return int(d)
}

// Begin starts a read: the cursor goes back to data_tail and the head snapshot is taken
// afresh. Records read but not committed are read again. An invalid head (behind the tail,
// moved backwards, unaligned, or more than Size() past the tail) makes the next Next return a
// CorruptError.
func (b *RawBuffer) Begin() {
	b.tail = b.loadTail()
	b.cursor = b.tail
	if !b.snapshot() {
		b.head = b.cursor // nothing to read past a bad head
	}
}

// Refresh takes a new head snapshot and keeps the cursor, so that Next goes on with the
// records written since Begin.
func (b *RawBuffer) Refresh() {
	b.snapshot()
}

// snapshot loads data_head into b.head if it is valid; otherwise it records a CorruptError
// (unless one is pending) and leaves b.head alone.
func (b *RawBuffer) snapshot() bool {
	h := b.loadHead()
	var reason string
	switch {
	case b.ignoring && h == b.ignored && b.corrupt == nil:
		return false // passed over already (SkipCorrupt): nothing new
	case int64(h-b.tail) < 0:
		reason = fmt.Sprintf("head %d behind tail %d", h, b.tail)
	case int64(h-b.head) < 0:
		reason = fmt.Sprintf("head moved backwards from %d to %d", b.head, h)
	case h-b.tail > uint64(len(b.data)):
		reason = fmt.Sprintf("head %d more than the %d-byte ring past tail %d", h, len(b.data), b.tail)
	case h&7 != 0:
		reason = fmt.Sprintf("head %d not 8-aligned", h)
	default:
		b.head = h
		b.badHead, b.ignoring = false, false // the head is sane again
		b.stats.MaxFill = max(b.stats.MaxFill, int(h-b.tail))
		return true
	}
	if b.corrupt == nil {
		b.corrupt = &CorruptError{CPU: b.cpu, Pos: b.cursor, Size: h, Reason: reason}
		b.badHead, b.badPos, b.behind = true, h, int64(h-b.tail) < 0
	}
	return false
}

// quiet reports that the cursor is at the head snapshot, no error is pending and data_head
// has not moved since the snapshot: nothing to parse, and nothing for Refresh to do. It is
// the cheap test that an ordered Reader makes of a quiet ring, once per record for every
// ring without one.
func (b *RawBuffer) quiet() bool {
	// Acquire; pairs with the kernel's smp_store_release of data_head (see loadHead). A head
	// that moved, or an invalid one, is left to Refresh.
	return b.cursor == b.head && b.corrupt == nil && atomic.LoadUint64(&b.page.Data_head) == b.head
}

// pending returns the bytes between the cursor and the head snapshot.
func (b *RawBuffer) pending() int { return int(b.head - b.cursor) }

// Next parses the record at the cursor into rec and moves the cursor past it. It returns
// false, nil when the cursor reached the head snapshot (call Refresh or Begin for more), and
// false with a *CorruptError when the record cannot be valid; then the cursor stays put and
// Next keeps returning that error until SkipCorrupt. rec is left alone when Next returns false.
//
// A sample's Data and Wrapped alias ring memory until the tail is committed past rec.Next.
// After Release, Next returns false with an error matching os.ErrClosed.
func (b *RawBuffer) Next(rec *Record) (bool, error) {
	if b.parse(rec) {
		return true, nil
	}
	return false, b.stopErr()
}

// stopErr is why parsing stopped: the pending CorruptError once the cursor reached it, the
// release, or nil at the end of the head snapshot.
func (b *RawBuffer) stopErr() error {
	switch {
	case b.blocked():
		return b.corrupt
	case b.released:
		return b.errReleased("read")
	}
	return nil
}

// errReleased is the error of a read on a released RawBuffer.
func (b *RawBuffer) errReleased(verb string) error {
	return fmt.Errorf("%s perf ring cpu %d: released: %w", verb, b.cpu, os.ErrClosed)
}

// blocked reports whether the pending error, if any, stops parsing at the cursor: an invalid
// head stops it everywhere, a corrupt record once the cursor reaches it. (After Begin the
// cursor can be behind a corrupt record: the records before it are read again.)
func (b *RawBuffer) blocked() bool {
	return b.corrupt != nil && (b.badHead || int64(b.cursor-b.corrupt.Pos) >= 0)
}

// parse is Next without the error: false means the end of the snapshot or a pending error
// (blocked). The common record, a plain sample (plainAt), is taken as each takes it;
// everything else goes through parseAny, which checks every case.
func (b *RawBuffer) parse(rec *Record) bool {
	p, room := b.plainRoom()
	if size, n := plainAt(p, room); size != 0 {
		rec.CPU = b.cpu
		b.take(rec, p, size, n)
		return true
	}
	return b.parseRest(rec)
}

// parseRest is parse past the plain samples: any record parseAny takes, and,
// with skipOther, past the records of other types.
func (b *RawBuffer) parseRest(rec *Record) bool {
	for b.head != b.cursor && (b.corrupt == nil || !b.blocked()) && b.parseAny(rec) {
		if rec.Type != RecordOther || !b.skipOther {
			return true
		}
	}
	return false
}

// each is the loop that delivers records: Drain, callback mode and both Reader policies run
// it. It parses records from the cursor up to the head snapshot and calls fn with each, the
// cursor already past it, while they start within limit bytes of where it began. It returns
// how many records fn received, and stops
//   - at the end of the snapshot, or past limit: nil;
//   - when fn returns an error: that error;
//   - at a corrupt record: the *CorruptError (the cursor stays on it);
//   - after the record during which the owner was closed (b.closed): nil;
//   - in an ordered run (b.keyed), at a record the run may not deliver: errHeld, with the
//     record parsed into rec and the cursor past it.
//
// It does not commit. Plain samples (plainAt) are taken in line, loaded through the ring's
// base pointer, with no call per record but fn's; every other record goes through parseRest.
func (b *RawBuffer) each(rec *Record, limit uint64, fn func(*Record) error) (int, error) {
	from := b.cursor
	closed, keyed := b.closed, b.keyed
	rec.CPU = b.cpu
	k := 0
	for {
		if b.cursor-from >= limit {
			return k, nil
		}
		p, room := b.plainRoom()
		pos := b.cursor
		end := pos + room                         // the records must end by here
		stop := pos + min(room, limit-(pos-from)) // and start before here
		for int64(stop-pos) > 0 {
			size, n := plainAt(p, end-pos)
			if size == 0 {
				break
			}
			pos, p = b.take(rec, p, size, n)
			if keyed && !b.inRun(rec) {
				return k, errHeld
			}
			k++
			if err := fn(rec); err != nil {
				return k, err
			}
			if closed != nil && closed.closed() {
				return k, nil
			}
		}
		if room > 0 && int64(stop-pos) <= 0 {
			continue // the limit, or the ring's end: the piece after it is plain again
		}
		if !b.parseRest(rec) {
			return k, b.stopErr()
		}
		if keyed {
			return k, errHeld // a lost record or a wrapped sample: the ordered reader's to place
		}
		k++
		if err := fn(rec); err != nil {
			return k, err
		}
		if closed != nil && closed.closed() {
			return k, nil
		}
	}
}

// inRun reads a plain sample's key for an ordered run (see RawBuffer.keyed) and reports
// whether the run may deliver it.
func (b *RawBuffer) inRun(rec *Record) bool {
	if n := uint64(len(rec.Data)); n < 8 || b.keyOff > n-8 {
		return false
	}
	key := binary.NativeEndian.Uint64(rec.Data[b.keyOff:])
	rec.Key, rec.Late = key, false
	if key < b.keyLo || key > b.keyHi {
		return false
	}
	b.keyLo = key
	return true
}

// plainRoom returns where the record at the cursor starts and how many bytes follow from
// there in one piece, up to the head snapshot or the ring's end, whichever comes first; or
// nil, 0 when the record is none of plainAt's: re-read after Begin (counted already), an
// error pending, or a cursor off the 8-byte alignment, which parseAny reports.
func (b *RawBuffer) plainRoom() (unsafe.Pointer, uint64) {
	pos := b.cursor
	if b.counted != pos || b.corrupt != nil || pos&7 != 0 {
		return nil, 0
	}
	off := pos & b.mask
	return unsafe.Add(b.base, off), min(b.head-pos, uint64(len(b.data))-off)
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
func (b *RawBuffer) take(rec *Record, p unsafe.Pointer, size, n uint64) (uint64, unsafe.Pointer) {
	pos := b.cursor
	next := pos + size
	rec.Type, rec.RawType, rec.Pos, rec.Next, rec.Lost = RecordSample, unix.PERF_RECORD_SAMPLE, pos, next, 0
	rec.Data, rec.Wrapped = unsafe.Slice((*byte)(unsafe.Add(p, recSampleDataOff)), n), nil
	b.stats.Samples++
	b.stats.Bytes += n
	b.counted, b.cursor = next, next
	// From the base: a pointer past the ring's end is not valid Go.
	return next, unsafe.Add(b.base, next&b.mask)
}

// parseAt parses the record at pos, a record boundary between the cursor and the head
// snapshot, into rec without moving the cursor and without counting it: a look ahead. It
// returns false at the end of the snapshot, and for a record that cannot be valid, which
// Next reports once the cursor gets there.
func (b *RawBuffer) parseAt(pos uint64, rec *Record) bool {
	if int64(pos-b.cursor) < 0 || int64(b.head-pos) < 0 {
		return false // not between the cursor and the head: nothing to trust there
	}
	cursor, counted, stats, corrupt, badHead := b.cursor, b.counted, b.stats, b.corrupt, b.badHead
	b.cursor, b.counted = pos, pos
	ok := b.parse(rec)
	b.cursor, b.counted, b.stats, b.corrupt, b.badHead = cursor, counted, stats, corrupt, badHead
	return ok
}

// parseAny parses any record at the cursor, checking everything; parse has checked that
// there is a record (avail > 0) and no error pending at the cursor.
func (b *RawBuffer) parseAny(rec *Record) bool {
	pos := b.cursor
	avail := b.head - pos
	if pos&7 != 0 {
		return b.fail(pos, 0, "cursor not 8-aligned")
	}
	data := b.data
	// The header never straddles the end: pos is 8-aligned and len(data) a multiple of 8.
	// The kernel writes records in its own byte order, as plainAt reads them.
	off := pos & b.mask
	hdr := data[off : off+recHeaderSize]
	typ := binary.NativeEndian.Uint32(hdr[0:4])
	size := uint64(binary.NativeEndian.Uint16(hdr[6:8]))
	// size-1 >= avail catches size 0 and size > avail in one compare.
	if size&7 != 0 || size-1 >= avail {
		return b.badSize(pos, size, avail)
	}
	next := pos + size
	count := int64(pos-b.counted) >= 0

	switch typ {
	case unix.PERF_RECORD_SAMPLE:
		if size < recSampleMinSize {
			return b.fail(pos, size, fmt.Sprintf("sample record size %d too short for its size field", size))
		}
		// The u32 size is 8-aligned, so it never straddles, but it wraps to the ring's start
		// when the header ends the ring.
		o := (pos + recHeaderSize) & b.mask
		n := uint64(binary.NativeEndian.Uint32(data[o : o+4]))
		if n > size-recSampleDataOff {
			return b.badSample(pos, size, n)
		}
		start := (pos + recSampleDataOff) & b.mask
		end := start + n
		if end <= uint64(len(data)) {
			rec.Data, rec.Wrapped = data[start:end:end], nil
		} else {
			rec.Data, rec.Wrapped = data[start:], data[:end-uint64(len(data)):end-uint64(len(data))]
		}
		rec.Type, rec.Lost = RecordSample, 0
		if count {
			b.stats.Samples++
			b.stats.Bytes += n
		}
	case unix.PERF_RECORD_LOST:
		if size < recLostSize {
			return b.fail(pos, size, fmt.Sprintf("lost record size %d shorter than %d", size, recLostSize))
		}
		// u64 lost at offset 16: 8-aligned, never straddles.
		o := (pos + 16) & b.mask
		lost := binary.NativeEndian.Uint64(data[o : o+8])
		rec.Type, rec.Lost, rec.Data, rec.Wrapped = RecordLost, lost, nil, nil
		if count {
			b.stats.Lost += lost
		}
	default:
		rec.Type, rec.Lost, rec.Data, rec.Wrapped = RecordOther, 0, nil, nil
		if count {
			b.stats.Other++
		}
	}
	rec.RawType, rec.CPU, rec.Pos, rec.Next, rec.Key, rec.Late = typ, b.cpu, pos, next, 0, false
	if count {
		b.counted = next
	}
	b.cursor = next
	return true
}

// badSize explains a header size that failed parseAny's combined check.
func (b *RawBuffer) badSize(pos, size, avail uint64) bool {
	var reason string
	switch {
	case size == 0:
		reason = "record size 0"
	case size&7 != 0:
		reason = fmt.Sprintf("record size %d not a multiple of 8", size)
	case size > uint64(len(b.data)):
		reason = fmt.Sprintf("record size %d larger than the %d-byte ring", size, len(b.data))
	default:
		reason = fmt.Sprintf("record size %d past the head (%d bytes pending)", size, avail)
	}
	return b.fail(pos, size, reason)
}

// badSample explains a sample whose u32 size does not fit its header size.
func (b *RawBuffer) badSample(pos, size, n uint64) bool {
	reason := fmt.Sprintf("sample size %d does not fit record size %d", n, size)
	if n+recSampleDataOff > 0xffff {
		// perf_event_header.size is a u16: a bigger sample wraps it (cilium/ebpf#1633).
		reason += " (sample over 64 KiB overflowed the u16 header size)"
	}
	return b.fail(pos, size, reason)
}

// fail records a sticky CorruptError and returns false.
func (b *RawBuffer) fail(pos, size uint64, reason string) bool {
	b.corrupt = &CorruptError{CPU: b.cpu, Pos: pos, Size: size, Reason: reason}
	b.badHead = false
	return false
}

// Commit publishes data_tail = pos, handing the bytes before pos back to the kernel. pos
// must be a record boundary (a Record's Pos or Next) between the committed tail and the
// cursor; otherwise Commit writes nothing and returns an error matching os.ErrInvalid.
// Committing the current tail is a no-op. After Release it returns an error matching
// os.ErrClosed.
func (b *RawBuffer) Commit(pos uint64) error {
	if b.released {
		return b.errReleased("commit")
	}
	if pos == b.tail {
		return nil
	}
	var reason string
	switch d := pos - b.tail; {
	case int64(d) < 0:
		reason = fmt.Sprintf("backwards from tail %d", b.tail)
	case d > b.cursor-b.tail:
		reason = fmt.Sprintf("past the cursor %d", b.cursor)
	case pos&7 != 0:
		reason = "not 8-aligned"
	default:
		b.commit(pos)
		return nil
	}
	return fmt.Errorf("commit perf ring cpu %d to %d: %s: %w", b.cpu, pos, reason, os.ErrInvalid)
}

// commit stores data_tail without checks.
func (b *RawBuffer) commit(pos uint64) {
	b.tail = pos
	// Release; pairs with the kernel's READ_ONCE(data_tail) + smp_mb() in perf_output_begin:
	// our reads of the records before pos happen before the kernel reuses their space
	// (libbpf: smp_store_release in ring_buffer_write_tail).
	atomic.StoreUint64(&b.page.Data_tail, pos)
}

// commitCursor commits everything parsed so far.
func (b *RawBuffer) commitCursor() {
	if b.cursor != b.tail {
		b.commit(b.cursor)
	}
}

// Drain reads every record from data_tail up to a fresh head snapshot, calling fn for each
// (samples, lost and other records alike), then commits once, up to the end of the last
// record fn received, and returns how many it received. fn returning an error stops the
// drain: Drain returns that error, and the record fn failed on counts as received. Records
// written after the snapshot wait for the next Drain.
//
// rec and its Data and Wrapped are valid only during the call to fn; fn must copy what it
// keeps, and must not call b's methods other than CPU, Size and Stats.
//
// A record that cannot be valid stops the drain with a *CorruptError; the records before it
// are received and committed. Call SkipCorrupt to go on. A nil fn is an error matching
// os.ErrInvalid; after Release, Drain fails with an error matching os.ErrClosed.
func (b *RawBuffer) Drain(fn func(rec *Record) error) (int, error) {
	if b.released {
		return 0, b.errReleased("drain")
	}
	if fn == nil {
		return 0, fmt.Errorf("drain perf ring cpu %d: nil function: %w", b.cpu, os.ErrInvalid)
	}
	b.Begin()
	rec := &b.rec
	n, err := b.each(rec, math.MaxUint64, fn)
	b.commitCursor()
	*rec = Record{} // drop the references to ring memory
	return n, err
}

// SkipCorrupt is the way on after a CorruptError: it gives up everything up to the head
// snapshot, commits data_tail there, clears the error and returns the number of bytes
// skipped; Stats counts the corruption and the bytes. Records already returned by Next but
// not committed are released too (not counted as skipped), also those that Begin would read
// again before the corrupt one. Without a pending error it discards what is pending,
// counted as skipped.
//
// An invalid head snapshot is the header page's, not the records': SkipCorrupt passes over
// that data_head value, skipping nothing, and reading goes on once the kernel writes
// data_head again (a head too far ahead, unaligned or moved backwards would otherwise make
// the reader skip genuine records). A head behind the tail says the tail moved: the reader
// resynchronises with the head, committing it as the tail.
func (b *RawBuffer) SkipCorrupt() uint64 {
	if b.corrupt != nil {
		b.stats.Corrupt++
	}
	if b.badHead && !b.behind {
		b.ignored, b.ignoring = b.badPos, true
		b.corrupt, b.badHead = nil, false
		return 0
	}
	target := b.head
	if b.badHead {
		target = b.badPos
	}
	from := b.cursor
	if b.corrupt != nil && !b.badHead && int64(b.corrupt.Pos-from) > 0 {
		from = b.corrupt.Pos // the records before it are good (Begin went back)
	}
	skipped := min(target-from, uint64(len(b.data)))
	b.stats.CorruptBytes += skipped
	b.corrupt, b.badHead, b.badPos, b.behind = nil, false, 0, false
	b.cursor, b.head, b.counted = target, target, target
	if target != b.tail {
		b.commit(target)
	}
	return skipped
}

// Stats returns what this RawBuffer parsed: a record is counted once, the first time it is
// parsed, even if Begin makes it read again; MaxFill is the fullest head snapshot. Late,
// Dropped and Discarded stay zero.
func (b *RawBuffer) Stats() Stats { return b.stats }

// Release hands the ring back to its PerfBuffer (see PerfBuffer.Buffer): callback mode drains
// it again, and Close can unmap it. Every Record read from b is invalid afterwards. Next, Drain
// and Commit fail with an error matching os.ErrClosed then; Begin, Refresh, SkipCorrupt and
// Used see an empty ring, and CPU, Size and Stats keep their values. Release is idempotent.
func (b *RawBuffer) Release() {
	hand := b.onRelease // (*b is overwritten below)
	if hand == nil {
		return
	}
	b.onRelease = nil
	// Point at memory of our own so that nothing can touch the mapping once it is freed.
	released, err := newRawBufferFromParts(b.cpu, new(unix.PerfEventMmapPage), make([]byte, 8))
	if err != nil {
		panic(err) // 8 is a valid ring size
	}
	stats, size := b.stats, len(b.data)
	*b = *released
	b.stats, b.released, b.size = stats, true, size
	hand()
}
