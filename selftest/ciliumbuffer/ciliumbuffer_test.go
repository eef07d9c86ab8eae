// SPDX-License-Identifier: Apache-2.0

// Privileged selftests of ciliumbuffer: selftest/bpfbuffer's program
// (PERFBUF_BUFFER, bpfbuffer.bpf.c) loaded with cilium/ebpf, its buffer
// prepared by ciliumbuffer.Prepare as each kind, and read by
// perfbuf.NewReader through ciliumbuffer.Map, with every attempt accounted
// for against what perfbuf reports. The package needs no cgo: it runs in
// builds with CGO_ENABLED=0 too.
package ciliumbuffer

import (
	"encoding/binary"
	"errors"
	"os"
	"runtime"
	"syscall"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/rlimit"
	"github.com/perfbuf/perfbuf"
	"github.com/perfbuf/perfbuf/bpfbuffer/ciliumbuffer"
	"github.com/perfbuf/perfbuf/internal/cpus"
	"github.com/perfbuf/perfbuf/selftest/internal/ledger"
	"golang.org/x/sys/unix"
)

// obj is selftest/bpfbuffer's program, built by `make bpf`.
const obj = "../bpfbuffer/bpf/bpfbuffer.bpf.o"

// The program's limits (bpfbuffer.bpf.c): the largest reserve
// (SAMPLE_MAX), the most records a run makes (BATCH), the ring's size as
// compiled (RING_SIZE).
const (
	sampleMax = 256
	batch     = 64
	ringSize  = 64 << 10
)

// How produce writes (enum how).
const (
	viaOutput  = iota // perfbuf_buffer_output
	viaReserve        // perfbuf_buffer_reserve, _submit
	viaDiscard        // the same, discarding every `every`-th
	viaTooBig         // perfbuf_buffer_reserve above SAMPLE_MAX
	viaInner          // perfbuf_ringbuf_output to an empty map-in-map slot
)

// testRunOnCPU is BPF_F_TEST_RUN_ON_CPU (include/uapi/linux/bpf.h), which
// x/sys/unix lacks.
const testRunOnCPU = 1

// spec loads the object's spec, not yet loaded into the kernel.
func spec(t *testing.T) *ebpf.CollectionSpec {
	t.Helper()
	s, err := ebpf.LoadCollectionSpec(obj)
	if err != nil {
		t.Fatalf("%v (run `make bpf`)", err)
	}
	return s
}

// privileged raises RLIMIT_MEMLOCK where the kernel charges maps to it
// (before 5.11; cilium/ebpf raises it only there), and skips the test if
// err, from creating a map or loading a program, says it lacks the
// privileges, unless under CI (CI=true), where a privileged test fails.
func privileged(t *testing.T, err error) {
	t.Helper()
	if err == nil {
		err = rlimit.RemoveMemlock()
	}
	if errors.Is(err, os.ErrPermission) && os.Getenv("CI") != "true" {
		t.Skipf("privileged selftest (needs CAP_BPF, CAP_PERFMON): %v", err)
	}
}

// load creates the collection of s, closed at cleanup; it skips without
// the privileges (fails under CI).
func load(t *testing.T, s *ebpf.CollectionSpec) *ebpf.Collection {
	t.Helper()
	privileged(t, nil)
	coll, err := ebpf.NewCollection(s)
	if err != nil {
		privileged(t, err)
		t.Fatalf("load %s: %v", obj, err)
	}
	t.Cleanup(coll.Close)
	return coll
}

type fixture struct {
	coll *ebpf.Collection
	kind ciliumbuffer.Kind
	cpus []int
}

// setup prepares the buffer as want with opts and more, and loads the
// object.
func setup(t *testing.T, want ciliumbuffer.Kind, opts *perfbuf.Options, more ...ciliumbuffer.Option) *fixture {
	t.Helper()
	s := spec(t)
	kind, err := ciliumbuffer.Prepare(s, "events", want, opts, more...)
	if err != nil {
		t.Fatal(err)
	}
	online, err := cpus.Online()
	if err != nil {
		t.Fatal(err)
	}
	return &fixture{coll: load(t, s), kind: kind, cpus: online}
}

