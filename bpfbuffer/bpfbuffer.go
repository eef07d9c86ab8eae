// SPDX-License-Identifier: Apache-2.0

// Package bpfbuffer makes a BPF program's buffer a ring buffer or a perf
// event array when its object loads, whichever the kernel has: the choice
// libbpf-tools' bpf_buffer__new makes, in one call, with the BPF side
// following it exactly.
//
// The BPF program declares the buffer with PERFBUF_BUFFER and writes it
// with perfbuf_buffer_output (or _reserve, then _submit or _discard), from
// bpf/perfbuf.bpf.h. Between opening the object and loading it, Prepare
// probes the kernel, sets the map's type and sizes, and writes the choice
// into the buffer's read-only settings (<map>_config), where the verifier
// reads it as a constant and drops the code of the other kind. The same
// perfbuf.NewReader (or perfbuf.New) then reads the map, whichever it
// became:
//
//	m, _ := libbpfgo.NewModuleFromFile("prog.bpf.o")
//	opts := perfbuf.Options{RingBytes: 256 << 10}
//	kind, err := bpfbuffer.Prepare(m, "events", bpfbuffer.Any, &opts)
//	...
//	err = m.BPFLoadObject()
//	events, _ := m.GetMap("events")
//	failures, _ := m.GetMap("events_failures")
//	opts.FailureMap = failures
//	r, err := perfbuf.NewReader(events, opts)
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
	"github.com/perfbuf/perfbuf/internal/buflayout"
)

// Kind is what a buffer is made at load: Any, RingBuf or PerfEventArray.
// It is ciliumbuffer.Kind: the same values for both loaders.
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
// yet loaded, the kind want: Any chooses a ring buffer when the kernel
// has them (libbpf_probe_bpf_map_type), else a perf event array; RingBuf
// or PerfEventArray forces that kind. It returns the kind chosen. Call it
// after the module is opened and before BPFLoadObject.
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
// For a ring buffer it clears RingBytes in opts, as the size is settled
// at load and New refuses it for a ring buffer. WakeupEvents has no ring
// buffer equivalent and must be zero. A nil opts is the zero Options.
//
// For a perf event array, the map gets 4-byte keys and values and an
// entry for each possible CPU, and <map>_scratch, where
// perfbuf_buffer_reserve builds a record, is created; for a ring buffer,
// <map>_scratch is not created.
//
// Errors (with Any as the kind): os.ErrInvalid for a nil m, a want that
// is no Kind, WakeupEvents set, a negative RingBytes or WakeupBytes, a
// ring buffer's RingBytes above 2 GiB, or a WakeupBytes not below the
// ring buffer's size; errors.ErrUnsupported for RingBuf on a kernel
// without ring buffers; ErrLoaded once the object is loaded; ErrPrepared
// for a second call that asks for another object; for a map that
// PERFBUF_BUFFER did not declare, libbpfgo's error, wrapped. After
// another error the module may be partly changed: close it.
func Prepare(m *libbpfgo.Module, mapName string, want Kind, opts *perfbuf.Options) (Kind, error) {
	if opts == nil {
		opts = &perfbuf.Options{}
	}
	if m == nil {
		return 0, fmt.Errorf("prepare buffer %q: nil module (open the object first, with libbpfgo.NewModuleFromFile): %w", mapName, os.ErrInvalid)
	}
	if err := buflayout.Check(want, opts); err != nil {
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
	// libbpf gives a map a descriptor when it creates it (at load), or
	// when it reuses one; its type and size are settled then.
	if events.FileDescriptor() >= 0 {
		return 0, fmt.Errorf("prepare buffer %q: %w (the object is loaded, or the map reuses a descriptor): call Prepare after opening the module and before BPFLoadObject", mapName, ErrLoaded)
	}
	kind, err := buflayout.Choose(want, hasRingBuf)
	if err != nil {
		return 0, fmt.Errorf("prepare buffer %q: %w", mapName, err)
	}
	p, err := buflayout.NewPlan(kind, events.MaxEntries(), opts)
	if err != nil {
		return 0, fmt.Errorf("prepare buffer %q as %v: %w", mapName, kind, err)
	}

	key := preparedKey{weak.Make(m), mapName}
	prepared.Lock()
	defer prepared.Unlock()
	if was, ok := prepared.m[key]; ok {
		if was != p {
			return 0, fmt.Errorf("prepare buffer %q as %v: %w as %v; open the module again to prepare it another way",
				mapName, p, ErrPrepared, was)
		}
	} else {
		if kind == RingBuf {
			err = asRingBuf(m, events, scratch, mapName, p)
		} else {
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
			prepared.m = make(map[preparedKey]buflayout.Plan)
		}
		prepared.m[key] = p
		runtime.AddCleanup(m, forget, key)
	}
	p.Finish(opts)
	return kind, nil
}

// prepared holds what Prepare made of each buffer, by module and map
// name, so that a second call can tell the same object from another. An
// entry goes when its module is garbage.
var prepared struct {
	sync.Mutex
	m map[preparedKey]buflayout.Plan
}

type preparedKey struct {
	mod  weak.Pointer[libbpfgo.Module]
	name string
}

// forget drops the entry of a module that is garbage.
func forget(key preparedKey) {
	prepared.Lock()
	delete(prepared.m, key)
	prepared.Unlock()
}

// hasRingBuf says whether the kernel creates ring buffers. libbpf answers
// 0 for "no" (and for a failure it cannot tell apart), which libbpfgo
// returns as the error Errno(0).
func hasRingBuf() (bool, error) {
	has, err := libbpfgo.BPFMapTypeIsSupported(libbpfgo.MapTypeRingbuf)
	if errno, ok := err.(syscall.Errno); has || ok && errno == 0 {
		return has, nil
	}
	return false, err
}

func asRingBuf(m *libbpfgo.Module, events, scratch *libbpfgo.BPFMap, name string, p buflayout.Plan) error {
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
