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
// Nothing is read but what the RawBuffers read. Its methods may be called
// from any goroutine.
type Raw struct {
	Rings
	r *owner.Raw
}

// NewRaw opens the rings of m, as [NewReader] does, for raw views.
// Errors: as NewReader's.
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
// limit; zero: do not block) or Close is called, and returns dst with the
// buffer index of every ring that holds records appended (none after a
// timeout). Records below WakeupEvents or WakeupBytes raise no wakeup:
// they are found when the timeout passes. Wait opens the rings of CPUs that
// came online since its last call, at new indexes: a caller that waits on
// EpollFD calls Wait(0, nil) to take them in.
//
// Errors: os.ErrClosed, a syscall.Errno from epoll or from opening a ring.
func (r *Raw) Wait(timeout time.Duration, dst []int) ([]int, error) { return r.r.Wait(timeout, dst) }

// RawBuffer reads one ring in place, for consumers of their own (see
// [Raw.Buffer]): a CPU's perf ring or a BPF ring buffer.
//
// One goroutine uses a RawBuffer; it holds no lock and never blocks. It
// reads with a cursor and a snapshot of the producer's position: [RawBuffer.Begin]
// takes both, [RawBuffer.Next] parses up to the snapshot, [RawBuffer.Commit]
// hands the space back to the kernel; [RawBuffer.Drain] does all three.
//
// Nothing read is trusted: a record or position that cannot be valid gives
// a *[CorruptError], returned until [RawBuffer.SkipCorrupt]. A ring buffer's
// kernel wakes a reader only once the committed position reaches the record
// committed: commit before [Raw.Wait], or wait with a timeout.
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
// returns false, nil at the snapshot's end, and false with the pending
// *[CorruptError] at a record that cannot be valid. rec's Data aliases ring
// memory until Commit passes rec.Next.
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

// Commit hands the space before pos back to the kernel. pos must be a record
// boundary (a Record's Pos or Next) between the last commit and the cursor;
// otherwise Commit writes nothing and returns an error matching os.ErrInvalid.
func (b *RawBuffer) Commit(pos uint64) error {
	if b.done {
		return b.errReleased("commit")
	}
	return b.r.Cur().Commit(pos)
}

// Drain calls fn with every record up to a new snapshot, then commits once,
// past the last record fn received, and returns how many it received. fn's
// error stops it and is returned. rec is valid only during the call, and fn
// may call only Stats. A record that cannot be valid ends it
// with a *[CorruptError], the records before it committed.
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

// SkipCorrupt gets past a *[CorruptError]: it gives up what is left up to the
// snapshot, commits there, and returns the bytes skipped.
// A producer position that cannot be valid is passed over, skipping
// nothing, until the kernel writes it again; on a perf ring, one behind the
// consumer position makes the reader go on from it (the tail is what
// moved). On a ring buffer, the reader goes on from a producer position only
// if the kernel can have written it (docs/failures.md).
func (b *RawBuffer) SkipCorrupt() uint64 { return b.r.SkipCorrupt() }

// Stats returns what b parsed, each record counted once, and the ring's
// CPU, Size and Fill (loaded afresh; 0 after Release). It moves nothing.
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
