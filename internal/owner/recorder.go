// SPDX-License-Identifier: Apache-2.0

package owner

// Flight-recorder mode: Recorder keeps overwritable rings (backward perf
// rings, ring buffers in overwrite mode) that no one consumes, and copies
// their newest records on demand: the root's Recorder. The kernel side is
// internal/kernel's (overwrite.go), the parse internal/snapshot's; this
// file opens, pauses and counts.

import (
	"cmp"
	"errors"
	"fmt"
	"io"
	"os"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"unsafe"

	"github.com/perfbuf/perfbuf/internal/kernel"
	"github.com/perfbuf/perfbuf/internal/policy"
	"github.com/perfbuf/perfbuf/internal/ring"
	"github.com/perfbuf/perfbuf/internal/snapshot"
	"golang.org/x/sys/unix"
)

// Recorder is a flight recorder over a map's overwritable rings:
// perfbuf.Recorder's mechanism. Its methods run one at a time.
type Recorder struct {
	mu     sync.Mutex
	what   string
	closed bool
	pause  pauser // Pause's state (pause.go), set under mu
	rings  []recRing
	recs   []snapshot.Record // the parsers' scratch, reused by each Snapshot
	merged []ring.Record     // policy.MergeByKey's scratch, reused likewise

	// A perf event array: its backward rings, its slots (cpus) and the
	// descriptor they were stored through (slotFile), whose slots Close
	// deletes by key when byKey.
	perf  *kernel.PerfRings
	mapFD int
	byKey bool
	cpus  []int32

	maps     []*kernel.RingMapping // ring buffers' read-only mappings
	ringFDs  []int                 // their map descriptors (owned), for BufferFD
	owned    []int                 // descriptors opened here, closed at Close
	ids      []uint32              // claimed until Close
	failures *failureMap
	progs    *programs // Options.Programs, or nil
}

// recRing is one ring of a Recorder, with what its snapshots counted.
type recRing struct {
	perf  snapshot.PerfRing // a backward perf ring, or
	bpf   snapshot.BPFRing  // a ring buffer (bpf.Data non-nil)
	end   uint64            // the last snapshot's End: onlyNew's From
	stats Stats
}

// OpenRecorder opens m's rings, and those of more, as overwritable rings
// with the settings ro (whose fields were checked), the failure map
// failures (nil for none) and the programs progs (as Open's): for a perf
// event array, a backward ring on every online CPU, mapped read-only
// (CPUs that come online later get none), that wakes the epoll set as
// ro's WakeupEvents or WakeupBytes say, else once half of it was written;
// for a BPF ring buffer, or an array of them and more, each must be in
// overwrite mode (map flag BPF_F_RB_OVERWRITE, kernel 6.19).
func OpenRecorder(m Map, ro RingOptions, more []Map, failures Map, progs []int) (*Recorder, error) {
	defer runtime.KeepAlive(failures)
	defer runtime.KeepAlive(more)
	defer runtime.KeepAlive(m)
	if m == nil {
		return nil, fmt.Errorf("nil map: %w", os.ErrInvalid)
	}
	ro.overwrite = true
	// A wakeup costs the program that raises it several µs, many times
	// its own work (docs/performance.md): without a setting, a backward
	// ring raises one a half ring of bytes, as a Reader's budget does,
	// not one a sample.
	ro.Budget = ro.WakeupEvents == 0 && ro.WakeupBytes == 0
	fd := m.FileDescriptor()
	info, err := checkMap(fd)
	if err == nil {
		err = ro.checkPrepared(info)
	}
	if err != nil {
		return nil, err
	}
	// The maps are checked before the programs are taken, which the
	// refusals below would otherwise leave open.
	var maps []mapArg // ring buffers'; nil for a perf event array
	if info.typ == mapTypePerfEventArray {
		if len(more) > 0 {
			return nil, (fmt.Errorf("options Maps with %v, which is read alone: %w", info, os.ErrInvalid))
		}
	} else {
		maps = []mapArg{{fd, info}}
		for i, mm := range more {
			info, err := checkMap(mm.FileDescriptor())
			if err != nil {
				return nil, (fmt.Errorf("options Maps[%d]: %w", i, err))
			}
			maps = append(maps, mapArg{mm.FileDescriptor(), info})
		}
	}
	r := &Recorder{mapFD: -1, what: describeMaps(info, len(more))}
	r.pause.grace = kernel.WaitWriters
	if r.progs, err = openPrograms(progs); err != nil {
		return nil, err
	}
	if maps == nil {
		err = r.openPerf(fd, info, pinPath(m), ro, failures)
	} else {
		err = r.openRingBufs(maps, ro, failures)
	}
	if err != nil {
		r.free()
		return nil, err
	}
	return r, nil
}

