// SPDX-License-Identifier: Apache-2.0

package buflayout

import (
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"syscall"
	"testing"

	"github.com/perfbuf/perfbuf"
	"github.com/perfbuf/perfbuf/internal/cpus"
	"github.com/perfbuf/perfbuf/internal/kernel"
	"golang.org/x/sys/unix"
)

func TestCheck(t *testing.T) {
	for name, c := range map[string]struct {
		want Kind
		opts perfbuf.Options
		err  error
		set  Settings
	}{
		"any":                    {Any, perfbuf.Options{RingBytes: 1 << 20, WakeupBytes: 4096}, nil, Apply(nil)},
		"no such kind":           {Kind(7), perfbuf.Options{}, os.ErrInvalid, Apply(nil)},
		"WakeupEvents":           {PerfEventArray, perfbuf.Options{WakeupEvents: 2}, os.ErrInvalid, Apply(nil)},
		"negative RingBytes":     {RingBuf, perfbuf.Options{RingBytes: -1}, os.ErrInvalid, Apply(nil)},
		"negative WakeupBytes":   {RingBuf, perfbuf.Options{WakeupBytes: -1}, os.ErrInvalid, Apply(nil)},
		"perf's options checked": {PerfEventArray, perfbuf.Options{RingBytes: -1}, os.ErrInvalid, Apply(nil)},
		"ring per CPU":           {RingBufPerCPU, perfbuf.Options{RingBytes: 4096}, nil, Apply(nil)},
		"2 CPUs a ring":          {RingBufPerCPU, perfbuf.Options{}, nil, Settings{CPUsPerRing: 2}},
		"no CPU a ring":          {RingBufPerCPU, perfbuf.Options{}, os.ErrInvalid, Settings{CPUsPerRing: 0}},
		"CPUsPerRing, RingBuf":   {RingBuf, perfbuf.Options{}, os.ErrInvalid, Settings{CPUsPerRing: 2}},
		"CPUsPerRing, Any":       {Any, perfbuf.Options{}, os.ErrInvalid, Settings{CPUsPerRing: 2}},
	} {
		if err := Check(c.want, c.set, &c.opts); !errors.Is(err, c.err) || (err == nil) != (c.err == nil) {
			t.Errorf("%s: %v, want %v", name, err, c.err)
		}
	}
}

