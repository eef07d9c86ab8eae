// SPDX-License-Identifier: Apache-2.0

package perfbuf

// ReadBatch over the fullest-first policy copies inside the ring's loop
// (ring.Sink): its contracts on both kinds, over fake rings.

import (
	"errors"
	"fmt"
	"os"
	"sync/atomic"
	"testing"

	"github.com/perfbuf/perfbuf/internal/ring"
	"github.com/perfbuf/perfbuf/internal/ringtest"
)

// batchKind is one kind of fake ring for the ReadBatch tests: a Reader over
// one ring, emit writing a sample of n bytes carrying seq, corrupt writing a
// record that cannot be valid.
type batchKind struct {
	name    string
	open    func(t *testing.T) (r *Reader, emit func(seq uint64, n int), corrupt func())
	seqOf   func(data []byte) uint64
	padding func(n int) int // the payload length a Sample of an n-byte sample has
}

func batchKinds() []batchKind {
	return []batchKind{{
		name: "perf",
		open: func(t *testing.T) (*Reader, func(uint64, int), func()) {
			f := newFakeRings(t, 1, 64<<10)
			r := f.reader(t, ReaderOptions{MaxLatency: -1})
			return r, func(seq uint64, n int) { f.emit(t, 0, seq, seq, n) },
				func() { f.rings[0].MustWrite(t, ringtest.PerfRecord(9, 0, make([]byte, 8))) } // size 0
		},
		seqOf:   seqOf,
		padding: func(n int) int { return (n+4+7)&^7 - 4 },
	}, {
		name: "ringbuf",
		open: func(t *testing.T) (*Reader, func(uint64, int), func()) {
			f := newFakeBPFRings(t, 1, 64<<10)
			r := f.reader(t, ReaderOptions{MaxLatency: -1})
			rb := f.rings[0]
			return r, func(seq uint64, n int) { rb.Output(t, payload(seq, seq, n)) },
				func() {
					pos := rb.Output(t, make([]byte, 8))
					rb.Put(pos, ringtest.U32(1<<20)) // a length past the producer
				}
		},
		seqOf:   seqOf,
		padding: func(n int) int { return n },
	}}
}

// A corrupt record in the middle of a batch: the records before it are
// copied and returned, the error is the next call's, the ring goes on past
// it. A full batch stops inside a ring's turn and the next call goes on
// from there, none twice, none skipped.
func TestReadBatchCorruptMidBatch(t *testing.T) {
	for _, k := range batchKinds() {
		t.Run(k.name, func(t *testing.T) {
			r, emit, corrupt := k.open(t)
			for seq := range uint64(10) {
				emit(seq, 24)
			}
			corrupt()
			batch := make([]Sample, 4)
			var got []uint64
			for _, want := range []int{4, 4, 2} {
				n, err := r.ReadBatch(batch)
				if n != want || err != nil {
					t.Fatalf("ReadBatch = %d, %v; want %d, nil", n, err, want)
				}
				for _, s := range batch[:n] {
					if s.Type != RecordSample || len(s.Data) != k.padding(24) || s.CPU != r.c.Rings[0].Cur().CPU() {
						t.Fatalf("sample %+v", s)
					}
					got = append(got, k.seqOf(s.Data))
				}
			}
			if fmt.Sprint(got) != "[0 1 2 3 4 5 6 7 8 9]" {
				t.Errorf("read %v", got)
			}
			if n, err := r.ReadBatch(batch); n != 0 || !errors.Is(err, ErrCorrupt) {
				t.Fatalf("ReadBatch at the corrupt record = %d, %v; want ErrCorrupt", n, err)
			}
			emit(10, 24)
			if n, err := r.ReadBatch(batch); n != 1 || err != nil || k.seqOf(batch[0].Data) != 10 {
				t.Fatalf("ReadBatch after the corruption = %d, %v", n, err)
			}
			if st := r.Stats()[0]; st.Samples != 11 || st.Corrupt != 1 {
				t.Errorf("stats %+v; want 11 samples, 1 corruption", st)
			}
		})
	}
}

// A call copies about batchBytes of payload at most, at least one record:
// it stops after the record that reaches the cap. It allocates nothing once
// the Samples' memory is large enough.
func TestReadBatchBytesCap(t *testing.T) {
	for _, k := range batchKinds() {
		t.Run(k.name, func(t *testing.T) {
			r, emit, _ := k.open(t)
			const size = 3000 // three reach batchBytes
			for seq := range uint64(5) {
				emit(seq, size)
			}
			batch := make([]Sample, 64)
			for _, want := range []int{3, 2} {
				if n, err := r.ReadBatch(batch); n != want || err != nil {
					t.Fatalf("ReadBatch = %d, %v; want %d", n, err, want)
				}
			}
			emit(5, 20000) // larger than the cap: one record a call
			emit(6, 24)
			for _, want := range []uint64{5, 6} {
				if n, err := r.ReadBatch(batch); n != 1 || err != nil || k.seqOf(batch[0].Data) != want {
					t.Fatalf("ReadBatch = %d, %v; want seq %d alone", n, err, want)
				}
			}
			for seq := range uint64(128) { // AllocsPerRun's warm-up and its run
				emit(seq, 24)
			}
			allocs := testing.AllocsPerRun(1, func() {
				if n, err := r.ReadBatch(batch); n != 64 || err != nil {
					t.Fatalf("ReadBatch = %d, %v", n, err)
				}
			})
			if allocs != 0 {
				t.Errorf("%v allocations a batch of 64", allocs)
			}
			r.Close()
			if n, err := r.ReadBatch(batch); n != 0 || !errors.Is(err, os.ErrClosed) {
				t.Errorf("ReadBatch after Close = %d, %v", n, err)
			}
		})
	}
}

