// SPDX-License-Identifier: Apache-2.0

package ring

// The BPF ring buffer kind (BPF_MAP_TYPE_RINGBUF): one ring shared by every CPU (or one CPU's,
// in an array of ring buffers), parsed in place. Its memory, the loads of the positions and
// headers and the reads' start are here; what it stores as consumer_pos and its wake rule in
// ringbuf_consumer.go; its parse in ringbuf_parse.go; the cursor over them is cursor.go's. The protocol is the kernel's (kernel/bpf/ringbuf.c) as libbpf reads it
// (src/ringbuf.c, ringbuf_process_ring).
//
// Memory. The map's mmap has three parts: consumer_pos, alone on a page the reader may write
// (offset 0); producer_pos, alone on a read-only page (offset one page); and the data area,
// max_entries bytes (a power of two, a multiple of the page size), mapped twice back to back
// right after the producer page, so that a record that starts near the end of the area can
// be read as one piece running into the second copy. Positions are free-running byte counts
// (unsigned long: 64 bits on the hosts this file supports); a position's offset in the area
// is pos & (size-1).
//
// Records. Each starts with struct bpf_ringbuf_hdr { u32 len; s32 pg_off; } (8 bytes) and
// takes round_up(len+8, 8) bytes, len being the low 30 bits: the kernel keeps records below
// RINGBUF_MAX_RECORD_SZ (UINT_MAX/4). Bit 31 (BPF_RINGBUF_BUSY_BIT) says the record is
// reserved but not yet committed: the reader stops there, since records are consumed in
// order, and treats the ring as empty meanwhile (Stalled), however long the program holds
// it; its length is checked as any other's (at). Bit 30 (BPF_RINGBUF_DISCARD_BIT) says the program discarded it: skipped and counted.
//
// Invariants (positions in ring order, wrap-safe): tail <= cursor <= head, head - tail < size,
// and all three 8-aligned, while no position error is pending. snapshot establishes them for
// head, Begin and SkipCorrupt for tail, commit keeps them; every read of the data area relies
// on them (a record read at pos < head ends by head, so by pos&mask + size < 2*size). Nothing
// read from the memory is trusted before it is checked against them.

import (
	"fmt"
	"math"
	"os"
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"
)

// The record header's constants (include/uapi/linux/bpf.h).
const (
	bpfRingBusyBit    = 1 << 31                // BPF_RINGBUF_BUSY_BIT
	bpfRingDiscardBit = 1 << 30                // BPF_RINGBUF_DISCARD_BIT
	bpfRingLenMask    = bpfRingDiscardBit - 1  // the length bits
	bpfRingHdrSize    = 8                      // BPF_RINGBUF_HDR_SZ
	bpfRingHdrRound   = bpfRingHdrSize + 8 - 1 // len + this, &^ 7: round_up(len + 8, 8)
)

