// SPDX-License-Identifier: Apache-2.0

package owner

// The producing programs' runs that the kernel skipped
// (Options.Programs): the runs no ring and no failure map can count,
// since the program never ran.

import (
	"fmt"
	"os"
	"strconv"
	"sync"

	"github.com/perfbuf/perfbuf/internal/kernel"
	"golang.org/x/sys/unix"
)

// progLink is what /proc/self/fd/N links to for a BPF program's
// descriptor (the anon inode's name, kernel/bpf/syscall.c).
const progLink = "anon_inode:bpf-prog"

// programs are the Options.Programs opened by an owner: a duplicate of
// each descriptor, closed with the rings, and the skipped runs last read.
type programs struct {
	fds []int // duplicates of the caller's; empty in tests
	// stats reads a program's counts: kernel.GetProgStats, or a test's.
	stats func(fd int) (kernel.ProgStats, error)

	// mu serialises reads and close: Stats may run on any goroutine,
	// also while the rings are freed.
	mu     sync.Mutex
	closed bool
	missed []uint64 // as fds: each program's recursion_misses last read
}

// openPrograms checks that each of fds is a BPF program's descriptor
// and holds a duplicate of it, so that the counts stay readable until
// close even if the caller closes its own first; nil for no fds.
//
// Errors name the field: EBADF for a closed descriptor (or a negative
// one), os.ErrInvalid for a descriptor of something else (a map, a
// file).
func openPrograms(fds []int) (*programs, error) {
	if len(fds) == 0 {
		return nil, nil
	}
	p := &programs{stats: kernel.GetProgStats, missed: make([]uint64, len(fds))}
	for i, fd := range fds {
		own, err := ownProgram(fd)
		if err != nil {
			p.close()
			return nil, fmt.Errorf("options Programs[%d]: %w", i, err)
		}
		p.fds = append(p.fds, own)
	}
	p.read() // counts since the programs loaded, as the failure map's
	return p, nil
}

// ownProgram returns a duplicate of fd that is a BPF program's.
func ownProgram(fd int) (int, error) {
	if fd < 0 {
		return -1, fmt.Errorf("program fd %d: %w", fd, unix.EBADF)
	}
	own, err := unix.FcntlInt(uintptr(fd), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return -1, fmt.Errorf("program fd %d: duplicate: %w", fd, err)
	}
	// The duplicate is what is checked, as ownMap's: the caller's number
	// may be another object's by now.
	link, err := os.Readlink("/proc/self/fd/" + strconv.Itoa(own))
	if err == nil && link != progLink {
		err = fmt.Errorf("is %s, not a BPF program: %w", link, os.ErrInvalid)
	}
	if err != nil {
		unix.Close(own)
		return -1, fmt.Errorf("program fd %d: %w", fd, err)
	}
	return own, nil
}

// NotRun returns the runs of the programs that the kernel skipped since
// they loaded: what they hold now, or, once p is closed, what they held
// then. A read that fails keeps a program's last count (they only grow).
// A nil p has none.
func (p *programs) NotRun() uint64 {
	if p == nil {
		return 0
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.closed {
		p.read()
	}
	var n uint64
	for _, m := range p.missed {
		n += m
	}
	return n
}

// read reads each program's recursion_misses into p.missed; p.mu is held
// (or p is not shared yet).
func (p *programs) read() {
	for i, fd := range p.fds {
		if s, err := p.stats(fd); err == nil {
			p.missed[i] = s.RecursionMisses
		}
	}
}

// close reads the counts a last time, for Stats after Close, and closes
// the descriptors. Idempotent; nothing on a nil p.
func (p *programs) close() {
	if p == nil {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return
	}
	p.read()
	p.closed = true
	for _, fd := range p.fds {
		unix.Close(fd)
	}
}

// addTo puts the skipped runs on st, as NotRun, where mergeFailures
// puts the failures of no ring's CPU: on a ring buffer read alone, its one
// entry; otherwise an entry of its own, appended, with Ring and CPU -1 (a
// program's runs are no ring's), once there is one. It returns st, grown.
func (p *programs) addTo(st []Stats) []Stats {
	n := p.NotRun()
	switch {
	case n == 0:
		return st
	case readAlone(st):
		st[0].NotRun = n
		return st
	}
	return append(st, Stats{Ring: -1, CPU: -1, NotRun: n})
}
