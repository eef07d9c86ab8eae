// SPDX-License-Identifier: Apache-2.0

// Package owner owns the rings a perfbuf reader reads, below the public
// types: it opens them (a perf event array's per-CPU rings: perfarray.go,
// perfopen.go; BPF ring buffers: ringbufmaps.go, takeover.go), checks the
// maps and the ring settings (maps.go, config.go), claims a map for one
// reader in this process, keeps the failure map and its cross-process
// reader key (failuremap.go, presence.go), pauses (pause.go), counts
// (counts.go, stats.go), and closes (owner.go); and it runs each mode's
// reads (reader.go, readwait.go, readcopy.go, readloop.go; callback.go;
// raw.go; recorder.go). The root package holds the public types and
// delegates to it. libbpf's opener comes from the root's one cgo file
// (OpenLibbpf), so that no import points up.
package owner

// The owner core, written once for Reader, PerfBuffer and Raw: opening the rings
// (and those of CPUs that come online), the lifetime and Close protocol,
// the wait, the failure map, Stats. What it delivers and how is its
// policy's (internal/policy); the public types on top say when.

import (
	"fmt"
	"os"
	"runtime"
	"sync/atomic"
	"time"

	"github.com/perfbuf/perfbuf/internal/kernel"
	"github.com/perfbuf/perfbuf/internal/policy"
	"github.com/perfbuf/perfbuf/internal/ring"
	"github.com/perfbuf/perfbuf/internal/wait"
)

// Core owns the rings of one map for its Reader, PerfBuffer or Raw.
type Core struct {
	policy.Set               // the rings and what the policy shares
	src        source        // what opened the rings: Open's, or Over's given
	W          *wait.Waiter  // the wait on every ring, woken by Close
	Life       wait.Lifetime // calls in progress; the last one out after Close frees
	pol        policy.Policy
	fds        []int // the descriptor a wait polls for ring i; grows under StatsMu
	// kinds[i] is Rings[i] as its owner sees it (waited on, counted at
	// Close, viewed raw); the policies see only its ring.Ring. It grows
	// with Rings, under StatsMu.
	Kinds []ring.Kind
	// newCPUs, if set, is the CPU watch's flag of CPUs that came online
	// (hotplug.go), or over ring buffers the takeover's of rings whose
	// consumer lock it won (ringbufmaps.go): the reads' check of it is one
	// load, no call.
	newCPUs *atomic.Bool
	// holdBack: a Reader of ring buffers within a latency budget holds
	// a record back in each ring buffer (ring.RingBuf.HoldBack), so that
	// the programs raise no wakeup while records keep coming (see
	// holdBackRingBufs). addRing sets it on the rings added later.
	holdBack bool
	// progs are Options.Programs, whose skipped runs Stats adds; nil for
	// none. Closed with the rings.
	progs *programs
	// what names what is read, for errors (see name).
	what string
	// pause is Pause's state (pause.go); a perf event array's rings
	// take its lock to add a CPU's ring.
	pause pauser
	// countsLost says that the perf rings' events were opened with the
	// kernel's count of what they refused (kernel.PerfConfig.CountLost):
	// Stats and Close read it (refused). Set by Open.
	countsLost bool
	// viewLost[i] is what ring i's lost records reported to RawBuffers,
	// counted in their own Stats, not here; added at their Release, under
	// StatsMu. Close tells by it what the kernel has yet to report.
	viewLost []uint64
}

// source is what opened an owner's rings, and what of them is its kind's:
// a perf event array's rings (perfarray.go), or a BPF ring buffer map's
// (ringbufmaps.go).
type source interface {
	// opened returns the rings opened, with the descriptor a wait polls
	// for each.
	opened() ([]ring.Kind, []int)
	// addNew opens the rings of CPUs that came online (a perf event
	// array's; see newCPUs) and calls add with each.
	addNew(add func(rb ring.Kind, fd int) error) error
	// epollFD is an epoll set over every ring, for a caller's own loop.
	epollFD() (int, error)
	// unlink stops new output into the rings, as far as the kind can,
	// and waits for output in progress: what is in them is then final.
	unlink()
	// close frees everything; failureCounters is the failure map, or nil.
	close()
	failureCounters() *failureMap
	// oneWriter reports whether one CPU alone writes ring i (an ordered
	// reader's rule 1: policy.WindowConfig).
	oneWriter(i int) bool
}

