// SPDX-License-Identifier: Apache-2.0

package owner

// Opening the rings of a perf event array: the checks on the map, the claim
// that makes one reader per map in this process, the perf events
// (perfopen.go: libbpf's perf_buffer, or perfbuf's own opener where
// libbpf refuses), the ring kind over each ring's memory (internal/ring),
// the CPUs that get a ring (ringCPUs) and those that come online later.
// The owner core (owner.go) owns a rings.

import (
	"errors"
	"fmt"
	"os"
	"slices"
	"sync"
	"syscall"

	"github.com/perfbuf/perfbuf/internal/cpus"
	"github.com/perfbuf/perfbuf/internal/kernel"
	"github.com/perfbuf/perfbuf/internal/ring"
	"golang.org/x/sys/unix"
)

// rings are the per-CPU rings of one perf event array, opened
// (openPerfEvents) on the CPUs perf_buffer__new would choose, and later on
// CPUs that come online (internal/kernel's CPUWatch), each in an opening of its own.
//
// Rings are only added, by the owner's reading goroutine under its drain
// lock, which therefore reads cpus, ring and fds without mu; other goroutines
// take mu.
type rings struct {
	// mapFD is the perf event array as the rings fill its slots
	// (slotFile): a map file of the reader's own, or where there is
	// none (byKey), a duplicate of the caller's descriptor. Every opening
	// stores its rings through it, and libbpf keeps it to delete its
	// slots in perf_buffer__free. release puts a descriptor of no map in
	// its place (released), and close closes that, when mapOwned.
	mapFD    int
	mapOwned bool
	byKey    bool // release deletes the slots by key
	released bool
	// stored are the keys the openings stored, which release deletes
	// without a file of its own.
	stored []int32

	cfg   RingConfig       // their configuration
	mapID uint32           // claimed in claims until close
	limit int              // CPUs below it may have a ring (possible CPUs, max_entries)
	watch *kernel.CPUWatch // CPUs coming online; nil if not tracked
	cs    []PerfEvents     // cs[0] from New, then one per ring opened later
	epfd  int              // cs[0]'s epoll set (EpollFD), over every ring
	// openCPU opens a ring on a CPU that came online: openOne, but in
	// tests.
	openCPU func(cpu int32) (*ring.Perf, int, ringSrc, error)

	mu   sync.RWMutex
	cpus []int32      // cpus[i] is the CPU behind buffer index i
	ring []*ring.Perf // the owner's reader of ring i
	fds  []int        // ring i's perf event descriptor
	src  []ringSrc    // where ring i is in its opening

	failures *failureMap // Options.FailureMap, or nil; closed with the rings

	// pause is the owner's pause state (pause.go), set when the owner
	// starts: add holds its lock, and opens a ring paused while paused.
	pause *pauser
}

// ringSrc is a ring's opening and index in it.
type ringSrc struct {
	c PerfEvents
	j int
}

