// SPDX-License-Identifier: Apache-2.0

// Package bpftest loads the selftests' BPF programs and drives them with
// BPF_PROG_TEST_RUN, so that samples are emitted on a chosen CPU
// deterministically: no sleeps, no tracing noise. It is internal/bpfrun
// with testing.TB: errors fail the test, cleanups close what it opened.
package bpftest

import (
	"encoding/binary"
	"fmt"
	"os"
	"runtime"
	"strings"
	"testing"
	"time"
	"unsafe"

	"github.com/aquasecurity/libbpfgo"
	"github.com/perfbuf/perfbuf/internal/bpfrun"
	"github.com/perfbuf/perfbuf/internal/cpus"
)

// RequirePrivileges skips the test when it cannot load BPF programs, except
// under CI (CI=true), where a privileged test that cannot run must fail.
func RequirePrivileges(tb testing.TB) {
	tb.Helper()
	err := bpfrun.CheckPrivileges()
	if err == nil {
		return
	}
	if os.Getenv("CI") == "true" {
		tb.Fatalf("privileged selftest cannot run under CI: %v", err)
	}
	tb.Skipf("privileged selftest: %v", err)
}

// Load opens and loads a BPF object built by `make bpf`, closed at cleanup.
func Load(tb testing.TB, path string) *libbpfgo.Module {
	tb.Helper()
	RequirePrivileges(tb)
	m, err := bpfrun.Load(path)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(m.Close)
	return m
}

// Map returns the named map of m.
func Map(tb testing.TB, m *libbpfgo.Module, name string) *libbpfgo.BPFMap {
	tb.Helper()
	bm, err := bpfrun.Map(m, name)
	if err != nil {
		tb.Fatal(err)
	}
	return bm
}

// Prog returns the named program's fd.
func Prog(tb testing.TB, m *libbpfgo.Module, name string) int {
	tb.Helper()
	fd, err := bpfrun.Prog(m, name)
	if err != nil {
		tb.Fatal(err)
	}
	return fd
}

// Emit runs an emit_samples program (selftest/common/emit.bpf.h) on cpu:
// count samples, of size + i%span bytes (span 0: all of size).
func Emit(tb testing.TB, progFD, cpu int, count, size, span uint64) {
	tb.Helper()
	if err := bpfrun.Emit(progFD, cpu, count, size, span); err != nil {
		tb.Fatal(err)
	}
}

// Run runs a raw_tp program once on cpu with args as its context
// (struct bpf_raw_tracepoint_args) and fails the test if the run fails or
// the program returns non-zero.
func Run(tb testing.TB, progFD, cpu int, args ...uint64) {
	tb.Helper()
	ret, err := bpfrun.Run(progFD, cpu, args...)
	if err != nil {
		tb.Fatal(err)
	}
	if ret != 0 {
		tb.Fatalf("program run on cpu %d with args %v returned %d", cpu, args, ret)
	}
}

// EmitStats mirrors struct emit_stats.
type EmitStats = bpfrun.EmitStats

// Stats reads the per-CPU emit_stats map.
func Stats(tb testing.TB, m *libbpfgo.Module) []EmitStats {
	tb.Helper()
	st, err := bpfrun.Stats(m)
	if err != nil {
		tb.Fatal(err)
	}
	return st
}

// PerCPU reads key 0 of the BPF_MAP_TYPE_PERCPU_ARRAY mapName of m, whose
// value is a struct that T mirrors (fixed-size fields, host byte order),
// and returns it by CPU number: libbpf returns one value per possible CPU,
// in the order of the possible CPUs.
func PerCPU[T any](tb testing.TB, m *libbpfgo.Module, mapName string) map[int]T {
	tb.Helper()
	return PerCPUAt[T](tb, m, mapName, 0)
}

