// SPDX-License-Identifier: Apache-2.0

package ciliumbuffer

import (
	"errors"
	"fmt"
	"os"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/perfbuf/perfbuf"
	"github.com/perfbuf/perfbuf/bpfbuffer/ciliumbuffer"
	"github.com/perfbuf/perfbuf/internal/cpus"
	"github.com/perfbuf/perfbuf/selftest/internal/ledger"
)

// config mirrors struct perfbuf_buffer_config.
type config struct{ RingBuf, WakeupBytes, MaxSample, CPUsPerRing uint64 }

// prepared is what Prepare set in a spec: for an array of ring buffers,
// the size of its inner map and of its rings, and the slots its Contents
// fill with them.
type prepared struct {
	Type                           ebpf.MapType
	KeySize, ValueSize, MaxEntries uint32
	ScratchValue                   uint32
	Config                         config
	Inner                          uint32 // the inner map's max_entries
	Rings                          string // the rings' slots and sizes: "0:8192 1:8192"
}

func preparedOf(t *testing.T, s *ebpf.CollectionSpec) prepared {
	t.Helper()
	m := s.Maps["events"]
	p := prepared{Type: m.Type, KeySize: m.KeySize, ValueSize: m.ValueSize, MaxEntries: m.MaxEntries, ScratchValue: s.Maps["events_scratch"].ValueSize}
	if err := s.Variables["events_config"].Get(&p.Config); err != nil {
		t.Fatal(err)
	}
	if m.InnerMap != nil {
		p.Inner = m.InnerMap.MaxEntries
	}
	var rings []string
	for _, kv := range m.Contents {
		name, _ := kv.Value.(string)
		r := s.Maps[name]
		if r == nil || r.Type != ebpf.RingBuf || name != fmt.Sprintf("events_%d", kv.Key) {
			t.Fatalf("slot %v names %q, a %v", kv.Key, name, r)
		}
		rings = append(rings, fmt.Sprintf("%v:%d", kv.Key, r.MaxEntries))
	}
	// Rings the Contents do not name: left over.
	for name, ms := range s.Maps {
		if strings.HasPrefix(name, "events_") && ms.Type == ebpf.RingBuf && !slices.ContainsFunc(m.Contents, func(kv ebpf.MapKV) bool { return kv.Value == name }) {
			t.Fatalf("ring %q left in the spec", name)
		}
	}
	p.Rings = strings.Join(rings, " ")
	return p
}

