// SPDX-License-Identifier: Apache-2.0

package snapshot

// A BPF ring buffer in overwrite mode (map flag BPF_F_RB_OVERWRITE, 1<<19, kernel 6.19:
// commit feeaf1346f80 "bpf: Add overwrite mode for BPF ring buffer"). When a reservation
// does not fit, the kernel moves overwrite_pos past the oldest records, record by record,
// until it does, instead of failing; consumer_pos no longer holds the producers back.
// The records a reader can trust run from the later of consumer_pos and overwrite_pos up
// to producer_pos.

import (
	"fmt"
	"sync/atomic"
	"unsafe"
)

// The producer page of a BPF ring buffer: struct bpf_ringbuf in kernel/bpf/ringbuf.c
// (6.19 and 7.x, unchanged through 7.3) has
//
//	unsigned long producer_pos __aligned(PAGE_SIZE);
//	unsigned long pending_pos;
//	unsigned long overwrite_pos;	/* after the last overwritten record */
//	char data[] __aligned(PAGE_SIZE);
//
// pending_pos came in 6.10 (the oldest record not yet committed); overwrite_pos was put
// after it when the overwrite mode was merged, so that pending_pos kept its offset. These
// offsets are not uapi: the 7.3 guest's selftest (selftest/overwrite) checks
// OverwritePosOffset against bpf_ringbuf_query(BPF_RB_OVERWRITE_POS). Offsets in bytes
// on a 64-bit kernel.
const (
	ProducerPosOffset  = 0
	PendingPosOffset   = 8
	OverwritePosOffset = 16
)

// The record header's bits (include/uapi/linux/bpf.h) and its size.
const (
	busyBit    = 1 << 31 // BPF_RINGBUF_BUSY_BIT
	discardBit = 1 << 30 // BPF_RINGBUF_DISCARD_BIT
	lenMask    = discardBit - 1
	bpfHdrSize = 8 // BPF_RINGBUF_HDR_SZ: u32 len, u32 pg_off
)

// What the walk found at a position (Record.kind).
const (
	kindRecord  = iota // committed
	kindBusy           // reserved, not committed
	kindDiscard        // discarded
)

// maxPosReload is how many times BPF loads producer_pos again when overwrite_pos is past it.
const maxPosReload = 8

// BPFRing is a BPF ring buffer's memory.
type BPFRing struct {
	Consumer  *uint64 // consumer_pos: the consumer page's first word
	Producer  *uint64 // producer_pos: the producer page's first word
	Overwrite *uint64 // overwrite_pos: the producer page's word at OverwritePosOffset
	Data      []byte  // the data area (its first mapping: max_entries bytes)
}

// BPFRingAt returns the BPFRing of a ring buffer mapped by the kernel: consumerPage and
// producerPage point at its consumer and producer pages, data at its data area. The
// pointers must stay mapped while the BPFRing is used.
func BPFRingAt(consumerPage, producerPage unsafe.Pointer, data []byte) BPFRing {
	return BPFRing{
		Consumer:  (*uint64)(consumerPage),
		Producer:  (*uint64)(unsafe.Add(producerPage, ProducerPosOffset)),
		Overwrite: (*uint64)(unsafe.Add(producerPage, OverwritePosOffset)),
		Data:      data,
	}
}

// BPFOptions are a ring buffer snapshot's options.
type BPFOptions struct {
	// From leaves out the records before position From: a previous snapshot's End
	// returns only the records written since. 0: every record in the ring.
	From uint64
	// Settle, if set, runs between the copy and the check, and must return only once
	// every producer that was writing when it was called has finished: internal/kernel's
	// WaitWriters (an RCU grace period). It is what makes the check hold on weakly
	// ordered hosts (arm64): see BPF. An error from it ends the snapshot.
	Settle func() error
}

