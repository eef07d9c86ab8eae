// SPDX-License-Identifier: Apache-2.0

package overwrite

import (
	"encoding/binary"
	"errors"
	"io"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/perfbuf/perfbuf"
	"github.com/perfbuf/perfbuf/internal/bpfrun"
	"github.com/perfbuf/perfbuf/internal/kernel"
	"github.com/perfbuf/perfbuf/selftest/internal/bpftest"
	"golang.org/x/sys/unix"
)

// ledger follows one CPU's samples across snapshots taken with onlyNew:
// each seq at most once, in increasing order, checked whole.
type ledger struct {
	samples, lost uint64
	next          uint64 // the seq after the last one returned
}

// take checks recs, one snapshot's, and adds them to the ledgers, by CPU:
// within a snapshot, a CPU's samples follow each other with no gap (a
// ring's window, less its oldest records).
func take(t *testing.T, recs []perfbuf.Record, l map[int]*ledger) {
	t.Helper()
	seen := map[int]bool{}
	for _, rec := range recs {
		g := l[rec.CPU]
		if g == nil {
			g = &ledger{}
			l[rec.CPU] = g
		}
		if rec.Type == perfbuf.RecordLost {
			g.lost += rec.Lost
			continue
		}
		h, err := bpftest.Check(rec.Data, rec.CPU)
		if err != nil {
			t.Fatalf("cpu %d: %v", rec.CPU, err)
		}
		if h.Seq < g.next || seen[rec.CPU] && h.Seq != g.next {
			t.Fatalf("cpu %d: seq %d after seq %d: returned twice, out of order or with a gap", rec.CPU, h.Seq, g.next-1)
		}
		seen[rec.CPU] = true
		g.samples++
		g.next = h.Seq + 1
	}
}

