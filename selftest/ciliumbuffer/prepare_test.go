// SPDX-License-Identifier: Apache-2.0

package ciliumbuffer

import (
	"errors"
	"os"
	"reflect"
	"strings"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/perfbuf/perfbuf"
	"github.com/perfbuf/perfbuf/bpfbuffer/ciliumbuffer"
	"github.com/perfbuf/perfbuf/internal/cpus"
)

// config mirrors struct perfbuf_buffer_config.
type config struct{ RingBuf, WakeupBytes, MaxSample uint64 }

// prepared is what Prepare set in a spec.
type prepared struct {
	Type                           ebpf.MapType
	KeySize, ValueSize, MaxEntries uint32
	ScratchValue                   uint32
	Config                         config
}

func preparedOf(t *testing.T, s *ebpf.CollectionSpec) prepared {
	t.Helper()
	m := s.Maps["events"]
	p := prepared{Type: m.Type, KeySize: m.KeySize, ValueSize: m.ValueSize, MaxEntries: m.MaxEntries, ScratchValue: s.Maps["events_scratch"].ValueSize}
	if err := s.Variables["events_config"].Get(&p.Config); err != nil {
		t.Fatal(err)
	}
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
	compiled := prepared{Type: ebpf.RingBuf, MaxEntries: ringSize, ScratchValue: sampleMax, Config: config{1, 0, sampleMax}}
	ring := prepared{Type: ebpf.RingBuf, MaxEntries: uint32(2 * page), ScratchValue: 1, Config: config{1, 100, sampleMax}}
	perf := prepared{Type: ebpf.PerfEventArray, KeySize: 4, ValueSize: 4, MaxEntries: uint32(possible[len(possible)-1] + 1),
		ScratchValue: sampleMax, Config: config{0, 0, sampleMax}}

	s := spec(t)
	if got := preparedOf(t, s); got != compiled {
		t.Fatalf("the spec as compiled: %+v, want %+v", got, compiled)
	}
	for i, step := range []struct {
		want ciliumbuffer.Kind
		opts perfbuf.Options
		got  prepared
		err  error
	}{
		{ciliumbuffer.PerfEventArray, perfbuf.Options{RingBytes: 3 * page}, perf, nil},
		{ciliumbuffer.PerfEventArray, perfbuf.Options{RingBytes: 3 * page}, perf, nil},
		{ciliumbuffer.RingBuf, perfbuf.Options{}, perf, ciliumbuffer.ErrPrepared},
		{ciliumbuffer.RingBuf, perfbuf.Options{RingBytes: 2 * page, WakeupBytes: 100}, ring, nil},
		{ciliumbuffer.RingBuf, perfbuf.Options{RingBytes: 2 * page, WakeupBytes: 100}, ring, nil},
		{ciliumbuffer.RingBuf, perfbuf.Options{WakeupBytes: 4 * page}, ring, os.ErrInvalid}, // not below the ring's 2 pages
		{ciliumbuffer.PerfEventArray, perfbuf.Options{}, perf, nil},
	} {
		opts := step.opts
		kind, err := ciliumbuffer.Prepare(s, "events", step.want, &opts)
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
		case kind == ciliumbuffer.RingBuf && (opts.RingBytes != 0 || opts.WakeupBytes != step.opts.WakeupBytes),
			kind == ciliumbuffer.PerfEventArray && !reflect.DeepEqual(opts, step.opts):
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
		}, "cannot pass map_type 4 into func bpf_ringbuf_output#130"},
		{"ring buffer, config of a perf event array", func(s *ebpf.CollectionSpec) {
			if err := s.Variables["events_config"].Set(config{0, 0, sampleMax}); err != nil {
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
