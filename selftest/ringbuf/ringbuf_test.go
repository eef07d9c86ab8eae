// SPDX-License-Identifier: Apache-2.0

// Privileged selftests of BPF ring buffers (BPF_MAP_TYPE_RINGBUF) read by
// the same Reader, callback mode and raw mode as perf event arrays:
// ringbuf.bpf.c writes a ring buffer on a chosen CPU through
// BPF_PROG_TEST_RUN, by bpf_ringbuf_output and by reserve and submit or
// discard, and counts every attempt and its result itself; every reader
// must account for each record exactly.
package ringbuf

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/aquasecurity/libbpfgo"
	"github.com/perfbuf/perfbuf"
	"github.com/perfbuf/perfbuf/internal/bpfrun"
	"github.com/perfbuf/perfbuf/internal/cpus"
	"github.com/perfbuf/perfbuf/selftest/internal/bpftest"
)

const obj = "bpf/ringbuf.bpf.o"

// The ring's size (RING_SIZE), a run's most records (BATCH), and the flags
// of bpf_ringbuf_output, _submit and _discard (include/uapi/linux/bpf.h).
const (
	ringSize    = 64 << 10
	batch       = 64
	noWakeup    = 1 // BPF_RB_NO_WAKEUP
	forceWakeup = 2 // BPF_RB_FORCE_WAKEUP
)

// How produce writes: bpf_ringbuf_output, reserve and submit, reserve and
// discard every `every`-th.
const (
	viaOutput = iota
	viaReserve
	viaDiscard
)

type fixture struct {
	mod     *libbpfgo.Module
	events  *libbpfgo.BPFMap
	events2 *libbpfgo.BPFMap
	prog    int
	cpus    []int
}

func setup(t *testing.T) *fixture {
	t.Helper()
	m := bpftest.Load(t, obj)
	online, err := cpus.Online()
	if err != nil {
		t.Fatal(err)
	}
	return &fixture{
		mod:     m,
		events:  bpftest.Map(t, m, "events"),
		events2: bpftest.Map(t, m, "events2"),
		prog:    bpftest.Prog(t, m, "produce"),
		cpus:    online,
	}
}

// produce makes count records of size bytes on cpu, how, with flags, into
// events (which 0) or events2 (1).
func (f *fixture) produce(t *testing.T, cpu int, count, size, how, flags, every, which uint64) {
	t.Helper()
	if err := f.tryProduce(cpu, count, size, how, flags, every, which); err != nil {
		t.Fatal(err)
	}
}

func (f *fixture) tryProduce(cpu int, count, size, how, flags, every, which uint64) error {
	for done := uint64(0); done < count; done += batch {
		ret, err := bpfrun.Run(f.prog, cpu, min(count-done, batch), size, how, flags, every, which)
		if err != nil {
			return err
		}
		if ret != 0 {
			return fmt.Errorf("produce on cpu %d: program returned %d", cpu, ret)
		}
	}
	return nil
}

// outcome mirrors struct outcome: what the program saw on one CPU.
type outcome struct{ Attempts, OK, Discarded, Full, Other, NoRing uint64 }

func (o outcome) minus(b outcome) outcome {
	return outcome{o.Attempts - b.Attempts, o.OK - b.OK, o.Discarded - b.Discarded, o.Full - b.Full, o.Other - b.Other, o.NoRing - b.NoRing}
}

// outcomes reads the program's own per-CPU counts, by CPU.
func (f *fixture) outcomes(t *testing.T) map[int]outcome {
	t.Helper()
	return bpftest.PerCPU[outcome](t, f.mod, "outcomes")
}

// collector checks and counts what a reader delivered: per CPU (the
// sample's own field: a ring buffer is every CPU's), sequence numbers that
// only grow, and the size the sample says.
type collector struct {
	t    *testing.T
	mu   sync.Mutex
	got  map[int]uint64
	last map[int]uint64
}

func newCollector(t *testing.T) *collector {
	return &collector{t: t, got: map[int]uint64{}, last: map[int]uint64{}}
}

