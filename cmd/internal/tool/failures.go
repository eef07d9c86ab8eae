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

// FailuresText says how many reserves or outputs failed before reaching a
// ring, and why: "3 failed outputs (ring full 2, ENOENT 1)". A full ring
// buffer is the usual one on a ring buffer (bpf_ringbuf_reserve found no
// room: the C tools drop such an event without a word); a full perf ring
// is a lost record instead. ENOENT on a perf event array: an output on a
// CPU that came online after the rings were opened.
func FailuresText(f perfbuf.Failures) string {
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
	if f.Total() == 1 {
		plural = ""
	}
	return fmt.Sprintf("%d failed output%s (%s)", f.Total(), plural, strings.Join(causes, ", "))
}
