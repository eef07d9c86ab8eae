// SPDX-License-Identifier: Apache-2.0

// Package ring reads the two kinds of ring a BPF program writes, in place and
// in pure Go: a CPU's perf ring of a perf event array (perf.go) and a BPF ring
// buffer (ringbuf.go). Both read with one shared Cursor (cursor.go); a kind
// adds its loads and stores, its parse at a position and its wake rule.
//
// A kind owns its memory and its positions, a pure parse of the record at a
// position, and commit. It does not know who waits, who is closed, or which
// record a policy wants next. Nothing read from the memory is trusted: a
// record or position that cannot be valid is a *CorruptError, pending
// (sticky) until SkipCorrupt.
package ring

import "sync/atomic"

// Ring is what the policies (fullest first, the ordered merge, callbacks)
// and a raw view ask of a ring of either kind. One goroutine uses a ring at
// a time; the producer is the kernel.
type Ring interface {
	// Cur is the ring's positions, counts, pending corruption and
	// commit.
	Cur() *Cursor
	// Begin moves the cursor back to the consumer position as the memory
	// holds it and takes a snapshot of the producer's; Refresh takes a
	// snapshot and keeps the cursor. Both, and a commit, which leaves it
	// alone, make a ring buffer's consumer position that someone else
	// wrote a position error.
	Begin()
	Refresh()
	// Quiet reports nothing to parse and nothing new since the snapshot,
	// at the cost of one load (a ring buffer's two): the ordered merge's
	// look at an idle ring.
	Quiet() bool
	// Stalled reports that the record at the cursor cannot be read yet
	// although the snapshot holds it: a ring buffer's record reserved and
	// not yet submitted, which may last. The ring is then as good as
	// empty: a policy passes it over, and a Flush has nothing more to
	// deliver from it.
	Stalled() bool
	// Next parses the record at the cursor into rec and moves the cursor
	// past it: false, nil at the end of what may be read now; false and
	// the *CorruptError at a record that cannot be valid.
	Next(rec *Record) (bool, error)
	// Each is the kind's fast loop: Next and fn for each record from the
	// cursor, while records start within limit bytes of where it began,
	// until fn's error (returned, the record counted as delivered), a
	// corrupt record (its error), the end of what may be read now, or
	// after the record during which stop became true. With a sink, the
	// records go to the sink, and to fn only those it does not take, and
	// the loop also stops once the sink is full (Sink.Full); a sink with
	// KeyEnd makes it an ordered run, which stops before any record it
	// does not deliver. It returns how
	// many records it delivered and how far the cursor moved. It does not
	// commit.
	Each(rec *Record, limit uint64, stop *atomic.Bool, fn func(*Record) error, s *Sink) (k int, used uint64, err error)
	// Peek parses the record at pos, a record boundary between the cursor
	// and the snapshot, without moving the cursor or counting it.
	Peek(pos uint64, rec *Record) bool
	// SkipCorrupt gets past a pending *CorruptError, counted, and returns
	// the bytes skipped.
	SkipCorrupt() uint64
	// Reached reports whether a reader whose oldest record not delivered
	// starts at oldest has delivered everything below to, a snapshot of
	// the producer's position taken before (a Flush's), or the ring is
	// stalled. A ring with an error pending, or whose positions in memory
	// cannot be valid, has not: the error is left pending for the read to
	// meet and report.
	Reached(oldest, to uint64) bool
}

// Waker is what the wait asks of a ring: how to tell that it moved, and
// whether the kernel will wake a reader that sleeps on it now.
type Waker interface {
	// Progress is what the wait compares to tell that the ring moved since
	// it last looked: the producer's position, and for a ring buffer
	// whether the record at the consumer position is busy (its commit,
	// which wakes a settled reader, moves no position). Any goroutine may
	// call it.
	Progress() uint64
	// Settle is called before the reader sleeps on the ring, and reports
	// whether it may: whether the kernel will wake it for what comes
	// next, given what the reader keeps in the ring.
	Settle() bool
}

// Kind is a ring of either kind as its owner holds it: read by a policy,
// waited on, and counted at Close.
type Kind interface {
	Ring
	Waker
	// Left counts the samples, the samples lost records report, and the
	// records the programs discarded not counted yet, from oldest (or the
	// consumer position, if someone read further) to the producer's: what
	// Close leaves. It moves nothing.
	Left(oldest uint64) (samples, lost, discarded uint64)
	// View returns a new reader of the ring's memory, with positions of
	// its own (a raw view beside the owner's reader). It holds no mapping:
	// it is invalid once the ring is closed.
	View() (Ring, error)
}

var (
	_ Kind = (*Perf)(nil)
	_ Kind = (*RingBuf)(nil)
)
