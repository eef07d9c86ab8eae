package perfbuf

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

// failureMap is a FailureMap opened for rings: a descriptor of its own,
// closed with the rings, and the counts last read.
type failureMap struct {
	name string
	fd   int   // a duplicate of the caller's; -1 in tests
	cpus []int // cpus[k]: the CPU of the lookup's k-th value (the possible CPUs)
	// lookup reads key 0 into out, failuresWords words per CPU of cpus:
	// lookupPerCPU, or a test's fake.
	lookup func(fd int, out []uint64) error
	// reader says the map has key 1, the reader's (see PERFBUF_FAILURE_MAP
	// in bpf/perfbuf.bpf.h), which setReaderClosed writes.
	reader bool

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
	dup, err := unix.FcntlInt(uintptr(fd), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("failure map fd %d: %w", fd, err)
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
			info.name, mapTypeName(info.typ), info.typ, want, os.ErrInvalid)
	case info.keySize != 4:
		return nil, fmt.Errorf("failure map %q has %d-byte keys, %s (__u32 keys): %w",
			info.name, info.keySize, want, os.ErrInvalid)
	case info.valueSize != failuresSize:
		return nil, fmt.Errorf("failure map %q has %d-byte values, %s (struct perfbuf_failures, %d bytes): %w",
			info.name, info.valueSize, want, failuresSize, os.ErrInvalid)
	case info.maxEntries < 1:
		return nil, fmt.Errorf("failure map %q has no entries, %s: %w", info.name, want, os.ErrInvalid)
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
		name:   info.name,
		fd:     fd,
		cpus:   possible,
		lookup: lookupPerCPU,
		reader: info.maxEntries >= 2,
		buf:    make([]uint64, failuresWords*n),
	}
	// A map the descriptor may not read (BPF_F_WRONLY, or a pinned map
	// opened write-only) is refused now rather than read as zeros forever.
	if err := f.lookup(f.fd, f.buf); err != nil {
		return nil, fmt.Errorf("failure map %q: read: %w", info.name, err)
	}
	f.last = decodeFailures(f.buf, n)
	return f, nil
}

// setReaderClosed writes key 1, the reader's, on every CPU: its first word
// is 1 while the ring buffer's reader is closed, and ring buffer outputs
// through bpf/perfbuf.bpf.h then fail in the program (counted as noent).
// Only user space writes that key, so the whole value may be written. A
// map without the key (an older PERFBUF_FAILURE_MAP, a nil f) is left
// alone.
func (f *failureMap) setReaderClosed(closed bool) error {
	if f == nil || !f.reader || f.fd < 0 {
		return nil
	}
	vals := make([]uint64, failuresWords*len(f.cpus))
	if closed {
		for k := range f.cpus {
			vals[k*failuresWords] = 1
		}
	}
	if err := updatePerCPU(f.fd, 1, vals); err != nil {
		return fmt.Errorf("failure map %q: mark the reader %s: %w", f.name, map[bool]string{true: "closed", false: "open"}[closed], err)
	}
	return nil
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

// close reads the counts a last time, for Stats after Close, and closes the
// descriptor. It is idempotent, and does nothing on a nil f.
func (f *failureMap) close() {
	if f == nil {
		return
	}
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

// addTo puts the counts on st (see mergeFailures); a nil f adds nothing.
func (f *failureMap) addTo(st []Stats) []Stats {
	if f == nil {
		return st
	}
	return mergeFailures(st, f.cpus, f.counts())
}

// failureCounters returns r's failure map: nil without one, and for a nil
// r (a Reader over rings of a test's own).
func (r *rings) failureCounters() *failureMap {
	if r == nil {
		return nil
	}
	return r.failures
}

// mergeFailures puts each CPU's failures (counts[k] is CPU cpus[k]'s, in
// increasing CPU order) on st, one entry per ring in buffer index order:
// on the entry of the CPU's latest ring (the highest index with that CPU),
// as a CPU that came back online writes to its new ring; and for a CPU with
// no ring but failures, on an entry of its own, appended after the rings'
// in CPU order, with Ring -1 and only CPU and Failed set. A ring buffer's
// one ring is every CPU's (CPU -1), so each CPU's failures come in such
// entries after it. It returns st, grown.
func mergeFailures(st []Stats, cpus []int, counts []Failures) []Stats {
	if len(counts) == 0 {
		return st
	}
	latest := make(map[int]int, len(st)) // CPU -> its latest ring's index
	for i := range st {
		latest[st[i].CPU] = i
	}
	for k, c := range counts {
		if i, ok := latest[cpus[k]]; ok {
			st[i].Failed = c
		} else if c != (Failures{}) {
			st = append(st, Stats{Ring: -1, CPU: cpus[k], Failed: c})
		}
	}
	return st
}
