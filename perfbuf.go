// Package perfbuf reads BPF perf event arrays (BPF_MAP_TYPE_PERF_EVENT_ARRAY)
// through libbpf's perf_buffer.
//
// A PerfBuffer opens one ring per online CPU and offers two ways to read them:
//
//   - Callback mode: Poll, Consume and ConsumeBuffer drain the rings with
//     libbpf and hand each sample to Options.SampleFunc and each lost count to
//     Options.LostFunc, with the CPU it came from. Samples cross from C to Go
//     in batches, not one call per sample.
//   - Raw mode: Buffer(i) returns a RawBuffer, a pure-Go reader over ring i's
//     mapped memory, for zero-copy reads, peeking and custom ordering.
//
// The names follow libbpf (perf_buffer__poll is Poll, perf_buffer__consume is
// Consume, and so on) so that code ported from C finds each call.
package perfbuf

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/perfbuf/perfbuf/internal/cpus"
	"golang.org/x/sys/unix"
)

// DefaultPageCount is the number of data pages per CPU ring when
// Options.PageCount is zero: 64 pages, 256 KiB with 4 KiB pages.
const DefaultPageCount = 64

// Errors returned by this package. Each is wrapped with context; match with
// errors.Is. An errno from libbpf or the kernel stays a syscall.Errno under
// the wrapping (errors.Is(err, syscall.ENOENT) works).
var (
	// ErrNotPerfEventArray: the map given to New is of another type.
	ErrNotPerfEventArray = errors.New("map is not a perf event array")
	// ErrInvalidOptions: an Options field or an argument is out of range.
	ErrInvalidOptions = errors.New("invalid perf buffer options")
	// ErrSampleTooLarge: Options.MaxSampleSize cannot fit in a ring.
	ErrSampleTooLarge = errors.New("sample does not fit in perf ring")
	// ErrIndex: a buffer index is negative or not below BufferCount.
	ErrIndex = errors.New("perf buffer index out of range")
	// ErrBusy: the ring is held by a RawBuffer (see Buffer).
	ErrBusy = errors.New("perf ring held by a raw reader")
	// ErrReentrant: a call made from inside a callback (SampleFunc,
	// LostFunc, a reader's Each function or All loop) would wait for a
	// call in progress, perhaps the one running the callback.
	ErrReentrant = errors.New("call from inside a callback would wait for a call in progress")
	// ErrMapInUse: another PerfBuffer of this process reads the map (see
	// New).
	ErrMapInUse = errors.New("perf event array read by another perf buffer")
)

// Map is what New reads from: a perf event array's file descriptor.
// *libbpfgo.BPFMap satisfies it; MapFD wraps a bare descriptor.
type Map interface {
	FileDescriptor() int
}

// MapFD is a bare map file descriptor that satisfies Map.
type MapFD int

// FileDescriptor returns fd.
func (fd MapFD) FileDescriptor() int { return int(fd) }

// Options configures New. The zero value is usable: 64 pages per CPU, a
// wakeup on every sample, samples counted but not delivered.
type Options struct {
	// PageCount is the number of data pages in each CPU's ring, a power of
	// two. Zero selects DefaultPageCount; anything else that is not a
	// positive power of two is an error.
	PageCount int

	// WakeupEvents wakes the reader once every WakeupEvents samples
	// (libbpf's perf_buffer_opts.sample_period, the event's wakeup_events).
	// Zero means 1. Larger values cut the producer's cost, but samples below
	// the threshold raise no wakeup: Poll with a timeout, or Consume, to
	// pick them up.
	WakeupEvents int

	// WakeupBytes, if set, wakes the reader once a ring holds this many
	// bytes instead (the event's wakeup_watermark). It excludes
	// WakeupEvents > 1 and must be below the ring size.
	WakeupBytes int

	// MaxSampleSize, if set, is the largest sample the BPF program
	// outputs, in bytes. New fails with ErrSampleTooLarge when a record
	// carrying it, with the kernel's 24-byte lost record in front of it,
	// cannot fit in a ring: the kernel would drop such samples as lost, and
	// after one loss every one (a one-page ring takes at most 4052 bytes).
	MaxSampleSize int

	// SampleFunc receives each sample with the CPU it was written on. data
	// is only valid during the call: copy what you keep. Its length is the
	// kernel's raw size, which is padded so that records stay 8-byte
	// aligned (a 13-byte bpf_perf_event_output arrives as 20 bytes), so
	// samples must carry their own length. It runs on the goroutine that
	// called Poll or Consume; a panic in it reaches that caller, and the
	// samples not yet delivered are delivered by the next call.
	SampleFunc func(cpu int, data []byte)

	// LostFunc receives each count of samples the kernel dropped on a CPU
	// because its ring was full. The kernel writes that record only once a
	// later sample fits, so a count can arrive late.
	LostFunc func(cpu int, count uint64)
}

