// SPDX-License-Identifier: Apache-2.0

package failures

import (
	"testing"
	"time"

	"github.com/perfbuf/perfbuf"
	"github.com/perfbuf/perfbuf/internal/kernel"
	"github.com/perfbuf/perfbuf/internal/owner"
	"github.com/perfbuf/perfbuf/selftest/internal/bpftest"
)

// openers are the two ring openers: libbpf's perf_buffer, and perfbuf's
// own (kernel.ForcePerfRings).
var openers = []struct {
	name  string
	force bool
}{{"libbpf", false}, {"perfbuf", true}}

// forceOpener makes perfbuf open its rings itself (force) or through
// libbpf until the test ends.
func forceOpener(t *testing.T, force bool) {
	t.Helper()
	kernel.ForcePerfRings.Store(force)
	t.Cleanup(func() { kernel.ForcePerfRings.Store(false) })
}

// Losses at Close, counted: one-page rings filled and then outrun by 200
// outputs of 200 bytes on every CPU, never read, closed full. No output
// fits after the ring filled, so the kernel reports none of the losses in
// a lost record; on kernels with PERF_FORMAT_LOST (6.0) Stats and Close
// count them from each event's count of refused outputs, so that, per CPU,
// every attempt is a sample left, a loss or a failure, exactly:
//
//	attempts = Samples + Lost + Left + failed, Lost = the ENOSPCs
//
// Before 6.0 (owner.CloseExact false) the losses of a full ring are not counted.
// Both openers, every owner kind (a Raw counts its losses at Close only:
// while open, they are its RawBuffers').
func TestCloseFullRings(t *testing.T) {
	f := setup(t)
	// 200 samples of 200 bytes fill a ring of one page up to 16 KiB (the
	// program takes at most SAMPLE_MAX, 512 bytes, a sample).
	size := uint64(200)
	count := uint64(200 * max(bpftest.Scale()/4, 1))
	owners := append(modes[:len(modes):len(modes)], struct {
		name string
		open func(*testing.T, perfbuf.Map, perfbuf.Options, *collector) mode
	}{"raw", rawMode})
	for _, o := range openers {
		for _, m := range owners {
			t.Run(o.name+"/"+m.name, func(t *testing.T) {
				forceOpener(t, o.force)
				before := f.outcomes(t)
				c := newCollector(t)
				md := m.open(t, f.events, perfbuf.Options{RingBytes: bpftest.RingBytes(1), FailureMap: f.failures}, c)
				for _, cpu := range f.cpus {
					f.output(t, cpu, count, size, currentCPU, 0)
				}
				after := f.outcomes(t)
				open := perCPU(md.stats())
				md.close()
				closed := perCPU(md.stats())
				for _, cpu := range f.cpus {
					d := delta(before[cpu], after[cpu])
					if d.NoSpace == 0 || d.OK == 0 {
						t.Fatalf("cpu %d: %d outputs in the ring, %d ENOSPC: the ring did not fill", cpu, d.OK, d.NoSpace)
					}
					st := closed[cpu]
					if !owner.CloseExact() {
						if st.Samples+st.Left != d.OK || st.Lost > d.NoSpace {
							t.Errorf("cpu %d: delivered %d + left %d, lost %d; want %d + the ENOSPC %d at most", cpu, st.Samples, st.Left, st.Lost, d.OK, d.NoSpace)
						}
						continue
					}
					if got := open[cpu].Lost; m.name != "raw" && got != d.NoSpace {
						t.Errorf("cpu %d: Stats before Close: lost %d, want the %d ENOSPC", cpu, got, d.NoSpace)
					}
					failed := d.failed().Total()
					if st.Lost != d.NoSpace || st.Samples+st.Lost+st.Left+failed != d.Attempts {
						t.Errorf("cpu %d: %d attempts != delivered %d + lost %d + left %d + failed %d (ENOSPC %d)",
							cpu, d.Attempts, st.Samples, st.Lost, st.Left, failed, d.NoSpace)
					}
				}
				t.Logf("cpu %d: %d attempts = %d left + %d lost", f.cpus[0], delta(before[f.cpus[0]], after[f.cpus[0]]).Attempts, closed[f.cpus[0]].Left, closed[f.cpus[0]].Lost)
			})
		}
	}
}

// Losses at Close during production, counted: producers on every CPU
// outrun readers of one-page rings, and Close comes while they write, the
// rings full or nearly: per CPU, every attempt is a sample delivered or
// left, a loss or a failure, exactly, with Lost the ENOSPCs (where
// owner.CloseExact, from 6.0). Both openers.
func TestCloseLossy(t *testing.T) {
	f := setup(t)
	iterations := 8
	if testing.Short() {
		iterations = 3
	}
	for _, o := range openers {
		for _, form := range []string{"callback/Poll", "fullest/ReadInto", "ordered/Each"} {
			t.Run(o.name+"/"+form, func(t *testing.T) {
				forceOpener(t, o.force)
				for it := range iterations {
					closeDuringProduction(t, f, form, time.Duration(it%4)*time.Millisecond, 1)
				}
			})
		}
	}
}

// delta is what the program saw between a and b.
func delta(a, b outcome) outcome {
	return outcome{
		Attempts: b.Attempts - a.Attempts, OK: b.OK - a.OK, NoSpace: b.NoSpace - a.NoSpace,
		NoEntry: b.NoEntry - a.NoEntry, TooBig: b.TooBig - a.TooBig, Invalid: b.Invalid - a.Invalid,
		NotOnCPU: b.NotOnCPU - a.NotOnCPU, Other: b.Other - a.Other,
	}
}

// rawMode opens a Raw on events with the failure map; it reads nothing.
func rawMode(t *testing.T, events perfbuf.Map, opts perfbuf.Options, _ *collector) mode {
	t.Helper()
	r, err := perfbuf.NewRaw(events, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	return mode{stats: r.Stats, close: func() { r.Close() }}
}
