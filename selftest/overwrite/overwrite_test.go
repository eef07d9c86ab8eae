// SPDX-License-Identifier: Apache-2.0

// Privileged selftests of overwritable rings, a flight recorder's low layers: backward
// perf rings opened by internal/kernel, paused and read by internal/snapshot (every
// kernel), and BPF ring buffers in overwrite mode (kernel 6.19: the 7.3 guest of `make
// vmtest`), whose producer page internal/snapshot reads at offsets the kernel does not
// publish: checked here against bpf_ringbuf_query. On kernels without the mode, the
// probe's error is checked instead.
package overwrite

import (
	"encoding/binary"
	"errors"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"unsafe"

	"github.com/perfbuf/perfbuf/internal/bpfrun"
	"github.com/perfbuf/perfbuf/internal/kernel"
	"github.com/perfbuf/perfbuf/internal/snapshot"
	"github.com/perfbuf/perfbuf/selftest/internal/bpftest"
	"golang.org/x/sys/unix"
)

const (
	backwardObj = "bpf/backward.bpf.o"
	rbObj       = "bpf/rbover.bpf.o"
	rbSize      = 64 << 10 // RING_SIZE of rbover.bpf.c
)

// backwardRings opens a backward ring of pages pages on each CPU of f, closed at cleanup.
func backwardRings(t *testing.T, f *bpftest.Fixture, pages int) *kernel.PerfRings {
	t.Helper()
	cpus := make([]int32, len(f.CPUs))
	for j, cpu := range f.CPUs {
		cpus[j] = int32(cpu)
	}
	p, err := kernel.OpenBackwardRings(f.Events.FileDescriptor(), kernel.PerfConfig{Pages: pages, PageSize: bpftest.Page, WakeupEvents: 1}, cpus)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for _, cpu := range cpus {
			_ = kernel.DeleteSlot(f.Events.FileDescriptor(), uint32(cpu))
		}
		p.Close()
	})
	return p
}

// perfRing is ring j of p as internal/snapshot reads it.
func perfRing(p *kernel.PerfRings, j int) snapshot.PerfRing {
	base, size := p.Ring(j)
	hdr := (*unix.PerfEventMmapPage)(base)
	return snapshot.PerfRing{Head: &hdr.Data_head, Data: unsafe.Slice((*byte)(unsafe.Add(base, hdr.Data_offset)), size)}
}

// pausedSnapshot pauses ring j, waits for the writers in flight, copies its records and
// resumes it: the protocol Perf's comment asks for.
func pausedSnapshot(t *testing.T, p *kernel.PerfRings, j int, buf []byte, from uint64) snapshot.Snapshot {
	t.Helper()
	if err := p.Pause(j, true); err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := p.Pause(j, false); err != nil {
			t.Error(err)
		}
	}()
	if err := kernel.WaitWriters(); err != nil {
		t.Fatal(err)
	}
	s, err := snapshot.Perf(perfRing(p, j), buf, nil, snapshot.PerfOptions{From: from})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// A backward ring keeps the newest records, never refusing an output for want of room
