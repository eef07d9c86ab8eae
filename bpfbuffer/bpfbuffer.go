// SPDX-License-Identifier: Apache-2.0

// Package bpfbuffer makes a BPF program's buffer a ring buffer, an array of
// ring buffers (a ring per CPU, or per N CPUs) or a perf event array when
// its object loads, as the user asks or as the kernel allows: the choice
// libbpf-tools' bpf_buffer__new makes, in one call, with the BPF side
// following it exactly.
//
// The BPF program declares the buffer with PERFBUF_BUFFER and writes it
// with perfbuf_buffer_output (or _reserve, then _submit or _discard), from
// bpf/perfbuf.bpf.h. Between opening the object and loading it, Prepare
// probes the kernel, sets the map's type and sizes, and writes the choice
// into the buffer's read-only settings (<map>_config), where the verifier
// reads it as a constant and drops the code of the other layouts. Once the
// object is loaded, Maps says what to read and the same perfbuf.NewReader
// (or perfbuf.New) reads it, whichever layout it became:
//
//	m, _ := libbpfgo.NewModuleFromFile("prog.bpf.o")
//	opts := perfbuf.Options{RingBytes: 256 << 10}
//	kind, err := bpfbuffer.Prepare(m, "events", bpfbuffer.Any, &opts)
//	...
//	err = m.BPFLoadObject()
//	events, opts, err := bpfbuffer.Maps(m, "events", opts)
//	r, err := perfbuf.NewReader(events, perfbuf.ReaderOptions{Options: opts})
//
// docs/bpfbuffer.md says more.
package bpfbuffer

import (
	"errors"
	"fmt"
	"os"
	"runtime"
	"sync"
	"syscall"
	"weak"

	"github.com/aquasecurity/libbpfgo"
	"github.com/perfbuf/perfbuf"
	"github.com/perfbuf/perfbuf/buflayout"
	"golang.org/x/sys/unix"
)

// Kind is what a buffer is made at load: Any, RingBuf, PerfEventArray or
// RingBufPerCPU. It is ciliumbuffer.Kind: the same values for both
// loaders.
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
	// CPUs, which Prepare makes; the BPF side writes the ring of the CPU
	// it runs on. Any chooses it, a ring per CPU, where the kernel allows
	// (docs/bpfbuffer.md says why).
	RingBufPerCPU = buflayout.RingBufPerCPU
)

// Option is a setting of Prepare beyond perfbuf.Options. It is
// ciliumbuffer.Option.
type Option = buflayout.Option

// CPUsPerRing makes each ring of RingBufPerCPU the ring of n CPUs: CPU c
// writes ring c/n (Falco's modern probe shares a ring between 2 CPUs by
// default). The default is 1, a ring per CPU. Fewer rings cost less memory
// and fewer wakeups; more CPUs on one ring contend for its lock. Prepare
// refuses it for another kind, and an n below 1 (os.ErrInvalid).
func CPUsPerRing(n int) Option { return buflayout.CPUsPerRing(n) }

// Overwrite makes the ring buffers, the one of RingBuf or each of
// RingBufPerCPU, in overwrite mode (map flag BPF_F_RB_OVERWRITE, kernel
// 6.19), for a perfbuf.Recorder: the kernel overwrites the oldest records
// rather than refuse new ones. A perf event array needs nothing at load
// (the Recorder opens backward rings); Any chooses ring buffers (a ring
// per CPU, else one) only where the kernel has overwrite mode, else a
// perf event array. A buffer whose
// map flags carry BPF_F_RB_OVERWRITE is made so without it. RingBuf or
// RingBufPerCPU on a kernel without the mode: errors.ErrUnsupported,
// naming 6.19. WakeupBytes must be zero.
func Overwrite() Option { return buflayout.Overwrite() }

// Errors of Prepare called at the wrong time or twice, wrapped.
var (
	// ErrLoaded: the buffer's map exists already (the object was loaded,
	// or the map reuses a descriptor): a map's type and size are settled
	// when it is created. Prepare goes between opening the module and
	// BPFLoadObject.
	ErrLoaded = errors.New("map created already")
	// ErrPrepared: the buffer was prepared already, into another object
	// (another kind, ring size or watermark). Open the module again to
	// prepare it another way.
	ErrPrepared = errors.New("buffer prepared already")
)

