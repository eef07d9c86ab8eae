// SPDX-License-Identifier: Apache-2.0

package perfbuf

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"
)

// A long read hands the ring's space back as it goes, a chunk
// (commitChunk) at a time: the kernel's producers see the ring full up to
// the committed position. Committed only at the end of a turn, a quarter
// of the ring, the space read lay idle while producers lost records
// (docs/performance.md, "Space handed back as it is read"). Every read
// form, both kinds, fullest first and ordered (over a ring buffer, a ring
// read in place, hot).
func TestLongReadCommitsAsItGoes(t *testing.T) {
	const size = 1 << 20
	const chunk = size / 32 // what a read delivers between commits from a ring of 1 MiB
	for _, kind := range []string{"perf", "ringbuf"} {
		for _, pol := range []string{"fullest", "ordered"} {
			for _, form := range []string{"ReadInto", "ReadBatch", "Each"} {
				t.Run(kind+"/"+pol+"/"+form, func(t *testing.T) {
					var (
						r         *Reader
						committed func() uint64 // the consumer position
						recSize   uint64
					)
					var ord *Order
					if pol == "ordered" {
						ord = &Order{MaxDelay: time.Hour}
					}
					if kind == "perf" {
						f := newFakeRings(t, 1, size)
						recSize = 80 // header 8, size 4, 64 bytes, padded to 8
						for n := uint64(0); (n+1)*recSize < size/8*7; n++ {
							f.emit(t, 0, n, n, 64)
						}
						f.rings[0].Publish()
						r = f.reader(t, ReaderOptions{Order: ord, MaxLatency: -1})
						committed = func() uint64 { return atomic.LoadUint64(&f.rings[0].Page.Data_tail) }
					} else {
						f := newFakeBPFRings(t, 1, size)
						recSize = 72 // header 8, 64 bytes
						for n := uint64(0); (n+1)*recSize < size/8*7; n++ {
							f.emit(t, 0, n, n, 64)
						}
						if ord != nil {
							r = f.ordered(t, *ord)
						} else {
							r = f.reader(t, ReaderOptions{MaxLatency: -1})
						}
						committed = func() uint64 { return atomic.LoadUint64(&f.rings[0].Pos[0]) }
					}
					r.SetDeadline(time.Now().Add(10 * time.Second))
					// Delivered bytes not yet committed: at most a chunk and the
					// record being delivered.
					want := size / 2 / recSize
					delivered := uint64(0)
					check := func() {
						t.Helper()
						if behind := delivered*recSize - committed(); int64(behind) < 0 || behind > chunk+recSize {
							t.Fatalf("after %d records (%d bytes) the ring is committed to %d: %d bytes behind, more than a chunk of %d",
								delivered, delivered*recSize, committed(), behind, chunk)
						}
					}
					errEnough := errors.New("enough")
					switch form {
					case "ReadInto":
						var s Sample
						for ; delivered < want; delivered++ {
							check()
							if err := r.ReadInto(&s); err != nil {
								t.Fatal(err)
							}
						}
					case "ReadBatch":
						batch := make([]Sample, 64)
						for delivered < want {
							check()
							n, err := r.ReadBatch(batch)
							if err != nil {
								t.Fatal(err)
							}
							delivered += uint64(n)
						}
					case "Each":
						err := r.Each(context.Background(), func(rec *Record) error {
							check()
							if delivered++; delivered == want {
								return errEnough
							}
							return nil
						})
						if !errors.Is(err, errEnough) {
							t.Fatal(err)
						}
					}
					if st := r.Stats()[0]; pol == "ordered" && kind == "ringbuf" && st.Held != 0 {
						t.Errorf("the ring was copied, not read in place: %s", fmt.Sprint(st))
					}
				})
			}
		}
	}
}
