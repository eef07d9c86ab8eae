// SPDX-License-Identifier: Apache-2.0

package bpftest

import (
	"fmt"
	"sync"
	"testing"

	"github.com/aquasecurity/libbpfgo"
	"github.com/perfbuf/perfbuf"
	"github.com/perfbuf/perfbuf/internal/bpfrun"
	"github.com/perfbuf/perfbuf/internal/kernel"
)

// Fixture is a loaded selftest object with the emitter of emit.bpf.h.
type Fixture struct {
	Mod    *libbpfgo.Module
	Events *libbpfgo.BPFMap // the perf event array
	Prog   int              // the emit program
	CPUs   []int            // the CPUs the tests emit on
}

// Setup loads obj (built by `make bpf`) and finds the emitter.
func Setup(tb testing.TB, obj string) *Fixture {
	tb.Helper()
	e, err := bpfrun.NewEmitter(Load(tb, obj))
	if err != nil {
		tb.Fatal(err)
	}
	return &Fixture{Mod: e.Mod, Events: e.Events, Prog: e.Prog, CPUs: e.CPUs}
}

// Emit emits count samples on cpu (see the package-level Emit).
func (f *Fixture) Emit(tb testing.TB, cpu int, count, size, span uint64) {
	tb.Helper()
	Emit(tb, f.Prog, cpu, count, size, span)
}

// TryEmit is Emit for goroutines other than the test's: it returns the
// error instead of failing the test.
func (f *Fixture) TryEmit(cpu int, count, size, span uint64) error {
	return bpfrun.Emit(f.Prog, cpu, count, size, span)
}

// Stats reads the emitter's per-CPU counts.
func (f *Fixture) Stats(tb testing.TB) []EmitStats {
	tb.Helper()
	return Stats(tb, f.Mod)
}

// Entry is one sample as a Collector saw it.
type Entry struct {
	Seq uint64 // valid when SeqValid(Len)
	Len int    // delivered (padded) length
}

// Collector checks and counts what a reader delivers, per CPU: content,
// sequence numbers strictly increasing (none twice), lost counts. Safe for
// concurrent use.
type Collector struct {
	mu      sync.Mutex
	Samples map[int]int
	Lost    map[int]uint64
	Log     map[int][]Entry
	errs    []error
}

// NewCollector returns an empty Collector.
func NewCollector() *Collector {
	return &Collector{Samples: map[int]int{}, Lost: map[int]uint64{}, Log: map[int][]Entry{}}
}

// Sample checks and records one sample delivered for cpu.
func (c *Collector) Sample(cpu int, data []byte) {
	c.mu.Lock()
	defer c.mu.Unlock()
	h, err := Check(data, cpu)
	if err != nil {
		c.errs = append(c.errs, err)
		return
	}
	log := c.Log[cpu]
	if SeqValid(len(data)) {
		for i := len(log) - 1; i >= 0; i-- {
			if prev := log[i]; SeqValid(prev.Len) {
				if h.Seq <= prev.Seq {
					c.errs = append(c.errs, fmt.Errorf("cpu %d: seq %d after %d: duplicate or reordered", cpu, h.Seq, prev.Seq))
				}
				break
			}
		}
	}
	e := Entry{Len: len(data)}
	if SeqValid(len(data)) {
		e.Seq = h.Seq
	}
	c.Log[cpu] = append(log, e)
	c.Samples[cpu]++
}

// Count returns the number of samples of cpu seen so far.
func (c *Collector) Count(cpu int) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.Samples[cpu]
}

// LostFn records a lost count for cpu.
func (c *Collector) LostFn(cpu int, n uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.Lost[cpu] += n
}

// Check reports the errors seen so far.
func (c *Collector) Check(tb testing.TB) {
	tb.Helper()
	c.mu.Lock()
	defer c.mu.Unlock()
	for i, err := range c.errs {
		if i == 10 {
			tb.Errorf("... %d more errors", len(c.errs)-10)
			break
		}
		tb.Error(err)
	}
}

// CheckAccounting checks, for every CPU of f: samples received plus lost
// reported equals samples the program tried to emit, received equals
// emitted, and lost equals the outputs that failed.
func (c *Collector) CheckAccounting(tb testing.TB, f *Fixture) {
	tb.Helper()
	c.Check(tb)
	stats := f.Stats(tb)
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, cpu := range f.CPUs {
		st := stats[cpu]
		got, lost := uint64(c.Samples[cpu]), c.Lost[cpu]
		tb.Logf("cpu %d: emitted %d failed %d | received %d lost %d", cpu, st.Emitted, st.Failed, got, lost)
		if got+lost != st.Seq {
			tb.Errorf("cpu %d: received %d + lost %d != attempts %d", cpu, got, lost, st.Seq)
		}
		if got != st.Emitted || lost != st.Failed {
			tb.Errorf("cpu %d: received %d lost %d, kernel says emitted %d failed %d", cpu, got, lost, st.Emitted, st.Failed)
		}
	}
}

// CheckStats checks a reader's rings' Stats (Stats().Rings) against what
// c saw delivered, CPU by CPU (a CPU that came back online has two rings):
// samples, their bytes as delivered (padded), and lost counts (from 6.0 at
// least those: the kernel's count of refused outputs, reported or not).
func (c *Collector) CheckStats(tb testing.TB, rings []perfbuf.Stats) {
	tb.Helper()
	c.mu.Lock()
	defer c.mu.Unlock()
	byCPU := map[int]perfbuf.Stats{}
	for _, s := range rings {
		t := byCPU[s.CPU]
		t.Samples += s.Samples
		t.Bytes += s.Bytes
		t.Lost += s.Lost
		byCPU[s.CPU] = t
	}
	for cpu, s := range byCPU {
		var bytes uint64
		for _, e := range c.Log[cpu] {
			bytes += uint64(e.Len)
		}
		// Lost counts the losses delivered, and from 6.0 the kernel's
		// count of those it has not reported (docs/failures.md).
		if s.Samples != uint64(c.Samples[cpu]) || s.Bytes != bytes || s.Lost < c.Lost[cpu] || !kernel.FormatLost() && s.Lost != c.Lost[cpu] {
			tb.Errorf("cpu %d: Stats say %d samples (%d bytes), %d lost; delivered %d samples (%d bytes), %d lost",
				cpu, s.Samples, s.Bytes, s.Lost, c.Samples[cpu], bytes, c.Lost[cpu])
		}
	}
}
