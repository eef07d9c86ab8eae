// SPDX-License-Identifier: Apache-2.0

// Package ciliumbuffer is package bpfbuffer for cilium/ebpf's loader: it
// makes a BPF program's PERFBUF_BUFFER (bpf/perfbuf.bpf.h) a ring buffer,
// an array of ring buffers (a ring per CPU, or per N CPUs) or a perf event
// array in a *ebpf.CollectionSpec, before the collection is created, as
// the user asks or as the kernel allows; it says what to read once the
// collection is created (Maps); and it passes a *ebpf.Map to perfbuf as it
// is (Map), or opens a Reader over one on the defaults (NewReader), as
// cilium/ebpf's perf.NewReader and ringbuf.NewReader do. It needs no cgo:
// it builds with CGO_ENABLED=0, as perfbuf's readers do.
//
// The decision is bpfbuffer.Prepare's, made by the same code
// (package buflayout): the same Options give the same object, whichever
// loader loads it.
//
//	spec, _ := ebpf.LoadCollectionSpec("prog.bpf.o")
//	opts := perfbuf.Options{RingBytes: 256 << 10}
//	kind, err := ciliumbuffer.Prepare(spec, "events", ciliumbuffer.Any, &opts)
//	...
//	coll, err := ebpf.NewCollection(spec)
//	events, opts, err := ciliumbuffer.Maps(coll, "events", opts)
//	r, err := perfbuf.NewReader(events, perfbuf.ReaderOptions{Options: opts})
//
// docs/bpfbuffer.md says more.
package ciliumbuffer

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"slices"
	"syscall"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/features"
	"github.com/perfbuf/perfbuf"
	"github.com/perfbuf/perfbuf/buflayout"
	"golang.org/x/sys/unix"
)

// Kind is what a buffer is made at load: Any, RingBuf, PerfEventArray or
// RingBufPerCPU. It is bpfbuffer.Kind: the same values in both packages.
type Kind = buflayout.Kind

const (
	// Any asks Prepare for the best layout the kernel allows: a ring
	// buffer per CPU where it takes ring buffers in an array of maps
	// (5.10), else one ring buffer (5.8), else a perf event array.
	// Prepare returns it only with an error.
	Any = buflayout.Any
	// RingBuf is a BPF_MAP_TYPE_RINGBUF: one ring that every CPU writes.
	RingBuf = buflayout.RingBuf
	// PerfEventArray is a BPF_MAP_TYPE_PERF_EVENT_ARRAY: a ring per CPU.
	PerfEventArray = buflayout.PerfEventArray
	// RingBufPerCPU is a BPF_MAP_TYPE_ARRAY_OF_MAPS of
	// BPF_MAP_TYPE_RINGBUF: a ring buffer per CPU, or per CPUsPerRing
	// CPUs, in the slot of its CPUs; the BPF side writes the ring of the
	// CPU it runs on. Any chooses it, a ring per CPU, where the kernel
	// allows.
	RingBufPerCPU = buflayout.RingBufPerCPU
)

// Option is a setting of Prepare beyond perfbuf.Options. It is
// bpfbuffer.Option.
type Option = buflayout.Option

// CPUsPerRing makes each ring of RingBufPerCPU the ring of n CPUs: CPU c
// writes ring c/n. The default is 1, a ring per CPU. Prepare refuses it
// for another kind, and an n below 1 (os.ErrInvalid).
func CPUsPerRing(n int) Option { return buflayout.CPUsPerRing(n) }

// Overwrite makes the ring buffers in overwrite mode, for a
// perfbuf.Recorder, as bpfbuffer.Overwrite: RingBuf or RingBufPerCPU on a
// kernel without the mode (before 6.19) is errors.ErrUnsupported, naming
// 6.19; Any chooses a perf event array there (a ring per CPU, else one
// ring buffer, where the kernel has the mode).
func Overwrite() Option { return buflayout.Overwrite() }

// ErrPrepared is Prepare's error, wrapped, for a buffer prepared as
// another layout already (a perf event array, an array of ring buffers)
// and asked for ring buffers of the size it was compiled with, which the
// spec no longer holds. Give Options.RingBytes, or prepare a copy of the
// spec as it was loaded (CollectionSpec.Copy before the first Prepare).
var ErrPrepared = errors.New("buffer prepared already")

