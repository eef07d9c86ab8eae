// Drain benchmarks: every mode beside the C reference, over rings that BPF
// pre-fills on one CPU before each timed drain. One op is one sample, so
// ns/op is ns per sample and allocs/op is allocations per sample.
//
//	go test -run '^$' -bench Drain -benchtime 2000000x ./selftest/bench
package bench

import (
	"fmt"
	"runtime"
	"testing"

	"github.com/aquasecurity/libbpfgo"
	"github.com/perfbuf/perfbuf"
	"github.com/perfbuf/perfbuf/selftest/internal/bpftest"
	"golang.org/x/sys/unix"
)

const (
	pages   = 64 // 256 KiB rings, the default
	fillCPU = 0
)

var sizes = []int{16, 64, 256, 1024}

// sink keeps the benchmarks' reads alive.
var sink uint64

type fixture struct {
	mod    *libbpfgo.Module
	events *libbpfgo.BPFMap
	prog   int
}

func setup(b *testing.B) *fixture {
	m := bpftest.Load(b, "bpf/bench.bpf.o")
	return &fixture{mod: m, events: bpftest.Map(b, m, "events"), prog: bpftest.Prog(b, m, "emit")}
}

// pin runs the benchmark on another CPU than the one that fills the ring, as
// a reader runs beside its producers, so that every mode reads the ring
// under the same conditions. (On the filling CPU itself, each output's
// wakeup interrupts the test run: filling gets 30 times slower.) It returns
// the undo.
func pin(b *testing.B) func() {
	runtime.LockOSThread()
	var old, set unix.CPUSet
	if err := unix.SchedGetaffinity(0, &old); err != nil {
		b.Fatal(err)
	}
	set.Set((fillCPU + 1) % runtime.NumCPU())
	if err := unix.SchedSetaffinity(0, &set); err != nil {
		b.Fatal(err)
	}
	return func() {
		unix.SchedSetaffinity(0, &old)
		runtime.UnlockOSThread()
	}
}

// run drains b.N samples of size bytes in rounds: fill (untimed), then
// drain (timed).
func (f *fixture) run(b *testing.B, size int, drain func() (int, error)) {
	defer pin(b)()
	perRound := (pages*4096 - 4096) / perfbuf.SampleRecordSize(size)
	b.ReportAllocs()
	b.SetBytes(int64(size))
	b.ResetTimer()
	for left := b.N; left > 0; {
		k := min(perRound, left)
		b.StopTimer()
		bpftest.Emit(b, f.prog, fillCPU, uint64(k), uint64(size), 0)
		b.StartTimer()
		n, err := drain()
		if err != nil {
			b.Fatal(err)
		}
		if n != k {
			b.StopTimer()
			b.Fatalf("drained %d samples, filled %d", n, k)
		}
		left -= n
	}
	b.StopTimer()
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N), "ns/sample")
}

func BenchmarkDrain(b *testing.B) {
	f := setup(b)
	for _, size := range sizes {
		b.Run(fmt.Sprintf("C/%d", size), func(b *testing.B) {
			r, err := OpenCRef(f.events.FileDescriptor(), pages)
			if err != nil {
				b.Fatal(err)
			}
			defer r.Close()
			f.run(b, size, r.Consume)
			sink += r.Sum()
		})
		b.Run(fmt.Sprintf("callback/%d", size), func(b *testing.B) {
			var sum uint64
			pb, err := perfbuf.New(f.events, perfbuf.Options{PageCount: pages,
				SampleFunc: func(_ int, data []byte) { sum += ReadAll(data) }})
			if err != nil {
				b.Fatal(err)
			}
			defer pb.Close()
			f.run(b, size, pb.Consume)
			sink += sum
		})
		b.Run(fmt.Sprintf("raw-zerocopy/%d", size), func(b *testing.B) {
			var sum uint64
			f.runRaw(b, size, func(rec *perfbuf.Record) bool {
				sum += ReadAll(rec.Data) + ReadAll(rec.Wrapped)
				return true
			})
			sink += sum
		})
		b.Run(fmt.Sprintf("raw-copy/%d", size), func(b *testing.B) {
			var sum uint64
			buf := make([]byte, 0, 64<<10)
			f.runRaw(b, size, func(rec *perfbuf.Record) bool {
				buf = rec.AppendTo(buf[:0])
				sum += ReadAll(buf)
				return true
			})
			sink += sum
		})
	}
}

// runRaw benchmarks RawBuffer.Drain over the filled CPU's ring with fn.
func (f *fixture) runRaw(b *testing.B, size int, fn func(*perfbuf.Record) bool) {
	pb, err := perfbuf.New(f.events, perfbuf.Options{PageCount: pages})
	if err != nil {
		b.Fatal(err)
	}
	defer pb.Close()
	var rb *perfbuf.RawBuffer
	for i := 0; i < pb.BufferCount(); i++ {
		if cpu, _ := pb.CPU(i); cpu == fillCPU {
			if rb, err = pb.Buffer(i); err != nil {
				b.Fatal(err)
			}
		}
	}
	defer rb.Release()
	f.run(b, size, func() (int, error) { return rb.Drain(fn) })
}
