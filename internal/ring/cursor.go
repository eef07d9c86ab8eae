// SPDX-License-Identifier: Apache-2.0

package ring

// The cursor both ring kinds read with: positions, counts, the pending
// corruption, and commit. A kind (perf.go, ringbuf.go) embeds a Cursor and
// adds its loads and stores, its parse at a position and its wake rule.

import (
	"fmt"
	"os"
)

// Cursor is one ring's reading state, the same for both kinds. Positions are
// free-running byte counts, like the kernel's: Tail (what was handed back to
// the kernel), Pos (the next record to parse) and Head (the producer's
// position at the last snapshot), Tail <= Pos <= Head <= Tail+Size in ring
// order. Only the kind's methods move them; every reader of the ring (a
// policy, RawBuffer) reads them here.
//
// One goroutine uses a Cursor at a time, but for Positions and Used, which
// load the memory's positions afresh and may run anywhere.
type Cursor struct {
	index int    // the owner's buffer index, for Record.Ring and errors
	cpu   int    // the CPU whose ring it is, or -1 for a ring shared by CPUs
	size  uint64 // the data area's size, a power of two
	name  string // "perf ring cpu 1", "BPF ring buffer": for errors
	mem   memory // the kind's loads and store of the positions

	tail   uint64 // the consumer position as last loaded (Begin) or stored (commit)
	cursor uint64 // the next record to parse
	head   uint64 // the producer's position at the last snapshot

	// counted is the position up to which records were counted, so that
	// records read again after a Begin are not counted twice.
	counted uint64

	corrupt *CorruptError // sticky until SkipCorrupt
	// badPos: corrupt is about the positions, not a record at the cursor;
	// it stops parsing everywhere.
	badPos bool
	// ignored is a producer position that SkipCorrupt passed over (it
	// cannot be resynchronised with): snapshots see nothing new while the
	// memory keeps that value.
	ignored  uint64
	ignoring bool

	counts Counts
}

// memory is what a kind gives the cursor of its positions in memory.
type memory interface {
	// positions loads the consumer position and the producer's (acquire),
	// afresh.
	positions() (consumer, producer uint64)
	// waiting is positions with the consumer position past what the
	// reader delivered: a ring buffer's consumer_pos held back
	// (RingBuf.HoldBack) shows as the reader's tail. Positions and Used
	// report it.
	waiting() (consumer, producer uint64)
	// storeConsumer publishes the consumer position pos (release), the space
	// before it going back to the kernel, if the memory still holds from (the
	// tail), and reports whether it did. A ring buffer's consumer_pos that
	// someone else wrote since is left alone; a perf ring's data_tail is the
	// reader's own, always stored.
	storeConsumer(from, pos uint64) bool
}

// init sets the cursor up over mem at the consumer position tail.
func (c *Cursor) init(cpu int, size uint64, name string, mem memory, tail uint64) {
	c.cpu, c.size, c.name, c.mem = cpu, size, name, mem
	c.tail, c.cursor, c.head, c.counted = tail, tail, tail, tail
}

// SetIndex gives the ring its owner's buffer index (Record.Ring,
// CorruptError.Ring), also to an error pending since the ring was made
// (positions that cannot be valid at opening).
func (c *Cursor) SetIndex(i int) {
	c.index = i
	if c.corrupt != nil {
		c.corrupt.Ring = i
	}
}

// Index is the ring's buffer index.
func (c *Cursor) Index() int { return c.index }

// CPU is the CPU whose ring it is, or -1 for a ring shared by CPUs.
func (c *Cursor) CPU() int { return c.cpu }

// Size is the data area's size in bytes.
func (c *Cursor) Size() int { return int(c.size) }

// Name names the ring in errors: "perf ring cpu 1", "BPF ring buffer".
func (c *Cursor) Name() string { return c.name }

// Counts is what the ring parsed, each record counted once, the first time
// it is parsed.
func (c *Cursor) Counts() *Counts { return &c.counts }

// Pos is the next record to parse; Head the producer's position at the
// last snapshot; Tail the consumer position last committed.
func (c *Cursor) Pos() uint64  { return c.cursor }
func (c *Cursor) Head() uint64 { return c.head }
func (c *Cursor) Tail() uint64 { return c.tail }

// Pending is the bytes between the cursor and the snapshot.
func (c *Cursor) Pending() int { return int(c.head - c.cursor) }