// CPUStats counts what one CPU's ring delivered.
type CPUStats struct {
	CPU     int    // the CPU behind the ring
	Samples uint64 // samples handed to SampleFunc (or dropped when it is nil)
	Bytes   uint64 // payload bytes of those samples
	Lost    uint64 // samples the kernel reported lost
	// Records skipped: of a type other than sample and lost (Other), or
	// too short for what they say they hold (Corrupt: a sample whose u32
	// size its u16 header cannot hold, as one over 64 KiB wraps it).
	Other, Corrupt uint64
}

// PerfBuffer is a set of per-CPU perf rings over one perf event array.
//
// Poll, Consume and ConsumeBuffer may be called from several goroutines:
// their drains are serialised (libbpf has no locking of its own), and waiting
// in Poll holds no lock. Close may be called from any goroutine, any number of
// times, including from inside SampleFunc; it wakes every blocked Poll, which
// returns an error matching os.ErrClosed, and frees the rings once the last
// call in progress has returned.
//
// Poll, Consume, ConsumeBuffer and Buffer called from inside a SampleFunc or
// LostFunc do not wait for a drain in progress (the one running the
// callback, or another goroutine's): they fail with ErrReentrant instead.
type PerfBuffer struct {
	mapID  uint32   // claimed in claims until free
	c      *cBuffer // the libbpf side: rings and the arena
	cpus   []int32  // cpus[i] is the CPU behind buffer index i
	sample func(cpu int, data []byte)
	lost   func(cpu int, count uint64)

	w    *waiter  // Poll's epoll over every ring, woken by Close
	life lifetime // calls in progress; the last one out after Close frees

	drainMu sync.Mutex // serialises drains; guards the fields below
	batch   batch
	pend    []pending // per-index counts not yet published to stats
	all     []int32   // 0..n-1, for Consume
	idxBuf  []int32   // drain's filtered index list

	// held[i]: a RawBuffer reads ring i, and drains skip it. Buffer sets
	// it under drainMu (no drain runs then); Release clears it without the
	// lock, so that it may be called from a SampleFunc.
	held  []atomic.Bool
	nheld atomic.Int32
	// cut: a drain stopped before its last ring (a SampleFunc panicked, or
	// libbpf failed), so rings that epoll reported ready may still hold
	// samples, and their readiness is spent: the next Poll drains every
	// ring without waiting.
	cut atomic.Bool

	stats []cpuCounters // per buffer index
}

type cpuCounters struct {
	samples, bytes, lost, other, corrupt atomic.Uint64
}

type pending struct {
	samples, bytes, lost, other, corrupt uint64
}