// The ring's loop into a sink on a perf ring: limit, stop (Close during a
// record), a full batch, Room, lost records copied, a sample that
// straddles the ring's end copied in one piece, and a sample function that
// takes the samples in one piece while the loop's function gets the rest.
func TestPerfEachSink(t *testing.T) {
	f := ringtest.NewPerfAt(256, 128)
	f.MustWrite(t, ringtest.PerfSample(ringtest.Pattern(20, 1))) // at 128, 32 bytes
	f.MustWrite(t, ringtest.PerfLost(1, 7))                      // at 160, 24 bytes
	f.MustWrite(t, ringtest.PerfSample(ringtest.Pattern(44, 2))) // at 184, 56 bytes
	f.MustWrite(t, ringtest.PerfSample(ringtest.Pattern(36, 3))) // at 240: 4 bytes, then 32 at the start
	f.MustWrite(t, ringtest.PerfSample(ringtest.Pattern(4, 4)))  // at 288
	want := "[sample 20 1 lost 7 sample 44 2 sample 36 3 sample 4 4]"
	show := func(c *Sample) string {
		if c.Type == RecordLost {
			return fmt.Sprintf("lost %d", c.Lost)
		}
		return fmt.Sprintf("sample %d %d", len(c.Data), c.Data[0]) // Pattern's first byte is its seed
	}
	run := func(s *ring.Sink, limit uint64, stop *atomic.Bool) (string, []int) {
		b := perfReader(t, f)
		b.Begin()
		var out []string
		var ks []int
		for {
			s.N, s.Room = 0, 1<<20
			k, _, err := b.perf().Each(new(Record), limit-(b.perf().Pos()-128), stop, func(*Record) error {
				t.Fatal("the function called with a copying sink")
				return nil
			}, s)
			if err != nil {
				t.Fatal(err)
			}
			for i := range s.Into[:s.N] {
				out = append(out, show(&s.Into[i]))
			}
			ks = append(ks, k)
			if !s.Full() || b.perf().Pos()-128 >= limit {
				return fmt.Sprint(out), ks
			}
		}
	}
	for _, n := range []int{1, 2, 5, 64} {
		if got, ks := run(&ring.Sink{Into: make([]Sample, n)}, 1<<20, new(atomic.Bool)); got != want {
			t.Errorf("batches of %d: %s in calls %v, want %s", n, got, ks, want)
		}
	}
	if got, ks := run(&ring.Sink{Into: make([]Sample, 64)}, 57, new(atomic.Bool)); got != "[sample 20 1 lost 7 sample 44 2]" || fmt.Sprint(ks) != "[3]" {
		t.Errorf("limit 57: %s in calls %v", got, ks)
	}
	var stop atomic.Bool
	stop.Store(true) // closed during the first record
	if got, _ := run(&ring.Sink{Into: make([]Sample, 64)}, 1<<20, &stop); got != "[sample 20 1]" {
		t.Errorf("stop: %s", got)
	}
	// Room: the loop stops after the record that uses it up.
	b := perfReader(t, f)
	b.Begin()
	s := ring.Sink{Into: make([]Sample, 64), Room: 21}
	if k, _, err := b.perf().Each(new(Record), 1<<20, new(atomic.Bool), nil, &s); k != 3 || s.N != 3 || err != nil || !s.Full() {
		t.Errorf("room 21: %d records, %d copies, %v", k, s.N, err) // 20 bytes, a lost record, 44
	}

	var seen []string
	b = perfReader(t, f)
	b.Begin()
	sampleSink := ring.Sink{Sample: func(cpu int, data []byte) {
		seen = append(seen, fmt.Sprintf("sample %d cpu %d", len(data), cpu))
	}}
	k, _, err := b.perf().Each(new(Record), 1<<20, new(atomic.Bool), func(rec *Record) error {
		seen = append(seen, fmt.Sprintf("fn %v %d+%d", rec.Type, len(rec.Data), len(rec.Wrapped)))
		return nil
	}, &sampleSink)
	c := b.CPU()
	if k != 5 || err != nil || fmt.Sprint(seen) != fmt.Sprintf("[sample 20 cpu %d fn lost 0+0 sample 44 cpu %d fn sample 4+32 sample 4 cpu %d]", c, c, c) {
		t.Errorf("sample function: %d, %v, %v", k, err, seen)
	}
}
