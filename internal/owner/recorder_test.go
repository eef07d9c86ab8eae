// SPDX-License-Identifier: Apache-2.0

package owner

import (
	"encoding/binary"
	"errors"
	"fmt"
	"github.com/perfbuf/perfbuf/internal/ring"
	"io"
	"os"
	"strings"
	"syscall"
	"testing"
	"unsafe"

	"github.com/perfbuf/perfbuf/internal/kernel"
	"github.com/perfbuf/perfbuf/internal/snapshot"
)

// fakeBackward is a backward perf ring in Go memory, written as the kernel
// writes one: each record below the last, data_head going down from 0.
type fakeBackward struct {
	head uint64
	data []byte
}

func newFakeBackward(size int) *fakeBackward {
	words := make([]uint64, size/8)
	return &fakeBackward{data: unsafe.Slice((*byte)(unsafe.Pointer(&words[0])), size)}
}

// fakeClock is the time the fake rings' samples carry, one tick a sample.
var fakeClock uint64

// sample writes a PERF_RECORD_SAMPLE of payload p (a multiple of 8 bytes
// minus 4, as the kernel pads it) at the next tick of fakeClock.
func (f *fakeBackward) sample(p []byte) {
	fakeClock++
	f.sampleAt(fakeClock, p)
}

// sampleAt writes a sample of PERF_SAMPLE_TIME | PERF_SAMPLE_RAW, as the
// Recorder's events make them: the time, then the raw data p.
func (f *fakeBackward) sampleAt(time uint64, p []byte) {
	var rec []byte
	rec = binary.NativeEndian.AppendUint64(rec, time)
	rec = binary.NativeEndian.AppendUint32(rec, uint32(len(p)))
	f.record(snapshot.PerfRecordSample, append(rec, p...))
}

// lostThen writes a PERF_RECORD_LOST of n samples and a sample p at time,
// as the kernel writes them after refused outputs: in one reservation, the
// lost record below the sample.
func (f *fakeBackward) lostThen(n, time uint64, p []byte) {
	f.sampleAt(time, p)
	var body []byte
	body = binary.NativeEndian.AppendUint64(body, 0) // id
	body = binary.NativeEndian.AppendUint64(body, n)
	f.record(snapshot.PerfRecordLost, body)
}

// record writes a record of type typ and body below the last one.
func (f *fakeBackward) record(typ uint32, body []byte) {
	rsize := uint64(8 + len(body))
	f.head -= rsize
	mask := uint64(len(f.data) - 1)
	var rec []byte
	rec = binary.NativeEndian.AppendUint32(rec, typ)
	rec = binary.NativeEndian.AppendUint16(rec, 0)
	rec = binary.NativeEndian.AppendUint16(rec, uint16(rsize))
	rec = append(rec, body...)
	for i, b := range rec {
		f.data[(f.head+uint64(i))&mask] = b
	}
}

func (f *fakeBackward) ring() snapshot.PerfRing {
	return snapshot.PerfRing{Head: &f.head, Data: f.data}
}

// recPayload is a 12-byte sample payload holding n.
func recPayload(n byte) []byte { return []byte{n, n, n, n, n, n, n, n, n, n, n, n} }

// fakeRecorder is a Recorder over fake perf rings (nothing to pause).
func fakeRecorder(rings ...*fakeBackward) *Recorder {
	r := &Recorder{mapFD: -1, what: "fake", pause: pauser{grace: kernel.WaitWriters}}
	for i, f := range rings {
		r.rings = append(r.rings, recRing{perf: f.ring(), stats: Stats{Ring: i, CPU: i, Size: len(f.data)}})
	}
	return r
}