// oldConfig is struct perfbuf_buffer_config in an object built with a
// perfbuf.bpf.h older than the array of ring buffers: no cpus_per_ring.
type oldConfig struct {
	buflayout.Config
	MaxSample uint64
}

// Prepare makes the PERFBUF_BUFFER mapName of spec the kind want: Any
// chooses a ring buffer per CPU (RingBufPerCPU, a ring per CPU) when the
// kernel takes ring buffers in an array of maps (it makes one, of one
// page, to see) and the object was built with a perfbuf.bpf.h that has
// that layout, else one ring buffer when the kernel has them
// (features.HaveMapType(ebpf.RingBuf)), else a perf event array; RingBuf,
// PerfEventArray or RingBufPerCPU forces that kind. It returns the kind
// chosen. Call it before ebpf.NewCollection (or LoadAndAssign) with spec;
// once the collection is created, read the buffer with what Maps returns.
//
// For RingBufPerCPU, mapName becomes an array of maps whose inner map is a
// ring buffer of RingBytes, with the map flags PERFBUF_BUFFER declared,
// and Prepare adds a ring buffer map to spec for every slot that holds a
// possible CPU (a CPU that comes online later has its ring already), named
// <mapName>_<slot> ("events_0"), each named in the array's Contents: so
// ebpf.NewCollection makes the rings with the collection, and fills the
// slots before it returns, before any program can be attached. Each
// collection made from spec has rings of its own, in its Maps, and closes
// them with the rest. more may hold CPUsPerRing and Overwrite.
//
// It changes only spec: the map mapName, the map <mapName>_scratch, the
// variable <mapName>_config, and for RingBufPerCPU the rings' maps. Called again, it sets them anew from its
// arguments, whatever it made before: the same want and Options give the
// same spec (but for ErrPrepared, below). A spec is not loaded itself, so
// there is no bpfbuffer.ErrLoaded: each ebpf.NewCollection loads a copy,
// and a collection made before Prepare holds the buffer as compiled. opts
// notes what Prepare made: a reader given with it a map that is not that
// (the collection's, made before Prepare) refuses it with os.ErrInvalid,
// naming the fix.
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
//     the Reader, which then holds its wakeups back (Options.WakeupBytes).
//
// RingBytes is each ring's size for RingBufPerCPU, not a total, also
// when Any chooses it: the rings take RingBytes times their number, as a
// perf event array's do (docs/bpfbuffer.md). For one shared ring of
// RingBytes, ask for RingBuf.
//
// The rings are the collection's maps: read them through Maps after
// ebpf.NewCollection. After LoadAndAssign without them, cilium/ebpf
// closes them, and a Reader given the array opens its rings by ID, which
// needs CAP_SYS_ADMIN: load with NewCollection, or ask for RingBuf.
//
// For ring buffers it clears RingBytes in opts (the size is settled at
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
// that is no Kind, CPUsPerRing below 1 or with another kind than
// RingBufPerCPU, WakeupEvents set, a negative RingBytes or WakeupBytes, a
// ring buffer's RingBytes above 2 GiB, a WakeupBytes not below the ring
// buffer's size, a map or variable of that name that PERFBUF_BUFFER did
// not declare, or RingBufPerCPU for an object built with a perfbuf.bpf.h
// older than that layout; os.ErrNotExist when the spec has no such map or
// variable; os.ErrExist when spec has a map of its own by a ring's name;
// errors.ErrUnsupported for RingBuf or RingBufPerCPU on a kernel without
// ring buffers; ErrPrepared for ring buffers of the compiled size after
// another layout; a probe's error (features.HaveMapType), naming CAP_BPF
// for an EPERM or EACCES (os.ErrPermission), with Any too. spec is left as
// it was after an error. A kernel that takes no ring buffer in an array
// of maps (before 5.8) fails ebpf.NewCollection.
func Prepare(spec *ebpf.CollectionSpec, mapName string, want Kind, opts *perfbuf.Options, more ...Option) (Kind, error) {
	if opts == nil {
		opts = &perfbuf.Options{}
	}
	if spec == nil {
		return 0, fmt.Errorf("prepare buffer %q: nil spec (load it first, with ebpf.LoadCollectionSpec): %w", mapName, os.ErrInvalid)
	}
	set := buflayout.Apply(more)
	if err := buflayout.Check(want, set, opts); err != nil {
		return 0, fmt.Errorf("prepare buffer %q: %w", mapName, err)
	}
	b, err := find(spec, mapName)
	if err != nil {
		return 0, fmt.Errorf("prepare buffer %q: %w", mapName, err)
	}
	set.Declared(b.flags())
	kind, err := buflayout.ChooseFor(want, set, hasRingBuf, hasRingArray)
	if err != nil {
		return 0, fmt.Errorf("prepare buffer %q: %w", mapName, err)
	}
	if kind == RingBufPerCPU && b.old && want == Any {
		kind = RingBuf // as the object can have
	}
	if kind == RingBufPerCPU && b.old {
		return 0, fmt.Errorf("prepare buffer %q as %v: %s_config has no cpus_per_ring (built with a perfbuf.bpf.h older than the array of ring buffers): %w",
			mapName, kind, mapName, os.ErrInvalid)
	}
	// A map prepared as another layout no longer holds the ring buffer's
	// size as compiled.
	var compiled uint32
	if b.events.Type == ebpf.RingBuf {
		compiled = b.events.MaxEntries
	}
	plan, err := buflayout.NewPlan(kind, compiled, set, opts)
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
	plan.Finish(opts, mapName, "call ciliumbuffer.Prepare before ebpf.NewCollection or LoadAndAssign, and read the collection made after it (ciliumbuffer.Maps)")
	return kind, nil
}