// Failed reports a pending *CorruptError: the ring must be read to report
// and skip it.
func (c *Cursor) Failed() bool { return c.corrupt != nil }

// IsCorrupt reports whether err is the ring's pending *CorruptError (and
// not an error of a policy's function that happens to be one).
func (c *Cursor) IsCorrupt(err error) bool { return c.corrupt != nil && err == error(c.corrupt) }

// Positions loads the consumer position and the producer's, as the memory
// holds them, but for a ring buffer's consumer_pos held back, which shows
// as the reader's tail (RingBuf.HoldBack).
func (c *Cursor) Positions() (consumer, producer uint64) { return c.mem.waiting() }

// LoadHead loads the producer's position: a Flush's mark.
func (c *Cursor) LoadHead() uint64 {
	_, p := c.mem.positions()
	return p
}

// Used is the fill: the bytes between the consumer and producer positions,
// loaded afresh, clamped to [0, Size]. Any goroutine may call it.
func (c *Cursor) Used() int {
	t, h := c.mem.waiting()
	d := h - t
	if int64(d) < 0 {
		return 0
	}
	return int(min(d, c.size))
}

// blocked reports whether the pending error, if any, stops parsing at the
// cursor: a position error everywhere, a corrupt record once the cursor
// reaches it (after Begin the cursor can be behind it: the records before
// it are read again).
func (c *Cursor) blocked() bool {
	return c.corrupt != nil && (c.badPos || int64(c.cursor-c.corrupt.Pos) >= 0)
}

// fail records a corrupt record at pos, sticky until SkipCorrupt.
func (c *Cursor) fail(pos, size uint64, reason string) {
	c.corrupt = &CorruptError{Ring: c.index, CPU: c.cpu, Pos: pos, Size: size, Reason: reason}
	c.badPos = false
}

// failPos records a position error, unless an error is pending: Pos is the
// consumer position, Size the producer's.
func (c *Cursor) failPos(consumer, producer uint64, reason string) {
	if c.corrupt == nil {
		c.corrupt = &CorruptError{Ring: c.index, CPU: c.cpu, Pos: consumer, Size: producer, Reason: reason}
		c.badPos = true
	}
}

// Commit hands the bytes before pos back to the kernel. pos must be a
// record boundary (a Record's Pos or Next) between the tail and the cursor;
// otherwise Commit writes nothing and returns an error matching
// os.ErrInvalid. Committing the tail is a no-op. A consumer position that
// someone else wrote since the tail is left as it is (see store).
func (c *Cursor) Commit(pos uint64) error {
	if pos == c.tail {
		return nil
	}
	var reason string
	switch d := pos - c.tail; {
	case int64(d) < 0:
		reason = fmt.Sprintf("backwards from tail %d", c.tail)
	case d > c.cursor-c.tail:
		reason = fmt.Sprintf("past the cursor %d", c.cursor)
	case pos&7 != 0:
		reason = "not 8-aligned"
	default:
		c.store(pos)
		return nil
	}
	return fmt.Errorf("commit %s to %d: %s: %w", c.name, pos, reason, os.ErrInvalid)
}

// CommitCursor commits everything parsed.
func (c *Cursor) CommitCursor() {
	if c.cursor != c.tail {
		c.store(c.cursor)
	}
}

// store publishes pos as the consumer position. One that someone else wrote
// since the tail (a second consumer of a ring buffer) is left as it is and
// becomes a position error, for parsing to return: committing over it would
// make the reader deliver again what that consumer took.
func (c *Cursor) store(pos uint64) {
	if !c.mem.storeConsumer(c.tail, pos) {
		c.otherWriter(c.mem.positions())
		return
	}
	c.tail = pos
}

// otherWriter records a position error for a consumer position in memory
// that is not the tail: only the reader stores it, so another consumer, or
// a stray write, changed it.
func (c *Cursor) otherWriter(consumer, producer uint64) {
	c.failPos(consumer, producer, fmt.Sprintf("consumer position changed from %d to %d by another writer", c.tail, consumer))
}

// moved reports whether producer position p differs from the snapshot, a
// value SkipCorrupt passed over aside.
func (c *Cursor) moved(p uint64) bool {
	return p != c.head && !(c.ignoring && p == c.ignored)
}
