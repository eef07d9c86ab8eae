// SPDX-License-Identifier: Apache-2.0

// Privileged selftests of raw mode over real rings: raw.bpf.c emits on a
// chosen CPU through BPF_PROG_TEST_RUN; RawBuffer reads what libbpf maps.
package raw

import (
	"errors"
	"fmt"
	"os"
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/perfbuf/perfbuf"
	"github.com/perfbuf/perfbuf/selftest/internal/bpftest"
)

const obj = "bpf/raw.bpf.o"

// load is one emission pattern: bursts that overflow a small ring, with
// sizes that make records straddle its end, then a drain after each burst.
// Being deterministic, it produces the same samples and the same losses for
// any reader that drains at the same points.
func load(t *testing.T, f *bpftest.Fixture, drain func()) {
	t.Helper()
	for round := 0; round < 8; round++ {
		for _, cpu := range f.CPUs {
			// Up to ~410 bytes: 60 overflow 2 pages of 4 KiB, and each larger
			// page takes as many more.
			f.Emit(t, cpu, 60*uint64(bpftest.Scale()), 1+uint64(round)*37, 150)
		}
		drain()
	}
	// The kernel writes its LOST record once a sample fits again.
	for _, cpu := range f.CPUs {
		f.Emit(t, cpu, 1, 8, 0)
	}
	drain()
}

// relative rebases each CPU's sequence numbers on the first attempt of the
// phase, so that two phases of the same load compare equal.
func relative(c *bpftest.Collector, base []bpftest.EmitStats) map[int][]bpftest.Entry {
	out := map[int][]bpftest.Entry{}
	for cpu, log := range c.Log {
		for _, e := range log {
			if bpftest.SeqValid(e.Len) {
				e.Seq -= base[cpu].Seq
			}
			out[cpu] = append(out[cpu], e)
		}
	}
	return out
}

// drainRaw reads every ring through RawBuffers into c, copying a payload
// only when it straddles the ring's end, and returns how many did.
func drainRaw(t *testing.T, bufs []*perfbuf.RawBuffer, c *bpftest.Collector) (straddled int) {
	t.Helper()
	var scratch []byte
	for _, rb := range bufs {
		cpu := rb.Stats().CPU
		_, err := rb.Drain(func(rec *perfbuf.Record) error {
			if rec.CPU != cpu {
				t.Errorf("record of cpu %d in cpu %d's ring", rec.CPU, cpu)
			}
			switch rec.Type {
			case perfbuf.RecordSample:
				data := rec.Data
				if len(rec.Wrapped) > 0 {
					scratch = rec.AppendTo(scratch[:0])
					data = scratch
					straddled++
				}
				c.Sample(cpu, data)
			case perfbuf.RecordLost:
				c.LostFn(cpu, rec.Lost)
			default:
				t.Errorf("cpu %d: unexpected record type %v", cpu, rec.Type)
			}
			return nil
		})
		if err != nil {
			t.Fatalf("drain cpu %d: %v", cpu, err)
		}
	}
	return straddled
}