// New opens a ring on every online CPU for the perf event array m and stores
// each ring's fd in the map at the CPU's index, as perf_buffer__new does.
// A perf event array has one ring slot per CPU, so it has one reader: New
// fails with ErrMapInUse while another PerfBuffer of this process reads the
// same map (by kernel map ID, whichever fd names it), until that one is
// closed and its rings freed. Across processes the kernel cannot tell: the
// last PerfBuffer opened takes the slots over and receives the samples, and
// the earlier one receives nothing more.
//
// Errors: ErrInvalidOptions, ErrSampleTooLarge, ErrMapInUse,
// ErrNotPerfEventArray (also
// for a BPF object that is not a map, such as a program), and errnos from
// the kernel (syscall.EBADF for a closed descriptor, syscall.EINVAL for one
// that is not a BPF object).
func New(m Map, opts Options) (*PerfBuffer, error) {
	if m == nil {
		return nil, fmt.Errorf("new perf buffer: nil map: %w", ErrInvalidOptions)
	}
	fd := m.FileDescriptor()
	pages, err := opts.validate(os.Getpagesize())
	if err != nil {
		return nil, fmt.Errorf("new perf buffer: %w", err)
	}
	if fd < 0 {
		return nil, fmt.Errorf("new perf buffer: map fd %d: %w", fd, syscall.EBADF)
	}
	// The kernel answers a closed fd with EBADFD in BPF_OBJ_GET_INFO_BY_FD
	// (since 6.x); ask fcntl first so that it is EBADF on every kernel.
	if _, err := unix.FcntlInt(uintptr(fd), unix.F_GETFD, 0); err != nil {
		return nil, fmt.Errorf("new perf buffer: map fd %d: %w", fd, err)
	}
	info, err := mapInfo(fd)
	// BPF_OBJ_GET_INFO_BY_FD answers for programs, links and BTF too, in
	// their own info struct, which would be read as a map's.
	if kind := fdKind(fd); kind != "" && kind != "anon_inode:bpf-map" {
		if err == nil {
			err = ErrNotPerfEventArray
		}
		return nil, fmt.Errorf("new perf buffer: fd %d is not a BPF map (%s): %w", fd, kind, err)
	}
	if err != nil {
		return nil, fmt.Errorf("new perf buffer: map fd %d: get map info: %w", fd, err)
	}
	if info.typ != mapTypePerfEventArray {
		return nil, fmt.Errorf("new perf buffer: map %q has type %s (%d): %w",
			info.name, mapTypeName(info.typ), info.typ, ErrNotPerfEventArray)
	}
	cpus, err := ringCPUs(info.maxEntries)
	if err != nil {
		return nil, fmt.Errorf("new perf buffer: %w", err)
	}
	if !claimMap(info.id) {
		return nil, fmt.Errorf("new perf buffer: map %q (id %d): %w", info.name, info.id, ErrMapInUse)
	}

	pb := &PerfBuffer{
		mapID:  info.id,
		cpus:   cpus,
		sample: opts.SampleFunc,
		lost:   opts.LostFunc,
		pend:   make([]pending, len(cpus)),
		stats:  make([]cpuCounters, len(cpus)),
		all:    make([]int32, len(cpus)),
		held:   make([]atomic.Bool, len(cpus)),
		idxBuf: make([]int32, 0, len(cpus)),
	}
	for i := range pb.all {
		pb.all[i] = int32(i)
	}
	pb.life.free = pb.free
	wakeup := opts.WakeupEvents
	if wakeup == 0 {
		wakeup = 1
	}
	ringBytes := pages * os.Getpagesize()
	arenaCap, reserve := arenaSize(ringBytes)
	pb.c, err = openC(fd, pages, wakeup, opts.WakeupBytes, cpus, arenaCap, reserve)
	if err != nil {
		pb.free()
		return nil, fmt.Errorf("new perf buffer: %w", err)
	}
	if n := pb.c.bufferCount(); n != len(cpus) {
		pb.free()
		return nil, fmt.Errorf("new perf buffer: libbpf opened %d rings for %d cpus", n, len(cpus))
	}
	fds := make([]int, len(cpus))
	for i := range fds {
		fds[i] = pb.c.bufferFD(i)
	}
	if pb.w, err = newWaiter(fds); err != nil {
		pb.free()
		return nil, fmt.Errorf("new perf buffer: %w", err)
	}
	return pb, nil
}

