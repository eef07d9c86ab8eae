// SPDX-License-Identifier: Apache-2.0

// Package buflayout is what a PERFBUF_BUFFER (bpf/perfbuf.bpf.h) becomes at
// load, whichever loader loads it: the kinds of buffer, the checks of the
// ring settings, the choice of a kind, and each kind's map settings and
// BPF-side config. bpfbuffer applies a Plan to a libbpfgo module,
// bpfbuffer/ciliumbuffer to a cilium/ebpf CollectionSpec; neither decides
// anything of its own, so that both make the same object from the same
// Options.
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
	"golang.org/x/sys/unix"
)

// Kind is what a buffer is made at load.
type Kind int

const (
	// Any asks for a ring buffer if the kernel has them (5.8 and later),
	// else a perf event array. Prepare returns it only with an error.
	Any Kind = iota
	// RingBuf is a BPF_MAP_TYPE_RINGBUF: one ring that every CPU writes.
	RingBuf
	// PerfEventArray is a BPF_MAP_TYPE_PERF_EVENT_ARRAY: a ring per CPU.
	PerfEventArray
)

// String returns "any", "ringbuf" or "perf_event_array".
func (k Kind) String() string {
	switch k {
	case Any:
		return "any"
	case RingBuf:
		return "ringbuf"
	case PerfEventArray:
		return "perf_event_array"
	}
	return fmt.Sprintf("Kind(%d)", int(k))
}

// Config is the part of struct perfbuf_buffer_config (bpf/perfbuf.bpf.h)
// that Prepare writes: its first two fields, in this order. The third,
// max_sample, is the BPF program's own and is left as compiled.
type Config struct {
	RingBuf     uint64
	WakeupBytes uint64
}

// Check refuses what Prepare cannot do the same way for every kind, before
// anything is looked up: want that is no Kind, WakeupEvents (no ring
// buffer equivalent), a negative RingBytes or WakeupBytes. Errors match
// os.ErrInvalid; the caller adds which buffer.
func Check(want Kind, opts *perfbuf.Options) error {
	switch {
	case want != Any && want != RingBuf && want != PerfEventArray:
		return fmt.Errorf("%v: %w", want, os.ErrInvalid)
	case opts.WakeupEvents != 0:
		return fmt.Errorf("WakeupEvents has no ring buffer equivalent; use WakeupBytes: %w", os.ErrInvalid)
	case opts.RingBytes < 0 || opts.WakeupBytes < 0:
		return fmt.Errorf("negative RingBytes (%d) or WakeupBytes (%d): %w", opts.RingBytes, opts.WakeupBytes, os.ErrInvalid)
	}
	return nil
}

// Choose returns the kind a buffer becomes for want: a forced kind as it
// is, Any as RingBuf where hasRingBuf (the loader's probe) says the kernel
// creates ring buffers, else PerfEventArray. RingBuf on a kernel without
// them is errors.ErrUnsupported; a probe that fails, its error.
func Choose(want Kind, hasRingBuf func() (bool, error)) (Kind, error) {
	if want != Any && want != RingBuf {
		return want, nil
	}
	has, err := hasRingBuf()
	switch {
	case err != nil:
		return 0, fmt.Errorf("probe ring buffers: %w", err)
	case has:
		return RingBuf, nil
	case want == RingBuf:
		return 0, fmt.Errorf("the kernel has no ring buffers: %w", errors.ErrUnsupported)
	}
	return PerfEventArray, nil
}

// Plan is the object a buffer becomes: the kind, and for a ring buffer its
// size and the BPF side's watermark. A perf event array's ring settings
// are the reader's (Options, at New), not the object's. Two Plans are the
// same object when they are equal.
type Plan struct {
	Kind   Kind
	Size   int // ring buffer: the ring's bytes (max_entries)
	Wakeup int // ring buffer: the BPF side's watermark (config.wakeup_bytes)
}

// ErrNoSize is NewPlan's error for a ring whose size is to be the one
// compiled (RingBytes zero) when the loader no longer knows it (compiled
// zero).
var ErrNoSize = errors.New("compiled ring size unknown")

// NewPlan returns the plan of a buffer of kind (RingBuf or PerfEventArray)
// made with opts, which Check accepted. compiled is the ring buffer's size
// as the object declares it (its max_entries), used when RingBytes is
// zero; zero if the loader no longer knows it.
//
// A ring buffer gets RingBytes rounded up to a power of two pages, as
// perfbuf rounds a perf event array's rings, at most 2 GiB; WakeupBytes
// must be below its size. Errors match os.ErrInvalid, or ErrNoSize.
func NewPlan(kind Kind, compiled uint32, opts *perfbuf.Options) (Plan, error) {
	if kind != RingBuf {
		return Plan{Kind: kind}, nil
	}
	size := int(compiled)
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
	return Plan{Kind: kind, Size: size, Wakeup: opts.WakeupBytes}, nil
}

// String says what p makes: "perf_event_array", "ringbuf of 8192 bytes
// (wakeup at 1024)".
func (p Plan) String() string {
	if p.Kind != RingBuf {
		return p.Kind.String()
	}
	if p.Wakeup == 0 {
		return fmt.Sprintf("%v of %d bytes", p.Kind, p.Size)
	}
	return fmt.Sprintf("%v of %d bytes (wakeup at %d)", p.Kind, p.Size, p.Wakeup)
}

// MapSettings is the buffer map's type and sizes, in the kernel's terms
// (a BPF_MAP_TYPE_*), which each loader sets as its own.
type MapSettings struct {
	Type       uint32
	KeySize    uint32
	ValueSize  uint32
	MaxEntries uint32
}

// Map returns the buffer map's settings for p. A ring buffer has no keys
// or values and max_entries of its size; a perf event array 4-byte keys
// and values (a CPU number, a perf event's descriptor) and an entry for
// each possible CPU, the highest one's included (the map is indexed by
// CPU number).
func (p Plan) Map() (MapSettings, error) {
	if p.Kind == RingBuf {
		return MapSettings{Type: unix.BPF_MAP_TYPE_RINGBUF, MaxEntries: uint32(p.Size)}, nil
	}
	possible, err := cpus.Possible()
	if err != nil {
		return MapSettings{}, err
	}
	return MapSettings{Type: unix.BPF_MAP_TYPE_PERF_EVENT_ARRAY, KeySize: 4, ValueSize: 4, MaxEntries: uint32(slices.Max(possible) + 1)}, nil
}

// Scratch reports whether p uses <map>_scratch, where
// perfbuf_buffer_reserve builds a record on the perf path.
func (p Plan) Scratch() bool { return p.Kind != RingBuf }

// Config returns the BPF side's config for p.
func (p Plan) Config() Config {
	if p.Kind == RingBuf {
		return Config{RingBuf: 1, WakeupBytes: uint64(p.Wakeup)}
	}
	return Config{}
}

// Finish leaves opts ready for perfbuf.NewReader or perfbuf.New over the
// loaded map: a ring buffer's size is settled at load (and New refuses
// RingBytes for one), so it clears RingBytes; the rest stays.
func (p Plan) Finish(opts *perfbuf.Options) {
	if p.Kind == RingBuf {
		opts.RingBytes = 0
	}
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