// Prepare makes the PERFBUF_BUFFER mapName of m, an object opened and not
// yet loaded, the kind want: Any chooses a ring buffer per CPU
// (RingBufPerCPU, a ring per CPU) when the kernel takes ring buffers in an
// array of maps (it makes one, of one page, to see) and the object was
// built with a perfbuf.bpf.h that has that layout, else one ring buffer
// when the kernel has them (libbpf_probe_bpf_map_type), else a perf event
// array; RingBuf, PerfEventArray or RingBufPerCPU forces that kind. It
// returns the kind chosen. Call it after the module is opened and before BPFLoadObject;
// once it is loaded, read the buffer with what Maps returns.
//
// For RingBufPerCPU, Prepare makes the array of maps and its rings itself,
// now: a ring of RingBytes for every slot that holds a possible CPU (a
// CPU that comes online later has its ring already), each with the map
// flags PERFBUF_BUFFER declared, in the slots before any program can
// run, and has libbpf use that array for the map (bpf_map__reuse_fd). It
// keeps a descriptor of each ring for the module's life (they are closed
// when the module is garbage), so that a Reader over them needs no
// CAP_SYS_ADMIN: Maps hands them over. more may hold CPUsPerRing and
// Overwrite.
//
// Called again for the same buffer of the same module, it does nothing
// more if the object would be the same (the same kind, and for a ring
// buffer the same size and watermark): it returns the kind and leaves
// opts as the first call did. Asked for another object, it fails with
// ErrPrepared and changes nothing.
//
// It reads two of opts' ring settings, which mean the same for both
// kinds, and leaves opts ready for perfbuf.NewReader or perfbuf.New over
// the loaded map:
//
//   - RingBytes sizes a ring, rounded up to a power of two pages, as
//     perfbuf does for a perf event array's rings: the ring buffer's one
//     ring (its max_entries; zero keeps the map's size, as PERFBUF_BUFFER
//     declared it), or each CPU's ring of a perf event array (left in
//     opts for New).
//   - WakeupBytes wakes the reader once this much data is unread: a
//     perf event's wakeup_watermark (left in opts for New), or, for a ring
//     buffer, the BPF side's watermark (<map>_config.wakeup_bytes), at
//     and above which it commits each record with BPF_RB_FORCE_WAKEUP.
//     Zero keeps libbpf's behaviour: a ring buffer wakes its reader for
//     the first record after the reader caught up. Left in opts for both
//     kinds: a Reader over the ring buffer, woken below it, waits up to
//     its MaxLatency before it drains (Options.WakeupBytes).
//
// RingBytes is each ring's size for RingBufPerCPU, not a total, also
// when Any chooses it: the rings take RingBytes times their number, as a
// perf event array's do (docs/bpfbuffer.md). For one shared ring of
// RingBytes, ask for RingBuf.
//
// For ring buffers it clears RingBytes in opts, as the size is settled at
// load. WakeupEvents has no ring buffer equivalent and must be zero. A nil
// opts is the zero Options.
//
// For a perf event array, the map gets 4-byte keys and values and an
// entry for each possible CPU, and <map>_scratch, where
// perfbuf_buffer_reserve builds a record, is created; for a ring buffer,
// <map>_scratch is not created.
//
// Errors (with Any as the kind): os.ErrInvalid for a nil m, a want that
// is no Kind, WakeupEvents set, a negative RingBytes or WakeupBytes, a
// ring buffer's RingBytes above 2 GiB, or a WakeupBytes not below the
// ring buffer's size, CPUsPerRing below 1 or with another kind than
// RingBufPerCPU; errors.ErrUnsupported for RingBuf or RingBufPerCPU on a
// kernel without ring buffers, or RingBufPerCPU on one that takes none in
// an array of maps; the probe's EPERM or EACCES (os.ErrPermission), naming
// CAP_BPF, without the privilege to create a map, with Any too; ErrLoaded once the object is loaded; ErrPrepared for
// a second call that asks for another object; for a map that
// PERFBUF_BUFFER did not declare, libbpfgo's error, wrapped; for
// RingBufPerCPU, the kernel's errno creating the maps (EPERM, saying
// whether RLIMIT_MEMLOCK is the cause), wrapped. After another error the
// module may be partly changed: close it.
func Prepare(m *libbpfgo.Module, mapName string, want Kind, opts *perfbuf.Options, more ...Option) (Kind, error) {
	if opts == nil {
		opts = &perfbuf.Options{}
	}
	if m == nil {
		return 0, fmt.Errorf("prepare buffer %q: nil module (open the object first, with libbpfgo.NewModuleFromFile): %w", mapName, os.ErrInvalid)
	}
	set := buflayout.Apply(more)
	if err := buflayout.Check(want, set, opts); err != nil {
		return 0, fmt.Errorf("prepare buffer %q: %w", mapName, err)
	}
	events, err := m.GetMap(mapName)
	if err != nil {
		return 0, fmt.Errorf("prepare buffer: %w", err)
	}
	scratch, err := m.GetMap(mapName + "_scratch")
	if err != nil {
		return 0, fmt.Errorf("prepare buffer %q: not a PERFBUF_BUFFER: %w", mapName, err)
	}
	key := preparedKey{weak.Make(m), mapName}
	prepared.Lock()
	defer prepared.Unlock()
	was, ok := prepared.m[key]
	// libbpf gives a map a descriptor when it creates it (at load), or
	// when it reuses one; its type and size are settled then. Prepare
	// has libbpf reuse the array of ring buffers it made, and a ring
	// buffer in overwrite mode: that map has its descriptor from the
	// first call on.
	if events.FileDescriptor() >= 0 && (!ok || !reuses(was.p)) {
		return 0, fmt.Errorf("prepare buffer %q: %w (the object is loaded, or the map reuses a descriptor): call Prepare after opening the module and before BPFLoadObject", mapName, ErrLoaded)
	}
	if ok && reuses(was.p) {
		set.Declared(was.p.MapFlags(0)) // the map is Prepare's now
	} else {
		set.Declared(uint32(events.MapFlags()))
	}
	kind, err := buflayout.ChooseFor(want, set, hasRingBuf, hasRingArray)
	if err != nil {
		return 0, fmt.Errorf("prepare buffer %q: %w", mapName, err)
	}
	// A first call with Any that found an object without the array's
	// layout made one ring buffer: its config (rewritten as it is) has
	// no room for cpus_per_ring.
	if want == Any && kind == RingBufPerCPU && ok && was.p.Kind == RingBuf && setArrayConfig(m, scratch, mapName, was.p) != nil {
		kind = RingBuf
	}
	// The ring's size now: the map's, as declared or prepared; once the
	// map is the array Prepare made, its rings'.
	now := events.MaxEntries()
	if ok && was.p.Kind == RingBufPerCPU {
		now = uint32(was.p.Size)
	}
	p, err := buflayout.NewPlan(kind, now, set, opts)
	if err != nil {
		return 0, fmt.Errorf("prepare buffer %q as %v: %w", mapName, kind, err)
	}

	if ok {
		if was.p != p {
			return 0, fmt.Errorf("prepare buffer %q as %v: %w as %v; open the module again to prepare it another way",
				mapName, p, ErrPrepared, was.p)
		}
		// The array's descriptor cannot tell a loaded object from one
		// prepared: the read-only settings can (libbpfgo refuses them
		// once loaded). They are written again as they are.
		if reuses(p) {
			if err := setConfig(m, scratch, mapName, p); err != nil {
				return 0, fmt.Errorf("prepare buffer %q: %w (the object is loaded): call Prepare after opening the module and before BPFLoadObject: %w", mapName, ErrLoaded, err)
			}
		}
	} else {
		var rings []ringFD
		switch kind {
		case RingBuf:
			err = asRingBuf(m, events, scratch, mapName, p)
		case RingBufPerCPU:
			rings, err = asRingBufArray(m, events, scratch, mapName, p)
			if want == Any && errors.Is(err, errOldConfig) {
				// Nothing changed: one ring buffer, as the object can have.
				kind = RingBuf
				if p, err = buflayout.NewPlan(kind, now, set, opts); err == nil {
					err = asRingBuf(m, events, scratch, mapName, p)
				}
			}
		default:
			err = asPerfEventArray(m, events, scratch, mapName, p)
		}
		if errors.Is(err, syscall.EBUSY) {
			// libbpf's answer to a change of a map it created: a load
			// that failed leaves no descriptor, but the object loaded.
			return 0, fmt.Errorf("prepare buffer %q as %v: %w (BPFLoadObject was called, even if it failed): call Prepare after opening the module and before BPFLoadObject: %w", mapName, kind, ErrLoaded, err)
		}
		if err != nil {
			return 0, fmt.Errorf("prepare buffer %q as %v: %w", mapName, kind, err)
		}
		if prepared.m == nil {
			prepared.m = make(map[preparedKey]*entry)
		}
		prepared.m[key] = &entry{p: p, rings: rings}
		runtime.AddCleanup(m, forget, key)
	}
	p.Finish(opts, mapName, "call bpfbuffer.Prepare after opening the module and before BPFLoadObject, and read what bpfbuffer.Maps returns")
	return kind, nil
}

