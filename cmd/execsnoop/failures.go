package main

import (
	"fmt"
	"strings"

	"github.com/perfbuf/perfbuf"
)

// sumFailures adds up the failed outputs of every Stats entry (rings, and
// CPUs that had failures but no ring).
func sumFailures(stats []perfbuf.Stats) perfbuf.Failures {
	var sum perfbuf.Failures
	for _, s := range stats {
		f := s.Failed
		sum.NoEntry += f.NoEntry
		sum.TooBig += f.TooBig
		sum.Invalid += f.Invalid
		sum.NotOnCPU += f.NotOnCPU
		sum.Other += f.Other
	}
	return sum
}

// failuresText says how many outputs failed before reaching a ring, and
// why, by the errno bpf_perf_event_output returned:
// "3 failed outputs (ENOENT 2, EOPNOTSUPP 1)". ENOENT is the usual one: an
// exec on a CPU that came online after the rings were opened.
func failuresText(f perfbuf.Failures) string {
	var causes []string
	for _, c := range []struct {
		errno string
		n     uint64
	}{{"ENOENT", f.NoEntry}, {"E2BIG", f.TooBig}, {"EINVAL", f.Invalid}, {"EOPNOTSUPP", f.NotOnCPU}, {"other", f.Other}} {
		if c.n > 0 {
			causes = append(causes, fmt.Sprintf("%s %d", c.errno, c.n))
		}
	}
	plural := "s"
	if f.Total() == 1 {
		plural = ""
	}
	return fmt.Sprintf("%d failed output%s (%s)", f.Total(), plural, strings.Join(causes, ", "))
}