// RingBuf reads one BPF ring buffer map in place.
//
// Concurrency: one goroutine uses a RingBuf (every method but Used, Positions and Progress,
// which load positions atomically and may run anywhere). The producers are BPF programs on any CPU: they reserve
// space (advancing producer_pos) and commit records (clearing the busy bit) while the reader
// parses and stores consumer_pos. RingBuf holds no lock and never blocks.
//
// Reading works with a cursor and a head snapshot, as for the perf ring: Begin takes both
// (cursor = consumer_pos, head = producer_pos), next and each parse from the cursor up to the
// snapshot and never beyond it, commit stores consumer_pos. A record still busy ends the
// parse like the end of the snapshot does. After a *CorruptError, parsing keeps returning it
// until SkipCorrupt.
type RingBuf struct {
	Cursor
	consumer *uint64 // consumer_pos: ours to write, the kernel reads it
	producer *uint64 // producer_pos: the kernel's, read-only to us
	data     []byte  // the data area mapped twice: len is 2*size, cap too
	mask     uint64  // size-1

	// maps are the two mmaps of NewRingBuf, unmapped by Close; nil for Go memory.
	maps [2][]byte

	// What SkipCorrupt checks a producer_pos against before it stores it: own, the
	// consumer_pos this reader stored last (or found at opening); seen, the last producer_pos
	// taken as valid (own until one was), never behind own; sure, whether one was.
	own, seen uint64
	sure      bool

	// HoldBack: a commit that reaches the head snapshot stores as consumer_pos the start of
	// the last record before it, not its end, so that the kernel wakes nobody for the
	// records after it (their positions are not consumer_pos; see Settle). held says that
	// consumer_pos (own) is so held back, behind the tail: the records from own to the
	// tail were delivered, and Begin reads on from the tail. Release, Settle and
	// SkipCorrupt store the tail. The owner sets HoldBack before reading starts.
	HoldBack bool
	held     bool
	// shown is the tail with bit 0 set while a record is held back, else 0, for waiting's
	// loads from any goroutine (the tail is 8-aligned). Stored after consumer_pos.
	shown atomic.Uint64

	// fresh: the reader has moved consumer_pos never since it opened. While it also has
	// parsed nothing (cursor == tail), consumer_pos is not yet its own: it takes the one it
	// finds (adopt), so that a reader opened while the previous one still read (an agent's
	// upgrade) starts where that one left off. Nothing was delivered from the old position.
	fresh bool

	// SettleHook, if set, runs in Settle between the store of consumer_pos and the second
	// look at the ring: tests put a producer there.
	SettleHook func()
}

// NewRingBufFromParts builds a reader over positions and a data area given separately; tests
// use it with Go memory. data is the area mapped twice, len(data) == 2*size, size a power of
// two >= 8; data's first half must be mirrored in its second as the double mapping does.
// data must be 8-aligned. Errors wrap os.ErrInvalid.
func NewRingBufFromParts(cpu int, consumer *uint64, producer *uint64, data []byte) (*RingBuf, error) {
	if consumer == nil || producer == nil {
		return nil, fmt.Errorf("new BPF ring buffer: nil position: %w", os.ErrInvalid)
	}
	if unsafe.Sizeof(uintptr(0)) != 8 {
		// The kernel's positions are unsigned long: 32 bits there.
		return nil, fmt.Errorf("new BPF ring buffer: %d-bit host not supported: %w", 8*unsafe.Sizeof(uintptr(0)), os.ErrInvalid)
	}
	size := len(data) / 2
	if len(data)%2 != 0 || size < 8 || size&(size-1) != 0 {
		return nil, fmt.Errorf("new BPF ring buffer: data of %d bytes is not twice a power of two >= 8: %w", len(data), os.ErrInvalid)
	}
	// The header loads are atomic 32-bit loads at 8-aligned offsets.
	if uintptr(unsafe.Pointer(unsafe.SliceData(data)))%8 != 0 {
		return nil, fmt.Errorf("new BPF ring buffer: data not 8-aligned: %w", os.ErrInvalid)
	}
	r := &RingBuf{
		consumer: consumer,
		producer: producer,
		data:     data[:len(data):len(data)],
		mask:     uint64(size - 1),
	}
	name := "BPF ring buffer"
	if cpu >= 0 {
		name = fmt.Sprintf("BPF ring buffer cpu %d", cpu)
	}
	r.init(cpu, uint64(size), name, r, 0)
	r.Restart()
	return r, nil
}

// Restart starts the reader afresh at the consumer_pos in the map, as if it were made now:
// for a reader that takes the ring over from another consumer (internal to perfbuf: the
// consumer lock won), whose commits moved consumer_pos since this reader was made. The
// counts are kept; every Record parsed before is invalid. Positions that cannot be valid now
// are the first read's to report: once the kernel wrote past a consumer_pos ahead of
// producer_pos, nothing would tell that the reader starts in the middle of a record.
func (r *RingBuf) Restart() {
	c := atomic.LoadUint64(r.consumer) // pairs with the stores of the reader that committed it
	r.tail, r.cursor, r.head, r.counted = c, c, c, c
	r.corrupt, r.badPos, r.ignoring = nil, false, false
	r.own, r.seen, r.sure, r.fresh, r.held = c, c, false, true, false
	r.shown.Store(0)
	if p := r.loadProducer(); r.checkPos(p) != "" {
		r.failPos(r.tail, p, r.checkPos(p))
	} else {
		r.seen, r.sure = p, true
	}
}