// What Prepare makes of the spec, for each kind, and again: the same
// Options give the same spec, whatever it was prepared as before; a ring
// buffer of the compiled size after a perf event array is refused
// (ErrPrepared), and the spec is left as it was.
func TestPrepareSpec(t *testing.T) {
	page := os.Getpagesize()
	possible, err := cpus.Possible()
	if err != nil {
		t.Fatal(err)
	}
	compiled := prepared{Type: ebpf.RingBuf, MaxEntries: ringSize, ScratchValue: sampleMax, Config: config{1, 0, sampleMax, 1}}
	ring := prepared{Type: ebpf.RingBuf, MaxEntries: uint32(2 * page), ScratchValue: 1, Config: config{1, 100, sampleMax, 1}}
	perf := prepared{Type: ebpf.PerfEventArray, KeySize: 4, ValueSize: 4, MaxEntries: uint32(possible[len(possible)-1] + 1),
		ScratchValue: sampleMax, Config: config{0, 0, sampleMax, 1}}
	// A ring of 4 pages per 2 CPUs, a slot for each pair holding a
	// possible CPU.
	var slots []string
	for _, k := range ledger.NewRings(possible, 2).Keys {
		slots = append(slots, fmt.Sprintf("%d:%d", k, 4*page))
	}
	perCPU := prepared{Type: ebpf.ArrayOfMaps, KeySize: 4, ValueSize: 4, MaxEntries: uint32(possible[len(possible)-1]/2 + 1),
		ScratchValue: 1, Config: config{2, 0, sampleMax, 2}, Inner: uint32(4 * page), Rings: strings.Join(slots, " ")}

	s := spec(t)
	if got := preparedOf(t, s); got != compiled {
		t.Fatalf("the spec as compiled: %+v, want %+v", got, compiled)
	}
	for i, step := range []struct {
		want ciliumbuffer.Kind
		opts perfbuf.Options
		got  prepared
		err  error
		more []ciliumbuffer.Option
	}{
		{ciliumbuffer.PerfEventArray, perfbuf.Options{RingBytes: 3 * page}, perf, nil, nil},
		{ciliumbuffer.PerfEventArray, perfbuf.Options{RingBytes: 3 * page}, perf, nil, nil},
		{ciliumbuffer.RingBuf, perfbuf.Options{}, perf, ciliumbuffer.ErrPrepared, nil},
		{ciliumbuffer.RingBuf, perfbuf.Options{RingBytes: 2 * page, WakeupBytes: 100}, ring, nil, nil},
		{ciliumbuffer.RingBuf, perfbuf.Options{RingBytes: 2 * page, WakeupBytes: 100}, ring, nil, nil},
		{ciliumbuffer.RingBuf, perfbuf.Options{WakeupBytes: 4 * page}, ring, os.ErrInvalid, nil}, // not below the ring's 2 pages
		{ciliumbuffer.PerfEventArray, perfbuf.Options{}, perf, nil, nil},
		{ciliumbuffer.RingBufPerCPU, perfbuf.Options{RingBytes: 4 * page}, perCPU, nil, []ciliumbuffer.Option{ciliumbuffer.CPUsPerRing(2)}},
		{ciliumbuffer.RingBufPerCPU, perfbuf.Options{RingBytes: 4 * page}, perCPU, nil, []ciliumbuffer.Option{ciliumbuffer.CPUsPerRing(2)}},
		{ciliumbuffer.RingBufPerCPU, perfbuf.Options{}, perCPU, ciliumbuffer.ErrPrepared, nil},
		{ciliumbuffer.RingBufPerCPU, perfbuf.Options{RingBytes: 4 * page}, perCPU, os.ErrInvalid, []ciliumbuffer.Option{ciliumbuffer.CPUsPerRing(0)}},
		{ciliumbuffer.RingBuf, perfbuf.Options{RingBytes: 2 * page, WakeupBytes: 100}, ring, nil, nil},
	} {
		opts := step.opts
		kind, err := ciliumbuffer.Prepare(s, "events", step.want, &opts, step.more...)
		if !errors.Is(err, step.err) || (err == nil) != (step.err == nil) {
			t.Fatalf("step %d: Prepare %v = %v, %v; want %v", i, step.want, kind, err, step.err)
		}
		t.Logf("step %d: Prepare %v, %+v: %v, %v", i, step.want, step.opts, kind, err)
		if got := preparedOf(t, s); got != step.got {
			t.Errorf("step %d: the spec %+v, want %+v", i, got, step.got)
		}
		switch {
		case err != nil:
			if kind != 0 || !reflect.DeepEqual(opts, step.opts) {
				t.Errorf("step %d: failed with %v, %+v; want Any and the Options untouched", i, kind, opts)
			}
		case kind != step.want:
			t.Errorf("step %d: kind %v, want %v", i, kind, step.want)
		case kind != ciliumbuffer.PerfEventArray && (opts.RingBytes != 0 || opts.WakeupBytes != step.opts.WakeupBytes),
			kind == ciliumbuffer.PerfEventArray && (opts.RingBytes != step.opts.RingBytes || opts.WakeupBytes != step.opts.WakeupBytes):
			t.Errorf("step %d: Options %+v after Prepare as %v", i, opts, kind)
		}
	}
}