// (no reader consumes it); paused, it refuses them and, once resumed, reports them as a
// lost record. Every CPU's ring is opened; the program writes on the first.
func TestBackwardRing(t *testing.T) {
	f := bpftest.Setup(t, backwardObj)
	const pages = 2
	p := backwardRings(t, f, pages)
	cpu := f.CPUs[0]
	const size = 40 // a sample of 40 bytes
	rec := bpftest.RecordSize(size)
	ring := pages * bpftest.Page
	n := 3 * ring / rec // three times the ring
	start := f.Stats(t)[cpu]
	f.Emit(t, cpu, uint64(n), size, 0)
	mid := f.Stats(t)[cpu]
	if failed := mid.Failed - start.Failed; failed != 0 {
		t.Fatalf("%d of %d outputs to a backward ring failed; it overwrites, it never refuses", failed, n)
	}
	buf := make([]byte, ring)
	s := pausedSnapshot(t, p, 0, buf, 0)
	if s.Counts != (snapshot.Counts{}) {
		t.Errorf("counts %+v, want none", s.Counts)
	}
	// The newest records that fit whole: ring/rec of them, up to the last seq written.
	if want := ring / rec; len(s.Records) != want {
		t.Fatalf("%d records, want the newest %d (%d-byte records in %d bytes)", len(s.Records), want, rec, ring)
	}
	for i, r := range s.Records {
		h, err := bpftest.Check(r.Data, cpu)
		if err != nil || r.Type != snapshot.PerfRecordSample {
			t.Fatalf("record %d (type %d): %v", i, r.Type, err)
		}
		if want := mid.Seq - uint64(len(s.Records)-i); h.Seq != want {
			t.Fatalf("record %d: seq %d, want %d (the newest, oldest first)", i, h.Seq, want)
		}
	}
	t.Logf("cpu %d: %d samples written, the newest %d kept", cpu, n, len(s.Records))

	// Paused, the ring refuses outputs; resumed, it reports them lost before the next.
	if err := p.Pause(0, true); err != nil {
		t.Fatal(err)
	}
	f.Emit(t, cpu, 5, size, 0)
	if err := p.Pause(0, false); err != nil {
		t.Fatal(err)
	}
	paused := f.Stats(t)[cpu]
	if failed := paused.Failed - mid.Failed; failed != 5 {
		t.Errorf("%d of 5 outputs to a paused ring failed, want all", failed)
	}
	f.Emit(t, cpu, 1, size, 0)
	s = pausedSnapshot(t, p, 0, buf, s.End)
	if len(s.Records) != 2 || s.Records[0].Type != snapshot.PerfRecordLost || s.Records[0].Lost != 5 ||
		s.Records[1].Type != snapshot.PerfRecordSample {
		t.Fatalf("after the pause: %+v, want a lost record of 5, then a sample", s.Records)
	}
	if h, err := bpftest.Check(s.Records[1].Data, cpu); err != nil || h.Seq != paused.Seq {
		t.Errorf("sample after the pause: seq %d, %v; want %d", h.Seq, err, paused.Seq)
	}
}

// rbPositions mirrors rbover.bpf.c's struct positions.
type rbPositions struct {
	Overwrite, Producer, Consumer, Avail, Failed uint64
}