// buffer is what PERFBUF_BUFFER declared, in a spec.
type buffer struct {
	name    string
	spec    *ebpf.CollectionSpec
	events  *ebpf.MapSpec
	scratch *ebpf.MapSpec
	config  *ebpf.VariableSpec
	cfg     buflayout.FullConfig // config's value
	old     bool                 // config is an oldConfig: no cpus_per_ring
}

// find returns the PERFBUF_BUFFER name of spec, checked to be one: its map
// as compiled or as Prepare made it.
func find(spec *ebpf.CollectionSpec, name string) (*buffer, error) {
	b := &buffer{name: name, spec: spec, events: spec.Maps[name], scratch: spec.Maps[name+"_scratch"], config: spec.Variables[name+"_config"]}
	switch {
	case b.events == nil:
		return nil, fmt.Errorf("no map %q in the spec: %w", name, os.ErrNotExist)
	case b.scratch == nil || b.config == nil:
		return nil, fmt.Errorf("not a PERFBUF_BUFFER: no map %s_scratch or variable %s_config: %w", name, name, os.ErrNotExist)
	case b.events.Type != ebpf.RingBuf && b.events.Type != ebpf.PerfEventArray && !b.isRingArray(),
		b.scratch.Type != ebpf.PerCPUArray,
		b.config.Size() != uint32(binary.Size(b.cfg)) && b.config.Size() != buflayout.OldConfigSize || !b.config.Constant():
		return nil, fmt.Errorf("not a PERFBUF_BUFFER: map %v, %s_scratch %v, %s_config of %d bytes in %s: %w",
			b.events.Type, name, b.scratch.Type, name, b.config.Size(), b.config.SectionName, os.ErrInvalid)
	}
	b.old = b.config.Size() == buflayout.OldConfigSize
	var err error
	if b.old {
		var c oldConfig
		err = b.config.Get(&c)
		b.cfg = buflayout.FullConfig{Config: c.Config, MaxSample: c.MaxSample}
	} else {
		err = b.config.Get(&b.cfg)
	}
	if err != nil {
		return nil, fmt.Errorf("read %s_config: %w", name, err)
	}
	return b, nil
}

// flags returns the map flags PERFBUF_BUFFER declared: the ring buffer's,
// kept by the template of an array of them.
func (b *buffer) flags() uint32 {
	if b.isRingArray() {
		return b.events.InnerMap.Flags
	}
	return b.events.Flags
}

