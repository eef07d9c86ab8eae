// SPDX-License-Identifier: Apache-2.0

package buflayout

import (
	"errors"
	"os"
	"slices"
	"syscall"
	"testing"

	"github.com/perfbuf/perfbuf"
	"github.com/perfbuf/perfbuf/internal/cpus"
	"golang.org/x/sys/unix"
)

func TestCheck(t *testing.T) {
	for name, c := range map[string]struct {
		want Kind
		opts perfbuf.Options
		err  error
	}{
		"any":                    {Any, perfbuf.Options{RingBytes: 1 << 20, WakeupBytes: 4096}, nil},
		"no such kind":           {Kind(7), perfbuf.Options{}, os.ErrInvalid},
		"WakeupEvents":           {PerfEventArray, perfbuf.Options{WakeupEvents: 2}, os.ErrInvalid},
		"negative RingBytes":     {RingBuf, perfbuf.Options{RingBytes: -1}, os.ErrInvalid},
		"negative WakeupBytes":   {RingBuf, perfbuf.Options{WakeupBytes: -1}, os.ErrInvalid},
		"perf's options checked": {PerfEventArray, perfbuf.Options{RingBytes: -1}, os.ErrInvalid},
	} {
		if err := Check(c.want, &c.opts); !errors.Is(err, c.err) || (err == nil) != (c.err == nil) {
			t.Errorf("%s: %v, want %v", name, err, c.err)
		}
	}
}

func TestChoose(t *testing.T) {
	yes := func() (bool, error) { return true, nil }
	no := func() (bool, error) { return false, nil }
	fails := func() (bool, error) { return false, syscall.EPERM }
	never := func() (bool, error) { t.Error("probed for a forced perf event array"); return false, nil }
	for _, c := range []struct {
		want  Kind
		probe func() (bool, error)
		got   Kind
		err   error
	}{
		{Any, yes, RingBuf, nil},
		{Any, no, PerfEventArray, nil},
		{RingBuf, yes, RingBuf, nil},
		{RingBuf, no, 0, errors.ErrUnsupported},
		{PerfEventArray, never, PerfEventArray, nil},
		{Any, fails, 0, syscall.EPERM},
	} {
		got, err := Choose(c.want, c.probe)
		if got != c.got || !errors.Is(err, c.err) || (err == nil) != (c.err == nil) {
			t.Errorf("Choose(%v) = %v, %v; want %v, %v", c.want, got, err, c.got, c.err)
		}
	}
}

func TestPlan(t *testing.T) {
	page := os.Getpagesize()
	possible, err := cpus.Possible()
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		kind     Kind
		compiled uint32
		opts     perfbuf.Options
		plan     Plan
		str      string
		m        MapSettings
		cfg      Config
		err      error
	}{
		{RingBuf, 64 << 10, perfbuf.Options{}, Plan{RingBuf, 64 << 10, 0}, "ringbuf of 65536 bytes",
			MapSettings{Type: unix.BPF_MAP_TYPE_RINGBUF, MaxEntries: 64 << 10}, Config{RingBuf: 1}, nil},
		{RingBuf, 64 << 10, perfbuf.Options{RingBytes: 3 * page, WakeupBytes: 100}, Plan{RingBuf, 4 * page, 100}, "",
			MapSettings{Type: unix.BPF_MAP_TYPE_RINGBUF, MaxEntries: uint32(4 * page)}, Config{RingBuf: 1, WakeupBytes: 100}, nil},
		{RingBuf, 64 << 10, perfbuf.Options{RingBytes: 1}, Plan{RingBuf, page, 0}, "", MapSettings{}, Config{}, nil},
		{RingBuf, 64 << 10, perfbuf.Options{RingBytes: 1<<31 + 1}, Plan{}, "", MapSettings{}, Config{}, os.ErrInvalid},
		{RingBuf, 64 << 10, perfbuf.Options{WakeupBytes: 64 << 10}, Plan{}, "", MapSettings{}, Config{}, os.ErrInvalid},
		{RingBuf, 0, perfbuf.Options{}, Plan{}, "", MapSettings{}, Config{}, ErrNoSize},
		{RingBuf, 0, perfbuf.Options{RingBytes: page}, Plan{RingBuf, page, 0}, "", MapSettings{}, Config{}, nil},
		{PerfEventArray, 64 << 10, perfbuf.Options{RingBytes: 3 * page, WakeupBytes: 100}, Plan{Kind: PerfEventArray}, "perf_event_array",
			MapSettings{Type: unix.BPF_MAP_TYPE_PERF_EVENT_ARRAY, KeySize: 4, ValueSize: 4, MaxEntries: uint32(slices.Max(possible) + 1)}, Config{}, nil},
	} {
		p, err := NewPlan(c.kind, c.compiled, &c.opts)
		if p != c.plan || !errors.Is(err, c.err) || (err == nil) != (c.err == nil) {
			t.Errorf("NewPlan(%v, %d, %+v) = %+v, %v; want %+v, %v", c.kind, c.compiled, c.opts, p, err, c.plan, c.err)
			continue
		}
		if err != nil {
			continue
		}
		if c.str != "" && p.String() != c.str {
			t.Errorf("%+v: String %q, want %q", p, p, c.str)
		}
		if c.m != (MapSettings{}) {
			if m, err := p.Map(); m != c.m || err != nil {
				t.Errorf("%v: Map = %+v, %v; want %+v", p, m, err, c.m)
			}
			if cfg := p.Config(); cfg != c.cfg {
				t.Errorf("%v: Config %+v, want %+v", p, cfg, c.cfg)
			}
		}
		if p.Scratch() != (c.kind == PerfEventArray) {
			t.Errorf("%v: Scratch %v", p, p.Scratch())
		}
		opts := c.opts
		p.Finish(&opts)
		if want := map[bool]int{true: 0, false: c.opts.RingBytes}[c.kind == RingBuf]; opts.RingBytes != want || opts.WakeupBytes != c.opts.WakeupBytes {
			t.Errorf("%v: Finish left %+v, want RingBytes %d and WakeupBytes kept", p, opts, want)
		}
	}
	if s := (Plan{RingBuf, 8192, 1024}).String(); s != "ringbuf of 8192 bytes (wakeup at 1024)" {
		t.Errorf("String %q", s)
	}
}