// On a kernel with the overwrite mode (6.19), internal/snapshot's offsets of the producer
// page's positions are the kernel's: what the mapped page holds at them is what
// bpf_ringbuf_query says, after records past the ring's size. The snapshot then holds the
// newest records, from overwrite_pos on. On older kernels, the probe says ErrUnsupported
// naming 6.19, and loading a map with the flag fails as it predicts.
func TestRingOverwrite(t *testing.T) {
	bpftest.RequirePrivileges(t)
	major, minor, err := kernel.Version()
	if err != nil {
		t.Fatal(err)
	}
	probe := kernel.ProbeRingOverwrite()
	if major < 6 || major == 6 && minor < 19 {
		if !errors.Is(probe, errors.ErrUnsupported) || !strings.Contains(probe.Error(), "6.19") {
			t.Fatalf("kernel %d.%d: probe: %v; want errors.ErrUnsupported naming 6.19", major, minor, probe)
		}
		m, err := bpfrun.Load(rbObj)
		if err == nil {
			m.Close()
			t.Fatalf("kernel %d.%d: a ring buffer with BPF_F_RB_OVERWRITE loaded; the probe said unsupported", major, minor)
		}
		if !errors.Is(err, syscall.EINVAL) {
			t.Logf("load error: %v (not EINVAL)", err)
		}
		t.Logf("kernel %d.%d: %v", major, minor, probe)
		return
	}
	if probe != nil {
		t.Fatalf("kernel %d.%d: probe: %v; want the overwrite mode", major, minor, probe)
	}
	m := bpftest.Load(t, rbObj)
	rb := bpftest.Map(t, m, "rb")
	info, err := kernel.GetMapInfo(rb.FileDescriptor())
	if err != nil {
		t.Fatal(err)
	}
	if info.Flags&kernel.MapFlagRBOverwrite == 0 || info.MaxEntries != rbSize {
		t.Fatalf("map info %+v: want BPF_F_RB_OVERWRITE and %d bytes", info, rbSize)
	}
	mp, err := kernel.MapRingBuffer(rb.FileDescriptor(), rbSize)
	if err != nil {
		t.Fatal(err)
	}
	defer mp.Close()
	prog := bpftest.Prog(t, m, "fill")
	const (
		size  = 100 // a 112-byte record
		batch = 256
		runs  = 8 // 2048 records, 229376 bytes: 3.5 rings
	)
	rec := uint64((size + 8 + 7) &^ 7)
	for r := range uint64(runs) {
		bpftest.Run(t, prog, 0, batch, size, r*batch)
	}
	var key uint32
	val, err := bpftest.Map(t, m, "positions").GetValue(unsafe.Pointer(&key))
	if err != nil {
		t.Fatal(err)
	}
	var q rbPositions
	if _, err := binary.Decode(val, binary.NativeEndian, &q); err != nil {
		t.Fatal(err)
	}
	page := mp.Producer()
	word := func(off uintptr) uint64 { return atomic.LoadUint64((*uint64)(unsafe.Add(page, off))) }
	prod, pending, over := word(snapshot.ProducerPosOffset), word(snapshot.PendingPosOffset), word(snapshot.OverwritePosOffset)
	t.Logf("query: overwrite %d, producer %d, consumer %d, avail %d, failed %d; page: producer %d, pending %d, overwrite %d",
		q.Overwrite, q.Producer, q.Consumer, q.Avail, q.Failed, prod, pending, over)
	if q.Failed != 0 {
		t.Errorf("%d outputs failed in overwrite mode", q.Failed)
	}
	if q.Producer != runs*batch*rec || q.Overwrite == 0 || q.Producer-q.Overwrite > rbSize {
		t.Fatalf("query: producer %d (want %d), overwrite %d: not a ring overwritten", q.Producer, runs*batch*rec, q.Overwrite)
	}
	if over != q.Overwrite {
		t.Errorf("overwrite_pos at offset %d of the producer page: %d; bpf_ringbuf_query(BPF_RB_OVERWRITE_POS): %d",
			snapshot.OverwritePosOffset, over, q.Overwrite)
	}
	if prod != q.Producer {
		t.Errorf("producer_pos at offset %d: %d; bpf_ringbuf_query(BPF_RB_PROD_POS): %d", snapshot.ProducerPosOffset, prod, q.Producer)
	}
	// pending_pos: the last reservation found every record before it committed.
	if pending != prod-rec {
		t.Errorf("pending_pos at offset %d: %d, want %d (the last record's position)", snapshot.PendingPosOffset, pending, prod-rec)
	}

	r := snapshot.BPFRingAt(mp.Consumer(), page, mp.Data())
	buf := make([]byte, rbSize)
	s, err := snapshot.BPF(r, buf, nil, snapshot.BPFOptions{Settle: kernel.WaitWriters})
	if err != nil {
		t.Fatal(err)
	}
	if s.Counts != (snapshot.Counts{}) || s.End != prod {
		t.Errorf("snapshot: counts %+v, end %d; want none, %d", s.Counts, s.End, prod)
	}
	want := (prod - over) / rec
	if uint64(len(s.Records)) != want || len(s.Records) == 0 || s.Records[0].Pos != over {
		t.Fatalf("snapshot: %d records, want %d from overwrite_pos %d", len(s.Records), want, over)
	}
	last := uint64(runs*batch) - 1
	for i, rec := range s.Records {
		seq := binary.NativeEndian.Uint64(rec.Data)
		if seq != last-uint64(len(s.Records)-1-i) || len(rec.Data) != size {
			t.Fatalf("record %d: seq %d, %d bytes; want %d, %d", i, seq, len(rec.Data), last-uint64(len(s.Records)-1-i), size)
		}
		for j := 8; j < size; j++ {
			if rec.Data[j] != byte(j*7) {
				t.Fatalf("record %d (seq %d): byte %d = %#x, want %#x", i, seq, j, rec.Data[j], byte(j*7))
			}
		}
	}
	t.Logf("snapshot: the newest %d of %d records, from overwrite_pos %d to producer_pos %d", len(s.Records), runs*batch, over, prod)
}
