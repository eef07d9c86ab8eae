// SPDX-License-Identifier: Apache-2.0

package bpfbuffer

// The array of ring buffers (bpfbuffer.RingBufPerCPU): a ring per CPU or
// per N CPUs, made by Prepare, read through bpfbuffer.Maps by the same
// Reader in every form, with every attempt accounted for per ring.

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/aquasecurity/libbpfgo"
	"github.com/perfbuf/perfbuf"
	"github.com/perfbuf/perfbuf/bpfbuffer"
	"github.com/perfbuf/perfbuf/internal/cpus"
	"github.com/perfbuf/perfbuf/internal/kernel"
	"github.com/perfbuf/perfbuf/selftest/internal/bpftest"
	"golang.org/x/sys/unix"
)

// perCPU is a fixture loaded as an array of ring buffers, n CPUs a ring,
// with the map and Options that bpfbuffer.Maps returned.
type perCPU struct {
	*fixture
	n    int
	keys []uint32 // ring i's slot
	m    perfbuf.Map
	opts perfbuf.Options
}

// setupPerCPU prepares the buffer as rings of one page, n CPUs a ring,
// loads it, and checks what the array holds: a ring of a page in the
// slot of every possible CPU, the rings Maps hands over.
func setupPerCPU(t *testing.T, n int) *perCPU {
	t.Helper()
	opts := perfbuf.Options{RingBytes: bpftest.RingBytes(1)}
	f := setup(t, bpfbuffer.RingBufPerCPU, &opts, bpfbuffer.CPUsPerRing(n))
	if f.kind != bpfbuffer.RingBufPerCPU || opts.RingBytes != 0 {
		t.Fatalf("Prepare chose %v, left RingBytes %d; want %v, RingBytes cleared", f.kind, opts.RingBytes, bpfbuffer.RingBufPerCPU)
	}
	possible, err := cpus.Possible()
	if err != nil {
		t.Fatal(err)
	}
	p := &perCPU{fixture: f, n: n}
	for _, c := range possible {
		if k := uint32(c / n); !slices.Contains(p.keys, k) {
			p.keys = append(p.keys, k)
		}
	}
	if typ, entries := f.events.Type(), f.events.MaxEntries(); typ != libbpfgo.MapTypeArrayOfMaps || entries != p.keys[len(p.keys)-1]+1 {
		t.Fatalf("events: %v of %d slots, want an array of maps of %d", typ, entries, p.keys[len(p.keys)-1]+1)
	}
	p.m, p.opts, err = bpfbuffer.Maps(f.mod, "events", opts)
	if err != nil {
		t.Fatal(err)
	}
	if p.opts.FailureMap == nil || len(p.opts.Maps) != len(p.keys)-1 {
		t.Fatalf("Maps: %d further rings, failure map %v; want %d, events_failures", len(p.opts.Maps), p.opts.FailureMap, len(p.keys)-1)
	}
	for i, k := range p.keys {
		info, err := kernel.GetMapInfo(p.ring(i).FileDescriptor())
		if err != nil {
			t.Fatal(err)
		}
		id, err := kernel.InnerMapID(f.events.FileDescriptor(), k)
		if err != nil || id != info.ID || info.Type != uint32(libbpfgo.MapTypeRingbuf) || int(info.MaxEntries) != bpftest.Page {
			t.Errorf("slot %d holds map %d (%v); ring %d of Maps is %+v, want that ring buffer, of a page", k, id, err, i, info)
		}
		if want := fmt.Sprintf("events_%d", k); info.Name != want {
			t.Errorf("ring %d named %q, want %q", i, info.Name, want)
		}
	}
	return p
}

// ring returns the map of ring i, as Maps handed it over.
func (p *perCPU) ring(i int) perfbuf.Map {
	if i == 0 {
		return p.m
	}
	return p.opts.Maps[i-1]
}

