// SPDX-License-Identifier: Apache-2.0

package tool

// The failed outputs a tool reports in its summary (perfbuf.Stats.Failed).

import (
	"fmt"
	"strings"

	"github.com/perfbuf/perfbuf"
)

// NoRing returns what st's sums count beyond its rings' entries
// (st.Rings): the lost samples and failed outputs of CPUs without a ring
// of their own, as on several ring buffers that CPUs share, where which
// ring an output was for cannot be told.
func NoRing(st *perfbuf.Stats) (lost uint64, failed perfbuf.Failures) {
	lost, failed = st.Lost, st.Failed
	for i := range st.Rings {
		r := &st.Rings[i]
		lost -= r.Lost
		failed.NoEntry -= r.Failed.NoEntry
		failed.TooBig -= r.Failed.TooBig
		failed.Invalid -= r.Failed.Invalid
		failed.NotOnCPU -= r.Failed.NotOnCPU
		failed.Other -= r.Failed.Other
	}
	return lost, failed
}

// FailuresText says how many reserves or outputs failed before reaching a
// ring, and why: "3 failed outputs (ENOENT 2, EINVAL 1)". A full ring is
// no failure but a lost sample (perfbuf.Stats' Lost), a ring buffer's as
// its failure map counts them. ENOENT on a perf event array: an output on
// a CPU that came online after the rings were opened. "" for none.
func FailuresText(f perfbuf.Failures) string {
	outputs := f.Total()
	if outputs == 0 {
		return ""
	}
	var causes []string
	for _, c := range []struct {
		name string
		n    uint64
	}{{"ENOENT", f.NoEntry}, {"E2BIG", f.TooBig}, {"EINVAL", f.Invalid},
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
