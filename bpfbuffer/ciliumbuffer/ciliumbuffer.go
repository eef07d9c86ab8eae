// SPDX-License-Identifier: Apache-2.0

// Package ciliumbuffer is package bpfbuffer for cilium/ebpf's loader: it
// makes a BPF program's PERFBUF_BUFFER (bpf/perfbuf.bpf.h) a ring buffer
// or a perf event array in a *ebpf.CollectionSpec, before the collection
// is created, whichever the kernel has; and it passes a *ebpf.Map to
// perfbuf as it is (Map). It needs no cgo: it builds with CGO_ENABLED=0,
// as perfbuf's readers do.
//
// The decision is bpfbuffer.Prepare's, made by the same code
// (internal/buflayout): the same Options give the same object, whichever
// loader loads it.
//
//	spec, _ := ebpf.LoadCollectionSpec("prog.bpf.o")
//	opts := perfbuf.Options{RingBytes: 256 << 10}
//	kind, err := ciliumbuffer.Prepare(spec, "events", ciliumbuffer.Any, &opts)
//	...
//	coll, err := ebpf.NewCollection(spec)
//	opts.FailureMap = ciliumbuffer.Map(coll.Maps["events_failures"])
//	r, err := perfbuf.NewReader(ciliumbuffer.Map(coll.Maps["events"]), opts)
//
// docs/bpfbuffer.md says more.
package ciliumbuffer

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/features"
	"github.com/perfbuf/perfbuf"
	"github.com/perfbuf/perfbuf/internal/buflayout"
)

// Kind is what a buffer is made at load: Any, RingBuf or PerfEventArray.
// It is bpfbuffer.Kind: the same values in both packages.
type Kind = buflayout.Kind

const (
	// Any asks Prepare for a ring buffer if the kernel has them (5.8 and
	// later), else a perf event array. Prepare returns it only with an
	// error.
	Any = buflayout.Any
	// RingBuf is a BPF_MAP_TYPE_RINGBUF: one ring that every CPU writes.
	RingBuf = buflayout.RingBuf
	// PerfEventArray is a BPF_MAP_TYPE_PERF_EVENT_ARRAY: a ring per CPU.
	PerfEventArray = buflayout.PerfEventArray
)

// ErrPrepared is Prepare's error, wrapped, for a buffer prepared as a perf
// event array already and asked for a ring buffer of the size it was
// compiled with, which the spec no longer holds. Give Options.RingBytes, or prepare
// a copy of the spec as it was loaded (CollectionSpec.Copy before the
// first Prepare).
var ErrPrepared = errors.New("buffer prepared already")

// fullConfig mirrors struct perfbuf_buffer_config: what Prepare writes
// (buflayout.Config), then max_sample, the program's.
type fullConfig struct {
	buflayout.Config
	MaxSample uint64
}

// Prepare makes the PERFBUF_BUFFER mapName of spec the kind want: Any
// chooses a ring buffer when the kernel has them
// (features.HaveMapType(ebpf.RingBuf)), else a perf event array; RingBuf
// or PerfEventArray forces that kind. It returns the kind chosen. Call it
// before ebpf.NewCollection (or LoadAndAssign) with spec.
//
// It changes only spec: the map mapName, the map <mapName>_scratch and the
// variable <mapName>_config. Called again, it sets them anew from its
// arguments, whatever it made before: the same want and Options give the
// same spec (but for ErrPrepared, below). A spec is not loaded itself, so
// there is no bpfbuffer.ErrLoaded: each ebpf.NewCollection loads a copy.
// To keep the object prepared two ways, prepare a copy of the spec as
// loaded for each (CollectionSpec.Copy).
//
// It reads two of opts' ring settings, as bpfbuffer.Prepare does, and
// leaves opts ready for perfbuf.NewReader or perfbuf.New over the
// collection's map:
//
//   - RingBytes sizes a ring, rounded up to a power of two pages: the ring
//     buffer's one ring (its MaxEntries; zero keeps the spec's size, as
//     PERFBUF_BUFFER declared it), or each CPU's ring of a perf event
//     array (left in opts for NewReader).
//   - WakeupBytes wakes the reader once this much data is unread: a perf
//     event's wakeup_watermark (left in opts), or for a ring buffer the BPF
//     side's watermark (<mapName>_config.wakeup_bytes), at and above which
//     it commits each record with BPF_RB_FORCE_WAKEUP; left in opts for
//     the Reader's hold-off (Options.WakeupBytes).
//
// For a ring buffer it clears RingBytes in opts (the size is settled at
// load). WakeupEvents has no ring buffer equivalent and must be zero. A nil
// opts is the zero Options.
//
// A perf event array gets 4-byte keys and values and an entry for each
// possible CPU, and <mapName>_scratch, where perfbuf_buffer_reserve
// builds a record, keeps the program's max_sample bytes per CPU. A ring
// buffer's program never reaches <mapName>_scratch (the verifier drops
// the perf path), but cilium/ebpf creates every map a program names: its
// value shrinks to one byte (eight a CPU, as the kernel rounds it).
//
// Errors (with Any as the kind): os.ErrInvalid for a nil spec, a want
// that is no Kind, WakeupEvents set, a negative RingBytes or WakeupBytes,
// a ring buffer's RingBytes above 2 GiB, a WakeupBytes not below the ring
// buffer's size, or a map or variable of that name that PERFBUF_BUFFER
// did not declare; os.ErrNotExist when the spec has no such map or variable;
// errors.ErrUnsupported for RingBuf on a kernel without ring buffers;
// ErrPrepared for a ring buffer of the compiled size after a perf event
// array; a probe's error (features.HaveMapType). spec is left as it was
// after an error.
func Prepare(spec *ebpf.CollectionSpec, mapName string, want Kind, opts *perfbuf.Options) (Kind, error) {
	if opts == nil {
		opts = &perfbuf.Options{}
	}
	if spec == nil {
		return 0, fmt.Errorf("prepare buffer %q: nil spec (load it first, with ebpf.LoadCollectionSpec): %w", mapName, os.ErrInvalid)
	}
	if err := buflayout.Check(want, opts); err != nil {
		return 0, fmt.Errorf("prepare buffer %q: %w", mapName, err)
	}
	b, err := find(spec, mapName)
	if err != nil {
		return 0, fmt.Errorf("prepare buffer %q: %w", mapName, err)
	}
	kind, err := buflayout.Choose(want, hasRingBuf)
	if err != nil {
		return 0, fmt.Errorf("prepare buffer %q: %w", mapName, err)
	}
	// A map prepared as another layout no longer holds the ring buffer's
	// size as compiled.
	var compiled uint32
	if b.events.Type == ebpf.RingBuf {
		compiled = b.events.MaxEntries
	}
	plan, err := buflayout.NewPlan(kind, compiled, opts)
	if errors.Is(err, buflayout.ErrNoSize) {
		return 0, fmt.Errorf("prepare buffer %q as %v of its compiled size: %w as a %v; give RingBytes, or prepare a copy of the spec as loaded",
			mapName, kind, ErrPrepared, b.events.Type)
	}
	if err != nil {
		return 0, fmt.Errorf("prepare buffer %q as %v: %w", mapName, kind, err)
	}
	if err := b.apply(plan); err != nil {
		return 0, fmt.Errorf("prepare buffer %q as %v: %w", mapName, plan, err)
	}
	plan.Finish(opts)
	return kind, nil
}

