// SPDX-License-Identifier: Apache-2.0

package perfbuf

// The ring kinds' contract: what the owner core (core.go), the policies
// and RawBuffer ask of a ring. Two kinds meet it: the perf ring
// (perfring.go, a CPU's ring of a perf event array) and the BPF ring buffer
// (ringbuf.go, BPF_MAP_TYPE_RINGBUF, one ring for every CPU or for a group).
// Calls go through the interface once per record at most (next), once per
// batch on the fast path (each, whose loop is the kind's own).

import "sync/atomic"

// ring reads one ring in place. One goroutine uses a ring at a time; the
// producer is the kernel.
//
// Positions are the kind's, free-running: tail (what was handed back to
// the kernel), cursor (the next record to parse) and head (the producer's
// position at the last snapshot), tail <= cursor <= head. Nothing read from
// the memory is trusted: a record or position that cannot be valid is a
// *CorruptError, pending (sticky) until skipCorrupt.
type ring interface {
	// setIndex gives the ring its owner's buffer index (Record.Ring,
	// Stats.Ring, CorruptError.Ring).
	setIndex(i int)
	// cpuNum is the CPU whose ring it is, or -1 for a ring shared by CPUs.
	cpuNum() int
	// size is the data area's size in bytes.
	size() int
	// counts is what the ring parsed, each record counted once.
	counts() *Stats

	// loadHead loads the producer's position (acquire): a Flush's mark.
	loadHead() uint64
	// progress is what the waiter compares to tell that the ring moved
	// since it last looked: the producer's position, and for a ring
	// buffer whether the record at the consumer position is busy (its
	// commit, which wakes a settled reader, moves no position). Any
	// goroutine may call it.
	progress() uint64
	// used is the fill: the bytes between the producer's position and the
	// committed tail, loaded afresh. Any goroutine may call it.
	used() int
	// positions loads the committed tail and the producer's position
	// afresh, as the memory holds them.
	positions() (consumer, producer uint64)

	// begin moves the cursor back to the tail as the memory says it and
	// takes a head snapshot; refresh takes one and keeps the cursor.
	begin()
	refresh()
	// quiet reports nothing to parse and nothing new since the snapshot,
	// at the cost of one load (a ring buffer's two: its consumer position
	// too, which nobody else may write): the ordered merge's look at an
	// idle ring.
	quiet() bool
	// pending is the bytes between the cursor and the snapshot; failed
	// reports a pending CorruptError, and isCorrupt whether err is it.
	pending() int
	// stalled reports that the record at the cursor cannot be read yet
	// although the snapshot holds it: a ring buffer's record reserved and
	// not yet submitted (busy), which may last (a preempted or sleeping
	// program). The ring is then as good as empty: a policy passes it
	// over, and a Flush has nothing more to deliver from it. One load of
	// the header, never per record.
	stalled() bool
	failed() bool
	isCorrupt(err error) bool
	cursorPos() uint64
	headPos() uint64
	tailPos() uint64
	// reached reports whether a reader whose oldest record not delivered
	// starts at oldest has delivered everything below to, a head snapshot
	// taken before (a Flush's), or the ring is stalled. A ring with an
	// error pending, or whose positions in memory cannot be valid, has
	// not: the error is left pending (recorded if new), for the read to
	// meet and report.
	reached(oldest, to uint64) bool

	// next parses the record at the cursor into rec and moves the cursor
	// past it: false, nil at the end of what may be read now; false and the
	// *CorruptError at a record that cannot be valid.
	next(rec *Record) (bool, error)
	// each is the kind's fast loop: next and fn for each record from the
	// cursor, while records start within limit bytes of where it began,
	// until fn's error (returned, the record counted as received), a
	// corrupt record (its error), the end of what may be read now, or
	// after the record during which stop became true. It returns how many
	// records fn received and how far the cursor moved, so that a caller
	// needs no other call through the interface per loop. It does not
	// commit.
	each(rec *Record, limit uint64, stop *atomic.Bool, fn func(*Record) error) (k int, used uint64, err error)
	// peek parses the record at pos, a record boundary between the cursor
	// and the snapshot, without moving the cursor or counting it.
	peek(pos uint64, rec *Record) bool

	// commit hands the bytes before pos, a record boundary between the
	// tail and the cursor, back to the kernel (os.ErrInvalid otherwise);
	// commitCursor hands back everything parsed.
	commit(pos uint64) error
	commitCursor()
	// skipCorrupt gets past a pending CorruptError, counted, and returns
	// the bytes skipped.
	skipCorrupt() uint64
	// settle is called before the reader sleeps on the ring, and reports
	// whether it may: whether the kernel will wake it for what comes next,
	// given what the reader keeps in the ring.
	settle() bool
	// left counts the samples, the samples lost records report, and the
	// records the programs discarded not counted yet, from oldest (or the
	// tail, if someone read further) to the producer: what Close leaves.
	// It moves nothing.
	left(oldest uint64) (samples, lost, discarded uint64)
}