// validate checks the options and returns the page count to use.
func (o *Options) validate(pageSize int) (int, error) {
	pages := o.PageCount
	if pages == 0 {
		pages = DefaultPageCount
	}
	if pages < 0 || pages&(pages-1) != 0 {
		return 0, fmt.Errorf("page count %d is not a power of two: %w", o.PageCount, ErrInvalidOptions)
	}
	// Checked before anything computes with the ring size, which would
	// overflow: the ring and its header page must fit in a mapping.
	if pages > maxRingBytes/pageSize {
		return 0, fmt.Errorf("page count %d too large: a ring holds at most %d bytes: %w", o.PageCount, maxRingBytes, ErrInvalidOptions)
	}
	ringBytes := pages * pageSize
	// perf_event_attr.wakeup_events is a u32 that the kernel compares as
	// an int: beyond MaxInt32 it would wake on every sample.
	if o.WakeupEvents < 0 || o.WakeupEvents > math.MaxInt32 {
		return 0, fmt.Errorf("wakeup events %d outside [0, %d]: %w", o.WakeupEvents, math.MaxInt32, ErrInvalidOptions)
	}
	if o.WakeupBytes < 0 || o.WakeupBytes >= ringBytes || o.WakeupBytes > math.MaxUint32 { // a u32
		return 0, fmt.Errorf("wakeup bytes %d outside [0, %d): %w", o.WakeupBytes, ringBytes, ErrInvalidOptions)
	}
	if o.WakeupBytes > 0 && o.WakeupEvents > 1 {
		return 0, fmt.Errorf("wakeup bytes and wakeup events both set: %w", ErrInvalidOptions)
	}
	if o.MaxSampleSize < 0 {
		return 0, fmt.Errorf("max sample size %d is negative: %w", o.MaxSampleSize, ErrInvalidOptions)
	}
	if o.MaxSampleSize > 0 {
		need := SampleRecordSize(min(o.MaxSampleSize, maxRecordSize)) // (no overflow)
		// The kernel keeps one record slot free (CIRC_SPACE leaves a
		// byte, and records are 8-aligned), and a record's size is a u16.
		// Once a sample is lost, perf_output_begin writes the pending lost
		// record in the same reservation as the next sample: a sample that
		// fits only without it would be lost again and again, into an
		// empty ring too, and the lost count would never arrive.
		room := ringBytes - 8 - lostRecordSize
		if need > room || need > maxRecordSize {
			return 0, fmt.Errorf("max sample size %d needs a %d-byte record, ring holds %d beside a lost record (limit %d): %w",
				o.MaxSampleSize, need, room, maxRecordSize, ErrSampleTooLarge)
		}
	}
	return pages, nil
}

// maxRingBytes bounds a ring's data area: far above what a kernel maps
// (perf's ring buffer keeps a page array of at most a few MiB), and low
// enough that no size computed from it overflows an int.
const maxRingBytes = 1 << 40

// maxRecordSize is the largest record perf_event_header.size (a u16) holds,
// rounded down to the 8-byte alignment of records.
const maxRecordSize = 65528

// lostRecordSize is the size of the kernel's PERF_RECORD_LOST for a BPF
// output event: perf_event_header, u64 id, u64 lost (libbpf does not set
// sample_id_all, which would append the sample id fields).
const lostRecordSize = 24

// SampleRecordSize is the ring space a sample of n bytes takes: the 8-byte
// perf_event_header, the u32 raw size, and the data padded to 8 bytes.
func SampleRecordSize(n int) int {
	return 8 + (n+4+7)&^7
}

// arenaBatch is how many bytes of entries a C-to-Go crossing carries at
// least. Larger batches save crossings (~100 ns each) but push the ring and
// the arena out of the CPU's caches; the benchmarks chose this one.
var arenaBatch = 64 << 10

