// SPDX-License-Identifier: Apache-2.0

package bpfbuffer

// Reader.Pause and Resume on the three layouts of one buffer: a perf
// event array (the kernel's pause: refused outputs come back as a lost
// record), a ring buffer and a ring per CPU (the failure map's reader
// key: refused outputs fail in the program, Failed.NoEntry). Every
// attempt is accounted for, exactly, on every CPU.

import (
	"encoding/binary"
	"errors"
	"os"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/perfbuf/perfbuf"
	"github.com/perfbuf/perfbuf/bpfbuffer"
	"github.com/perfbuf/perfbuf/internal/kernel"
	"github.com/perfbuf/perfbuf/selftest/internal/bpftest"
	"github.com/perfbuf/perfbuf/selftest/internal/ledger"
)

// pauseLayout is one layout of the pause tests' buffer: open loads it
// and returns the map to read and the options to read it with, a
// FailureMap among them.
type pauseLayout struct {
	name string
	open func(t *testing.T) (*fixture, perfbuf.Map, perfbuf.Options)
}

// pauseLayouts are the three layouts of one buffer.
func pauseLayouts() []pauseLayout {
	return []pauseLayout{
		{"perf event array", func(t *testing.T) (*fixture, perfbuf.Map, perfbuf.Options) {
			opts := perfbuf.Options{RingBytes: bpftest.RingBytes(1)}
			f := setup(t, bpfbuffer.PerfEventArray, &opts)
			opts.FailureMap = f.failures
			return f, f.events, opts
		}},
		{"ring buffer", func(t *testing.T) (*fixture, perfbuf.Map, perfbuf.Options) {
			opts := perfbuf.Options{RingBytes: bpftest.RingBytes(1)}
			f := setup(t, bpfbuffer.RingBuf, &opts)
			opts.FailureMap = f.failures
			return f, f.events, opts
		}},
		{"ring per CPU", func(t *testing.T) (*fixture, perfbuf.Map, perfbuf.Options) {
			p := setupPerCPU(t, 1)
			return p.fixture, p.m, p.opts
		}},
	}
}

// produceEach makes count outputs of 48 bytes on each of f's CPUs.
func (f *fixture) produceEach(t *testing.T, count uint64) {
	t.Helper()
	for _, cpu := range f.cpus {
		f.produce(t, cpu, count, 48, viaOutput, 1)
	}
}

// refusedWhilePaused is how many outputs a CPU's program saw refused
// between its outcomes o0 and o: ENOSPC from a paused perf ring (perf),
// ENOENT from perfbuf.bpf.h's closed reader key.
func refusedWhilePaused(perf bool, o, o0 ledger.Outcome) uint64 {
	if perf {
		return o.NoSpc - o0.NoSpc
	}
	return o.NoEnt - o0.NoEnt
}

// A Raw pauses as a Reader does (both are Rings): on each CPU, m outputs
// while paused, all refused, then k after Resume; the RawBuffers read the
// k of each CPU and, for a perf ring, one lost record of m.
func TestRawPause(t *testing.T) {
	const m, k = 6, 4
	for _, tc := range pauseLayouts() {
		t.Run(tc.name, func(t *testing.T) {
			f, events, opts := tc.open(t)
			perf := f.kind == bpfbuffer.PerfEventArray
			raw, err := perfbuf.NewRaw(events, opts)
			if err != nil {
				t.Fatal(err)
			}
			defer raw.Close()
			start := f.outcomes(t)
			if err := raw.Pause(); err != nil {
				t.Fatal(err)
			}
			f.produceEach(t, m)
			if err := raw.Resume(); err != nil {
				t.Fatal(err)
			}
			f.produceEach(t, k)
			got, lost := map[int]uint64{}, map[int]uint64{}
			for i := range raw.BufferCount() {
				b, err := raw.Buffer(i)
				if err != nil {
					t.Fatal(err)
				}
				if _, err := b.Drain(func(rec *perfbuf.Record) error {
					if rec.Type == perfbuf.RecordLost {
						lost[rec.CPU] += rec.Lost
						return nil
					}
					got[int(binary.NativeEndian.Uint32(rec.AppendTo(nil)[8:]))]++ // the CPU it was written on
					return nil
				}); err != nil {
					t.Fatal(err)
				}
				b.Release()
			}
			end := f.outcomes(t)
			for _, cpu := range f.cpus {
				o, o0 := end[cpu], start[cpu]
				refused := refusedWhilePaused(perf, o, o0)
				wantLost := uint64(0)
				if perf {
					wantLost = m
				}
				if ok := o.OK - o0.OK; ok != k || refused != m {
					t.Errorf("cpu %d: the program wrote %d, was refused %d; want %d, %d", cpu, ok, refused, k, m)
				}
				if got[cpu] != k || lost[cpu] != wantLost {
					t.Errorf("cpu %d: read %d samples, lost records of %d; want %d, %d", cpu, got[cpu], lost[cpu], k, wantLost)
				}
			}
		})
	}
}

