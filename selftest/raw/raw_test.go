// Privileged selftests of raw mode over real rings: raw.bpf.c emits on a
// chosen CPU through BPF_PROG_TEST_RUN; RawBuffer reads what libbpf maps.
package raw

import (
	"errors"
	"os"
	"reflect"
	"testing"

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
			f.Emit(t, cpu, 60, 1+uint64(round)*37, 150) // up to ~410 bytes; 2 pages overflow
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
// only when it straddles the ring's end.
func drainRaw(t *testing.T, bufs []*perfbuf.RawBuffer, c *bpftest.Collector) {
	t.Helper()
	var scratch []byte
	for _, rb := range bufs {
		_, err := rb.Drain(func(rec *perfbuf.Record) bool {
			switch rec.Type {
			case perfbuf.RecordSample:
				data := rec.Data
				if len(rec.Wrapped) > 0 {
					scratch = rec.AppendTo(scratch[:0])
					data = scratch
				}
				c.Sample(rb.CPU(), data)
			case perfbuf.RecordLost:
				c.LostFn(rb.CPU(), rec.Lost)
			default:
				t.Errorf("cpu %d: unexpected record type %d", rb.CPU(), rec.RawType)
			}
			return true
		})
		if err != nil {
			t.Fatalf("drain cpu %d: %v", rb.CPU(), err)
		}
	}
}

// Raw mode delivers exactly what callback mode delivers for the same
// emitted samples, and both account for every sample.
func TestRawMatchesCallback(t *testing.T) {
	f := bpftest.Setup(t, obj)

	// Phase 1: callback mode.
	cb := bpftest.NewCollector()
	pb, err := perfbuf.New(f.Events, perfbuf.Options{PageCount: 2, SampleFunc: cb.Sample, LostFunc: cb.LostFn})
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
	pb, err = perfbuf.New(f.Events, perfbuf.Options{PageCount: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer pb.Close()
	var bufs []*perfbuf.RawBuffer
	byCPU := map[int]*perfbuf.RawBuffer{} // buffer indexes are not CPU numbers
	for i := 0; i < pb.BufferCount(); i++ {
		rb, err := pb.Buffer(i)
		if err != nil {
			t.Fatal(err)
		}
		defer rb.Release()
		if cpu, _ := pb.CPU(i); rb.CPU() != cpu {
			t.Errorf("buffer %d: RawBuffer says cpu %d, CPU(i) %d", i, rb.CPU(), cpu)
		}
		if rb.Size() != 2*os.Getpagesize() {
			t.Errorf("buffer %d: size %d, want 2 pages", i, rb.Size())
		}
		bufs = append(bufs, rb)
		byCPU[rb.CPU()] = rb
	}
	load(t, f, func() { drainRaw(t, bufs, raw) })
	raw.Check(t)
	end2 := f.Stats(t)
	wrapped := false
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
		if st.Samples != uint64(raw.Samples[cpu]) || st.Lost != raw.Lost[cpu] || st.CorruptBytes != 0 || st.Unknown != 0 {
			t.Errorf("cpu %d: RawBuffer stats %+v", cpu, st)
		}
		if rb.Tail() != rb.Head() {
			t.Errorf("cpu %d: tail %d != head %d after draining", cpu, rb.Tail(), rb.Head())
		}
		wrapped = wrapped || rb.Head() > uint64(rb.Size())
	}
	if !wrapped {
		t.Error("no ring wrapped: the test does not cover straddling records")
	}
	if got, want := relative(raw, end1), relative(cb, base1); !reflect.DeepEqual(got, want) {
		t.Errorf("raw mode and callback mode delivered different samples")
	}
	if !reflect.DeepEqual(raw.Lost, cb.Lost) {
		t.Errorf("lost: raw %v, callback %v", raw.Lost, cb.Lost)
	}
}

// Peeking does not consume: records read without Commit are read again
// after Begin, and Commit publishes data_tail only when asked.
func TestRawPeekCommit(t *testing.T) {
	f := bpftest.Setup(t, obj)
	pb, err := perfbuf.New(f.Events, perfbuf.Options{PageCount: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer pb.Close()
	rb, err := pb.Buffer(0)
	if err != nil {
		t.Fatal(err)
	}
	defer rb.Release()
	f.Emit(t, rb.CPU(), 5, 64, 0)

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
			h, err := bpftest.Check(rec.Data, rb.CPU())
			if err != nil {
				t.Fatal(err)
			}
			seqs = append(seqs, h.Seq)
		}
	}
	first, end := read()
	if len(first) != 5 || rb.Tail() != 0 {
		t.Fatalf("peek read %d records, tail %d; want 5 and 0", len(first), rb.Tail())
	}
	if rb.Used() != int(end) {
		t.Errorf("Used %d, want %d", rb.Used(), end)
	}
	again, _ := read()
	if !reflect.DeepEqual(first, again) {
		t.Errorf("peek again: %v, first %v", again, first)
	}
	if err := rb.Commit(end + 8); !errors.Is(err, perfbuf.ErrInvalidCommit) {
		t.Errorf("commit past the head: %v", err)
	}
	if err := rb.Commit(end); err != nil {
		t.Fatal(err)
	}
	if rb.Tail() != end || rb.Used() != 0 {
		t.Errorf("after commit: tail %d used %d", rb.Tail(), rb.Used())
	}
	if err := rb.Commit(0); !errors.Is(err, perfbuf.ErrInvalidCommit) {
		t.Errorf("commit backwards: %v", err)
	}
}

// A RawBuffer holds its ring: callback mode leaves it alone until Release,
// Buffer twice is ErrBusy, and Close waits for Release to unmap.
func TestRawHold(t *testing.T) {
	f := bpftest.Setup(t, obj)
	c := bpftest.NewCollector()
	pb, err := perfbuf.New(f.Events, perfbuf.Options{PageCount: 1, SampleFunc: c.Sample, LostFunc: c.LostFn})
	if err != nil {
		t.Fatal(err)
	}
	defer pb.Close()
	n := pb.BufferCount()
	for _, i := range []int{-1, n} {
		if _, err := pb.Buffer(i); !errors.Is(err, perfbuf.ErrIndex) {
			t.Errorf("Buffer(%d): %v, want ErrIndex", i, err)
		}
	}
	rb, err := pb.Buffer(0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pb.Buffer(0); !errors.Is(err, perfbuf.ErrBusy) {
		t.Errorf("Buffer(0) twice: %v, want ErrBusy", err)
	}
	if _, err := pb.ConsumeBuffer(0); !errors.Is(err, perfbuf.ErrBusy) {
		t.Errorf("ConsumeBuffer on a held ring: %v, want ErrBusy", err)
	}
	cpu0 := rb.CPU()
	f.Emit(t, cpu0, 3, 32, 0)
	if got, err := pb.Consume(); err != nil || got != 0 {
		t.Errorf("Consume with ring 0 held: %d samples, %v; want 0", got, err)
	}
	if rb.Used() == 0 {
		t.Error("ring 0 empty: callback mode drained a held ring")
	}
	rb.Release()
	rb.Release() // idempotent
	if rb.Used() != 0 {
		t.Error("a released RawBuffer still reads the ring")
	}
	if got, err := pb.Consume(); err != nil || got != 3 {
		t.Errorf("Consume after Release: %d samples, %v; want 3", got, err)
	}

	// Close with a RawBuffer held: the mapping stays until Release.
	rb, err = pb.Buffer(0)
	if err != nil {
		t.Fatal(err)
	}
	f.Emit(t, cpu0, 2, 32, 0)
	pb.Close()
	if _, err := pb.Buffer(0); !errors.Is(err, os.ErrClosed) {
		t.Errorf("Buffer after Close: %v", err)
	}
	got := 0
	if _, err := rb.Drain(func(*perfbuf.Record) bool { got++; return true }); err != nil || got != 2 {
		t.Errorf("drain after Close: %d records, %v; want 2", got, err)
	}
	rb.Release()
}