// A snapshot returns every ring's newest records, oldest first; the buffer
// is shared out, what a ring leaves going to the next; onlyNew leaves out
// what the last snapshot read; what does not fit is counted in Skipped.
func TestRecorderSnapshot(t *testing.T) {
	a, b := newFakeBackward(256), newFakeBackward(256)
	for n := range byte(30) { // 30 records of 32 bytes: the newest 8 whole in 256
		a.sample(recPayload(n))
	}
	b.sample(recPayload(100))
	r := fakeRecorder(a, b)
	defer r.Close()

	check := func(recs []Record, want ...byte) {
		t.Helper()
		var got []byte
		for _, rec := range recs {
			if rec.Type != ring.Sample || len(rec.Data) != 12 || rec.CPU != rec.Ring {
				t.Fatalf("record %+v", rec)
			}
			got = append(got, rec.Data[0])
		}
		if string(got) != string(want) {
			t.Fatalf("records %v, want %v", got, want)
		}
	}
	// A record takes 32 bytes in its ring, 24 in buf (its time, size and
	// payload). Ring 1 holds less than half of 192 bytes and gets what it
	// holds (32), ring 0 the rest (160: its newest 6).
	buf := make([]byte, 192)
	recs, err := r.Snapshot(buf, nil, false)
	if err != nil {
		t.Fatal(err)
	}
	check(recs, 24, 25, 26, 27, 28, 29, 100)
	st := r.Stats()
	if st[0].Samples != 6 || st[0].Skipped != 2 || st[1].Samples != 1 || st[0].Bytes != 6*12 {
		t.Errorf("stats %+v", st)
	}
	// A buffer of ring 0's records and ring 1's window holds them all.
	recs, err = r.Snapshot(make([]byte, 8*24+32), recs[:0], false)
	if err != nil {
		t.Fatal(err)
	}
	check(recs, 22, 23, 24, 25, 26, 27, 28, 29, 100)

	a.sample(recPayload(30))
	recs, err = r.Snapshot(buf, recs[:0], true)
	if err != nil {
		t.Fatal(err)
	}
	check(recs, 30)

	// No room for one record: io.ErrShortBuffer, and the other ring's.
	b.sample(recPayload(101))
	recs, err = r.Snapshot(make([]byte, 2*24-8), recs[:0], false)
	if !errors.Is(err, io.ErrShortBuffer) || !strings.Contains(err.Error(), "ring 0") {
		t.Fatalf("short buffer: %v", err)
	}
	check(recs, 101)

	r.Close()
	if _, err := r.Snapshot(buf, nil, false); !errors.Is(err, os.ErrClosed) {
		t.Errorf("after Close: %v", err)
	}
	if err := r.SetPaused("pause", true); !errors.Is(err, os.ErrClosed) {
		t.Errorf("Pause after Close: %v", err)
	}
}

// A perf event array's snapshot merges its rings by the kernel's time of
// each sample, which Key carries; a lost record keeps its place before the
// sample it was written with.
func TestRecorderSnapshotMerged(t *testing.T) {
	a, b := newFakeBackward(512), newFakeBackward(512)
	a.sampleAt(10, recPayload(1))
	b.sampleAt(20, recPayload(2))
	a.sampleAt(30, recPayload(3))
	b.lostThen(7, 40, recPayload(4))
	a.sampleAt(40, recPayload(5)) // a tie: ring 0's first
	b.sampleAt(60, recPayload(6))
	a.lostThen(2, 50, recPayload(7))
	r := fakeRecorder(a, b)
	defer r.Close()
	recs, err := r.Snapshot(make([]byte, 512), nil, false)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, rec := range recs {
		if rec.Type == ring.Lost {
			got = append(got, fmt.Sprintf("lost %d@%d", rec.Lost, rec.Key))
		} else {
			got = append(got, fmt.Sprintf("%d@%d", rec.Data[0], rec.Key))
		}
	}
	want := "[1@10 2@20 3@30 5@40 lost 7@40 4@40 lost 2@50 7@50 6@60]"
	if fmt.Sprint(got) != want {
		t.Errorf("snapshot %v, want %v", got, want)
	}
}