// Open opens the rings of the map m (a perf event array: a ring on
// every online CPU; a BPF ring buffer: its one ring; an array of maps: its
// inner ring buffers'), and of the further ring buffers more, with the
// ring settings ro (whose fields were checked), the failure map failures
// (nil for none) and the producing programs' descriptors progs (see
// openPrograms). The settings that depend on the kind of map are checked
// against the maps before anything is claimed or mapped (checks.go).
// Errors: as NewReader's.
func Open(m Map, ro RingOptions, more []Map, failures Map, progs []int) (_ *Core, err error) {
	// The caller's maps stay reachable until their descriptors are
	// duplicated: a *ebpf.Map's finalizer would close its descriptor, and
	// another object could take the number, during the call.
	defer runtime.KeepAlive(failures)
	defer runtime.KeepAlive(more)
	defer runtime.KeepAlive(m)
	if m == nil {
		return nil, fmt.Errorf("nil map: %w", os.ErrInvalid)
	}
	fd := m.FileDescriptor()
	info, err := checkMap(fd)
	if err != nil {
		return nil, err
	}
	if err := ro.checkPrepared(info); err != nil {
		return nil, err
	}
	ps, err := openPrograms(progs)
	if err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			ps.close()
		}
	}()
	var src source
	switch {
	case info.typ != mapTypePerfEventArray:
		maps := []mapArg{{fd, info}}
		for i, mm := range more {
			fd := mm.FileDescriptor()
			info, err := checkMap(fd)
			if err != nil {
				return nil, fmt.Errorf("options Maps[%d]: %w", i, err)
			}
			maps = append(maps, mapArg{fd, info})
		}
		src, err = openRingBufs(maps, ro, failures)
	case len(more) > 0:
		return nil, fmt.Errorf("options Maps with %v, which is read alone: %w", info, os.ErrInvalid)
	default:
		cfg, cfgErr := ro.HostConfig()
		if cfgErr != nil {
			return nil, fmt.Errorf("%v: %w", info, cfgErr)
		}
		src, err = openRings(fd, info, pinPath(m), cfg, failures)
	}
	if err != nil {
		return nil, err
	}
	c, err := newCore(src.opened())
	if err != nil {
		src.close()
		return nil, err
	}
	c.src, c.progs = src, ps
	if r, ok := src.(*rings); ok {
		c.countsLost = r.cfg.kernel().CountLost
	}
	c.what = describeMaps(info, len(more))
	return c, nil
}

// newCore builds a core over rings, woken when fds[i] (ring i's perf event)
// is readable. It does not close what it was given if it fails.
func newCore(rings []ring.Kind, fds []int) (*Core, error) {
	c := &Core{}
	c.pause.grace = kernel.WaitWriters
	w, err := wait.New()
	if err != nil {
		return nil, err
	}
	c.W = w
	for i, rb := range rings {
		if err := c.addRing(rb, fds[i]); err != nil {
			w.Close()
			return nil, err
		}
	}
	return c, nil
}

// start puts c to work with its policy, pol, whose owner runs callbacks in
// scope (internal/wait), and starts watching for CPUs that come online.
func (c *Core) start(pol policy.Policy, scope wait.Scope) {
	c.pol = pol
	c.Life.Free = c.free
	c.Life.Scope = scope
	if r, ok := c.src.(*rings); ok {
		r.pause = &c.pause
	}
	if r, ok := c.src.(*rings); ok && r.watch != nil {
		c.newCPUs = &r.watch.Pending
		r.watch.Notify = c.poke
		r.watch.Start()
	}
	if s, ok := c.src.(*ringBufSource); ok && s.tk.waiting() {
		c.newCPUs = &s.tk.Pending
		s.tk.notify = c.poke
		s.tk.start()
	}
}

// addRing adds rb, whose perf event is fd, to the set, the wait, the
// policy and the owner.
func (c *Core) addRing(rb ring.Kind, fd int) error {
	if err := c.W.AddRing(rb, fd); err != nil {
		return err
	}
	// What a ring buffer holds at opening: a pinned one opened again goes
	// on from the consumer position in its map, which the last reader
	// left (Stats.Found). A perf ring is new, so empty.
	var found uint64
	if b, ok := rb.(*ring.RingBuf); ok {
		samples, _, discarded := b.Left(b.Cur().Tail())
		found = samples + discarded
	}
	if b, ok := rb.(*ring.RingBuf); ok {
		b.HoldBack = c.holdBack // (before the ring is read)
	}
	c.Push(rb)
	c.StatsMu.Lock()
	c.fds = append(c.fds, fd)
	c.Kinds = append(c.Kinds, rb)
	i := len(c.Rings) - 1
	c.Tallies[i].Found = found
	c.StatsMu.Unlock()
	if c.pol != nil {
		c.pol.AddRing(i)
	}
	return nil
}

// readsNow reports whether a read in line may take a record at once: no
// corruption to report and no CPUs to add. A read that finds otherwise
// leaves both to ReadBatch's loop. On the read side, under the owner's
// drain lock.
func (c *Core) readsNow() bool {
	return c.Corrupt == nil && !c.pending()
}

