// SPDX-License-Identifier: Apache-2.0

package overwrite

import (
	"encoding/binary"
	"errors"
	"os"
	"strings"
	"testing"

	"github.com/aquasecurity/libbpfgo"
	"github.com/cilium/ebpf"
	"github.com/perfbuf/perfbuf"
	"github.com/perfbuf/perfbuf/bpfbuffer"
	"github.com/perfbuf/perfbuf/bpfbuffer/ciliumbuffer"
	"github.com/perfbuf/perfbuf/internal/cpus"
	"github.com/perfbuf/perfbuf/internal/kernel"
	"github.com/perfbuf/perfbuf/selftest/internal/bpftest"
)

const bufferObj = "bpf/buffer.bpf.o"

// openBuffer opens buffer.bpf.o with libbpfgo, not loaded; closed at
// cleanup.
func openBuffer(t *testing.T) *libbpfgo.Module {
	t.Helper()
	// libbpf's debug messages dropped, as bpftest.Load does.
	libbpfgo.SetLoggerCbs(libbpfgo.Callbacks{LogFilters: []func(int, string) bool{
		func(level int, _ string) bool { return level == libbpfgo.LibbpfDebugLevel },
	}})
	m, err := libbpfgo.NewModuleFromFileArgs(libbpfgo.NewModuleArgs{BPFObjPath: bufferObj, SkipMemlockBump: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(m.Close)
	return m
}

// produce runs the program on every online CPU: n records each, seq 0 on.
func produce(t *testing.T, prog int, online []int, n uint64) {
	t.Helper()
	for _, cpu := range online {
		for seq := uint64(0); seq < n; seq += 200 {
			bpftest.Run(t, prog, cpu, min(200, n-seq), seq)
		}
	}
}

// Prepare with RingBufPerCPU and Overwrite makes every ring in overwrite
// mode (kernel 6.19: the 7.3 guest), for both loaders, as Any does there,
// and a Recorder over
// the rings that bpfbuffer.Maps hands over returns each CPU's newest
// records, whole. Before 6.19 both loaders refuse the layout with
// errors.ErrUnsupported naming 6.19, and Any falls back to a perf event
// array, which a Recorder reads with backward rings.
func TestPrepareOverwrite(t *testing.T) {
	bpftest.RequirePrivileges(t)
	online, err := cpus.Online()
	if err != nil {
		t.Fatal(err)
	}
	const written = 600 // per CPU: 24-byte records, 170 in a ring of 4096
	spec, err := ebpf.LoadCollectionSpec(bufferObj)
	if err != nil {
		t.Fatal(err)
	}
	var copts perfbuf.Options
	ckind, cerr := ciliumbuffer.Prepare(spec, "events", ciliumbuffer.RingBufPerCPU, &copts, ciliumbuffer.Overwrite())
	m := openBuffer(t)
	var opts perfbuf.Options
	kind, err := bpfbuffer.Prepare(m, "events", bpfbuffer.RingBufPerCPU, &opts, bpfbuffer.Overwrite())
	if kernel.ProbeRingOverwrite() != nil {
		for name, err := range map[string]error{"bpfbuffer": err, "ciliumbuffer": cerr} {
			if !errors.Is(err, errors.ErrUnsupported) || !strings.Contains(err.Error(), "6.19") {
				t.Errorf("%s: Prepare(RingBufPerCPU, Overwrite) without overwrite mode = %v; want errors.ErrUnsupported naming 6.19", name, err)
			}
		}
		t.Logf("no overwrite mode: %v", err)
		m = openBuffer(t)
		if kind, err := bpfbuffer.Prepare(m, "events", bpfbuffer.Any, &opts, bpfbuffer.Overwrite()); kind != bpfbuffer.PerfEventArray || err != nil {
			t.Fatalf("Prepare(Any, Overwrite) without overwrite mode = %v, %v; want a perf event array", kind, err)
		}
	} else if err != nil || kind != bpfbuffer.RingBufPerCPU || cerr != nil || ckind != ciliumbuffer.RingBufPerCPU {
		t.Fatalf("Prepare(RingBufPerCPU, Overwrite): bpfbuffer %v, %v; ciliumbuffer %v, %v", kind, err, ckind, cerr)
	} else {
		// One ring buffer: libbpfgo sets no map flags, Prepare makes the
		// ring and has libbpf reuse it; prepared twice the same way, it
		// loads in overwrite mode.
		one := openBuffer(t)
		for i := range 2 {
			o := perfbuf.Options{RingBytes: 8192}
			if kind, err := bpfbuffer.Prepare(one, "events", bpfbuffer.RingBuf, &o, bpfbuffer.Overwrite()); kind != bpfbuffer.RingBuf || err != nil {
				t.Fatalf("Prepare #%d (RingBuf, Overwrite) = %v, %v; want a ring buffer", i+1, kind, err)
			}
		}
		// Any: a ring per CPU in overwrite mode, as the kernel has both.
		if kind, err := bpfbuffer.Prepare(openBuffer(t), "events", bpfbuffer.Any, nil, bpfbuffer.Overwrite()); kind != bpfbuffer.RingBufPerCPU || err != nil {
			t.Errorf("Prepare(Any, Overwrite) = %v, %v; want a ring per CPU", kind, err)
		}
		if err := one.BPFLoadObject(); err != nil {
			t.Fatal(err)
		}
		rb := bpftest.Map(t, one, "events")
		want := uint32(max(8192, os.Getpagesize())) // RingBytes rounded up to a page
		if info, err := kernel.GetMapInfo(rb.FileDescriptor()); err != nil || info.Flags&kernel.MapFlagRBOverwrite == 0 || info.MaxEntries != want {
			t.Errorf("the ring buffer: %+v, %v; want %d bytes in overwrite mode", info, err, want)
		}
	}
	if err := m.BPFLoadObject(); err != nil {
		t.Fatal(err)
	}
	events, opts, err := bpfbuffer.Maps(m, "events", opts)
	if err != nil {
		t.Fatal(err)
	}
	if ckind == ciliumbuffer.RingBufPerCPU {
		// cilium/ebpf's rings carry the flag too.
		coll, err := ebpf.NewCollection(spec)
		if err != nil {
			t.Fatal(err)
		}
		defer coll.Close()
		cm, _, err := ciliumbuffer.Maps(coll, "events", copts)
		if err != nil {
			t.Fatal(err)
		}
		if info, err := kernel.GetMapInfo(cm.FileDescriptor()); err != nil || info.Flags&kernel.MapFlagRBOverwrite == 0 {
			t.Errorf("ciliumbuffer's ring: %+v, %v; want BPF_F_RB_OVERWRITE", info, err)
		}
	}
	for i, mm := range append([]perfbuf.Map{events}, opts.Maps...) {
		info, err := kernel.GetMapInfo(mm.FileDescriptor())
		if err != nil {
			t.Fatal(err)
		}
		if over := info.Flags&kernel.MapFlagRBOverwrite != 0; over != (kind == bpfbuffer.RingBufPerCPU) {
			t.Errorf("ring %d (%s): flags %#x", i, info.Name, info.Flags)
		}
	}
	rec, err := perfbuf.NewRecorder(events, opts)
	if err != nil {
		t.Fatal(err)
	}
	defer rec.Close()
	produce(t, bpftest.Prog(t, m, "produce"), online, written)
	recs, err := rec.Snapshot(make([]byte, 1<<20), nil, false)
	if err != nil {
		t.Fatal(err)
	}
	// Each CPU's records: the newest, whole and in order, up to the last.
	last := map[uint32]uint64{}
	count := map[uint32]int{}
	for _, r := range recs {
		if r.Type != perfbuf.RecordSample || len(r.Data) < 16 {
			t.Fatalf("record %+v", r)
		}
		seq, cpu := binary.NativeEndian.Uint64(r.Data), binary.NativeEndian.Uint32(r.Data[8:])
		if n, ok := last[cpu]; ok && seq != n+1 {
			t.Fatalf("cpu %d: seq %d after %d", cpu, seq, n)
		}
		last[cpu], count[cpu] = seq, count[cpu]+1
	}
	for _, cpu := range online {
		if last[uint32(cpu)] != written-1 || count[uint32(cpu)] < 100 {
			t.Errorf("cpu %d: %d records up to seq %d; want the newest, up to %d", cpu, count[uint32(cpu)], last[uint32(cpu)], written-1)
		}
		t.Logf("cpu %d: the newest %d of %d", cpu, count[uint32(cpu)], written)
	}
}
