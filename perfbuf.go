// Package perfbuf reads BPF perf event arrays (BPF_MAP_TYPE_PERF_EVENT_ARRAY).
//
// libbpf opens one ring per online CPU (perf_buffer__new_raw) and perfbuf
// reads the rings' memory in pure Go, in one of three ways:
//
//   - Callback mode, New: Poll and Consume hand each sample to
//     Options.SampleFunc and each lost count to Options.LostFunc, with the
//     CPU it came from, under libbpf's names (perf_buffer__poll is Poll,
//     perf_buffer__consume is Consume, and so on).
//   - Raw mode, PerfBuffer.Buffer: a RawBuffer over one ring's memory, for
//     consumers of their own: zero-copy records, peeking without
//     committing, the ring's fill level.
//   - NewReader: a Reader over all rings, with blocking reads, deadlines,
//     Flush and Close, delivering the fullest ring first or, with
//     ReaderOptions.Order, every CPU merged in the order of a key.
//
// The kernel counts the samples a full ring dropped (Stats.Lost) but not the
// bpf_perf_event_output calls that failed before reaching a ring (no ring in
// the CPU's slot, a bad index or flags). A BPF program that outputs through
// perfbuf_output of bpf/perfbuf.bpf.h counts those per CPU and by errno in a
// map of its own; given as Options.FailureMap (ReaderOptions.FailureMap),
// the map is read into Stats.Failed, so that per CPU what the program output
// is Samples + Lost + Failed.Total() (docs/failures.md).
//
// Errors are wrapped with context and match with errors.Is: the sentinels
// below, os.ErrInvalid for an argument out of range, os.ErrClosed after
// Close, os.ErrDeadlineExceeded; an errno from libbpf or the kernel stays a
// syscall.Errno (and os.ErrPermission matches EPERM and EACCES).
package perfbuf