// openRings checks failures (nil for none) and opens the rings of the perf
// event array fd, whose info checkMap returned and whose pin is pin ("" if
// not known), with cfg. Errors: os.ErrInvalid, ErrMapInUse, ErrMapType, and errnos
// from the kernel (EBADF for a closed descriptor, EINVAL for one that is not
// a BPF object, EPERM without the privileges perf_event_open and the map
// update need).
func openRings(fd int, info mapDesc, pin string, cfg RingConfig, failures Map) (_ *rings, err error) {
	// Checked before any ring is opened; from here, r.close closes it.
	fails, err := openFailureMap(failures)
	if err != nil {
		return nil, err
	}
	watch := kernel.NewCPUWatch() // before the online list: see newCPUWatch
	var r *rings
	defer func() {
		if err != nil && r == nil { // from r on, r.close closes them
			fails.close()
			if watch != nil {
				watch.Close()
			}
		}
	}()
	cpus, limit, err := ringCPUs(info.maxEntries)
	if err != nil {
		return nil, err
	}
	if !claimMap(info.id) {
		return nil, fmt.Errorf("%v (id %d): %w", info, info.id, ErrMapInUse)
	}
	mapFD, ownFile, err := slotFile(fd, info, pin)
	if err != nil {
		unclaimMap(info.id)
		return nil, err
	}
	r = &rings{mapFD: mapFD, mapOwned: true, byKey: !ownFile, cfg: cfg, mapID: info.id, limit: limit, watch: watch, failures: fails}
	r.openCPU = r.openOne
	c, err := openPerfEvents(r.mapFD, cfg, cpus)
	if err != nil {
		r.close()
		if errors.Is(err, os.ErrPermission) {
			// EPERM or EACCES: perf_event_open or the map update refused.
			return nil, fmt.Errorf("open perf events on map %q: %w (perf_event_open needs CAP_PERFMON or CAP_SYS_ADMIN, or a perf_event_paranoid that allows it; the map update needs CAP_BPF)", info.name, err)
		}
		return nil, fmt.Errorf("open perf events on map %q: %w", info.name, err)
	}
	r.cs, r.epfd = append(r.cs, c), c.EpollFD()
	r.stored = append(r.stored, cpus...)
	if n := c.BufferCount(); n != len(cpus) {
		r.close() // (it empties the slots)
		return nil, fmt.Errorf("opened %d rings for %d cpus", n, len(cpus))
	}
	for j, cpu := range cpus {
		src := ringSrc{c, j}
		rb, err := src.view(cpu)
		if err != nil {
			r.close()
			return nil, fmt.Errorf("ring %d: %w", j, err)
		}
		r.push(cpu, rb, c.BufferFD(j), src)
	}
	return r, nil
}

// push appends a ring and returns its buffer index.
func (r *rings) push(cpu int32, rb *ring.Perf, fd int, src ringSrc) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	rb.Cur().SetIndex(len(r.ring))
	r.cpus = append(r.cpus, cpu)
	r.ring = append(r.ring, rb)
	r.fds = append(r.fds, fd)
	r.src = append(r.src, src)
	return len(r.ring) - 1
}

// add opens a ring on cpu, which came online after New, and returns its
// buffer index. The caller holds the owner's drain lock.
func (r *rings) add(cpu int) (int, error) {
	if r.pause != nil {
		// A Pause meanwhile goes through this ring, or it opens paused.
		r.pause.mu.Lock()
		defer r.pause.mu.Unlock()
	}
	rb, fd, src, err := r.openCPU(int32(cpu))
	if err != nil {
		return 0, err
	}
	return r.push(int32(cpu), rb, fd, src), nil
}

// openOne opens a ring on cpu in an opening of its own, which stores it in
// the map at the CPU's key. Its descriptor joins the first opening's epoll
// set too, so that EpollFD covers it (perfbuf never calls
// perf_buffer__poll, the one reader of a libbpf set's event data). If it
// fails once the ring is stored, it empties the CPU's slot, by key, and
// closes the ring: outputs there then fail (ENOENT) rather than fill a ring
// nobody reads. (The kernel empties a slot only with the whole file that
// filled it, so this one slot goes by key: it holds the event stored a
// moment before, unless another process's reader stored its own there in
// between.) While the owner is paused, perfbuf's own opener opens it
// paused (openPausedEvents).
func (r *rings) openOne(cpu int32) (_ *ring.Perf, _ int, _ ringSrc, err error) {
	open := openPerfEvents
	if r.pause != nil && r.pause.paused { // (add holds its lock)
		open = openPausedEvents
	}
	c, err := open(r.mapFD, r.cfg, []int32{cpu})
	if err != nil {
		return nil, 0, ringSrc{}, err
	}
	defer func() {
		if err != nil {
			r.unlinkCPUs([]int32{cpu})
			c.Close()
		}
	}()
	src := ringSrc{c, 0}
	rb, err := src.view(cpu)
	if err != nil {
		return nil, 0, ringSrc{}, err
	}
	fd := c.BufferFD(0)
	ev := unix.EpollEvent{Events: unix.EPOLLIN, Fd: int32(fd)}
	if err := unix.EpollCtl(r.epfd, unix.EPOLL_CTL_ADD, fd, &ev); err != nil {
		return nil, 0, ringSrc{}, fmt.Errorf("add to epoll: %w", err)
	}
	r.cs = append(r.cs, c) // freed by close from here on
	r.stored = append(r.stored, cpu)
	return rb, fd, src, nil
}