// A Recorder over a perf event array keeps each CPU's newest samples and
// returns them, oldest first, exactly: the newest whole records that the
// ring holds. Paused, the rings refuse outputs, which come back as a lost
// record of their count after Resume.
func TestRecorderPerf(t *testing.T) {
	f := bpftest.Setup(t, backwardObj)
	const pages = 2
	rec, err := perfbuf.NewRecorder(f.Events, perfbuf.Options{RingBytes: bpftest.RingBytes(pages)})
	if err != nil {
		t.Fatal(err)
	}
	defer rec.Close()
	if _, err := perfbuf.NewReader(f.Events, perfbuf.ReaderOptions{}); !errors.Is(err, perfbuf.ErrMapInUse) {
		t.Fatalf("a reader beside the recorder: %v, want ErrMapInUse", err)
	}
	const size = 40
	rsize := bpftest.RecorderRecordSize(size)
	ring := pages * bpftest.Page
	n := uint64(3 * ring / rsize) // three times the ring, on each CPU
	keep := ring / rsize          // the newest whole records a ring holds
	start := f.Stats(t)
	for _, cpu := range f.CPUs {
		f.Emit(t, cpu, n, size, 0)
	}
	mid := f.Stats(t)
	buf := make([]byte, rec.BufferCount()*ring)
	recs, err := rec.Snapshot(buf, nil, false)
	if err != nil {
		t.Fatal(err)
	}
	byCPU := map[int][]perfbuf.Record{}
	for _, r := range recs {
		byCPU[r.CPU] = append(byCPU[r.CPU], r)
	}
	for _, cpu := range f.CPUs {
		got := byCPU[cpu]
		if failed := mid[cpu].Failed - start[cpu].Failed; failed != 0 {
			t.Errorf("cpu %d: %d outputs failed; a backward ring never refuses", cpu, failed)
		}
		if len(got) != keep {
			t.Fatalf("cpu %d: %d records, want the newest %d of %d", cpu, len(got), keep, n)
		}
		for i, r := range got {
			h, err := bpftest.Check(r.Data, cpu)
			if want := mid[cpu].Seq - uint64(keep-i); err != nil || h.Seq != want || r.Type != perfbuf.RecordSample {
				t.Fatalf("cpu %d record %d: seq %d, %v; want seq %d", cpu, i, h.Seq, err, want)
			}
		}
		// Written = returned + overwritten (the seqs before the first returned).
		first, _ := bpftest.Check(got[0].Data, cpu)
		if over := first.Seq - start[cpu].Seq; over+uint64(len(got)) != n {
			t.Errorf("cpu %d: %d returned + %d overwritten != %d written", cpu, len(got), over, n)
		}
	}
	stats := rec.Stats()
	for _, st := range stats.Rings {
		if st.Samples != uint64(len(byCPU[st.CPU])) || st.Left != 0 || st.Lost != 0 || st.Corrupt != 0 || st.Size != ring {
			t.Errorf("stats %+v; want %d samples, nothing left out", st, len(byCPU[st.CPU]))
		}
	}
	if len(stats.Rings) != len(f.CPUs) || stats.Samples != uint64(len(recs)) || stats.Left+stats.Lost+stats.Corrupt != 0 {
		t.Errorf("stats %+v; want %d rings, %d samples in all, nothing left out", stats, len(f.CPUs), len(recs))
	}
	t.Logf("%d cpus: %d samples written on each, the newest %d returned", len(f.CPUs), n, keep)

	// Nothing new since: an empty snapshot. Then a pause refuses 5 outputs
	// on the first CPU, reported after Resume before the next sample.
	if recs, err = rec.Snapshot(buf, recs[:0], true); err != nil || len(recs) != 0 {
		t.Fatalf("snapshot of nothing new: %d records, %v", len(recs), err)
	}
	cpu := f.CPUs[0]
	if err := rec.Pause(); err != nil {
		t.Fatal(err)
	}
	f.Emit(t, cpu, 5, size, 0)
	if recs, err = rec.Snapshot(buf, recs[:0], true); err != nil || len(recs) != 0 {
		t.Fatalf("snapshot while paused: %d records, %v", len(recs), err)
	}
	if err := rec.Resume(); err != nil {
		t.Fatal(err)
	}
	paused := f.Stats(t)[cpu]
	if failed := paused.Failed - mid[cpu].Failed; failed != 5 {
		t.Errorf("%d of 5 outputs to a paused ring failed, want all", failed)
	}
	f.Emit(t, cpu, 1, size, 0)
	recs, err = rec.Snapshot(buf, recs[:0], true)
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) != 2 || recs[0].Type != perfbuf.RecordLost || recs[0].Lost != 5 || recs[1].Type != perfbuf.RecordSample {
		t.Fatalf("after the pause: %+v, want a lost record of 5, then a sample", recs)
	}
	if h, err := bpftest.Check(recs[1].Data, cpu); err != nil || h.Seq != paused.Seq {
		t.Errorf("sample after the pause: seq %d, %v; want %d", h.Seq, err, paused.Seq)
	}
	stats = rec.Stats()
	for _, st := range stats.Rings {
		if st.CPU == cpu && st.Lost != 5 {
			t.Errorf("cpu %d: Stats.Lost %d, want 5", cpu, st.Lost)
		}
	}
	if stats.Lost != 5 {
		t.Errorf("Stats.Lost %d in all, want 5", stats.Lost)
	}

	// A buffer too small for one record.
	if _, err := rec.Snapshot(make([]byte, 8), nil, false); !errors.Is(err, io.ErrShortBuffer) {
		t.Errorf("8-byte buffer: %v, want io.ErrShortBuffer", err)
	}
	if err := rec.Close(); err != nil {
		t.Fatal(err)
	}
	// Closed, the map is free again: outputs find its slots empty.
	r2, err := perfbuf.NewRecorder(f.Events, perfbuf.Options{RingBytes: bpftest.RingBytes(pages)})
	if err != nil {
		t.Fatal(err)
	}
	r2.Close()
}

