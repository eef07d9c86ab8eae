// SPDX-License-Identifier: Apache-2.0

package ring

// A BPF ring buffer's consumer side: what the reader stores as consumer_pos, and when (the
// commit's compare-and-swap, the record held back within a budget, the adoption of a
// previous reader's position), and the wake rule that decides whether the reader may sleep
// (Settle). The memory and its loads are ringbuf.go's.

import "sync/atomic"

// storeConsumer publishes consumer_pos = pos if it still holds what this reader stored last
// (from, the reader's tail, or own while a record is held back): a compare-and-swap, so that
// a commit never writes over a position another consumer stored. With HoldBack, a commit of
// new records up to the head snapshot stores the start of the last one instead (held).
// Go's atomics are sequentially consistent: it releases our reads of the records before pos to
// the kernel's smp_load_acquire of consumer_pos in __bpf_ringbuf_reserve (which then reuses
// their space), and it is the full barrier that Settle's wake rule needs against the kernel's
// xchg + smp_load_acquire in bpf_ringbuf_commit (libbpf: smp_store_release(r->consumer_pos) in
// ringbuf_process_ring).
func (r *RingBuf) storeConsumer(from, pos uint64) bool {
	expect, store := r.published(), pos
	if r.HoldBack && pos != from && pos == r.head {
		store = r.lastRecord(from, pos)
	}
	if !atomic.CompareAndSwapUint64(r.consumer, expect, store) {
		return false
	}
	r.own, r.held = store, store != pos
	r.showHeld(pos)
	if pos != from {
		r.fresh = false
	}
	return true
}

// published is the consumer_pos this reader expects in the map: the tail, or the position it
// stored while a record is held back (HoldBack).
func (r *RingBuf) published() uint64 {
	if r.held {
		return r.own
	}
	return r.tail
}

// lastRecord returns the start of the last record in [from, pos), both record boundaries
// that the reader parsed up to (pos <= cursor), so that the headers between are ones it
// checked: what a commit held back stores.
func (r *RingBuf) lastRecord(from, pos uint64) uint64 {
	last := from
	for p := from; p != pos; {
		_, _, size := r.at(p)
		if size == 0 || size > pos-p {
			break // (not met: the records were parsed; a bound for the walk)
		}
		last, p = p, p+size
	}
	return last
}

// Held reports whether consumer_pos is held back behind the tail (HoldBack): the kernel
// wakes nobody for the next records, so the reader must look again on its own.
func (r *RingBuf) Held() bool { return r.held }

// Release stores the tail as consumer_pos if a record is held back, so that the next
// record committed at the tail wakes the reader: before the ring goes to another reader
// (Settle's store does the same before a wait that relies on the wakeup). It is a commit of
// nothing new, which storeConsumer never holds back: a consumer_pos that someone else wrote
// is left as it is and becomes a position error, as for any commit.
func (r *RingBuf) Release() {
	if r.held {
		r.store(r.tail)
	}
}

// showHeld publishes tail for waiting while a record is held back, nothing otherwise.
func (r *RingBuf) showHeld(tail uint64) {
	if r.held {
		r.shown.Store(tail | 1)
	} else if r.shown.Load() != 0 {
		r.shown.Store(0)
	}
}

// waiting is positions with consumer_pos past a record held back: the reader's tail, as
// showHeld published it. A load between the reader's store of consumer_pos and of shown
// sees the record held back as waiting, or the old tail, behind consumer_pos: the later of
// the two positions is taken.
func (r *RingBuf) waiting() (consumer, producer uint64) {
	c, p := r.positions()
	if s := r.shown.Load(); s != 0 {
		if t := s &^ 1; int64(t-c) > 0 && int64(p-t) >= 0 {
			c = t
		}
	}
	return c, p
}

// resync makes pos the reader's tail and consumer_pos, whoever wrote consumer_pos last:
// SkipCorrupt's way back in step. Release, as storeConsumer's.
func (r *RingBuf) resync(pos uint64) {
	r.tail, r.own, r.fresh, r.held = pos, pos, false, false
	r.showHeld(pos)
	atomic.StoreUint64(r.consumer, pos)
}

