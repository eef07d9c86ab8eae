// SPDX-License-Identifier: Apache-2.0

// Package buflayout is what a PERFBUF_BUFFER (bpf/perfbuf.bpf.h) becomes at
// load, whichever loader loads it: the kinds of buffer, the checks of the
// ring settings, the choice of a kind, and each kind's map settings and
// BPF-side config. It is the contract between perfbuf's readers and the
// loaders, which are modules of their own: bpfbuffer applies a Plan to a
// libbpfgo module, bpfbuffer/ciliumbuffer to a cilium/ebpf
// CollectionSpec, and a loader for another library would do the same.
// Neither decides anything of its own, so that both make the same object
// from the same Options, and a Plan's Finish tells the reader opened with
// those Options which map to expect.
//
// It is part of the module github.com/perfbuf/perfbuf and versioned with
// it: a loader's go.mod requires the root at the version whose buflayout
// it was built against, and the promise of docs/release.md holds for it
// as for package perfbuf. Programs that only load a buffer use their
// loader's Prepare, not this package.
//
// A layout is a Kind with its Plan: a new layout is a Kind here, its case
// in Check, NewPlan and Plan's methods, and one apply function in each
// loader's package.
package buflayout

import (
	"errors"
	"fmt"
	"os"
	"slices"

	"github.com/perfbuf/perfbuf"
	"github.com/perfbuf/perfbuf/internal/cpus"
	"github.com/perfbuf/perfbuf/internal/kernel"
	"github.com/perfbuf/perfbuf/internal/prepared"
	"golang.org/x/sys/unix"
)

// Kind is what a buffer is made at load.
type Kind int

const (
	// Any asks for the best layout the kernel and the object allow
	// (Choose): a ring buffer per CPU, else one ring buffer, else a perf
	// event array. Prepare returns it only with an error.
	Any Kind = iota
	// RingBuf is a BPF_MAP_TYPE_RINGBUF: one ring that every CPU writes.
	RingBuf
	// PerfEventArray is a BPF_MAP_TYPE_PERF_EVENT_ARRAY: a ring per CPU.
	PerfEventArray
	// RingBufPerCPU is a BPF_MAP_TYPE_ARRAY_OF_MAPS of
	// BPF_MAP_TYPE_RINGBUF: a ring buffer per CPU, or per CPUsPerRing
	// CPUs, in the slot of its CPUs (CPU c writes slot c/CPUsPerRing).
	// Any chooses it, a ring per CPU, where the kernel takes ring buffers
	// in an array of maps.
	RingBufPerCPU
)

// String returns "any", "ringbuf", "perf_event_array" or
// "ringbuf_per_cpu".
func (k Kind) String() string {
	switch k {
	case Any:
		return "any"
	case RingBuf:
		return "ringbuf"
	case PerfEventArray:
		return "perf_event_array"
	case RingBufPerCPU:
		return "ringbuf_per_cpu"
	}
	return fmt.Sprintf("Kind(%d)", int(k))
}

// Config is the part of struct perfbuf_buffer_config (bpf/perfbuf.bpf.h)
// that Prepare writes for a ring buffer or a perf event array: its first
// two fields, in this order. The third, max_sample, is the BPF program's
// own and is left as compiled; an object built with a perfbuf.bpf.h older
// than the array of ring buffers has no fourth.
type Config struct {
	RingBuf     uint64 // the layout: a PERFBUF_LAYOUT_* (layoutPerfArray, ...)
	WakeupBytes uint64
}

// FullConfig is struct perfbuf_buffer_config whole, as perfbuf.bpf.h has
// declared it since the array of ring buffers: what Prepare writes for
// RingBufPerCPU, whose CPUsPerRing the older, shorter struct
// (OldConfigSize bytes) has no room for.
type FullConfig struct {
	Config
	MaxSample   uint64 // the program's, kept as compiled
	CPUsPerRing uint64
}

// OldConfigSize is the size of struct perfbuf_buffer_config in objects
// built with a perfbuf.bpf.h older than the array of ring buffers: three
// __u64, no cpus_per_ring.
const OldConfigSize = 24

// The layouts of perfbuf_buffer_config.ringbuf (PERFBUF_LAYOUT_*).
const (
	layoutPerfArray    = 0
	layoutRingBuf      = 1
	layoutRingBufArray = 2
)

