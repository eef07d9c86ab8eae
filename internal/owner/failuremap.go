// SPDX-License-Identifier: Apache-2.0

package owner

// The BPF-side failure counters of bpf/perfbuf.bpf.h (Options.FailureMap):
// the checks on the map, reading it, and how its counts join Stats.
//
// perfbuf_output counts, per CPU and by errno, the bpf_perf_event_output
// calls that fail before they reach a ring (a full ring is the kernel's to
// report, in a lost record); the ring buffer outputs count their failures,
// a full ring among them (the kernel reports none). The counts live in a
// per-CPU array of one struct perfbuf_failures: one lookup of key 0 returns
// every possible CPU's.

import (
	"fmt"
	"os"
	"sync"
	"syscall"

	"github.com/perfbuf/perfbuf/internal/cpus"
	"github.com/perfbuf/perfbuf/internal/kernel"
	"golang.org/x/sys/unix"
)

// struct perfbuf_failures is six __u64, in the order of Failures' fields
// (noent, e2big, einval, opnotsupp, other, full): failuresWords words, 48
// bytes, with no padding. Its size is a multiple of 8, so the kernel's per-CPU
// values follow each other with no gap (it rounds each up to 8 bytes).
const (
	failuresWords = 6
	failuresSize  = 8 * failuresWords
)

// bpfVersion is the version of bpf/perfbuf.bpf.h's maps that this perfbuf
// reads (PERFBUF_BPF_VERSION there). A failure map carries its version in
// its max_entries, the version plus one: New refuses a map of another
// version, naming both.
const bpfVersion = 1

// failureMap is a FailureMap opened for rings: a descriptor of its own,
// closed with the rings, and the counts last read.
type failureMap struct {
	name string
	fd   int   // a duplicate of the caller's; -1 in tests
	cpus []int // cpus[k]: the CPU of the lookup's k-th value (the possible CPUs)
	// lookup reads key 0 into out, failuresWords words per CPU of cpus:
	// kernel.LookupPerCPU, or a test's fake.
	lookup func(fd int, out []uint64) error
	// reader says the map has key 1, the reader key (see PERFBUF_FAILURE_MAP
	// in bpf/perfbuf.bpf.h), which openReader and closeReader write.
	reader bool
	// readerKey reads (update false) or writes key 1's words, as lookup
	// reads key 0's: kernel.LookupPerCPU or kernel.UpdatePerCPU at key
	// 1, or a test's fake.
	readerKey func(fd int, words []uint64, update bool) error
	// id is the map's ID, which names its lock file in lockDir
	// (presence.go).
	id      uint32
	lockDir string
	// presence is this owner's lock as a reader alive: from openReader to
	// closeReader.
	presence *presence

	// mu serialises reads and close: Stats may run on any goroutine, also
	// while the rings are freed.
	mu     sync.Mutex
	closed bool
	buf    []uint64
	last   []Failures // as cpus; replaced by each read, never changed in place
}

// openFailureMap checks that m is a PERFBUF_FAILURE_MAP and opens it; nil
// for a nil m. It holds a duplicate of m's descriptor, so that the map stays
// readable until close even if the caller closes its own (or its libbpfgo
// module) first.
//
// Errors: os.ErrInvalid for a map of another type, key size, value size or
// no entries; for the descriptor itself, as checkMap's: EBADF for a closed
// one, the kernel's errno for one that is not a BPF object; EPERM from the
// first read for a map the descriptor may not read.
func openFailureMap(m Map) (*failureMap, error) {
	if m == nil {
		return nil, nil
	}
	fd := m.FileDescriptor()
	if fd < 0 {
		return nil, fmt.Errorf("failure map fd %d: %w", fd, syscall.EBADF)
	}
	// The duplicate is what is checked and kept. A closed fd fails here
	// with EBADF on every kernel (as checkMap's fcntl).
	dup, err := ownFD(fd)
	if err != nil {
		return nil, fmt.Errorf("failure %w", err)
	}
	f, err := newFailureMap(dup, fd)
	if err != nil {
		unix.Close(dup)
		return nil, err
	}
	return f, nil
}

