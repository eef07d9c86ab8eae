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
// each kind of map, and logs them (go test -v -run TestSeries256).
func TestSeries256(t *testing.T) {
	for _, tc := range []struct {
		name  string
		stats []perfbuf.Stats
		want  int
	}{
		{"perf event array", perfArray256(), 256 * (12 + len(causes))},
		{"ring buffer", ringBuf256(), 257 * (12 + len(causes))},
		{"array of ring buffers", ringBufArray256(), 257 * (12 + len(causes))},
	} {
		n := testutil.CollectAndCount(NewCollector(&fakeSource{stats: tc.stats}, Options{}))
		t.Logf("%s, %d CPUs: %d series", tc.name, hostCPUs, n)
		if n != tc.want {
			t.Errorf("%s: %d series, want %d", tc.name, n, tc.want)
		}
	}
}