// On each CPU: n outputs, Pause (twice: the second does nothing), m
// outputs, all refused, a read that still delivers the n, Resume (twice),
// k outputs. The Reader delivers n+k samples of each CPU and nothing else
// but, for a perf ring, one lost record of m; the program saw m refused
// (ENOSPC from a paused perf ring, ENOENT from perfbuf.bpf.h's closed
// reader key) and n+k written; Stats count the m in Lost (perf) or
// Failed.NoEntry (ring buffers). After Close, Pause and Resume fail with
// os.ErrClosed.
func TestReaderPause(t *testing.T) {
	const n, m, k = 5, 7, 3
	for _, tc := range pauseLayouts() {
		t.Run(tc.name, func(t *testing.T) {
			f, events, opts := tc.open(t)
			perf := f.kind == bpfbuffer.PerfEventArray
			if !perf {
				// Without the failure map, a ring buffer cannot be paused.
				bare := opts
				bare.FailureMap = nil
				r, err := perfbuf.NewReader(events, perfbuf.ReaderOptions{Options: bare})
				if err != nil {
					t.Fatal(err)
				}
				if err := r.Pause(); !errors.Is(err, errors.ErrUnsupported) {
					t.Errorf("Pause without a FailureMap: %v, want errors.ErrUnsupported", err)
				}
				r.Close()
			}
			r, err := perfbuf.NewReader(events, perfbuf.ReaderOptions{Options: opts})
			if err != nil {
				t.Fatal(err)
			}
			defer r.Close()
			got, lost := map[int]uint64{}, map[int]uint64{}
			consume := func() {
				t.Helper()
				if _, err := r.Consume(func(rec *perfbuf.Record) error {
					if rec.Type == perfbuf.RecordLost {
						lost[rec.CPU] += rec.Lost
						return nil
					}
					data := rec.AppendTo(nil)
					got[int(binary.NativeEndian.Uint32(data[8:]))]++ // the CPU it was written on
					return nil
				}); err != nil {
					t.Fatal(err)
				}
			}
			start := f.outcomes(t)
			f.produceEach(t, n)
			for range 2 {
				if err := r.Pause(); err != nil {
					t.Fatal(err)
				}
			}
			f.produceEach(t, m)
			consume() // paused: what is in the rings is still delivered
			for _, cpu := range f.cpus {
				if got[cpu] != n || lost[cpu] != 0 {
					t.Errorf("cpu %d, paused: %d samples, %d lost delivered; want %d, 0", cpu, got[cpu], lost[cpu], n)
				}
			}
			for range 2 {
				if err := r.Resume(); err != nil {
					t.Fatal(err)
				}
			}
			f.produceEach(t, k)
			consume()
			end := f.outcomes(t)
			st := r.Stats()
			noent, failed, statLost := st.Failed.NoEntry, st.Failed.Total(), st.Lost
			for _, cpu := range f.cpus {
				o, o0 := end[cpu], start[cpu]
				refused := refusedWhilePaused(perf, o, o0)
				if ok := o.OK - o0.OK; ok != n+k || refused != m || o.Attempts-o0.Attempts != n+m+k {
					t.Errorf("cpu %d: the program wrote %d, was refused %d of %d; want %d, %d of %d", cpu, ok, refused, o.Attempts-o0.Attempts, n+k, m, n+m+k)
				}
				if got[cpu] != n+k {
					t.Errorf("cpu %d: %d samples delivered, want %d", cpu, got[cpu], n+k)
				}
				wantLost := uint64(0)
				if perf {
					wantLost = m
				}
				if lost[cpu] != wantLost {
					t.Errorf("cpu %d: lost records of %d delivered, want %d", cpu, lost[cpu], wantLost)
				}
			}
			ncpu := uint64(len(f.cpus))
			if perf {
				if statLost != m*ncpu || failed != 0 {
					t.Errorf("stats: Lost %d, Failed %d; want %d, 0", statLost, failed, m*ncpu)
				}
				for i, s := range st.Rings {
					if s.Lost != m {
						t.Errorf("ring %d (cpu %d): Lost %d, want %d", i, s.CPU, s.Lost, m)
					}
				}
			} else if noent != m*ncpu || failed != noent || statLost != 0 {
				t.Errorf("stats: Failed.NoEntry %d of %d failed, Lost %d; want %d, 0 lost", noent, failed, statLost, m*ncpu)
			}
			t.Logf("%s, %d cpus: each wrote %d, %d refused while paused, %d after Resume; delivered %d each", f.kind, ncpu, n, m, k, n+k)

			r.Close()
			if err := r.Pause(); !errors.Is(err, os.ErrClosed) {
				t.Errorf("Pause after Close: %v, want os.ErrClosed", err)
			}
			if err := r.Resume(); !errors.Is(err, os.ErrClosed) {
				t.Errorf("Resume after Close: %v, want os.ErrClosed", err)
			}
		})
	}
}

