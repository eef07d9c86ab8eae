// SPDX-License-Identifier: Apache-2.0

// Privileged selftests of a build without cgo (CGO_ENABLED=0; `make
// test-nocgo`): BPF objects loaded with cilium/ebpf, not libbpfgo (which
// needs cgo), and read through perfbuf in every form: a BPF ring buffer
// (selftest/ringbuf's program) and a perf event array, whose rings then
// open through perfbuf's own opener (selftest/opener's program). Every
// output is accounted for: per CPU, what the program output is what was
// delivered, lost, left in the ring at Close, or failed in the program.
//
// The package has no cgo dependency, so it runs in cgo builds too, where
// perf event arrays open through libbpf.
package nocgo

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"maps"
	"os"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/perfbuf/perfbuf"
	"github.com/perfbuf/perfbuf/internal/cpus"
	"github.com/perfbuf/perfbuf/internal/kernel"
)

// The objects, built by `make bpf`.
const (
	ringbufObj = "../ringbuf/bpf/ringbuf.bpf.o"
	perfObj    = "../opener/bpf/opener.bpf.o"
)

// testRunOnCPU is BPF_F_TEST_RUN_ON_CPU (include/uapi/linux/bpf.h), which
// x/sys/unix lacks.
const testRunOnCPU = 1

// load loads obj with cilium/ebpf, closed at cleanup; it skips without the
// privileges (fails under CI).
func load(t *testing.T, obj string) *ebpf.Collection {
	t.Helper()
	coll, err := ebpf.LoadCollection(obj)
	if err != nil {
		if errors.Is(err, os.ErrPermission) && os.Getenv("CI") != "true" {
			t.Skipf("load %s (needs CAP_BPF, CAP_PERFMON): %v", obj, err)
		}
		t.Fatalf("load %s: %v", obj, err)
	}
	t.Cleanup(coll.Close)
	return coll
}

// run runs the raw_tp program prog once on cpu with args as its context.
func run(prog *ebpf.Program, cpu int, args ...uint64) error {
	ret, err := prog.Run(&ebpf.RunOptions{Context: args, CPU: uint32(cpu), Flags: testRunOnCPU})
	if err != nil {
		return fmt.Errorf("run on cpu %d: %w", cpu, err)
	}
	if ret != 0 {
		return fmt.Errorf("run on cpu %d: program returned %d", cpu, ret)
	}
	return nil
}

// perCPU reads key 0 of the per-CPU array m by CPU: the kernel returns one
// value per possible CPU, in the order of the possible CPUs.
func perCPU[T any](t *testing.T, m *ebpf.Map) map[int]T {
	t.Helper()
	var vals []T
	if err := m.Lookup(uint32(0), &vals); err != nil {
		t.Fatal(err)
	}
	possible, err := cpus.Possible()
	if err != nil {
		t.Fatal(err)
	}
	if len(vals) != len(possible) {
		t.Fatalf("%d values for %d possible cpus", len(vals), len(possible))
	}
	out := make(map[int]T, len(vals))
	for k, cpu := range possible {
		out[cpu] = vals[k]
	}
	return out
}

func online(t *testing.T) []int {
	t.Helper()
	c, err := cpus.Online()
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// tally counts what a reader delivered, by the CPU that wrote it, and
// checks each sample: the CPU it says, a sequence number that only grows.
type tally struct {
	mu        sync.Mutex
	samples   map[int]uint64
	lost      map[int]uint64
	last      map[int]uint64
	errs      []error
	cpuOf     func(recCPU int, data []byte) (cpu int, seq uint64, ok bool, err error)
	delivered int
}

func newTally(cpuOf func(int, []byte) (int, uint64, bool, error)) *tally {
	return &tally{samples: map[int]uint64{}, lost: map[int]uint64{}, last: map[int]uint64{}, cpuOf: cpuOf}
}

func (c *tally) sample(recCPU int, data []byte) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.delivered++
	cpu, seq, ok, err := c.cpuOf(recCPU, data)
	if err != nil {
		c.errs = append(c.errs, err)
		return
	}
	if ok {
		if c.samples[cpu] > 0 && seq <= c.last[cpu] {
			c.errs = append(c.errs, fmt.Errorf("cpu %d: seq %d after %d", cpu, seq, c.last[cpu]))
		}
		c.last[cpu] = seq
	}
	c.samples[cpu]++
}

