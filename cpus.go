// SPDX-License-Identifier: Apache-2.0

package perfbuf

// CPU discovery: which CPUs get a ring.

import (
	"fmt"
	"os"

	"github.com/perfbuf/perfbuf/internal/cpus"
)

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