// NewRingBuf maps the BPF ring buffer map mapFD, whose max_entries is size, as libbpf's
// ring_buffer__add does: the consumer page read-write at offset 0, the producer page and the
// data area twice read-only at offset one page. cpu is the CPU whose ring it is, or -1 for a
// ring shared by every CPU (the usual case). close unmaps. Checking that mapFD is a ring
// buffer and reading its size is the caller's.
//
// Errors wrap os.ErrInvalid for a size that is not a power-of-two multiple of the page size,
// and the mmap's errno (unix.Errno) when the kernel refuses.
func NewRingBuf(cpu int, mapFD int, size int) (*RingBuf, error) {
	page := os.Getpagesize()
	if size < page || size&(size-1) != 0 || size > (math.MaxInt-page)/2 {
		return nil, fmt.Errorf("new BPF ring buffer: size %d is not a power-of-two multiple of the %d-byte page: %w", size, page, os.ErrInvalid)
	}
	cons, err := unix.Mmap(mapFD, 0, page, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("new BPF ring buffer: map consumer page of fd %d: %w", mapFD, err)
	}
	prod, err := unix.Mmap(mapFD, int64(page), page+2*size, unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		_ = unix.Munmap(cons)
		return nil, fmt.Errorf("new BPF ring buffer: map producer page and data of fd %d: %w", mapFD, err)
	}
	// consumer_pos and producer_pos are the first words of their pages (struct bpf_ringbuf
	// keeps each page-aligned).
	r, err := NewRingBufFromParts(cpu, (*uint64)(unsafe.Pointer(&cons[0])), (*uint64)(unsafe.Pointer(&prod[0])), prod[page:])
	if err != nil {
		_ = unix.Munmap(prod)
		_ = unix.Munmap(cons)
		return nil, err
	}
	r.maps = [2][]byte{cons, prod}
	return r, nil
}

// Close unmaps the ring mapped by NewRingBuf and points the ring at memory of its own, an
// empty ring, so that a late call reads no freed mapping. No other method may run during
// close; every Record read from the ring is invalid after it. close is idempotent, and does
// nothing for Go memory but the same switch.
func (r *RingBuf) Close() error {
	var err error
	for i := len(r.maps) - 1; i >= 0; i-- {
		if r.maps[i] != nil {
			if e := unix.Munmap(r.maps[i]); e != nil && err == nil {
				err = fmt.Errorf("close BPF ring buffer: unmap: %w", e)
			}
			r.maps[i] = nil
		}
	}
	pos := new([2]uint64) // consumer and producer at 0: empty
	r.consumer, r.producer = &pos[0], &pos[1]
	r.data, r.mask, r.size = make([]byte, 16), 7, 8
	r.tail, r.cursor, r.head, r.counted = 0, 0, 0, 0
	r.own, r.seen, r.sure, r.held = 0, 0, true, false
	r.shown.Store(0)
	r.corrupt, r.badPos, r.ignoring = nil, false, false
	return err
}

// loadProducer loads producer_pos. Acquire: pairs with the kernel's smp_store_release of
// producer_pos in __bpf_ringbuf_reserve, which follows its write of the new record's busy
// header, so the headers below the returned position are written once it returns (libbpf:
// smp_load_acquire(r->producer_pos) in ringbuf_process_ring).
func (r *RingBuf) loadProducer() uint64 { return atomic.LoadUint64(r.producer) }

// loadHeader loads the len word of the record header at pos, which the invariants place in
// the first copy of the data area (pos&mask <= size-8). Acquire: pairs with the kernel's
// xchg of hdr->len in bpf_ringbuf_commit (a full barrier after the program's writes of the
// sample), so a header without the busy bit comes with its sample written (libbpf:
// smp_load_acquire(len_ptr) in ringbuf_process_ring). The kernel writes it in its own byte
// order: a plain 32-bit load reads it so.
func (r *RingBuf) loadHeader(pos uint64) uint32 {
	return atomic.LoadUint32((*uint32)(unsafe.Pointer(&r.data[pos&r.mask])))
}

