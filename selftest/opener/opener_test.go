// SPDX-License-Identifier: Apache-2.0

// Privileged selftests of perfbuf's own opener of perf rings
// (internal/kernel), which New and NewReader use where libbpf's perf_buffer
// refuses: every perf_buffer__new* reads /sys/devices/system/cpu/online into
// 128 bytes and fails with E2BIG on a longer list. Such lists need many
// CPUs with holes (selftest/hotplug's TestLongOnlineList, in the 128-CPU
// guest), so here the opener is forced (kernel.ForcePerfRings) on whatever
// host runs the tests, and every mode reads through it with exact
// accounting.
package opener

import (
	"errors"
	"testing"
	"time"

	"github.com/perfbuf/perfbuf"
	"github.com/perfbuf/perfbuf/internal/kernel"
	"github.com/perfbuf/perfbuf/selftest/internal/bpftest"
)

const obj = "bpf/opener.bpf.o"

// force makes perfbuf open perf rings with its own opener until the test
// ends, and returns how many rings that opener had opened before.
func force(t *testing.T) uint64 {
	t.Helper()
	kernel.ForcePerfRings.Store(true)
	t.Cleanup(func() { kernel.ForcePerfRings.Store(false) })
	return kernel.OpenedPerfRings()
}

// checkOpened checks that perfbuf's opener opened n rings since before.
func checkOpened(t *testing.T, before uint64, n int) {
	t.Helper()
	if got := kernel.OpenedPerfRings() - before; got != uint64(n) {
		t.Fatalf("perfbuf's opener opened %d rings, want %d (one per ring of the reader)", got, n)
	}
}

// emit emits rounds bursts of n samples (24 to 24+span-1 bytes) on every
// CPU of f, calling drain after each round: with small rings, samples are
// lost, and the accounting covers lost records too.
func emit(t *testing.T, f *bpftest.Fixture, rounds int, drain func()) {
	t.Helper()
	for range rounds {
		for _, cpu := range f.CPUs {
			f.Emit(t, cpu, 100, 24, 100)
		}
		drain()
	}
	// A last small sample per CPU: the kernel writes a LOST record it holds
	// back only with the next sample.
	for _, cpu := range f.CPUs {
		f.Emit(t, cpu, 1, 8, 0)
	}
	drain()
}

// TestOpenerCallback: callback mode, woken by Poll through the opener's
// epoll set (by events, then by a watermark), and drained by Consume.
func TestOpenerCallback(t *testing.T) {
	for _, tc := range []struct {
		name string
		opts perfbuf.Options
	}{
		{"events", perfbuf.Options{RingBytes: 1 << 12}},
		{"watermark", perfbuf.Options{RingBytes: 1 << 12, WakeupBytes: 1 << 10}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := force(t)
			f := bpftest.Setup(t, obj)
			c := bpftest.NewCollector()
			pb, err := perfbuf.New(f.Events, c.Sample, c.LostFn, tc.opts)
			if err != nil {
				t.Fatal(err)
			}
			defer pb.Close()
			checkOpened(t, before, pb.BufferCount())
			// One sample wakes by events; 40 of 64 bytes (88-byte
			// records) pass the watermark. Either way Poll returns
			// without its timeout.
			f.Emit(t, f.CPUs[0], 40, 64, 0)
			n, err := pb.Poll(time.Minute)
			if err != nil || n == 0 {
				t.Fatalf("Poll: %d records, %v; want the wakeup of the opener's event", n, err)
			}
			emit(t, f, 5, func() {
				if _, err := pb.Consume(); err != nil {
					t.Fatal(err)
				}
			})
			c.CheckAccounting(t, f)
			c.CheckStats(t, pb.Stats().Rings)
		})
	}
}

// TestOpenerReaders: the fullest-first Reader and the ordered one read
// through the opener's rings, lost records included.
func TestOpenerReaders(t *testing.T) {
	for _, tc := range []struct {
		name string
		opts perfbuf.ReaderOptions
	}{
		{"fullest", perfbuf.ReaderOptions{Options: perfbuf.Options{RingBytes: 1 << 12}}},
		{"ordered", perfbuf.ReaderOptions{Options: perfbuf.Options{RingBytes: 1 << 12}, Order: &perfbuf.Order{KeyOffset: 8}}}, // emit_hdr.ts
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := force(t)
			f := bpftest.Setup(t, obj)
			c := bpftest.NewCollector()
			r, err := perfbuf.NewReader(f.Events, tc.opts)
			if err != nil {
				t.Fatal(err)
			}
			defer r.Close()
			r.SetDeadline(time.Now().Add(time.Minute))
			checkOpened(t, before, r.BufferCount())
			emit(t, f, 5, func() {
				r.Flush()
				var s perfbuf.Sample
				for {
					err := r.ReadInto(&s)
					if errors.Is(err, perfbuf.ErrFlushed) {
						return
					}
					if err != nil {
						t.Fatal(err)
					}
					switch s.Type {
					case perfbuf.RecordSample:
						c.Sample(s.CPU, s.Data)
					case perfbuf.RecordLost:
						c.LostFn(s.CPU, s.Lost)
					}
				}
			})
			c.CheckAccounting(t, f)
			c.CheckStats(t, r.Stats().Rings)
		})
	}
}

// TestOpenerClose: Close empties the map's slots (the core's unlink) and
// closes everything the opener opened: outputs then fail as ENOENT, and
// the process holds as many descriptors as before New.
func TestOpenerClose(t *testing.T) {
	force(t)
	f := bpftest.Setup(t, obj)
	// A first New and Close opens what the process keeps (the runtime's
	// netpoller, which the uevent socket starts).
	pb, err := perfbuf.NewRaw(f.Events, perfbuf.Options{})
	if err != nil {
		t.Fatal(err)
	}
	pb.Close()
	fds := bpftest.OpenFDs(t)
	before := kernel.OpenedPerfRings()
	pb, err = perfbuf.NewRaw(f.Events, perfbuf.Options{})
	if err != nil {
		t.Fatal(err)
	}
	checkOpened(t, before, pb.BufferCount())
	if err := pb.Close(); err != nil {
		t.Fatal(err)
	}
	if now := bpftest.OpenFDs(t); now != fds {
		t.Errorf("%d descriptors open after Close, %d before New", now, fds)
	}
	start := f.Stats(t)
	for _, cpu := range f.CPUs {
		f.Emit(t, cpu, 3, 16, 0)
	}
	end := f.Stats(t)
	for _, cpu := range f.CPUs {
		if failed := end[cpu].Failed - start[cpu].Failed; failed != 3 {
			t.Errorf("cpu %d: %d of 3 outputs failed after Close, want all: its slot still holds a ring", cpu, failed)
		}
	}
}
