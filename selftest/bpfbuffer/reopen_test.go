// SPDX-License-Identifier: Apache-2.0

package bpfbuffer

// Reopening a pinned buffer (issue 30, item 7): a Reader closed, and
// another opened from the pins, in each of the three layouts.

import (
	"encoding/binary"
	"errors"
	"path/filepath"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/perfbuf/perfbuf"
	"github.com/perfbuf/perfbuf/bpfbuffer"
	"github.com/perfbuf/perfbuf/internal/cpus"
	"github.com/perfbuf/perfbuf/selftest/internal/bpftest"
	"github.com/perfbuf/perfbuf/selftest/internal/pins"
)

// A Reader reads a third of what the programs wrote and closes; outputs
// made while no reader is open fail (noent); a second Reader opened from
// the pinned maps (the array of maps itself for a ring per CPU, its slots
// opened by ID) reads the rest. A ring buffer, shared or one per CPU, goes
// on where the first reader stopped: each sample is delivered once, by one
// of the two, none skipped, and the second's Found, ring by ring, is what
// the first left (with the discarded records among them). A perf event
// array's second reader starts with empty rings (Found 0): what the first
// left went with its rings, counted as its Left. In every layout, every
// attempt is accounted for:
//
//	attempts == failed + sum over the readers and rings of
//	    (Samples + Discarded + Left - Found)
//
// (a perf ring's Discarded is 0: a discarded perf record was never
// written, and the program counts it apart).
func TestReopenPinned(t *testing.T) {
	for _, tc := range []struct {
		name string
		kind bpfbuffer.Kind
		more []bpfbuffer.Option
	}{
		{"ring buffer", bpfbuffer.RingBuf, nil},
		{"ring per CPU", bpfbuffer.RingBufPerCPU, []bpfbuffer.Option{bpfbuffer.CPUsPerRing(1)}},
		{"ring per 2 CPUs", bpfbuffer.RingBufPerCPU, []bpfbuffer.Option{bpfbuffer.CPUsPerRing(2)}},
		{"perf event array", bpfbuffer.PerfEventArray, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// Room for what every CPU writes, twice over (a shared ring
			// buffer takes every CPU's): 2 KiB a CPU at most.
			online, err := cpus.Online()
			if err != nil {
				t.Fatal(err)
			}
			opts := perfbuf.Options{RingBytes: bpftest.RingBytes(4 + len(online))}
			f := setup(t, tc.kind, &opts, tc.more...)
			if f.kind != tc.kind {
				t.Fatalf("Prepare chose %v, want %v", f.kind, tc.kind)
			}
			ringBufs := tc.kind != bpfbuffer.PerfEventArray
			dir := pins.Dir(t)
			for name, m := range map[string]*pinner{"events": {f.events.Pin}, "events_failures": {f.failures.Pin}} {
				if err := m.pin(filepath.Join(dir, name)); err != nil {
					t.Fatal(err)
				}
			}
			m, o, err := bpfbuffer.Maps(f.mod, "events", opts)
			if err != nil {
				t.Fatal(err)
			}
			r1, err := perfbuf.NewReader(m, perfbuf.ReaderOptions{Options: o})
			if err != nil {
				t.Fatal(err)
			}
			defer r1.Close()

			// delivered counts each sample by its CPU and sequence number.
			delivered := map[[2]uint64]int{}
			var got1, got2 uint64
			sample := func(data []byte, n *uint64) {
				if len(data) < 16 {
					t.Errorf("%d-byte sample", len(data))
					return
				}
				key := [2]uint64{uint64(binary.NativeEndian.Uint32(data[8:])), binary.NativeEndian.Uint64(data)}
				delivered[key]++
				*n++
			}
			produce := func(outputs, discards uint64) {
				for _, cpu := range f.cpus {
					f.produce(t, cpu, outputs, 48, viaOutput, 1)
					f.produce(t, cpu, discards, 32, viaDiscard, 2) // half discarded
				}
			}
			produce(20, 8)
			const first = 20 + 4 // samples a CPU, the first time
			k := first * len(f.cpus) / 3
			r1.SetDeadline(time.Now().Add(10 * time.Second))
			var s perfbuf.Sample
			for range k {
				if err := r1.ReadInto(&s); err != nil {
					t.Fatal(err)
				}
				sample(s.Data, &got1)
			}
			if err := r1.Close(); err != nil {
				t.Fatal(err)
			}
			st1 := r1.Stats()

			produce(3, 0) // no reader: noent

			events, err := ebpf.LoadPinnedMap(filepath.Join(dir, "events"), nil)
			if err != nil {
				t.Fatal(err)
			}
			defer events.Close()
			failures, err := ebpf.LoadPinnedMap(filepath.Join(dir, "events_failures"), nil)
			if err != nil {
				t.Fatal(err)
			}
			defer failures.Close()
			r2, err := perfbuf.NewReader(perfbuf.MapFD(events.FD()),
				perfbuf.ReaderOptions{Options: perfbuf.Options{FailureMap: perfbuf.MapFD(failures.FD())}})
			if err != nil {
				t.Fatal(err)
			}
			defer r2.Close()
			opened := r2.Stats()
			produce(10, 4)
			r2.SetDeadline(time.Now().Add(10 * time.Second))
			r2.Flush()
			for {
				err := r2.ReadInto(&s)
				if errors.Is(err, perfbuf.ErrFlushed) {
					break
				}
				if err != nil {
					t.Fatal(err)
				}
				sample(s.Data, &got2)
			}
			if err := r2.Close(); err != nil {
				t.Fatal(err)
			}
			st2 := r2.Stats()

			for key, n := range delivered {
				if n != 1 {
					t.Errorf("cpu %d sample %d delivered %d times", key[0], key[1], n)
				}
			}
			out := f.outcomes(t)
			var attempts, ok, discarded, noent uint64
			for _, cpu := range f.cpus {
				o := out[cpu]
				attempts += o.Attempts
				ok += o.OK
				discarded += o.Discarded
				noent += o.NoEnt
			}
			// The failure map's counts are since the programs loaded: the
			// second reader's are all of them (a ring buffer's full ring's
			// too, counted as Lost). Per ring: the rings of the two readers
			// are the same, in slot order, for ring buffers.
			failed := st2.Failed.Total()
			var sum uint64
			for _, st := range []perfbuf.Stats{st1, st2} {
				sum += st.Samples + st.Discarded + st.Left - st.Found
				if !ringBufs {
					sum += st.Lost
				}
			}
			if ringBufs {
				failed += st2.Lost
			}
			left1, found2 := st1.Left, st2.Found
			if st1.Found != 0 {
				t.Errorf("the first reader found %+v, want nothing (opened before any output)", st1)
			}
			if len(opened.Rings) != len(st2.Rings) || ringBufs && len(st1.Rings) != len(st2.Rings) {
				t.Fatalf("the readers' Stats: %d rings for the first, the second's %d at opening, %d at Close", len(st1.Rings), len(opened.Rings), len(st2.Rings))
			}
			for i, e := range st2.Rings {
				if opened.Rings[i].Found != e.Found {
					t.Errorf("ring %d: Found %d at opening, %d at Close", i, opened.Rings[i].Found, e.Found)
				}
				if !ringBufs {
					if e.Found != 0 {
						t.Errorf("ring %d: Found %d, want 0 (a perf ring is new)", i, e.Found)
					}
					continue
				}
				a := st1.Rings[i]
				if e.Found < a.Left || e.Found-a.Left > a.Discarded {
					t.Errorf("ring %d: found %d; the first reader's left %d (discarded %d)", i, e.Found, a.Left, a.Discarded)
				}
			}
			progDiscards := uint64(0)
			if !ringBufs {
				progDiscards = discarded // never written
			}
			if want := attempts - progDiscards; sum+failed != want {
				t.Errorf("%d attempts (%d discarded by the program), failed %d + the readers' terms %d = %d", attempts, discarded, failed, sum, sum+failed)
			}
			if noent != 3*uint64(len(f.cpus)) {
				t.Errorf("%d outputs failed as noent, want %d (those while no reader was open)", noent, 3*len(f.cpus))
			}
			if got1 != uint64(k) || st2.Samples != got2 {
				t.Errorf("delivered %d then %d; the Stats say %d, %d", got1, got2, k, st2.Samples)
			}
			if ringBufs {
				if got1+got2 != ok || uint64(len(delivered)) != ok || found2 < left1 {
					t.Errorf("%d samples reached the rings; delivered %d + %d (%d different); found %d of the %d left", ok, got1, got2, len(delivered), found2, left1)
				}
			} else if got1+got2+left1 != ok || found2 != 0 || left1 == 0 {
				t.Errorf("%d samples reached the rings; delivered %d + %d, left by the first %d (gone with its rings), found %d", ok, got1, got2, left1, found2)
			}
			t.Logf("%s: %d attempts = failed %d (noent %d) + delivered %d then %d + discarded %d; the first left %d, the second found %d",
				tc.name, attempts, failed, noent, got1, got2, discarded, left1, found2)
		})
	}
}

// pinner is a map's Pin (libbpfgo's BPFMap).
type pinner struct{ pin func(string) error }
