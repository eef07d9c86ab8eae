// SPDX-License-Identifier: Apache-2.0

package perfbuf

// Reader.Batches and Batch, beyond the read forms' tables (which run
// Batches beside Each: eachIn): runs in place, a loop that moves on part
// way, Close and a read from inside the loop, and the step inlined.

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"os"
	"os/exec"
	"reflect"
	"testing"
	"time"

	"github.com/perfbuf/perfbuf/internal/ring"
	"github.com/perfbuf/perfbuf/internal/ringtest"
)

// batchFakes returns a Reader over two fake rings of kind, and a function
// that writes a sample of n bytes carrying seq into ring i.
func batchFakes(t *testing.T, kind string, opts ReaderOptions) (*Reader, func(i int, seq uint64, n int)) {
	t.Helper()
	if kind == "perf" {
		f := newFakeRings(t, 2, 64<<10)
		return f.reader(t, opts), func(i int, seq uint64, n int) { f.emit(t, i, seq, seq, n) }
	}
	f := newFakeBPFRings(t, 2, 64<<10)
	return f.reader(t, opts), func(i int, seq uint64, n int) { f.emit(t, i, seq, seq, n) }
}

// Over the fullest-first policy a batch is a run of one ring's samples:
// every sample comes once, in its ring's order, in batches of many; a
// loop that moves on part way through a batch gets the rest in the next
// batch; the counts are exact (published, as Each's, at the end of the
// ring's turn, or at Close).
func TestBatchesRuns(t *testing.T) {
	for _, kind := range []string{"perf", "ringbuf"} {
		t.Run(kind, func(t *testing.T) {
			r, emit := batchFakes(t, kind, ReaderOptions{MaxLatency: -1})
			const n = 300
			for seq := range uint64(n) {
				emit(int(seq%2), seq, 16+int(seq%50))
			}
			next := [2]uint64{0, 1} // each ring's next seq
			got, batches, moves := 0, 0, 0
			r.SetDeadline(time.Now().Add(50 * time.Millisecond))
			for got < n {
				for b, err := range r.Batches(context.Background()) {
					if err != nil {
						t.Fatalf("after %d records: %v", got, err)
					}
					batches++
					k := 0
					for b.Next() {
						rec := b.Record()
						seq := binary.NativeEndian.Uint64(rec.AppendTo(nil)[8:])
						if rec.Type != RecordSample || seq != next[rec.Ring] || rec.Key != 0 || rec.Late || rec.Next <= rec.Pos {
							t.Fatalf("record %+v: seq %d, want %d", rec, seq, next[rec.Ring])
						}
						next[rec.Ring] += 2
						got++
						if k++; k == 5 && moves < 3 {
							break // move on after 5: the rest come next
						}
					}
					if k == 5 && moves < 3 {
						moves++
						break
					}
					if got == n {
						break
					}
				}
			}
			if batches > n/10 {
				t.Errorf("%d records in %d batches; want runs of many", n, batches)
			}
			r.Close() // publishes the counts of the turn the loop left
			if st := r.Stats(); st.Samples != n || st.Lost != 0 || st.Corrupt != 0 || st.Left != 0 {
				t.Errorf("stats %+v; want %d samples", st, n)
			}
		})
	}
}