// PerCPUAt is PerCPU of key, not key 0.
func PerCPUAt[T any](tb testing.TB, m *libbpfgo.Module, mapName string, key uint32) map[int]T {
	tb.Helper()
	val, err := Map(tb, m, mapName).GetValue(unsafe.Pointer(&key))
	if err != nil {
		tb.Fatalf("map %s: %v", mapName, err)
	}
	possible, err := cpus.Possible()
	if err != nil {
		tb.Fatal(err)
	}
	var zero T
	size := binary.Size(zero)
	if len(val) != size*len(possible) {
		tb.Fatalf("map %s: %d bytes for %d possible cpus of %d bytes", mapName, len(val), len(possible), size)
	}
	out := make(map[int]T, len(possible))
	for k, cpu := range possible {
		var v T
		if _, err := binary.Decode(val[k*size:(k+1)*size], binary.NativeEndian, &v); err != nil {
			tb.Fatalf("map %s: cpu %d: %v", mapName, cpu, err)
		}
		out[cpu] = v
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
		Seq: binary.NativeEndian.Uint64(full[0:]),
		TS:  binary.NativeEndian.Uint64(full[8:]),
		Len: binary.NativeEndian.Uint32(full[16:]),
		CPU: binary.NativeEndian.Uint32(full[20:]),
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

// RecordSize is the ring space an n-byte output takes: the 8-byte
// perf_event_header, the u32 raw size and the padded data.
func RecordSize(n int) int { return 8 + 4 + PaddedSize(n) }

// RecorderRecordSize is the ring space an n-byte output takes in a
// Recorder's backward ring, whose samples carry their time besides: 8
// bytes more than RecordSize.
func RecorderRecordSize(n int) int { return RecordSize(n) + 8 }

// SeqValid says whether a sample delivered with n bytes holds a whole seq:
// its true size is more than n-8.
func SeqValid(n int) bool { return n-8 >= 8 }

// Page is the host's page size. The selftests size their rings in pages
// (RingBytes) and their loads by Scale, so that they test the same thing
// on 4 KiB, 16 KiB and 64 KiB pages: a ring is at least one page, and a
// ring sized in bytes for 4 KiB pages is a quarter of what a test meant on
// 16 KiB pages, or a page where it meant two.
var Page = os.Getpagesize()

// RingBytes is the Options.RingBytes of rings of n pages.
func RingBytes(pages int) int { return pages * Page }

// Scale is how many 4 KiB pages one page holds: a load written for rings
// of 4 KiB pages (samples to fill or overflow a ring) multiplies its count
// by it.
func Scale() int { return max(Page/4096, 1) }

// OpenFDs returns how many descriptors this process holds: a test compares
// the counts before and after to find a descriptor left open. It first
// lets the garbage collector finalize what earlier tests dropped (a
// *ebpf.Map or a libbpfgo module closes its descriptors then), so that
// those closes do not land between the two counts.
func OpenFDs(tb testing.TB) int {
	tb.Helper()
	for range 3 {
		runtime.GC()
		time.Sleep(5 * time.Millisecond) // the finalizers run on a goroutine of their own
	}
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		tb.Fatal(err)
	}
	return len(ents)
}

// Parked reports whether, within d, a goroutine is parked in the netpoller
// ("IO wait") inside fn, a function as a stack trace names it
// ("perfbuf.(*Reader).ReadBatch"): a read waiting on the rings' wakeup.
// A test that must output only once a read waits (so that the kernel's
// wakeup finds the record, not the read's first look) waits for this,
// rather than sleeping and hoping the read got there first.
func Parked(fn string, d time.Duration) bool {
	buf := make([]byte, 1<<20)
	for end := time.Now().Add(d); time.Now().Before(end); time.Sleep(time.Millisecond) {
		for _, g := range strings.Split(string(buf[:runtime.Stack(buf, true)]), "\n\n") {
			if strings.Contains(g, "[IO wait") && strings.Contains(g, fn) {
				return true
			}
		}
	}
	return false
}