// Option is a setting of Prepare beyond perfbuf.Options, for either
// loader.
type Option func(*Settings)

// Settings are the Options of one Prepare call.
type Settings struct {
	CPUsPerRing int
	Overwrite   bool
}

// CPUsPerRing makes each ring of RingBufPerCPU the ring of n CPUs: CPU c
// writes ring c/n. The default is 1, a ring per CPU.
func CPUsPerRing(n int) Option {
	return func(s *Settings) { s.CPUsPerRing = n }
}

// Overwrite makes ring buffers in overwrite mode (map flag
// BPF_F_RB_OVERWRITE, kernel 6.19), for a perfbuf.Recorder: the ring
// buffer, or each ring of RingBufPerCPU. A perf event array needs nothing
// at load (the Recorder opens backward rings); Any chooses ring buffers
// (a ring per CPU, else one) only where the kernel has overwrite mode,
// else a perf event array.
func Overwrite() Option {
	return func(s *Settings) { s.Overwrite = true }
}

// Declared notes the map flags the buffer was declared with: a buffer
// declared in overwrite mode is made as if Overwrite were given.
func (s *Settings) Declared(flags uint32) {
	if flags&kernel.MapFlagRBOverwrite != 0 {
		s.Overwrite = true
	}
}

// Apply returns the Settings of more, defaults first.
func Apply(more []Option) Settings {
	s := Settings{CPUsPerRing: 1}
	for _, o := range more {
		o(&s)
	}
	return s
}

// Check refuses what Prepare cannot do the same way for every kind, before
// anything is looked up: want that is no Kind, CPUsPerRing below 1 or
// with another kind than RingBufPerCPU, WakeupEvents (no ring buffer
// equivalent), a negative RingBytes or WakeupBytes. Errors match
// os.ErrInvalid; the caller adds which buffer.
func Check(want Kind, set Settings, opts *perfbuf.Options) error {
	switch {
	case want != Any && want != RingBuf && want != PerfEventArray && want != RingBufPerCPU:
		return fmt.Errorf("%v: %w", want, os.ErrInvalid)
	case set.CPUsPerRing < 1:
		return fmt.Errorf("CPUsPerRing %d below 1: %w", set.CPUsPerRing, os.ErrInvalid)
	case set.CPUsPerRing != 1 && want != RingBufPerCPU:
		return fmt.Errorf("CPUsPerRing with %v, not %v: %w", want, RingBufPerCPU, os.ErrInvalid)
	case opts.WakeupEvents != 0:
		return fmt.Errorf("WakeupEvents has no ring buffer equivalent; use WakeupBytes: %w", os.ErrInvalid)
	case opts.RingBytes < 0 || opts.WakeupBytes < 0:
		return fmt.Errorf("negative RingBytes (%d) or WakeupBytes (%d): %w", opts.RingBytes, opts.WakeupBytes, os.ErrInvalid)
	case set.Overwrite && opts.WakeupBytes != 0:
		return fmt.Errorf("WakeupBytes %d in overwrite mode, which wakes no reader: %w", opts.WakeupBytes, os.ErrInvalid)
	}
	return nil
}

// Choose returns the kind a buffer becomes for want: a forced kind as it
// is, and Any as the best layout the kernel allows, by the loader's
// probes: RingBufPerCPU (a ring per CPU) where hasRingBuf says the kernel
// creates ring buffers and hasRingArray that it takes one in an array of
// maps (5.10), RingBuf where it has ring buffers only, else
// PerfEventArray. A ring per CPU first: no CPU takes another's ring lock,
// a full ring refuses only its own CPU's records, and an ordered Reader
// releases a key as soon as every ring has shown one at least as large
// (perfbuf.Order's rule 1), as over a perf event array.
//
// RingBuf or RingBufPerCPU on a kernel without ring buffers is
// errors.ErrUnsupported. A probe that fails returns its error, which for
// a probe refused for want of privilege (EPERM, EACCES) names CAP_BPF
// (NameCapBPF): Any fails with it rather than choose another kind, as the
// kernel's answer is unknown. hasRingArray is asked only for Any; a forced
// RingBufPerCPU learns whether the kernel takes ring buffers in an array
// of maps when the array is made.
func Choose(want Kind, hasRingBuf, hasRingArray func() (bool, error)) (Kind, error) {
	if want == PerfEventArray {
		return want, nil
	}
	has, err := hasRingBuf()
	switch {
	case err != nil:
		return 0, fmt.Errorf("probe ring buffers: %w", NameCapBPF(err))
	case !has && want != Any:
		return 0, fmt.Errorf("the kernel has no ring buffers: %w", errors.ErrUnsupported)
	case !has:
		return PerfEventArray, nil
	case want != Any:
		return want, nil
	}
	array, err := hasRingArray()
	switch {
	case err != nil:
		return 0, fmt.Errorf("probe ring buffers in an array of maps: %w", NameCapBPF(err))
	case array:
		return RingBufPerCPU, nil
	}
	return RingBuf, nil
}

