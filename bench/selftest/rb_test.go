// SPDX-License-Identifier: Apache-2.0

package bench

import (
	"fmt"
	"testing"

	"github.com/perfbuf/perfbuf/bench/internal/benchrun"
	"github.com/perfbuf/perfbuf/internal/bpfrun"
)

// rbObj is perfbench's ring buffer emitter (a 4 MiB BPF ring buffer),
// built by `make bpf`.
const rbObj = "../perfbench/bpf/rbbench.bpf.o"

// perfObj is perfbench's perf event array emitter, whose test runs take up
// to benchrun.MaxBatch samples, built by `make bpf`.
const perfObj = "../perfbench/bpf/perfbench.bpf.o"

// setupRB loads rbObj, closed at cleanup with the copies it loads.
func setupRB(tb testing.TB) *bpfrun.Emitter { tb.Helper(); return setupObj(tb, rbObj) }

// setupPerf loads perfObj, closed at cleanup with the copies it loads.
func setupPerf(tb testing.TB) *bpfrun.Emitter { tb.Helper(); return setupObj(tb, perfObj) }

func setupObj(tb testing.TB, path string) *bpfrun.Emitter {
	tb.Helper()
	requirePrivileges(tb)
	e, err := bpfrun.Open(path)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(e.Close)
	return e
}

// TestRBDrainCompare measures every ring buffer mode side by side: each
// reads exactly what was filled for it, and each timer runs once per round.
func TestRBDrainCompare(t *testing.T) {
	e := setupRB(t)
	for _, size := range []int{16, 1000} {
		t.Run(fmt.Sprint(size), func(t *testing.T) {
			// At 16 bytes a round is 150,000 samples, and libbpfgo takes
			// microseconds for each: part of a round. At 1000 bytes, three
			// rounds, so that the ring wraps.
			per := benchrun.RBPerRound(size)
			want := 1000
			if size > 64 {
				want = 2*per + 7
			}
			rounds := (want + per - 1) / per
			modes := benchrun.RBDrainModes
			tms := make([]*timer, len(modes))
			timers := make([]benchrun.Timer, len(modes))
			for i := range tms {
				tms[i] = &timer{tb: t}
				timers[i] = tms[i]
			}
			res, err := benchrun.RBDrainCompare(e, benchrun.DrainConfig{Size: size, Samples: want}, modes, timers)
			if err != nil {
				t.Fatal(err)
			}
			for i, mode := range modes {
				if res[i].Samples != want || res[i].Sum == 0 || tms[i].starts != rounds || tms[i].running {
					t.Errorf("%s: read %d of %d samples (sum %d), timer started %d times (want %d), running at the end: %v",
						mode, res[i].Samples, want, res[i].Sum, tms[i].starts, rounds, tms[i].running)
				}
			}
		})
	}
}

// The ring buffer drain refuses a perf event array.
func TestRBDrainNeedsRingBuffer(t *testing.T) {
	e := setup(t)
	if _, err := benchrun.RBDrain(e, benchrun.DrainConfig{Mode: benchrun.ModeC, Size: 16, Samples: 1}, &timer{tb: t}); err == nil {
		t.Error("a ring buffer drain over a perf event array ran")
	}
}

// TestRBSustained runs every ring buffer saturation mode briefly, at both
// test-run sizes, and checks the accounting: every sample emitted was
// received, and the loss is the program's failed outputs.
func TestRBSustained(t *testing.T) {
	e := setupRB(t)
	for _, batch := range benchrun.SustainedBatches {
		for _, mode := range benchrun.RBSustainedModes {
			t.Run(fmt.Sprintf("%s/%d", mode, batch), func(t *testing.T) {
				tm := &timer{tb: t}
				n := 20000 * len(e.CPUs)
				res, err := benchrun.RBSustained(e, benchrun.SustainedConfig{Mode: mode, Samples: n, Batch: batch}, tm)
				if err != nil {
					t.Fatal(err)
				}
				t.Logf("%s/%d: %.0f samples/s, emitted %d failed %d, received %d, wall %v",
					mode, batch, res.Rate(), res.Emitted, res.Failed, res.Received, res.Wall)
				if err := res.Check(); err != nil {
					t.Error(err)
				}
				if res.Emitted+res.Failed != uint64(n) || res.Batch != batch || tm.starts != 1 || tm.running {
					t.Errorf("emitted %d + failed %d != %d, batch %d, or timer started %d times (want 1)",
						res.Emitted, res.Failed, n, res.Batch, tm.starts)
				}
			})
		}
	}
}

// BenchmarkRBDrain/MODE/SIZE is BenchmarkDrain over a BPF ring buffer
// (benchrun.RBDrainCompare): each mode beside the C reference
// (ring_buffer__consume), round by round. One op is one sample.
func BenchmarkRBDrain(b *testing.B) {
	e := setupRB(b)
	for _, size := range benchrun.Sizes {
		for _, mode := range benchrun.RBDrainModes {
			b.Run(fmt.Sprintf("%s/%d", mode, size), func(b *testing.B) {
				modes, c := []string{mode}, &benchrun.Stopwatch{}
				timers := []benchrun.Timer{b}
				if mode != benchrun.ModeC {
					modes, timers = append(modes, benchrun.ModeC), append(timers, c)
				}
				b.ReportAllocs()
				b.SetBytes(int64(size))
				b.ResetTimer()
				res, err := benchrun.RBDrainCompare(e, benchrun.DrainConfig{Size: size, Samples: b.N}, modes, timers)
				if err != nil {
					b.Fatal(err)
				}
				sink += res[0].Sum
				b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N), "ns/sample")
				if c.Elapsed > 0 {
					b.ReportMetric(float64(b.Elapsed())/float64(c.Elapsed), "xC")
				}
			})
		}
	}
}