func (c *tally) lostFn(cpu int, n uint64) {
	c.mu.Lock()
	c.lost[cpu] += n
	c.mu.Unlock()
}

func (c *tally) record(rec *perfbuf.Record) error {
	switch rec.Type {
	case perfbuf.RecordSample:
		c.sample(rec.CPU, append(slices.Clip(rec.Data), rec.Wrapped...))
	case perfbuf.RecordLost:
		c.lostFn(rec.CPU, rec.Lost)
	}
	return nil
}

func (c *tally) sampleOf(s *perfbuf.Sample) {
	switch s.Type {
	case perfbuf.RecordSample:
		c.sample(s.CPU, s.Data)
	case perfbuf.RecordLost:
		c.lostFn(s.CPU, s.Lost)
	}
}

func (c *tally) check(t *testing.T) {
	t.Helper()
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, err := range c.errs[:min(len(c.errs), 10)] {
		t.Error(err)
	}
}

// reader is one read form over a map: open opens it, drain delivers what
// the rings hold to c, closeFn closes it and returns its Stats.
type reader struct {
	drain   func(t *testing.T)
	closeFn func() perfbuf.Stats
	rings   int
}

// form opens a reader of one form over m, delivering to c.
type form func(t *testing.T, m perfbuf.Map, opts perfbuf.ReaderOptions, c *tally) reader

// flushRead drains a Reader through read, a loop that stops at ErrFlushed.
func flushRead(t *testing.T, r *perfbuf.Reader, read func() error) {
	t.Helper()
	r.Flush()
	for {
		err := read()
		if errors.Is(err, perfbuf.ErrFlushed) {
			return
		}
		if err != nil {
			t.Fatal(err)
		}
	}
}