// ChooseFor is Choose for set: in overwrite mode, ring buffers count only
// where the kernel makes them in that mode (ProbeOverwrite): Any chooses a
// perf event array elsewhere, and RingBuf or RingBufPerCPU fails with the
// probe's error (errors.ErrUnsupported, naming 6.19).
func ChooseFor(want Kind, set Settings, hasRingBuf, hasRingArray func() (bool, error)) (Kind, error) {
	kind, err := Choose(want, hasRingBuf, hasRingArray)
	if err != nil || !set.Overwrite || kind == PerfEventArray {
		return kind, err
	}
	if err := ProbeOverwrite(); err != nil {
		if want == Any && errors.Is(err, errors.ErrUnsupported) {
			return PerfEventArray, nil
		}
		return 0, fmt.Errorf("%v in overwrite mode: %w", kind, NameCapBPF(err))
	}
	return kind, nil
}

// NameCapBPF returns err, from creating a BPF map, saying what it lacks
// when the kernel refused it for want of privilege (EPERM or EACCES, which
// match os.ErrPermission): a probe that says no more about the kernel.
// Other errors come back as they are; the errno stays wrapped.
func NameCapBPF(err error) error {
	if !errors.Is(err, os.ErrPermission) {
		return err
	}
	return fmt.Errorf("not permitted to create BPF maps, which needs CAP_BPF (CAP_SYS_ADMIN before 5.8; a reader of perf event arrays needs CAP_PERFMON too): run as root or grant them: %w", err)
}

// ProbeOverwrite is kernel.ProbeRingOverwrite; tests replace it.
var ProbeOverwrite = kernel.ProbeRingOverwrite

// Plan is the object a buffer becomes: the kind, for ring buffers each
// ring's size and the BPF side's watermark, and for RingBufPerCPU the
// CPUs a ring. A perf event array's ring settings are the reader's
// (Options, at New), not the object's. Two Plans are the same object when
// they are equal.
type Plan struct {
	Kind        Kind
	Size        int  // ring buffers: each ring's bytes (its max_entries)
	Wakeup      int  // ring buffers: the BPF side's watermark (config.wakeup_bytes)
	CPUsPerRing int  // RingBufPerCPU: CPU c writes slot c/CPUsPerRing
	Overwrite   bool // ring buffers: in overwrite mode (BPF_F_RB_OVERWRITE)
}

// ErrNoSize is NewPlan's error for a ring whose size is to be the one
// compiled (RingBytes zero) when the loader no longer knows it (compiled
// zero).
var ErrNoSize = errors.New("compiled ring size unknown")