func (c *collector) sample(recCPU int, data []byte) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if recCPU != -1 {
		c.t.Errorf("a ring buffer's record says cpu %d, want -1", recCPU)
	}
	if len(data) < 16 {
		c.t.Errorf("%d-byte sample", len(data))
		return
	}
	seq := binary.NativeEndian.Uint64(data)
	cpu := int(binary.NativeEndian.Uint32(data[8:]))
	if size := int(binary.NativeEndian.Uint32(data[12:])); size != len(data) {
		c.t.Errorf("cpu %d seq %d: %d bytes, the sample says %d", cpu, seq, len(data), size)
	}
	if c.got[cpu] > 0 && seq <= c.last[cpu] {
		c.t.Errorf("cpu %d: seq %d after %d", cpu, seq, c.last[cpu])
	}
	c.last[cpu] = seq
	c.got[cpu]++
}

func (c *collector) count(cpu int) uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.got[cpu]
}

// load writes the ring from every CPU in each of the three ways: 20
// outputs of 48 bytes, 20 reserved and submitted records of 32 and 256
// bytes, and 20 reserved of which every fourth is discarded.
func load(t *testing.T, f *fixture, which uint64) {
	for _, cpu := range f.cpus {
		f.produce(t, cpu, 20, 48, viaOutput, 0, 1, which)
		f.produce(t, cpu, 10, 32, viaReserve, 0, 1, which)
		f.produce(t, cpu, 10, 256, viaReserve, 0, 1, which)
		f.produce(t, cpu, 20, 32, viaDiscard, 0, 4, which)
	}
}

// check accounts for every record: per CPU, delivered == submitted, and
// in all, the Stats' samples and discarded records are the program's, in
// the ring's entry and in the sums.
func check(t *testing.T, f *fixture, before map[int]outcome, c *collector, stats perfbuf.Stats) {
	t.Helper()
	after := f.outcomes(t)
	var ok, discarded uint64
	for _, cpu := range f.cpus {
		d := after[cpu].minus(before[cpu])
		t.Logf("cpu %d: attempted %d = submitted %d + discarded %d + full %d + other %d | delivered %d",
			cpu, d.Attempts, d.OK, d.Discarded, d.Full, d.Other, c.count(cpu))
		if d.OK+d.Discarded+d.Full+d.Other+d.NoRing != d.Attempts || d.Other != 0 {
			t.Errorf("cpu %d: the program's counts do not add up: %+v", cpu, d)
		}
		if got := c.count(cpu); got != d.OK {
			t.Errorf("cpu %d: %d delivered, %d submitted", cpu, got, d.OK)
		}
		ok, discarded = ok+d.OK, discarded+d.Discarded
	}
	if len(stats.Rings) != 1 {
		t.Fatalf("Stats: %+v; want one entry, the ring's", stats)
	}
	for i, st := range []perfbuf.Stats{stats.Rings[0], stats} {
		if st.CPU != -1 || st.Samples != ok || st.Discarded != discarded || st.Lost != 0 || st.Corrupt != 0 {
			t.Errorf("Stats %+v (%s); want cpu -1, %d samples, %d discarded", st, []string{"ring 0", "sums"}[i], ok, discarded)
		}
	}
}

