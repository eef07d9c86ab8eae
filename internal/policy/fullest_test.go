// SPDX-License-Identifier: Apache-2.0

package policy

import (
	"errors"
	"fmt"
	"math"
	"testing"

	"github.com/perfbuf/perfbuf/internal/ring"
	"github.com/perfbuf/perfbuf/internal/ringtest"
	"golang.org/x/sys/unix"
)

// A pass gives the fullest ring the first turn; a turn reads at most its
// budget and commits every chunk within it; every record goes once. Both
// ring kinds, and each way of reading a turn: Next, NextCopy (ReadInto),
// Each, CopyInto (ReadBatch).
func TestFullestPasses(t *testing.T) {
	for _, kind := range []string{"perf", "ringbuf"} {
		for _, form := range []string{"Next", "NextCopy", "Each", "CopyInto"} {
			t.Run(kind+"/"+form, func(t *testing.T) {
				var s *Set
				var committed func(i int) uint64
				var rec uint64 // a record's bytes in the ring
				counts := []int{2, 6, 4}
				if kind == "perf" {
					var fakes []*ringtest.Perf
					s, fakes = perfSet(t, 3, 4096)
					for i, n := range counts {
						for k := range n {
							emitPerf(t, fakes[i], uint64(100*i+k), 16)
						}
					}
					rec = 32
					committed = func(i int) uint64 { return fakes[i].Page.Data_tail }
				} else {
					var fakes []*ringtest.RingBuf
					s, fakes = ringBufSet(t, 3, 4096)
					for i, n := range counts {
						for k := range n {
							fakes[i].Output(t, keyed(uint64(100*i+k), 16))
						}
					}
					rec = 24
					committed = func(i int) uint64 { return fakes[i].Pos[0] }
				}
				f := NewFullest(s)
				f.SetTurn(int(3*rec), int(rec)) // turns of 3 records, a commit each
				var order []int                 // the ring of each record delivered
				deliver := func(i int, key uint64) {
					if want := uint64(100*i + len(filter(order, i))); key != want {
						t.Fatalf("ring %d delivered key %d, want %d", i, key, want)
					}
					order = append(order, i)
					if c := committed(i); c+2*rec < uint64(len(filter(order, i)))*rec {
						t.Fatalf("ring %d: %d records delivered, committed %d bytes", i, len(filter(order, i)), c)
					}
				}
				switch form {
				case "Next", "NextCopy":
					var c ring.Copy
					for {
						if form == "NextCopy" && f.NextCopy(&c) {
							deliver(c.Ring, payloadKeyOf(c.Data))
							continue
						}
						r, i := f.Next()
						if i < 0 {
							break
						}
						deliver(i, payloadKey(r))
						f.Delivered(i)
					}
				case "Each":
					for {
						more, err := f.Each(func(r *ring.Record) error { deliver(r.Ring, payloadKey(r)); return nil })
						if err != nil {
							t.Fatal(err)
						}
						if !more {
							break
						}
					}
				case "CopyInto":
					into := make([]ring.Copy, 2)
					for {
						sink := ring.Sink{Into: into, Room: math.MaxInt}
						more := f.CopyInto(&sink)
						for _, c := range into[:sink.N] {
							deliver(c.Ring, payloadKeyOf(c.Data))
						}
						if !more {
							break
						}
					}
				}
				// Fullest first, turns of 3 (a turn cut short by a full
				// batch goes on at the next CopyInto).
				want := "[1 1 1 2 2 2 0 0 1 1 1 2]"
				if fmt.Sprint(order) != want {
					t.Fatalf("rings in delivery order %v, want %s", order, want)
				}
				for i := range s.Rings {
					if got, wantPos := committed(i), s.Rings[i].Cur().Pos(); got != wantPos {
						t.Errorf("ring %d committed to %d, its cursor at %d", i, got, wantPos)
					}
					if s.Tallies[i].Samples != uint64(counts[i]) {
						t.Errorf("ring %d: %+v", i, s.Tallies[i])
					}
				}
				if timeout, _ := f.Idle(); timeout != s.Latency {
					t.Errorf("Idle = %v, want the latency %v", timeout, s.Latency)
				}
			})
		}
	}
}

func filter(order []int, i int) []int {
	var out []int
	for _, j := range order {
		if j == i {
			out = append(out, j)
		}
	}
	return out
}

func payloadKeyOf(b []byte) uint64 {
	return payloadKey(&ring.Record{Data: b})
}