// arenaSize returns the arena's size and the room it keeps for one more
// record: the entry of the largest record a ring of ringBytes can hold.
func arenaSize(ringBytes int) (size, reserve int) {
	reserve = min(ringBytes, maxRecordSize) + arenaEntryHdr
	return max(arenaBatch, reserve) + reserve, reserve
}

// ringCPUs mirrors perf_buffer__new's choice of CPUs: the online ones among
// the first min(possible CPUs, max_entries). Buffer index i reads cpus[i].
func ringCPUs(maxEntries uint32) ([]int32, error) {
	online, err := cpus.Online()
	if err != nil {
		return nil, err
	}
	possible, err := cpus.Possible()
	if err != nil {
		return nil, err
	}
	limit := len(possible)
	if possible := maxCPU(possible) + 1; possible > limit {
		limit = possible // libbpf counts possible CPUs as the highest + 1
	}
	if int(maxEntries) < limit {
		limit = int(maxEntries)
	}
	var ring []int32
	for _, cpu := range online {
		if cpu < limit {
			ring = append(ring, int32(cpu))
		}
	}
	if len(ring) == 0 {
		return nil, fmt.Errorf("no online cpu below map max_entries %d: %w", maxEntries, ErrInvalidOptions)
	}
	return ring, nil
}

func maxCPU(cpus []int) int {
	m := -1
	for _, c := range cpus {
		m = max(m, c)
	}
	return m
}

// Close stops the perf buffer: blocked Polls return an error matching
// os.ErrClosed, and the rings, their mappings and descriptors are freed as
// soon as no call is in progress and every RawBuffer is released (at once if
// so). Later calls fail with os.ErrClosed. Close is idempotent and returns
// nil.
//
// Delivery stops with Close: called from SampleFunc or LostFunc, that call is
// the last; called from another goroutine, only a callback already running
// there may still return. Samples still in the rings are discarded: to stop
// without losing them, call Consume before Close.
func (pb *PerfBuffer) Close() error {
	pb.life.close(func() { pb.w.wake() })
	return nil
}

// free releases everything; called once, by lifetime or before the buffer
// is shared.
func (pb *PerfBuffer) free() {
	if pb.c != nil {
		pb.c.close() // perf_buffer__free clears the map's slots
		pb.c = nil
	}
	if pb.w != nil {
		pb.w.close()
	}
	unclaimMap(pb.mapID) // after the slots are cleared: a new reader's stay
}

// claims holds the IDs of the maps that PerfBuffers of this process read,
// from New until free.
var claims struct {
	sync.Mutex
	ids map[uint32]bool
}

// claimMap claims map id for a new PerfBuffer; it reports false if another
// holds it.
func claimMap(id uint32) bool {
	claims.Lock()
	defer claims.Unlock()
	if claims.ids[id] {
		return false
	}
	if claims.ids == nil {
		claims.ids = make(map[uint32]bool)
	}
	claims.ids[id] = true
	return true
}

func unclaimMap(id uint32) {
	claims.Lock()
	delete(claims.ids, id)
	claims.Unlock()
}

