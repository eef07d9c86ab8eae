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
func perfArray256() perfbuf.Stats {
	rings := make([]perfbuf.Stats, hostCPUs)
	for i := range rings {
		rings[i] = perfbuf.Stats{CPU: i, Samples: 1, Failed: perfbuf.Failures{Invalid: 1}}
	}
	return sums(perfbuf.Stats{}, rings...)
}

// ringBuf256 is the Stats of one ring buffer shared by 256 CPUs, read
// alone: each CPU's full outputs are in its one entry, as Lost.
func ringBuf256() perfbuf.Stats {
	return sums(perfbuf.Stats{}, perfbuf.Stats{CPU: -1, Samples: 1, Lost: hostCPUs})
}

// ringBufArray256 is the Stats of an array of 256 ring buffers, one per
// CPU: each ring is every CPU's as far as the library knows (CPU -1), and
// the CPUs' full outputs are no ring's, in the sums only.
func ringBufArray256() perfbuf.Stats {
	var rings []perfbuf.Stats
	for range hostCPUs {
		rings = append(rings, perfbuf.Stats{CPU: -1, Samples: 1})
	}
	return sums(perfbuf.Stats{Lost: hostCPUs}, rings...)
}

// TestSeries256 counts the series one reader exports on a 256-CPU host, for
// each kind of map, by default and with PerCPU, and logs them (go test -v
// -run TestSeries256). Before the default aggregated, every count was per
// CPU: 4608, 4626 and 4626 series (the ring buffers' rings in cpu="-1").
// Before the ages and wakeups: 21, 21 and 3336 by default; 4866, 1551 and
// 4866 with PerCPU. Before MaxRingSeries, an array of 256 ring buffers
// exported a series set per ring by default: 3849 (15 a ring). Before
// Stats had the sums (16 series a ring, a cause full, the hotplug and
// exact Close gauges, failures per CPU of ring buffers): 26, 26 and 26;
// 5636, 1556 and 1556 with PerCPU.
func TestSeries256(t *testing.T) {
	const rings = 12 // 8 counters, 2 fill ratios, the size and the age
	for _, tc := range []struct {
		name          string
		stats         perfbuf.Stats
		size          int
		max           int // Options.MaxRingSeries
		want, wantCPU int
	}{
		// One series of the rings, the failures by cause and the
		// programs' runs not run (with PerCPU, the causes per CPU, and
		// the runs not run once, as no CPU's), the reader's wakeups.
		{"perf event array", perfArray256(), 64 << 10, 0,
			rings + len(causes) + 1 + 1, hostCPUs*(rings+len(causes)) + 1 + 1},
		// With PerCPU, the failures of no CPU's ring (cpu="").
		{"ring buffer", ringBuf256(), 16 << 20, 0,
			rings + len(causes) + 1 + 1, rings + len(causes) + 1 + 1},
		// More rings than MaxRingSeries: summed, as a perf event array's;
		// the lost samples of no ring in ring "none".
		{"array of ring buffers", ringBufArray256(), 256 << 10, 0,
			rings + 1 + len(causes) + 1 + 1, rings + 1 + len(causes) + 1 + 1},
		// A series per ring, asked for.
		{"array of ring buffers, no limit", ringBufArray256(), 256 << 10, -1,
			hostCPUs*rings + 1 + len(causes) + 1 + 1, hostCPUs*rings + 1 + len(causes) + 1 + 1},
		{"array of ring buffers, a series per ring up to 256", ringBufArray256(), 256 << 10, hostCPUs,
			hostCPUs*rings + 1 + len(causes) + 1 + 1, hostCPUs*rings + 1 + len(causes) + 1 + 1},
		{"array of ring buffers, a series per ring up to 255", ringBufArray256(), 256 << 10, hostCPUs - 1,
			rings + 1 + len(causes) + 1 + 1, rings + 1 + len(causes) + 1 + 1},
	} {
		src := &fakeReader{fakeSource: fakeSource{stats: tc.stats}}
		for range tc.stats.Rings {
			src.sizes = append(src.sizes, tc.size)
		}
		n := testutil.CollectAndCount(NewCollector(src, Options{MaxRingSeries: tc.max}))
		nCPU := testutil.CollectAndCount(NewCollector(src, Options{PerCPU: true, MaxRingSeries: tc.max}))
		t.Logf("%s, %d CPUs: %d series, %d with PerCPU", tc.name, hostCPUs, n, nCPU)
		if n != tc.want || nCPU != tc.wantCPU {
			t.Errorf("%s: %d series, %d with PerCPU; want %d, %d", tc.name, n, nCPU, tc.want, tc.wantCPU)
		}
	}
}