// Prepare refuses what it cannot do the same way for both kinds, and a
// map that PERFBUF_BUFFER did not declare, before it changes anything.
func TestPrepareErrors(t *testing.T) {
	for name, c := range map[string]struct {
		mapName string
		want    ciliumbuffer.Kind
		opts    perfbuf.Options
		err     error
		says    string
	}{
		"no such kind":          {"events", ciliumbuffer.Kind(7), perfbuf.Options{}, os.ErrInvalid, "Kind(7)"},
		"WakeupEvents":          {"events", ciliumbuffer.Any, perfbuf.Options{WakeupEvents: 2}, os.ErrInvalid, "WakeupEvents"},
		"negative RingBytes":    {"events", ciliumbuffer.PerfEventArray, perfbuf.Options{RingBytes: -1}, os.ErrInvalid, "RingBytes"},
		"ring above 2 GiB":      {"events", ciliumbuffer.RingBuf, perfbuf.Options{RingBytes: 1<<31 + 1}, os.ErrInvalid, "ring bytes"},
		"watermark not below":   {"events", ciliumbuffer.RingBuf, perfbuf.Options{WakeupBytes: ringSize}, os.ErrInvalid, "wakeup bytes"},
		"no such map":           {"nope", ciliumbuffer.Any, perfbuf.Options{}, os.ErrNotExist, `no map "nope"`},
		"not a PERFBUF_BUFFER":  {"rings", ciliumbuffer.Any, perfbuf.Options{}, os.ErrNotExist, "not a PERFBUF_BUFFER"},
		"its scratch map alone": {"events_scratch", ciliumbuffer.PerfEventArray, perfbuf.Options{}, os.ErrNotExist, "not a PERFBUF_BUFFER"},
	} {
		s := spec(t)
		before := preparedOf(t, s)
		opts := c.opts
		kind, err := ciliumbuffer.Prepare(s, c.mapName, c.want, &opts)
		if kind != 0 || !errors.Is(err, c.err) || !strings.Contains(err.Error(), c.says) || !strings.Contains(err.Error(), c.mapName) {
			t.Errorf("%s: %v, %v; want %v, saying %q and the map's name", name, kind, err, c.err, c.says)
		}
		if !reflect.DeepEqual(opts, c.opts) || preparedOf(t, s) != before {
			t.Errorf("%s: the Options or the spec changed", name)
		}
		t.Logf("%s: %v", name, err)
	}
	if _, err := ciliumbuffer.Prepare(nil, "events", ciliumbuffer.Any, nil); !errors.Is(err, os.ErrInvalid) {
		t.Errorf("a nil spec: %v", err)
	}
	// A nil Options is the zero Options.
	if kind, err := ciliumbuffer.Prepare(spec(t), "events", ciliumbuffer.PerfEventArray, nil); kind != ciliumbuffer.PerfEventArray || err != nil {
		t.Errorf("nil Options: %v, %v", kind, err)
	}
}

// What a user sees who changes the map's type by hand and forgets the
// config (docs/bpfbuffer.md quotes it): the verifier checks the ring
// buffer path, which the config left live, against a perf event array;
// and the other way round.
func TestForgottenConfig(t *testing.T) {
	for _, c := range []struct {
		name   string
		change func(*ebpf.CollectionSpec)
		says   string
	}{
		{"perf event array, config as compiled", func(s *ebpf.CollectionSpec) {
			m := s.Maps["events"]
			m.Type, m.KeySize, m.ValueSize, m.MaxEntries = ebpf.PerfEventArray, 4, 4, 0
		}, "cannot pass map_type 4 into func bpf_ringbuf_"}, // (the first ring buffer helper the verifier meets)
		{"ring buffer, config of a perf event array", func(s *ebpf.CollectionSpec) {
			if err := s.Variables["events_config"].Set(config{0, 0, sampleMax, 1}); err != nil {
				t.Fatal(err)
			}
		}, "cannot pass map_type 27 into func bpf_perf_event_output#25"},
	} {
		t.Run(c.name, func(t *testing.T) {
			s := spec(t)
			c.change(s)
			privileged(t, nil)
			coll, err := ebpf.NewCollection(s)
			if err == nil {
				coll.Close()
				t.Fatal("the collection loaded")
			}
			privileged(t, err)
			if !strings.Contains(err.Error(), c.says) {
				t.Errorf("%v; want it saying %q", err, c.says)
			}
			t.Log(err)
		})
	}
}