// Poll waits up to timeout for rings to become ready, drains the ready ones
// and returns the number of samples delivered (libbpf's perf_buffer__poll
// returns a count of rings instead). A negative timeout waits until a ring
// is ready or Close is called; zero does not wait. A timeout with nothing
// ready returns 0 and no error.
//
// Poll waits on its own epoll set, so do not also wait on EpollFD: the
// kernel reports a ring's readiness to whichever waiter looks first.
//
// Errors: os.ErrClosed (wrapped) once Close is called, also for a Poll that
// was blocked when it was; ErrReentrant (see PerfBuffer); a syscall.Errno
// from epoll or libbpf.
func (pb *PerfBuffer) Poll(timeout time.Duration) (int, error) {
	const op = "poll perf buffer"
	if err := pb.life.enter(op); err != nil {
		return 0, err
	}
	defer pb.life.exit()

	if pb.cut.Swap(false) {
		return pb.drain(op, pb.all) // see cut
	}
	// From inside a callback, fail before waiting rather than after.
	if err := pb.lockDrain(); err != nil {
		return 0, fmt.Errorf("%s: %w", op, err)
	}
	pb.drainMu.Unlock()
	s := scratchPool.Get().(*pollScratch)
	defer scratchPool.Put(s)
	nev, err := pb.w.wait(s.evs[:], timeout)
	if err != nil {
		return 0, fmt.Errorf("%s: %w", op, err)
	}
	if pb.life.closed() {
		return 0, fmt.Errorf("%s: %w", op, os.ErrClosed)
	}
	idxs := s.idx[:0]
	for _, ev := range s.evs[:nev] {
		if ev.Fd != wakeTag {
			idxs = append(idxs, ev.Fd)
		}
	}
	return pb.drain(op, idxs)
}

const maxEvents = 64

// pollScratch is Poll's per-call memory, pooled so that Poll does not
// allocate and concurrent Polls do not share it.
type pollScratch struct {
	evs [maxEvents]unix.EpollEvent
	idx [maxEvents]int32
}

var scratchPool = sync.Pool{New: func() any { return new(pollScratch) }}

// Consume drains every ring without waiting and returns the number of
// samples delivered (perf_buffer__consume). Errors: os.ErrClosed (wrapped)
// after Close; ErrReentrant (see PerfBuffer); a syscall.Errno from libbpf.
func (pb *PerfBuffer) Consume() (int, error) {
	const op = "consume perf buffer"
	if err := pb.life.enter(op); err != nil {
		return 0, err
	}
	defer pb.life.exit()
	return pb.drain(op, pb.all)
}

// ConsumeBuffer drains ring i without waiting and returns the number of
// samples delivered (perf_buffer__consume_buffer). Errors: ErrIndex,
// os.ErrClosed (wrapped) after Close; ErrReentrant (see PerfBuffer); a
// syscall.Errno from libbpf.
func (pb *PerfBuffer) ConsumeBuffer(i int) (int, error) {
	op := fmt.Sprintf("consume perf buffer %d", i)
	if err := pb.checkIndex(i); err != nil {
		return 0, fmt.Errorf("%s: %w", op, err)
	}
	if err := pb.life.enter(op); err != nil {
		return 0, err
	}
	defer pb.life.exit()
	if pb.held[i].Load() {
		return 0, fmt.Errorf("%s: %w", op, ErrBusy)
	}
	return pb.drain(op, pb.all[i:i+1])
}

// BufferCount returns the number of rings (perf_buffer__buffer_cnt): one per
// CPU chosen at New. It stays valid after Close.
func (pb *PerfBuffer) BufferCount() int { return len(pb.cpus) }

// CPU returns the CPU behind buffer index i. Indexes are not CPU numbers:
// like libbpf, New skips offline CPUs and CPUs beyond the map's max_entries.
// Errors: ErrIndex.
func (pb *PerfBuffer) CPU(i int) (int, error) {
	if err := pb.checkIndex(i); err != nil {
		return 0, fmt.Errorf("cpu of perf buffer %d: %w", i, err)
	}
	return int(pb.cpus[i]), nil
}

// BufferFD returns ring i's perf event descriptor
// (perf_buffer__buffer_fd). It belongs to the PerfBuffer: do not close it.
// Errors: ErrIndex, os.ErrClosed (wrapped).
func (pb *PerfBuffer) BufferFD(i int) (int, error) {
	op := fmt.Sprintf("fd of perf buffer %d", i)
	if err := pb.checkIndex(i); err != nil {
		return -1, fmt.Errorf("%s: %w", op, err)
	}
	if err := pb.life.enter(op); err != nil {
		return -1, err
	}
	defer pb.life.exit()
	return pb.c.bufferFD(i), nil
}

