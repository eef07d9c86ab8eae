// SPDX-License-Identifier: Apache-2.0

package perfbuf

// Reopening: a Reader opened again over the memory of ring buffers that a
// closed Reader read (a pinned map opened again) goes on where that one
// stopped, and its Stats say what it found (issue 30, item 7).

import (
	"errors"
	"fmt"
	"testing"
	"time"
)

// A second Reader over the same ring buffers goes on with the first record
// the first one did not deliver: every record is delivered once, by one of
// the two, none skipped. Close committed everything the first delivered,
// the record a function failed on included, and the second's Found is what
// the first left (Left, and the discarded records among them). Per ring,
// the readers' Samples + Discarded + Left - Found add up to what reached
// the ring while they were open; the first's Found, what was there before
// it. Two rings, as an array of ring buffers with a ring per CPU has.
func TestRingBufReopen(t *testing.T) {
	const perRing = 30
	const samples = 2*perRing - 2*perRing/5 // the first outputs' samples: 1 in 5 discarded
	discarded := func(seq uint64) bool { return seq%5 == 3 }
	for _, form := range []string{"ReadInto", "Consume failing"} {
		for _, read := range []int{0, 1, 7, 30, samples} {
			t.Run(fmt.Sprintf("%s/read %d", form, read), func(t *testing.T) {
				f := newFakeBPFRings(t, 2, 4096)
				outputs := make([]uint64, 2) // records that reached each ring
				wantSamples := map[uint64]bool{}
				output := func(n int) {
					seq := uint64(len(wantSamples)) << 8 // fresh seqs, apart from the discards'
					for i := range 2 * n {
						r := i % 2
						seq++
						p, ok := f.rings[r].Reserve(8)
						if !ok {
							t.Fatal("no room")
						}
						f.rings[r].Write(p, bpfPayload(seq))
						f.rings[r].Commit(p, discarded(seq))
						outputs[r]++
						if !discarded(seq) {
							wantSamples[seq] = true
						}
					}
				}
				output(perRing)
				got := map[uint64]int{}

				r1 := f.reader(t, ReaderOptions{MaxLatency: -1})
				setBudget(r1, 5*16, 2*16) // turns that end between records
				n := 0
				switch form {
				case "ReadInto":
					r1.SetDeadline(time.Now().Add(time.Second))
					var s Sample
					for n < read {
						if err := r1.ReadInto(&s); err != nil {
							t.Fatalf("ReadInto after %d: %v", n, err)
						}
						got[seq8(s.Data)]++
						n++
					}
				case "Consume failing":
					// The function fails on the read-th record: delivered all
					// the same (the read does not give it again).
					errFull := errors.New("full")
					for n < read {
						_, err := r1.Consume(func(rec *Record) error {
							got[seq8(rec.Data)]++
							n++
							if n == read {
								return errFull
							}
							return nil
						})
						if err != nil && !errors.Is(err, errFull) || err == nil && n < read {
							t.Fatalf("Consume after %d: %v", n, err)
						}
					}
				}
				if err := r1.Close(); err != nil {
					t.Fatal(err)
				}
				st1 := r1.Stats()

				r2 := f.reader(t, ReaderOptions{MaxLatency: -1})
				opened := r2.Stats()
				output(5) // and more while it reads
				if _, err := r2.Consume(func(rec *Record) error {
					got[seq8(rec.Data)]++
					return nil
				}); err != nil {
					t.Fatal(err)
				}
				if err := r2.Close(); err != nil {
					t.Fatal(err)
				}
				st2 := r2.Stats()

				for seq := range wantSamples {
					if got[seq] != 1 {
						t.Errorf("sample %d delivered %d times", seq, got[seq])
					}
				}
				if len(got) != len(wantSamples) {
					t.Errorf("delivered %d different samples, want %d", len(got), len(wantSamples))
				}
				var samples1 uint64
				for i := range 2 {
					a, b := st1[i], st2[i]
					samples1 += a.Samples
					if a.Found != perRing || opened[i].Found != b.Found {
						t.Errorf("ring %d: Found %d at the first opening, %d and %d at the second's; want %d, what was output before it", i, a.Found, opened[i].Found, b.Found, perRing)
					}
					// What the first left, discarded records included, is
					// what the second found: it counts them again.
					if b.Found < a.Left || b.Found-a.Left > a.Discarded {
						t.Errorf("ring %d: found %d, the first reader left %d (discarded %d)", i, b.Found, a.Left, a.Discarded)
					}
					sum := a.Samples + a.Discarded + a.Left - a.Found + b.Samples + b.Discarded + b.Left - b.Found
					if sum+a.Found != outputs[i] || b.Left != 0 {
						t.Errorf("ring %d: Stats %+v then %+v: sum %d, want %d, nothing left", i, a, b, sum, outputs[i])
					}
				}
				if samples1 != uint64(n) {
					t.Errorf("the first reader delivered %d, its Samples say %d", n, samples1)
				}
			})
		}
	}
}
