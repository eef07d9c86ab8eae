// SPDX-License-Identifier: Apache-2.0

package perfbuf

// ReadInto's common path over both kinds: the fullest-first policy's turn
// calls the turn's ring as its kind (policy.Fullest.Next), and the read
// leaves through wait.Lifetime.ExitExclusive's inlined common case.

import (
	"errors"
	"fmt"
	"os"
	"runtime"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/perfbuf/perfbuf/internal/ringtest"
	"golang.org/x/sys/unix"
)

// readIntoKind is one ring of a kind, read by a fullest-first Reader.
type readIntoKind struct {
	name string
	// open returns the Reader over one fake ring, put (a producer's
	// output of an 8-byte sample carrying seq: false when the ring is
	// full), and corrupt, which writes a record that cannot be valid and
	// returns its position and the reason the Reader gives.
	open func(t *testing.T) (r *Reader, put func(seq uint64) bool, corrupt func() (uint64, string))
}

var readIntoKinds = []readIntoKind{
	{"perf", func(t *testing.T) (*Reader, func(uint64) bool, func() (uint64, string)) {
		f := newFakeRings(t, 1, 4096)
		rb := f.rings[0]
		put := func(seq uint64) bool {
			if !rb.Write(ringtest.PerfSample(bpfPayload(seq))) {
				rb.Lost = 0 // full: the caller waits, nothing is lost
				return false
			}
			rb.Publish()
			f.wake(0)
			return true
		}
		corrupt := func() (uint64, string) {
			pos := rb.Head
			rb.MustWrite(t, ringtest.PerfRecord(unix.PERF_RECORD_SAMPLE, 12, make([]byte, 8)))
			rb.Publish()
			f.wake(0)
			return pos, "record size 12 not a multiple of 8"
		}
		return f.reader(t, ReaderOptions{MaxLatency: -1}), put, corrupt
	}},
	{"ringbuf", func(t *testing.T) (*Reader, func(uint64) bool, func() (uint64, string)) {
		f := newFakeBPFRings(t, 1, 4096)
		rb := f.rings[0]
		put := func(seq uint64) bool {
			p, ok := rb.Reserve(8)
			if ok {
				rb.Write(p, bpfPayload(seq))
				rb.Commit(p, false)
			}
			return ok
		}
		corrupt := func() (uint64, string) {
			p, _ := rb.Reserve(8)
			rb.Put(p, ringtest.U32(64)) // committed, its length past the producer
			return p, "record length 64"
		}
		return f.reader(t, ReaderOptions{MaxLatency: -1}), put, corrupt
	}},
}

// A corrupt record met in the middle of a turn, by ReadInto alone: the
// records before it come in order, the read that reaches it reports it
// once as a *CorruptError (counted), and the next reads go on past it.
func TestReadIntoCorruptInTurn(t *testing.T) {
	for _, kind := range readIntoKinds {
		t.Run(kind.name, func(t *testing.T) {
			r, put, corrupt := kind.open(t)
			for seq := range uint64(4) {
				put(seq)
			}
			pos, reason := corrupt()
			r.SetDeadline(time.Now().Add(50 * time.Millisecond))
			var got []uint64
			var err error
			within(t, "ReadInto up to the corrupt record", func() {
				for s := (Sample{}); err == nil; {
					if err = r.ReadInto(&s); err == nil {
						got = append(got, seq8(s.Data))
					}
				}
			})
			var ce *CorruptError
			if !errors.As(err, &ce) || ce.Pos != pos || !strings.HasPrefix(ce.Reason, reason) {
				t.Fatalf("ReadInto: %v; want a *CorruptError at %d: %q", err, pos, reason)
			}
			if fmt.Sprint(got) != "[0 1 2 3]" {
				t.Errorf("delivered %v before the error, want [0 1 2 3]", got)
			}
			if st := r.Stats()[0]; st.Samples != 4 || st.Corrupt != 1 {
				t.Errorf("stats %+v; want 4 samples and the corruption counted", st)
			}
			// Reported once; what comes after is read.
			put(4)
			put(5)
			got, err = nil, nil
			r.SetDeadline(time.Now().Add(50 * time.Millisecond))
			within(t, "ReadInto past the corrupt record", func() {
				for s := (Sample{}); err == nil; {
					if err = r.ReadInto(&s); err == nil {
						got = append(got, seq8(s.Data))
					}
				}
			})
			if !errors.Is(err, os.ErrDeadlineExceeded) || fmt.Sprint(got) != "[4 5]" {
				t.Errorf("after the report: %v, %v; want [4 5], then the deadline", got, err)
			}
		})
	}
}