// Raw mode delivers exactly what callback mode delivers for the same
// emitted samples, and both account for every sample.
func TestRawMatchesCallback(t *testing.T) {
	f := bpftest.Setup(t, obj)

	// Phase 1: callback mode.
	cb := bpftest.NewCollector()
	pb, err := perfbuf.New(f.Events, cb.Sample, cb.LostFn, perfbuf.Options{RingBytes: bpftest.RingBytes(2)})
	if err != nil {
		t.Fatal(err)
	}
	base1 := f.Stats(t)
	load(t, f, func() {
		if _, err := pb.Consume(); err != nil {
			t.Fatal(err)
		}
	})
	cb.CheckAccounting(t, f)
	pb.Close()
	end1 := f.Stats(t)

	// Phase 2: raw mode over fresh rings of the same size.
	raw := bpftest.NewCollector()
	rp, err := perfbuf.NewRaw(f.Events, perfbuf.Options{RingBytes: bpftest.RingBytes(2)})
	if err != nil {
		t.Fatal(err)
	}
	defer rp.Close()
	var bufs []*perfbuf.RawBuffer
	byCPU := map[int]*perfbuf.RawBuffer{} // buffer indexes are not CPU numbers
	for i := 0; i < rp.BufferCount(); i++ {
		rb, err := rp.Buffer(i)
		if err != nil {
			t.Fatal(err)
		}
		defer rb.Release()
		if cpu := rp.Stats().Rings[i].CPU; rb.Stats().CPU != cpu {
			t.Errorf("buffer %d: RawBuffer says cpu %d, Stats cpu %d", i, rb.Stats().CPU, cpu)
		}
		if rb.Stats().Size != 2*os.Getpagesize() {
			t.Errorf("buffer %d: size %d, want 2 pages", i, rb.Stats().Size)
		}
		bufs = append(bufs, rb)
		byCPU[rb.Stats().CPU] = rb
	}
	straddled := 0
	load(t, f, func() { straddled += drainRaw(t, bufs, raw) })
	raw.Check(t)
	end2 := f.Stats(t)
	for _, cpu := range f.CPUs {
		emitted, lost := end2[cpu].Emitted-end1[cpu].Emitted, end2[cpu].Failed-end1[cpu].Failed
		t.Logf("cpu %d raw: emitted %d failed %d | received %d lost %d", cpu, emitted, lost, raw.Samples[cpu], raw.Lost[cpu])
		if uint64(raw.Samples[cpu]) != emitted || raw.Lost[cpu] != lost {
			t.Errorf("cpu %d: raw received %d lost %d; kernel emitted %d failed %d", cpu, raw.Samples[cpu], raw.Lost[cpu], emitted, lost)
		}
		if cb.Lost[cpu] == 0 {
			t.Errorf("cpu %d: the load lost nothing: it does not overflow the ring", cpu)
		}
		rb := byCPU[cpu]
		if rb == nil {
			t.Errorf("cpu %d: no ring", cpu)
			continue
		}
		st := rb.Stats()
		raw.CheckStats(t, []perfbuf.Stats{st})
		if st.CPU != cpu || st.Corrupt != 0 || st.Left != 0 {
			t.Errorf("cpu %d: RawBuffer stats %+v", cpu, st)
		}
		if rb.Stats().Fill != 0 {
			t.Errorf("cpu %d: %d bytes left after draining", cpu, rb.Stats().Fill)
		}
	}
	t.Logf("%d samples straddled a ring's end", straddled)
	if straddled == 0 {
		t.Error("no sample straddled a ring's end: the test does not cover them")
	}
	if got, want := relative(raw, end1), relative(cb, base1); !reflect.DeepEqual(got, want) {
		t.Errorf("raw mode and callback mode delivered different samples")
	}
	if !reflect.DeepEqual(raw.Lost, cb.Lost) {
		t.Errorf("lost: raw %v, callback %v", raw.Lost, cb.Lost)
	}
}

// rawRing0 opens f's rings, one page each, for raw mode only and returns
// ring 0, released and closed at cleanup.
func rawRing0(t *testing.T, f *bpftest.Fixture) *perfbuf.RawBuffer {
	t.Helper()
	pb, err := perfbuf.NewRaw(f.Events, perfbuf.Options{RingBytes: 1 << 12})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pb.Close() })
	rb, err := pb.Buffer(0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(rb.Release) // (before pb.Close: cleanups run last first)
	return rb
}

// Peeking does not consume: records read without Commit are read again
// after Begin, and Commit publishes data_tail only when asked.
func TestRawPeekCommit(t *testing.T) {
	f := bpftest.Setup(t, obj)
	rb := rawRing0(t, f)
	cpu := rb.Stats().CPU
	f.Emit(t, cpu, 5, 64, 0)

	read := func() (seqs []uint64, end uint64) {
		rb.Begin()
		var rec perfbuf.Record
		for {
			ok, err := rb.Next(&rec)
			if err != nil {
				t.Fatal(err)
			}
			if !ok {
				return seqs, rec.Next
			}
			h, err := bpftest.Check(rec.Data, cpu)
			if err != nil {
				t.Fatal(err)
			}
			seqs = append(seqs, h.Seq)
		}
	}
	first, end := read()
	if len(first) != 5 || end != 5*uint64(bpftest.RecordSize(64)) {
		t.Fatalf("peek read %d records up to %d; want 5 up to %d", len(first), end, 5*bpftest.RecordSize(64))
	}
	if rb.Stats().Fill != int(end) {
		t.Errorf("Fill %d after peeking, want %d: nothing committed", rb.Stats().Fill, end)
	}
	again, _ := read()
	if !reflect.DeepEqual(first, again) {
		t.Errorf("peek again: %v, first %v", again, first)
	}
	if err := rb.Commit(end + 8); !errors.Is(err, os.ErrInvalid) {
		t.Errorf("commit past the head: %v", err)
	}
	if rb.Stats().Fill != int(end) {
		t.Errorf("Fill %d after a refused commit, want %d", rb.Stats().Fill, end)
	}
	if err := rb.Commit(end); err != nil {
		t.Fatal(err)
	}
	if rb.Stats().Fill != 0 {
		t.Errorf("after commit: used %d", rb.Stats().Fill)
	}
	if err := rb.Commit(0); !errors.Is(err, os.ErrInvalid) {
		t.Errorf("commit backwards: %v", err)
	}
}

