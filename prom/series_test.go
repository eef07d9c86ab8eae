// SPDX-License-Identifier: Apache-2.0

package prom

import (
	"testing"

	"github.com/perfbuf/perfbuf"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// hostCPUs is the CPU count of the series test: a large host.
const hostCPUs = 256

// perfArray256 is the Stats of a perf event array with a ring on each of
// 256 CPUs.
func perfArray256() []perfbuf.Stats {
	st := make([]perfbuf.Stats, hostCPUs)
	for i := range st {
		st[i] = perfbuf.Stats{Ring: i, CPU: i, Samples: 1, Failed: perfbuf.Failures{Invalid: 1}}
	}
	return st
}

// ringBuf256 is the Stats of one ring buffer shared by 256 CPUs, each with
// failures of its own (Ring -1).
func ringBuf256() []perfbuf.Stats {
	st := []perfbuf.Stats{{Ring: 0, CPU: -1, Samples: 1}}
	for cpu := range hostCPUs {
		st = append(st, perfbuf.Stats{Ring: -1, CPU: cpu, Failed: perfbuf.Failures{Full: 1}})
	}
	return st
}

// ringBufArray256 is the Stats of an array of 256 ring buffers, one per
// CPU: each ring is every CPU's as far as the library knows (CPU -1), and
// each CPU's failures come in entries of their own.
func ringBufArray256() []perfbuf.Stats {
	var st []perfbuf.Stats
	for i := range hostCPUs {
		st = append(st, perfbuf.Stats{Ring: i, CPU: -1, Samples: 1})
	}
	for cpu := range hostCPUs {
		st = append(st, perfbuf.Stats{Ring: -1, CPU: cpu, Failed: perfbuf.Failures{Full: 1}})
	}
	return st
}

// TestSeries256 counts the series one reader exports on a 256-CPU host, for
// each kind of map, by default and with PerCPU, and logs them (go test -v
// -run TestSeries256). Before the default aggregated, every count was per
// CPU: 4608, 4626 and 4626 series (the ring buffers' rings in cpu="-1").
// Before the ages and wakeups: 21, 21 and 3336 by default; 4866, 1551 and
// 4866 with PerCPU. Before MaxRingSeries, an array of 256 ring buffers
// exported a series set per ring by default: 3849 (15 a ring).
func TestSeries256(t *testing.T) {
	const rings = 16 // 11 counters, 2 fill ratios, the size and 2 ages
	for _, tc := range []struct {
		name          string
		stats         []perfbuf.Stats
		size          int
		max           int // Options.MaxRingSeries
		want, wantCPU int
	}{
		// One series of the rings, the failures by cause and the
		// programs' runs not run (with PerCPU, the causes per CPU, and
		// the runs not run once, as no CPU's), 3 series of the reader
		// (wakeups, hotplug, an exact Close).
		{"perf event array", perfArray256(), 64 << 10, 0,
			rings + len(causes) + 1 + 3, hostCPUs*(rings+len(causes)) + 1 + 3},
		{"ring buffer", ringBuf256(), 16 << 20, 0,
			rings + len(causes) + 1 + 3, rings + hostCPUs*len(causes) + 1 + 3},
		// More rings than MaxRingSeries: summed, as a perf event array's.
		{"array of ring buffers", ringBufArray256(), 256 << 10, 0,
			rings + len(causes) + 1 + 3, rings + hostCPUs*len(causes) + 1 + 3},
		// A series per ring, asked for.
		{"array of ring buffers, no limit", ringBufArray256(), 256 << 10, -1,
			hostCPUs*rings + len(causes) + 1 + 3, hostCPUs*(rings+len(causes)) + 1 + 3},
		{"array of ring buffers, a series per ring up to 256", ringBufArray256(), 256 << 10, hostCPUs,
			hostCPUs*rings + len(causes) + 1 + 3, hostCPUs*(rings+len(causes)) + 1 + 3},
		{"array of ring buffers, a series per ring up to 255", ringBufArray256(), 256 << 10, hostCPUs - 1,
			rings + len(causes) + 1 + 3, rings + hostCPUs*len(causes) + 1 + 3},
	} {
		src := &fakeReader{fakeSource: fakeSource{stats: tc.stats}, follows: true}
		for _, st := range tc.stats {
			if st.Ring >= 0 {
				src.sizes = append(src.sizes, tc.size)
			}
		}
		n := testutil.CollectAndCount(NewCollector(src, Options{MaxRingSeries: tc.max}))
		nCPU := testutil.CollectAndCount(NewCollector(src, Options{PerCPU: true, MaxRingSeries: tc.max}))
		t.Logf("%s, %d CPUs: %d series, %d with PerCPU", tc.name, hostCPUs, n, nCPU)
		if n != tc.want || nCPU != tc.wantCPU {
			t.Errorf("%s: %d series, %d with PerCPU; want %d, %d", tc.name, n, nCPU, tc.want, tc.wantCPU)
		}
	}
}