// Every form of reading reads a ring buffer, and accounts for every record.
func TestRingBufForms(t *testing.T) {
	f := setup(t)
	forms := map[string]func(t *testing.T, c *collector) (stats func() perfbuf.Stats, closeFn func()){
		"ReadInto": func(t *testing.T, c *collector) (func() perfbuf.Stats, func()) {
			r := newReader(t, f.events, perfbuf.ReaderOptions{})
			load(t, f, 0)
			r.Flush()
			var s perfbuf.Sample
			for {
				err := r.ReadInto(&s)
				if errors.Is(err, perfbuf.ErrFlushed) {
					break
				}
				if err != nil {
					t.Fatal(err)
				}
				c.sample(s.CPU, s.Data)
			}
			return r.Stats, func() { r.Close() }
		},
		"Each": func(t *testing.T, c *collector) (func() perfbuf.Stats, func()) {
			r := newReader(t, f.events, perfbuf.ReaderOptions{})
			load(t, f, 0)
			r.Flush()
			err := r.Each(context.Background(), func(rec *perfbuf.Record) error {
				c.sample(rec.CPU, rec.Data)
				return nil
			})
			if !errors.Is(err, perfbuf.ErrFlushed) {
				t.Fatal(err)
			}
			return r.Stats, func() { r.Close() }
		},
		"Batches": func(t *testing.T, c *collector) (func() perfbuf.Stats, func()) {
			r := newReader(t, f.events, perfbuf.ReaderOptions{})
			load(t, f, 0)
			r.Flush()
			for b, err := range r.Batches(context.Background()) {
				if err != nil {
					if !errors.Is(err, perfbuf.ErrFlushed) {
						t.Fatal(err)
					}
					break
				}
				for b.Next() {
					rec := b.Record()
					c.sample(rec.CPU, rec.Data)
				}
			}
			return r.Stats, func() { r.Close() }
		},
		"Consume": func(t *testing.T, c *collector) (func() perfbuf.Stats, func()) {
			r := newReader(t, f.events, perfbuf.ReaderOptions{})
			load(t, f, 0)
			if _, err := r.Consume(func(rec *perfbuf.Record) error {
				c.sample(rec.CPU, rec.Data)
				return nil
			}); err != nil {
				t.Fatal(err)
			}
			return r.Stats, func() { r.Close() }
		},
		"callback": func(t *testing.T, c *collector) (func() perfbuf.Stats, func()) {
			pb, err := perfbuf.New(f.events, c.sample, nil, perfbuf.Options{})
			if err != nil {
				t.Fatal(err)
			}
			load(t, f, 0)
			if n, err := pb.Poll(time.Second); n == 0 || err != nil {
				t.Fatalf("Poll = %d, %v", n, err)
			}
			if _, err := pb.Consume(); err != nil {
				t.Fatal(err)
			}
			return pb.Stats, func() { pb.Close() }
		},
		"raw": func(t *testing.T, c *collector) (func() perfbuf.Stats, func()) {
			pb, err := perfbuf.NewRaw(f.events, perfbuf.Options{})
			if err != nil {
				t.Fatal(err)
			}
			load(t, f, 0)
			ready, err := pb.Wait(time.Second, nil)
			if len(ready) != 1 || ready[0] != 0 || err != nil {
				t.Fatalf("Wait = %v, %v; want ring 0", ready, err)
			}
			rb, err := pb.Buffer(0)
			if err != nil {
				t.Fatal(err)
			}
			defer rb.Release()
			if _, err := rb.Drain(func(rec *perfbuf.Record) error {
				if len(rec.Wrapped) != 0 {
					t.Errorf("a ring buffer record in two parts")
				}
				c.sample(rec.CPU, rec.Data)
				return nil
			}); err != nil {
				t.Fatal(err)
			}
			// The RawBuffer's counts, as the sums of its one ring.
			st := rb.Stats()
			st.Rings = []perfbuf.Stats{st}
			return func() perfbuf.Stats { return st }, func() { pb.Close() }
		},
	}
	for name, read := range forms {
		t.Run(name, func(t *testing.T) {
			before := f.outcomes(t)
			c := newCollector(t)
			stats, closeFn := read(t, c)
			check(t, f, before, c, stats())
			closeFn()
			if st := stats(); st.Left != 0 || st.Rings[0].Left != 0 {
				t.Errorf("left %d (ring 0: %d) at Close, want none", st.Left, st.Rings[0].Left)
			}
		})
	}
}