// A ring opened paused (what a Reader does for a CPU that comes online
// while paused: kernel.PerfConfig.Paused) refuses every output from its
// first: none reaches it before the pause, as it is paused before its slot
// is stored. Resumed, it takes them.
func TestOpenPaused(t *testing.T) {
	opts := perfbuf.Options{}
	f := setup(t, bpfbuffer.PerfEventArray, &opts)
	cpu := f.cpus[len(f.cpus)-1]
	cfg := kernel.PerfConfig{Pages: 1, PageSize: bpftest.Page, WakeupEvents: 1, Paused: true}
	p, err := kernel.OpenPerfRings(f.events.FileDescriptor(), cfg, []int32{int32(cpu)})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	defer kernel.DeleteSlot(f.events.FileDescriptor(), uint32(cpu))
	const m, k = 4, 2
	o0 := f.outcomes(t)[cpu]
	f.produce(t, cpu, m, 48, viaOutput, 1)
	o1 := f.outcomes(t)[cpu]
	if nospc, ok := o1.NoSpc-o0.NoSpc, o1.OK-o0.OK; nospc != m || ok != 0 {
		t.Fatalf("a ring opened paused: %d outputs refused, %d written; want %d, 0", nospc, ok, m)
	}
	if err := kernel.PauseOutput(p.FD(0), false); err != nil {
		t.Fatal(err)
	}
	f.produce(t, cpu, k, 48, viaOutput, 1)
	if o2 := f.outcomes(t)[cpu]; o2.OK-o1.OK != k || o2.NoSpc != o1.NoSpc {
		t.Errorf("resumed: %d written, %d refused; want %d, 0", o2.OK-o1.OK, o2.NoSpc-o1.NoSpc, k)
	}
}

// Close racing Pause and Resume (each from a goroutine of its own) over a
// ring buffer (issue 47, item 7), 60 times: a read blocked at Close
// returns os.ErrClosed, and a reader opened again at once (ErrMapInUse
// only until the first is freed), paused and resumed, receives every
// output, none refused. The time from Close
// to the read's return is logged: the read used to free, and so waited
// for the grace period after the reader key closed, or for the Pause's.
func TestCloseRacesPause(t *testing.T) {
	opts := perfbuf.Options{RingBytes: bpftest.RingBytes(1)}
	f := setup(t, bpfbuffer.RingBuf, &opts)
	opts.FailureMap = f.failures
	cpu := f.cpus[0]
	var worst time.Duration
	for it := range 60 {
		r, err := perfbuf.NewReader(f.events, perfbuf.ReaderOptions{Options: opts})
		if err != nil {
			t.Fatal(err)
		}
		stop := make(chan struct{})
		var toggles sync.WaitGroup
		for _, call := range []func() error{r.Pause, r.Resume} { // each on its own
			toggles.Add(1)
			go func() {
				defer toggles.Done()
				for {
					select {
					case <-stop:
						return
					default:
					}
					_ = call()
				}
			}()
		}
		read := make(chan error, 1)
		go func() {
			var s perfbuf.Sample
			err := r.ReadInto(&s)
			for err == nil {
				err = r.ReadInto(&s)
			}
			read <- err
		}()
		for range it % 5 {
			runtime.Gosched()
		}
		start := time.Now()
		r.Close()
		select {
		case err := <-read:
			if !errors.Is(err, os.ErrClosed) {
				t.Fatalf("iteration %d: read: %v, want os.ErrClosed", it, err)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("iteration %d: read still blocked 10s after Close", it)
		}
		worst = max(worst, time.Since(start))

		var again *perfbuf.Reader
		for range 10000 {
			if again, err = perfbuf.NewReader(f.events, perfbuf.ReaderOptions{Options: opts}); !errors.Is(err, perfbuf.ErrMapInUse) {
				break
			}
			time.Sleep(time.Millisecond)
		}
		if err != nil {
			t.Fatalf("iteration %d: reopen: %v", it, err)
		}
		if err := again.Pause(); err != nil {
			t.Fatalf("iteration %d: pause the reopened reader: %v", it, err)
		}
		if err := again.Resume(); err != nil {
			t.Fatalf("iteration %d: resume the reopened reader: %v", it, err)
		}
		close(stop) // (the calls on the closed reader ran meanwhile)
		toggles.Wait()
		o0 := f.outcomes(t)[cpu]
		f.produce(t, cpu, 10, 48, viaOutput, 1)
		o1 := f.outcomes(t)[cpu]
		got, err := again.Consume(func(*perfbuf.Record) error { return nil })
		again.Close()
		if o1.NoEnt != o0.NoEnt || o1.OK-o0.OK != 10 || err != nil || got < 10 {
			t.Fatalf("iteration %d: reopened and resumed: %d written, %d refused (noent), %d received (%v); want 10, 0, 10",
				it, o1.OK-o0.OK, o1.NoEnt-o0.NoEnt, got, err)
		}
	}
	t.Logf("slowest read after Close: %v", worst)
}