// prepared holds what Prepare made of each buffer, by module and map
// name, so that a second call can tell the same object from another, and
// Maps finds the rings of an array. An entry goes, and its rings'
// descriptors are closed, when its module is garbage.
var prepared struct {
	sync.Mutex
	m map[preparedKey]*entry
}

// entry is what Prepare made of one buffer: the object, and for
// RingBufPerCPU the descriptors of its rings, in slot order.
type entry struct {
	p     buflayout.Plan
	rings []ringFD
}

type preparedKey struct {
	mod  weak.Pointer[libbpfgo.Module]
	name string
}

// forget drops the entry of a module that is garbage, and closes its
// rings' descriptors.
func forget(key preparedKey) {
	prepared.Lock()
	e := prepared.m[key]
	delete(prepared.m, key)
	prepared.Unlock()
	if e != nil {
		closeRings(e.rings)
	}
}

// hasRingBuf says whether the kernel creates ring buffers. libbpf answers
// 0 for "no", and for a failure it cannot tell apart (EPERM without
// CAP_BPF among them), which libbpfgo returns as the error Errno(0): a
// "no" is asked again of the kernel, whose errno tells them apart (EINVAL
// for a map type it does not know).
func hasRingBuf() (bool, error) {
	has, err := libbpfgo.BPFMapTypeIsSupported(libbpfgo.MapTypeRingbuf)
	if errno, ok := err.(syscall.Errno); has || !ok || errno != 0 {
		return has, err
	}
	fd, err := createRingBuf("perfbuf_probe", uint32(os.Getpagesize()), 0)
	if errors.Is(err, syscall.EINVAL) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	unix.Close(fd)
	return true, nil
}

