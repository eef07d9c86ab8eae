// SPDX-License-Identifier: Apache-2.0

package perfbuf

// ReadBatch over the fullest-first policy copies inside the ring's loop
// (ring.Sink): its contracts on both kinds, over fake rings.

import (
	"errors"
	"fmt"
	"os"
	"testing"

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
					if s.Type != RecordSample || len(s.Data) != k.padding(24) || s.CPU != r.r.C.Rings[0].Cur().CPU() {
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