// checkConsumer loads consumer_pos and records a position error if it is not the one this
// reader stored (the tail, or what it held back: published): once
// the reader moved it or parsed a record, only this reader stores consumer_pos, so another
// consumer, or a stray write, changed it. Before that (fresh), the reader adopts it.
func (r *RingBuf) checkConsumer() uint64 {
	c := atomic.LoadUint64(r.consumer) // ours; pairs with store
	if c != r.published() {
		if r.adopt(c) {
			return c
		}
		r.otherWriter(c, r.loadProducer())
	}
	return c
}

// mayAdopt reports whether c is a consumer_pos another reader can have left beside a
// producer_pos the kernel can have written: both aligned, c ahead of the tail (a reader
// commits forward), and within the ring behind producer_pos. Anything else is reported, as
// from a reader that read.
func (r *RingBuf) mayAdopt(c uint64) bool {
	p := r.loadProducer()
	return (c|p)&7 == 0 && int64(c-r.tail) > 0 && int64(p-c) >= 0 && p-c <= r.mask
}

// adopt makes c, the consumer_pos another reader left, this fresh reader's position, if it
// has parsed nothing (fresh, cursor at the tail, no error pending) and c may be adopted:
// it starts there as it would have had it opened then. It reports whether it did. What
// SkipCorrupt checks a producer_pos against moves with it.
func (r *RingBuf) adopt(c uint64) bool {
	if !r.fresh || r.cursor != r.tail || r.corrupt != nil || !r.mayAdopt(c) {
		return false
	}
	r.tail, r.cursor, r.counted, r.own = c, c, c, c
	if int64(c-r.head) > 0 { // (a producer_pos behind the head snapshot stays an error)
		r.head = c
	}
	if int64(c-r.seen) > 0 {
		r.seen = c
	}
	return true
}

// Settle is called before the reader sleeps: it reports whether the reader may sleep until
// the ring's descriptor wakes it, that is whether the kernel will wake it for the next record
// it can read. The kernel wakes a ring buffer's reader only from bpf_ringbuf_commit, and only
// when consumer_pos, loaded after the commit's xchg of the header, equals the committed
// record's position (or with BPF_RB_FORCE_WAKEUP; BPF_RB_NO_WAKEUP wakes no one).
//
// Settle stores consumer_pos (= tail) again, then loads producer_pos and the header at the
// cursor again, and returns true only when all of these hold:
//   - no error is pending;
//   - tail == cursor: every record parsed is committed. Otherwise the kernel wakes no one for
//     the records that come next (their positions are not consumer_pos), so the reader must
//     commit first (or poll);
//   - producer_pos equals the head snapshot: nothing reserved since;
//   - the cursor is at the head, or at a record still busy: the next record the reader can
//     read is not committed yet, and it starts at consumer_pos.
//
// Why a commit cannot be missed: the store of consumer_pos and the kernel's xchg of the
// header are both full barriers, each followed by a load of the other's word (Dekker's
// pattern). So either the commit's load sees consumer_pos equal to the record's position and
// wakes the reader, or Settle's load sees the header without its busy bit (or producer_pos
// moved, for a record reserved after the snapshot) and returns false. Records committed
// behind a busy one are not missed either: the busy one's commit will wake the reader.
// With false, the caller parses again (Begin or Refresh) before it thinks of sleeping.
func (r *RingBuf) Settle() bool {
	if r.corrupt != nil || r.tail != r.cursor {
		return false
	}
	if c := atomic.LoadUint64(r.consumer); c != r.published() && r.adopt(c) { // ours; pairs with store
		return false // a fresh reader's start (see checkConsumer): read from there first
	}
	// The full barrier before the second look (see above). It stores the tail over a
	// record held back (HoldBack; storeConsumer expects what was stored): the kernel
	// wakes the reader for the next record only at the tail.
	r.store(r.tail)
	if r.corrupt != nil {
		return false // consumer_pos written by someone else (see store)
	}
	if r.SettleHook != nil {
		r.SettleHook()
	}
	if r.moved(r.loadProducer()) {
		return false
	}
	return r.cursor == r.head || r.loadHeader(r.cursor)&bpfRingBusyBit != 0
}
