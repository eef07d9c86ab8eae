// SPDX-License-Identifier: Apache-2.0

package tool

// The failed outputs a tool reports in its summary (perfbuf.Stats.Failed).

import (
	"fmt"
	"strings"

	"github.com/perfbuf/perfbuf"
)

// SumFailures adds up the failed outputs of every Stats entry.
func SumFailures(stats []perfbuf.Stats) perfbuf.Failures {
	var sum perfbuf.Failures
	for _, s := range stats {
		sum = sum.Add(s.Failed)
	}
	return sum
}

// SumNotRun adds up the runs of the programs that the kernel skipped
// (perfbuf.Stats' NotRun, with perfbuf.Options.Programs).
func SumNotRun(stats []perfbuf.Stats) uint64 {
	var n uint64
	for _, s := range stats {
		n += s.NotRun
	}
	return n
}

// FailuresText says how many reserves or outputs failed before reaching a
// ring, and why: "3 failed outputs (ring full 2, ENOENT 1)". A full ring
// buffer is the usual one on a ring buffer (bpf_ringbuf_reserve found no
// room: the C tools drop such an event without a word); a full perf ring
// is a lost record instead. ENOENT on a perf event array: an output on a
// CPU that came online after the rings were opened. "" for none.
func FailuresText(f perfbuf.Failures) string {
	outputs := f.Total()
	if outputs == 0 {
		return ""
	}
	var causes []string
	for _, c := range []struct {
		name string
		n    uint64
	}{{"ring full", f.Full}, {"ENOENT", f.NoEntry}, {"E2BIG", f.TooBig}, {"EINVAL", f.Invalid},
		{"EOPNOTSUPP", f.NotOnCPU}, {"other", f.Other}} {
		if c.n > 0 {
			causes = append(causes, fmt.Sprintf("%s %d", c.name, c.n))
		}
	}
	plural := "s"
	if outputs == 1 {
		plural = ""
	}
	return fmt.Sprintf("%d failed output%s (%s)", outputs, plural, strings.Join(causes, ", "))
}

// SkippedText says how many runs of the programs (perfbuf.Options.Programs)
// the kernel skipped, n, a BPF program already running on the CPU, and so
// what was never traced: "5 program runs skipped by the kernel (execs not
// traced)" for what "execs". "" for none.
func SkippedText(n uint64, what string) string {
	if n == 0 {
		return ""
	}
	return fmt.Sprintf("%d program runs skipped by the kernel (%s not traced)", n, what)
}

// ProgramsEntry reports whether s is the entry of the programs' runs not
// run (Ring and CPU -1), which a tool's per-ring lines leave out.
func ProgramsEntry(s *perfbuf.Stats) bool { return s.Ring < 0 && s.CPU < 0 }