// ringOf returns the index of the ring that cpu writes.
func (p *perCPU) ringOf(cpu int) int { return slices.Index(p.keys, uint32(cpu/p.n)) }

// ringCollector counts what a reader delivered, by ring and by the CPU the
// sample says, and checks that each went to its CPU's ring.
type ringCollector struct {
	t    *testing.T
	p    *perCPU
	got  map[int]uint64 // by CPU
	ring map[int]uint64 // by ring
}

func newRingCollector(t *testing.T, p *perCPU) *ringCollector {
	return &ringCollector{t: t, p: p, got: map[int]uint64{}, ring: map[int]uint64{}}
}

// anyRing is the ring of a sample delivered without one (perfbuf.New's
// sample function).
const anyRing = -2

// sample counts a sample read from ring, delivered for recCPU.
func (c *ringCollector) sample(ring, recCPU int, data []byte) {
	if len(data) < 16 {
		c.t.Errorf("%d-byte sample", len(data))
		return
	}
	cpu := int(binary.NativeEndian.Uint32(data[8:]))
	if recCPU != -1 {
		c.t.Errorf("a ring buffer's record delivered for cpu %d, want -1", recCPU)
	}
	if want := c.p.ringOf(cpu); ring == anyRing {
		ring = want
	} else if ring != want {
		c.t.Errorf("a sample written on cpu %d read from ring %d, want its ring %d", cpu, ring, want)
	}
	c.got[cpu]++
	c.ring[ring]++
}

// A ring per CPU, and per 2 CPUs (one ring for two: on a 2-CPU host, one
// ring in all), read by a Reader over the rings Maps handed over. On each
// CPU: outputs and reserves that reach its ring, discards, reserves above
// the buffer's max sample (einval), outputs to a missing inner ring buffer
// of another map (noent), outputs while the CPU's slot is empty (noent),
// a full ring (full, and only that ring's CPUs refused), and records left
// at Close. Per ring, every attempt of its CPUs is accounted for:
// attempted == delivered + discarded + left + the CPUs' failures.
func TestRingPerCPU(t *testing.T) {
	for _, n := range []int{1, 2} {
		t.Run(fmt.Sprintf("%d CPUs a ring", n), func(t *testing.T) {
			p := setupPerCPU(t, n)
			f := p.fixture
			r, err := perfbuf.NewReader(p.m, perfbuf.ReaderOptions{Options: p.opts})
			if err != nil {
				t.Fatal(err)
			}
			defer r.Close()
			c := newRingCollector(t, p)
			consume := func() {
				t.Helper()
				if _, err := r.Consume(func(rec *perfbuf.Record) error {
					if rec.Type == perfbuf.RecordSample {
						c.sample(rec.Ring, rec.CPU, rec.AppendTo(nil))
					}
					return nil
				}); err != nil {
					t.Fatal(err)
				}
			}
			for _, cpu := range f.cpus {
				f.produce(t, cpu, 5, 48, viaOutput, 1)
				f.produce(t, cpu, 5, 32, viaReserve, 1)
				f.produce(t, cpu, 4, 200, viaReserve, 1) // 256-byte reserves
				f.produce(t, cpu, 8, 32, viaDiscard, 4)  // 2 discarded
				f.produce(t, cpu, 2, 32, viaTooBig, 1)
				f.produce(t, cpu, 3, 48, viaInner, 1)
			}
			consume()

			// The first CPU's slot emptied: its outputs and reserves (and
			// those of the CPUs sharing its ring) fail as noent, the
			// others' go on. The slot is filled again with its ring.
			first := f.cpus[0]
			emptied := p.keys[p.ringOf(first)]
			if err := kernel.DeleteSlot(f.events.FileDescriptor(), emptied); err != nil {
				t.Fatal(err)
			}
			for _, cpu := range f.cpus {
				f.produce(t, cpu, 3, 48, viaOutput, 1)
				f.produce(t, cpu, 2, 32, viaReserve, 1)
			}
			if err := kernel.UpdateSlot(f.events.FileDescriptor(), emptied, p.ring(p.ringOf(first)).FileDescriptor()); err != nil {
				t.Fatal(err)
			}
			consume()

			// The first CPU's ring full: 40 records of 200 bytes into one
			// page (a larger page, as many more), not read. Only the CPUs
			// of that ring are refused.
			f.produce(t, first, 40*uint64(bpftest.Scale()), 200, viaOutput, 1)
			for _, cpu := range f.cpus {
				f.produce(t, cpu, 3, 48, viaOutput, 1) // left at Close, or full
			}
			if err := r.Close(); err != nil {
				t.Fatal(err)
			}
			accountPerRing(t, p, c, r.Stats(), emptied)
		})
	}
}