// openPerf opens a backward ring on each CPU perf_buffer__new would
// choose, stored through a map file of the Recorder's own where it can
// have one (slotFile; pin is the map's pin, or "").
func (r *Recorder) openPerf(fd int, info mapDesc, pin string, ro RingOptions, failures Map) error {
	cfg, err := ro.HostConfig()
	if err != nil {
		return fmt.Errorf("%v: %w", info, err)
	}
	if r.failures, err = openFailureMap(failures); err != nil {
		return err
	}
	cpus, _, err := ringCPUs(info.maxEntries)
	if err != nil {
		return err
	}
	if !claimMap(info.id) {
		return fmt.Errorf("%v (id %d): %w", info, info.id, ErrMapInUse)
	}
	r.ids = append(r.ids, info.id)
	var own bool
	if r.mapFD, own, err = slotFile(fd, info, pin); err != nil {
		return err
	}
	r.byKey = !own
	kc := cfg.kernel()
	kc.Time = true // the kernel's time of each sample: Snapshot merges the rings by it
	if r.perf, err = kernel.OpenBackwardRings(r.mapFD, kc, cpus); err != nil {
		return fmt.Errorf("open backward perf rings on %v: %w", info, err)
	}
	r.cpus = cpus
	for j, cpu := range cpus {
		base, size := r.perf.Ring(j)
		hdr := (*unix.PerfEventMmapPage)(base)
		// data_offset is written once, at the mapping, before the mmap returns.
		data := unsafe.Slice((*byte)(unsafe.Add(base, hdr.Data_offset)), size)
		r.rings = append(r.rings, recRing{
			perf:  snapshot.PerfRing{Head: &hdr.Data_head, Data: data},
			stats: Stats{Ring: j, CPU: int(cpu), Size: size},
		})
	}
	return nil
}

// openRingBufs maps the ring buffers of maps (those in arrays of maps too)
// read-only, once ro is checked against each.
func (r *Recorder) openRingBufs(maps []mapArg, ro RingOptions, failures Map) error {
	var bufs []mapArg
	for _, m := range maps {
		if m.info.typ == mapTypeArrayOfMaps {
			s := &ringBufSource{epfd: -1}
			inner, err := s.inner(m, ro)
			r.owned = append(r.owned, s.owned...)
			if err != nil {
				return err
			}
			bufs = append(bufs, inner...)
			continue
		}
		if err := ro.checkRingBuf(m.info); err != nil {
			return err
		}
		fd, err := ownMap(m.fd, m.info)
		if err != nil {
			return fmt.Errorf("ring buffer %q: %w", m.info.name, err)
		}
		r.owned = append(r.owned, fd)
		bufs = append(bufs, mapArg{fd, m.info})
	}
	if len(bufs) == 0 {
		return fmt.Errorf("no ring buffer in the maps given (an array of maps with every slot empty?): %w", os.ErrInvalid)
	}
	var err error
	if r.failures, err = openFailureMap(failures); err != nil {
		return err
	}
	for i, b := range bufs {
		if !claimMap(b.info.id) {
			return fmt.Errorf("%v (id %d): %w", b.info, b.info.id, ErrMapInUse)
		}
		r.ids = append(r.ids, b.info.id)
		mp, err := kernel.MapRingBuffer(b.fd, int(b.info.maxEntries))
		if err != nil {
			return fmt.Errorf("%v: %w", b.info, err)
		}
		r.maps = append(r.maps, mp)
		r.ringFDs = append(r.ringFDs, b.fd)
		r.rings = append(r.rings, recRing{
			bpf:   snapshot.BPFRingAt(mp.Consumer(), mp.Producer(), mp.Data()),
			stats: Stats{Ring: i, CPU: -1, Size: int(b.info.maxEntries)},
		})
	}
	// Programs that write through bpf/perfbuf.bpf.h write while a reader
	// is counted.
	return r.failures.openReader()
}

