// SPDX-License-Identifier: Apache-2.0

package perfbuf

// Benchmarks of the Reader over fake rings (no kernel): fullest-first and
// ordered.

import (
	"context"
	"encoding/binary"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/perfbuf/perfbuf/internal/ring"
	"github.com/perfbuf/perfbuf/internal/ringtest"
)

// readRound publishes what the fake rings hold, flushes r and, with the
// timer running, reads until the Flush ends the round: with ReadInto into
// s, or with Each and a callback that does nothing (Each) or reads every
// byte of each sample (EachSum).
func readRound(b *testing.B, f *fakeRings, r *Reader, mode string, s *Sample) {
	for _, ring := range f.rings {
		ring.Publish()
	}
	r.Flush()
	b.StartTimer()
	switch mode {
	case "ReadInto":
		for r.ReadInto(s) == nil {
		}
	case "ReadBatch":
		for {
			if _, err := r.ReadBatch(batch[:]); err != nil {
				break
			}
		}
	case "Each":
		r.Each(context.Background(), func(*Record) error { return nil })
	case "EachSum":
		r.Each(context.Background(), func(rec *Record) error {
			if rec.Type != RecordSample {
				return errStop
			}
			ringtest.Sink += ringtest.Sum(rec.Data)
			if len(rec.Wrapped) > 0 {
				ringtest.Sink += ringtest.Sum(rec.Wrapped)
			}
			return nil
		})
	}
}

// batch is ReadBatch's Samples in the benchmarks: their Data grows once.
var batch [64]Sample

// benchRingSize is the fake rings' size in the reader benchmarks: perfbuf's
// default (64 pages), so that two rings fit in a core's L2 cache as the
// real ones do.
const benchRingSize = 64 << 12

// BenchmarkReaderReadInto measures a Reader's cost per record over two fake
// rings already filled (no kernel): ReadInto, Each and EachSum (see
// readRound), at two sizes. The ordered Reader's benchmark uses the same
// rings and records.
func BenchmarkReaderReadInto(b *testing.B) {
	for _, mode := range []string{"ReadInto", "ReadBatch", "Each", "EachSum"} {
		for _, size := range []int{16, 64} {
			b.Run(fmt.Sprintf("%s/size=%d", mode, size), func(b *testing.B) {
				f := newFakeRings(b, 2, benchRingSize)
				r := f.reader(b, ReaderOptions{MaxLatency: -1})
				rec := ringtest.PerfSample(payload(0, 0, size))
				per := (benchRingSize - 4096) / len(rec)
				var s Sample
				b.ReportAllocs()
				b.ResetTimer()
				for done := 0; done < b.N; done += 2 * per {
					b.StopTimer()
					for i := 0; i < 2*per; i++ {
						f.rings[i%2].Write(rec)
					}
					readRound(b, f, r, mode, &s)
				}
				b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N), "ns/record")
			})
		}
	}
}

// BenchmarkOrderedReadInto measures the ordered Reader's cost per record over
// two filled fake rings whose keys interleave, so that rule 1 releases each
// (the Flush of each round only releases its last record): ReadInto,
// ReadBatch and Each, at two sizes, with the rings taking turns every record (run=1, the
// merge's worst case) or every 32 (as the real drain benchmark fills them).
func BenchmarkOrderedReadInto(b *testing.B) {
	for _, mode := range []string{"ReadInto", "ReadBatch", "Each"} {
		for _, size := range []int{16, 64} {
			for _, run := range []int{1, 32} {
				b.Run(fmt.Sprintf("%s/size=%d/run=%d", mode, size, run), func(b *testing.B) {
					benchOrdered(b, mode, size, run)
				})
			}
		}
	}
}

func benchOrdered(b *testing.B, mode string, size, run int) {
	f := newFakeRings(b, 2, benchRingSize)
	o := f.ordered(b, Order{MaxDelay: time.Hour})
	per := (benchRingSize - 4096) / len(ringtest.PerfSample(payload(0, 0, size)))
	recs := make([][]byte, 2*per)
	for i := range recs {
		recs[i] = ringtest.PerfSample(payload(0, uint64(i), size))
	}
	key := uint64(0)
	var s Sample
	b.ReportAllocs()
	b.ResetTimer()
	for done := 0; done < b.N; done += 2 * per {
		b.StopTimer()
		for i, rec := range recs {
			key++
			binary.NativeEndian.PutUint64(rec[ring.PerfSampleDataOff:], key)
			f.rings[i/run%2].Write(rec)
		}
		readRound(b, f, o, mode, &s)
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N), "ns/record")
}

// BenchmarkOrderedManyRings measures the merge's cost per record as the
// number of rings grows (a machine's CPU count): with Each over rings of
// 64 KiB, 64-byte samples whose keys go round the busy rings one record at
// a time, so that every record is a new pick. With every ring busy, rule 1
// releases each record; with two busy, the idle rings hold it back until
// rule 2 releases it, the look-ahead having found a key KeyWindow larger.
func BenchmarkOrderedManyRings(b *testing.B) {
	for _, n := range []int{2, 8, 64} {
		for _, busy := range slices.Compact([]int{2, n}) {
			b.Run(fmt.Sprintf("rings=%d/busy=%d", n, busy), func(b *testing.B) {
				const size = 16 << 12
				f := newFakeRings(b, n, size)
				o := f.ordered(b, Order{MaxDelay: time.Hour, KeyWindow: 64})
				rec := ringtest.PerfSample(payload(0, 0, 64))
				per := (size - 4096) / len(rec) * busy
				key := uint64(0)
				var s Sample
				b.ReportAllocs()
				b.ResetTimer()
				for done := 0; done < b.N; done += per {
					b.StopTimer()
					for i := 0; i < per; i++ {
						key++
						binary.NativeEndian.PutUint64(rec[ring.PerfSampleDataOff:], key)
						f.rings[i%busy].Write(rec)
					}
					readRound(b, f, o, "Each", &s)
				}
				b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N), "ns/record")
			})
		}
	}
}
