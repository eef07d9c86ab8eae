// SPDX-License-Identifier: Apache-2.0

// Package perfbuf reads what BPF programs emit, perf event arrays
// (BPF_MAP_TYPE_PERF_EVENT_ARRAY, a ring per CPU) and BPF ring buffers
// (BPF_MAP_TYPE_RINGBUF), behind one API, reading the rings' memory in pure
// Go. Four ways to read:
//
//   - [NewReader]: a [Reader] over every ring, with blocking reads
//     ([Reader.ReadBatch], [Reader.Each], [Reader.ReadInto], [Reader.All]),
//     deadlines, [Reader.Flush] and [Reader.Close]; the fullest ring first,
//     or in the order of a key ([Order]).
//   - [New]: callback mode under libbpf's names: [PerfBuffer.Poll] hands
//     each sample to a function, as perf_buffer__poll does.
//   - [NewRaw]: a [RawBuffer] per ring, for consumers of their own:
//     zero-copy records, peeking without committing, the fill level.
//   - [NewRecorder]: a flight recorder over rings that the kernel
//     overwrites (backward perf rings, ring buffers in overwrite mode):
//     nothing is read until [Recorder.Snapshot] copies the newest records.
//
// Every sample the programs output is accounted for in [Stats]: delivered,
// lost, left at Close, or failed before reaching a ring (with a
// [Options].FailureMap; docs/failures.md).
//
// Errors are wrapped with context and match with errors.Is: the sentinels
// below, os.ErrInvalid for an argument out of range, os.ErrClosed after
// Close, os.ErrDeadlineExceeded; an errno from libbpf or the kernel stays a
// syscall.Errno.
package perfbuf

import (
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/perfbuf/perfbuf/internal/policy"
	"github.com/perfbuf/perfbuf/internal/wait"
)

// PerfBuffer reads every ring of a map in callback mode, under libbpf's
// names (perf_buffer__poll is [PerfBuffer.Poll], and so on): each sample
// goes to a function, with the CPU it came from.
//
// Its methods may be called from any goroutine: drains are serialised, and
// a Poll waiting holds no lock. Close may be called from any goroutine,
// also from a callback. A call from inside a callback that would wait for
// a drain fails with [ErrReentrant].
type PerfBuffer struct {
	c  *core
	cb *policy.Callback

	drainMu sync.Mutex // serialises drains and ring additions

	// The contexts of errors, naming what is read: "poll ring buffer
	// \"events\"" (made once: a call formats nothing unless it fails).
	opPoll, opConsume string

	// cut: a drain stopped before its last ring (a callback panicked), so
	// rings that epoll reported ready may still hold samples, and their
	// readiness is spent: the next Poll drains every ring without waiting.
	cut atomic.Bool

	// drainF (pb.drainTurn, made once) drains ring drainI inside
	// wait.Drains (see drainRing), giving drainK and drainErr.
	drainF   func()
	drainI   int
	drainK   int
	drainErr error
}

// New opens the rings of m, as [NewReader] does, for callback mode: sample
// receives each sample and lost, if not nil, each count of samples a full
// perf ring dropped, with the CPU they came from (-1 for a ring shared by
// CPUs). data aliases ring memory and is valid only during the call.
//
// Errors: as NewReader's, and os.ErrInvalid for a nil sample.
func New(m Map, sample func(cpu int, data []byte), lost func(cpu int, count uint64), opts Options) (*PerfBuffer, error) {
	const op = "new PerfBuffer"
	if err := opts.check(); err != nil {
		return nil, wrap(op, err)
	}
	if sample == nil {
		return nil, fmt.Errorf("%s: nil sample function: %w", op, os.ErrInvalid)
	}
	c, err := openCore(m, opts.ring(), opts.Maps, opts.FailureMap)
	if err != nil {
		return nil, wrap(op, err)
	}
	return newPerfBuffer(c, sample, lost), nil
}

// newPerfBuffer is New over a core already open (tests pass cores over
// rings of their own).
func newPerfBuffer(c *core, sample func(int, []byte), lost func(int, uint64)) *PerfBuffer {
	pb := &PerfBuffer{c: c, opPoll: "poll " + c.name(), opConsume: "consume " + c.name()}
	pb.cb = policy.NewCallback(&c.Set, sample, lost)
	pb.drainF = pb.drainTurn
	c.start(pb.cb, wait.Drains)
	return pb
}

// Close stops the perf buffer: a blocked Poll returns an error matching
// os.ErrClosed, and the rings are freed once no call is in progress. A
// drain in progress stops after the callback it runs. What is still in the
// rings is counted in Stats as Left. Close is idempotent.
func (pb *PerfBuffer) Close() error {
	pb.c.close()
	return nil
}

// Poll waits up to timeout for a wakeup, then drains every ring that holds
// records, and returns how many it delivered (perf_buffer__poll). A
// negative timeout waits until a ring is ready or Close is called; zero
// does not wait. It waits in the Go runtime's netpoller, parking its
// goroutine, not a thread; concurrent Polls wait one after another.
//
// Errors: os.ErrClosed; a *[CorruptError] for a ring that held what the
// kernel never writes, got past and counted once the other records are
// delivered; [ErrReentrant]; a syscall.Errno from epoll.
func (pb *PerfBuffer) Poll(timeout time.Duration) (int, error) {
	op := pb.opPoll
	if err := pb.c.life.Enter(op); err != nil {
		return 0, err
	}
	defer pb.c.life.Exit()

	if pb.cut.Swap(false) {
		return pb.drain(op, -1, false) // see cut
	}
	// From inside a callback, fail before waiting rather than after.
	if err := pb.lockDrain(); err != nil {
		return 0, wrap(op, err)
	}
	// A BPF ring buffer's kernel wakes its reader only for a record
	// committed at the consumer position: one committed while the last
	// drain was still behind it raised no wakeup (ring.settle). Drain it
	// rather than wait for a wakeup that will not come.
	settled := pb.c.settled(nil)
	pb.drainMu.Unlock()
	if !settled {
		return pb.drain(op, -1, false)
	}
	event, err := pb.c.w.Wait(timeout, 0)
	if err != nil {
		return 0, wrap(op, err)
	}
	if pb.c.life.Closed() {
		return 0, wrap(op, os.ErrClosed)
	}
	if pb.c.w.Woken() {
		pb.c.w.ClearWake() // a CPU came online (poke): drain sees to it
	}
	if !event {
		return 0, nil
	}
	return pb.drain(op, -1, true)
}

