// SPDX-License-Identifier: Apache-2.0

// Benchmarks of every mode beside the C reference (bench/internal/cref), over
// real rings filled by BPF (bpf/bench.bpf.c, through BPF_PROG_TEST_RUN).
// The measurements themselves live in bench/internal/benchrun, which
// bench/perfbench runs too; these wrap them for `go test -bench`.
//
//   - BenchmarkDrain/MODE/SIZE: rings pre-filled (untimed), then drained in
//     one timed pass per round, round by round beside the C reference
//     (benchrun.DrainCompare). One op is one sample: ns/op is ns per
//     sample, allocs/op allocations per sample, xC the time over the C
//     reference's in the same rounds. Every mode fills CPU 0's ring but
//     the ordered ones, which fill both CPUs in alternating batches so
//     that they merge two rings (bench/internal/benchrun/ordered.go says why),
//     and their reference C-2cpu, the C reference over that fill.
//   - BenchmarkSustained/MODE: producers on every CPU emit b.N 64-byte
//     samples in all while the mode consumes; one op is one sample, ns/op
//     is wall time per sample, and samples/s and lost are reported.
//   - BenchmarkRBDrain/MODE/SIZE: the same over a 4 MiB BPF ring buffer
//     (../perfbench/bpf/rbbench.bpf.o) filled to 90 %, beside C's
//     ring_buffer__consume, with cilium/ebpf's and libbpfgo's readers too
//     (rb_test.go).
//
// TestDrain and TestSustained check that the harness reads what it fills;
// TestRBDrainCompare and TestRBSustained do for ring buffers.
// The benchmarks need root (see requirePrivileges):
//
//	go test -run '^$' -bench . -benchtime 1000000x ./bench/selftest
package bench

import (
	"fmt"
	"os"
	"testing"

	"github.com/perfbuf/perfbuf/bench/internal/benchrun"
	"github.com/perfbuf/perfbuf/internal/bpfrun"
)

const obj = "bpf/bench.bpf.o"

// sink keeps the benchmarks' reads alive.
var sink uint64

// setup loads obj (built by `make bpf`) and finds its emitter, closed at
// cleanup with the copies it loads. It is selftest/internal/bpftest's
// Setup, which Go's internal rule keeps out of reach from bench/.
func setup(tb testing.TB) *bpfrun.Emitter { tb.Helper(); return setupObj(tb, obj) }

// requirePrivileges skips the test when it cannot load BPF programs, except
// under CI (CI=true), where a privileged test that cannot run must fail.
func requirePrivileges(tb testing.TB) {
	tb.Helper()
	err := bpfrun.CheckPrivileges()
	if err == nil {
		return
	}
	if os.Getenv("CI") == "true" {
		tb.Fatalf("privileged selftest cannot run under CI: %v", err)
	}
	tb.Skipf("privileged selftest: %v", err)
}

func BenchmarkDrain(b *testing.B) {
	e := setup(b)
	for _, size := range benchrun.Sizes {
		for _, mode := range benchrun.DrainModes {
			b.Run(fmt.Sprintf("%s/%d", mode, size), func(b *testing.B) {
				// Beside its C reference, round by round, unless this is
				// the C reference; C-2cpu beside C.
				modes, c := []string{mode}, &benchrun.Stopwatch{}
				timers := []benchrun.Timer{b}
				ref := benchrun.Reference(mode)
				if mode == ref {
					ref = benchrun.ModeC
				}
				if mode != ref {
					modes, timers = append(modes, ref), append(timers, c)
				}
				b.ReportAllocs()
				b.SetBytes(int64(size))
				b.ResetTimer()
				res, err := benchrun.DrainCompare(e, benchrun.DrainConfig{Size: size, Samples: b.N}, modes, timers)
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

func BenchmarkSustained(b *testing.B) {
	e := setup(b)
	for _, mode := range benchrun.SustainedModes {
		b.Run(mode, func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(benchrun.SustainedSize)
			b.ResetTimer()
			res, err := benchrun.Sustained(e, benchrun.SustainedConfig{Mode: mode, Samples: b.N}, b)
			if err != nil {
				b.Fatal(err)
			}
			// Accounting, not timing: what the emitter counts as failed
			// is what the reader must report lost.
			if err := res.Check(); err != nil {
				b.Error(err)
			}
			b.ReportMetric(res.Rate(), "samples/s")
			b.ReportMetric(float64(res.Lost), "lost")
			b.ReportMetric(float64(res.Wall.Milliseconds()), "wall-ms")
		})
	}
}