// produce runs the program on cpu: count records of size bytes, how.
func (f *fixture) produce(t *testing.T, cpu int, count, size, how, every uint64) {
	t.Helper()
	prog := f.coll.Programs["produce"]
	for done := uint64(0); done < count; done += batch {
		ctx := []uint64{min(count-done, batch), size, how, every}
		ret, err := prog.Run(&ebpf.RunOptions{Context: ctx, CPU: uint32(cpu), Flags: testRunOnCPU})
		if err != nil || ret != 0 {
			t.Fatalf("run on cpu %d with %v: %d, %v", cpu, ctx, ret, err)
		}
	}
}

// outcomes reads the program's own counts, by CPU: the kernel returns one
// value per possible CPU, in the order of the possible CPUs.
func (f *fixture) outcomes(t *testing.T) map[int]ledger.Outcome {
	t.Helper()
	var vals []ledger.Outcome
	if err := f.coll.Maps["outcomes"].Lookup(uint32(0), &vals); err != nil {
		t.Fatal(err)
	}
	possible, err := cpus.Possible()
	if err != nil {
		t.Fatal(err)
	}
	out := map[int]ledger.Outcome{}
	for k, cpu := range possible {
		out[cpu] = vals[k]
	}
	return out
}

// delivered counts the samples a reader delivered, by the CPU each says
// it was written on, and checks the record's CPU: a ring buffer's records
// are every CPU's (-1), a perf ring's its CPU's.
func (f *fixture) consume(t *testing.T, r *perfbuf.Reader, got map[int]uint64) {
	t.Helper()
	var buf []byte
	if _, err := r.Consume(func(rec *perfbuf.Record) error {
		if rec.Type != perfbuf.RecordSample {
			return nil
		}
		buf = rec.AppendTo(buf[:0])
		if len(buf) < 16 {
			t.Fatalf("%d-byte sample", len(buf))
		}
		cpu := int(binary.NativeEndian.Uint32(buf[8:]))
		want := -1
		if f.kind == ciliumbuffer.PerfEventArray {
			want = cpu
		}
		if rec.CPU != want {
			t.Errorf("a sample written on cpu %d delivered for cpu %d, want %d", cpu, rec.CPU, want)
		}
		got[cpu]++
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}

// The program prepared by ciliumbuffer.Prepare as a ring buffer and as a
// perf event array (Any's ring per CPU: TestRingPerCPU), loaded by cilium/ebpf and
// read by perfbuf.NewReader over ciliumbuffer.Map with the same Options.
// On each CPU: outputs before the reader opens, outputs and reserves that
// reach the buffer, discards, reserves above the buffer's max sample
// (einval), outputs to a missing inner ring buffer (noent), a full ring
// (a ring buffer's full, a perf ring's lost samples), and samples left at
// Close. Every attempt is accounted for: per CPU for a perf event array,
// per ring (the CPUs' failures summed) for a ring buffer.
func TestBothKinds(t *testing.T) {
	for _, tc := range []struct {
		name string
		want ciliumbuffer.Kind
		got  ciliumbuffer.Kind
	}{
		{"ring buffer forced", ciliumbuffer.RingBuf, ciliumbuffer.RingBuf},
		{"perf forced", ciliumbuffer.PerfEventArray, ciliumbuffer.PerfEventArray},
	} {
		t.Run(tc.name, func(t *testing.T) {
			page := os.Getpagesize()
			// One page: a ring buffer of a page, or a page per CPU.
			opts := perfbuf.Options{RingBytes: page}
			f := setup(t, tc.want, &opts)
			if f.kind != tc.got {
				t.Fatalf("Prepare chose %v, want %v", f.kind, tc.got)
			}
			checkMaps(t, f)

			for _, cpu := range f.cpus {
				f.produce(t, cpu, 3, 48, viaOutput, 1) // before the reader: perf slots are empty
			}
			opts.FailureMap = ciliumbuffer.Map(f.coll.Maps["events_failures"])
			r, err := perfbuf.NewReader(ciliumbuffer.Map(f.coll.Maps["events"]), perfbuf.ReaderOptions{Options: opts})
			if err != nil {
				t.Fatal(err)
			}
			defer r.Close()
			got := map[int]uint64{}
			for _, cpu := range f.cpus {
				f.produce(t, cpu, 5, 48, viaOutput, 1)
				f.produce(t, cpu, 5, 32, viaReserve, 1)
				f.produce(t, cpu, 4, 200, viaReserve, 1) // 256-byte reserves
				f.produce(t, cpu, 8, 32, viaDiscard, 4)  // 2 discarded
				f.produce(t, cpu, 2, 32, viaTooBig, 1)
				f.produce(t, cpu, 3, 48, viaInner, 1)
			}
			f.consume(t, r, got)
			// A full ring: 40 records of 200 bytes fill a 4 KiB page; a
			// larger page takes as many more.
			for _, cpu := range f.cpus {
				f.produce(t, cpu, 40*uint64(page/4096), 200, viaOutput, 1)
			}
			f.consume(t, r, got)
			// A perf ring reports its lost samples once a later one fits.
			for _, cpu := range f.cpus {
				f.produce(t, cpu, 1, 48, viaOutput, 1)
			}
			f.consume(t, r, got)
			for _, cpu := range f.cpus {
				f.produce(t, cpu, 3, 48, viaOutput, 1) // left at Close
			}
			if err := r.Close(); err != nil {
				t.Fatal(err)
			}
			ledger.Check(t, f.kind == ciliumbuffer.RingBuf, f.cpus, f.outcomes(t), got, r.Stats())
		})
	}
}

// ciliumbuffer.NewReader is perfbuf.NewReader over ciliumbuffer.Map with
// the defaults: over either kind every output is delivered, a perf ring is
// 256 KiB (cilium/ebpf's 64 pages of 4 KiB), a ring buffer is its map's
// size; a nil map has no descriptor (EBADF).
func TestNewReader(t *testing.T) {
	for _, kind := range []ciliumbuffer.Kind{ciliumbuffer.RingBuf, ciliumbuffer.PerfEventArray} {
		t.Run(kind.String(), func(t *testing.T) {
			opts := perfbuf.Options{RingBytes: os.Getpagesize()}
			f := setup(t, kind, &opts)
			r, err := ciliumbuffer.NewReader(f.coll.Maps["events"])
			if err != nil {
				t.Fatal(err)
			}
			defer r.Close()
			got := map[int]uint64{}
			for _, cpu := range f.cpus {
				f.produce(t, cpu, 5, 48, viaOutput, 1)
			}
			f.consume(t, r, got)
			for _, cpu := range f.cpus {
				if got[cpu] != 5 {
					t.Errorf("cpu %d: %d samples delivered, want 5", cpu, got[cpu])
				}
			}
			size := os.Getpagesize() // the ring buffer's, as Prepare made it
			if kind == ciliumbuffer.PerfEventArray {
				size = 256 << 10
			}
			if st := r.Stats(); st.Rings[0].Size != size {
				t.Errorf("ring 0 of %d bytes, want %d", st.Rings[0].Size, size)
			}
		})
	}
	if _, err := ciliumbuffer.NewReader(nil); !errors.Is(err, syscall.EBADF) {
		t.Errorf("nil map: %v, want EBADF", err)
	}
}

// checkMaps checks what the object became: the buffer's type and size, and
// the scratch map's value (max_sample bytes for the perf path, one byte
// for a ring buffer, whose program never reaches it).
func checkMaps(t *testing.T, f *fixture) {
	t.Helper()
	events, err := f.coll.Maps["events"].Info()
	if err != nil {
		t.Fatal(err)
	}
	scratch, err := f.coll.Maps["events_scratch"].Info()
	if err != nil {
		t.Fatal(err)
	}
	possible, err := cpus.Possible()
	if err != nil {
		t.Fatal(err)
	}
	switch f.kind {
	case ciliumbuffer.RingBuf:
		if events.Type != ebpf.RingBuf || int(events.MaxEntries) != os.Getpagesize() || scratch.ValueSize != 1 {
			t.Errorf("events %v of %d bytes, events_scratch of %d-byte values; want a ring buffer of a page (RingBytes), scratch of 1",
				events.Type, events.MaxEntries, scratch.ValueSize)
		}
	case ciliumbuffer.PerfEventArray:
		if events.Type != ebpf.PerfEventArray || int(events.MaxEntries) != possible[len(possible)-1]+1 || scratch.ValueSize != sampleMax {
			t.Errorf("events %v of %d entries, events_scratch of %d-byte values; want a perf event array of %d, scratch of %d",
				events.Type, events.MaxEntries, scratch.ValueSize, possible[len(possible)-1]+1, sampleMax)
		}
	}
}

// A *ebpf.Map passed through ciliumbuffer.Map and then dropped: once
// NewReader has returned, the garbage collector closes the caller's
// descriptors (the buffer's and the failure map's), a hash map takes a
// freed number, and the Reader reads on from its own duplicates: every
// record is delivered, the failure map's counts are read, and the
// program's outputs after Close fail as the kind says (no reader).
func TestMapDropped(t *testing.T) {
	for _, want := range []ciliumbuffer.Kind{ciliumbuffer.RingBuf, ciliumbuffer.PerfEventArray} {
		t.Run(want.String(), func(t *testing.T) {
			opts := perfbuf.Options{}
			f := setup(t, want, &opts)
			events, failures := f.coll.DetachMap("events"), f.coll.DetachMap("events_failures")
			fds := []int{events.FD(), failures.FD()}
			opts.FailureMap = ciliumbuffer.Map(failures)
			r, err := perfbuf.NewReader(ciliumbuffer.Map(events), perfbuf.ReaderOptions{Options: opts})
			// Reachable until NewReader has returned (ciliumbuffer.Map).
			runtime.KeepAlive(events)
			runtime.KeepAlive(failures)
			if err != nil {
				t.Fatal(err)
			}
			defer r.Close()
			events, failures = nil, nil
			for _, fd := range fds {
				for i := 0; ; i++ {
					runtime.GC()
					if _, err := unix.FcntlInt(uintptr(fd), unix.F_GETFD, 0); errors.Is(err, unix.EBADF) {
						break
					}
					if i == 100 {
						t.Fatalf("fd %d still open after %d garbage collections", fd, i)
					}
				}
			}
			hash, err := ebpf.NewMap(&ebpf.MapSpec{Type: ebpf.Hash, KeySize: 4, ValueSize: 4, MaxEntries: 1})
			if err != nil {
				t.Fatal(err)
			}
			defer hash.Close()
			t.Logf("the caller's descriptors %v closed by the garbage collector; a hash map took %d", fds, hash.FD())

			before := f.outcomes(t)
			for _, cpu := range f.cpus {
				f.produce(t, cpu, 7, 48, viaOutput, 1)
				f.produce(t, cpu, 2, 32, viaTooBig, 1)
			}
			got := map[int]uint64{}
			f.consume(t, r, got)
			if err := r.Close(); err != nil {
				t.Fatal(err)
			}
			after := f.outcomes(t)
			st := r.Stats()
			samples, invalid := st.Samples, st.Failed.Invalid
			for _, cpu := range f.cpus {
				if ok := after[cpu].OK - before[cpu].OK; ok != 7 || got[cpu] != 7 || after[cpu].Inval != 2 {
					t.Errorf("cpu %d: %d output, %d delivered, %d reserves too big; want 7, 7, 2", cpu, ok, got[cpu], after[cpu].Inval)
				}
			}
			// The failure map, read through its own duplicate.
			if n := uint64(len(f.cpus)); samples != 7*n || invalid != 2*n {
				t.Errorf("Stats: %d samples, %d reserves too big; want %d, %d", samples, invalid, 7*n, 2*n)
			}
			// Closed, the reader is gone for the program: a ring buffer's
			// outputs fail as noent (the failure map's reader key), a perf
			// event array's too (no ring in the CPU's slot).
			f.produce(t, f.cpus[0], 1, 48, viaOutput, 1)
			if d := f.outcomes(t)[f.cpus[0]].NoEnt - after[f.cpus[0]].NoEnt; d != 1 {
				t.Errorf("an output after Close: %d failed as noent, want 1", d)
			}
		})
	}
}