// Snapshot is perfbuf.Recorder.Snapshot: the newest whole records of
// every ring, copied into buf and appended to dst.
func (r *Recorder) Snapshot(buf []byte, dst []ring.Record, onlyNew bool) ([]ring.Record, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	op := "snapshot " + r.what
	if r.closed {
		return dst, fmt.Errorf("%s: %w", op, os.ErrClosed)
	}
	// Paused, the perf rings are still (Pause waited for their writers);
	// otherwise each parse waits for the writers in flight after its copy.
	settle := kernel.WaitWriters
	if r.pause.paused {
		settle = nil
	}
	recs := r.recs
	start := len(dst) // the snapshot's records: dst[start:]
	timed := false    // perf rings', whose samples carry their time
	var short error
	shares := r.shares(len(buf), onlyNew)
	later := 0 // what the rings after i are given
	for _, n := range shares {
		later += n
	}
	for i := range r.rings {
		rr := &r.rings[i]
		later -= shares[i]
		part := max(len(buf)-later, 0) // ring i's share, and what the rings before it left
		var from uint64
		if onlyNew {
			from = rr.end
		}
		var s snapshot.Snapshot
		var err error
		if rr.bpf.Data != nil {
			s, err = snapshot.BPF(rr.bpf, buf[:part], recs, snapshot.BPFOptions{From: from, Settle: kernel.WaitWriters})
		} else {
			timed = true
			s, err = snapshot.Perf(rr.perf, buf[len(buf)-part:], recs, snapshot.PerfOptions{From: from, Settle: settle, Time: true})
		}
		recs = s.Records
		r.recs = recs[:0]
		if errors.Is(err, io.ErrShortBuffer) {
			if short == nil {
				short = fmt.Errorf("%s: ring %d: %w", op, i, err)
			}
		} else if err != nil {
			return dst, fmt.Errorf("%s: ring %d: %w", op, i, err)
		}
		rr.end = s.End
		used := 0 // the bytes of buf the records kept take
		for k := range s.Records {
			sr := &s.Records[k]
			rec := ring.Record{Type: ring.Sample, Ring: i, CPU: rr.stats.CPU, Pos: sr.Pos, Next: sr.Next(), Data: sr.Data, Lost: sr.Lost, Key: sr.Time}
			if sr.Type == snapshot.PerfRecordLost {
				rec.Type, rec.Data = ring.Lost, nil
				rr.stats.Lost += sr.Lost
			} else {
				rr.stats.Samples++
				rr.stats.Bytes += uint64(len(sr.Data))
			}
			if rr.bpf.Data == nil {
				used += int(sr.Next()-sr.Pos) - 8 // a perf record's body, header left out
			}
			dst = append(dst, rec)
		}
		r.count(i, &s.Counts)
		// What the part leaves unused goes to the rings after. A perf
		// ring fills its part from the end, the newest record last: the
		// records kept are the newest, at the end. A ring buffer fills its
		// part from the start, oldest first: those kept end where the
		// newest ends.
		if rr.bpf.Data == nil {
			buf = buf[:len(buf)-used]
		} else {
			for k := len(s.Records) - 1; k >= 0; k-- {
				// (An empty Data's pointer may not be its offset in buf.)
				if last := s.Records[k].Data; len(last) > 0 {
					used = int(uintptr(unsafe.Pointer(&last[0]))-uintptr(unsafe.Pointer(&buf[0]))) + len(last)
					break
				}
			}
			buf = buf[used:]
		}
	}
	if timed {
		r.merged = policy.MergeByKey(dst[start:], r.merged)
	}
	return dst, short
}

// shares divides n bytes of a snapshot's buffer among the rings by what
// each holds (the bytes from where the snapshot starts to the newest
// record, headers included: a little more than its records take): rings
// that hold less than an equal part of what is left get what they hold,
// the others equal parts of the rest.
func (r *Recorder) shares(n int, onlyNew bool) []int {
	want := make([]int, len(r.rings))
	for i := range r.rings {
		want[i] = r.rings[i].window(onlyNew)
	}
	share := make([]int, len(want))
	order := make([]int, len(want))
	for i := range order {
		order[i] = i
	}
	slices.SortFunc(order, func(a, b int) int { return cmp.Compare(want[a], want[b]) })
	for k, i := range order {
		share[i] = min(want[i], n/(len(order)-k))
		n -= share[i]
	}
	return share
}

// window returns the bytes a snapshot of rr would walk: what a perf ring
// holds up to its size, or a ring buffer from the later of its consumer
// and overwrite positions; with onlyNew, from the last snapshot's end.
func (rr *recRing) window(onlyNew bool) int {
	var from uint64
	if rr.bpf.Data != nil {
		// Acquire loads, as snapshot.BPF's; an estimate, which the parse
		// does not trust.
		prod := atomic.LoadUint64(rr.bpf.Producer)
		start := atomic.LoadUint64(rr.bpf.Consumer)
		starts := []uint64{atomic.LoadUint64(rr.bpf.Overwrite)}
		if onlyNew {
			starts = append(starts, rr.end)
		}
		for _, p := range starts {
			if int64(p-start) > 0 {
				start = p
			}
		}
		return int(min(max(int64(prod-start), 0), int64(len(rr.bpf.Data))))
	}
	// Paused: data_head moves no more (acquire: as snapshot.Perf's).
	head := atomic.LoadUint64(rr.perf.Head)
	if onlyNew {
		from = rr.end
	}
	return int(min(-head, from-head, uint64(len(rr.perf.Data))))
}

