// SPDX-License-Identifier: Apache-2.0

package overwrite

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/perfbuf/perfbuf"
	"github.com/perfbuf/perfbuf/internal/bpfrun"
	"github.com/perfbuf/perfbuf/selftest/internal/bpftest"
	"golang.org/x/sys/unix"
)

// producerEnv names, in a child of BenchmarkRecorderCost, the CPU it emits
// on; the emit program is its descriptor 3.
const producerEnv = "PERFBUF_OVERWRITE_PRODUCER_CPU"

// TestProducerProcess is BenchmarkRecorderCost's producer when run as its
// child: it emits 64-byte samples on one CPU flat out until killed. Run
// otherwise, it does nothing.
func TestProducerProcess(t *testing.T) {
	cpu, err := strconv.Atoi(os.Getenv(producerEnv))
	if err != nil {
		return
	}
	for {
		if err := bpfrun.Emit(3, cpu, 1<<16, 64, 0); err != nil {
			t.Fatal(err)
		}
	}
}

// taskClock returns the CPU time that this process's threads have run,
// their schedstat's first field summed (ns, every thread alive now: the Go
// runtime does not end its threads).
func taskClock(tb testing.TB) time.Duration {
	tb.Helper()
	dirs, err := filepath.Glob("/proc/self/task/*/schedstat")
	if err != nil {
		tb.Fatal(err)
	}
	var sum time.Duration
	for _, d := range dirs {
		b, err := os.ReadFile(d)
		if err != nil {
			continue // a thread that ended
		}
		ns, err := strconv.ParseInt(strings.Fields(string(b))[0], 10, 64)
		if err != nil {
			tb.Fatal(err)
		}
		sum += time.Duration(ns)
	}
	return sum
}

// wakeups returns this process's context switches, voluntary and not
// (getrusage): how often its threads slept or were put off a CPU.
func wakeups(tb testing.TB) int64 {
	tb.Helper()
	var ru unix.Rusage
	if err := unix.Getrusage(unix.RUSAGE_SELF, &ru); err != nil {
		tb.Fatal(err)
	}
	return ru.Nvcsw + ru.Nivcsw
}

// The cost of a flight recorder: the task clock of the recorder's process
// (this one) while a producer on each CPU, a process of its own, emits
// 64-byte samples flat out into the backward perf rings (4 MiB a CPU).
//
//   - idle: an op is one second of the recorder doing nothing, as between
//     two snapshots. Reported: task-ms/s, the process's CPU milliseconds a
//     second of wall time (the Go runtime's included), its context
//     switches a second, and the producers' samples a second.
//
//   - snapshot: an op is one Snapshot of every ring, whole. Reported: its
//     task-ms, the records and MiB it returned.
//
//     go test -run '^$' -bench RecorderCost -benchtime 5x ./selftest/overwrite/
func BenchmarkRecorderCost(b *testing.B) {
	f := bpftest.Setup(b, backwardObj)
	const ringBytes = 4 << 20
	rec, err := perfbuf.NewRecorder(f.Events, perfbuf.Options{RingBytes: ringBytes})
	if err != nil {
		b.Fatal(err)
	}
	defer rec.Close()
	prog := os.NewFile(uintptr(f.Prog), "emit")
	for _, cpu := range f.CPUs {
		cmd := exec.Command(os.Args[0], "-test.run=^TestProducerProcess$")
		cmd.Env = append(os.Environ(), producerEnv+"="+strconv.Itoa(cpu))
		cmd.ExtraFiles = []*os.File{prog}
		if err := cmd.Start(); err != nil {
			b.Fatal(err)
		}
		defer cmd.Wait()
		defer cmd.Process.Kill()
	}
	time.Sleep(time.Second) // the producers start, the rings fill
	b.Run("idle", func(b *testing.B) {
		before := f.Stats(b)
		start, switches, wall := taskClock(b), wakeups(b), time.Now()
		for b.Loop() {
			time.Sleep(time.Second)
		}
		secs := time.Since(wall).Seconds()
		b.ReportMetric(float64(taskClock(b)-start)/1e6/secs, "task-ms/s")
		b.ReportMetric(float64(wakeups(b)-switches)/secs, "switches/s")
		var emitted uint64
		after := f.Stats(b)
		for _, cpu := range f.CPUs {
			emitted += after[cpu].Emitted - before[cpu].Emitted
		}
		b.ReportMetric(float64(emitted)/secs, "samples/s")
	})
	b.Run("snapshot", func(b *testing.B) {
		buf := make([]byte, len(f.CPUs)*ringBytes)
		var recs []perfbuf.Record
		var bytes int
		start, n := taskClock(b), 0
		for b.Loop() {
			if recs, err = rec.Snapshot(buf, recs[:0], false); err != nil {
				b.Fatal(err)
			}
			n++
			for _, r := range recs {
				bytes += len(r.Data)
			}
		}
		b.ReportMetric(float64(taskClock(b)-start)/1e6/float64(n), "task-ms/op")
		b.ReportMetric(float64(len(recs)), "records/op")
		b.ReportMetric(float64(bytes)/float64(n)/(1<<20), "MiB/op")
	})
}
