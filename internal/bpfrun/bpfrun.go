// SPDX-License-Identifier: Apache-2.0

// Package bpfrun loads the emitter programs of selftest/common/emit.bpf.h
// and drives them with BPF_PROG_TEST_RUN, so that samples are written on a
// chosen CPU deterministically: no sleeps, no tracing noise.
//
// It returns errors and does not depend on testing: the selftests use it
// through selftest/internal/bpftest, which turns the errors into test
// failures, and the benchmark tooling (bench/perfbench, bench/selftest)
// uses it directly.
package bpfrun

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"runtime"
	"sync"
	"unsafe"

	"github.com/aquasecurity/libbpfgo"
	"github.com/perfbuf/perfbuf/internal/cpus"
	"golang.org/x/sys/unix"
)

// ErrPrivileges is wrapped by CheckPrivileges when BPF programs cannot be
// loaded here.
var ErrPrivileges = errors.New("cannot load BPF programs")

// CheckPrivileges reports why this process cannot load and test-run BPF
// programs (not root, no kernel BTF), or nil if it can.
func CheckPrivileges() error {
	if os.Geteuid() != 0 {
		return fmt.Errorf("needs root (CAP_BPF, CAP_PERFMON, CAP_SYS_ADMIN): %w", ErrPrivileges)
	}
	if _, err := os.Stat("/sys/kernel/btf/vmlinux"); err != nil {
		return fmt.Errorf("needs kernel BTF: %v: %w", err, ErrPrivileges)
	}
	return nil
}

var quietOnce sync.Once

// quietLibbpf drops libbpf's debug messages (they go to stderr otherwise).
func quietLibbpf() {
	quietOnce.Do(func() {
		libbpfgo.SetLoggerCbs(libbpfgo.Callbacks{LogFilters: []func(int, string) bool{
			func(level int, _ string) bool { return level == libbpfgo.LibbpfDebugLevel },
		}})
	})
}

// Load opens and loads the BPF object at path (built by `make bpf`). The
// caller closes the module.
func Load(path string) (*libbpfgo.Module, error) {
	if _, err := os.Stat(path); err != nil {
		return nil, fmt.Errorf("load BPF object: %w (run `make bpf`)", err)
	}
	quietLibbpf()
	// NewModuleFromFile raises RLIMIT_MEMLOCK, which needs
	// CAP_SYS_RESOURCE; kernels >= 5.11 charge BPF memory to the cgroup.
	m, err := libbpfgo.NewModuleFromFileArgs(libbpfgo.NewModuleArgs{BPFObjPath: path, SkipMemlockBump: true})
	if err != nil {
		return nil, fmt.Errorf("open BPF object %s: %w", path, err)
	}
	if err := m.BPFLoadObject(); err != nil {
		m.Close()
		return nil, fmt.Errorf("load BPF object %s: %w", path, err)
	}
	return m, nil
}

// Map returns the named map of m.
func Map(m *libbpfgo.Module, name string) (*libbpfgo.BPFMap, error) {
	bm, err := m.GetMap(name)
	if err != nil {
		return nil, fmt.Errorf("find map %s: %w", name, err)
	}
	return bm, nil
}

// Prog returns the named program's fd.
func Prog(m *libbpfgo.Module, name string) (int, error) {
	p, err := m.GetProgram(name)
	if err != nil {
		return -1, fmt.Errorf("find program %s: %w", name, err)
	}
	return p.FileDescriptor(), nil
}

// testRunAttr is the BPF_PROG_TEST_RUN part of union bpf_attr
// (include/uapi/linux/bpf.h, struct test); x/sys/unix has no type for it.
type testRunAttr struct {
	progFD      uint32
	retval      uint32
	dataSizeIn  uint32
	dataSizeOut uint32
	dataIn      uint64
	dataOut     uint64
	repeat      uint32
	duration    uint32
	ctxSizeIn   uint32
	ctxSizeOut  uint32
	ctxIn       uint64
	ctxOut      uint64
	flags       uint32
	cpu         uint32
	batchSize   uint32
	_           uint32
}