// A corrupt record met in a turn is skipped to the ring's head and left
// for the read to report (Set.Corrupt); the other rings are read on.
func TestFullestCorrupt(t *testing.T) {
	for _, form := range []string{"Next", "Each"} {
		t.Run(form, func(t *testing.T) {
			s, fakes := perfSet(t, 2, 4096)
			emitPerf(t, fakes[0], 1, 16)
			fakes[0].Put(ringtest.PerfRecord(unix.PERF_RECORD_SAMPLE, 4, make([]byte, 8)))
			fakes[0].Publish()
			emitPerf(t, fakes[1], 2, 16)
			f := NewFullest(s)
			n := 0
			for {
				if form == "Next" {
					if _, i := f.Next(); i < 0 {
						break
					} else {
						f.Delivered(i)
					}
					n++
					continue
				}
				more, err := f.Each(func(*ring.Record) error { n++; return nil })
				if err != nil {
					t.Fatal(err)
				}
				if !more {
					break
				}
			}
			var ce *ring.CorruptError
			if n != 2 || !errors.As(s.Corrupt, &ce) {
				t.Fatalf("%d delivered, Corrupt %v; want 2 and a CorruptError", n, s.Corrupt)
			}
		})
	}
}

// A Flush ends once every ring's records up to its head at the Flush went:
// the pass that starts after that reports none.
func TestFullestFlush(t *testing.T) {
	s, fakes := perfSet(t, 2, 4096)
	emitPerf(t, fakes[0], 1, 16)
	f := NewFullest(s)
	s.RequestFlush()
	emitPerf(t, fakes[1], 2, 16) // after the Flush: not waited for, delivered if met
	out, _ := readAll(t, s, f)
	if len(out) == 0 || len(out) > 2 || out[0].ring != 0 {
		t.Fatalf("delivered %v; want ring 0's record first", out)
	}
	if s.Flushing() {
		t.Fatal("the flush did not end")
	}
	f.AddRing(1) // (a pass looks at every ring)
	if f.Oldest(0) != s.Rings[0].Cur().Pos() {
		t.Fatal("Oldest is not the cursor")
	}
}

// Callback mode drains a ring to its head: samples in one piece, and one
// that straddles the ring's end made contiguous, to sample; lost records
// to lost; all committed. A corruption is skipped and returned.
func TestCallbackDrain(t *testing.T) {
	const size = 4096
	f := ringtest.NewPerfAt(size, size-16)
	p, err := ring.NewPerfFromParts(3, f.Page, f.Data)
	if err != nil {
		t.Fatal(err)
	}
	s := &Set{Latency: -1}
	s.Push(p)
	var keys []uint64
	var lost uint64
	c := NewCallback(s, func(cpu int, data []byte) {
		if cpu != 3 {
			t.Errorf("cpu %d", cpu)
		}
		keys = append(keys, payloadKeyOf(data))
	}, func(cpu int, n uint64) { lost += n })
	emitPerf(t, f, 1, 24) // straddles the end
	f.Put(ringtest.PerfLost(0, 4))
	f.Publish()
	emitPerf(t, f, 2, 16)
	n, err := c.Drain(0)
	if err != nil || n != 3 || fmt.Sprint(keys) != "[1 2]" || lost != 4 {
		t.Fatalf("Drain = %d, %v; keys %v, lost %d", n, err, keys, lost)
	}
	if f.Page.Data_tail != f.Page.Data_head || s.Tallies[0].Samples != 2 || c.Oldest(0) != f.Page.Data_head {
		t.Fatalf("committed %d of %d, %+v", f.Page.Data_tail, f.Page.Data_head, s.Tallies[0])
	}
	f.Put(ringtest.PerfRecord(unix.PERF_RECORD_SAMPLE, 4, make([]byte, 8)))
	f.Publish()
	var ce *ring.CorruptError
	if _, err := c.Drain(0); !errors.As(err, &ce) {
		t.Fatalf("Drain over a corruption: %v", err)
	}
	emitPerf(t, f, 3, 16)
	if n, err := c.Drain(0); n != 1 || err != nil {
		t.Fatalf("Drain after the corruption = %d, %v", n, err)
	}
	c.AddRing(0)

	raw := Raw{S: s}
	raw.AddRing(0)
	raw.CommitPublish(0)
	if raw.Oldest(0) != f.Page.Data_tail {
		t.Fatal("Raw's oldest is not the tail")
	}
}