// Snapshots taken while producers write on every CPU: every sample returned
// is whole, none twice, each snapshot's in order with no gap, and at the
// end each CPU's outputs are accounted for exactly: none refused (a
// snapshot does not pause), the newest returned, and the others
// overwritten, by the kernel or while a snapshot copied them (Left).
func TestRecorderPerfRacing(t *testing.T) {
	f := bpftest.Setup(t, backwardObj)
	rec, err := perfbuf.NewRecorder(f.Events, perfbuf.Options{RingBytes: bpftest.RingBytes(1)})
	if err != nil {
		t.Fatal(err)
	}
	defer rec.Close()
	const size, batch, snapshots = 64, 32, 20
	start := f.Stats(t)
	var wg sync.WaitGroup
	var stop atomic.Bool
	errs := make(chan error, len(f.CPUs))
	for _, cpu := range f.CPUs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for !stop.Load() {
				if err := f.TryEmit(cpu, batch, size, 0); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	l := map[int]*ledger{}
	for _, cpu := range f.CPUs {
		l[cpu] = &ledger{next: start[cpu].Seq}
	}
	buf := make([]byte, len(f.CPUs)*bpftest.RingBytes(1))
	var recs []perfbuf.Record
	var took time.Duration
	for range snapshots {
		t0 := time.Now()
		if recs, err = rec.Snapshot(buf, recs[:0], true); err != nil {
			stop.Store(true)
			wg.Wait()
			t.Fatal(err)
		}
		took += time.Since(t0)
		take(t, recs, l)
		// Let every CPU write a ring's worth before the next.
		for from := f.Stats(t); ; {
			now, grown := f.Stats(t), true
			for _, cpu := range f.CPUs {
				grown = grown && now[cpu].Emitted-from[cpu].Emitted >= uint64(bpftest.RingBytes(1)/bpftest.RecorderRecordSize(size))
			}
			if grown {
				break
			}
		}
	}
	stop.Store(true)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	end := f.Stats(t)
	if recs, err = rec.Snapshot(buf, recs[:0], true); err != nil {
		t.Fatal(err)
	}
	take(t, recs, l)
	stats := rec.Stats()
	var returned uint64
	for _, cpu := range f.CPUs {
		d := end[cpu].Sub(start[cpu])
		g := l[cpu]
		if d.Failed != 0 || g.lost != 0 {
			t.Errorf("cpu %d: %d outputs failed, %d counted lost; want none", cpu, d.Failed, g.lost)
		}
		if g.samples > d.Emitted || g.next != end[cpu].Seq {
			t.Errorf("cpu %d: %d samples returned, last seq %d; %d emitted, last seq %d", cpu, g.samples, g.next-1, d.Emitted, end[cpu].Seq-1)
		}
		t.Logf("cpu %d: %d written: %d returned, %d overwritten", cpu, d.Seq, g.samples, d.Emitted-g.samples)
		returned += g.samples
	}
	if stats.Samples != returned || stats.Lost != 0 {
		t.Errorf("stats %+v; want the %d samples the snapshots returned, none lost", stats, returned)
	}
	t.Logf("%d snapshots in %v; %d records overwritten while a snapshot copied them (Left)", snapshots+1, took, stats.Left)
}

// A Recorder over a ring buffer in overwrite mode (kernel 6.19: the 7.3
// guest) returns the newest records exactly, from overwrite_pos on, while
// a Reader refuses the map. On older kernels, and over a ring buffer not in
// overwrite mode, NewRecorder says why.
func TestRecorderRingBuf(t *testing.T) {
	bpftest.RequirePrivileges(t)
	plain, err := kernel.CreateRingBuf("pb_plain", uint32(bpftest.Page), 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(plain)
	_, err = perfbuf.NewRecorder(perfbuf.MapFD(plain), perfbuf.Options{})
	if kernel.ProbeRingOverwrite() != nil {
		if !errors.Is(err, errors.ErrUnsupported) || !strings.Contains(err.Error(), "6.19") || !strings.Contains(err.Error(), `ring buffer "pb_plain"`) {
			t.Fatalf("recorder over a ring buffer, kernel without overwrite mode: %v; want errors.ErrUnsupported naming 6.19 and the map", err)
		}
		t.Logf("no overwrite mode: %v", err)
		return
	}
	if !errors.Is(err, os.ErrInvalid) || !strings.Contains(err.Error(), "not in overwrite mode") {
		t.Fatalf("recorder over a ring buffer not in overwrite mode: %v; want os.ErrInvalid", err)
	}
	m := bpftest.Load(t, rbObj)
	rb := bpftest.Map(t, m, "rb")
	_, err = perfbuf.NewReader(rb, perfbuf.ReaderOptions{})
	if !errors.Is(err, errors.ErrUnsupported) || !strings.Contains(err.Error(), `ring buffer "rb" is in overwrite mode`) {
		t.Fatalf("reader over a ring buffer in overwrite mode: %v; want errors.ErrUnsupported naming the map and the mode", err)
	}
	rec, err := perfbuf.NewRecorder(rb, perfbuf.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer rec.Close()
	if err := rec.Pause(); !errors.Is(err, errors.ErrUnsupported) {
		t.Errorf("Pause over a ring buffer: %v, want errors.ErrUnsupported", err)
	}
	prog := bpftest.Prog(t, m, "fill")
	const (
		size  = 100 // a 112-byte record
		batch = 256
		runs  = 8 // 2048 records: 3.5 rings
	)
	recSize := uint64((size + 8 + 7) &^ 7)
	for r := range uint64(runs) {
		bpftest.Run(t, prog, 0, batch, size, r*batch)
	}
	buf := make([]byte, rbSize)
	recs, err := rec.Snapshot(buf, nil, false)
	if err != nil {
		t.Fatal(err)
	}
	written := uint64(runs * batch)
	// The kernel moves overwrite_pos record by record until the new one
	// fits: what is left is the newest whole records within the ring.
	keep := (rbSize - recSize) / recSize
	if uint64(len(recs)) < keep || uint64(len(recs)) > rbSize/recSize {
		t.Fatalf("%d records, want the newest %d or %d", len(recs), keep, rbSize/recSize)
	}
	for i, r := range recs {
		seq := binary.NativeEndian.Uint64(r.Data)
		if want := written - uint64(len(recs)-i); seq != want || len(r.Data) != size || r.CPU != -1 || r.Type != perfbuf.RecordSample {
			t.Fatalf("record %d: seq %d, %d bytes, cpu %d; want seq %d, %d bytes, cpu -1", i, seq, len(r.Data), r.CPU, want, size)
		}
	}
	// Written = returned + overwritten, and the kernel tells the
	// overwritten: overwrite_pos is their bytes.
	over := recs[0].Pos / recSize
	if over+uint64(len(recs)) != written {
		t.Errorf("%d returned + %d overwritten (overwrite_pos %d) != %d written", len(recs), over, recs[0].Pos, written)
	}
	t.Logf("%d written, the newest %d returned, %d overwritten", written, len(recs), over)
	st := rec.Stats()
	if len(st.Rings) != 1 || st.Rings[0].Samples != uint64(len(recs)) || st.Rings[0].Left != 0 || st.Rings[0].Size != rbSize || st.Rings[0].CPU != -1 ||
		st.Samples != uint64(len(recs)) || st.Left != 0 {
		t.Errorf("stats %+v; want one ring of cpu -1, %d samples, nothing left out", st, len(recs))
	}
	// onlyNew: nothing, then exactly the batch written since.
	if recs, err = rec.Snapshot(buf, recs[:0], true); err != nil || len(recs) != 0 {
		t.Fatalf("nothing new: %d records, %v", len(recs), err)
	}
	bpftest.Run(t, prog, 0, batch, size, written)
	if recs, err = rec.Snapshot(buf, recs[:0], true); err != nil || len(recs) != batch {
		t.Fatalf("one batch since: %d records, %v; want %d", len(recs), err, batch)
	}
	if seq := binary.NativeEndian.Uint64(recs[0].Data); seq != written {
		t.Errorf("first record since: seq %d, want %d", seq, written)
	}
	// Order.Sort puts a snapshot in the order of a key in the records: the
	// seq, written here in two batches, the second's smaller.
	const later = 1 << 20
	bpftest.Run(t, prog, 0, batch, size, later)
	bpftest.Run(t, prog, 0, batch, size, 0)
	if recs, err = rec.Snapshot(buf, recs[:0], true); err != nil || len(recs) != 2*batch {
		t.Fatalf("two batches since: %d records, %v; want %d", len(recs), err, 2*batch)
	}
	if err := (perfbuf.Order{KeyOffset: 0}).Sort(recs); err != nil {
		t.Fatal(err)
	}
	for i, r := range recs {
		want := uint64(i)
		if i >= batch {
			want = later + uint64(i-batch)
		}
		if seq := binary.NativeEndian.Uint64(r.Data); seq != want || r.Key != want {
			t.Fatalf("sorted: record %d has seq %d, key %d; want %d", i, seq, r.Key, want)
		}
	}
	// A buffer too small for one record.
	if _, err := rec.Snapshot(make([]byte, size-1), nil, false); !errors.Is(err, io.ErrShortBuffer) {
		t.Errorf("%d-byte buffer: %v, want io.ErrShortBuffer", size-1, err)
	}
}

// A Recorder pauses a ring buffer in overwrite mode through the reader key
// of its FailureMap (kernel 6.19: the 7.3 guest): the outputs of
// perfbuf.bpf.h while paused fail in the program and are counted exactly
// in Failed.NoEntry, snapshots return the records from before the pause,
// and after Resume the outputs land again. Without a FailureMap, Pause is
// errors.ErrUnsupported.
func TestRecorderRingBufPause(t *testing.T) {
	bpftest.RequirePrivileges(t)
	if err := kernel.ProbeRingOverwrite(); err != nil {
		if !errors.Is(err, errors.ErrUnsupported) {
			t.Fatal(err)
		}
		t.Logf("no overwrite mode (TestRecorderRingBuf checks the error): %v", err)
		return
	}
	m := bpftest.Load(t, rbObj)
	rbc, failures := bpftest.Map(t, m, "rbc"), bpftest.Map(t, m, "failures")
	prog := bpftest.Prog(t, m, "fill_counted")
	rec, err := perfbuf.NewRecorder(rbc, perfbuf.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if err := rec.Pause(); !errors.Is(err, errors.ErrUnsupported) {
		t.Errorf("Pause without a FailureMap: %v, want errors.ErrUnsupported", err)
	}
	rec.Close()

	rec, err = perfbuf.NewRecorder(rbc, perfbuf.Options{FailureMap: failures})
	if err != nil {
		t.Fatal(err)
	}
	defer rec.Close()
	// 16-byte records: 4096 fit in the ring, none is overwritten.
	const before, during, after = 100, 256, 50
	seqs := func(recs []perfbuf.Record, from, n uint64) {
		t.Helper()
		if uint64(len(recs)) != n {
			t.Fatalf("%d records, want %d", len(recs), n)
		}
		for i, r := range recs {
			if seq := binary.NativeEndian.Uint64(r.Data); seq != from+uint64(i) || len(r.Data) != 8 {
				t.Fatalf("record %d: seq %d (%d bytes), want %d", i, seq, len(r.Data), from+uint64(i))
			}
		}
	}
	bpftest.Run(t, prog, 0, before, 0)
	if err := rec.Pause(); err != nil {
		t.Fatal(err)
	}
	bpftest.Run(t, prog, 0, during, before)
	buf := make([]byte, rbSize)
	for range 2 { // paused: the same records each time
		recs, err := rec.Snapshot(buf, nil, false)
		if err != nil {
			t.Fatal(err)
		}
		seqs(recs, 0, before)
	}
	if st := rec.Stats(); len(st.Rings) != 1 || st.Rings[0].Failed.NoEntry != during || st.Rings[0].Failed.Total() != during ||
		st.Failed.NoEntry != during || st.Failed.Total() != during {
		t.Fatalf("paused: stats %+v; want %d outputs refused (Failed.NoEntry)", st, during)
	}
	if err := rec.Resume(); err != nil {
		t.Fatal(err)
	}
	bpftest.Run(t, prog, 0, after, before+during)
	recs, err := rec.Snapshot(buf, nil, true)
	if err != nil {
		t.Fatal(err)
	}
	seqs(recs, before+during, after)
	// Every output is returned or refused: 100 + 50 returned, 256 refused.
	st := rec.Stats()
	if st.Rings[0].Failed.NoEntry != during || st.Rings[0].Samples != 2*before+after || st.Rings[0].Left != 0 ||
		st.Failed.NoEntry != during || st.Samples != 2*before+after || st.Left != 0 {
		t.Errorf("stats %+v; want %d refused, %d returned (the first %d twice)", st, during, 2*before+after, before)
	}
	t.Logf("%d written, %d refused while paused (Failed.NoEntry), %d after Resume", before, during, after)
}

// ready waits up to timeout for epfd, a Recorder's EpollFD, and reports
// whether a ring woke it.
func ready(t *testing.T, epfd int, timeout time.Duration) bool {
	t.Helper()
	events := make([]unix.EpollEvent, 8)
	for {
		n, err := unix.EpollWait(epfd, events, int(timeout.Milliseconds()))
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		return n > 0
	}
}

// A Recorder over a perf event array wakes its EpollFD as WakeupEvents
// says, for a caller that takes the new records when woken; by default
// once half a ring was written, never a sample: a wakeup costs the
// program several µs (BenchmarkRecorderProgram), and until this was
// fixed every sample paid one into rings that no one waited on.
func TestRecorderWakeups(t *testing.T) {
	const size = 40
	f := bpftest.Setup(t, backwardObj)
	cpu := f.CPUs[0]
	// The wakeup is an irq_work that the output queues on its CPU. Run
	// from another CPU, the program runs in an IPI's handler and the
	// irq_work after it, racing the test's next look; run on the calling
	// thread's own CPU, the irq_work runs before the run returns.
	// open pins the subtest's thread to cpu and opens a Recorder with
	// opts, closed at the subtest's end, and its epoll descriptor.
	open := func(t *testing.T, opts perfbuf.Options) (*perfbuf.Recorder, int) {
		unpin, err := bpfrun.Pin(cpu)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(unpin)
		rec, err := perfbuf.NewRecorder(f.Events, opts)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { rec.Close() })
		epfd, err := rec.EpollFD()
		if err != nil {
			t.Fatal(err)
		}
		return rec, epfd
	}
	t.Run("default", func(t *testing.T) {
		const pages = 2
		_, epfd := open(t, perfbuf.Options{RingBytes: bpftest.RingBytes(pages)})
		f.Emit(t, cpu, 4, size, 0)
		if ready(t, epfd, 0) {
			t.Fatal("woken after 4 samples in a ring of 2 pages; want a wakeup a half ring")
		}
		half := pages * bpftest.Page / 2
		f.Emit(t, cpu, uint64(half/bpftest.RecorderRecordSize(size)+1), size, 0)
		if !ready(t, epfd, 10*time.Second) {
			t.Fatal("not woken once half the ring was written")
		}
	})
	t.Run("WakeupEvents", func(t *testing.T) {
		const every = 4
		rec, epfd := open(t, perfbuf.Options{RingBytes: bpftest.RingBytes(2), WakeupEvents: every})
		buf := make([]byte, rec.BufferCount()*bpftest.RingBytes(2))
		recs, err := rec.Snapshot(buf, nil, true) // nothing yet
		if err != nil || len(recs) != 0 {
			t.Fatalf("first snapshot: %d records, %v", len(recs), err)
		}
		for round := range 3 {
			f.Emit(t, cpu, every-1, size, 0)
			if ready(t, epfd, 0) {
				t.Fatalf("round %d: woken after %d samples, want %d", round, every-1, every)
			}
			f.Emit(t, cpu, 1, size, 0)
			if !ready(t, epfd, 10*time.Second) {
				t.Fatalf("round %d: not woken after %d samples", round, every)
			}
			if recs, err = rec.Snapshot(buf, recs[:0], true); err != nil || len(recs) != every {
				t.Fatalf("round %d: snapshot of the new records: %d, %v; want %d", round, len(recs), err, every)
			}
		}
	})
}

// A snapshot of a perf event array's rings merges them by the time the
// kernel wrote each sample, on bpf_ktime_get_ns's clock (Record.Key): the
// records of a run on one CPU, then one on another, then the first again
// come back in that order, not ring after ring, each after the time the
// program stamped in it.
func TestRecorderMergedByTime(t *testing.T) {
	f := bpftest.Setup(t, backwardObj)
	if len(f.CPUs) < 2 {
		t.Skip("one CPU: one ring") // (a fact of the host, not a privilege)
	}
	rec, err := perfbuf.NewRecorder(f.Events, perfbuf.Options{RingBytes: bpftest.RingBytes(4)})
	if err != nil {
		t.Fatal(err)
	}
	defer rec.Close()
	const size, n = 40, 5
	a, b := f.CPUs[0], f.CPUs[1]
	var want []int // the CPU of each sample, in the order written
	for _, cpu := range []int{a, b, a, b} {
		f.Emit(t, cpu, n, size, 0)
		for range n {
			want = append(want, cpu)
		}
	}
	recs, err := rec.Snapshot(make([]byte, rec.BufferCount()*bpftest.RingBytes(4)), nil, false)
	if err != nil {
		t.Fatal(err)
	}
	var got []int
	var last uint64
	for _, r := range recs {
		h, err := bpftest.Check(r.Data, r.CPU)
		if err != nil {
			t.Fatal(err)
		}
		if r.Key < last || r.Key < h.TS {
			t.Errorf("cpu %d seq %d: time %d, after %d, stamped %d: want a time at least both", r.CPU, h.Seq, r.Key, last, h.TS)
		}
		last = r.Key
		got = append(got, r.CPU)
	}
	if !slices.Equal(got, want) {
		t.Errorf("snapshot by CPU %v, want the order written %v", got, want)
	}
}