// opened returns the rings opened so far, for the owner core.
func (r *rings) opened() ([]ring.Kind, []int) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	out := make([]ring.Kind, len(r.ring))
	for i, rb := range r.ring {
		out[i] = rb
	}
	return out, slices.Clone(r.fds)
}

// addNew opens a ring for each CPU that came online since the last call
// (internal/kernel's CPUWatch) and calls add with it and its perf event.
func (r *rings) addNew(add func(rb ring.Kind, fd int) error) error {
	return r.addNewCPUs(func(i int) error { return add(r.ring[i], r.fds[i]) })
}

// eventFDs returns every ring's perf event, in buffer index order.
func (r *rings) eventFDs() []int {
	r.mu.RLock()
	defer r.mu.RUnlock()
	return slices.Clone(r.fds)
}

// epollFD is the first opening's epoll set, over every ring.
func (r *rings) epollFD() (int, error) { return r.epfd, nil }

func (s ringSrc) view(cpu int32) (*ring.Perf, error) {
	base, size, err := s.c.Ring(s.j)
	if err != nil {
		return nil, err
	}
	return ring.NewPerf(int(cpu), base, size)
}

// unlink takes the rings out of the map (release) and waits until no
// output that found one of them there is still writing into it, so that
// what is in the rings afterwards is final: Close counts it as left, and an
// output from then on fails in the program (ENOENT, counted by a failure
// map), unless another reader filled the slot since.
//
// bpf_perf_event_output looks the ring up and writes it within the BPF
// program's RCU read-side section; emptying the slot does not wait for
// those (the kernel only defers the event's release). An RCU grace period
// does (kernel.WaitWriters, nohz_full kernels included); it blocks only the
// caller. Where it cannot be waited for (CanWaitWriters false), the count
// races with such outputs.
func (r *rings) unlink() {
	if len(r.cs) == 0 {
		return // nothing opened: no slot filled, no output to wait for
	}
	r.release()
	rcuGrace()
}

// release empties the slots the rings filled, once. With a map file of the
// reader's own, it releases that file: the kernel then empties the slots
// filled through it that still hold the event it stored
// (perf_event_fd_array_release, kernel/bpf/arraymap.c), and a slot that a
// reader in another process filled since keeps that reader's ring. Without
// one, it deletes the slots stored, by key, whoever filled them since.
// Either way mapFD then names the first opening's epoll set, no map:
// perf_buffer__free deletes its slots by key through the descriptor it was
// given, and that fails (EINVAL) rather than empty a slot of another
// reader. The fork lock keeps a child between fork and exec from holding
// the map file past the call, where its release would come later.
func (r *rings) release() {
	if !r.mapOwned || r.released {
		return
	}
	r.released = true
	if r.byKey {
		for _, key := range slices.Compact(slices.Sorted(slices.Values(r.stored))) {
			_ = kernel.DeleteSlot(r.mapFD, uint32(key)) // ENOENT: a slot already empty
		}
	}
	if len(r.cs) == 0 {
		unix.Close(r.mapFD) // no opening keeps its number
		r.mapOwned = false
		return
	}
	syscall.ForkLock.RLock()
	// Closes the map file. It fails only for a bad descriptor: then the
	// file stays until close, and the frees delete by key through it.
	_ = unix.Dup3(r.epfd, r.mapFD, unix.O_CLOEXEC)
	syscall.ForkLock.RUnlock()
}

// unlinkCPUs deletes the slots of cpus, by key, and waits for the outputs
// that found them (see unlink).
func (r *rings) unlinkCPUs(cpus []int32) {
	for _, key := range slices.Compact(slices.Sorted(slices.Values(cpus))) {
		_ = kernel.DeleteSlot(r.mapFD, uint32(key)) // ENOENT: a slot already empty
	}
	rcuGrace()
}