// The choice per kernel capability, by fake probes: Any is a ring per
// CPU where the kernel takes ring buffers in an array of maps, one ring
// buffer where it has ring buffers only, a perf event array where it has
// none; a probe that fails, at either step, fails Any naming CAP_BPF for a
// refusal. The array is probed for Any alone.
func TestChoose(t *testing.T) {
	yes := func() (bool, error) { return true, nil }
	no := func() (bool, error) { return false, nil }
	fails := func() (bool, error) { return false, syscall.EPERM }
	denied := func() (bool, error) { return false, syscall.EACCES }
	enomem := func() (bool, error) { return false, syscall.ENOMEM }
	never := func() (bool, error) { t.Error("probed for a forced kind"); return false, nil }
	for _, c := range []struct {
		want         Kind
		probe, array func() (bool, error)
		got          Kind
		err          error
	}{
		{Any, yes, yes, RingBufPerCPU, nil},
		{Any, yes, no, RingBuf, nil},
		{Any, no, never, PerfEventArray, nil},
		{Any, yes, fails, 0, syscall.EPERM},
		{Any, yes, denied, 0, syscall.EACCES},
		{Any, yes, enomem, 0, syscall.ENOMEM},
		{RingBuf, yes, never, RingBuf, nil},
		{RingBuf, no, never, 0, errors.ErrUnsupported},
		{PerfEventArray, never, never, PerfEventArray, nil},
		{Any, fails, never, 0, syscall.EPERM},
		{RingBufPerCPU, yes, never, RingBufPerCPU, nil},
		{RingBufPerCPU, no, never, 0, errors.ErrUnsupported},
		{RingBufPerCPU, fails, never, 0, syscall.EPERM},
		{Any, denied, never, 0, syscall.EACCES},
		{RingBuf, denied, never, 0, syscall.EACCES},
	} {
		got, err := Choose(c.want, c.probe, c.array)
		if got != c.got || !errors.Is(err, c.err) || (err == nil) != (c.err == nil) {
			t.Errorf("Choose(%v) = %v, %v; want %v, %v", c.want, got, err, c.got, c.err)
		}
		// A probe refused for want of privilege says which.
		if errors.Is(c.err, os.ErrPermission) && (!errors.Is(err, os.ErrPermission) || !strings.Contains(err.Error(), "CAP_BPF")) {
			t.Errorf("Choose(%v) = %v; want it naming CAP_BPF", c.want, err)
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
		{RingBuf, 64 << 10, perfbuf.Options{}, Plan{RingBuf, 64 << 10, 0, 0, false}, "ringbuf of 65536 bytes",
			MapSettings{Type: unix.BPF_MAP_TYPE_RINGBUF, MaxEntries: 64 << 10}, Config{RingBuf: 1}, nil},
		{RingBuf, 64 << 10, perfbuf.Options{RingBytes: 3 * page, WakeupBytes: 100}, Plan{RingBuf, 4 * page, 100, 0, false}, "",
			MapSettings{Type: unix.BPF_MAP_TYPE_RINGBUF, MaxEntries: uint32(4 * page)}, Config{RingBuf: 1, WakeupBytes: 100}, nil},
		{RingBuf, 64 << 10, perfbuf.Options{RingBytes: 1}, Plan{RingBuf, page, 0, 0, false}, "", MapSettings{}, Config{}, nil},
		{RingBuf, 64 << 10, perfbuf.Options{RingBytes: 1<<31 + 1}, Plan{}, "", MapSettings{}, Config{}, os.ErrInvalid},
		{RingBuf, 64 << 10, perfbuf.Options{WakeupBytes: 64 << 10}, Plan{}, "", MapSettings{}, Config{}, os.ErrInvalid},
		{RingBuf, 0, perfbuf.Options{}, Plan{}, "", MapSettings{}, Config{}, ErrNoSize},
		{RingBuf, 0, perfbuf.Options{RingBytes: page}, Plan{RingBuf, page, 0, 0, false}, "", MapSettings{}, Config{}, nil},
		// A compiled size below a page (4 KiB on a host of 16 KiB pages) is
		// rounded as libbpf rounds it: cilium/ebpf would have the kernel
		// refuse it.
		{RingBuf, uint32(page / 4), perfbuf.Options{}, Plan{RingBuf, page, 0, 0, false}, "", MapSettings{}, Config{}, nil},
		{RingBufPerCPU, uint32(3 * page), perfbuf.Options{}, Plan{RingBufPerCPU, 4 * page, 0, 1, false}, "", MapSettings{}, Config{}, nil},
		{PerfEventArray, 64 << 10, perfbuf.Options{RingBytes: 3 * page, WakeupBytes: 100}, Plan{Kind: PerfEventArray}, "perf_event_array",
			MapSettings{Type: unix.BPF_MAP_TYPE_PERF_EVENT_ARRAY, KeySize: 4, ValueSize: 4, MaxEntries: uint32(slices.Max(possible) + 1)}, Config{}, nil},
		{RingBufPerCPU, 64 << 10, perfbuf.Options{RingBytes: 3 * page, WakeupBytes: 100}, Plan{RingBufPerCPU, 4 * page, 100, 1, false},
			fmt.Sprintf("ringbuf_per_cpu of %d bytes a ring, 1 CPUs a ring (wakeup at 100)", 4*page),
			MapSettings{Type: unix.BPF_MAP_TYPE_ARRAY_OF_MAPS, KeySize: 4, ValueSize: 4, MaxEntries: uint32(slices.Max(possible) + 1),
				Inner: InnerMap{Type: unix.BPF_MAP_TYPE_RINGBUF, MaxEntries: uint32(4 * page)}}, Config{RingBuf: 2, WakeupBytes: 100}, nil},
		{RingBufPerCPU, 64 << 10, perfbuf.Options{}, Plan{RingBufPerCPU, 64 << 10, 0, 1, false}, "", MapSettings{}, Config{}, nil},
		{RingBufPerCPU, 0, perfbuf.Options{}, Plan{}, "", MapSettings{}, Config{}, ErrNoSize},
		{RingBufPerCPU, 64 << 10, perfbuf.Options{WakeupBytes: 64 << 10}, Plan{}, "", MapSettings{}, Config{}, os.ErrInvalid},
	} {
		p, err := NewPlan(c.kind, c.compiled, Apply(nil), &c.opts)
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
		p.Finish(&opts, "events", "call Prepare first")
		if want := map[bool]int{true: 0, false: c.opts.RingBytes}[c.kind != PerfEventArray]; opts.RingBytes != want || opts.WakeupBytes != c.opts.WakeupBytes {
			t.Errorf("%v: Finish left %+v, want RingBytes %d and WakeupBytes kept", p, opts, want)
		}
	}
	if s := (Plan{RingBuf, 8192, 1024, 0, false}).String(); s != "ringbuf of 8192 bytes (wakeup at 1024)" {
		t.Errorf("String %q", s)
	}
}

// A ring per CPU, or per 2: the array's slots, the CPUs' groups holding a
// possible CPU, gaps left empty; the whole config with max_sample kept.
func TestRingPerCPUPlan(t *testing.T) {
	for _, tc := range []struct {
		possible []int
		n        int
		want     []uint32
	}{
		{[]int{0, 1}, 1, []uint32{0, 1}},
		{[]int{0, 1}, 2, []uint32{0}},
		{[]int{0, 1, 2, 3, 4}, 2, []uint32{0, 1, 2}},
		{[]int{0, 1, 6, 7}, 2, []uint32{0, 3}},
		{[]int{0, 1, 2}, 8, []uint32{0}},
	} {
		if got := RingKeys(tc.possible, tc.n); !slices.Equal(got, tc.want) {
			t.Errorf("RingKeys(%v, %d) = %v, want %v", tc.possible, tc.n, got, tc.want)
		}
	}
	possible, err := cpus.Possible()
	if err != nil {
		t.Fatal(err)
	}
	p, err := NewPlan(RingBufPerCPU, 4096, Settings{CPUsPerRing: 2}, &perfbuf.Options{})
	if err != nil {
		t.Fatal(err)
	}
	slots, err := p.Slots()
	if want := RingKeys(possible, 2); err != nil || !slices.Equal(slots, want) {
		t.Errorf("Slots = %v, %v; want %v", slots, err, want)
	}
	if m, err := p.Map(); err != nil || m.MaxEntries != slots[len(slots)-1]+1 {
		t.Errorf("Map = %+v, %v; want %d slots", m, err, slots[len(slots)-1]+1)
	}
	if c := p.FullConfig(256); c != (FullConfig{Config{2, 0}, 256, 2}) {
		t.Errorf("FullConfig = %+v", c)
	}
	if c := (Plan{Kind: PerfEventArray}).FullConfig(256); c != (FullConfig{Config{0, 0}, 256, 1}) {
		t.Errorf("perf FullConfig = %+v", c)
	}
	if s, err := (Plan{Kind: RingBuf, Size: 4096}).Slots(); s != nil || err != nil {
		t.Errorf("a shared ring's Slots = %v, %v", s, err)
	}
}

// A ring's name is the buffer's and its slot, within 15 characters, the
// slot kept whole.
func TestRingName(t *testing.T) {
	for _, tc := range []struct {
		name string
		key  uint32
		want string
	}{
		{"events", 3, "events_3"},
		{"a_very_long_buffer", 3, "a_very_long_b_3"},
		{"a_very_long_buffer", 255, "a_very_long_255"},
		{"fifteen_chars_x", 3, "fifteen_chars_3"},
	} {
		if got := RingName(tc.name, tc.key); got != tc.want || len(got) > 15 {
			t.Errorf("RingName(%q, %d) = %q, want %q", tc.name, tc.key, got, tc.want)
		}
	}
}

// Overwrite mode: ring buffers only where the kernel makes them in it (a
// forced kind fails with the probe's error, naming 6.19; Any falls back
// to a perf event array, from a ring per CPU as from one ring buffer),
// the flag on the rings and never on a perf event array, and no
// watermark.
func TestOverwrite(t *testing.T) {
	yes := func() (bool, error) { return true, nil }
	no := func() (bool, error) { return false, nil }
	old := ProbeOverwrite
	defer func() { ProbeOverwrite = old }()
	set := Apply([]Option{Overwrite()})
	before := fmt.Errorf("needs kernel 6.19: %w", errors.ErrUnsupported)
	for _, c := range []struct {
		want  Kind
		array func() (bool, error) // the kernel takes ring buffers in an array of maps
		probe error
		got   Kind
		err   error
	}{
		{Any, yes, nil, RingBufPerCPU, nil},
		{Any, no, nil, RingBuf, nil},
		{RingBufPerCPU, yes, nil, RingBufPerCPU, nil},
		{PerfEventArray, yes, nil, PerfEventArray, nil},
		{Any, yes, before, PerfEventArray, nil},
		{Any, no, before, PerfEventArray, nil},
		{RingBuf, yes, before, 0, errors.ErrUnsupported},
		{RingBufPerCPU, yes, before, 0, errors.ErrUnsupported},
		{Any, yes, syscall.EPERM, 0, syscall.EPERM},
	} {
		ProbeOverwrite = func() error { return c.probe }
		got, err := ChooseFor(c.want, set, yes, c.array)
		if got != c.got || !errors.Is(err, c.err) || (err == nil) != (c.err == nil) {
			t.Errorf("ChooseFor(%v) with probe %v = %v, %v; want %v, %v", c.want, c.probe, got, err, c.got, c.err)
		}
		if c.err == errors.ErrUnsupported && !strings.Contains(err.Error(), "6.19") {
			t.Errorf("ChooseFor(%v): %v does not name 6.19", c.want, err)
		}
	}
	ProbeOverwrite = func() error { t.Error("probed without Overwrite"); return nil }
	if got, err := ChooseFor(RingBuf, Apply(nil), yes, yes); got != RingBuf || err != nil {
		t.Errorf("ChooseFor(RingBuf) = %v, %v", got, err)
	}
	if got, err := ChooseFor(Any, Apply(nil), yes, yes); got != RingBufPerCPU || err != nil {
		t.Errorf("ChooseFor(Any) = %v, %v", got, err)
	}
	var declared Settings
	declared.Declared(kernel.MapFlagRBOverwrite | unix.BPF_F_NUMA_NODE)
	if !declared.Overwrite {
		t.Error("a map declared in overwrite mode is not made in it")
	}
	opts := perfbuf.Options{RingBytes: 8192}
	p, err := NewPlan(RingBufPerCPU, 0, set, &opts)
	if err != nil || !p.Overwrite || !strings.HasSuffix(p.String(), " in overwrite mode") {
		t.Fatalf("NewPlan = %v, %v", p, err)
	}
	if f := p.MapFlags(unix.BPF_F_NUMA_NODE); f != kernel.MapFlagRBOverwrite|unix.BPF_F_NUMA_NODE {
		t.Errorf("ring flags %#x", f)
	}
	perf, _ := NewPlan(PerfEventArray, 0, set, &opts)
	if f := perf.MapFlags(kernel.MapFlagRBOverwrite); f != 0 {
		t.Errorf("perf event array flags %#x", f)
	}
	if err := Check(Any, set, &perfbuf.Options{WakeupBytes: 64}); !errors.Is(err, os.ErrInvalid) {
		t.Errorf("WakeupBytes in overwrite mode: %v", err)
	}
}