func newReader(t *testing.T, m perfbuf.Map, opts perfbuf.ReaderOptions) *perfbuf.Reader {
	t.Helper()
	r, err := perfbuf.NewReader(m, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	return r
}

// A full ring refuses records in the program (nothing is lost unseen: the
// program counts them), and the reader delivers every record that got in;
// what is still in the ring at Close is counted as left.
func TestRingBufFullAndLeft(t *testing.T) {
	f := setup(t)
	before := f.outcomes(t)
	c := newCollector(t)
	r := newReader(t, f.events, perfbuf.ReaderOptions{})
	cpu := f.cpus[len(f.cpus)-1]
	f.produce(t, cpu, 400, 256, viaReserve, 0, 1, 0) // 264 bytes each: 248 fit in 64 KiB
	d := f.outcomes(t)[cpu].minus(before[cpu])
	if d.Full == 0 || d.OK == 0 {
		t.Fatalf("the ring did not fill: %+v", d)
	}
	var n uint64
	stop := errors.New("enough")
	_, err := r.Consume(func(rec *perfbuf.Record) error {
		c.sample(rec.CPU, rec.Data)
		if n++; n == d.OK/2 {
			return stop
		}
		return nil
	})
	if err != stop {
		t.Fatal(err)
	}
	r.Close()
	st := r.Stats().Rings[0]
	t.Logf("cpu %d: attempted %d = submitted %d + full %d | delivered %d, left %d", cpu, d.Attempts, d.OK, d.Full, st.Samples, st.Left)
	if st.Samples != d.OK/2 || st.Samples+st.Left != d.OK {
		t.Errorf("Stats %+v: delivered + left != %d submitted", st, d.OK)
	}
}

// The wake rule: the kernel wakes a ring buffer's reader only when the
// consumer position it published has caught up with the record committed
// (or with BPF_RB_FORCE_WAKEUP; never with BPF_RB_NO_WAKEUP). A blocked
// read returns for a record written with the default flags or forced, and
// for one written without a wakeup within MaxLatency; under load from every
// CPU, with each setting, nothing is left behind and no read hangs.
func TestRingBufWakeups(t *testing.T) {
	f := setup(t)
	for _, tc := range []struct {
		name    string
		flags   uint64
		latency time.Duration
	}{
		{"default", 0, 0},
		{"force", forceWakeup, 0},
		{"no wakeup", noWakeup, 20 * time.Millisecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := f.outcomes(t)
			c := newCollector(t)
			r := newReader(t, f.events, perfbuf.ReaderOptions{MaxLatency: tc.latency})
			cpu := f.cpus[0]
			got := make(chan error, 1)
			var s perfbuf.Sample
			go func() { got <- r.ReadInto(&s) }()
			time.Sleep(20 * time.Millisecond) // the read blocks first (either order is correct)
			f.produce(t, cpu, 1, 48, viaOutput, tc.flags, 1, 0)
			select {
			case err := <-got:
				if err != nil {
					t.Fatal(err)
				}
				c.sample(s.CPU, s.Data)
			case <-time.After(5 * time.Second):
				t.Fatalf("a blocked read did not return 5 s after a record")
			}

			// Load: a producer on each CPU, the reader blocking between
			// records, then a Flush once the producers are done.
			var wg sync.WaitGroup
			errs := make(chan error, len(f.cpus))
			for _, cpu := range f.cpus {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for range 50 {
						if err := f.tryProduce(cpu, 20, 32, viaReserve, tc.flags, 1, 0); err != nil {
							errs <- err
							return
						}
					}
				}()
			}
			done := make(chan error, 1)
			go func() {
				for {
					err := r.ReadInto(&s)
					if errors.Is(err, perfbuf.ErrFlushed) {
						done <- nil
						return
					}
					if err != nil {
						done <- err
						return
					}
					c.sample(s.CPU, s.Data)
				}
			}()
			wg.Wait()
			close(errs)
			for err := range errs {
				t.Fatal(err)
			}
			r.Flush()
			select {
			case err := <-done:
				if err != nil {
					t.Fatal(err)
				}
			case <-time.After(10 * time.Second):
				t.Fatalf("the reader did not finish 10 s after the producers")
			}
			check(t, f, before, c, r.Stats())
		})
	}
}