// rcuGrace waits for an RCU grace period: every BPF program running at the
// call has returned (see unlink). It is kernel.WaitWriters; an error
// leaves the count racing (CloseExact is false).
func rcuGrace() { _ = kernel.WaitWriters() }

// close empties the slots (release, if unlink did not) and frees the
// rings: each opening unmaps and closes its own (perf_buffer__free's
// deletes by key find no map: see release). Every reader of them is
// invalid afterwards. Then it closes mapFD, which the frees used.
func (r *rings) close() {
	if r.watch != nil {
		r.watch.Close()
	}
	r.release()
	for _, c := range slices.Backward(r.cs) {
		c.Close()
	}
	if r.mapOwned {
		unix.Close(r.mapFD)
		r.mapOwned = false
	}
	unclaimMap(r.mapID) // after the slots are cleared: a new reader's stay
	r.failures.close()
}

// CloseExact is perfbuf.CloseExact: whether the counts add up exactly at
// Close on this kernel.
func CloseExact() bool { return kernel.CanWaitWriters() && kernel.FormatLost() }

// takeNewCPUs returns the CPUs that need a new ring: those announced online
// (again or for the first time), and with rescan, the online CPUs without a
// ring. Each comes once, in increasing order; CPUs past the map's entries
// are left out.
func (r *rings) takeNewCPUs() ([]int, error) {
	online, rescan := r.watch.Take()
	if rescan {
		now, err := cpus.Online()
		if err != nil {
			return nil, err
		}
		r.mu.RLock()
		for _, cpu := range now {
			if !slices.Contains(r.cpus, int32(cpu)) {
				online = append(online, cpu)
			}
		}
		r.mu.RUnlock()
	}
	slices.Sort(online)
	online = slices.Compact(online)
	return slices.DeleteFunc(online, func(cpu int) bool { return cpu >= r.limit }), nil
}

// addNewCPUs opens a ring for each CPU that takeNewCPUs returns and calls
// added with its buffer index. A CPU that went offline again before its
// ring opened (ENODEV) is skipped: its uevent will come again. The caller
// holds its owner's drain lock.
func (r *rings) addNewCPUs(added func(i int) error) error {
	news, err := r.takeNewCPUs()
	if err != nil {
		return fmt.Errorf("cpus online: %w", err)
	}
	for _, cpu := range news {
		i, err := r.add(cpu)
		if errors.Is(err, syscall.ENODEV) {
			continue
		}
		if err != nil {
			return fmt.Errorf("open ring on cpu %d, online since: %w", cpu, err)
		}
		if err := added(i); err != nil {
			return fmt.Errorf("ring on cpu %d, online since: %w", cpu, err)
		}
	}
	return nil
}

// failureCounters returns r's failure map: nil without one.
func (r *rings) failureCounters() *failureMap { return r.failures }

// ringCPUs mirrors perf_buffer__new's choice of CPUs: the online ones among
// the first min(possible CPUs, max_entries), that limit. Buffer index i
// reads cpus[i].
func ringCPUs(maxEntries uint32) ([]int32, int, error) {
	online, err := cpus.Online()
	if err != nil {
		return nil, 0, err
	}
	possible, err := cpus.Possible()
	if err != nil {
		return nil, 0, err
	}
	limit := len(possible)
	if highest := maxCPU(possible) + 1; highest > limit {
		limit = highest // libbpf counts possible CPUs as the highest + 1
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
		return nil, 0, fmt.Errorf("no online cpu below map max_entries %d: %w", maxEntries, os.ErrInvalid)
	}
	return ring, limit, nil
}

func maxCPU(cpus []int) int {
	m := -1
	for _, c := range cpus {
		m = max(m, c)
	}
	return m
}

// oneWriter is false: a perf ring is one CPU's, but an ordered reader of
// perf rings merges without the window's rule 1 (policy.NewOrdered).
func (r *rings) oneWriter(int) bool { return false }