// newFailureMap checks the map behind fd (the caller's userFD, for errors)
// and returns it as a failureMap that owns fd.
func newFailureMap(fd, userFD int) (*failureMap, error) {
	info, err := bpfMapInfo(fd, userFD, os.ErrInvalid)
	if err != nil {
		return nil, fmt.Errorf("failure map: %w", err)
	}
	const want = "want a PERFBUF_FAILURE_MAP of bpf/perfbuf.bpf.h"
	switch {
	case info.typ != mapTypePerCPUArray:
		return nil, fmt.Errorf("failure map %q has type %s (%d), %s (percpu_array): %w",
			info.name, kernel.MapTypeName(info.typ), info.typ, want, os.ErrInvalid)
	case info.keySize != 4:
		return nil, fmt.Errorf("failure map %q has %d-byte keys, %s (__u32 keys): %w",
			info.name, info.keySize, want, os.ErrInvalid)
	case info.valueSize != failuresSize:
		return nil, fmt.Errorf("failure map %q has %d-byte values, %s (struct perfbuf_failures, %d bytes): %w",
			info.name, info.valueSize, want, failuresSize, os.ErrInvalid)
	case info.maxEntries != bpfVersion+1:
		return nil, versionError(info)
	}
	// A lookup returns a value for each possible CPU, in CPU order
	// (for_each_possible_cpu): as many as the kernel's list holds, and
	// those CPUs. (Not libbpf_num_possible_cpus, which reads the list
	// into 128 bytes and fails with E2BIG on a longer one.)
	possible, err := cpus.Possible()
	if err != nil {
		return nil, fmt.Errorf("failure map %q: %w", info.name, err)
	}
	n := len(possible)
	f := &failureMap{
		name:      info.name,
		id:        info.id,
		lockDir:   defaultLockDir,
		fd:        fd,
		cpus:      possible,
		lookup:    func(fd int, out []uint64) error { return kernel.LookupPerCPU(fd, 0, out) },
		reader:    true,
		readerKey: readerKeyPerCPU,
		buf:       make([]uint64, failuresWords*n),
	}
	// A map the descriptor may not read (BPF_F_WRONLY, or a pinned map
	// opened write-only) is refused now rather than read as zeros forever.
	if err := f.lookup(f.fd, f.buf); err != nil {
		return nil, fmt.Errorf("failure map %q: read: %w", info.name, err)
	}
	f.last = decodeFailures(f.buf, n)
	return f, nil
}

// versionError refuses the failure map info, whose max_entries says
// another version of bpf/perfbuf.bpf.h than bpfVersion, naming both and
// which side to rebuild.
func versionError(info mapDesc) error {
	v := int64(info.maxEntries) - 1
	fix := "rebuild the BPF programs with this perfbuf's bpf/perfbuf.bpf.h"
	if v > bpfVersion {
		fix = "upgrade perfbuf to one that reads it"
	}
	return fmt.Errorf("failure map %q is of bpf/perfbuf.bpf.h version %d (max_entries %d); this perfbuf reads version %d (max_entries %d): %s: %w",
		info.name, v, info.maxEntries, bpfVersion, bpfVersion+1, fix, os.ErrInvalid)
}

// The reader key, key 1 of a PERFBUF_FAILURE_MAP, says whether a ring
// buffer's reader is open, to the ring buffer outputs of bpf/perfbuf.bpf.h,
// which test its first word on their CPU: not 0, no reader (closed), and
// they fail (counted as noent). Every CPU's copy holds the same words:
//
//	word 0 (noent): 1 while no reader is alive, once one was
//	the others: 0
//
// Which readers are alive, in every process, is the kernel's to keep:
// each holds a lock on a lock file of the failure map's (presence.go),
// which the kernel drops when the reader closes or its process ends. A
// reader marks the key open once it holds its lock (openReader); one that
// leaves marks it closed only if it is the last (closeReader). So a Close
// marks closed only what no other reader holds open: when a new process
// opens its reader on a pinned map and then the old one closes (an agent's
// upgrade), or the other way round, the outputs keep coming to the reader
// that stays; and a reader killed without Close is not counted as alive.
//
// What remains: while every reader is dead and none has opened since, the
// key stays open: outputs land in the ring, for the next reader. A map
// created anew (the program reloaded, the pin removed) starts open.

// openReader marks this owner as a reader of the ring buffers that f's
// outputs write: the key is open from its return. A map without the key
// (an older PERFBUF_FAILURE_MAP, a nil f) is left alone.
func (f *failureMap) openReader() error {
	if f == nil || !f.reader || f.presence != nil {
		return nil
	}
	p, err := joinPresence(f.lockDir, f.id)
	if err != nil {
		return fmt.Errorf("failure map %q: mark a reader open: %w", f.name, err)
	}
	if err := f.markKey(false); err != nil {
		p.leave()
		return fmt.Errorf("failure map %q: mark a reader open: %w", f.name, err)
	}
	f.presence = p
	return nil
}

// closeReader takes this owner out of the readers that openReader added
// it to; last reports that it was the last reader alive, and marked the
// key closed: outputs through bpf/perfbuf.bpf.h then fail in the program.
// It does nothing, and reports false, unless openReader added f.
func (f *failureMap) closeReader() (last bool, err error) {
	if f == nil || f.presence == nil {
		return false, nil
	}
	p := f.presence
	f.presence = nil
	defer p.leave()
	if last, err = f.closeIfLast(p); err != nil {
		return false, fmt.Errorf("failure map %q: mark a reader closed: %w", f.name, err)
	}
	return last, nil
}

// pauseReader marks the key closed if this owner is the only reader alive
// (ErrMapInUse otherwise), and stays a reader: resumeReader marks the key
// open again. A reader that opens meanwhile marks it open too.
func (f *failureMap) pauseReader() error {
	if f.presence == nil {
		return fmt.Errorf("failure map %q: pause: not a reader: %w", f.name, os.ErrClosed)
	}
	last, err := f.closeIfLast(f.presence)
	if err == nil {
		err = f.presence.share()
	}
	switch {
	case err != nil:
		return fmt.Errorf("failure map %q: pause: %w", f.name, err)
	case !last:
		return fmt.Errorf("failure map %q: another reader of the ring buffers is open: %w", f.name, ErrMapInUse)
	}
	return nil
}

