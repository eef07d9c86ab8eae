// SPDX-License-Identifier: Apache-2.0

// Package perfbuf reads what BPF programs emit: perf event arrays
// (BPF_MAP_TYPE_PERF_EVENT_ARRAY) and BPF ring buffers
// (BPF_MAP_TYPE_RINGBUF), behind one API.
//
// For a perf event array libbpf opens one ring per online CPU
// (perf_buffer__new_raw); a ring buffer is one ring for every CPU, mapped
// as libbpf's ring_buffer__add maps it, and a reader may take several
// (Options.Maps, or an array of maps of ring buffers). perfbuf reads the
// rings' memory in pure Go, in one of three ways:
//
//   - NewReader: a Reader over all rings, with blocking reads (ReadInto,
//     ReadBatch, Each, All), a read of what is there now (Consume),
//     deadlines, Flush and Close, delivering the fullest ring first or,
//     with Options.Order, every CPU of a perf event array merged in the
//     order of a key.
//   - Callback mode, New: Poll and Consume hand each sample to
//     Options.SampleFunc and each lost count to Options.LostFunc, with the
//     CPU it came from, under libbpf's names (perf_buffer__poll is Poll,
//     perf_buffer__consume is Consume, and so on).
//   - Raw mode, PerfBuffer.Buffer: a RawBuffer over one ring's memory, for
//     consumers of their own: zero-copy records, peeking without
//     committing, the ring's fill level; PerfBuffer.Wait waits for rings.
//
// The kernel counts the samples a full ring dropped (Stats.Lost) but not the
// bpf_perf_event_output calls that failed before reaching a ring (no ring in
// the CPU's slot, a bad index or flags). A BPF program that outputs through
// perfbuf_output of bpf/perfbuf.bpf.h counts those per CPU and by errno in a
// map of its own; given as Options.FailureMap, the map is read into
// Stats.Failed, so that per CPU what the program output is Samples + Lost +
// Left + Failed.Total() once the reader is closed (docs/failures.md says
// when a lost count cannot be known).
//
// Errors are wrapped with context and match with errors.Is: the sentinels
// below, os.ErrInvalid for an argument out of range, os.ErrClosed after
// Close, os.ErrDeadlineExceeded; an errno from libbpf or the kernel stays a
// syscall.Errno (and os.ErrPermission matches EPERM and EACCES).
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

// PerfBuffer is a set of per-CPU perf rings over one perf event array, read
// in callback mode (Poll, Consume, ConsumeBuffer) or raw mode (Buffer, Wait).
//
// Poll, Consume and ConsumeBuffer may be called from several goroutines:
// their drains are serialised, and waiting in Poll holds no lock. Close may
// be called from any goroutine, any number of times, also from a callback;
// it wakes every blocked Poll and Wait, which return an error matching
// os.ErrClosed, and frees the rings once the last call in progress has
// returned and every RawBuffer is released.
//
// Poll, Consume, ConsumeBuffer and Buffer called from inside a SampleFunc or
// LostFunc do not wait for the drain in progress (the one running the
// callback, or another goroutine's): they fail with ErrReentrant.
type PerfBuffer struct {
	c   *core
	cb  *policy.Callback // nil with Options.Raw
	raw bool

	drainMu sync.Mutex // serialises drains and ring additions

	// held[i]: a RawBuffer reads ring i, and drains skip it. Buffer sets
	// it under drainMu (no drain runs then); Release clears it without the
	// lock, so that it may be called from a SampleFunc. The slice grows
	// with the rings (under drainMu and heldMu); Release reads it under
	// heldMu.
	heldMu sync.Mutex
	held   []*atomic.Bool
	nheld  atomic.Int32
	// The contexts of errors, naming what is read: "poll ring buffer
	// \"events\"" (made once: a call formats nothing unless it fails).
	opPoll, opConsume, opWait string

	// cut: a drain stopped before its last ring (a SampleFunc panicked),
	// so rings that epoll reported ready may still hold samples, and their
	// readiness is spent: the next Poll drains every ring without waiting.
	cut atomic.Bool

	// drainF (pb.drainTurn, made once) drains ring drainI inside
	// wait.Drains (see drainRing), giving drainK and drainErr.
	drainF   func()
	drainI   int
	drainK   int
	drainErr error
}