// NewPlan returns the plan of a buffer of kind (RingBuf, PerfEventArray
// or RingBufPerCPU) made with set and opts, which Check accepted. compiled
// is the ring buffer's size as the object declares it (its max_entries),
// used when RingBytes is zero, rounded likewise; zero if the loader no
// longer knows it.
//
// A ring buffer, and each ring of RingBufPerCPU, gets RingBytes rounded up
// to a power of two pages, as perfbuf rounds a perf event array's rings,
// at most 2 GiB; WakeupBytes must be below its size. RingBytes is each
// ring's size, not a total, whether RingBufPerCPU was asked for or Any
// chose it: the size a perf event array gives each CPU's ring, so that
// Any takes RingBytes a CPU on every kernel, and a ring no smaller on a
// host of many CPUs. Errors match os.ErrInvalid, or ErrNoSize.
func NewPlan(kind Kind, compiled uint32, set Settings, opts *perfbuf.Options) (Plan, error) {
	if kind != RingBuf && kind != RingBufPerCPU {
		return Plan{Kind: kind}, nil
	}
	// The compiled size is rounded as RingBytes is, as libbpf rounds a
	// ring buffer's (adjust_ringbuf_sz): a buffer declared with 4 KiB is
	// a page on a host of 16 KiB pages, whichever loader loads it.
	size := ringSize(int(compiled))
	if opts.RingBytes == 0 && compiled == 0 {
		return Plan{}, ErrNoSize
	}
	if opts.RingBytes > maxRingBytes {
		return Plan{}, fmt.Errorf("ring bytes %d above %d: %w", opts.RingBytes, maxRingBytes, os.ErrInvalid)
	} else if opts.RingBytes != 0 {
		size = ringSize(opts.RingBytes)
	}
	if opts.WakeupBytes >= size {
		return Plan{}, fmt.Errorf("wakeup bytes %d not below the %d-byte ring: %w", opts.WakeupBytes, size, os.ErrInvalid)
	}
	p := Plan{Kind: kind, Size: size, Wakeup: opts.WakeupBytes, Overwrite: set.Overwrite}
	if kind == RingBufPerCPU {
		p.CPUsPerRing = set.CPUsPerRing
	}
	return p, nil
}

// String says what p makes: "perf_event_array", "ringbuf of 8192 bytes
// (wakeup at 1024)", "ringbuf_per_cpu of 8192 bytes a ring, 2 CPUs a
// ring".
func (p Plan) String() string {
	var s string
	switch p.Kind {
	case RingBuf:
		s = fmt.Sprintf("%v of %d bytes", p.Kind, p.Size)
	case RingBufPerCPU:
		s = fmt.Sprintf("%v of %d bytes a ring, %d CPUs a ring", p.Kind, p.Size, p.CPUsPerRing)
	default:
		return p.Kind.String()
	}
	if p.Wakeup != 0 {
		s += fmt.Sprintf(" (wakeup at %d)", p.Wakeup)
	}
	if p.Overwrite {
		s += " in overwrite mode"
	}
	return s
}

// MapFlags returns the flags of the buffer's ring buffers (the map's, or
// each ring's of RingBufPerCPU) from those it was declared with: with
// BPF_F_RB_OVERWRITE in overwrite mode; a perf event array's without it.
func (p Plan) MapFlags(declared uint32) uint32 {
	if p.Overwrite && (p.Kind == RingBuf || p.Kind == RingBufPerCPU) {
		return declared | kernel.MapFlagRBOverwrite
	}
	return declared &^ kernel.MapFlagRBOverwrite
}

// MapSettings is the buffer map's type and sizes, in the kernel's terms
// (a BPF_MAP_TYPE_*), which each loader sets as its own.
type MapSettings struct {
	Type       uint32
	KeySize    uint32
	ValueSize  uint32
	MaxEntries uint32
	// Inner is an array of maps' inner map: the template the kernel
	// checks each slot's map against and the verifier types a lookup
	// by. Zero for the other kinds.
	Inner InnerMap
}

// InnerMap is the inner map of an array of maps: a ring buffer of
// MaxEntries bytes, with no keys or values. Its flags are the buffer's
// as PERFBUF_BUFFER declared them.
type InnerMap struct {
	Type       uint32
	MaxEntries uint32
}

// Map returns the buffer map's settings for p. A ring buffer has no keys
// or values and max_entries of its size; a perf event array 4-byte keys
// and values (a CPU number, a perf event's descriptor) and an entry for
// each possible CPU, the highest one's included (the map is indexed by
// CPU number); an array of ring buffers 4-byte keys and values (a slot, a
// map) and a slot for each group of CPUsPerRing CPUs up to the highest
// possible CPU's, its inner map a ring buffer of Size bytes.
func (p Plan) Map() (MapSettings, error) {
	if p.Kind == RingBuf {
		return MapSettings{Type: unix.BPF_MAP_TYPE_RINGBUF, MaxEntries: uint32(p.Size)}, nil
	}
	possible, err := cpus.Possible()
	if err != nil {
		return MapSettings{}, err
	}
	if p.Kind == RingBufPerCPU {
		keys := RingKeys(possible, p.CPUsPerRing)
		return MapSettings{Type: unix.BPF_MAP_TYPE_ARRAY_OF_MAPS, KeySize: 4, ValueSize: 4, MaxEntries: keys[len(keys)-1] + 1,
			Inner: InnerMap{Type: unix.BPF_MAP_TYPE_RINGBUF, MaxEntries: uint32(p.Size)}}, nil
	}
	return MapSettings{Type: unix.BPF_MAP_TYPE_PERF_EVENT_ARRAY, KeySize: 4, ValueSize: 4, MaxEntries: uint32(slices.Max(possible) + 1)}, nil
}