// Ring buffers: a Recorder reads only those in overwrite mode, and the
// other owners refuse them.
func TestCheckRingBufOverwrite(t *testing.T) {
	over := mapDesc{typ: mapTypeRingBuf, maxEntries: 4096, flags: kernel.MapFlagRBOverwrite, name: "rec"}
	plain := over
	plain.flags = 0
	err := RingOptions{}.checkRingBuf(over)
	if !errors.Is(err, errors.ErrUnsupported) || !strings.Contains(err.Error(), `ring buffer "rec" is in overwrite mode`) {
		t.Errorf("reader over an overwrite-mode ring buffer: %v", err)
	}
	if err := (RingOptions{overwrite: true}).checkRingBuf(over); err != nil {
		t.Errorf("recorder: %v", err)
	}
	// A Recorder moves no ring buffer's consumer position, which the
	// kernel's wakeups count from: neither wakeup setting applies.
	for _, ro := range []RingOptions{{overwrite: true, WakeupBytes: 64}, {overwrite: true, WakeupEvents: 2}} {
		err := ro.checkRingBuf(over)
		if !errors.Is(err, os.ErrInvalid) || !strings.Contains(err.Error(), `ring buffer "rec"`) || !strings.Contains(err.Error(), "options Wakeup") {
			t.Errorf("recorder with %+v: %v, want os.ErrInvalid naming the field and the map", ro, err)
		}
	}
	err = RingOptions{overwrite: true}.checkRingBuf(plain)
	if !errors.Is(err, os.ErrInvalid) && !errors.Is(err, errors.ErrUnsupported) || !strings.Contains(err.Error(), `ring buffer "rec"`) {
		t.Errorf("recorder over a ring buffer not in overwrite mode: %v", err)
	}
	// The error names the fix: bpfbuffer's or ciliumbuffer's Overwrite
	// option (Any with it where the kernel has no overwrite mode).
	if !strings.Contains(err.Error(), "Overwrite()") {
		t.Errorf("recorder over a ring buffer not in overwrite mode: %v; want it naming Prepare(..., Overwrite())", err)
	}
	// (Under qemu-user, as make test-bigendian runs this, bpf(2) itself
	// is ENOSYS: no kernel to name.)
	if errors.Is(err, errors.ErrUnsupported) && !errors.Is(err, syscall.ENOSYS) && !strings.Contains(err.Error(), "6.19") {
		t.Errorf("unsupported without naming 6.19: %v", err)
	}
	t.Log(err)
}

// fakeRingBuf is a BPF ring buffer in Go memory, committed records only.
type fakeRingBuf struct {
	cons uint64
	prod [3]uint64 // producer_pos, pending_pos, overwrite_pos
	data []byte
}

func newFakeRingBuf(size int) *fakeRingBuf {
	words := make([]uint64, size/8)
	return &fakeRingBuf{data: unsafe.Slice((*byte)(unsafe.Pointer(&words[0])), size)}
}

// output commits a record of payload p.
func (f *fakeRingBuf) output(p []byte) {
	mask := uint64(len(f.data) - 1)
	var rec []byte
	rec = binary.NativeEndian.AppendUint32(rec, uint32(len(p)))
	rec = binary.NativeEndian.AppendUint32(rec, 0)
	rec = append(rec, p...)
	for i, b := range rec {
		f.data[(f.prod[0]+uint64(i))&mask] = b
	}
	f.prod[0] += uint64(len(rec)+7) &^ 7
}