// forms are the read forms: the Reader's (ReadInto, ReadBatch, Each,
// Batches, Consume), callback mode's (Poll, Consume) and raw mode's (Wait,
// Buffer, Drain).
var forms = map[string]form{
	"ReadInto": func(t *testing.T, m perfbuf.Map, opts perfbuf.ReaderOptions, c *tally) reader {
		r := newReader(t, m, opts)
		var s perfbuf.Sample
		return reader{
			drain: func(t *testing.T) {
				flushRead(t, r, func() error {
					err := r.ReadInto(&s)
					if err == nil {
						c.sampleOf(&s)
					}
					return err
				})
			},
			closeFn: func() perfbuf.Stats { r.Close(); return r.Stats() },
			rings:   r.BufferCount(),
		}
	},
	"ReadBatch": func(t *testing.T, m perfbuf.Map, opts perfbuf.ReaderOptions, c *tally) reader {
		r := newReader(t, m, opts)
		batch := make([]perfbuf.Sample, 16)
		return reader{
			drain: func(t *testing.T) {
				flushRead(t, r, func() error {
					n, err := r.ReadBatch(batch)
					for i := range batch[:n] {
						c.sampleOf(&batch[i])
					}
					return err
				})
			},
			closeFn: func() perfbuf.Stats { r.Close(); return r.Stats() },
			rings:   r.BufferCount(),
		}
	},
	"Each": func(t *testing.T, m perfbuf.Map, opts perfbuf.ReaderOptions, c *tally) reader {
		r := newReader(t, m, opts)
		return reader{
			drain: func(t *testing.T) {
				r.Flush()
				if err := r.Each(context.Background(), c.record); !errors.Is(err, perfbuf.ErrFlushed) {
					t.Fatal(err)
				}
			},
			closeFn: func() perfbuf.Stats { r.Close(); return r.Stats() },
			rings:   r.BufferCount(),
		}
	},
	"Batches": func(t *testing.T, m perfbuf.Map, opts perfbuf.ReaderOptions, c *tally) reader {
		r := newReader(t, m, opts)
		return reader{
			drain: func(t *testing.T) {
				r.Flush()
				for b, err := range r.Batches(context.Background()) {
					if err != nil {
						if !errors.Is(err, perfbuf.ErrFlushed) {
							t.Fatal(err)
						}
						return
					}
					for b.Next() {
						if err := c.record(b.Record()); err != nil {
							t.Fatal(err)
						}
					}
				}
			},
			closeFn: func() perfbuf.Stats { r.Close(); return r.Stats() },
			rings:   r.BufferCount(),
		}
	},
	"Consume": func(t *testing.T, m perfbuf.Map, opts perfbuf.ReaderOptions, c *tally) reader {
		r := newReader(t, m, opts)
		return reader{
			drain: func(t *testing.T) {
				if _, err := r.Consume(c.record); err != nil {
					t.Fatal(err)
				}
			},
			closeFn: func() perfbuf.Stats { r.Close(); return r.Stats() },
			rings:   r.BufferCount(),
		}
	},
	"callback": func(t *testing.T, m perfbuf.Map, opts perfbuf.ReaderOptions, c *tally) reader {
		pb := newPerfBuffer(t, m, c.sample, c.lostFn, opts.Options)
		return reader{
			drain: func(t *testing.T) {
				// Something was written: Poll returns for it at once.
				if n, err := pb.Poll(time.Minute); n == 0 || err != nil {
					t.Fatalf("Poll = %d, %v", n, err)
				}
				if _, err := pb.Consume(); err != nil {
					t.Fatal(err)
				}
			},
			closeFn: func() perfbuf.Stats { pb.Close(); return pb.Stats() },
			rings:   pb.BufferCount(),
		}
	},
	"raw": func(t *testing.T, m perfbuf.Map, opts perfbuf.ReaderOptions, c *tally) reader {
		pb, err := perfbuf.NewRaw(m, opts.Options)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { pb.Close() })
		// One RawBuffer a ring for the whole test: what it reads is in its
		// own Stats, added to the Raw's (Left, at Close) below.
		bufs := make([]*perfbuf.RawBuffer, pb.BufferCount())
		for i := range bufs {
			b, err := pb.Buffer(i)
			if err != nil {
				t.Fatal(err)
			}
			bufs[i] = b
		}
		return reader{
			drain: func(t *testing.T) {
				if ready, err := pb.Wait(time.Minute, nil); len(ready) == 0 || err != nil {
					t.Fatalf("Wait = %v, %v", ready, err)
				}
				for _, b := range bufs {
					if _, err := b.Drain(c.record); err != nil {
						t.Fatal(err)
					}
				}
			},
			closeFn: func() perfbuf.Stats {
				for _, b := range bufs {
					b.Release()
				}
				pb.Close()
				stats := pb.Stats()
				for i, b := range bufs {
					rs := b.Stats()
					for _, s := range []*perfbuf.Stats{&stats, &stats.Rings[i]} {
						s.Samples += rs.Samples
						s.Lost += rs.Lost
						s.Discarded += rs.Discarded
						s.Corrupt += rs.Corrupt
					}
				}
				return stats
			},
			rings: len(bufs),
		}
	},
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

func newPerfBuffer(t *testing.T, m perfbuf.Map, sample func(int, []byte), lost func(int, uint64), opts perfbuf.Options) *perfbuf.PerfBuffer {
	t.Helper()
	pb, err := perfbuf.New(m, sample, lost, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pb.Close() })
	return pb
}

// outcome mirrors ringbuf.bpf.c's struct outcome: one CPU's attempts and
// their results.
type outcome struct{ Attempts, OK, Discarded, Full, Other, NoRing uint64 }