// EpollFD returns libbpf's epoll descriptor over all rings
// (perf_buffer__epoll_fd), for callers that wait in their own event loop and
// then call Consume. It belongs to the PerfBuffer: do not close it. Errors:
// os.ErrClosed (wrapped).
func (pb *PerfBuffer) EpollFD() (int, error) {
	const op = "epoll fd of perf buffer"
	if err := pb.life.enter(op); err != nil {
		return -1, err
	}
	defer pb.life.exit()
	return pb.c.epollFD(), nil
}

// Stats returns per-CPU counts, in buffer index order. It may be called
// from any goroutine, also after Close.
func (pb *PerfBuffer) Stats() []CPUStats {
	out := make([]CPUStats, len(pb.cpus))
	for i := range out {
		st := &pb.stats[i]
		out[i] = CPUStats{
			CPU:     int(pb.cpus[i]),
			Samples: st.samples.Load(),
			Bytes:   st.bytes.Load(),
			Lost:    st.lost.Load(),
			Other:   st.other.Load(),
			Corrupt: st.corrupt.Load(),
		}
	}
	return out
}

func (pb *PerfBuffer) checkIndex(i int) error {
	if i < 0 || i >= len(pb.cpus) {
		return fmt.Errorf("index %d not in [0, %d): %w", i, len(pb.cpus), ErrIndex)
	}
	return nil
}