// count adds what snapshot c left out to ring i's Stats.
func (r *Recorder) count(i int, c *snapshot.Counts) {
	st := &r.rings[i].stats
	st.Skipped += c.Busy + c.Overwritten + c.NoRoom
	st.Discarded += c.Discarded
	if c.Corrupt {
		st.Corrupt++
	}
}

// SetPaused is Pause (on) and Resume: pauser.set, over the perf rings or
// the ring buffers' reader key.
func (r *Recorder) SetPaused(verb string, on bool) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	op := verb + " " + r.what
	if r.closed {
		return fmt.Errorf("%s: %w", op, os.ErrClosed)
	}
	var fds func() []int
	if r.perf != nil {
		fds = func() []int {
			out := make([]int, r.perf.Count())
			for j := range out {
				out[j] = r.perf.FD(j)
			}
			return out
		}
	}
	return r.pause.set(op, on, func(change func(pauseTarget) error) error {
		return wrap(op, change(pauseTarget{perfFDs: fds, f: r.failures}))
	})
}

// Stats returns each ring's counts: what the snapshots returned (Samples,
// Bytes, Lost) and left out (Skipped, Discarded, Corrupt). A record
// returned by two snapshots counts twice.
func (r *Recorder) Stats() []Stats {
	r.mu.Lock()
	st := make([]Stats, len(r.rings))
	for i := range r.rings {
		st[i] = r.rings[i].stats
	}
	r.mu.Unlock()
	return r.progs.addTo(r.failures.addTo(st))
}

// Close frees the rings, once a Snapshot in progress returns; a perf event
// array's slots are emptied first, as a reader's are. Idempotent.
func (r *Recorder) Close() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.closed {
		r.closed = true
		r.free()
	}
}

// Name describes the maps, for errors.
func (r *Recorder) Name() string { return r.what }

// Count is the number of rings, fixed at opening.
func (r *Recorder) Count() int { return len(r.rings) }

// Wakeups is 0: a Recorder never waits for a ring.
func (r *Recorder) Wakeups() uint64 { return 0 }

// BufferFD returns ring i's descriptor: its backward perf event, or its
// ring buffer map.
func (r *Recorder) BufferFD(i int) (int, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	op := fmt.Sprintf("fd of ring %d of %s", i, r.what)
	switch {
	case i < 0 || i >= len(r.rings):
		return -1, fmt.Errorf("%s: %d rings: %w", op, len(r.rings), os.ErrInvalid)
	case r.closed:
		return -1, fmt.Errorf("%s: %w", op, os.ErrClosed)
	case r.perf != nil:
		return r.perf.FD(i), nil
	}
	return r.ringFDs[i], nil
}

// EpollFD returns the epoll set over a perf event array's backward rings,
// ready once the programs have written what wakes a ring (OpenRecorder).
// Over ring buffers it fails with errors.ErrUnsupported: the kernel
// counts what wakes a ring buffer from the consumer position, which a
// Recorder never moves.
func (r *Recorder) EpollFD() (int, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	op := "epoll fd of " + r.what
	switch {
	case r.closed:
		return -1, fmt.Errorf("%s: %w", op, os.ErrClosed)
	case r.perf == nil:
		return -1, fmt.Errorf("%s: a Recorder waits for no ring buffer: %w", op, errors.ErrUnsupported)
	}
	return r.perf.EpollFD(), nil
}

// free empties the slots and frees what NewRecorder opened, as far as it
// got. The slots go with the map file they were stored through (see
// rings.release), or by key without one of its own, before the rings.
func (r *Recorder) free() {
	if r.perf != nil && r.byKey {
		for _, cpu := range r.cpus {
			_ = kernel.DeleteSlot(r.mapFD, uint32(cpu))
		}
	}
	if r.mapFD >= 0 {
		syscall.ForkLock.RLock() // (see rings.release)
		unix.Close(r.mapFD)
		syscall.ForkLock.RUnlock()
		r.mapFD = -1
	}
	if r.perf != nil {
		_ = r.perf.Close()
	}
	for _, mp := range r.maps {
		_ = mp.Close()
	}
	for _, fd := range r.owned {
		unix.Close(fd)
	}
	for _, id := range r.ids {
		unclaimMap(id)
	}
	r.failures.close()
	r.progs.close()
	for i := range r.rings {
		r.rings[i].perf, r.rings[i].bpf = snapshot.PerfRing{}, snapshot.BPFRing{}
	}
}