// accountPerRing checks, once the reader is closed, that every attempt is
// accounted for, per ring, with the failures of the CPUs that write it.
func accountPerRing(t *testing.T, p *perCPU, c *ringCollector, stats []perfbuf.Stats, emptied uint32) {
	t.Helper()
	out := p.outcomes(t)
	rings := map[int]perfbuf.Stats{}
	failed := map[int]perfbuf.Failures{}
	for _, s := range stats {
		switch {
		case s.Ring >= 0 && s.CPU == -1:
			rings[s.Ring] = s
		case s.Ring == -1 && s.CPU >= 0:
			failed[s.CPU] = s.Failed
		default:
			t.Fatalf("Stats entry %+v: want a ring's (cpu -1) or a CPU's failures (ring -1)", s)
		}
	}
	if len(rings) != len(p.keys) {
		t.Fatalf("Stats %+v: %d rings, want %d", stats, len(rings), len(p.keys))
	}
	type sum struct{ attempts, ok, discarded, full, failed, noent uint64 }
	by := map[int]*sum{}
	for _, cpu := range p.cpus {
		o, fl := out[cpu], failed[cpu]
		if o.OK+o.Discarded+o.Full+o.NoSpc+o.NoEnt+o.Inval+o.Other != o.Attempts || o.Other != 0 || o.NoSpc != 0 {
			t.Errorf("cpu %d: the program's counts do not add up: %+v", cpu, o)
		}
		// 3 to the other map's empty slot, and, for the CPUs of the ring
		// whose slot was emptied, 3 outputs and 2 reserves: the program
		// counts a reserve that gets nothing as full, which the failure
		// map tells apart.
		wantNoEnt, reserves := uint64(3), uint64(0)
		if uint32(cpu/p.n) == emptied {
			wantNoEnt, reserves = 3+3, 2
		}
		if o.Inval != 2 || o.NoEnt != wantNoEnt || c.got[cpu] == 0 {
			t.Errorf("cpu %d: einval %d, noent %d, delivered %d; want 2, %d, some", cpu, o.Inval, o.NoEnt, c.got[cpu], wantNoEnt)
		}
		if fl.Full != o.Full-reserves || fl.NoEntry != o.NoEnt+reserves || fl.Invalid != o.Inval || fl.TooBig+fl.NotOnCPU+fl.Other != 0 {
			t.Errorf("cpu %d: Failed %+v; the program saw full %d, noent %d, einval %d, with %d reserves in an empty slot", cpu, fl, o.Full, o.NoEnt, o.Inval, reserves)
		}
		i := p.ringOf(cpu)
		if by[i] == nil {
			by[i] = &sum{}
		}
		s := by[i]
		s.attempts += o.Attempts
		s.ok += o.OK
		s.discarded += o.Discarded
		s.full += fl.Full
		s.failed += fl.Total()
		s.noent += fl.NoEntry
	}
	first := p.ringOf(p.cpus[0])
	for i, s := range by {
		st := rings[i]
		if got := st.Samples + st.Discarded + st.Left + s.failed; got != s.attempts {
			t.Errorf("ring %d: attempted %d, Stats %+v, failed %d: the sum is %d", i, s.attempts, st, s.failed, got)
		}
		if st.Samples != c.ring[i] || st.Samples+st.Left != s.ok || st.Discarded != s.discarded || st.Lost != 0 || st.Corrupt != 0 {
			t.Errorf("ring %d: Stats %+v, delivered %d; its CPUs saw %+v", i, st, c.ring[i], *s)
		}
		// Only the ring filled refused records.
		if (s.full != 0) != (i == first) || st.Left == 0 {
			t.Errorf("ring %d: %d refused as full, %d left; want refusals in ring %d only, some left", i, s.full, st.Left, first)
		}
		t.Logf("ring %d (slot %d): attempted %d = delivered %d + discarded %d + left %d + failed %d (full %d, noent %d)",
			i, p.keys[i], s.attempts, st.Samples, st.Discarded, st.Left, s.failed, s.full, s.noent)
	}
}