// drain consumes the rings idxs into the arena and delivers each batch.
// Drains are serialised; the caller holds a user reference (enter).
func (pb *PerfBuffer) drain(op string, idxs []int32) (int, error) {
	if err := pb.lockDrain(); err != nil {
		return 0, fmt.Errorf("%s: %w", op, err)
	}
	defer pb.drainMu.Unlock()
	defer pb.publish()
	done := false
	defer func() {
		if !done {
			pb.cut.Store(true) // a panic or an error: see cut
		}
	}()

	// Samples left in the arena by a SampleFunc that panicked come first:
	// the C side empties the arena when it fills it again.
	n := pb.batch.deliver(pb)
	if pb.nheld.Load() > 0 {
		idxs = pb.unheld(idxs)
	}
	for pos := 0; pos < len(idxs); {
		if pb.life.closed() {
			break // Close was called from a callback: stop after the batch
		}
		used, next, err := pb.c.drain(idxs, pos)
		pb.batch = batch{buf: pb.c.arena[:used]}
		n += pb.batch.deliver(pb)
		if err != nil {
			return n, fmt.Errorf("%s: ring %d: %w", op, idxs[next-1], err)
		}
		pos = next
	}
	done = true
	return n, nil
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

// unheld returns idxs without the rings that RawBuffers hold, in idxBuf.
func (pb *PerfBuffer) unheld(idxs []int32) []int32 {
	out := pb.idxBuf[:0]
	for _, i := range idxs {
		if !pb.held[i].Load() {
			out = append(out, i)
		}
	}
	return out
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
// Errors: ErrIndex, ErrBusy if a RawBuffer holds ring i already,
// os.ErrClosed (wrapped), ErrReentrant, a syscall.Errno from libbpf.
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
	rb, err := pb.openRaw(i)
	if err != nil {
		pb.life.exit()
		return nil, fmt.Errorf("%s: %w", op, err)
	}
	pb.held[i].Store(true)
	pb.nheld.Add(1)
	return rb, nil
}

func (pb *PerfBuffer) openRaw(i int) (*RawBuffer, error) {
	if pb.held[i].Load() {
		return nil, ErrBusy
	}
	base, size, err := pb.c.ring(i)
	if err != nil {
		return nil, err
	}
	rb, err := newRawBuffer(int(pb.cpus[i]), base, size)
	if err != nil {
		return nil, err
	}
	rb.owner, rb.idx = pb, i
	return rb, nil
}

// release ends RawBuffer i's hold (RawBuffer.Release). It takes no lock: a
// drain in progress (the SampleFunc that calls it, say) has its list of
// rings already, without ring i; the next drain takes the ring again.
func (pb *PerfBuffer) release(i int) {
	if !pb.held[i].Swap(false) {
		panic(fmt.Sprintf("perfbuf: release of ring %d, which no RawBuffer holds", i))
	}
	pb.nheld.Add(-1)
	pb.life.exit()
}

// publish moves the drainer's pending counts into the shared stats, once per
// drain rather than with an atomic add per sample.
func (pb *PerfBuffer) publish() {
	for i := range pb.pend {
		p := &pb.pend[i]
		if *p == (pending{}) {
			continue
		}
		st := &pb.stats[i]
		st.samples.Add(p.samples)
		st.bytes.Add(p.bytes)
		st.lost.Add(p.lost)
		st.other.Add(p.other)
		st.corrupt.Add(p.corrupt)
		*p = pending{}
	}
}

// Arena entries, written by perfbuf_on_event in perfbuf_helpers.c: a u32
// payload size (or a marker) and a u32 buffer index, in native byte order,
// then the payload padded to 8 bytes. A marker's payload is a u64: the lost
// count for arenaEntryLost; for arenaEntryOther, a record of another type
// (skipped), that type; for arenaEntryBad, a record too short for what it
// says it holds (skipped), its size. perfbuf_cgo.go checks these against the
// C definitions at compile time.
const (
	arenaEntryHdr   = 8
	arenaEntryLost  = 0xffffffff
	arenaEntryOther = 0xfffffffe
	arenaEntryBad   = 0xfffffffd
)

// batch is the part of the arena not yet delivered.
type batch struct {
	buf []byte
	off int
}

// deliver hands every entry from off on to the callbacks and returns the
// number of samples. off moves past an entry before its callback runs, so a
// panicking callback leaves the rest for the next call and nothing is
// delivered twice. A callback that calls Close ends the delivery: no
// callback runs after Close has returned on this goroutine.
func (b *batch) deliver(pb *PerfBuffer) int {
	n := 0
	buf, pend, cpus := b.buf, pb.pend, pb.cpus
	sampleFn, lostFn := pb.sample, pb.lost
	for off := b.off; off+arenaEntryHdr <= len(buf); off = b.off {
		size := binary.NativeEndian.Uint32(buf[off:])
		idx := binary.NativeEndian.Uint32(buf[off+4:])
		start := off + arenaEntryHdr
		p := &pend[idx]
		if size >= arenaEntryBad { // a marker
			v := binary.NativeEndian.Uint64(buf[start:])
			b.off = start + 8
			switch size {
			case arenaEntryLost:
				p.lost += v
				if lostFn != nil {
					lostFn(int(cpus[idx]), v)
					if pb.life.closed() {
						return n
					}
				}
			case arenaEntryOther:
				p.other++
			default:
				p.corrupt++
			}
			continue
		}
		end := start + int(size)
		data := buf[start:end:end]
		b.off = start + int((size+7)&^7)
		p.samples++
		p.bytes += uint64(size)
		n++
		if sampleFn != nil {
			sampleFn(int(cpus[idx]), data)
			if pb.life.closed() {
				return n
			}
		}
	}
	return n
}

// fdKind returns what fd refers to as /proc/self/fd shows it
// ("anon_inode:bpf-map", "anon_inode:bpf-prog", "/dev/null"), or "" when
// /proc cannot tell.
func fdKind(fd int) string {
	kind, err := os.Readlink("/proc/self/fd/" + strconv.Itoa(fd))
	if err != nil {
		return ""
	}
	return kind
}

// BPF map types New reports by name (from include/uapi/linux/bpf.h).
const mapTypePerfEventArray = 4

type mapDesc struct {
	id         uint32 // the kernel's map ID: one per map, whatever the fd
	typ        uint32
	maxEntries uint32
	name       string
}