// Slots returns the slots of p's rings (RingBufPerCPU): one for each
// group of CPUsPerRing CPUs that holds a possible CPU, in order; none for
// the other kinds. A ring for every possible CPU, online or not, so that a
// CPU that comes online later has its ring already.
func (p Plan) Slots() ([]uint32, error) {
	if p.Kind != RingBufPerCPU {
		return nil, nil
	}
	possible, err := cpus.Possible()
	if err != nil {
		return nil, err
	}
	return RingKeys(possible, p.CPUsPerRing), nil
}

// RingKeys returns the slots of the rings for the possible CPUs, n CPUs a
// ring (CPU c writes slot c/n), in order: gaps in the possible CPUs leave
// their slots empty.
func RingKeys(possible []int, n int) []uint32 {
	var keys []uint32
	for _, c := range possible {
		if k := uint32(c / n); !slices.Contains(keys, k) {
			keys = append(keys, k)
		}
	}
	return keys
}

// RingName names the ring of slot key of the buffer name: "events_3",
// within the kernel's 15 characters (the slot kept whole).
func RingName(name string, key uint32) string {
	suffix := fmt.Sprintf("_%d", key)
	return name[:min(len(name), unix.BPF_OBJ_NAME_LEN-1-len(suffix))] + suffix
}

// Scratch reports whether p uses <map>_scratch, where
// perfbuf_buffer_reserve builds a record on the perf path.
func (p Plan) Scratch() bool { return p.Kind == PerfEventArray }

// Config returns the BPF side's config for p: its first two fields.
func (p Plan) Config() Config {
	switch p.Kind {
	case RingBuf:
		return Config{RingBuf: layoutRingBuf, WakeupBytes: uint64(p.Wakeup)}
	case RingBufPerCPU:
		return Config{RingBuf: layoutRingBufArray, WakeupBytes: uint64(p.Wakeup)}
	}
	return Config{RingBuf: layoutPerfArray}
}

// FullConfig returns the BPF side's config for p whole, maxSample kept as
// the program compiled it; CPUsPerRing is 1 but for RingBufPerCPU, as
// PERFBUF_BUFFER declares it.
func (p Plan) FullConfig(maxSample uint64) FullConfig {
	c := FullConfig{Config: p.Config(), MaxSample: maxSample, CPUsPerRing: 1}
	if p.Kind == RingBufPerCPU {
		c.CPUsPerRing = uint64(p.CPUsPerRing)
	}
	return c
}

// Finish leaves opts ready for perfbuf.NewReader or perfbuf.New over the
// loaded map of the buffer name: a ring buffer's size is settled at load,
// so it clears RingBytes for ring buffers; the rest stays. It notes in
// opts the map p makes, which the reader checks the map it is given
// against, and fix, what to do about a map that is not it (one loaded
// before Prepare).
func (p Plan) Finish(opts *perfbuf.Options, name, fix string) {
	if p.Kind == RingBuf || p.Kind == RingBufPerCPU {
		opts.RingBytes = 0
	}
	b := &prepared.Buffer{Name: name, Plan: p.String(), Size: uint32(p.Size), Overwrite: p.Overwrite, Fix: fix}
	// Map and Slots failed no earlier, when the loader applied p.
	if m, err := p.Map(); err == nil {
		b.Type = m.Type
	}
	slots, _ := p.Slots()
	for _, k := range slots {
		b.Rings = append(b.Rings, RingName(name, k))
	}
	prepared.Set(opts, b)
}

// maxRingBytes is the largest ring a plan makes: max_entries is a __u32,
// and a ring's size a power of two.
const maxRingBytes = 1 << 31

// ringSize rounds n up to a power of two pages, as perfbuf rounds
// Options.RingBytes for a perf event array's rings.
func ringSize(n int) int {
	size := os.Getpagesize()
	for size < n {
		size <<= 1
	}
	return size
}