// isRingArray reports whether b's map is an array of ring buffers, as
// Prepare makes it.
func (b *buffer) isRingArray() bool {
	return b.events.Type == ebpf.ArrayOfMaps && b.events.InnerMap != nil && b.events.InnerMap.Type == ebpf.RingBuf
}

// rings returns the names of the rings' maps that a former Prepare added
// to the spec: those the array's Contents name.
func (b *buffer) rings() []string {
	if !b.isRingArray() {
		return nil
	}
	var names []string
	for _, kv := range b.events.Contents {
		if n, ok := kv.Value.(string); ok {
			names = append(names, n)
		}
	}
	return names
}

// apply makes b the object plan says. It changes nothing if it fails.
func (b *buffer) apply(plan buflayout.Plan) error {
	m, err := plan.Map()
	if err != nil {
		return err
	}
	slots, err := plan.Slots()
	if err != nil {
		return err
	}
	// The rings' names are Prepare's: a map of the spec's own by one of
	// them would be replaced.
	was := b.rings()
	for _, k := range slots {
		if n := buflayout.RingName(b.name, k); b.spec.Maps[n] != nil && !slices.Contains(was, n) {
			return fmt.Errorf("the spec has a map %q, the name of the ring of slot %d: %w", n, k, os.ErrExist)
		}
	}
	flags := plan.MapFlags(b.flags())
	cfg := plan.FullConfig(b.cfg.MaxSample)
	if b.old {
		err = b.config.Set(oldConfig{cfg.Config, cfg.MaxSample})
	} else {
		err = b.config.Set(cfg)
	}
	if err != nil {
		return fmt.Errorf("set %s_config: %w", b.name, err)
	}
	for _, n := range was {
		delete(b.spec.Maps, n)
	}
	b.events.Type = ebpf.MapType(m.Type)
	b.events.KeySize, b.events.ValueSize, b.events.MaxEntries = m.KeySize, m.ValueSize, m.MaxEntries
	b.events.Flags, b.events.InnerMap, b.events.Contents = flags, nil, nil
	if plan.Kind == RingBufPerCPU {
		// The kernel checks each slot's map against the template (type,
		// flags), and the verifier types a lookup's result by it. cilium
		// fills the slots with the maps the Contents name once it has
		// made them, before NewCollection returns.
		b.events.Flags = 0
		b.events.InnerMap = &ebpf.MapSpec{Name: b.name, Type: ebpf.MapType(m.Inner.Type), MaxEntries: m.Inner.MaxEntries, Flags: flags}
		for _, k := range slots {
			n := buflayout.RingName(b.name, k)
			b.spec.Maps[n] = &ebpf.MapSpec{Name: n, Type: ebpf.MapType(m.Inner.Type), MaxEntries: m.Inner.MaxEntries, Flags: flags}
			b.events.Contents = append(b.events.Contents, ebpf.MapKV{Key: k, Value: n})
		}
	}
	// The perf path builds a record of up to max_sample bytes in this
	// CPU's scratch value; the ring buffer paths' scratch is dead code.
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

// hasRingArray says whether the kernel takes a ring buffer in an array of
// maps: it makes an array of one slot whose inner map is a ring of one
// page. EINVAL, ENOTSUPP or ebpf.ErrNotSupported is "no" (before 5.10 the
// kernel has no map_meta_equal for ring buffers); another error is the
// probe's.
func hasRingArray() (bool, error) {
	m, err := ebpf.NewMap(&ebpf.MapSpec{
		Name: "perfbuf_probe", Type: ebpf.ArrayOfMaps, KeySize: 4, ValueSize: 4, MaxEntries: 1,
		InnerMap: &ebpf.MapSpec{Name: "perfbuf_probe", Type: ebpf.RingBuf, MaxEntries: uint32(os.Getpagesize())},
	})
	if errors.Is(err, unix.EINVAL) || errors.Is(err, errNotSupp) || errors.Is(err, ebpf.ErrNotSupported) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	m.Close()
	return true, nil
}

// errNotSupp is the kernel's ENOTSUPP (524, include/linux/errno.h), which
// x/sys/unix does not name: what bpf_map_meta_alloc answers for an inner
// map type without map_meta_equal.
const errNotSupp = syscall.Errno(524)

// Map returns m as a perfbuf.Map, for perfbuf.New, perfbuf.NewReader,
// Options.FailureMap and Options.Maps: a *ebpf.Map passed as it is.
//
// The reader keeps a duplicate of m's descriptor, which its Close closes:
// once New or NewReader has returned, m may be closed, or dropped and its
// descriptor closed by the garbage collector, and the reader reads on.
// During the call the constructors keep m reachable. A nil m has no
// descriptor: the call fails with syscall.EBADF.
func Map(m *ebpf.Map) perfbuf.Map { return (*ebpfMap)(m) }

// NewReader opens a perfbuf.Reader over m with the defaults, as
// cilium/ebpf's perf.NewReader and ringbuf.NewReader open theirs: it is
// perfbuf.NewReader(Map(m), perfbuf.ReaderOptions{}), for a port that
// needs no option (a perf ring of 256 KiB, cilium's 64 pages on 4 KiB
// pages). With options, or over a buffer that Prepare made, call
// perfbuf.NewReader. Errors: perfbuf.NewReader's.
func NewReader(m *ebpf.Map) (*perfbuf.Reader, error) {
	return perfbuf.NewReader(Map(m), perfbuf.ReaderOptions{})
}

// ebpfMap is a *ebpf.Map with perfbuf.Map's method.
type ebpfMap ebpf.Map

// FileDescriptor returns the map's descriptor, or -1 for a nil map.
func (m *ebpfMap) FileDescriptor() int {
	if m == nil {
		return -1
	}
	return (*ebpf.Map)(m).FD()
}

// Maps returns the map to read the buffer mapName of coll with, as Prepare
// made it, and opts completed for perfbuf.NewReader or perfbuf.New:
// FailureMap set to <mapName>_failures if it is nil, and for an array of
// ring buffers the first ring as the map and the others appended to a
// copy of opts.Maps, in slot order (a Reader's Stats().Rings[i] is the i-th
// ring: CPU i's with a ring per CPU and no gap in the possible CPUs). For
// the other kinds the map is the buffer's own. The maps are coll's,
// through Map: keep coll open until NewReader or New has returned.
//
// The Reader then needs no CAP_SYS_ADMIN, which opening the rings of the
// array by ID would (a Reader given the array itself does that, when it
// may: so read it, once the rings' maps are closed, as after
// LoadAndAssign without them).
//
// Errors: os.ErrInvalid for a nil coll; os.ErrNotExist for a map coll
// does not have, wrapped.
func Maps(coll *ebpf.Collection, mapName string, opts perfbuf.Options) (perfbuf.Map, perfbuf.Options, error) {
	if coll == nil {
		return nil, opts, fmt.Errorf("buffer %q maps: nil collection: %w", mapName, os.ErrInvalid)
	}
	events := coll.Maps[mapName]
	if events == nil {
		return nil, opts, fmt.Errorf("buffer %q maps: no map %q in the collection: %w", mapName, mapName, os.ErrNotExist)
	}
	if opts.FailureMap == nil {
		failures := coll.Maps[mapName+"_failures"]
		if failures == nil {
			return nil, opts, fmt.Errorf("buffer %q maps: not a PERFBUF_BUFFER: no map %s_failures: %w", mapName, mapName, os.ErrNotExist)
		}
		opts.FailureMap = Map(failures)
	}
	if events.Type() != ebpf.ArrayOfMaps {
		return Map(events), opts, nil
	}
	// The rings Prepare added, by their slots' names.
	var rings []perfbuf.Map
	for k := range events.MaxEntries() {
		if m := coll.Maps[buflayout.RingName(mapName, k)]; m != nil && m.Type() == ebpf.RingBuf {
			rings = append(rings, Map(m))
		}
	}
	if len(rings) == 0 {
		return Map(events), opts, nil
	}
	opts.Maps = append(slices.Clip(slices.Clone(opts.Maps)), rings[1:]...)
	return rings[0], opts, nil
}
