// SPDX-License-Identifier: Apache-2.0

package hotplug

import (
	"encoding/binary"
	"os"
	"slices"
	"testing"

	"github.com/aquasecurity/libbpfgo"
	"github.com/perfbuf/perfbuf"
	"github.com/perfbuf/perfbuf/bpfbuffer"
	"github.com/perfbuf/perfbuf/internal/bpfrun"
	"github.com/perfbuf/perfbuf/internal/cpus"
	"github.com/perfbuf/perfbuf/selftest/internal/bpftest"
)

// rbObj is a PERFBUF_BUFFER written with perfbuf_buffer_output: produce
// writes args[0] records (at most 64) of 16 bytes, u64 seq then u32 cpu.
const rbObj = "bpf/ringpercpu.bpf.o"

// A ring buffer per CPU (bpfbuffer.RingBufPerCPU) has a ring for every
// possible CPU from Prepare on. A CPU that is offline when the object
// loads and when the Reader opens, then comes online, writes its own
// ring, which the Reader has read from the start: nothing to open, every
// record delivered from its CPU's ring, nothing failed.
func TestHotplugRingPerCPU(t *testing.T) {
	if os.Getenv("PERFBUF_VMTEST") != "1" {
		t.Skip("takes a CPU offline: only inside a VM (make vmtest), never on the host")
	}
	bpftest.RequirePrivileges(t)
	online, err := cpus.Online()
	if err != nil {
		t.Fatal(err)
	}
	possible, err := cpus.Possible()
	if err != nil {
		t.Fatal(err)
	}
	if len(online) < 2 {
		t.Fatalf("online cpus %v: need two", online)
	}
	cpu := online[len(online)-1]
	t.Cleanup(func() { setOnline(t, cpu, true) })
	setOnline(t, cpu, false)

	m, err := libbpfgo.NewModuleFromFileArgs(libbpfgo.NewModuleArgs{BPFObjPath: rbObj, SkipMemlockBump: true})
	if err != nil {
		t.Fatalf("%v (run `make bpf`)", err)
	}
	t.Cleanup(m.Close)
	opts := perfbuf.Options{RingBytes: bpftest.RingBytes(4)}
	if kind, err := bpfbuffer.Prepare(m, "events", bpfbuffer.RingBufPerCPU, &opts); err != nil || kind != bpfbuffer.RingBufPerCPU {
		t.Fatalf("Prepare = %v, %v", kind, err)
	}
	if err := m.BPFLoadObject(); err != nil {
		t.Fatal(err)
	}
	events, ropts, err := bpfbuffer.Maps(m, "events", opts)
	if err != nil {
		t.Fatal(err)
	}
	r, err := perfbuf.NewReader(events, perfbuf.ReaderOptions{Options: ropts})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if n := len(r.Stats().Rings); n < len(possible) {
		t.Fatalf("%d rings, want one for each of %d possible cpus", n, len(possible))
	}
	setOnline(t, cpu, true)
	now, err := cpus.Online()
	if err != nil {
		t.Fatal(err)
	}
	prog := bpftest.Prog(t, m, "produce")
	const each = 20
	for _, c := range now {
		if _, err := bpfrun.Run(prog, c, each); err != nil {
			t.Fatal(err)
		}
	}
	got := map[int]int{}
	if _, err := r.Consume(func(rec *perfbuf.Record) error {
		if rec.Type != perfbuf.RecordSample {
			return nil
		}
		data := rec.AppendTo(nil)
		c := int(binary.NativeEndian.Uint32(data[8:]))
		if want := slices.Index(possible, c); rec.Ring != want {
			t.Errorf("a record of cpu %d in ring %d, want %d", c, rec.Ring, want)
		}
		got[c]++
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	for _, c := range now {
		if got[c] != each {
			t.Errorf("cpu %d: delivered %d, want %d", c, got[c], each)
		}
	}
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	// The sums: every ring's, and every CPU's failures.
	if st := r.Stats(); st.Failed.Total() != 0 || st.Left != 0 {
		t.Errorf("Stats %+v: want nothing failed or left", st)
	}
	t.Logf("cpu %d, offline at load, delivered %d from its ring %d", cpu, got[cpu], slices.Index(possible, cpu))
}
