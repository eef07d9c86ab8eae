// SPDX-License-Identifier: Apache-2.0

package perfbuf

// Raw mode: Raw holds a map's rings for consumers of their own, and
// RawBuffer reads one of them in place, a thin shell over the ring kind
// (internal/ring) that holds only the hand-back to its Raw.

import (
	"fmt"
	"math"
	"os"
	"sync/atomic"
	"time"

	"github.com/perfbuf/perfbuf/internal/owner"
	"github.com/perfbuf/perfbuf/internal/ring"
	"golang.org/x/sys/unix"
)

// Raw holds every ring of a map for raw views: [Raw.Buffer] returns a
// [RawBuffer] over one ring, and [Raw.Wait] waits for rings with records.
// Its methods may be called from any goroutine. What a RawBuffer reads is
// counted in the RawBuffer's Stats, not in the Raw's.
type Raw struct {
	Rings
	r *owner.Raw
}

// NewRaw opens the rings of m, as [NewReader] does, for raw views.
func NewRaw(m Map, opts Options) (*Raw, error) {
	const op = "new Raw"
	if err := opts.check(); err != nil {
		return nil, wrap(op, err)
	}
	c, err := owner.Open(m, opts.ring(), ownerMaps(opts.Maps), opts.FailureMap, opts.Programs)
	if err != nil {
		return nil, wrap(op, err)
	}
	return newRaw(c), nil
}

// newRaw is NewRaw over a core already open (tests pass cores over rings of
// their own).
func newRaw(c *owner.Core) *Raw { return &Raw{Rings{c}, owner.NewRaw(c)} }

// Buffer returns a RawBuffer over ring i (perf_buffer__buffer), to read
// until its Release. Errors: os.ErrInvalid for an index out of range,
// [ErrBusy] if a RawBuffer holds ring i already, os.ErrClosed.
func (r *Raw) Buffer(i int) (*RawBuffer, error) {
	rb, release, err := r.r.Buffer(i)
	if err != nil {
		return nil, err
	}
	var b *RawBuffer
	b = newRawBuffer(rb, func() { release(b.final.Lost) }) // (Release sets final first)
	return b, nil
}

// Wait blocks until a ring holds records, timeout passes (negative: no
// limit; zero: no wait) or Close is called, and appends to dst the index
// of every ring that holds records. It opens the rings of CPUs that came
// online since. Errors: os.ErrClosed, a syscall.Errno.
func (r *Raw) Wait(timeout time.Duration, dst []int) ([]int, error) { return r.r.Wait(timeout, dst) }

// RawBuffer reads one ring in place, from one goroutine, without locks:
// [RawBuffer.Begin] takes a snapshot of the producer's position,
// [RawBuffer.Next] parses up to it, [RawBuffer.Commit] hands the space
// back; [RawBuffer.Drain] does all three. A record or position that cannot
// be valid gives a *[CorruptError] until [RawBuffer.SkipCorrupt]. A ring
// buffer wakes its reader only for records after its last commit.
type RawBuffer struct {
	r     ring.Ring
	rec   Record      // Drain's record, kept here so that Drain does not allocate
	hand  func()      // hands the ring back to its PerfBuffer; nil once released
	stop  atomic.Bool // never set: Drain runs until the snapshot's end
	done  bool        // Release was called: the ring is gone
	name  string      // the ring's name in errors after Release
	final Stats       // Stats after Release
}

// newRawBuffer wraps ring r; hand, if not nil, is what Release calls.
func newRawBuffer(r ring.Ring, hand func()) *RawBuffer {
	return &RawBuffer{r: r, hand: hand}
}

// Begin moves the cursor back to the consumer position and takes a new
// snapshot: records read but not committed are read again.
func (b *RawBuffer) Begin() { b.r.Begin() }

// Next parses the record at the cursor into rec and moves past it. It
// returns false at the snapshot's end, or with a *[CorruptError].
func (b *RawBuffer) Next(rec *Record) (bool, error) {
	if b.done {
		return false, b.errReleased("read")
	}
	return b.r.Next(rec)
}

// errReleased is the error of a call on a released RawBuffer.
func (b *RawBuffer) errReleased(verb string) error {
	return fmt.Errorf("%s %s: released: %w", verb, b.name, os.ErrClosed)
}

// Commit hands the space before pos, a record's Pos or Next between the
// last commit and the cursor, back to the kernel (else os.ErrInvalid).
func (b *RawBuffer) Commit(pos uint64) error {
	if b.done {
		return b.errReleased("commit")
	}
	return b.r.Cur().Commit(pos)
}

// Drain calls fn with every record up to a new snapshot, then commits past
// the last one fn received, and returns how many. fn's error, or a
// *[CorruptError], stops it. rec is valid only during the call.
func (b *RawBuffer) Drain(fn func(rec *Record) error) (int, error) {
	if b.done {
		return 0, b.errReleased("drain")
	}
	if fn == nil {
		return 0, fmt.Errorf("drain %s: nil function: %w", b.r.Cur().Name(), os.ErrInvalid)
	}
	b.r.Begin()
	n, _, err := b.r.Each(&b.rec, math.MaxUint64, &b.stop, fn, nil)
	b.r.Cur().CommitCursor()
	b.rec = Record{} // drop the references to ring memory
	return n, err
}

// SkipCorrupt gets past a *[CorruptError]: it gives up what is left up to
// the snapshot, commits there, and returns the bytes skipped (a bad
// producer position: docs/failures.md).
func (b *RawBuffer) SkipCorrupt() uint64 { return b.r.SkipCorrupt() }

// Stats returns what b parsed, and the ring's CPU, Size and Fill.
func (b *RawBuffer) Stats() Stats {
	if b.done {
		return b.final
	}
	c := b.r.Cur()
	n := c.Counts()
	return Stats{CPU: c.CPU(), Samples: n.Samples, Lost: n.Lost, Discarded: n.Discarded, Bytes: n.Bytes,
		Corrupt: n.Corrupt, Size: c.Size(), Fill: c.Used(), MaxFill: n.MaxFill}
}

// Release hands the ring back to its Raw; records read from b are invalid
// afterwards. Next, Drain and Commit then fail with os.ErrClosed; the other
// methods see an empty ring. Release is idempotent.
func (b *RawBuffer) Release() {
	hand := b.hand
	if hand == nil {
		return
	}
	b.hand = nil
	b.name = b.r.Cur().Name()
	// Point at memory of our own so that nothing can touch the mapping once it is freed.
	b.final = b.Stats()
	b.final.Fill = 0
	empty, err := ring.NewPerfFromParts(b.r.Cur().CPU(), new(unix.PerfEventMmapPage), make([]byte, 8))
	if err != nil {
		panic(err) // 8 is a valid ring size
	}
	b.r, b.done = empty, true
	hand()
}