// addNewCPUs gives the CPUs that came online since the last call their
// rings (hotplug.go): a check of one atomic when none did. On the read
// side, under the owner's drain lock.
func (c *Core) addNewCPUs() error {
	if c.newCPUs == nil || !c.newCPUs.Load() { // (pending's, written out: as a call it puts addNewCPUs over the inliner's budget, 81 of 80)
		return nil
	}
	return c.addNew() // (out of line: the check inlines into every read)
}

// pending reports whether rings wait to be added (addNewCPUs): a CPU that
// came online, or a ring buffer's takeover won.
func (c *Core) pending() bool { return c.newCPUs != nil && c.newCPUs.Load() }

// addNew is addNewCPUs past its check.
//
//go:noinline (so that addNewCPUs inlines)
func (c *Core) addNew() error { return c.src.addNew(c.addRing) }

// Count returns the number of rings; any goroutine may call it.
func (c *Core) Count() int {
	c.StatsMu.Lock()
	defer c.StatsMu.Unlock()
	return len(c.Rings)
}

// Wakeups counts the blocked waits that a ring's wakeup ended.
func (c *Core) Wakeups() uint64 { return c.W.Wakeups() }

// fd returns the descriptor a wait polls for ring i (its perf event, or its
// ring buffer map), i < count().
func (c *Core) fd(i int) int {
	c.StatsMu.Lock()
	defer c.StatsMu.Unlock()
	return c.fds[i]
}

// checkIndex checks a buffer index.
func (c *Core) checkIndex(i int) error {
	if n := c.Count(); i < 0 || i >= n {
		return fmt.Errorf("index %d not in [0, %d): %w", i, n, os.ErrInvalid)
	}
	return nil
}

// BufferFD is the owners' BufferFD: ring i's descriptor that a wait polls.
func (c *Core) BufferFD(i int) (int, error) {
	op := fmt.Sprintf("fd of ring %d of %s", i, c.Name())
	if err := c.checkIndex(i); err != nil {
		return -1, wrap(op, err)
	}
	if err := c.Life.Enter(op); err != nil {
		return -1, err
	}
	defer c.Life.Exit()
	return c.fd(i), nil
}

// EpollFD is the owners' EpollFD: an epoll set over every ring.
func (c *Core) EpollFD() (int, error) {
	op := "epoll fd of " + c.Name()
	if err := c.Life.Enter(op); err != nil {
		return -1, err
	}
	defer c.Life.Exit()
	return c.src.epollFD()
}

// poke wakes a blocked wait (see wait.Waiter.WakeOpen): a CPU came online, a
// context was cancelled, a deadline or a flush was set.
func (c *Core) poke() { c.W.WakeOpen(&c.Life) }

// Close stops the owner: the rings' loops stop after the record in
// progress, blocked waits return, and free runs once no call is in
// progress.
func (c *Core) Close() {
	// A read's own function that closes asks for no more records; a Close
	// from outside hands the held copies over. Stored before the lifetime
	// is marked closed: a read that finds it closed reads HandOver at once
	// (Reader.closed), and found false, while wake was still to run here,
	// left an ordered window's copies undelivered.
	if !c.Life.Closed() {
		c.HandOver.Store(!wait.Reads.Inside())
	}
	c.Life.Close(func() {
		c.Stop.Store(true)
		c.W.Wake(true)
	})
}

// free commits what was delivered, takes the rings out of the map and
// waits for the outputs already running into them (rings.unlink), counts
// what is left in them, and what a perf ring refused that no lost record
// reported (refused), then frees everything. Called once, by lifetime,
// when no call is in progress.
func (c *Core) free() {
	for i := range c.Rings {
		c.pol.CommitPublish(i)
	}
	c.releaseHeld() // the next reader of a ring starts after its last record delivered
	c.src.unlink()
	c.StatsMu.Lock()
	held, _ := c.pol.(policy.Holder)
	for i, rb := range c.Kinds {
		samples, lost, discarded := rb.Left(c.pol.Oldest(i))
		if held != nil {
			samples += held.Held(i) // taken from the ring, never delivered
		}
		c.Tallies[i].Left += samples
		c.Tallies[i].Lost += lost
		c.Tallies[i].Discarded += discarded
		if n, ok := c.refused(rb, c.fds[i]); ok {
			// The losses reported are counted here (delivered, left) or
			// in a RawBuffer's Stats; the rest the kernel never reported.
			reported := c.Tallies[i].Lost
			if i < len(c.viewLost) {
				reported += c.viewLost[i]
			}
			if n > reported {
				c.Tallies[i].Lost += n - reported
			}
		}
	}
	c.StatsMu.Unlock()
	c.src.close()
	c.progs.close()
	c.W.Close()
}