// A BPF ring buffer, read in every form: per CPU, the program's records
// submitted are those delivered or left in the ring at Close, and in all
// the Stats' samples, discarded records and left are what the program and
// the reader saw.
func TestRingBufNoCgo(t *testing.T) {
	cpuList := online(t)
	for name, open := range forms {
		t.Run(name, func(t *testing.T) {
			// A ring buffer of its own: what a reader leaves in a ring
			// buffer, the next one reads.
			coll := load(t, ringbufObj)
			events, prog, outcomes := coll.Maps["events"], coll.Programs["produce"], coll.Maps["outcomes"]
			// produce's args: count (<= 64), size, how (0 output, 1
			// reserve and submit, 2 reserve and discard every
			// `every`-th), flags, every, map (0: events).
			produce := func(t *testing.T, count, size, how, every uint64) {
				t.Helper()
				for _, cpu := range cpuList {
					if err := run(prog, cpu, count, size, how, 0, every, 0); err != nil {
						t.Fatal(err)
					}
				}
			}
			before := perCPU[outcome](t, outcomes)
			c := newTally(func(recCPU int, data []byte) (int, uint64, bool, error) {
				if recCPU != -1 || len(data) < 16 {
					return 0, 0, false, fmt.Errorf("record of cpu %d, %d bytes: want cpu -1 and a header", recCPU, len(data))
				}
				cpu := int(binary.NativeEndian.Uint32(data[8:]))
				if size := binary.NativeEndian.Uint32(data[12:]); int(size) != len(data) {
					return 0, 0, false, fmt.Errorf("cpu %d: %d bytes, the record says %d", cpu, len(data), size)
				}
				return cpu, binary.NativeEndian.Uint64(data), true, nil
			})
			r := open(t, perfbuf.MapFD(events.FD()), perfbuf.ReaderOptions{}, c)
			for range 3 {
				produce(t, 20, 48, 0, 1)  // bpf_ringbuf_output
				produce(t, 10, 256, 1, 1) // reserve, submit
				produce(t, 20, 32, 2, 4)  // reserve; every 4th discarded
				r.drain(t)
			}
			produce(t, 5, 32, 1, 1) // left in the ring
			stats := r.closeFn()
			c.check(t)
			after := perCPU[outcome](t, outcomes)
			var ok, discarded uint64
			for _, cpu := range cpuList {
				d := outcome{
					after[cpu].Attempts - before[cpu].Attempts, after[cpu].OK - before[cpu].OK,
					after[cpu].Discarded - before[cpu].Discarded, after[cpu].Full - before[cpu].Full,
					after[cpu].Other - before[cpu].Other, after[cpu].NoRing - before[cpu].NoRing,
				}
				if d.OK+d.Discarded+d.Full+d.Other+d.NoRing != d.Attempts || d.Other+d.NoRing+d.Full != 0 {
					t.Errorf("cpu %d: %+v: want every attempt submitted or discarded", cpu, d)
				}
				if got := c.samples[cpu]; got != d.OK-5 {
					t.Errorf("cpu %d: %d delivered, %d submitted of which 5 left unread", cpu, got, d.OK)
				}
				ok, discarded = ok+d.OK, discarded+d.Discarded
			}
			if len(stats.Rings) != 1 {
				t.Fatalf("Stats %+v: want the ring's entry alone", stats)
			}
			// One ring and no failure map: the sums are the ring's.
			st := stats.Rings[0]
			if stats.Samples != st.Samples || stats.Left != st.Left || stats.Discarded != st.Discarded ||
				stats.Lost != st.Lost || stats.Corrupt != st.Corrupt || stats.Failed != st.Failed || stats.NotRun != 0 {
				t.Errorf("sums %+v: want ring 0's %+v", stats, st)
			}
			t.Logf("submitted %d = delivered %d + left %d; discarded %d", ok, st.Samples, st.Left, st.Discarded)
			if st.Samples+st.Left != ok || st.Samples != uint64(c.delivered) || st.Left != uint64(5*len(cpuList)) ||
				st.Discarded != discarded || st.Lost+st.Corrupt+st.Failed.Total() != 0 {
				t.Errorf("Stats %+v: want %d delivered + %d left = %d submitted, %d discarded", st, c.delivered, 5*len(cpuList), ok, discarded)
			}
		})
	}
}

// emitStats mirrors emit.bpf.h's struct emit_stats.
type emitStats struct{ Emitted, Failed, Seq uint64 }

