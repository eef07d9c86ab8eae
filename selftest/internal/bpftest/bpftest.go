// Package bpftest loads the selftests' BPF programs and drives them with
// BPF_PROG_TEST_RUN, so that samples are emitted on a chosen CPU
// deterministically: no sleeps, no tracing noise.
package bpftest

import (
	"encoding/binary"
	"fmt"
	"os"
	"runtime"
	"testing"
	"unsafe"

	"github.com/aquasecurity/libbpfgo"
	"golang.org/x/sys/unix"
)

// RequirePrivileges skips the test when it cannot load BPF programs, except
// under CI (CI=true), where a privileged test that cannot run must fail.
func RequirePrivileges(tb testing.TB) {
	tb.Helper()
	reason := ""
	switch {
	case os.Geteuid() != 0:
		reason = "needs root (CAP_BPF, CAP_PERFMON)"
	default:
		if _, err := os.Stat("/sys/kernel/btf/vmlinux"); err != nil {
			reason = "needs kernel BTF: " + err.Error()
		}
	}
	if reason == "" {
		return
	}
	if os.Getenv("CI") == "true" {
		tb.Fatalf("privileged selftest cannot run under CI: %s", reason)
	}
	tb.Skipf("privileged selftest: %s", reason)
}

// Load opens and loads a BPF object built by `make bpf`, closed at cleanup.
func Load(tb testing.TB, path string) *libbpfgo.Module {
	tb.Helper()
	RequirePrivileges(tb)
	if _, err := os.Stat(path); err != nil {
		tb.Fatalf("BPF object %s missing (run `make bpf`): %v", path, err)
	}
	libbpfgo.SetLoggerCbs(libbpfgo.Callbacks{LogFilters: []func(int, string) bool{
		func(level int, _ string) bool { return level == libbpfgo.LibbpfDebugLevel },
	}})
	// NewModuleFromFile raises RLIMIT_MEMLOCK, which needs
	// CAP_SYS_RESOURCE; kernels >= 5.11 charge BPF memory to the cgroup.
	m, err := libbpfgo.NewModuleFromFileArgs(libbpfgo.NewModuleArgs{BPFObjPath: path, SkipMemlockBump: true})
	if err != nil {
		tb.Fatalf("open %s: %v", path, err)
	}
	tb.Cleanup(m.Close)
	if err := m.BPFLoadObject(); err != nil {
		tb.Fatalf("load %s: %v", path, err)
	}
	return m
}

// Map returns the named map of m.
func Map(tb testing.TB, m *libbpfgo.Module, name string) *libbpfgo.BPFMap {
	tb.Helper()
	bm, err := m.GetMap(name)
	if err != nil {
		tb.Fatalf("map %s: %v", name, err)
	}
	return bm
}

// Prog returns the named program's fd.
func Prog(tb testing.TB, m *libbpfgo.Module, name string) int {
	tb.Helper()
	p, err := m.GetProgram(name)
	if err != nil {
		tb.Fatalf("program %s: %v", name, err)
	}
	return p.FileDescriptor()
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

// Run runs a raw_tp program once on cpu with args as its context
// (struct bpf_raw_tracepoint_args) and returns its return value.
func Run(progFD, cpu int, args ...uint64) (uint32, error) {
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

// Emit runs an emit_samples program (selftest/common/emit.bpf.h) on cpu:
// count samples, of size + i%span bytes (span 0: all of size).
func Emit(tb testing.TB, progFD, cpu int, count, size, span uint64) {
	tb.Helper()
	ret, err := Run(progFD, cpu, count, size, span)
	if err != nil {
		tb.Fatal(err)
	}
	if ret != 0 {
		tb.Fatalf("emit on cpu %d returned %d", cpu, ret)
	}
}

// EmitStats mirrors struct emit_stats.
type EmitStats struct {
	Emitted, Failed, Seq uint64
}

// Stats reads the per-CPU emit_stats map.
func Stats(tb testing.TB, m *libbpfgo.Module) []EmitStats {
	tb.Helper()
	bm := Map(tb, m, "emit_stats")
	var key uint32
	val, err := bm.GetValue(unsafe.Pointer(&key))
	if err != nil {
		tb.Fatalf("read emit_stats: %v", err)
	}
	const size = 24
	out := make([]EmitStats, len(val)/size)
	for i := range out {
		b := val[i*size:]
		out[i] = EmitStats{
			Emitted: binary.LittleEndian.Uint64(b[0:]),
			Failed:  binary.LittleEndian.Uint64(b[8:]),
			Seq:     binary.LittleEndian.Uint64(b[16:]),
		}
	}
	return out
}

// Header is the start of every emitted sample (struct emit_hdr).
type Header struct {
	Seq, TS  uint64
	Len, CPU uint32
}

// HeaderSize is the size of struct emit_hdr.
const HeaderSize = 24

// Check verifies an emitted sample as received: its padded length, its
// header and its pattern. It returns the header, with Seq valid only when
// SeqValid(len(data)).
func Check(data []byte, cpu int) (Header, error) {
	var full [HeaderSize]byte
	copy(full[:], data)
	h := Header{
		Seq: binary.LittleEndian.Uint64(full[0:]),
		TS:  binary.LittleEndian.Uint64(full[8:]),
		Len: binary.LittleEndian.Uint32(full[16:]),
		CPU: binary.LittleEndian.Uint32(full[20:]),
	}
	// The kernel pads samples without clearing the padding, so a header
	// field is known only when the true size, more than len(data)-8,
	// covers it.
	if len(data)-8 < HeaderSize {
		return h, nil // too short to check more than its count
	}
	if h.CPU != uint32(cpu) {
		return h, fmt.Errorf("sample seq %d says cpu %d, delivered for cpu %d", h.Seq, h.CPU, cpu)
	}
	if want := PaddedSize(int(h.Len)); len(data) != want {
		return h, fmt.Errorf("sample seq %d of %d bytes delivered as %d, want %d", h.Seq, h.Len, len(data), want)
	}
	for i := HeaderSize; i < int(h.Len); i++ {
		want := byte(i * 7)
		if i < HeaderSize+8 {
			want += byte(h.Seq)
		}
		if data[i] != want {
			return h, fmt.Errorf("sample seq %d byte %d = %#x, want %#x", h.Seq, i, data[i], want)
		}
	}
	return h, nil
}

// PaddedSize is the raw size the kernel reports for an n-byte output:
// records stay 8-byte aligned, so u32 size + data round up to 8.
func PaddedSize(n int) int { return (n+4+7)&^7 - 4 }

// SeqValid says whether a sample delivered with n bytes holds a whole seq:
// its true size is more than n-8.
func SeqValid(n int) bool { return n-8 >= 8 }