// Begin starts a read: tail and cursor = consumer_pos loaded afresh (or, with a record
// held back, the tail after it), head = producer_pos. Records read but not committed are
// read again (and not counted again). A consumer_pos
// that someone else wrote, or positions that cannot be valid, make parsing return a
// *CorruptError.
func (r *RingBuf) Begin() {
	c := r.checkConsumer()
	if int64(r.cursor-r.counted) > 0 {
		r.counted = r.cursor // (see counted)
	}
	if r.held && c == r.own {
		c = r.tail // the records held back were delivered
	}
	r.tail, r.cursor = c, c
	if !r.snapshot() {
		r.head = c // nothing to read past bad positions
	}
}

// Refresh takes a new head snapshot and keeps the cursor. A consumer_pos that someone else
// wrote makes parsing return a *CorruptError, as Begin does: a reader that only refreshes
// (the ordered window) must meet it too, or it would parse a record another consumer took, and
// a Flush would wait for a consumer_pos that Reached never sees as its own.
func (r *RingBuf) Refresh() {
	r.checkConsumer()
	r.snapshot()
}

// snapshot loads producer_pos into head if it is valid against tail and the previous head;
// otherwise it records a position error (unless an error is pending) and leaves head alone.
func (r *RingBuf) snapshot() bool {
	p := r.loadProducer()
	if r.ignoring && p == r.ignored && r.corrupt == nil {
		return false // passed over by SkipCorrupt: nothing new
	}
	if reason := r.checkPos(p); reason != "" {
		r.failPos(r.tail, p, reason)
		return false
	}
	r.head, r.ignoring = p, false
	r.seen, r.sure = p, true
	r.counts.MaxFill = max(r.counts.MaxFill, int(p-r.tail))
	return true
}

// checkPos says what is wrong with tail and a producer position p, or "" if they can be the
// kernel's. The kernel's positions are 8-aligned (records are), __bpf_ringbuf_reserve
// keeps producer_pos - consumer_pos <= size-1, and producer_pos never moves back.
func (r *RingBuf) checkPos(p uint64) string {
	t, size := r.tail, r.mask+1
	switch {
	case t&7 != 0:
		return fmt.Sprintf("consumer position %d not 8-aligned", t)
	case p&7 != 0:
		return fmt.Sprintf("producer position %d not 8-aligned", p)
	case int64(p-t) < 0:
		return fmt.Sprintf("consumer position %d past producer position %d", t, p)
	case p-t >= size:
		return fmt.Sprintf("producer position %d a full %d-byte ring or more past consumer position %d", p, size, t)
	case int64(p-r.seen) < 0:
		return fmt.Sprintf("producer position %d moved back from %d", p, r.seen)
	}
	return ""
}

// Quiet reports that the cursor is at the head snapshot, no error is pending, producer_pos
// has not moved since the snapshot and consumer_pos is still the tail: nothing to parse,
// and nothing for Refresh to do. A consumer_pos that someone else wrote is Begin's to
// report, on the read that meets it.
func (r *RingBuf) Quiet() bool {
	return r.cursor == r.head && r.corrupt == nil && !r.moved(r.loadProducer()) &&
		atomic.LoadUint64(r.consumer) == r.published() // ours; pairs with store
}

// Stalled reports that the record at the cursor is reserved and not yet submitted (busy):
// the ring is as good as empty until the program commits it, and the kernel's commit will
// wake the reader once consumer_pos is at it (see Settle).
func (r *RingBuf) Stalled() bool {
	if r.corrupt != nil {
		return false
	}
	kind, _, _ := r.at(r.cursor)
	return kind == atBusy
}