// BPF copies the committed records of a BPF ring buffer in overwrite mode into buf, from
// the later of consumer_pos, overwrite_pos and o.From up to producer_pos, and returns
// them, oldest first, appended to recs[:0] (which it reuses, also for the records it
// skips). The newest records are kept when buf cannot hold them all (the older ones are
// counted in NoRoom); when the newest alone does not fit, the error is a
// *ShortBufferError. Records still being written are skipped (Busy), and so are
// discarded ones (Discarded). The walk stops at a header that cannot be valid (a size
// past producer_pos, busy and discarded at once: Counts.Corrupt).
//
// Producers may go on writing. The records are copied with atomic loads; then
// overwrite_pos is loaded again, and every record before it is dropped (Overwritten):
// the kernel moves overwrite_pos past a record before a new reservation reuses any of its
// bytes, so a record at or after the new overwrite_pos was not touched. Since the kernel
// moves it record by record, the new overwrite_pos is also a record boundary that the
// walk, if its headers were not overwritten under it, passed through; if it did not, the
// walk read an overwritten header and everything it found is dropped.
//
// Why the check holds: the kernel stores overwrite_pos (WRITE_ONCE) before the
// smp_store_release of producer_pos that publishes the reservation, under the ring's
// lock, and the program writes the record's bytes after the reservation returns. On x86
// (TSO) stores become visible in program order, so a copy that saw a reused byte was
// followed, in our load order (atomic loads are not reordered with later loads), by a
// load of overwrite_pos that sees the new value. On arm64 the store-release orders what
// precedes it, not the program's later stores, so a reused byte can be visible before
// overwrite_pos is: o.Settle closes that gap. It waits for an RCU grace period, which
// every BPF program that was running when it started (and so every write the copy saw)
// has left: its stores, overwrite_pos's included, are then visible to the load after it.
// (Sleepable programs run under RCU tasks trace, which that grace period does not wait
// for: a ring buffer that they write needs Settle to wait for those too.)
func BPF(r BPFRing, buf []byte, recs []Record, o BPFOptions) (Snapshot, error) {
	if err := checkData(r.Data); err != nil {
		return Snapshot{}, err
	}
	size := uint64(len(r.Data))
	mask := size - 1
	s := Snapshot{Records: recs[:0]}
	// Acquire: pairs with the smp_store_release of producer_pos in __bpf_ringbuf_reserve,
	// so the headers below it are written (busy or not) and overwrite_pos is at least the
	// value that reservation stored before it.
	prod := atomic.LoadUint64(r.Producer)
	over := atomic.LoadUint64(r.Overwrite)
	cons := atomic.LoadUint64(r.Consumer)
	start := cons
	for _, p := range []uint64{over, o.From} {
		if after(p, start) {
			start = p
		}
	}
	// overwrite_pos, loaded after producer_pos, may come from a later reservation than
	// producer_pos did, and be past it: load producer_pos again, a few times.
	for i := 0; after(start, prod); i++ {
		if i == maxPosReload {
			s.End, s.Lapped = prod, true
			return s, nil
		}
		prod = atomic.LoadUint64(r.Producer)
	}
	s.End = prod
	if start&7 != 0 || prod&7 != 0 || prod-start > size {
		s.Corrupt = true // positions the kernel cannot hold
		return s, nil
	}

	// The walk: every record's position and kind, in order.
	pos := start
	for pos != prod {
		// Acquire: pairs with the xchg of hdr->len in bpf_ringbuf_commit (a full
		// barrier after the program's writes), so a committed record's bytes are
		// written. Kernel byte order: a native 32-bit load.
		hdr := atomic.LoadUint32((*uint32)(unsafe.Pointer(&r.Data[pos&mask])))
		n := uint64(hdr & lenMask)
		rsize := (n + bpfHdrSize + 7) &^ 7
		if rsize > prod-pos || hdr&busyBit != 0 && hdr&discardBit != 0 {
			s.Corrupt = true
			break
		}
		var kind uint8 = kindRecord
		switch {
		case hdr&busyBit != 0:
			kind = kindBusy
		case hdr&discardBit != 0:
			kind = kindDiscard
		}
		s.Records = append(s.Records, Record{Pos: pos, size: uint32(n), kind: kind})
		pos += rsize
	}
	walkEnd := pos
	list := s.Records

	// The newest records that fit.
	first, used := len(list), 0
	for i := len(list) - 1; i >= 0; i-- {
		if list[i].kind != kindRecord {
			continue
		}
		n := int(list[i].size)
		if used+n > len(buf) {
			if used == 0 {
				for _, rec := range list {
					switch rec.kind {
					case kindBusy:
						s.Busy++
					case kindDiscard:
						s.Discarded++
					default:
						s.NoRoom++
					}
				}
				s.Records = list[:0]
				return s, &ShortBufferError{Need: n, Have: len(buf)}
			}
			break
		}
		used += n
		first = i
	}
	off := 0
	for i := first; i < len(list); i++ {
		rec := &list[i]
		if rec.kind != kindRecord {
			continue
		}
		dst := buf[off : off+int(rec.size) : off+int(rec.size)]
		copyWords(dst, r.Data, (rec.Pos+bpfHdrSize)&mask, len(dst))
		rec.Data = dst
		off += len(dst)
	}

	// The check.
	if o.Settle != nil {
		if err := o.Settle(); err != nil {
			s.Records = list[:0]
			return s, fmt.Errorf("settle ring buffer writers: %w", err)
		}
	}
	// Loaded after the copy's atomic loads (and after Settle): pairs with the WRITE_ONCE
	// of overwrite_pos in __bpf_ringbuf_reserve that precedes any reuse of the bytes below
	// it.
	over2 := atomic.LoadUint64(r.Overwrite)
	cut := 0
	for cut < len(list) && after(over2, list[cut].Pos) {
		cut++
	}
	switch {
	case !after(over2, start):
		// Nothing walked was overwritten.
	case after(over2, walkEnd):
		cut, s.Corrupt = len(list), false // a bad header there was a new record's bytes
	case over2 == walkEnd:
		cut = len(list)
	case cut == len(list) || list[cut].Pos != over2:
		// The walk left the records' chain: it read an overwritten header, and what
		// it found from there on (a bad header included) is a new record's bytes.
		cut, s.Corrupt = len(list), false
	}
	out := list[:0]
	for i, rec := range list {
		switch {
		case i < cut:
			if rec.kind == kindRecord {
				s.Overwritten++
			}
		case rec.kind == kindBusy:
			s.Busy++
		case rec.kind == kindDiscard:
			s.Discarded++
		case i < first:
			s.NoRoom++
		default:
			out = append(out, rec)
		}
	}
	s.Records = out
	return s, nil
}