import (
	"errors"
	"fmt"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// Errors returned by this package, each wrapped with context.
var (
	// ErrNotPerfEventArray: the map is of another type, or the descriptor
	// is not a BPF map.
	ErrNotPerfEventArray = errors.New("map is not a perf event array")
	// ErrSampleTooLarge: MaxSampleSize cannot fit in a ring.
	ErrSampleTooLarge = errors.New("sample does not fit in perf ring")
	// ErrMapInUse: another PerfBuffer or Reader of this process reads the
	// map (a perf event array has one ring slot per CPU, so one reader).
	ErrMapInUse = errors.New("perf event array read by another reader")
	// ErrBusy: the ring is held by a RawBuffer (see PerfBuffer.Buffer).
	ErrBusy = errors.New("perf ring held by a raw reader")
	// ErrReentrant: a call made from inside a callback (SampleFunc,
	// LostFunc, an Each function or an All loop) would wait for a call in
	// progress, perhaps the one running the callback.
	ErrReentrant = errors.New("call from inside a callback would wait for a call in progress")
	// ErrFlushed: a Reader delivered everything that was in the rings when
	// Flush was called.
	ErrFlushed = errors.New("perf buffer flushed")
	// ErrCorrupt: a ring held a record or head the kernel never writes
	// (see CorruptError).
	ErrCorrupt = errors.New("corrupt perf ring record")
)

// Map is what New and NewReader read from: a perf event array's file
// descriptor. *libbpfgo.BPFMap satisfies it; MapFD wraps a bare descriptor.
type Map interface {
	FileDescriptor() int
}

// MapFD is a bare map file descriptor that satisfies Map.
type MapFD int

// FileDescriptor returns fd.
func (fd MapFD) FileDescriptor() int { return int(fd) }

// Options configures New.
type Options struct {
	// PageCount is the number of data pages in each CPU's ring, a power of
	// two. Zero means 64 (256 KiB with 4 KiB pages), unless RingBytes is
	// set.
	PageCount int

	// RingBytes, if set, sizes each ring's data area in bytes instead of
	// pages: rounded up to a power of two pages of the host's page size
	// (os.Getpagesize), as cilium/ebpf's perf reader does. Setting it with
	// PageCount is an error. On a host with 64 KiB pages, 64 pages would be
	// 4 MiB a CPU, so an agent that ships one setting for every host sizes
	// its rings here (at least one page: 4 KiB or 64 KiB).
	RingBytes int

	// WakeupEvents wakes the reader once every WakeupEvents samples
	// (libbpf's perf_buffer_opts.sample_period, the event's
	// wakeup_events). Zero means 1. Larger values cut the producer's and
	// the consumer's cost, but samples below the threshold raise no
	// wakeup: a blocked Poll sleeps on them (a Poll that starts while they
	// are there delivers them at once). Poll with a timeout, or Consume,
	// to pick them up.
	WakeupEvents int

	// WakeupBytes, if set, wakes the reader once a ring holds this many
	// bytes instead (the event's wakeup_watermark). It excludes
	// WakeupEvents > 1 and must be below the ring size.
	WakeupBytes int

	// MaxSampleSize, if set, is the largest sample the BPF program
	// outputs, in bytes. New fails with ErrSampleTooLarge when a record
	// carrying it, with the kernel's 24-byte lost record in front of it,
	// cannot fit in a ring: the kernel would drop every such sample once
	// one was lost (a one-page ring takes at most 4052 bytes).
	MaxSampleSize int

	// SampleFunc receives each sample with the CPU it was written on; New
	// requires it unless Raw is set. data aliases ring memory and is valid
	// only during the call: copy what you keep. Its length is the kernel's
	// raw size, padded so that records stay 8-byte aligned (a 13-byte
	// bpf_perf_event_output arrives as 20 bytes), so samples must carry
	// their own length. It runs on the goroutine that called Poll or
	// Consume; a panic in it reaches that caller, and the samples after it
	// are delivered by the next call.
	SampleFunc func(cpu int, data []byte)

	// LostFunc, if set, receives each count of samples the kernel dropped
	// on a CPU because its ring was full. The kernel writes that record
	// only once a later sample fits, so a count can arrive late.
	LostFunc func(cpu int, count uint64)

	// FailureMap, if set, is the BPF-side failure counters of
	// bpf/perfbuf.bpf.h (PERFBUF_FAILURE_MAP): the bpf_perf_event_output
	// calls that failed before reaching a ring, which the kernel counts
	// nowhere else. Stats reads it into each CPU's Failed. New fails with
	// os.ErrInvalid if it is not such a map (a per-CPU array of one
	// struct perfbuf_failures).
	FailureMap Map

	// Raw opens the rings for raw mode only (PerfBuffer.Buffer), with no
	// callbacks: SampleFunc and LostFunc must be nil, and Poll, Consume
	// and ConsumeBuffer fail.
	Raw bool
}

func (o *Options) ring() ringOptions {
	return ringOptions{o.PageCount, o.RingBytes, o.WakeupEvents, o.WakeupBytes, o.MaxSampleSize}
}

// Stats counts what was read from one CPU's ring. Every mode reports the
// same fields; those a mode has no use for stay zero.
//
// Stats methods return one entry per ring, in buffer index order. A CPU may
// have two rings (one opened at New, one when it came back online), and
// with a FailureMap, CPUs without a ring that had failures get an entry of
// their own after the rings'; sum entries by CPU for per-CPU totals.
type Stats struct {
	CPU          int    // the CPU behind the ring
	Samples      uint64 // samples delivered (and late samples dropped: see Dropped)
	Bytes        uint64 // their payload bytes, as delivered (kernel padding included)
	Lost         uint64 // samples the kernel reported lost, in the lost records delivered
	Other        uint64 // records of other types, skipped
	Corrupt      uint64 // corrupt records or heads found, each reported once as a *CorruptError
	CorruptBytes uint64 // bytes skipped past them
	Late         uint64 // ordered Reader: samples delivered (or dropped) behind a larger key
	Dropped      uint64 // ordered Reader with DropLate: late samples dropped
	Discarded    uint64 // bytes left undelivered in the ring at Close
	MaxFill      int    // the most bytes seen waiting in the ring
	Fill         int    // bytes waiting in the ring when Stats was called (0 after Close)
	// Failed counts the CPU's failed bpf_perf_event_output calls, with a
	// FailureMap; on the CPU's latest ring's entry. They are the map's
	// counts, which the BPF program keeps from its load on, so outputs
	// before New (to a slot with no ring yet: NoEntry) count too. After
	// Close they are the counts when the rings were freed. New reads the
	// map once; a later read that fails (for want of kernel memory) leaves
	// the counts of the last one that worked.
	Failed Failures
}

// Failures counts a CPU's bpf_perf_event_output calls that failed before
// reaching a ring, by errno, as bpf/perfbuf.bpf.h counts them. A full ring
// (ENOSPC) is not among them: the kernel reports those samples in a lost
// record, counted in Stats.Lost. So, per CPU, what a program emitted is
// Samples + Lost + Failed.Total().
type Failures struct {
	NoEntry  uint64 // ENOENT: the CPU's slot in the map holds no ring
	TooBig   uint64 // E2BIG: the CPU's index is past the map's max_entries
	Invalid  uint64 // EINVAL: flags the helper rejects
	NotOnCPU uint64 // EOPNOTSUPP: the slot's ring is another CPU's, or its event was stopped
	Other    uint64 // any other errno
}

// Total is the number of failed calls of every cause.
func (f Failures) Total() uint64 {
	return f.NoEntry + f.TooBig + f.Invalid + f.NotOnCPU + f.Other
}

// PerfBuffer is a set of per-CPU perf rings over one perf event array, read
// in callback mode (Poll, Consume, ConsumeBuffer) or raw mode (Buffer).
//
// Poll, Consume and ConsumeBuffer may be called from several goroutines:
// their drains are serialised, and waiting in Poll holds no lock. Close may
// be called from any goroutine, any number of times, also from a callback;
// it wakes every blocked Poll, which returns an error matching
// os.ErrClosed, and frees the rings once the last call in progress has
// returned and every RawBuffer is released.
//
// Poll, Consume, ConsumeBuffer and Buffer called from inside a SampleFunc or
// LostFunc do not wait for the drain in progress (the one running the
// callback, or another goroutine's): they fail with ErrReentrant.
type PerfBuffer struct {
	r      *rings
	sample func(cpu int, data []byte)
	lost   func(cpu int, count uint64)
	raw    bool // Options.Raw

	w    *waiter  // Poll's epoll over every ring, woken by Close
	life lifetime // calls in progress; the last one out after Close frees

	drainMu sync.Mutex // serialises drains; guards the fields below
	rec     Record     // the record being delivered
	wrapped []byte     // a sample that straddles the ring's end, made contiguous
	deliver func(*Record) error

	// held[i]: a RawBuffer reads ring i, and drains skip it. Buffer sets
	// it under drainMu (no drain runs then); Release clears it without the
	// lock, so that it may be called from a SampleFunc. The slice grows
	// with the rings (under drainMu and r.mu); Release reads it under r.mu.
	held  []*atomic.Bool
	nheld atomic.Int32
	// cut: a drain stopped before its last ring (a SampleFunc panicked),
	// so rings that epoll reported ready may still hold samples, and their
	// readiness is spent: the next Poll drains every ring without waiting.
	cut atomic.Bool

	statsMu sync.Mutex
	stats   []Stats // by buffer index
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
// Errors: os.ErrInvalid (an option out of range, no SampleFunc),
// ErrSampleTooLarge, ErrMapInUse, ErrNotPerfEventArray, and errnos from the
// kernel (syscall.EBADF for a closed descriptor, syscall.EINVAL for one that
// is not a BPF object, syscall.EPERM without CAP_PERFMON and CAP_BPF).
func New(m Map, opts Options) (*PerfBuffer, error) {
	const op = "new perf buffer"
	switch {
	case opts.Raw && (opts.SampleFunc != nil || opts.LostFunc != nil):
		return nil, fmt.Errorf("%s: Raw with SampleFunc or LostFunc: %w", op, os.ErrInvalid)
	case !opts.Raw && opts.SampleFunc == nil:
		return nil, fmt.Errorf("%s: no SampleFunc (set Raw to read the rings with Buffer only): %w", op, os.ErrInvalid)
	}
	cfg, err := opts.ring().hostConfig()
	if err != nil {
		return nil, fmt.Errorf("%s: %w", op, err)
	}
	r, err := openRings(m, cfg, opts.FailureMap)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", op, err)
	}
	pb, err := newPerfBuffer(r, opts)
	if err != nil {
		r.close()
		return nil, fmt.Errorf("%s: %w", op, err)
	}
	return pb, nil
}

// newPerfBuffer is New over rings already open (tests pass rings of their
// own). It does not close r if it fails.
func newPerfBuffer(r *rings, opts Options) (*PerfBuffer, error) {
	pb := &PerfBuffer{
		r:      r,
		sample: opts.SampleFunc,
		lost:   opts.LostFunc,
		raw:    opts.Raw,
	}
	pb.deliver = pb.deliverRecord
	var err error
	if pb.w, err = newWaiter(nil, nil); err != nil {
		return nil, err
	}
	for i := range r.raw {
		if err := pb.added(i); err != nil {
			pb.w.close()
			return nil, err
		}
	}
	pb.life.free = pb.free
	if r.watch != nil {
		r.watch.notify = pb.poke
		r.watch.start()
	}
	return pb, nil
}

// added takes ring i, new in pb.r, into the drains, the waits and the
// stats. Under drainMu, once the PerfBuffer is in use.
func (pb *PerfBuffer) added(i int) error {
	rb := pb.r.raw[i]
	rb.skipOther, rb.closed = true, &pb.life
	if err := pb.w.addRing(rb, pb.r.fds[i]); err != nil {
		return err
	}
	pb.r.mu.Lock()
	pb.held = append(pb.held, new(atomic.Bool))
	pb.r.mu.Unlock()
	pb.statsMu.Lock()
	pb.stats = append(pb.stats, Stats{CPU: rb.CPU()})
	pb.statsMu.Unlock()
	return nil
}

// poke wakes a blocked Poll (see waiter.wakeOpen): a CPU came online.
func (pb *PerfBuffer) poke() { pb.w.wakeOpen(&pb.life) }

// addNewCPUs gives the CPUs that came online since the last call their
// rings (hotplug.go). Under drainMu.
func (pb *PerfBuffer) addNewCPUs() error {
	if !pb.r.cpusPending() {
		return nil
	}
	return pb.r.addNewCPUs(pb.added)
}

// Close stops the perf buffer: blocked Polls return an error matching
// os.ErrClosed, and the rings, their mappings and descriptors are freed as
// soon as no call is in progress and every RawBuffer is released (at once if
// so). Later calls fail with os.ErrClosed. Close is idempotent and returns
// nil.
//
// Delivery stops with Close: called from SampleFunc or LostFunc, that call is
// the last; called from another goroutine, a drain in progress stops after
// the callback it is running (or, when Close falls between two, the one it
// starts). What is still in the rings is discarded and
// counted in Stats as Discarded: to stop without losing it, call Consume
// (after the producers stop), then Close.
func (pb *PerfBuffer) Close() error {
	pb.life.close(func() { pb.w.wake(true) })
	return nil
}

// free counts what is left in the rings and releases everything; called
// once, by lifetime, when no call is in progress.
func (pb *PerfBuffer) free() {
	pb.statsMu.Lock()
	for i, rb := range pb.r.raw {
		pb.stats[i].Discarded += uint64(rb.Used())
	}
	pb.statsMu.Unlock()
	pb.r.close()
	pb.w.close()
}

// Poll waits up to timeout for a ring's wakeup, drains every ring that holds
// records and returns the number of samples delivered (libbpf's
// perf_buffer__poll drains the rings epoll reported and returns their
// count). It waits in the Go runtime's netpoller: a blocked Poll parks its
// goroutine, not a thread. A negative timeout waits until a ring
// is ready or Close is called; zero does not wait. A timeout with nothing
// ready returns 0 and no error.
//
// Poll waits on its own epoll set, so do not also wait on EpollFD: the
// kernel reports a ring's readiness to whichever waiter looks first.
// Concurrent Polls wait one after another, each within its own timeout.
//
// Errors: os.ErrClosed (wrapped) once Close is called, also for a Poll that
// was blocked when it was; a *CorruptError (ErrCorrupt) for a ring that held
// a record or head the kernel never writes, which is got past as
// RawBuffer.SkipCorrupt does and counted, after the ring's good records and
// the other rings' are delivered (the next call goes on as usual); ErrReentrant (see PerfBuffer);
// os.ErrInvalid with Options.Raw; a syscall.Errno from epoll.
func (pb *PerfBuffer) Poll(timeout time.Duration) (int, error) {
	const op = "poll perf buffer"
	if err := pb.enter(op); err != nil {
		return 0, err
	}
	defer pb.life.exit()

	if pb.cut.Swap(false) {
		return pb.drain(op, -1, false) // see cut
	}
	// From inside a callback, fail before waiting rather than after.
	if err := pb.lockDrain(); err != nil {
		return 0, fmt.Errorf("%s: %w", op, err)
	}
	pb.drainMu.Unlock()
	event, err := pb.w.wait(timeout)
	if err != nil {
		return 0, fmt.Errorf("%s: %w", op, err)
	}
	if pb.life.closed() {
		return 0, fmt.Errorf("%s: %w", op, os.ErrClosed)
	}
	if pb.w.woken.Load() {
		pb.w.clearWake() // a CPU came online (poke): drain sees to it
	}
	if !event {
		return 0, nil
	}
	return pb.drain(op, -1, true)
}

// Consume drains every ring without waiting and returns the number of
// samples delivered (perf_buffer__consume). Errors: as Poll's, but for the
// wait's.
func (pb *PerfBuffer) Consume() (int, error) {
	const op = "consume perf buffer"
	if err := pb.enter(op); err != nil {
		return 0, err
	}
	defer pb.life.exit()
	return pb.drain(op, -1, false)
}

// ConsumeBuffer drains ring i without waiting and returns the number of
// samples delivered (perf_buffer__consume_buffer). Errors: as Consume's,
// and os.ErrInvalid for an index out of range, ErrBusy while a RawBuffer
// holds the ring.
func (pb *PerfBuffer) ConsumeBuffer(i int) (int, error) {
	op := fmt.Sprintf("consume perf buffer %d", i)
	if err := pb.checkIndex(i); err != nil {
		return 0, fmt.Errorf("%s: %w", op, err)
	}
	if err := pb.enter(op); err != nil {
		return 0, err
	}
	defer pb.life.exit()
	return pb.drain(op, i, false)
}

// enter starts a callback-mode call.
func (pb *PerfBuffer) enter(op string) error {
	if pb.sample == nil {
		return fmt.Errorf("%s: opened with Raw, no SampleFunc: %w", op, os.ErrInvalid)
	}
	return pb.life.enter(op)
}

// BufferCount returns the number of rings (perf_buffer__buffer_cnt): one per
// CPU chosen at New, then one more for each CPU that came online since
// (buffer indexes stay as they are: the new rings come after). Poll, Consume
// and ConsumeBuffer open those rings; with Options.Raw, BufferCount does,
// when not called while another goroutine holds a ring's Buffer call (a CPU
// whose ring fails to open is left without one). It stays valid after
// Close.
func (pb *PerfBuffer) BufferCount() int {
	if pb.raw && pb.life.enter("") == nil {
		if pb.drainMu.TryLock() {
			_ = pb.addNewCPUs() // no error to return: see above
			pb.drainMu.Unlock()
		}
		pb.life.exit()
	}
	return pb.r.count()
}

// CPU returns the CPU behind buffer index i. Indexes are not CPU numbers:
// like libbpf, New skips offline CPUs and CPUs beyond the map's max_entries.
// Errors: os.ErrInvalid for an index out of range.
func (pb *PerfBuffer) CPU(i int) (int, error) {
	if err := pb.checkIndex(i); err != nil {
		return 0, fmt.Errorf("cpu of perf buffer %d: %w", i, err)
	}
	return pb.r.cpu(i), nil
}

// BufferFD returns ring i's perf event descriptor
// (perf_buffer__buffer_fd). It belongs to the PerfBuffer: do not close it.
// Errors: os.ErrInvalid for an index out of range, os.ErrClosed (wrapped).
func (pb *PerfBuffer) BufferFD(i int) (int, error) {
	op := fmt.Sprintf("fd of perf buffer %d", i)
	if err := pb.checkIndex(i); err != nil {
		return -1, fmt.Errorf("%s: %w", op, err)
	}
	if err := pb.life.enter(op); err != nil {
		return -1, err
	}
	defer pb.life.exit()
	return pb.r.fd(i), nil
}

// EpollFD returns libbpf's epoll descriptor over all rings
// (perf_buffer__epoll_fd), those of CPUs that came online since New
// included, for callers that wait in their own event loop and then call
// Consume (which opens the rings of CPUs that came online). It belongs to the PerfBuffer: do not close it. Errors:
// os.ErrClosed (wrapped).
func (pb *PerfBuffer) EpollFD() (int, error) {
	const op = "epoll fd of perf buffer"
	if err := pb.life.enter(op); err != nil {
		return -1, err
	}
	defer pb.life.exit()
	return pb.r.epfd, nil
}

// Stats returns per-CPU counts of what callback mode delivered, in buffer
// index order (what a RawBuffer reads is in its own Stats). It may be called
// from any goroutine, also after Close.
func (pb *PerfBuffer) Stats() []Stats {
	pb.statsMu.Lock()
	st := slices.Clone(pb.stats)
	pb.statsMu.Unlock()
	pb.r.mu.RLock()
	raw := pb.r.raw[:len(st)] // rings are added to raw before stats
	pb.r.mu.RUnlock()
	return completeStats(st, raw, &pb.life, pb.r.failures)
}

func (pb *PerfBuffer) checkIndex(i int) error {
	if n := pb.r.count(); i < 0 || i >= n {
		return fmt.Errorf("index %d not in [0, %d): %w", i, n, os.ErrInvalid)
	}
	return nil
}

// drain delivers the records of ring one, or of every ring (-1), skipping
// the held ones (and, after a wait, those with nothing in them: a wait does
// not say which ring woke it, see poller.go), and returns the number of
// samples delivered and the first ring's corruption. It opens the rings of
// CPUs that came online first, and reports a failure to after the drain.
// Drains are serialised; the caller holds a user reference (enter).
func (pb *PerfBuffer) drain(op string, one int, nonEmpty bool) (int, error) {
	if err := pb.lockDrain(); err != nil {
		return 0, fmt.Errorf("%s: %w", op, err)
	}
	defer pb.drainMu.Unlock()
	firstErr := pb.addNewCPUs()
	if firstErr != nil {
		firstErr = fmt.Errorf("%s: %w", op, firstErr)
	}
	from, to := 0, len(pb.r.raw)
	if one >= 0 {
		if pb.held[one].Load() {
			return 0, fmt.Errorf("%s: %w", op, ErrBusy)
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
		if pb.life.closed() {
			break // Close was called from a callback
		}
		if pb.nheld.Load() > 0 && pb.held[i].Load() {
			continue
		}
		if nonEmpty && pb.r.raw[i].Used() == 0 {
			continue
		}
		k, err := pb.drainRing(i)
		n += k
		if err != nil && firstErr == nil {
			firstErr = fmt.Errorf("%s: %w", op, err)
		}
	}
	done = true
	return n, firstErr
}

// drainRing delivers ring i's records up to its head and commits them, also
// when a callback panics. A corrupt ring is got past (SkipCorrupt) and its
// *CorruptError returned.
func (pb *PerfBuffer) drainRing(i int) (int, error) {
	rb := pb.r.raw[i]
	before := rb.stats.Samples
	defer pb.publish(i) // commits, and counts what was delivered
	rb.Begin()
	_, err := rb.each(&pb.rec, maxLimit, pb.deliver)
	if err != nil {
		rb.SkipCorrupt() // counted; the ring goes on past it
	}
	return int(rb.stats.Samples - before), err
}

// maxLimit is each's limit for a drain to the head.
const maxLimit = ^uint64(0)

// deliverRecord hands a record to SampleFunc or LostFunc: each's fn for
// callback mode.
func (pb *PerfBuffer) deliverRecord(rec *Record) error {
	if rec.Type == RecordLost {
		if pb.lost != nil {
			pb.lost(rec.CPU, rec.Lost)
		}
		return nil
	}
	data := rec.Data
	if len(rec.Wrapped) > 0 {
		pb.wrapped = rec.AppendTo(pb.wrapped[:0])
		data = pb.wrapped
	}
	pb.sample(rec.CPU, data)
	return nil
}

// publish commits ring i up to its cursor (every record before it was
// delivered) and copies its counts into the shared stats.
func (pb *PerfBuffer) publish(i int) {
	rb := pb.r.raw[i]
	rb.commitCursor()
	pb.rec = Record{} // drop the references to ring memory
	pb.statsMu.Lock()
	st := &pb.stats[i]
	discarded := st.Discarded
	*st = rb.stats
	st.Discarded = discarded
	pb.statsMu.Unlock()
}

// lockDrain takes drainMu, unless it would wait from inside a callback:
// then it fails with ErrReentrant (see reentry.go).
func (pb *PerfBuffer) lockDrain() error {
	if pb.drainMu.TryLock() {
		return nil
	}
	if inCallback(drainCallbackFrames) {
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
	op := fmt.Sprintf("raw perf buffer %d", i)
	if err := pb.checkIndex(i); err != nil {
		return nil, fmt.Errorf("%s: %w", op, err)
	}
	// The reference taken here is what keeps the mapping alive: the
	// RawBuffer's Release drops it.
	if err := pb.life.enter(op); err != nil {
		return nil, err
	}
	if err := pb.lockDrain(); err != nil {
		pb.life.exit()
		return nil, fmt.Errorf("%s: %w", op, err)
	}
	defer pb.drainMu.Unlock()
	if pb.held[i].Load() {
		pb.life.exit()
		return nil, fmt.Errorf("%s: %w", op, ErrBusy)
	}
	rb, err := pb.r.view(i)
	if err != nil {
		pb.life.exit()
		return nil, fmt.Errorf("%s: %w", op, err)
	}
	rb.onRelease = func() { pb.release(i) }
	pb.held[i].Store(true)
	pb.nheld.Add(1)
	return rb, nil
}

// release ends RawBuffer i's hold (RawBuffer.Release). It takes no lock: a
// drain in progress (the SampleFunc that calls it, say) has passed ring i
// already or looks at held before it drains it.
func (pb *PerfBuffer) release(i int) {
	pb.r.mu.RLock()
	held := pb.held[i]
	pb.r.mu.RUnlock()
	held.Store(false)
	pb.nheld.Add(-1)
	pb.life.exit()
}