// An ordered Reader's batches come in key order: a perf ring's records
// that rule 1 releases in a row are a run, stepped in place with each Key
// set (keys alternating between the rings: batches of one); a loop that
// leaves a run part way gets its other records in the next batch, in
// order, none twice. (Over ring buffers a Flush's records come from the
// window's copies, one at a time; its hot ring's runs:
// TestOrderedRingBufHotEach.)
func TestBatchesOrdered(t *testing.T) {
	for _, kind := range []string{"perf", "ringbuf"} {
		for _, tc := range []struct {
			name    string
			ring    func(seq uint64) int
			leave   int // records the loop steps to in a batch before it leaves it (0: all)
			longest int // the longest batch wanted, at least
		}{
			{"interleaved", func(seq uint64) int { return int(seq % 3 % 2) }, 0, 1},
			{"runs", func(seq uint64) int { return int(seq / 8 % 2) }, 0, 6},
			{"runs left part way", func(seq uint64) int { return int(seq / 8 % 2) }, 3, 3},
		} {
			t.Run(kind+"/"+tc.name, func(t *testing.T) {
				r, emit := batchFakes(t, kind, ReaderOptions{MaxLatency: -1, Order: &Order{MaxDelay: time.Hour}})
				const n = 64
				for seq := range uint64(n) {
					emit(tc.ring(seq), seq, 24)
				}
				r.Flush()
				var keys []uint64
				longest := 0
				for b, err := range r.Batches(context.Background()) {
					if err != nil {
						if !errors.Is(err, ErrFlushed) {
							t.Fatal(err)
						}
						break
					}
					k := 0
					for b.Next() {
						rec := b.Record()
						if key := binary.NativeEndian.Uint64(rec.Data); rec.Key != key {
							t.Fatalf("record of key %d: Key %d", key, rec.Key)
						}
						keys = append(keys, rec.Key)
						if k++; k == tc.leave {
							break
						}
					}
					longest = max(longest, k)
				}
				for i, k := range keys {
					if k != uint64(i) || len(keys) != n {
						t.Fatalf("keys %v, want 0 to %d in order", keys, n-1)
					}
				}
				if kind == "ringbuf" {
					tc.longest = 1
				}
				if longest < tc.longest || tc.longest == 1 && longest != 1 {
					t.Fatalf("the longest batch: %d records; want %d", longest, tc.longest)
				}
			})
		}
	}
}

// Close from inside the loop ends the reading at the batch's end, with
// os.ErrClosed; a read from inside fails with ErrReentrant.
func TestBatchesCloseInside(t *testing.T) {
	for _, kind := range []string{"perf", "ringbuf"} {
		t.Run(kind, func(t *testing.T) {
			r, emit := batchFakes(t, kind, ReaderOptions{MaxLatency: -1})
			for seq := range uint64(20) {
				emit(0, seq, 32)
			}
			var last error
			got := 0
			for b, err := range r.Batches(context.Background()) {
				if err != nil {
					last = err
					break
				}
				var s Sample
				if err := r.ReadInto(&s); !errors.Is(err, ErrReentrant) {
					t.Errorf("ReadInto inside the loop: %v, want ErrReentrant", err)
				}
				for b.Next() {
					if !bytes.HasPrefix(b.Record().Data, ringtest.Keyed(uint64(got), uint64(got), 32)) {
						t.Fatalf("record %d: %x", got, b.Record().Data)
					}
					if got++; got == 3 {
						r.Close()
					}
				}
			}
			// The batch is the run of the first 19: the last record before
			// the ring's head comes in a batch of its own.
			if !errors.Is(last, os.ErrClosed) || got != 19 {
				t.Errorf("%d records, then %v; want the batch's 19, then os.ErrClosed", got, last)
			}
		})
	}
}

// Batch.Next and Record are inlined into the caller's loop, which is what
// a batch is for: the inliner's costs change between Go releases, and
// Next is at its budget. (A method of an internal package's type, as
// through an alias, is not inlined outside this module: the step is the
// root package's.)
func TestBatchInline(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the package with -gcflags=-m")
	}
	out, err := exec.Command("go", "build", "-gcflags=-m", ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	for _, fn := range []string{"(*Batch).Next", "(*Batch).Record"} {
		if !bytes.Contains(out, []byte("can inline "+fn)) {
			t.Errorf("%s is not inlined (go build -gcflags=-m=2 says why)", fn)
		}
	}
}

// Batch and ring.Steps share one layout, field by field: the ring's loop
// writes a Batch through a *ring.Steps (Batch.steps).
func TestBatchLayout(t *testing.T) {
	bt, st := reflect.TypeFor[Batch](), reflect.TypeFor[ring.Steps]()
	if bt.Size() != st.Size() || bt.NumField() != st.NumField() {
		t.Fatalf("Batch: %d bytes, %d fields; ring.Steps: %d bytes, %d fields", bt.Size(), bt.NumField(), st.Size(), st.NumField())
	}
	for i := range bt.NumField() {
		bf, sf := bt.Field(i), st.Field(i)
		if bf.Offset != sf.Offset || bf.Type != sf.Type {
			t.Errorf("field %d: Batch's %s %v at %d, ring.Steps's %s %v at %d", i, bf.Name, bf.Type, bf.Offset, sf.Name, sf.Type, sf.Offset)
		}
	}
}
