// SPDX-License-Identifier: Apache-2.0

package bench

import (
	"fmt"
	"path/filepath"
	"testing"

	"github.com/aquasecurity/libbpfgo"
	"github.com/perfbuf/perfbuf/bench/internal/benchrun"
	"github.com/perfbuf/perfbuf/internal/bpfrun"
)

// timer is a benchrun.Timer that checks the calls pair up.
type timer struct {
	tb      testing.TB
	running bool
	starts  int
}

func (t *timer) StartTimer() {
	if t.running {
		t.tb.Error("StartTimer while running")
	}
	t.running = true
	t.starts++
}

func (t *timer) StopTimer() { t.running = false }

// TestDrain runs every drain mode over a few rounds (so the rings wrap) and
// checks that each reads what was filled, timing only the drains.
func TestDrain(t *testing.T) {
	e := setup(t)
	for _, size := range []int{16, 1000} {
		for _, mode := range benchrun.DrainModes {
			t.Run(fmt.Sprintf("%s/%d", mode, size), func(t *testing.T) {
				per := benchrun.PerRound(benchrun.DrainPages, size)
				want := 2*per + per/3
				tm := &timer{tb: t}
				res, err := benchrun.Drain(e, benchrun.DrainConfig{Mode: mode, Size: size, Samples: want}, tm)
				if err != nil {
					t.Fatal(err)
				}
				if res.Samples != want || tm.starts != 3 || tm.running {
					t.Errorf("read %d of %d samples, timer started %d times (want 3), running at the end: %v",
						res.Samples, want, tm.starts, tm.running)
				}
			})
		}
	}
}

// TestDrainCompare measures every mode side by side: each reads exactly
// what was filled for it (each mode has a copy of the emitter, with a perf
// event array of its own), and each timer runs once per round.
func TestDrainCompare(t *testing.T) {
	e := setup(t)
	size := 64
	per := benchrun.PerRound(benchrun.DrainPages, size)
	want := 2*per + 5
	modes := benchrun.DrainModes
	tms := make([]*timer, len(modes))
	timers := make([]benchrun.Timer, len(modes))
	for i := range tms {
		tms[i] = &timer{tb: t}
		timers[i] = tms[i]
	}
	res, err := benchrun.DrainCompare(e, benchrun.DrainConfig{Size: size, Samples: want}, modes, timers)
	if err != nil {
		t.Fatal(err)
	}
	for i, mode := range modes {
		if res[i].Samples != want || res[i].Sum == 0 || tms[i].starts != 3 || tms[i].running {
			t.Errorf("%s: read %d of %d samples (sum %d), timer started %d times (want 3), running at the end: %v",
				mode, res[i].Samples, want, res[i].Sum, tms[i].starts, tms[i].running)
		}
	}
}

// TestSustained runs every sustained mode briefly and checks the
// accounting: received equals emitted, lost equals failed. It runs on obj,
// whose test runs take up to 256 samples, as BenchmarkSustained does, and
// on perfbench's emitter (perfObj) at each of SustainedBatches, up to 4096
// samples per test run, as perfbench does.
func TestSustained(t *testing.T) {
	for _, em := range []struct {
		e       *bpfrun.Emitter
		batches []int
	}{{setup(t), []int{benchrun.SustainedBatch}}, {setupPerf(t), benchrun.SustainedBatches}} {
		for _, batch := range em.batches {
			for _, mode := range benchrun.SustainedModes {
				t.Run(fmt.Sprintf("%s/%s/%d", filepath.Base(em.e.Obj), mode, batch), func(t *testing.T) {
					tm := &timer{tb: t}
					n := 20000 * len(em.e.CPUs)
					res, err := benchrun.Sustained(em.e, benchrun.SustainedConfig{Mode: mode, Samples: n, Batch: batch}, tm)
					if err != nil {
						t.Fatal(err)
					}
					t.Logf("%s/%d: %.0f samples/s, emitted %d failed %d, received %d lost %d late %d, wall %v",
						mode, batch, res.Rate(), res.Emitted, res.Failed, res.Received, res.Lost, res.Late, res.Wall)
					if err := res.Check(); err != nil {
						t.Error(err)
					}
					if res.Emitted+res.Failed < uint64(n) || res.Batch != batch || tm.starts != 1 || tm.running {
						t.Errorf("emitted %d + failed %d < %d, batch %d, or timer started %d times (want 1)",
							res.Emitted, res.Failed, n, res.Batch, tm.starts)
					}
				})
			}
		}
	}
}

// A test run larger than the emitter takes is an error, not fewer samples:
// obj's program takes 256 samples a run, and no emitter more than MaxBatch.
// Every CPU's share is 4 runs, whatever the CPU count, so that each
// producer asks for a run of batch samples.
func TestSustainedBatchTooLarge(t *testing.T) {
	e := setup(t)
	for _, batch := range []int{benchrun.SustainedBatch + 1, benchrun.MaxBatch + 1} {
		samples := 4 * batch * len(e.CPUs)
		_, err := benchrun.Sustained(e, benchrun.SustainedConfig{Mode: benchrun.ModeC, Samples: samples, Batch: batch}, &timer{tb: t})
		if err == nil {
			t.Errorf("batch %d on %s: no error", batch, obj)
		}
	}
}

// The emitter's copies (one per mode in DrainCompare) are loaded once and
// kept, each with a perf event array and a program of its own.
func TestEmitterCopies(t *testing.T) {
	e := setup(t)
	c0, err := e.Copy(0)
	if err != nil {
		t.Fatal(err)
	}
	c1, err := e.Copy(1)
	if err != nil {
		t.Fatal(err)
	}
	if again, err := e.Copy(0); err != nil || again != c0 {
		t.Errorf("Copy(0) again: %p, %v; want the copy loaded first, %p", again, err, c0)
	}
	ids := map[uint32]string{}
	for name, em := range map[string]*bpfrun.Emitter{"emitter": e, "copy 0": c0, "copy 1": c1} {
		info, err := libbpfgo.GetMapInfoByFD(em.Events.FileDescriptor())
		if err != nil {
			t.Fatal(err)
		}
		if other, dup := ids[info.ID]; dup {
			t.Errorf("%s and %s share perf event array %d", name, other, info.ID)
		}
		ids[info.ID] = name
	}
}