// A RawBuffer holds its ring: Buffer twice is ErrBusy until Release, what
// it leaves in the ring is the next RawBuffer's, and Close waits for
// Release to unmap.
func TestRawHold(t *testing.T) {
	f := bpftest.Setup(t, obj)
	raw, err := perfbuf.NewRaw(f.Events, perfbuf.Options{RingBytes: 1 << 12})
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	n := raw.BufferCount()
	for _, i := range []int{-1, n} {
		if _, err := raw.Buffer(i); !errors.Is(err, os.ErrInvalid) {
			t.Errorf("Buffer(%d): %v, want os.ErrInvalid", i, err)
		}
	}
	rb, err := raw.Buffer(0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := raw.Buffer(0); !errors.Is(err, perfbuf.ErrBusy) {
		t.Errorf("Buffer(0) twice: %v, want ErrBusy", err)
	}
	cpu0 := rb.Stats().CPU
	f.Emit(t, cpu0, 3, 32, 0)
	if rb.Stats().Fill == 0 {
		t.Error("ring 0 empty after 3 samples")
	}
	rb.Release()
	rb.Release() // idempotent
	if rb.Stats().Fill != 0 {
		t.Error("a released RawBuffer still reads the ring")
	}
	drain := func(rb *perfbuf.RawBuffer) (int, error) {
		got := 0
		_, err := rb.Drain(func(*perfbuf.Record) error { got++; return nil })
		return got, err
	}
	rb, err = raw.Buffer(0)
	if err != nil {
		t.Fatalf("Buffer(0) after Release: %v", err)
	}
	if got, err := drain(rb); err != nil || got != 3 {
		t.Errorf("drain by a second RawBuffer: %d samples, %v; want the 3 the first left", got, err)
	}
	rb.Release()

	// Close with a RawBuffer held: the mapping stays until Release.
	rb, err = raw.Buffer(0)
	if err != nil {
		t.Fatal(err)
	}
	f.Emit(t, cpu0, 2, 32, 0)
	raw.Close()
	if _, err := raw.Buffer(0); !errors.Is(err, os.ErrClosed) {
		t.Errorf("Buffer after Close: %v", err)
	}
	if got, err := drain(rb); err != nil || got != 2 {
		t.Errorf("drain after Close: %d records, %v; want 2", got, err)
	}
	rb.Release()
	// The rings were freed at Release, with nothing left in them: what
	// the RawBuffers read is in their own Stats, not the Raw's, nor left.
	if st := raw.Stats().Rings[0]; st.Samples != 0 || st.Left != 0 {
		t.Errorf("stats after Release %+v; want no samples (the RawBuffers read them), none left", st)
	}
	if _, err := rb.Drain(func(*perfbuf.Record) error { return nil }); !errors.Is(err, os.ErrClosed) {
		t.Errorf("drain after Release: %v; want os.ErrClosed", err)
	}
}

// RawBuffer.Release hands back its own ring, and only that one: ring 0,
// still held, stays busy. (Release used to release ring 0, whatever its
// own: it overwrote the RawBuffer, index included, before it told the
// PerfBuffer which ring.)
func TestReleaseHandsBackItsOwnRing(t *testing.T) {
	f := bpftest.Setup(t, obj)
	if len(f.CPUs) < 2 {
		t.Skip("needs two CPUs")
	}
	raw, err := perfbuf.NewRaw(f.Events, perfbuf.Options{RingBytes: 1 << 12})
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	rb0, err := raw.Buffer(0)
	if err != nil {
		t.Fatal(err)
	}
	defer rb0.Release()
	rb1, err := raw.Buffer(1)
	if err != nil {
		t.Fatal(err)
	}
	f.Emit(t, rb0.Stats().CPU, 5, 32, 0)
	rb1.Release()
	if rb, err := raw.Buffer(1); err != nil {
		t.Errorf("Buffer(1) after releasing ring 1: %v", err)
	} else {
		rb.Release()
	}
	if _, err := raw.Buffer(0); !errors.Is(err, perfbuf.ErrBusy) {
		t.Errorf("Buffer(0) while a RawBuffer holds ring 0: %v; want ErrBusy", err)
	}
	got := 0
	if _, err := rb0.Drain(func(*perfbuf.Record) error { got++; return nil }); err != nil || got != 5 {
		t.Errorf("ring 0's RawBuffer after ring 1's Release: %d records, %v; want 5", got, err)
	}
}

// Drain stops at the first error its function returns and returns it; the
// record the function failed on counts as received and is committed, the
// rest stay in the ring for the next Drain.
func TestRawDrainStops(t *testing.T) {
	f := bpftest.Setup(t, obj)
	rb := rawRing0(t, f)
	const size = 48
	cpu := rb.Stats().CPU
	f.Emit(t, cpu, 5, size, 0)
	stop := errors.New("stop")
	var seqs []uint64
	collect := func(rec *perfbuf.Record) error {
		h, err := bpftest.Check(rec.AppendTo(nil), cpu)
		if err != nil {
			return err
		}
		seqs = append(seqs, h.Seq)
		if len(seqs) == 3 {
			return fmt.Errorf("third record: %w", stop)
		}
		return nil
	}
	if n, err := rb.Drain(collect); n != 3 || !errors.Is(err, stop) {
		t.Fatalf("Drain = %d, %v; want 3 records and the function's error", n, err)
	}
	if want := 2 * bpftest.RecordSize(size); rb.Stats().Fill != want {
		t.Errorf("%d bytes left after the stopped Drain, want %d (2 records)", rb.Stats().Fill, want)
	}
	if n, err := rb.Drain(collect); n != 2 || err != nil {
		t.Fatalf("second Drain = %d, %v; want the 2 records left", n, err)
	}
	for i := 1; i < len(seqs); i++ {
		if seqs[i] != seqs[i-1]+1 {
			t.Errorf("sequence %v: a record twice or missing", seqs)
			break
		}
	}
	if st := rb.Stats(); st.Samples != 5 || st.Bytes != 5*uint64(bpftest.PaddedSize(size)) {
		t.Errorf("stats %+v; want 5 samples of %d bytes", st, bpftest.PaddedSize(size))
	}
	if _, err := rb.Drain(nil); !errors.Is(err, os.ErrInvalid) {
		t.Errorf("Drain(nil): %v; want os.ErrInvalid", err)
	}
}

// TestRawRingBytes: rings sized in bytes get a power of two of the host's
// pages, as mapped by the kernel, and carry samples; both sizes set fail
// before anything is opened.
func TestRawRingBytes(t *testing.T) {
	f := bpftest.Setup(t, obj)
	page := os.Getpagesize()
	for _, c := range []struct{ bytes, want int }{
		{1, page},
		{3*page - 1, 4 * page},
		{5 * page, 8 * page},
	} {
		pb, err := perfbuf.NewRaw(f.Events, perfbuf.Options{RingBytes: c.bytes})
		if err != nil {
			t.Fatalf("RingBytes %d: %v", c.bytes, err)
		}
		for i := 0; i < pb.BufferCount(); i++ {
			rb, err := pb.Buffer(i)
			if err != nil {
				t.Fatal(err)
			}
			if rb.Stats().Size != c.want {
				t.Errorf("RingBytes %d: ring %d holds %d bytes, want %d (%d-byte pages)", c.bytes, i, rb.Stats().Size, c.want, page)
			}
			f.Emit(t, rb.Stats().CPU, 3, 32, 0)
			n, err := rb.Drain(func(*perfbuf.Record) error { return nil })
			if n != 3 || err != nil {
				t.Errorf("RingBytes %d: ring %d drained %d, %v; want 3 samples", c.bytes, i, n, err)
			}
			rb.Release()
		}
		pb.Close()
	}
	_, err := perfbuf.NewReader(f.Events, perfbuf.ReaderOptions{Options: perfbuf.Options{RingBytes: -page}})
	if !errors.Is(err, os.ErrInvalid) {
		t.Errorf("negative RingBytes: %v, want os.ErrInvalid", err)
	}
}

// Raw mode waits with Raw.Wait: it names the rings that hold
// records, blocks until a sample wakes it (emitted while it waits), times
// out with none, and returns os.ErrClosed once Close is called; draining
// the rings it names accounts for every sample, on every CPU.
func TestRawWait(t *testing.T) {
	f := bpftest.Setup(t, obj)
	pb, err := perfbuf.NewRaw(f.Events, perfbuf.Options{RingBytes: bpftest.RingBytes(4)})
	if err != nil {
		t.Fatal(err)
	}
	defer pb.Close()
	bufs := make([]*perfbuf.RawBuffer, pb.BufferCount())
	ringOf := map[int]int{} // CPU -> buffer index
	for i := range bufs {
		if bufs[i], err = pb.Buffer(i); err != nil {
			t.Fatal(err)
		}
		defer bufs[i].Release()
		ringOf[bufs[i].Stats().CPU] = i
	}
	c := bpftest.NewCollector()
	drain := func(ready []int) {
		drainRaw(t, func() (out []*perfbuf.RawBuffer) {
			for _, i := range ready {
				out = append(out, bufs[i])
			}
			return out
		}(), c)
	}

	if ready, err := pb.Wait(0, nil); len(ready) != 0 || err != nil {
		t.Fatalf("Wait(0) on empty rings: %v, %v", ready, err)
	}
	if ready, err := pb.Wait(20*time.Millisecond, nil); len(ready) != 0 || err != nil {
		t.Fatalf("Wait(20ms) on empty rings: %v, %v", ready, err)
	}
	var ready []int
	for _, cpu := range f.CPUs {
		// Already there: Wait returns at once, naming that ring only.
		f.Emit(t, cpu, 3, 24, 8)
		if ready, err = pb.Wait(time.Second, ready[:0]); err != nil || !slices.Equal(ready, []int{ringOf[cpu]}) {
			t.Fatalf("cpu %d: Wait = %v, %v; want [%d]", cpu, ready, err, ringOf[cpu])
		}
		drain(ready)
		// Emitted while Wait blocks: the sample's wakeup ends it.
		got := make(chan []int, 1)
		go func() {
			r, err := pb.Wait(-1, nil)
			if err != nil {
				t.Error(err)
			}
			got <- r
		}()
		time.Sleep(10 * time.Millisecond) // (either order is correct)
		f.Emit(t, cpu, 2, 40, 0)
		select {
		case r := <-got:
			if !slices.Equal(r, []int{ringOf[cpu]}) {
				t.Fatalf("cpu %d: blocked Wait = %v; want [%d]", cpu, r, ringOf[cpu])
			}
			drain(r)
		case <-time.After(5 * time.Second):
			t.Fatalf("cpu %d: Wait still blocked 5 s after a sample", cpu)
		}
	}
	c.CheckAccounting(t, f)
	for i, rb := range bufs {
		if rb.Stats().Fill != 0 {
			t.Errorf("ring %d: %d bytes left", i, rb.Stats().Fill)
		}
	}

	done := make(chan error, 1)
	go func() {
		_, err := pb.Wait(-1, nil)
		done <- err
	}()
	time.Sleep(10 * time.Millisecond)
	pb.Close()
	select {
	case err := <-done:
		if !errors.Is(err, os.ErrClosed) {
			t.Errorf("Wait blocked at Close: %v, want os.ErrClosed", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Wait still blocked 5 s after Close")
	}
	if _, err := pb.Wait(0, nil); !errors.Is(err, os.ErrClosed) {
		t.Errorf("Wait after Close: %v, want os.ErrClosed", err)
	}
}