// Every form of reading reads the rings: ReadInto, ReadBatch, Each, All,
// Consume, the callback owner's Poll and Consume, and the raw view. Each
// CPU writes 20 records; every one comes back, from its CPU's ring, and
// the Stats say so.
func TestRingPerCPUForms(t *testing.T) {
	p := setupPerCPU(t, 1)
	f := p.fixture
	const each = 20
	load := func() {
		for _, cpu := range f.cpus {
			f.produce(t, cpu, each, 48, viaOutput, 1)
		}
	}
	want := uint64(each * len(f.cpus))
	// readFlushed reads until the Flush asked after the load completes:
	// every record then in the rings is delivered, and counted.
	readFlushed := func(t *testing.T, r *perfbuf.Reader, read func() error) {
		t.Helper()
		r.SetDeadline(time.Now().Add(10 * time.Second))
		r.Flush()
		for {
			err := read()
			if errors.Is(err, perfbuf.ErrFlushed) {
				return
			}
			if err != nil {
				t.Fatal(err)
			}
		}
	}
	forms := map[string]func(t *testing.T, c *ringCollector) (stats func() []perfbuf.Stats, closeFn func()){
		"ReadInto": func(t *testing.T, c *ringCollector) (func() []perfbuf.Stats, func()) {
			r := newReader(t, p)
			load()
			var s perfbuf.Sample
			readFlushed(t, r, func() error {
				if err := r.ReadInto(&s); err != nil {
					return err
				}
				c.sample(s.Ring, s.CPU, s.Data)
				return nil
			})
			return r.Stats, func() { r.Close() }
		},
		"ReadBatch": func(t *testing.T, c *ringCollector) (func() []perfbuf.Stats, func()) {
			r := newReader(t, p)
			load()
			batch := make([]perfbuf.Sample, 7)
			readFlushed(t, r, func() error {
				n, err := r.ReadBatch(batch)
				for _, s := range batch[:n] {
					c.sample(s.Ring, s.CPU, s.Data)
				}
				return err
			})
			return r.Stats, func() { r.Close() }
		},
		"Each": func(t *testing.T, c *ringCollector) (func() []perfbuf.Stats, func()) {
			r := newReader(t, p)
			load()
			r.Flush()
			err := r.Each(context.Background(), func(rec *perfbuf.Record) error {
				c.sample(rec.Ring, rec.CPU, rec.AppendTo(nil))
				return nil
			})
			if !errors.Is(err, perfbuf.ErrFlushed) {
				t.Fatal(err)
			}
			return r.Stats, func() { r.Close() }
		},
		"All": func(t *testing.T, c *ringCollector) (func() []perfbuf.Stats, func()) {
			r := newReader(t, p)
			load()
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			r.Flush()
			for s, err := range r.All(ctx) {
				if errors.Is(err, perfbuf.ErrFlushed) {
					break
				}
				if err != nil {
					t.Fatal(err)
				}
				c.sample(s.Ring, s.CPU, s.Data)
			}
			return r.Stats, func() { r.Close() }
		},
		"Consume": func(t *testing.T, c *ringCollector) (func() []perfbuf.Stats, func()) {
			r := newReader(t, p)
			load()
			if _, err := r.Consume(func(rec *perfbuf.Record) error {
				c.sample(rec.Ring, rec.CPU, rec.AppendTo(nil))
				return nil
			}); err != nil {
				t.Fatal(err)
			}
			return r.Stats, func() { r.Close() }
		},
		"callback": func(t *testing.T, c *ringCollector) (func() []perfbuf.Stats, func()) {
			// The sample function is told no ring: the sample's CPU says
			// which.
			pb, err := perfbuf.New(p.m, func(cpu int, data []byte) { c.sample(anyRing, cpu, data) }, nil, p.opts)
			if err != nil {
				t.Fatal(err)
			}
			load()
			if n, err := pb.Poll(10 * time.Second); n == 0 || err != nil {
				t.Fatalf("Poll = %d, %v", n, err)
			}
			if _, err := pb.Consume(); err != nil {
				t.Fatal(err)
			}
			return pb.Stats, func() { pb.Close() }
		},
		"raw": func(t *testing.T, c *ringCollector) (func() []perfbuf.Stats, func()) {
			pb, err := perfbuf.NewRaw(p.m, p.opts)
			if err != nil {
				t.Fatal(err)
			}
			load()
			var st []perfbuf.Stats
			for i := range p.keys {
				rb, err := pb.Buffer(i)
				if err != nil {
					t.Fatal(err)
				}
				if _, err := rb.Drain(func(rec *perfbuf.Record) error {
					c.sample(i, rec.CPU, rec.Data)
					return nil
				}); err != nil {
					t.Fatal(err)
				}
				st = append(st, rb.Stats())
				rb.Release()
			}
			return func() []perfbuf.Stats { return st }, func() { pb.Close() }
		},
	}
	for name, read := range forms {
		t.Run(name, func(t *testing.T) {
			c := newRingCollector(t, p)
			stats, closeFn := read(t, c)
			var samples uint64
			for _, s := range stats() {
				if s.Ring >= 0 {
					samples += s.Samples
					if s.Samples != c.ring[s.Ring] {
						t.Errorf("ring %d: Stats %+v, delivered %d", s.Ring, s, c.ring[s.Ring])
					}
				}
			}
			for _, cpu := range f.cpus {
				if c.got[cpu] != each {
					t.Errorf("cpu %d: delivered %d, want %d", cpu, c.got[cpu], each)
				}
			}
			if samples != want {
				t.Errorf("Stats count %d samples, want %d", samples, want)
			}
			closeFn()
		})
	}
}