// Over ring buffers, the shares go the same way: a ring buffer fills its
// part from the start, and what it leaves goes to the next.
func TestRecorderSnapshotRingBufs(t *testing.T) {
	a, b := newFakeRingBuf(512), newFakeRingBuf(512)
	for n := range byte(10) {
		a.output(recPayload(n)) // 24 bytes a record in the ring, 12 in buf
	}
	b.output(recPayload(100))
	r := &Recorder{mapFD: -1, what: "fake", pause: pauser{grace: kernel.WaitWriters}}
	for i, f := range []*fakeRingBuf{a, b} {
		r.rings = append(r.rings, recRing{bpf: snapshot.BPFRingAt(unsafe.Pointer(&f.cons), unsafe.Pointer(&f.prod), f.data),
			stats: Stats{Ring: i, CPU: -1, Size: len(f.data)}})
	}
	defer r.Close()
	// 120 bytes: ring 1 holds 24 of them, ring 0 gets 96, 8 records; ring 1
	// then has 24 bytes from where ring 0's end.
	buf := make([]byte, 120)
	recs, err := r.Snapshot(buf, nil, false)
	if err != nil {
		t.Fatal(err)
	}
	var got []byte
	for _, rec := range recs {
		got = append(got, rec.Data[0])
		if len(rec.Data) != 12 || rec.CPU != -1 {
			t.Fatalf("record %+v", rec)
		}
	}
	if want := []byte{2, 3, 4, 5, 6, 7, 8, 9, 100}; string(got) != string(want) {
		t.Fatalf("records %v, want %v", got, want)
	}
	if recs[len(recs)-1].Data[0] != 100 || &recs[len(recs)-1].Data[0] != &buf[96] {
		t.Errorf("ring 1's record not right after ring 0's in buf")
	}
	if st := r.Stats(); st[0].Samples != 8 || st[0].Skipped != 2 || st[1].Samples != 1 {
		t.Errorf("stats %+v", st)
	}
	a.output(recPayload(10))
	if recs, err = r.Snapshot(buf, recs[:0], true); err != nil || len(recs) != 1 || recs[0].Data[0] != 10 || recs[0].Ring != 0 {
		t.Fatalf("only new: %+v, %v", recs, err)
	}
	if err := r.SetPaused("pause", true); !errors.Is(err, errors.ErrUnsupported) {
		t.Errorf("Pause over ring buffers: %v", err)
	}
}

// Ring buffers pause through the reader key of the FailureMap: Pause
// marks it closed when the Recorder is its only reader, Resume opens it
// again, and a key that another reader holds open is left open
// (ErrMapInUse). Without a reader key, errors.ErrUnsupported.
func TestRecorderPauseRingBuf(t *testing.T) {
	cpus := []int{0, 1, 3}
	key := newFakeReaderKey(t, len(cpus))
	recorder := func() *Recorder {
		f, _ := fakeFailureMap(cpus)
		key.attach(f)
		rb := newFakeRingBuf(512)
		r := &Recorder{mapFD: -1, what: "fake", failures: f, pause: pauser{grace: kernel.WaitWriters}}
		r.rings = []recRing{{bpf: snapshot.BPFRingAt(unsafe.Pointer(&rb.cons), unsafe.Pointer(&rb.prod), rb.data), stats: Stats{CPU: -1, Size: 512}}}
		if err := f.openReader(); err != nil {
			t.Fatal(err)
		}
		return r
	}
	want := func(step string, closed bool) {
		t.Helper()
		if c := key.closed(t); c != closed {
			t.Errorf("%s: key closed %v, want %v", step, c, closed)
		}
	}
	r := recorder()
	want("open", false)
	for range 2 { // the second does nothing
		if err := r.SetPaused("pause", true); err != nil {
			t.Fatal(err)
		}
		want("paused", true)
	}
	for range 2 {
		if err := r.SetPaused("resume", false); err != nil {
			t.Fatal(err)
		}
		want("resumed", false)
	}
	// Paused, Close leaves the key closed.
	if err := r.SetPaused("pause", true); err != nil {
		t.Fatal(err)
	}
	r.Close()
	want("closed while paused", true)

	// Another reader counted: the key stays open.
	r, other := recorder(), recorder()
	want("two readers", false)
	if err := r.SetPaused("pause", true); !errors.Is(err, ErrMapInUse) {
		t.Errorf("Pause with another reader: %v, want ErrMapInUse", err)
	}
	want("pause refused", false)
	other.Close()
	if err := r.SetPaused("pause", true); err != nil {
		t.Fatal(err)
	}
	want("paused alone", true)
	r.Close()

	// No reader key (no FailureMap, or a map of one entry).
	r = recorder()
	r.failures.reader = false
	if err := r.SetPaused("pause", true); !errors.Is(err, errors.ErrUnsupported) || !strings.Contains(err.Error(), "FailureMap") {
		t.Errorf("Pause without a reader key: %v, want errors.ErrUnsupported naming FailureMap", err)
	}
	if err := r.SetPaused("resume", false); !errors.Is(err, errors.ErrUnsupported) {
		t.Errorf("Resume without a reader key: %v, want errors.ErrUnsupported", err)
	}
}