// Consume drains every ring without waiting and returns the number of
// records delivered (perf_buffer__consume). Errors: as Poll's, but for the
// wait's.
func (pb *PerfBuffer) Consume() (int, error) {
	op := pb.opConsume
	if err := pb.c.life.Enter(op); err != nil {
		return 0, err
	}
	defer pb.c.life.Exit()
	return pb.drain(op, -1, false)
}

// ConsumeBuffer drains ring i without waiting and returns the number of
// records delivered (perf_buffer__consume_buffer). Errors: as Consume's,
// and os.ErrInvalid for an index out of range.
func (pb *PerfBuffer) ConsumeBuffer(i int) (int, error) {
	op := fmt.Sprintf("consume ring %d of %s", i, pb.c.name())
	if err := pb.c.checkIndex(i); err != nil {
		return 0, wrap(op, err)
	}
	if err := pb.c.life.Enter(op); err != nil {
		return 0, err
	}
	defer pb.c.life.Exit()
	return pb.drain(op, i, false)
}

// BufferCount returns the number of rings (perf_buffer__buffer_cnt): one
// per CPU at New, then one more for each CPU that came online since (a
// drain opens its ring). It opens nothing, and stays valid after Close.
func (pb *PerfBuffer) BufferCount() int { return pb.c.count() }

// BufferFD returns ring i's perf event descriptor (perf_buffer__buffer_fd),
// or for a ring buffer its map's. It is the PerfBuffer's: do not close it.
func (pb *PerfBuffer) BufferFD(i int) (int, error) { return pb.c.bufferFD(i) }

// EpollFD returns an epoll descriptor over every ring
// (perf_buffer__epoll_fd), for a caller that waits in its own loop and then
// calls Consume. It is the PerfBuffer's: do not close it.
func (pb *PerfBuffer) EpollFD() (int, error) { return pb.c.epollFD() }

// Stats returns each ring's counts, in buffer index order. It may be
// called from any goroutine, also after Close.
func (pb *PerfBuffer) Stats() []Stats { return pb.c.statsNow() }

// FollowsCPUs reports whether samples of CPUs that come online later are
// read (see [Reader.FollowsCPUs]).
func (pb *PerfBuffer) FollowsCPUs() bool { return pb.c.followsCPUs() }

// Pause stops the output into every ring until [PerfBuffer.Resume], as
// [Reader.Pause] does; Poll and Consume still deliver what is in the
// rings.
func (pb *PerfBuffer) Pause() error { return pb.c.setPaused("pause "+pb.c.name(), true) }

// Resume undoes Pause, as [Reader.Resume] does.
func (pb *PerfBuffer) Resume() error { return pb.c.setPaused("resume "+pb.c.name(), false) }

// Wakeups counts the blocked waits that a ring's wakeup ended (see
// [Reader.Wakeups]).
func (pb *PerfBuffer) Wakeups() uint64 { return pb.c.w.Wakeups() }

// drain delivers the records of ring one, or of every ring (-1) (after a
// wait, those with something in them: a wait does not say which ring woke
// it, see internal/wait), and returns the number of
// records delivered and the first ring's corruption. It opens the rings of
// CPUs that came online first, and reports a failure to after the drain.
// Drains are serialised; the caller holds a call reference (enter).
func (pb *PerfBuffer) drain(op string, one int, nonEmpty bool) (int, error) {
	if err := pb.lockDrain(); err != nil {
		return 0, wrap(op, err)
	}
	defer pb.drainMu.Unlock()
	firstErr := wrap(op, pb.c.addNewCPUs())
	from, to := 0, len(pb.c.Rings)
	if one >= 0 {
		from, to = one, one+1
	}
	done := false
	defer func() {
		if !done {
			pb.cut.Store(true) // a panic: see cut
		}
	}()
	n := 0
	for i := from; i < to; i++ {
		if pb.c.Stop.Load() {
			break // Close was called from a callback
		}
		if nonEmpty && pb.c.Rings[i].Cur().Used() == 0 {
			continue
		}
		k, err := pb.drainRing(i)
		n += k
		if err != nil && firstErr == nil {
			firstErr = wrap(op, err)
		}
	}
	done = true
	return n, firstErr
}

// drainRing drains ring i inside wait.Drains: a call that its sample or
// lost function makes fails with ErrReentrant rather than wait for the drain.
func (pb *PerfBuffer) drainRing(i int) (int, error) {
	pb.drainI = i
	wait.Drains.Run(pb.drainF)
	return pb.drainK, pb.drainErr
}

func (pb *PerfBuffer) drainTurn() { pb.drainK, pb.drainErr = pb.cb.Drain(pb.drainI) }

// lockDrain takes drainMu, unless it would wait from inside a callback:
// then it fails with ErrReentrant (see internal/wait).
func (pb *PerfBuffer) lockDrain() error {
	if pb.drainMu.TryLock() {
		return nil
	}
	if wait.Drains.Inside() {
		return ErrReentrant
	}
	pb.drainMu.Lock()
	return nil
}