// holdBackRingBufs sets whether a Reader of ring buffers, with the ring
// settings ro and the latency budget latency, holds records back
// (holdBack). The kernel wakes a ring buffer's reader for a record
// committed at consumer_pos, that is for the first one after the reader
// caught up, unless the programs say otherwise (BPF_RB_NO_WAKEUP,
// BPF_RB_FORCE_WAKEUP). Within a budget (RingOptions.Budget, or WakeupBytes,
// at which the programs force a wakeup, with a MaxLatency) the reader
// that catches up stores consumer_pos at the start of the last record it
// delivered, not past it, and looks again when the budget's time is up:
// the records that come meanwhile raise no wakeup. A look that finds
// nothing new stores the tail (ring.RingBuf.Settle) and waits for the
// next record's wakeup. So a trickle costs the programs a wakeup a quiet
// spell, and a steady stream none, at a timer's wakeup of the reader a
// budget. A burst is seen only at the budget's end unless the programs
// force a wakeup: a ring must hold what they write in a budget at their
// peak rate.
func (c *Core) holdBackRingBufs(ro RingOptions, latency time.Duration) {
	c.holdBack = latency > 0 && (ro.Budget || ro.WakeupBytes > 0)
	for _, rb := range c.Kinds {
		if b, ok := rb.(*ring.RingBuf); ok {
			b.HoldBack = c.holdBack
		}
	}
}

// releaseHeld stores the tail of every ring buffer that holds a record
// back (ring.RingBuf.Release), so that the next record wakes the reader.
// The caller owns the rings' read side.
func (c *Core) releaseHeld() {
	if !c.holdBack {
		return
	}
	for _, rb := range c.Kinds {
		if b, ok := rb.(*ring.RingBuf); ok {
			b.Release()
		}
	}
}

// settled reports whether every ring but those skip names (nil: none) may
// be slept on: its kind's wake rule holds for what the reader left in it
// (ring.settle). The caller owns the rings' read side.
func (c *Core) settled(skip func(i int) bool) bool {
	for i, rb := range c.Kinds {
		if (skip == nil || !skip(i)) && !rb.Settle() {
			return false
		}
	}
	return true
}

// describeMaps names what a reader of the map info describes, and of more
// maps beside it (Options.Maps), reads: `perf event array "events"`,
// `ring buffer "events"`, `ring buffer "a" and 2 more maps`.
func describeMaps(info mapDesc, more int) string {
	if more == 0 {
		return info.String()
	}
	return fmt.Sprintf("%v and %d more maps", info, more)
}

// Name names what c reads, for errors: describeMaps', or "rings" over
// rings given without a name (Over).
func (c *Core) Name() string {
	if c.what == "" {
		return "rings"
	}
	return c.what
}

// refused returns how many outputs the perf ring rb, whose event is fd,
// refused since it opened (full or paused), whether its lost records
// reported them yet or not: the kernel's count (kernel.LostSamples). ok is
// false for a ring buffer, and for a perf ring opened without the count
// (kernels before 6.0, or rings given whole: Over), whose losses are only
// those its lost records report. The count is at least what the lost records delivered and in
// the ring report, and the difference is what the kernel has yet to
// report: Lost is the larger of the two.
func (c *Core) refused(rb ring.Kind, fd int) (uint64, bool) {
	if _, perf := rb.(*ring.Perf); !perf || !c.countsLost {
		return 0, false
	}
	n, ok, err := kernel.LostSamples(fd)
	return n, ok && err == nil
}

// SetPaused is the owners' Pause (on) and Resume: see pauser.set. After
// Close, os.ErrClosed.
func (c *Core) SetPaused(op string, on bool) error {
	return c.pause.set(op, on, func(change func(pauseTarget) error) error {
		if err := c.Life.Enter(op); err != nil {
			return err
		}
		defer c.Life.Exit()
		var t pauseTarget
		t.f = c.src.failureCounters()
		if r, ok := c.src.(*rings); ok {
			t.perfFDs = r.eventFDs
		}
		return wrap(op, change(t))
	})
}

// Over returns an owner of rings opened elsewhere and handed over whole:
// ring i is woken when fds[i] is readable; what names them in errors
// ("" : "rings"); oneWriter[i] says that one CPU alone writes ring i (an
// ordered reader's rule 1: policy.WindowConfig). No ring is added later,
// none is unlinked or freed at Close (their opener frees them), and there
// is no failure map.
func Over(rings []ring.Kind, fds []int, what string, oneWriter []bool) (*Core, error) {
	g := &given{rings: rings, fds: fds, one: oneWriter}
	c, err := newCore(g.opened())
	if err != nil {
		return nil, err
	}
	c.src, c.what = g, what
	return c, nil
}