// positions loads consumer_pos (ours; pairs with store) and producer_pos (acquire, see
// loadProducer): the cursor's memory.
func (r *RingBuf) positions() (consumer, producer uint64) {
	return atomic.LoadUint64(r.consumer), r.loadProducer()
}

// Cur returns the ring's cursor.
func (r *RingBuf) Cur() *Cursor { return &r.Cursor }

// Progress is producer_pos, plus one while the record at consumer_pos is busy: the waiter
// sees a change when that record is committed, which moves no position but is what wakes a
// reader stalled at it (see Settle). producer_pos is 8-aligned, so the two cannot be
// confused (an unaligned one is corrupt). Any goroutine may call it: it loads consumer_pos
// (ours; pairs with store), producer_pos (acquire, see loadProducer) and the header at
// consumer_pos (acquire, see loadHeader; in the area whatever consumer_pos holds), and
// reads nothing the reader's goroutine writes but the mapping, which close swaps only once
// no wait runs.
func (r *RingBuf) Progress() uint64 {
	c := atomic.LoadUint64(r.consumer)
	p := r.loadProducer()
	if c != p && c&7 == 0 && r.loadHeader(c)&bpfRingBusyBit != 0 { // (an aligned load only)
		return p + 1
	}
	return p
}

// Reached reports whether a reader whose oldest record not delivered is at oldest has
// delivered everything below to, an earlier head snapshot: oldest is at or past it, to is
// an unaligned producer position that SkipCorrupt passed over, or the ring is stalled at
// oldest (a busy record: nothing more to deliver now). Not with an error pending, nor with
// consumer_pos written by someone else, or producer_pos behind it or behind the head
// snapshot (which quiet and Begin see), unless SkipCorrupt passed over that producer_pos:
// the read must meet those and report them.
func (r *RingBuf) Reached(oldest, to uint64) bool {
	if r.corrupt != nil || !(int64(oldest-to) >= 0 || r.ignoring && to == r.ignored || oldest == r.cursor && r.Stalled()) {
		return false
	}
	// Once per ring and flush (a ring reached is not asked again): the positions as the
	// memory holds them. A producer_pos that SkipCorrupt passed over, still the same, was
	// reported once and holds nothing to deliver until it moves.
	c, p := r.positions()
	if r.ignoring && p == r.ignored {
		return c == r.published()
	}
	return c == r.published() && int64(p-c) >= 0 && int64(p-r.head) >= 0
}

// Left counts the committed samples from oldest (or consumer_pos, if it is further) to
// producer_pos: what Close leaves unread; and the discarded records among them that were not
// counted yet (Stats.Discarded then counts every discarded record that reached the ring). A
// record still busy ends the count (the program has not committed it), as does one that
// cannot be valid. A ring buffer reports no lost records: lost is 0. It moves nothing.
func (r *RingBuf) Left(oldest uint64) (samples, lost, discarded uint64) {
	if c := atomic.LoadUint64(r.consumer); int64(c-oldest) > 0 { // ours; pairs with store
		oldest = c
	}
	p := r.loadProducer()
	if int64(p-oldest) < 0 || p-oldest >= r.size || (p|oldest)&7 != 0 {
		return 0, 0, 0
	}
	// The discarded records before the count's mark were counted when parsed (see counted).
	counted := r.counted
	if int64(r.cursor-counted) > 0 {
		counted = r.cursor
	}
	head := r.head
	r.head = p // at reads up to the head snapshot: the producer's position here
	for pos := oldest; ; {
		kind, _, size := r.at(pos)
		if kind == atEnd || kind == atBusy || kind == atBad {
			break
		}
		if kind == atSample {
			samples++
		} else if int64(pos-counted) >= 0 {
			discarded++
		}
		pos += size
	}
	r.head = head
	return samples, 0, discarded
}

// View returns a new reader of the ring's memory (see Kind).
func (r *RingBuf) View() (Ring, error) {
	v, err := NewRingBufFromParts(r.cpu, r.consumer, r.producer, r.data)
	if err != nil {
		return nil, err
	}
	v.SetIndex(r.index)
	return v, nil
}