const (
	bpfProgTestRun   = 10     // BPF_PROG_TEST_RUN
	bpfFTestRunOnCPU = 1 << 0 // BPF_F_TEST_RUN_ON_CPU
)

// run runs a raw_tp program once on cpu with args as its context
// (struct bpf_raw_tracepoint_args) and returns its return value. From
// another CPU the kernel runs it there in an IPI, with interrupts off; on
// the calling CPU, with interrupts on, so that each perf wakeup the program
// raises interrupts it.
func run(progFD, cpu int, args ...uint64) (uint32, error) {
	if len(args) == 0 {
		args = []uint64{0}
	}
	attr := testRunAttr{
		progFD:    uint32(progFD),
		ctxSizeIn: uint32(8 * len(args)),
		ctxIn:     uint64(uintptr(unsafe.Pointer(&args[0]))),
		flags:     bpfFTestRunOnCPU,
		cpu:       uint32(cpu),
	}
	_, _, errno := unix.Syscall(unix.SYS_BPF, bpfProgTestRun, uintptr(unsafe.Pointer(&attr)), unsafe.Sizeof(attr))
	runtime.KeepAlive(args)
	if errno != 0 {
		return 0, fmt.Errorf("bpf prog test run on cpu %d: %w", cpu, errno)
	}
	return attr.retval, nil
}

// Run runs a raw_tp program once on cpu with args as its context, as Emit
// does for the emitter, and returns its return value: for programs of
// other shapes (selftest/failures).
func Run(progFD, cpu int, args ...uint64) (uint32, error) { return run(progFD, cpu, args...) }

// emitBatch is EMIT_BATCH of emit.bpf.h: the most samples one run emits.
const emitBatch = 256

// Emit runs an emit_samples program (selftest/common/emit.bpf.h) on cpu:
// count samples, sample n of size + n%span bytes (span 0: all of size), in
// runs of at most emitBatch samples.
func Emit(progFD, cpu int, count, size, span uint64) error {
	for first := uint64(0); first < count; first += emitBatch {
		args := [4]uint64{min(count-first, emitBatch), size, span, first}
		ret, err := run(progFD, cpu, args[:]...)
		if err != nil {
			return fmt.Errorf("emit: %w", err)
		}
		if ret != 0 {
			return fmt.Errorf("emit %d samples of %d+%d bytes on cpu %d: program returned %d", args[0], size, span, cpu, ret)
		}
	}
	return nil
}

// EmitStats mirrors struct emit_stats: one CPU's counts since the program
// was loaded.
type EmitStats struct {
	Emitted uint64 // bpf_perf_event_output succeeded
	Failed  uint64 // it failed: the kernel counted the sample lost
	Seq     uint64 // next sequence number: Emitted + Failed
}

// Sub returns s - o, field by field.
func (s EmitStats) Sub(o EmitStats) EmitStats {
	return EmitStats{Emitted: s.Emitted - o.Emitted, Failed: s.Failed - o.Failed, Seq: s.Seq - o.Seq}
}

// emitStatsSize is sizeof(struct emit_stats).
const emitStatsSize = 24

// Stats reads the per-CPU emit_stats map of m, indexed by CPU.
func Stats(m *libbpfgo.Module) ([]EmitStats, error) {
	bm, err := Map(m, "emit_stats")
	if err != nil {
		return nil, err
	}
	var key uint32
	val, err := bm.GetValue(unsafe.Pointer(&key))
	if err != nil {
		return nil, fmt.Errorf("read emit_stats: %w", err)
	}
	out := make([]EmitStats, len(val)/emitStatsSize)
	for i := range out {
		b := val[i*emitStatsSize:]
		out[i] = EmitStats{
			Emitted: binary.NativeEndian.Uint64(b[0:]),
			Failed:  binary.NativeEndian.Uint64(b[8:]),
			Seq:     binary.NativeEndian.Uint64(b[16:]),
		}
	}
	return out, nil
}