// Close racing ReadInto from two goroutines while a producer writes: both
// reads return os.ErrClosed, every sample is delivered once, each reader's
// in order, and the ledger is exact (Samples delivered, Samples + Left
// written). The two readers take turns (a read waiting for the other wakes
// at its exit), and the last one out frees.
func TestReadIntoCloseRace(t *testing.T) {
	for _, kind := range readIntoKinds {
		for _, delay := range []time.Duration{0, time.Millisecond, 20 * time.Millisecond} {
			t.Run(fmt.Sprint(kind.name, "/", delay), func(t *testing.T) {
				r, put, _ := kind.open(t)
				var stop atomic.Bool
				var written uint64
				producer := make(chan struct{})
				go func() {
					defer close(producer)
					for !stop.Load() {
						if put(written) {
							written++
						} else {
							runtime.Gosched() // full: wait for the readers
						}
					}
				}()
				var got [2][]uint64 // each reader's
				errs := make(chan error, 2)
				for g := range got {
					go func() {
						var s Sample
						for {
							if err := r.ReadInto(&s); err != nil {
								errs <- err
								return
							}
							got[g] = append(got[g], seq8(s.Data))
							runtime.Gosched() // let the other in
						}
					}()
				}
				time.Sleep(delay)
				stop.Store(true)
				<-producer
				r.Close()
				for range 2 {
					select {
					case err := <-errs:
						if !errors.Is(err, os.ErrClosed) {
							t.Errorf("ReadInto: %v, want os.ErrClosed", err)
						}
					case <-time.After(10 * time.Second):
						t.Fatal("ReadInto still running 10 s after Close")
					}
				}
				for g, seqs := range got {
					if !slices.IsSorted(seqs) {
						t.Errorf("reader %d: seqs out of order", g)
					}
				}
				all := slices.Sorted(slices.Values(append(got[0], got[1]...)))
				for i, seq := range all {
					if seq != uint64(i) {
						t.Fatalf("seq %d delivered where %d was due (each once, none skipped)", seq, i)
					}
				}
				st := r.Stats()[0]
				if st.Samples != uint64(len(all)) || st.Samples+st.Left != written {
					t.Errorf("delivered %d of %d written; Stats %+v", len(all), written, st)
				}
				t.Logf("%d written, %d and %d read by the two readers", written, len(got[0]), len(got[1]))
			})
		}
	}
}

// A read that ends a flush, or finds its deadline past, is how reads end
// in the normal course (a drain at shutdown, a poll with a deadline): it
// returns an error made once, which allocates nothing and says what was
// read, where fmt.Errorf took 3 allocations and 4-6 µs of CPU a read.
func TestReadIntoEndsAllocateNothing(t *testing.T) {
	for _, k := range readIntoKinds {
		t.Run(k.name, func(t *testing.T) {
			r, put, _ := k.open(t)
			var s Sample
			seq := uint64(0)
			flushRound := func() error {
				for range 4 {
					if !put(seq) {
						t.Fatalf("ring full at %d", seq)
					}
					seq++
				}
				r.Flush()
				for range 4 {
					if err := r.ReadInto(&s); err != nil {
						t.Fatal(err)
					}
				}
				return r.ReadInto(&s)
			}
			err := flushRound() // (s.Data grows here)
			if !errors.Is(err, ErrFlushed) || !strings.HasPrefix(err.Error(), "read ") {
				t.Fatalf("the read after a flush: %v, want ErrFlushed in the read's context", err)
			}
			// (Counted without -race, which allocates in the reads: make
			// test-nocgo.)
			if allocs := testing.AllocsPerRun(50, func() {
				if err := flushRound(); !errors.Is(err, ErrFlushed) {
					t.Fatal(err)
				}
			}); allocs != 0 && !raceDetector {
				t.Errorf("a flush's round, its ending read included: %v allocations, want 0", allocs)
			}

			r.SetDeadline(time.Now().Add(-time.Second))
			if err := r.ReadInto(&s); !errors.Is(err, os.ErrDeadlineExceeded) || !strings.HasPrefix(err.Error(), "read ") {
				t.Fatalf("a read past its deadline: %v, want os.ErrDeadlineExceeded in the read's context", err)
			}
			if allocs := testing.AllocsPerRun(50, func() {
				if err := r.ReadInto(&s); !errors.Is(err, os.ErrDeadlineExceeded) {
					t.Fatal(err)
				}
			}); allocs != 0 && !raceDetector {
				t.Errorf("a read past its deadline: %v allocations, want 0", allocs)
			}
		})
	}
}