// New opens a ring on every online CPU for the perf event array m, stores
// each ring's descriptor in the map at the CPU's index, as perf_buffer__new
// does, and returns the rings for callback mode (or raw mode only, with
// Options.Raw).
//
// A perf event array has one ring slot per CPU, so one reader: New fails
// with ErrMapInUse while another PerfBuffer or Reader of this process reads
// the same map (by kernel map ID, whichever descriptor names it), until
// that one is closed. Across processes the kernel cannot tell: the last
// reader opened takes the slots over and receives the samples, and the
// earlier one receives nothing more.
//
// Errors: os.ErrInvalid (an option out of range, no SampleFunc, a Reader's
// option), ErrSampleTooLarge, ErrMapInUse, ErrMapType, and errnos
// from the kernel (syscall.EBADF for a closed descriptor, syscall.EINVAL for
// one that is not a BPF object, syscall.EPERM without CAP_PERFMON and
// CAP_BPF).
func New(m Map, opts Options) (*PerfBuffer, error) {
	const op = "new PerfBuffer"
	if err := opts.checkNew(); err != nil {
		return nil, wrap(op, err)
	}
	c, err := openCore(m, opts.Maps, opts.ring(), opts.FailureMap)
	if err != nil {
		return nil, wrap(op, err)
	}
	return newPerfBuffer(c, &opts), nil
}

// newPerfBuffer is New over a core already open (tests pass cores over
// rings of their own).
func newPerfBuffer(c *core, opts *Options) *PerfBuffer {
	pb := &PerfBuffer{c: c, raw: opts.Raw,
		opPoll: "poll " + c.name(), opConsume: "consume " + c.name(), opWait: "wait " + c.name()}
	pb.held = make([]*atomic.Bool, len(c.Rings))
	for i := range pb.held {
		pb.held[i] = new(atomic.Bool)
	}
	c.onAdd = func(int) {
		pb.heldMu.Lock()
		pb.held = append(pb.held, new(atomic.Bool))
		pb.heldMu.Unlock()
	}
	var pol policy.Policy = policy.Raw{S: &c.Set}
	if !opts.Raw {
		pb.cb = policy.NewCallback(&c.Set, opts.SampleFunc, opts.LostFunc)
		pol = pb.cb
	}
	c.start(pol, wait.Drains)
	pb.drainF = pb.drainTurn
	return pb
}

// Close stops the perf buffer: blocked Polls and Waits return an error
// matching os.ErrClosed, and the rings, their mappings and descriptors are
// freed as soon as no call is in progress and every RawBuffer is released
// (at once if so). Later calls fail with os.ErrClosed. Close is idempotent
// and returns nil.
//
// Delivery stops with Close: called from SampleFunc or LostFunc, that call is
// the last; called from another goroutine, a drain in progress stops after
// the callback it is running (or, when Close falls between two, the one it
// starts). What is still in the rings is counted in Stats as Left (and the
// lost records among it in Lost), after the rings are taken out of the map
// and every output already running into them has finished: to stop without
// leaving samples, call Consume (after the producers stop), then Close.
func (pb *PerfBuffer) Close() error {
	pb.c.close()
	return nil
}