// Emitter is a loaded object that includes emit.bpf.h: its perf event
// array, its emit program and the CPUs to emit on. It is not safe for
// concurrent use.
type Emitter struct {
	Mod    *libbpfgo.Module
	Events *libbpfgo.BPFMap // the perf event array "events"
	Prog   int              // the "emit" program's fd
	CPUs   []int            // the online CPUs: each has a ring
	Obj    string           // the object's path, for Copy

	copies []*Emitter // loaded by Copy, closed by CloseCopies
}

// Open loads the object at path and finds its emitter. Close it when done.
func Open(path string) (*Emitter, error) {
	m, err := Load(path)
	if err != nil {
		return nil, err
	}
	e, err := NewEmitter(m)
	if err != nil {
		m.Close()
		return nil, err
	}
	e.Obj = path
	return e, nil
}

// Copy returns copy i (from 0) of e: e.Obj loaded once more, so that it has
// a perf event array and an emit program of its own, for a reader that
// must not share e's map (a perf event array has one reader). A copy is
// loaded on first use and kept for the next call; CloseCopies, or Close,
// closes the copies.
func (e *Emitter) Copy(i int) (*Emitter, error) {
	if i < 0 {
		return nil, fmt.Errorf("emitter copy %d: negative index", i)
	}
	if e.Obj == "" {
		return nil, errors.New("emitter copy: the emitter has no object path (Obj)")
	}
	for len(e.copies) <= i {
		e.copies = append(e.copies, nil)
	}
	if e.copies[i] == nil {
		c, err := Open(e.Obj)
		if err != nil {
			return nil, fmt.Errorf("emitter copy %d: %w", i, err)
		}
		e.copies[i] = c
	}
	return e.copies[i], nil
}

// CloseCopies closes the copies that Copy loaded, not e itself.
func (e *Emitter) CloseCopies() {
	for _, c := range e.copies {
		if c != nil {
			c.Close()
		}
	}
	e.copies = nil
}

// NewEmitter finds the emitter in a loaded module; the caller keeps
// ownership of m.
func NewEmitter(m *libbpfgo.Module) (*Emitter, error) {
	events, err := Map(m, "events")
	if err != nil {
		return nil, err
	}
	prog, err := Prog(m, "emit")
	if err != nil {
		return nil, err
	}
	online, err := cpus.Online()
	if err != nil {
		return nil, err
	}
	return &Emitter{Mod: m, Events: events, Prog: prog, CPUs: online}, nil
}

// Emit emits count samples of size + i%span bytes on cpu.
func (e *Emitter) Emit(cpu int, count, size, span uint64) error {
	return Emit(e.Prog, cpu, count, size, span)
}

// Stats reads the emitter's per-CPU counts.
func (e *Emitter) Stats() ([]EmitStats, error) { return Stats(e.Mod) }

// Close unloads the object and its copies.
func (e *Emitter) Close() {
	e.CloseCopies()
	e.Mod.Close()
}

// Pin locks the calling goroutine to its thread and the thread to cpu, and
// returns the undo, to be called on the same goroutine.
func Pin(cpu int) (undo func(), err error) {
	runtime.LockOSThread()
	var old, set unix.CPUSet
	if err := unix.SchedGetaffinity(0, &old); err != nil {
		runtime.UnlockOSThread()
		return nil, fmt.Errorf("pin to cpu %d: get affinity: %w", cpu, err)
	}
	set.Set(cpu)
	if err := unix.SchedSetaffinity(0, &set); err != nil {
		runtime.UnlockOSThread()
		return nil, fmt.Errorf("pin to cpu %d: %w", cpu, err)
	}
	return func() {
		_ = unix.SchedSetaffinity(0, &old) // restoring a set we were in
		runtime.UnlockOSThread()
	}, nil
}