// An object built with a perfbuf.bpf.h older than the array of ring
// buffers has a 24-byte events_config (no cpus_per_ring): it is prepared
// as a ring buffer or a perf event array as before, writing its three
// fields, and RingBufPerCPU is refused, the spec left as it was; Any
// makes it one ring buffer, as the object can have. (The spec's variable
// cut to 24 bytes stands for such an object.)
func TestPrepareOldConfig(t *testing.T) {
	s := spec(t)
	v := s.Variables["events_config"]
	v.Value = v.Value[:24]
	type old struct{ RingBuf, WakeupBytes, MaxSample uint64 }
	get := func() old {
		t.Helper()
		var c old
		if err := v.Get(&c); err != nil {
			t.Fatal(err)
		}
		return c
	}
	if kind, err := ciliumbuffer.Prepare(s, "events", ciliumbuffer.PerfEventArray, nil); kind != ciliumbuffer.PerfEventArray || err != nil {
		t.Fatalf("Prepare as a perf event array: %v, %v", kind, err)
	}
	if c := get(); c != (old{0, 0, sampleMax}) || s.Maps["events"].Type != ebpf.PerfEventArray {
		t.Errorf("prepared as a perf event array: config %+v, map %v", c, s.Maps["events"].Type)
	}
	opts := perfbuf.Options{RingBytes: os.Getpagesize(), WakeupBytes: 100}
	if kind, err := ciliumbuffer.Prepare(s, "events", ciliumbuffer.RingBuf, &opts); kind != ciliumbuffer.RingBuf || err != nil {
		t.Fatalf("Prepare as a ring buffer: %v, %v", kind, err)
	}
	if c := get(); c != (old{1, 100, sampleMax}) {
		t.Errorf("prepared as a ring buffer: config %+v", c)
	}
	before := s.Maps["events"].Copy()
	opts = perfbuf.Options{RingBytes: os.Getpagesize()}
	kind, err := ciliumbuffer.Prepare(s, "events", ciliumbuffer.RingBufPerCPU, &opts)
	if kind != 0 || !errors.Is(err, os.ErrInvalid) || !strings.Contains(err.Error(), "cpus_per_ring") {
		t.Errorf("Prepare as a ring per CPU: %v, %v; want os.ErrInvalid naming cpus_per_ring", kind, err)
	}
	t.Log(err)
	if c := get(); c != (old{1, 100, sampleMax}) || !reflect.DeepEqual(s.Maps["events"], before) || opts.RingBytes == 0 {
		t.Errorf("refused, Prepare changed the spec or the Options: config %+v, map %+v", c, s.Maps["events"])
	}
	opts = perfbuf.Options{RingBytes: 2 * os.Getpagesize()}
	if kind, err := ciliumbuffer.Prepare(s, "events", ciliumbuffer.Any, &opts); kind != ciliumbuffer.RingBuf || err != nil {
		t.Fatalf("Prepare(Any): %v, %v; want a ring buffer", kind, err)
	}
	if c, m := get(), s.Maps["events"]; c != (old{1, 0, sampleMax}) || m.Type != ebpf.RingBuf || int(m.MaxEntries) != 2*os.Getpagesize() {
		t.Errorf("Any: config %+v, map %v of %d bytes; want a ring buffer of 2 pages", c, m.Type, m.MaxEntries)
	}
}

// Prepare after the collection was made changes only the spec: the
// collection holds the buffer as compiled, a ring buffer of 64 KiB. A
// reader given its map with the Options Prepare completed refuses it,
// naming the fix, through Maps and through Map alike; before, it read the
// compiled ring buffer as if it were what Prepare returned.
func TestPrepareAfterCollection(t *testing.T) {
	page := os.Getpagesize()
	for _, c := range []struct {
		want ciliumbuffer.Kind
		opts perfbuf.Options
	}{
		{ciliumbuffer.RingBufPerCPU, perfbuf.Options{}},
		{ciliumbuffer.RingBufPerCPU, perfbuf.Options{RingBytes: 4 * page}},
		{ciliumbuffer.PerfEventArray, perfbuf.Options{}},
		{ciliumbuffer.RingBuf, perfbuf.Options{RingBytes: 2 * page}},
	} {
		t.Run(fmt.Sprintf("%v %d", c.want, c.opts.RingBytes), func(t *testing.T) {
			s := spec(t)
			coll := load(t, s) // before Prepare: the misuse
			opts := c.opts
			if kind, err := ciliumbuffer.Prepare(s, "events", c.want, &opts); kind != c.want || err != nil {
				t.Fatalf("Prepare: %v, %v", kind, err)
			}
			events, ropts, err := ciliumbuffer.Maps(coll, "events", opts)
			if err != nil {
				t.Fatal(err)
			}
			for name, m := range map[string]perfbuf.Map{"Maps": events, "Map": ciliumbuffer.Map(coll.Maps["events"])} {
				r, err := perfbuf.NewReader(m, perfbuf.ReaderOptions{Options: ropts})
				if err == nil {
					r.Close()
					t.Errorf("%s: a reader over the buffer as compiled, prepared as %v after the collection", name, c.want)
					continue
				}
				if !errors.Is(err, os.ErrInvalid) || !strings.Contains(err.Error(), "call ciliumbuffer.Prepare before ebpf.NewCollection") {
					t.Errorf("%s: %v; want os.ErrInvalid naming the fix", name, err)
				}
				t.Logf("%s: %v", name, err)
			}
		})
	}
}
