// SPDX-License-Identifier: Apache-2.0

package perfbuf

// Close racing a read over several ring buffers (an array of ring buffers,
// a ring per CPU: issue 30, item 9), and a Reader opened again over them.

import (
	"context"
	"errors"
	"fmt"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// Producers follow the kernel's protocol on each of 4 ring buffers (a
// ring per CPU), every fifth record discarded, waiting for room when a
// ring is full, while a Reader's Each delivers; the producers stop (as the
// failure map's key stops them) and Close comes while Each runs, after a
// delay that varies. Per ring: every sample delivered is delivered once,
// in order; Samples + Discarded + Left are the records committed. A second
// Reader over the same rings then finds what the first left (Found),
// delivers it, and the two together deliver every sample once.
func TestRingBufsCloseRace(t *testing.T) {
	const rings = 4
	for _, delay := range []time.Duration{0, 50 * time.Microsecond, 500 * time.Microsecond, 2 * time.Millisecond} {
		t.Run(fmt.Sprint(delay), func(t *testing.T) {
			f := newFakeBPFRings(t, rings, 4096)
			var stop atomic.Bool
			committed := make([]uint64, rings) // records, discarded ones included
			samples := make([]uint64, rings)   // samples committed: seqs 0..samples-1 of ring i
			var producers sync.WaitGroup
			for i, rb := range f.rings {
				producers.Add(1)
				go func() {
					defer producers.Done()
					for j := uint64(0); !stop.Load(); j++ {
						p, ok := rb.Reserve(8)
						for ; !ok && !stop.Load(); p, ok = rb.Reserve(8) {
							runtime.Gosched() // full: wait for the reader
						}
						if !ok {
							return
						}
						discard := j%5 == 4
						rb.Write(p, bpfPayload(uint64(i)<<32|samples[i]))
						rb.Commit(p, discard)
						committed[i]++
						if !discard {
							samples[i]++
						}
					}
				}()
			}
			got := make([][]uint64, rings)
			deliver := func(rec *Record) error {
				got[rec.Ring] = append(got[rec.Ring], seq8(rec.Data))
				return nil
			}
			r := f.reader(t, ReaderOptions{MaxLatency: -1})
			done := make(chan error, 1)
			go func() { done <- r.Each(context.Background(), deliver) }()
			time.Sleep(delay)
			stop.Store(true)
			producers.Wait()
			r.Close()
			select {
			case err := <-done:
				if !errors.Is(err, os.ErrClosed) {
					t.Fatalf("Each: %v, want os.ErrClosed", err)
				}
			case <-time.After(10 * time.Second):
				t.Fatal("Each still running 10 s after Close")
			}
			st1 := r.Stats()
			first := make([]int, rings)
			for i := range rings {
				first[i] = len(got[i])
				if st1[i].Samples != uint64(first[i]) || st1[i].Samples+st1[i].Discarded+st1[i].Left != committed[i] {
					t.Errorf("ring %d: delivered %d, %d committed, Stats %+v", i, first[i], committed[i], st1[i])
				}
			}

			r2 := f.reader(t, ReaderOptions{MaxLatency: -1})
			if _, err := r2.Consume(deliver); err != nil {
				t.Fatal(err)
			}
			if err := r2.Close(); err != nil {
				t.Fatal(err)
			}
			st2 := r2.Stats()
			var total, left uint64
			for i := range rings {
				a, b := st1[i], st2[i]
				left += a.Left
				if b.Found < a.Left || b.Found-a.Left > a.Discarded || b.Samples != a.Left || b.Left != 0 {
					t.Errorf("ring %d: the first left %d (Stats %+v); the second found %d, delivered %d (Stats %+v)", i, a.Left, a, b.Found, b.Samples, b)
				}
				if uint64(len(got[i])) != samples[i] {
					t.Errorf("ring %d: delivered %d of %d samples", i, len(got[i]), samples[i])
				}
				for j, seq := range got[i] {
					if seq != uint64(i)<<32|uint64(j) {
						t.Fatalf("ring %d: sample %d is seq %#x, want %#x (once each, in order)", i, j, seq, uint64(i)<<32|uint64(j))
					}
				}
				total += committed[i]
			}
			t.Logf("Close after %v: %d records committed on %d rings, %d samples left to the second reader", delay, total, rings, left)
		})
	}
}