// hasRingArray says whether the kernel takes a ring buffer in an array of
// maps: it makes a ring of one page and an array of one slot with it as
// the inner map. EINVAL or ENOTSUPP is "no" (before 5.10 the kernel has
// no map_meta_equal for ring buffers); another errno is the probe's error.
func hasRingArray() (bool, error) {
	ring, err := createRingBuf("perfbuf_probe", uint32(os.Getpagesize()), 0)
	if err != nil {
		return false, err
	}
	defer unix.Close(ring)
	array, err := createArrayOfMaps("perfbuf_probe", 1, ring)
	if errors.Is(err, syscall.EINVAL) || errors.Is(err, errNotSupp) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	unix.Close(array.FileDescriptor())
	return true, nil
}

// reuses says whether Prepare makes p's map itself, and has libbpf reuse
// it: an array of ring buffers, or a ring buffer in overwrite mode (whose
// flag libbpfgo cannot set).
func reuses(p buflayout.Plan) bool {
	return p.Kind == RingBufPerCPU || p.Kind == RingBuf && p.Overwrite
}

// setConfig writes <name>_config for p, a plan that reuses a map.
func setConfig(m *libbpfgo.Module, scratch *libbpfgo.BPFMap, name string, p buflayout.Plan) error {
	if p.Kind == RingBufPerCPU {
		return setArrayConfig(m, scratch, name, p)
	}
	if err := m.InitGlobalVariable(name+"_config", p.Config()); err != nil {
		return fmt.Errorf("set %s_config: %w", name, err)
	}
	return nil
}

func asRingBuf(m *libbpfgo.Module, events, scratch *libbpfgo.BPFMap, name string, p buflayout.Plan) error {
	if p.Overwrite {
		// libbpfgo sets no map flags: the ring is made here, with the
		// flags declared and BPF_F_RB_OVERWRITE, and libbpf keeps a
		// duplicate of it.
		fd, err := createRingBuf(name, uint32(p.Size), p.MapFlags(uint32(events.MapFlags())))
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		if err := setConfig(m, scratch, name, p); err != nil {
			return err
		}
		if err := scratch.SetAutocreate(false); err != nil {
			return err
		}
		if err := events.ReuseFD(fd); err != nil {
			return fmt.Errorf("have libbpf use the ring buffer: %w", err)
		}
		return nil
	}
	if err := events.SetType(libbpfgo.MapTypeRingbuf); err != nil {
		return err
	}
	if err := events.SetMaxEntries(uint32(p.Size)); err != nil {
		return err
	}
	if err := scratch.SetAutocreate(false); err != nil {
		return err
	}
	if err := m.InitGlobalVariable(name+"_config", p.Config()); err != nil {
		return fmt.Errorf("set %s_config: %w", name, err)
	}
	return nil
}

func asPerfEventArray(m *libbpfgo.Module, events, scratch *libbpfgo.BPFMap, name string, p buflayout.Plan) error {
	ms, err := p.Map()
	if err != nil {
		return err
	}
	for _, set := range []func() error{
		func() error { return events.SetType(libbpfgo.MapType(ms.Type)) },
		func() error { return events.SetKeySize(ms.KeySize) },
		func() error { return events.SetValueSize(ms.ValueSize) },
		func() error { return events.SetMaxEntries(ms.MaxEntries) },
		func() error { return scratch.SetAutocreate(true) },
	} {
		if err := set(); err != nil {
			return err
		}
	}
	if err := m.InitGlobalVariable(name+"_config", p.Config()); err != nil {
		return fmt.Errorf("set %s_config: %w", name, err)
	}
	return nil
}
