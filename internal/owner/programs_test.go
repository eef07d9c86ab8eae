// SPDX-License-Identifier: Apache-2.0

package owner

import (
	"errors"
	"os"
	"reflect"
	"strings"
	"syscall"
	"testing"

	"github.com/perfbuf/perfbuf/internal/kernel"
	"github.com/perfbuf/perfbuf/internal/ringtest"
)

// fakePrograms returns programs over n programs whose recursion_misses
// are misses[k] (read at each call); fail makes the reads fail.
func fakePrograms(misses []uint64, fail *bool) *programs {
	p := &programs{fds: make([]int, len(misses)), missed: make([]uint64, len(misses))}
	for k := range p.fds {
		p.fds[k] = -1 - k // closed by close: unix.Close fails on them, harmlessly
	}
	p.stats = func(fd int) (kernel.ProgStats, error) {
		if *fail {
			return kernel.ProgStats{}, syscall.ENOMEM
		}
		return kernel.ProgStats{RecursionMisses: misses[-1-fd]}, nil
	}
	p.read()
	return p
}

// The skipped runs go where a ring's reader finds them: in the one entry
// of a ring buffer read alone, else in an entry of their own, last, once
// there are some.
func TestProgramsAddTo(t *testing.T) {
	ring := func(r, cpu int) Stats { return Stats{Ring: r, CPU: cpu, Tally: Tally{Samples: 5}} }
	notRun := func(s Stats, n uint64) Stats { s.NotRun = n; return s }
	own := func(n uint64) Stats { return Stats{Ring: -1, CPU: -1, NotRun: n} }
	cases := []struct {
		name   string
		misses []uint64
		st     []Stats
		want   []Stats
	}{
		{"none yet", []uint64{0, 0}, []Stats{ring(0, 0), ring(1, 1)}, []Stats{ring(0, 0), ring(1, 1)}},
		{"perf event array", []uint64{3, 4}, []Stats{ring(0, 0), ring(1, 1)}, []Stats{ring(0, 0), ring(1, 1), own(7)}},
		{"ring buffer alone", []uint64{2}, []Stats{ring(0, -1)}, []Stats{notRun(ring(0, -1), 2)}},
		{"ring buffers", []uint64{2}, []Stats{ring(0, -1), ring(1, -1)}, []Stats{ring(0, -1), ring(1, -1), own(2)}},
		// A CPU's failures in an entry of its own (mergeFailures) are
		// that CPU's: the programs' come after them.
		{"after a cpu's failures", []uint64{1}, []Stats{ring(0, -1), {Ring: -1, CPU: 3, Failed: Failures{Full: 1}}},
			[]Stats{ring(0, -1), {Ring: -1, CPU: 3, Failed: Failures{Full: 1}}, own(1)}},
		// One perf ring, on the only CPU: a CPU's ring, not a shared one.
		{"one perf ring", []uint64{1}, []Stats{ring(0, 0)}, []Stats{ring(0, 0), own(1)}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			fail := false
			if got := fakePrograms(tc.misses, &fail).addTo(tc.st); !reflect.DeepEqual(got, tc.want) {
				t.Errorf("got %+v\nwant %+v", got, tc.want)
			}
		})
	}
	var none *programs
	if got := none.addTo([]Stats{ring(0, 0)}); len(got) != 1 || got[0] != ring(0, 0) {
		t.Errorf("nil programs: %+v", got)
	}
}

// NotRun reads the programs at each call until close, which reads them a
// last time; a failed read keeps a program's last count.
func TestProgramsNotRunCounts(t *testing.T) {
	misses, fail := []uint64{1, 2}, false
	p := fakePrograms(misses, &fail)
	if n := p.NotRun(); n != 3 {
		t.Fatalf("NotRun %d, want 3", n)
	}
	misses[0] = 5
	fail = true
	if n := p.NotRun(); n != 3 {
		t.Errorf("NotRun after a failed read %d, want the last counts' 3", n)
	}
	fail = false
	misses[1] = 4
	p.close()
	misses[0] = 100
	if n := p.NotRun(); n != 9 {
		t.Errorf("NotRun after close %d, want close's 9", n)
	}
	p.close() // idempotent
	var none *programs
	none.close()
	if none.NotRun() != 0 {
		t.Error("nil programs: NotRun not 0")
	}
}

// openPrograms refuses what is not a BPF program's descriptor, naming the
// field's index, and leaves nothing open; without privileges no real
// program can be made, so the refusals are what is tested here (the
// privileged selftest/failures opens real ones).
func TestOpenProgramsRefused(t *testing.T) {
	efd := ringtest.EventFD(t)
	if p, err := openPrograms(nil); p != nil || err != nil {
		t.Errorf("no programs: %v, %v; want nil, nil", p, err)
	}
	for _, tc := range []struct {
		name string
		fd   int
		want error
		says string
	}{
		{"an eventfd", efd, os.ErrInvalid, "anon_inode:[eventfd], not a BPF program"},
		{"no descriptor", 1 << 20, syscall.EBADF, "duplicate"},
		{"negative", -1, syscall.EBADF, "program fd -1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := ringtest.OpenFDs(t)
			p, err := openPrograms([]int{tc.fd})
			if p != nil || !errors.Is(err, tc.want) || !strings.Contains(err.Error(), "options Programs[0]") || !strings.Contains(err.Error(), tc.says) {
				t.Errorf("%v, %v; want %v naming Programs[0] and saying %q", p, err, tc.want, tc.says)
			}
			if after := ringtest.OpenFDs(t); after != before {
				t.Errorf("%d descriptors open after, %d before", after, before)
			}
		})
	}
}