// resumeReader marks the key open again after pauseReader.
func (f *failureMap) resumeReader() error {
	if err := f.markKey(false); err != nil {
		return fmt.Errorf("failure map %q: resume: %w", f.name, err)
	}
	return nil
}

// closeIfLast marks the key closed if p's reader is the only one alive,
// and reports whether it was; p then holds the write lock.
func (f *failureMap) closeIfLast(p *presence) (bool, error) {
	alone, err := p.alone()
	if err != nil || !alone {
		return false, err
	}
	return true, f.markKey(true)
}

// markKey writes the reader key, closed or open, on every CPU.
func (f *failureMap) markKey(closed bool) error {
	words := make([]uint64, failuresWords*len(f.cpus))
	if closed {
		for k := range f.cpus {
			words[k*failuresWords] = 1
		}
	}
	return f.readerKey(f.fd, words, true)
}

// readerKeyPerCPU reads or writes key 1 of the per-CPU array fd: every
// possible CPU's copy (see failureMap.readerKey).
func readerKeyPerCPU(fd int, words []uint64, update bool) error {
	if update {
		return kernel.UpdatePerCPU(fd, 1, words)
	}
	return kernel.LookupPerCPU(fd, 1, words)
}

// counts returns each CPU's failures, as f.cpus: what the map holds now,
// or, once f is closed or if the lookup fails, what it held at the last
// read that worked (New's read did). Having read it once, a lookup fails
// only for want of kernel memory; the counts only grow, so an old read is
// a lower bound. The slice is shared: do not change it.
func (f *failureMap) counts() []Failures {
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.closed {
		f.read()
	}
	return f.last
}

// read looks the counts up into f.last; f.mu is held.
func (f *failureMap) read() {
	if f.lookup(f.fd, f.buf) != nil {
		return // keep the last counts: see counts
	}
	f.last = decodeFailures(f.buf, len(f.cpus))
}

// decodeFailures returns the n CPUs' struct perfbuf_failures of a lookup's
// words.
func decodeFailures(words []uint64, n int) []Failures {
	out := make([]Failures, n)
	for k := range out {
		w := words[k*failuresWords : (k+1)*failuresWords]
		out[k] = Failures{NoEntry: w[0], TooBig: w[1], Invalid: w[2], NotOnCPU: w[3], Other: w[4], Full: w[5]}
	}
	return out
}

// close takes the owner out of the reader key's count if it is still in
// it (an owner that failed to open), reads the counts a last time, for
// Stats after Close, and closes the descriptor. It is idempotent, and does
// nothing on a nil f.
func (f *failureMap) close() {
	if f == nil {
		return
	}
	_, _ = f.closeReader()
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		return
	}
	f.read()
	f.closed = true
	if f.fd >= 0 {
		unix.Close(f.fd)
	}
}

// readAlone reports whether st are a ring buffer's read alone: one entry,
// no CPU's, which every CPU writes. What is no ring's (a CPU's failures,
// the programs' runs not run) goes on it rather than in an entry of its
// own.
func readAlone(st []Stats) bool { return len(st) == 1 && st[0].CPU < 0 }

// addTo puts the counts on st (see mergeFailures); a nil f adds nothing.
func (f *failureMap) addTo(st []Stats) []Stats {
	if f == nil {
		return st
	}
	return mergeFailures(st, f.cpus, f.counts())
}

// mergeFailures puts each CPU's failures (counts[k] is CPU cpus[k]'s, in
// increasing CPU order) on st, one entry per ring in buffer index order:
// on the entry of the CPU's latest ring (the highest index with that CPU),
// as a CPU that came back online writes to its new ring; every CPU's on a
// ring buffer read alone (one entry, CPU -1), which every CPU writes; and
// otherwise, for a CPU without a ring of its own, on an entry of its own,
// appended after the rings' in CPU order, with Ring -1 and only CPU and
// Failed set (several ring buffers that CPUs share: which one a failed
// output was for cannot be told). It returns st, grown.
func mergeFailures(st []Stats, cpus []int, counts []Failures) []Stats {
	if len(counts) == 0 {
		return st
	}
	shared := -1
	if readAlone(st) {
		shared = 0
		st[0].Failed = Failures{}
	}
	latest := make(map[int]int, len(st)) // CPU -> its latest ring's index
	for i := range st {
		latest[st[i].CPU] = i
	}
	for k, c := range counts {
		if i, ok := latest[cpus[k]]; ok {
			st[i].Failed = c
		} else if shared >= 0 {
			st[shared].Failed = st[shared].Failed.Add(c)
		} else if c != (Failures{}) {
			st = append(st, Stats{Ring: -1, CPU: cpus[k], Failed: c})
		}
	}
	return st
}