// A perf event array, read in every form and in order, its rings opened by
// perfbuf's own opener in a build without cgo: per CPU, the outputs
// attempted are the samples delivered, lost (full rings: 4 KiB each) and
// left at Close.
func TestPerfEventArrayNoCgo(t *testing.T) {
	coll := load(t, perfObj)
	events, prog, emitted := coll.Maps["events"], coll.Programs["emit"], coll.Maps["emit_stats"]
	cpuList := online(t)
	// emit's args: count (<= 256), size, span (sample n has size + n %
	// span bytes), first n.
	emit := func(t *testing.T, count, size, span uint64) {
		t.Helper()
		for _, cpu := range cpuList {
			if err := run(prog, cpu, count, size, span, 0); err != nil {
				t.Fatal(err)
			}
		}
	}
	all := maps.Clone(forms)
	all["ordered"] = func(t *testing.T, m perfbuf.Map, opts perfbuf.ReaderOptions, c *tally) reader {
		opts.Order = &perfbuf.Order{KeyOffset: 8} // emit_hdr.ts
		return forms["ReadInto"](t, m, opts, c)
	}
	for name, open := range all {
		t.Run(name, func(t *testing.T) {
			before := perCPU[emitStats](t, emitted)
			opened := kernel.OpenedPerfRings()
			c := newTally(func(recCPU int, data []byte) (int, uint64, bool, error) {
				// A sample's true size is more than len(data)-8 (the
				// kernel pads it): the header is known when that covers it.
				if len(data) < 32 {
					return recCPU, 0, false, nil
				}
				if cpu := int(binary.NativeEndian.Uint32(data[20:])); cpu != recCPU {
					return 0, 0, false, fmt.Errorf("sample says cpu %d, delivered for cpu %d", cpu, recCPU)
				}
				return recCPU, binary.NativeEndian.Uint64(data), true, nil
			})
			r := open(t, perfbuf.MapFD(events.FD()), perfbuf.ReaderOptions{Options: perfbuf.Options{RingBytes: 1 << 12}}, c)
			if !libbpfOpener {
				if n := kernel.OpenedPerfRings() - opened; n != uint64(r.rings) {
					t.Fatalf("perfbuf's opener opened %d rings of the reader's %d: without libbpf, it opens them all", n, r.rings)
				}
			}
			for range 3 {
				emit(t, 100, 24, 100) // 24 to 123 bytes: more than a 4 KiB ring holds
				r.drain(t)
			}
			emit(t, 3, 8, 0) // left in the rings
			stats := r.closeFn()
			c.check(t)
			after := perCPU[emitStats](t, emitted)
			byCPU := map[int]perfbuf.Stats{}
			for _, st := range stats.Rings {
				s := byCPU[st.CPU]
				s.CPU = st.CPU
				s.Samples, s.Lost, s.Left, s.Corrupt = s.Samples+st.Samples, s.Lost+st.Lost, s.Left+st.Left, s.Corrupt+st.Corrupt
				byCPU[st.CPU] = s
			}
			var attempts uint64
			for _, cpu := range cpuList {
				e := emitStats{after[cpu].Emitted - before[cpu].Emitted, after[cpu].Failed - before[cpu].Failed, after[cpu].Seq - before[cpu].Seq}
				attempts += e.Seq
				st := byCPU[cpu]
				t.Logf("cpu %d: attempted %d = delivered %d + lost %d + left %d", cpu, e.Seq, st.Samples, st.Lost, st.Left)
				if st.Samples+st.Lost+st.Left != e.Seq || st.Samples+st.Left != e.Emitted || st.Lost != e.Failed || st.Corrupt != 0 {
					t.Errorf("cpu %d: Stats %+v; the program emitted %d, failed %d (lost), of %d", cpu, st, e.Emitted, e.Failed, e.Seq)
				}
				if st.Samples != c.samples[cpu] || c.lost[cpu] > st.Lost {
					t.Errorf("cpu %d: delivered %d samples and %d lost; Stats say %d and %d", cpu, c.samples[cpu], c.lost[cpu], st.Samples, st.Lost)
				}
			}
			if got := stats.Samples + stats.Lost + stats.Left; got != attempts || stats.Corrupt != 0 {
				t.Errorf("sums %+v: %d outputs accounted for; the program attempted %d", stats, got, attempts)
			}
		})
	}
}
