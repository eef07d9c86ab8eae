// SPDX-License-Identifier: Apache-2.0

package overwrite

import (
	"testing"

	"github.com/perfbuf/perfbuf"
	"github.com/perfbuf/perfbuf/internal/bpfrun"
	"github.com/perfbuf/perfbuf/internal/kernel"
	"github.com/perfbuf/perfbuf/selftest/internal/bpftest"
	"golang.org/x/sys/unix"
)

// The program's side of a flight recorder: the BPF program's own time a
// sample (bpf_prog_info run_time_ns, BPF_ENABLE_STATS) as it writes 64-byte
// samples into a Recorder's backward perf rings, which no one reads. A
// wakeup raised from a program costs it several µs: a Recorder must raise
// none a sample.
func BenchmarkRecorderProgram(b *testing.B) {
	f := bpftest.Setup(b, backwardObj)
	rec, err := perfbuf.NewRecorder(f.Events, perfbuf.Options{RingBytes: 1 << 20})
	if err != nil {
		b.Fatal(err)
	}
	defer rec.Close()
	stats, err := kernel.EnableRunStats()
	if err != nil {
		b.Fatal(err)
	}
	defer unix.Close(stats)
	cpu := f.CPUs[0]
	// One sample a run, as a tracepoint's program writes: a batch of them
	// in one run would raise the wakeup of the first only.
	const batch = 1
	before, err := kernel.GetProgStats(f.Prog)
	if err != nil {
		b.Fatal(err)
	}
	n := 0
	for b.Loop() {
		if err := bpfrun.Emit(f.Prog, cpu, batch, 64, 0); err != nil {
			b.Fatal(err)
		}
		n += batch
	}
	after, err := kernel.GetProgStats(f.Prog)
	if err != nil {
		b.Fatal(err)
	}
	d := after.Sub(before)
	b.ReportMetric(float64(d.RunTime.Nanoseconds())/float64(n), "prog-ns/sample")
}