// What does not apply to a ring buffer is refused with a clear error; one
// reader per ring buffer in a process; two ring buffers read at once.
func TestRingBufOptions(t *testing.T) {
	f := setup(t)
	for name, c := range map[string]struct {
		opts perfbuf.ReaderOptions
		want error
	}{
		"RingBytes":     {perfbuf.ReaderOptions{Options: perfbuf.Options{RingBytes: 4096}}, os.ErrInvalid},
		"WakeupEvents":  {perfbuf.ReaderOptions{Options: perfbuf.Options{WakeupEvents: 8}}, os.ErrInvalid},
		"WakeupBytes":   {perfbuf.ReaderOptions{Options: perfbuf.Options{WakeupBytes: ringSize}}, os.ErrInvalid},
		"MaxSampleSize": {perfbuf.ReaderOptions{Options: perfbuf.Options{MaxSampleSize: ringSize - 15}}, perfbuf.ErrSampleTooLarge},
	} {
		if r, err := perfbuf.NewReader(f.events, c.opts); !errors.Is(err, c.want) {
			t.Errorf("%s: %v, want %v", name, err, c.want)
			if r != nil {
				r.Close()
			}
		}
	}
	// A RingBytes that agrees with the ring buffer's size is taken.
	if r, err := perfbuf.NewReader(f.events, perfbuf.ReaderOptions{Options: perfbuf.Options{RingBytes: ringSize}}); err != nil {
		t.Errorf("RingBytes %d, the ring buffer's size: %v", ringSize, err)
	} else {
		r.Close()
	}
	r := newReader(t, f.events, perfbuf.ReaderOptions{Options: perfbuf.Options{MaxSampleSize: ringSize - 16}}) // the largest record the kernel reserves
	if _, err := perfbuf.NewReader(f.events, perfbuf.ReaderOptions{}); !errors.Is(err, perfbuf.ErrMapInUse) {
		t.Errorf("a second reader of the ring buffer: %v, want ErrMapInUse", err)
	}
	r2 := newReader(t, f.events2, perfbuf.ReaderOptions{})
	before := f.outcomes(t)
	c1, c2 := newCollector(t), newCollector(t)
	load(t, f, 0)
	load(t, f, 1)
	for _, x := range []struct {
		r *perfbuf.Reader
		c *collector
	}{{r, c1}, {r2, c2}} {
		if _, err := x.r.Consume(func(rec *perfbuf.Record) error { x.c.sample(rec.CPU, rec.Data); return nil }); err != nil {
			t.Fatal(err)
		}
	}
	after := f.outcomes(t)
	for _, cpu := range f.cpus {
		if ok := after[cpu].OK - before[cpu].OK; c1.count(cpu)+c2.count(cpu) != ok {
			t.Errorf("cpu %d: %d + %d delivered, %d submitted", cpu, c1.count(cpu), c2.count(cpu), ok)
		}
	}
	r.Close()
	r = newReader(t, f.events, perfbuf.ReaderOptions{}) // free again after Close
	r.Close()
}

