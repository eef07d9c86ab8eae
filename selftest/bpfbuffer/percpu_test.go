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
	"github.com/perfbuf/perfbuf/selftest/internal/ledger"
	"golang.org/x/sys/unix"
)

// perCPU is a fixture loaded as an array of ring buffers, n CPUs a ring,
// with the map and Options that bpfbuffer.Maps returned.
type perCPU struct {
	*fixture
	ledger.Rings
	m    perfbuf.Map
	opts perfbuf.Options
}

// setupPerCPU prepares the buffer as rings of one page, n CPUs a ring,
// loads it, and checks what the array holds: a ring of a page in the
// slot of every possible CPU, the rings Maps hands over.
func setupPerCPU(t *testing.T, n int) *perCPU {
	t.Helper()
	return setupPerCPUAs(t, bpfbuffer.RingBufPerCPU, n)
}

// setupPerCPUAs is setupPerCPU with the kind asked of Prepare: Any must
// choose a ring per CPU (n 1) where the kernel allows, as here.
func setupPerCPUAs(t *testing.T, want bpfbuffer.Kind, n int) *perCPU {
	t.Helper()
	opts := perfbuf.Options{RingBytes: bpftest.RingBytes(1)}
	var more []bpfbuffer.Option
	if want == bpfbuffer.RingBufPerCPU {
		more = append(more, bpfbuffer.CPUsPerRing(n))
	}
	f := setup(t, want, &opts, more...)
	if f.kind != bpfbuffer.RingBufPerCPU || opts.RingBytes != 0 {
		t.Fatalf("Prepare(%v) chose %v, left RingBytes %d; want %v, RingBytes cleared", want, f.kind, opts.RingBytes, bpfbuffer.RingBufPerCPU)
	}
	possible, err := cpus.Possible()
	if err != nil {
		t.Fatal(err)
	}
	p := &perCPU{fixture: f, Rings: ledger.NewRings(possible, n)}
	if typ, entries := f.events.Type(), f.events.MaxEntries(); typ != libbpfgo.MapTypeArrayOfMaps || entries != p.Keys[len(p.Keys)-1]+1 {
		t.Fatalf("events: %v of %d slots, want an array of maps of %d", typ, entries, p.Keys[len(p.Keys)-1]+1)
	}
	p.m, p.opts, err = bpfbuffer.Maps(f.mod, "events", opts)
	if err != nil {
		t.Fatal(err)
	}
	if p.opts.FailureMap == nil || len(p.opts.Maps) != len(p.Keys)-1 {
		t.Fatalf("Maps: %d further rings, failure map %v; want %d, events_failures", len(p.opts.Maps), p.opts.FailureMap, len(p.Keys)-1)
	}
	for i, k := range p.Keys {
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

// A ring per CPU, and per 2 CPUs (one ring for two: on a 2-CPU host, one
// ring in all), read by a Reader over the rings Maps handed over. On each
// CPU: outputs and reserves that reach its ring, discards, reserves above
// the buffer's max sample (einval), outputs to a missing inner ring buffer
// of another map (noent), outputs while the CPU's slot is empty (noent),
// a full ring (full, and only that ring's CPUs refused), and records left
// at Close. Per ring, every attempt of its CPUs is accounted for:
// attempted == delivered + discarded + left + the CPUs' failures. Any
// makes the same ring per CPU on a kernel that takes ring buffers in an
// array of maps (5.10 and later, as every kernel these tests run on).
func TestRingPerCPU(t *testing.T) {
	for _, c := range []struct {
		want bpfbuffer.Kind
		n    int
	}{{bpfbuffer.RingBufPerCPU, 1}, {bpfbuffer.RingBufPerCPU, 2}, {bpfbuffer.Any, 1}} {
		t.Run(fmt.Sprintf("%v, %d CPUs a ring", c.want, c.n), func(t *testing.T) {
			p := setupPerCPUAs(t, c.want, c.n)
			f := p.fixture
			r, err := perfbuf.NewReader(p.m, perfbuf.ReaderOptions{Options: p.opts})
			if err != nil {
				t.Fatal(err)
			}
			defer r.Close()
			c := ledger.NewRingCollector(t, p.Rings)
			consume := func() {
				t.Helper()
				if _, err := r.Consume(func(rec *perfbuf.Record) error {
					if rec.Type == perfbuf.RecordSample {
						c.Sample(rec.Ring, rec.CPU, rec.AppendTo(nil))
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
			emptied := p.Keys[p.Of(first)]
			if err := kernel.DeleteSlot(f.events.FileDescriptor(), emptied); err != nil {
				t.Fatal(err)
			}
			for _, cpu := range f.cpus {
				f.produce(t, cpu, 3, 48, viaOutput, 1)
				f.produce(t, cpu, 2, 32, viaReserve, 1)
			}
			if err := kernel.UpdateSlot(f.events.FileDescriptor(), emptied, p.ring(p.Of(first)).FileDescriptor()); err != nil {
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
			ledger.CheckRings(t, p.Rings, f.cpus, f.outcomes(t), c, r.Stats(), emptied)
		})
	}
}

// An object built with a perfbuf.bpf.h older than the array of ring
// buffers (oldconfig.bpf.c: a 24-byte events_config, no cpus_per_ring)
// cannot be an array of ring buffers: Any makes it one ring buffer, the
// same when called again, and it loads as one; RingBufPerCPU is refused,
// naming cpus_per_ring.
func TestAnyOldConfig(t *testing.T) {
	const old = "bpf/oldconfig.bpf.o"
	m := openObj(t, old)
	for i := range 2 {
		opts := perfbuf.Options{RingBytes: bpftest.RingBytes(2)}
		if kind, err := bpfbuffer.Prepare(m, "events", bpfbuffer.Any, &opts); kind != bpfbuffer.RingBuf || err != nil || opts.RingBytes != 0 {
			t.Fatalf("Prepare #%d (Any) = %v, %v, RingBytes %d; want a ring buffer, RingBytes cleared", i+1, kind, err, opts.RingBytes)
		}
	}
	if err := m.BPFLoadObject(); err != nil {
		t.Fatal(err)
	}
	if events := bpftest.Map(t, m, "events"); events.Type() != libbpfgo.MapTypeRingbuf || int(events.MaxEntries()) != bpftest.RingBytes(2) {
		t.Errorf("events: %v of %d bytes, want a ring buffer of %d", events.Type(), events.MaxEntries(), bpftest.RingBytes(2))
	}
	kind, err := bpfbuffer.Prepare(openObj(t, old), "events", bpfbuffer.RingBufPerCPU, nil)
	if kind != 0 || err == nil || !strings.Contains(err.Error(), "cpus_per_ring") {
		t.Errorf("Prepare(RingBufPerCPU) = %v, %v; want an error naming cpus_per_ring", kind, err)
	}
	t.Log(err)
}

// Every form of reading reads the rings: ReadInto, ReadBatch, Each,
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
	forms := map[string]func(t *testing.T, c *ledger.RingCollector) (stats func() perfbuf.Stats, closeFn func()){
		"ReadInto": func(t *testing.T, c *ledger.RingCollector) (func() perfbuf.Stats, func()) {
			r := newReader(t, p)
			load()
			var s perfbuf.Sample
			readFlushed(t, r, func() error {
				if err := r.ReadInto(&s); err != nil {
					return err
				}
				c.Sample(s.Ring, s.CPU, s.Data)
				return nil
			})
			return r.Stats, func() { r.Close() }
		},
		"ReadBatch": func(t *testing.T, c *ledger.RingCollector) (func() perfbuf.Stats, func()) {
			r := newReader(t, p)
			load()
			batch := make([]perfbuf.Sample, 7)
			readFlushed(t, r, func() error {
				n, err := r.ReadBatch(batch)
				for _, s := range batch[:n] {
					c.Sample(s.Ring, s.CPU, s.Data)
				}
				return err
			})
			return r.Stats, func() { r.Close() }
		},
		"Each": func(t *testing.T, c *ledger.RingCollector) (func() perfbuf.Stats, func()) {
			r := newReader(t, p)
			load()
			r.Flush()
			err := r.Each(context.Background(), func(rec *perfbuf.Record) error {
				c.Sample(rec.Ring, rec.CPU, rec.AppendTo(nil))
				return nil
			})
			if !errors.Is(err, perfbuf.ErrFlushed) {
				t.Fatal(err)
			}
			return r.Stats, func() { r.Close() }
		},
		"Batches": func(t *testing.T, c *ledger.RingCollector) (func() perfbuf.Stats, func()) {
			r := newReader(t, p)
			load()
			r.Flush()
			for b, err := range r.Batches(context.Background()) {
				if err != nil {
					if !errors.Is(err, perfbuf.ErrFlushed) {
						t.Fatal(err)
					}
					break
				}
				for b.Next() {
					rec := b.Record()
					c.Sample(rec.Ring, rec.CPU, rec.AppendTo(nil))
				}
			}
			return r.Stats, func() { r.Close() }
		},
		"Consume": func(t *testing.T, c *ledger.RingCollector) (func() perfbuf.Stats, func()) {
			r := newReader(t, p)
			load()
			if _, err := r.Consume(func(rec *perfbuf.Record) error {
				c.Sample(rec.Ring, rec.CPU, rec.AppendTo(nil))
				return nil
			}); err != nil {
				t.Fatal(err)
			}
			return r.Stats, func() { r.Close() }
		},
		"callback": func(t *testing.T, c *ledger.RingCollector) (func() perfbuf.Stats, func()) {
			// The sample function is told no ring: the sample's CPU says
			// which.
			pb, err := perfbuf.New(p.m, func(cpu int, data []byte) { c.Sample(ledger.AnyRing, cpu, data) }, nil, p.opts)
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
		"raw": func(t *testing.T, c *ledger.RingCollector) (func() perfbuf.Stats, func()) {
			pb, err := perfbuf.NewRaw(p.m, p.opts)
			if err != nil {
				t.Fatal(err)
			}
			load()
			var st perfbuf.Stats
			for i := range p.Keys {
				rb, err := pb.Buffer(i)
				if err != nil {
					t.Fatal(err)
				}
				if _, err := rb.Drain(func(rec *perfbuf.Record) error {
					c.Sample(i, rec.CPU, rec.Data)
					return nil
				}); err != nil {
					t.Fatal(err)
				}
				// What a RawBuffer parsed is in its own Stats, not the
				// Raw's: the rings' entries, and their sum.
				rs := rb.Stats()
				st.Samples += rs.Samples
				st.Rings = append(st.Rings, rs)
				rb.Release()
			}
			return func() perfbuf.Stats { return st }, func() { pb.Close() }
		},
	}
	for name, read := range forms {
		t.Run(name, func(t *testing.T) {
			c := ledger.NewRingCollector(t, p.Rings)
			stats, closeFn := read(t, c)
			st := stats()
			var samples uint64
			for i, s := range st.Rings {
				samples += s.Samples
				if s.Samples != c.Ring[i] {
					t.Errorf("ring %d: Stats %+v, delivered %d", i, s, c.Ring[i])
				}
			}
			for _, cpu := range f.cpus {
				if c.Got[cpu] != each {
					t.Errorf("cpu %d: delivered %d, want %d", cpu, c.Got[cpu], each)
				}
			}
			if samples != want || st.Samples != want {
				t.Errorf("Stats count %d samples in the rings, %d in the sums, want %d", samples, st.Samples, want)
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
	c := ledger.NewRingCollector(t, p.Rings)
	for _, cpu := range f.cpus {
		f.produce(t, cpu, 10, 48, viaOutput, 1)
	}
	if _, err := r.Consume(func(rec *perfbuf.Record) error {
		c.Sample(rec.Ring, rec.CPU, rec.AppendTo(nil))
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	for _, cpu := range f.cpus {
		if c.Got[cpu] != 10 {
			t.Errorf("cpu %d: delivered %d, want 10", cpu, c.Got[cpu])
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

	// Any: a ring per CPU, where the kernel allows, as here.
	m2 := open(t)
	if kind, err := bpfbuffer.Prepare(m2, "events", bpfbuffer.Any, nil); kind != bpfbuffer.RingBufPerCPU || err != nil {
		t.Errorf("Prepare(Any) = %v, %v; want a ring per CPU", kind, err)
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
	c := ledger.NewRingCollector(t, p.Rings)
	for _, cpu := range f.cpus {
		f.produce(t, cpu, 10, 48, viaOutput, 1)
	}
	if _, err := res.r.Consume(func(rec *perfbuf.Record) error {
		c.Sample(rec.Ring, rec.CPU, rec.AppendTo(nil))
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	for _, cpu := range f.cpus {
		if c.Got[cpu] != 10 {
			t.Errorf("cpu %d: delivered %d, want 10", cpu, c.Got[cpu])
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

// An ordered Reader over a ring per CPU, and over one ring for 2 CPUs,
// keyed by each CPU's attempt number: every CPU writes rounds of outputs,
// interleaved with the other CPUs' (one CPU's records follow another's in
// a shared ring, their keys starting over), and the Reader delivers every
// record once, keys never falling, none late; then every attempt is
// accounted for per ring.
func TestRingPerCPUOrdered(t *testing.T) {
	for _, n := range []int{1, 2} {
		t.Run(fmt.Sprintf("%d CPUs a ring", n), func(t *testing.T) {
			p := setupPerCPU(t, n)
			f := p.fixture
			r, err := perfbuf.NewReader(p.m, perfbuf.ReaderOptions{Options: p.opts,
				Order: &perfbuf.Order{KeyOffset: 0, MaxDelay: 20 * time.Millisecond}})
			if err != nil {
				t.Fatal(err)
			}
			defer r.Close()
			c := ledger.NewRingCollector(t, p.Rings)
			const rounds, each = 4, 5 // 20 records of 56 bytes a CPU: 2 CPUs' in a page
			for range rounds {
				for _, cpu := range f.cpus {
					f.produce(t, cpu, each, 48, viaOutput, 1)
				}
			}
			want := rounds * each * len(f.cpus)
			r.SetDeadline(time.Now().Add(10 * time.Second))
			last := uint64(0)
			for got := 0; got < want; got++ {
				var s perfbuf.Sample
				if err := r.ReadInto(&s); err != nil {
					t.Fatalf("read %d of %d: %v", got, want, err)
				}
				if s.Late || s.Key < last || s.Key != binary.NativeEndian.Uint64(s.Data) {
					t.Fatalf("record %d: key %d after %d, late %v", got, s.Key, last, s.Late)
				}
				last = s.Key
				c.Sample(s.Ring, s.CPU, s.Data)
			}
			if err := r.Close(); err != nil {
				t.Fatal(err)
			}
			var attempts, ok uint64
			for _, o := range f.outcomes(t) {
				attempts, ok = attempts+o.Attempts, ok+o.OK
			}
			st := r.Stats()
			if attempts != uint64(want) || ok != attempts || st.Samples != ok || st.Left != 0 || st.Late != 0 || st.Failed.Total() != 0 {
				t.Errorf("%d attempts, %d ok; stats: %d delivered, %d left, %d late, %d failed",
					attempts, ok, st.Samples, st.Left, st.Late, st.Failed.Total())
			}
		})
	}
}