func newReader(t *testing.T, p *perCPU) *perfbuf.Reader {
	t.Helper()
	r, err := perfbuf.NewReader(p.m, perfbuf.ReaderOptions{Options: p.opts})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	return r
}

// The array itself reads as the rings Maps hands over (its slots opened by
// ID, which needs CAP_SYS_ADMIN, as this test has), and a second Reader of
// the same rings is refused.
func TestRingPerCPUArrayReader(t *testing.T) {
	p := setupPerCPU(t, 1)
	f := p.fixture
	opts := p.opts
	opts.Maps = nil
	r, err := perfbuf.NewReader(f.events, perfbuf.ReaderOptions{Options: opts})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := perfbuf.NewReader(p.m, perfbuf.ReaderOptions{Options: p.opts}); !errors.Is(err, perfbuf.ErrMapInUse) {
		t.Errorf("a second reader of the rings: %v, want ErrMapInUse", err)
	}
	c := newRingCollector(t, p)
	for _, cpu := range f.cpus {
		f.produce(t, cpu, 10, 48, viaOutput, 1)
	}
	if _, err := r.Consume(func(rec *perfbuf.Record) error {
		c.sample(rec.Ring, rec.CPU, rec.AppendTo(nil))
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	for _, cpu := range f.cpus {
		if c.got[cpu] != 10 {
			t.Errorf("cpu %d: delivered %d, want 10", cpu, c.got[cpu])
		}
	}
	r.Close()
}

// Prepare's checks of the layout: CPUsPerRing below 1, or with another
// kind; Any is a shared ring buffer (docs/bpfbuffer.md says why); a second
// call the same way does nothing more, another way is ErrPrepared, and
// after load ErrLoaded; Maps of a module it did not prepare gives the map
// itself.
func TestRingPerCPUPrepare(t *testing.T) {
	m := open(t)
	for name, c := range map[string]struct {
		want bpfbuffer.Kind
		n    int
	}{
		"no CPU a ring":                  {bpfbuffer.RingBufPerCPU, 0},
		"CPUsPerRing with a ring buffer": {bpfbuffer.RingBuf, 2},
		"CPUsPerRing with Any":           {bpfbuffer.Any, 2},
	} {
		kind, err := bpfbuffer.Prepare(m, "events", c.want, nil, bpfbuffer.CPUsPerRing(c.n))
		if kind != 0 || !errors.Is(err, os.ErrInvalid) {
			t.Errorf("%s: Prepare = %v, %v; want os.ErrInvalid", name, kind, err)
		}
		t.Logf("%s: %v", name, err)
	}
	opts := perfbuf.Options{RingBytes: bpftest.RingBytes(2)}
	fds := bpftest.OpenFDs(t)
	for i := range 2 {
		o := opts
		if kind, err := bpfbuffer.Prepare(m, "events", bpfbuffer.RingBufPerCPU, &o, bpfbuffer.CPUsPerRing(2)); kind != bpfbuffer.RingBufPerCPU || err != nil || o.RingBytes != 0 {
			t.Fatalf("Prepare #%d = %v, %v, Options %+v", i+1, kind, err, o)
		}
	}
	// The same again: RingBytes 0 keeps the rings' size.
	if kind, err := bpfbuffer.Prepare(m, "events", bpfbuffer.RingBufPerCPU, nil, bpfbuffer.CPUsPerRing(2)); kind != bpfbuffer.RingBufPerCPU || err != nil {
		t.Errorf("Prepare the same way with RingBytes 0 = %v, %v", kind, err)
	}
	possible, err := cpus.Possible()
	if err != nil {
		t.Fatal(err)
	}
	if rings := (slices.Max(possible) + 2) / 2; bpftest.OpenFDs(t) != fds+rings {
		t.Errorf("%d descriptors more after Prepare, want one for each of %d rings", bpftest.OpenFDs(t)-fds, rings)
	}
	for name, c := range map[string]struct {
		want bpfbuffer.Kind
		n    int
	}{
		"another CPUs per ring": {bpfbuffer.RingBufPerCPU, 1},
		"a shared ring":         {bpfbuffer.RingBuf, 1},
		"Any":                   {bpfbuffer.Any, 1},
	} {
		o := opts
		kind, err := bpfbuffer.Prepare(m, "events", c.want, &o, bpfbuffer.CPUsPerRing(c.n))
		if kind != 0 || !errors.Is(err, bpfbuffer.ErrPrepared) {
			t.Errorf("%s: Prepare = %v, %v; want ErrPrepared", name, kind, err)
		}
		t.Logf("%s: %v", name, err)
	}
	if err := m.BPFLoadObject(); err != nil {
		t.Fatal(err)
	}
	o := opts
	kind, err := bpfbuffer.Prepare(m, "events", bpfbuffer.RingBufPerCPU, &o, bpfbuffer.CPUsPerRing(2))
	if kind != 0 || !errors.Is(err, bpfbuffer.ErrLoaded) || !strings.Contains(err.Error(), "before BPFLoadObject") {
		t.Errorf("Prepare after load = %v, %v; want ErrLoaded", kind, err)
	}
	t.Logf("after load: %v", err)

	// Any: a shared ring, as compiled.
	m2 := open(t)
	if kind, err := bpfbuffer.Prepare(m2, "events", bpfbuffer.Any, nil); kind != bpfbuffer.RingBuf || err != nil {
		t.Errorf("Prepare(Any) = %v, %v; want a shared ring buffer", kind, err)
	}
	// Not prepared: the map itself, and its failure map.
	m3 := open(t)
	if err := m3.BPFLoadObject(); err != nil {
		t.Fatal(err)
	}
	got, gotOpts, err := bpfbuffer.Maps(m3, "events", perfbuf.Options{})
	if err != nil || got.FileDescriptor() != bpftest.Map(t, m3, "events").FileDescriptor() || gotOpts.FailureMap == nil || len(gotOpts.Maps) != 0 {
		t.Errorf("Maps of a buffer as compiled = %v, %+v, %v; want the map, its failure map", got, gotOpts, err)
	}
	if _, _, err := bpfbuffer.Maps(m3, "nope", perfbuf.Options{}); err == nil {
		t.Error("Maps of no such map succeeded")
	}
	if _, _, err := bpfbuffer.Maps(nil, "events", perfbuf.Options{}); !errors.Is(err, os.ErrInvalid) {
		t.Errorf("Maps(nil): %v, want os.ErrInvalid", err)
	}
}

// A Reader over the rings that Maps hands over opens without
// CAP_SYS_ADMIN; over the array itself it needs it to open the slots'
// rings by ID (EPERM). The capability is dropped from the effective set of
// one locked thread, which NewReader's calls run on and which goes when
// its goroutine ends.
func TestRingPerCPUWithoutSysAdmin(t *testing.T) {
	p := setupPerCPU(t, 1)
	f := p.fixture
	type result struct {
		r        *perfbuf.Reader
		err      error
		arrayErr error
	}
	done := make(chan result)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread ends with the goroutine
		if err := dropEffective(unix.CAP_SYS_ADMIN); err != nil {
			done <- result{err: err}
			return
		}
		var res result
		opts := p.opts
		opts.Maps = nil
		if r, err := perfbuf.NewReader(f.events, perfbuf.ReaderOptions{Options: opts}); err == nil {
			r.Close()
		} else {
			res.arrayErr = err
		}
		res.r, res.err = perfbuf.NewReader(p.m, perfbuf.ReaderOptions{Options: p.opts})
		done <- res
	}()
	res := <-done
	if res.err != nil {
		t.Fatalf("NewReader over the rings without CAP_SYS_ADMIN: %v", res.err)
	}
	defer res.r.Close()
	if !errors.Is(res.arrayErr, os.ErrPermission) {
		t.Errorf("NewReader over the array without CAP_SYS_ADMIN: %v, want EPERM (was the capability dropped?)", res.arrayErr)
	} else {
		t.Logf("over the array: %v", res.arrayErr)
	}
	c := newRingCollector(t, p)
	for _, cpu := range f.cpus {
		f.produce(t, cpu, 10, 48, viaOutput, 1)
	}
	if _, err := res.r.Consume(func(rec *perfbuf.Record) error {
		c.sample(rec.Ring, rec.CPU, rec.AppendTo(nil))
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	for _, cpu := range f.cpus {
		if c.got[cpu] != 10 {
			t.Errorf("cpu %d: delivered %d, want 10", cpu, c.got[cpu])
		}
	}
}

// dropEffective clears capability cp from the calling thread's effective
// set (capset(2) acts on one thread).
func dropEffective(cp int) error {
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if err := unix.Capget(&hdr, &data[0]); err != nil {
		return fmt.Errorf("capget: %w", err)
	}
	data[cp/32].Effective &^= 1 << (cp % 32)
	if err := unix.Capset(&hdr, &data[0]); err != nil {
		return fmt.Errorf("capset: %w", err)
	}
	return nil
}