// Raw mode peeks without committing: Begin reads the same records again
// until Commit hands them back, and Used tells the fill.
func TestRingBufRawPeek(t *testing.T) {
	f := setup(t)
	pb, err := perfbuf.NewRaw(f.events, perfbuf.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer pb.Close()
	rb, err := pb.Buffer(0)
	if err != nil {
		t.Fatal(err)
	}
	defer rb.Release()
	f.produce(t, f.cpus[0], 3, 48, viaOutput, 0, 1, 0)
	if rb.Stats().Fill != 3*(48+8) || rb.Stats().CPU != -1 || rb.Stats().Size != ringSize {
		t.Fatalf("Fill %d, CPU %d, Size %d; want 168, -1, %d", rb.Stats().Fill, rb.Stats().CPU, rb.Stats().Size, ringSize)
	}
	var seqs []uint64
	var second perfbuf.Record
	for pass := range 2 {
		rb.Begin()
		var rec perfbuf.Record
		for k := 0; ; k++ {
			ok, err := rb.Next(&rec)
			if err != nil {
				t.Fatal(err)
			}
			if !ok {
				break
			}
			seqs = append(seqs, binary.NativeEndian.Uint64(rec.Data))
			if k == 1 && pass == 0 {
				second = rec
			}
		}
	}
	if len(seqs) != 6 || fmt.Sprint(seqs[:3]) != fmt.Sprint(seqs[3:]) {
		t.Fatalf("two passes read %v; want the same 3 records twice", seqs)
	}
	if err := rb.Commit(second.Next); err != nil {
		t.Fatal(err)
	}
	if rb.Stats().Fill != 48+8 {
		t.Errorf("Fill %d after committing two records, want 56", rb.Stats().Fill)
	}
}

// Several ring buffers in one Reader: an array of maps whose inner maps are
// ring buffers (its empty slots passed over), or the rings given as the map
// and Options.Maps; fullest-first reads across them, and Stats has an
// entry for each ring. Mixing in a perf event array is refused.
func TestRingBufSeveral(t *testing.T) {
	f := setup(t)
	outer := bpftest.Map(t, f.mod, "rings")
	inner := []*libbpfgo.BPFMap{bpftest.Map(t, f.mod, "inner0"), bpftest.Map(t, f.mod, "inner1")}
	for name, open := range map[string]func() (*perfbuf.Reader, error){
		"array of maps": func() (*perfbuf.Reader, error) { return perfbuf.NewReader(outer, perfbuf.ReaderOptions{}) },
		"Maps": func() (*perfbuf.Reader, error) {
			return perfbuf.NewReader(inner[0], perfbuf.ReaderOptions{Options: perfbuf.Options{Maps: []perfbuf.Map{inner[1]}}})
		},
	} {
		t.Run(name, func(t *testing.T) {
			r, err := open()
			if err != nil {
				t.Fatal(err)
			}
			defer r.Close()
			before := f.outcomes(t)
			var slots [2]*collector
			for k := range slots {
				slots[k] = newCollector(t)
				for _, cpu := range f.cpus {
					f.produce(t, cpu, 30, 48, viaOutput, 0, 1, 2+uint64(k))
					f.produce(t, cpu, 8, 32, viaDiscard, 0, 2, 2+uint64(k))
				}
			}
			for _, cpu := range f.cpus {
				f.produce(t, cpu, 5, 48, viaOutput, 0, 1, 2+3) // slot 3: empty
			}
			if _, err := r.Consume(func(rec *perfbuf.Record) error {
				if rec.Ring < 0 || rec.Ring > 1 {
					t.Fatalf("record of ring %d", rec.Ring)
				}
				slots[rec.Ring].sample(rec.CPU, rec.Data)
				return nil
			}); err != nil {
				t.Fatal(err)
			}
			after := f.outcomes(t)
			st := r.Stats()
			if len(st.Rings) != 2 {
				t.Fatalf("Stats %+v; want an entry per ring", st)
			}
			for _, cpu := range f.cpus {
				d := after[cpu].minus(before[cpu])
				got := slots[0].count(cpu) + slots[1].count(cpu)
				t.Logf("cpu %d: attempted %d = submitted %d + discarded %d + no ring %d | delivered %d (%d + %d)",
					cpu, d.Attempts, d.OK, d.Discarded, d.NoRing, got, slots[0].count(cpu), slots[1].count(cpu))
				if got != d.OK || d.NoRing != 5 || slots[0].count(cpu) != slots[1].count(cpu) {
					t.Errorf("cpu %d: %+v; delivered %d", cpu, d, got)
				}
			}
			for i, s := range st.Rings {
				if s.CPU != -1 || s.Samples != uint64(len(f.cpus))*(30+4) || s.Discarded != uint64(len(f.cpus))*4 {
					t.Errorf("ring %d: Stats %+v", i, s)
				}
			}
			if _, err := perfbuf.NewReader(inner[1], perfbuf.ReaderOptions{}); !errors.Is(err, perfbuf.ErrMapInUse) {
				t.Errorf("another reader of an inner ring: %v, want ErrMapInUse", err)
			}
		})
	}
	if _, err := perfbuf.NewReader(f.events, perfbuf.ReaderOptions{Options: perfbuf.Options{Maps: []perfbuf.Map{bpftest.Map(t, f.mod, "outcomes")}}}); !errors.Is(err, perfbuf.ErrMapType) {
		t.Errorf("a per-CPU array among the maps: %v, want ErrMapType", err)
	}
	if _, err := perfbuf.NewReader(f.events, perfbuf.ReaderOptions{Options: perfbuf.Options{Maps: []perfbuf.Map{f.events}}}); !errors.Is(err, perfbuf.ErrMapInUse) {
		t.Errorf("the same ring twice: %v, want ErrMapInUse", err)
	}
	if r, err := perfbuf.NewReader(f.events, perfbuf.ReaderOptions{}); err != nil {
		t.Errorf("the ring after the refusals: %v (a claim left behind?)", err)
	} else {
		r.Close()
	}
}

// The positions libbpf's ring__consumer_pos and ring__producer_pos
// return, as a RawBuffer shows them: Fill is the bytes between them, and a
// record's Pos and Next are ring positions, the first record's Pos the
// consumer position, before and after a commit.
func TestRingBufPositions(t *testing.T) {
	f := setup(t)
	pb, err := perfbuf.NewRaw(f.events, perfbuf.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer pb.Close()
	rb, err := pb.Buffer(0)
	if err != nil {
		t.Fatal(err)
	}
	defer rb.Release()
	// read parses up to a new snapshot and returns the records' positions.
	read := func() (pos []uint64, next uint64) {
		t.Helper()
		rb.Begin()
		var rec perfbuf.Record
		for {
			ok, err := rb.Next(&rec)
			if err != nil {
				t.Fatal(err)
			}
			if !ok {
				return pos, next
			}
			pos, next = append(pos, rec.Pos), rec.Next
		}
	}
	if fill := rb.Stats().Fill; fill != 0 {
		t.Fatalf("Fill %d before any record, want 0", fill)
	}
	f.produce(t, f.cpus[0], 2, 48, viaOutput, 0, 1, 0)
	pos, next := read()
	if len(pos) != 2 || pos[1] != pos[0]+56 || next != pos[0]+2*56 || rb.Stats().Fill != int(next-pos[0]) {
		t.Fatalf("after 2 records: positions %v up to %d, Fill %d; want 2 records of 56 bytes, Fill 112", pos, next, rb.Stats().Fill)
	}
	if _, err := rb.Drain(func(*perfbuf.Record) error { return nil }); err != nil {
		t.Fatal(err)
	}
	if fill := rb.Stats().Fill; fill != 0 {
		t.Errorf("after Drain: Fill %d, want 0", fill)
	}
	// The consumer position moved to where the records ended.
	f.produce(t, f.cpus[0], 1, 48, viaOutput, 0, 1, 0)
	if pos2, next2 := read(); len(pos2) != 1 || pos2[0] != next || next2 != next+56 {
		t.Errorf("a record after Drain at %v up to %d; want one at %d", pos2, next2, next)
	}
}

// Within a budget over a real ring buffer, a Reader that caught up keeps
// consumer_pos at the start of the last record it delivered, so the
// kernel wakes it for the first record after a quiet spell and not for
// the ones after it, which come at the budget's next look; a forced
// wakeup still reaches it. The steps go by order, not time: the budget is
// an hour, the read waits before the first record, and a Flush stands for
// the budget's look. (The rule itself, with a producer that counts the
// wakeups it raises: TestReaderRingBufBudget in the root package.)
func TestRingBufHoldBack(t *testing.T) {
	f := setup(t)
	cpu := f.cpus[0]
	const reading = "perfbuf.(*Reader).ReadBatch"
	for _, opts := range []perfbuf.Options{{}, {WakeupBytes: 2 * 56}} {
		r := newReader(t, f.events, perfbuf.ReaderOptions{Options: opts, MaxLatency: time.Hour})
		// read reads one batch in the background once the read waits.
		read := func(out func()) chan int {
			t.Helper()
			n := make(chan int, 1)
			go func() {
				var batch [64]perfbuf.Sample
				k, err := r.ReadBatch(batch[:])
				if err != nil {
					t.Error(err)
				}
				n <- k
			}()
			if !bpftest.Parked(reading, 30*time.Second) {
				t.Fatal("the read never waited")
			}
			out()
			return n
		}
		// got is what a read returned, within 30 s: a hang, not a bound.
		got := func(n chan int) int {
			t.Helper()
			select {
			case k := <-n:
				return k
			case <-time.After(30 * time.Second):
				r.Close()
				t.Fatalf("WakeupBytes %d: a read still waits 30 s on; Wakeups %d", opts.WakeupBytes, r.Stats().Wakeups)
				return 0
			}
		}

		if k := got(read(func() { f.produce(t, cpu, 1, 48, viaOutput, 0, 1, 0) })); k != 1 || r.Stats().Wakeups != 1 {
			t.Errorf("WakeupBytes %d: the first record: %d delivered after %d wakeups; want 1 at once, woken", opts.WakeupBytes, k, r.Stats().Wakeups)
		}
		if opts.WakeupBytes == 0 {
			n := read(func() { f.produce(t, cpu, 3, 48, viaOutput, 0, 1, 0) })
			if !bpftest.Parked(reading, 30*time.Second) {
				t.Fatal("the read returned")
			}
			r.Flush() // the budget's look
			if k := got(n); k != 3 || r.Stats().Wakeups != 1 {
				t.Errorf("three records after the first: %d delivered after %d wakeups; want 3, no wakeup", k, r.Stats().Wakeups)
			}
		} else {
			// A forced wakeup, as PERFBUF_BUFFER raises at WakeupBytes.
			if k := got(read(func() { f.produce(t, cpu, 1, 48, viaOutput, forceWakeup, 1, 0) })); k != 1 || r.Stats().Wakeups != 2 {
				t.Errorf("a forced wakeup: %d delivered after %d wakeups; want 1, woken", k, r.Stats().Wakeups)
			}
		}
		r.Close()
	}
}

// The ledger at Close, exact with discarded records still in the ring: per
// ring, delivered + Discarded + Left is every record that got in (submitted
// or discarded), whatever the reader read before Close: nothing, some
// (a Reader's Consume stopped after 7 samples) or all (callback Consume).
// Discarded records left unread used to be in no count.
func TestRingBufCloseLedgerDiscarded(t *testing.T) {
	f := setup(t)
	stop := errors.New("enough")
	type opened struct {
		read  func()
		stats func() perfbuf.Stats
		close func()
	}
	forms := map[string]func(t *testing.T, c *collector) opened{
		"Reader/none": func(t *testing.T, c *collector) opened {
			r := newReader(t, f.events, perfbuf.ReaderOptions{})
			return opened{func() {}, r.Stats, func() { r.Close() }}
		},
		"Reader/some": func(t *testing.T, c *collector) opened {
			r := newReader(t, f.events, perfbuf.ReaderOptions{})
			return opened{func() {
				n := 0
				_, err := r.Consume(func(rec *perfbuf.Record) error {
					c.sample(rec.CPU, rec.Data)
					if n++; n == 7 {
						return stop
					}
					return nil
				})
				if err != stop {
					t.Fatal(err)
				}
			}, r.Stats, func() { r.Close() }}
		},
		"callback/none": func(t *testing.T, c *collector) opened {
			pb, err := perfbuf.New(f.events, c.sample, nil, perfbuf.Options{})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { pb.Close() })
			return opened{func() {}, pb.Stats, func() { pb.Close() }}
		},
		"callback/all": func(t *testing.T, c *collector) opened {
			pb, err := perfbuf.New(f.events, c.sample, nil, perfbuf.Options{})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { pb.Close() })
			return opened{func() {
				if _, err := pb.Consume(); err != nil {
					t.Fatal(err)
				}
			}, pb.Stats, func() { pb.Close() }}
		},
	}
	for name, open := range forms {
		t.Run(name, func(t *testing.T) {
			// What an earlier run left in the ring is not this one's.
			drain := newReader(t, f.events, perfbuf.ReaderOptions{})
			if _, err := drain.Consume(func(*perfbuf.Record) error { return nil }); err != nil {
				t.Fatal(err)
			}
			drain.Close()
			before := f.outcomes(t)
			c := newCollector(t)
			o := open(t, c)
			for _, cpu := range f.cpus {
				f.produce(t, cpu, 30, 40, viaDiscard, 0, 3, 0) // every third discarded
			}
			o.read()
			o.close()
			st := o.stats().Rings[0]
			var in, delivered uint64
			for _, cpu := range f.cpus {
				d := f.outcomes(t)[cpu].minus(before[cpu])
				if d.Full != 0 || d.Other != 0 || d.Discarded == 0 {
					t.Fatalf("cpu %d: %+v; want every record in the ring, some discarded", cpu, d)
				}
				in += d.OK + d.Discarded
				delivered += c.count(cpu)
			}
			t.Logf("ring: in %d = delivered %d + discarded %d + left %d", in, st.Samples, st.Discarded, st.Left)
			if st.Samples != delivered || st.Samples+st.Discarded+st.Left != in {
				t.Errorf("Stats %+v: delivered %d + discarded %d + left %d != %d in the ring", st, st.Samples, st.Discarded, st.Left, in)
			}
		})
	}
}

// Stats after Close, once the read in progress has unmapped the ring at
// its end (the last call out frees), says the ring's size as it was, not
// that of the empty ring Close points it at; and a Stats while the ring
// is unmapped does not race with the unmap (mountsnoop's Stats and a Flush
// that freed the ring did, under the race detector).
func TestStatsAfterClose(t *testing.T) {
	f := setup(t)
	for round := range 10 {
		r, err := perfbuf.NewReader(f.events, perfbuf.ReaderOptions{})
		if err != nil {
			t.Fatal(err)
		}
		read := make(chan error)
		go func() {
			var s perfbuf.Sample
			read <- r.ReadInto(&s) // blocks: nothing to read
		}()
		time.Sleep(time.Millisecond)
		during := make(chan perfbuf.Stats)
		go func() { during <- r.Stats() }()
		r.Close()
		<-read
		for _, sts := range []perfbuf.Stats{<-during, r.Stats()} {
			for _, st := range append([]perfbuf.Stats{sts}, sts.Rings...) {
				if st.Size != ringSize {
					t.Fatalf("round %d, after Close: size %d, want %d", round, st.Size, ringSize)
				}
			}
		}
	}
}