// Poll waits up to timeout for a ring's wakeup, drains every ring that holds
// records and returns the number of records delivered: calls of SampleFunc
// and of LostFunc (libbpf's perf_buffer__poll drains the rings epoll
// reported). It waits in the Go runtime's netpoller: a blocked Poll parks
// its goroutine, not a thread. A negative timeout waits until a ring is
// ready or Close is called; zero does not wait. A timeout with nothing
// ready returns 0 and no error.
//
// Poll waits on its own epoll set, so do not also wait on EpollFD: the
// kernel reports a ring's readiness to whichever waiter looks first.
// Concurrent Polls wait one after another, each returning within its own
// timeout, counted from its call.
//
// Errors: os.ErrClosed (wrapped) once Close is called, also for a Poll that
// was blocked when it was; a *CorruptError (ErrCorrupt) for a ring that held
// a record or head the kernel never writes, which is got past as
// RawBuffer.SkipCorrupt does and counted, after the ring's good records and
// the other rings' are delivered (the next call goes on as usual);
// ErrReentrant (see PerfBuffer); os.ErrInvalid with Options.Raw; a
// syscall.Errno from epoll.
func (pb *PerfBuffer) Poll(timeout time.Duration) (int, error) {
	op := pb.opPoll
	if err := pb.enter(op); err != nil {
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
	settled := pb.c.settled(pb.isHeld)
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
	if err := pb.enter(op); err != nil {
		return 0, err
	}
	defer pb.c.life.Exit()
	return pb.drain(op, -1, false)
}

// ConsumeBuffer drains ring i without waiting and returns the number of
// records delivered (perf_buffer__consume_buffer). Errors: as Consume's,
// and os.ErrInvalid for an index out of range, ErrBusy while a RawBuffer
// holds the ring.
func (pb *PerfBuffer) ConsumeBuffer(i int) (int, error) {
	op := fmt.Sprintf("consume ring %d of %s", i, pb.c.name())
	if err := pb.checkIndex(i); err != nil {
		return 0, wrap(op, err)
	}
	if err := pb.enter(op); err != nil {
		return 0, err
	}
	defer pb.c.life.Exit()
	return pb.drain(op, i, false)
}

// enter starts a callback-mode call.
func (pb *PerfBuffer) enter(op string) error {
	if pb.cb == nil {
		return fmt.Errorf("%s: opened with Raw, no SampleFunc: %w", op, os.ErrInvalid)
	}
	return pb.c.life.Enter(op)
}

// BufferCount returns the number of rings (perf_buffer__buffer_cnt): one per
// CPU chosen at New, then one more for each CPU that came online since
// (buffer indexes stay as they are: the new rings come after). Poll, Consume
// and ConsumeBuffer open those rings; with Options.Raw, Wait and BufferCount
// do (BufferCount for a raw consumer that waits on EpollFD), when not called
// while another goroutine holds a ring's Buffer call (a CPU whose ring fails
// to open is left without one: Wait reports the error). It stays valid
// after Close.
func (pb *PerfBuffer) BufferCount() int {
	if pb.raw && pb.c.life.Enter("") == nil {
		if pb.drainMu.TryLock() {
			_ = pb.c.addNewCPUs() // no error to return: see above
			pb.drainMu.Unlock()
		}
		pb.c.life.Exit()
	}
	return pb.c.count()
}

// BufferFD returns ring i's perf event descriptor
// (perf_buffer__buffer_fd), or for a ring buffer its map's (ring__map_fd).
// It belongs to the PerfBuffer, or to the caller's map: do not close it.
// Errors: os.ErrInvalid for an index out of range, os.ErrClosed (wrapped).
func (pb *PerfBuffer) BufferFD(i int) (int, error) {
	op := fmt.Sprintf("fd of ring %d of %s", i, pb.c.name())
	if err := pb.checkIndex(i); err != nil {
		return -1, wrap(op, err)
	}
	if err := pb.c.life.Enter(op); err != nil {
		return -1, err
	}
	defer pb.c.life.Exit()
	return pb.c.fd(i), nil
}

// EpollFD returns libbpf's epoll descriptor over all rings
// (perf_buffer__epoll_fd), those of CPUs that came online since New
// included, for callers that wait in their own event loop and then call
// Consume (which opens the rings of CPUs that came online), or in raw mode
// drain the rings. It belongs to the PerfBuffer: do not close it. Errors:
// os.ErrClosed (wrapped).
func (pb *PerfBuffer) EpollFD() (int, error) {
	op := "epoll fd of " + pb.c.name()
	if err := pb.c.life.Enter(op); err != nil {
		return -1, err
	}
	defer pb.c.life.Exit()
	return pb.c.src.epollFD()
}

// Stats returns per-ring counts of what callback mode delivered, in buffer
// index order (what a RawBuffer reads is in its own Stats). It may be called
// from any goroutine, also after Close.
func (pb *PerfBuffer) Stats() []Stats { return pb.c.statsNow() }

// FollowsCPUs reports whether samples of CPUs that come online after New
// are read: always for ring buffers; for a perf event array, if the CPU
// uevent socket opened (it cannot in a user namespace, see
// docs/kernels.md). It may be called from any goroutine.
func (pb *PerfBuffer) FollowsCPUs() bool { return pb.c.followsCPUs() }

func (pb *PerfBuffer) checkIndex(i int) error {
	if n := pb.c.count(); i < 0 || i >= n {
		return fmt.Errorf("index %d not in [0, %d): %w", i, n, os.ErrInvalid)
	}
	return nil
}

// drain delivers the records of ring one, or of every ring (-1), skipping
// the held ones (and, after a wait, those with nothing in them: a wait does
// not say which ring woke it, see poller.go), and returns the number of
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
		if pb.held[one].Load() {
			return 0, wrap(op, ErrBusy)
		}
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
		if pb.isHeld(i) {
			continue
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

// drainRing drains ring i inside wait.Drains: a call that its SampleFunc or
// LostFunc makes fails with ErrReentrant rather than wait for the drain.
func (pb *PerfBuffer) drainRing(i int) (int, error) {
	pb.drainI = i
	wait.Drains.Run(pb.drainF)
	return pb.drainK, pb.drainErr
}

func (pb *PerfBuffer) drainTurn() { pb.drainK, pb.drainErr = pb.cb.Drain(pb.drainI) }

// isHeld reports whether a RawBuffer holds ring i (drains skip it).
func (pb *PerfBuffer) isHeld(i int) bool {
	return pb.nheld.Load() > 0 && pb.held[i].Load()
}

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

// Buffer returns a raw-mode reader over ring i (perf_buffer__buffer): its
// mapped memory, read in place by pure Go. While the RawBuffer holds the
// ring, callback mode leaves it alone (Poll and Consume skip it,
// ConsumeBuffer(i) fails with ErrBusy), since both would move the same
// data_tail; after Release, either mode may read it. Release the RawBuffer
// when done: Close frees the rings only once every RawBuffer is released.
// Called from SampleFunc or LostFunc, Buffer fails with ErrReentrant
// (Release is fine there).
//
// Errors: os.ErrInvalid for an index out of range, ErrBusy if a RawBuffer
// holds ring i already, os.ErrClosed (wrapped), ErrReentrant, a
// syscall.Errno from libbpf.
func (pb *PerfBuffer) Buffer(i int) (*RawBuffer, error) {
	op := fmt.Sprintf("raw view of ring %d of %s", i, pb.c.name())
	if err := pb.checkIndex(i); err != nil {
		return nil, wrap(op, err)
	}
	// The reference taken here is what keeps the mapping alive: the
	// RawBuffer's Release drops it.
	if err := pb.c.life.Enter(op); err != nil {
		return nil, err
	}
	if err := pb.lockDrain(); err != nil {
		pb.c.life.Exit()
		return nil, wrap(op, err)
	}
	defer pb.drainMu.Unlock()
	if pb.held[i].Load() {
		pb.c.life.Exit()
		return nil, wrap(op, ErrBusy)
	}
	rb, err := pb.c.src.view(i)
	if err != nil {
		pb.c.life.Exit()
		return nil, wrap(op, err)
	}
	pb.held[i].Store(true)
	pb.nheld.Add(1)
	return newRawBuffer(rb, func() { pb.release(i) }), nil
}

// release ends RawBuffer i's hold (RawBuffer.Release). It takes no lock but
// heldMu: a drain in progress (the SampleFunc that calls it, say) has passed
// ring i already or looks at held before it drains it.
func (pb *PerfBuffer) release(i int) {
	pb.heldMu.Lock()
	held := pb.held[i]
	pb.heldMu.Unlock()
	held.Store(false)
	pb.nheld.Add(-1)
	pb.c.life.Exit()
}

// Wait is raw mode's wait: it blocks until a ring holds records, timeout
// passes (negative: no limit; zero: do not block) or Close is called, and
// returns dst with the buffer index of every ring that holds records
// appended, in index order (empty after a timeout). Drain them with
// Buffer(i) and RawBuffer.Drain (or Next and Commit): a ring with records
// left in it is ready again at once. It waits in the netpoller, as Poll
// does, for the rings' wakeups: with WakeupEvents > 1 or WakeupBytes,
// records below the threshold are found when the timeout passes. It opens
// the rings of CPUs that came online since the last call (their indexes are
// new). Errors: os.ErrClosed (wrapped), ErrReentrant from inside a
// callback, a syscall.Errno from epoll or from opening a ring.
func (pb *PerfBuffer) Wait(timeout time.Duration, dst []int) ([]int, error) {
	op := pb.opWait
	if err := pb.c.life.Enter(op); err != nil {
		return dst, err
	}
	defer pb.c.life.Exit()
	var deadline time.Time
	if timeout > 0 {
		deadline = time.Now().Add(timeout)
	}
	for {
		if err := pb.lockDrain(); err != nil {
			return dst, wrap(op, err)
		}
		err := pb.c.addNewCPUs()
		rings := pb.c.Rings
		pb.drainMu.Unlock()
		if err != nil {
			return dst, wrap(op, err)
		}
		n := len(dst)
		for i, rb := range rings {
			if rb.Cur().Used() > 0 {
				dst = append(dst, i)
			}
		}
		if len(dst) > n || timeout == 0 {
			return dst, nil
		}
		left := timeout
		if timeout > 0 {
			if left = time.Until(deadline); left <= 0 {
				return dst, nil
			}
		}
		if _, err := pb.c.w.Wait(left, 0); err != nil {
			return dst, wrap(op, err)
		}
		if pb.c.life.Closed() {
			return dst, wrap(op, os.ErrClosed)
		}
		if pb.c.w.Woken() {
			pb.c.w.ClearWake() // a CPU came online: look again
		}
	}
}