// buffer is what PERFBUF_BUFFER declared, in a spec.
type buffer struct {
	name    string
	events  *ebpf.MapSpec
	scratch *ebpf.MapSpec
	config  *ebpf.VariableSpec
	cfg     fullConfig // config's value
}

// find returns the PERFBUF_BUFFER name of spec, checked to be one.
func find(spec *ebpf.CollectionSpec, name string) (*buffer, error) {
	b := &buffer{name: name, events: spec.Maps[name], scratch: spec.Maps[name+"_scratch"], config: spec.Variables[name+"_config"]}
	switch {
	case b.events == nil:
		return nil, fmt.Errorf("no map %q in the spec: %w", name, os.ErrNotExist)
	case b.scratch == nil || b.config == nil:
		return nil, fmt.Errorf("not a PERFBUF_BUFFER: no map %s_scratch or variable %s_config: %w", name, name, os.ErrNotExist)
	case b.events.Type != ebpf.RingBuf && b.events.Type != ebpf.PerfEventArray,
		b.scratch.Type != ebpf.PerCPUArray,
		b.config.Size() != uint32(binary.Size(b.cfg)) || !b.config.Constant():
		return nil, fmt.Errorf("not a PERFBUF_BUFFER: map %v, %s_scratch %v, %s_config of %d bytes in %s: %w",
			b.events.Type, name, b.scratch.Type, name, b.config.Size(), b.config.SectionName, os.ErrInvalid)
	}
	if err := b.config.Get(&b.cfg); err != nil {
		return nil, fmt.Errorf("read %s_config: %w", name, err)
	}
	return b, nil
}

// apply makes b the object plan says. It changes nothing if it fails.
func (b *buffer) apply(plan buflayout.Plan) error {
	m, err := plan.Map()
	if err != nil {
		return err
	}
	cfg := b.cfg
	cfg.Config = plan.Config()
	if err := b.config.Set(cfg); err != nil {
		return fmt.Errorf("set %s_config: %w", b.name, err)
	}
	b.events.Type = ebpf.MapType(m.Type)
	b.events.KeySize, b.events.ValueSize, b.events.MaxEntries = m.KeySize, m.ValueSize, m.MaxEntries
	// The perf path builds a record of up to max_sample bytes in this
	// CPU's scratch value; the ring buffer path's scratch is dead code.
	b.scratch.ValueSize = 1
	if plan.Scratch() {
		b.scratch.ValueSize = uint32(cfg.MaxSample)
	}
	return nil
}

// hasRingBuf says whether the kernel creates ring buffers:
// features.HaveMapType's nil or ebpf.ErrNotSupported, its only conclusive
// answers.
func hasRingBuf() (bool, error) {
	err := features.HaveMapType(ebpf.RingBuf)
	if errors.Is(err, ebpf.ErrNotSupported) {
		return false, nil
	}
	return err == nil, err
}

// Map returns m as a perfbuf.Map, for perfbuf.New, perfbuf.NewReader,
// Options.FailureMap and Options.Maps: a *ebpf.Map passed as it is.
//
// The reader keeps a duplicate of m's descriptor, which its Close closes:
// once New or NewReader has returned, m may be closed, or dropped and its
// descriptor closed by the garbage collector, and the reader reads on.
// During the call m must stay open and reachable (keep a reference used
// after the call, or call runtime.KeepAlive(m) after it): a descriptor the
// garbage collector closed under the call fails it with syscall.EBADF, and
// is never read as another map. A nil m has no descriptor: the call fails
// with syscall.EBADF.
func Map(m *ebpf.Map) perfbuf.Map { return (*ebpfMap)(m) }

// ebpfMap is a *ebpf.Map with perfbuf.Map's method.
type ebpfMap ebpf.Map

// FileDescriptor returns the map's descriptor, or -1 for a nil map.
func (m *ebpfMap) FileDescriptor() int {
	if m == nil {
		return -1
	}
	return (*ebpf.Map)(m).FD()
}
