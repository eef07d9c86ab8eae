// SPDX-License-Identifier: Apache-2.0

package policy

// Benchmarks of the ordered policies' cost per record over fake rings
// filled before each round (no kernel, no owner): the in-place merge over
// perf rings and the window over ring buffers, each read by Next and
// Delivered (ReadInto's way), Each, and for the window NextCopy first.

import (
	"encoding/binary"
	"fmt"
	"testing"
	"time"

	"github.com/perfbuf/perfbuf/internal/ring"
	"github.com/perfbuf/perfbuf/internal/ringtest"
)

// benchSize is the fake rings' size: perfbuf's default of 64 pages.
const benchSize = 64 << 12

// benchSink keeps the benchmarks' reads of the records from being
// optimised away.
var benchSink uint64

// BenchmarkOrdered measures the in-place merge over two perf rings whose
// keys take turns every record (run=1, the merge's worst case) or every 32
// records; rule 1 releases all but the last, a Flush the rest.
func BenchmarkOrdered(b *testing.B) {
	for _, mode := range []string{"Next", "Each"} {
		for _, size := range []int{16, 64} {
			for _, run := range []int{1, 32} {
				b.Run(fmt.Sprintf("%s/size=%d/run=%d", mode, size, run), func(b *testing.B) {
					s, fakes := perfSet(b, 2, benchSize)
					o := NewOrdered(s, OrderConfig{MaxDelay: time.Hour, Window: 1 << 62})
					rec := ringtest.PerfSample(make([]byte, size))
					per := (benchSize - 4096) / len(rec) * 2
					key := uint64(0)
					b.ReportAllocs()
					b.ResetTimer()
					for done := 0; done < b.N; done += per {
						b.StopTimer()
						for i := range per {
							key++
							binary.NativeEndian.PutUint64(rec[ring.PerfSampleDataOff:], key)
							fakes[i/run%2].Write(rec)
						}
						for _, f := range fakes {
							f.Publish()
						}
						b.StartTimer()
						benchRound(b, s, o, mode, per)
					}
					b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N), "ns/record")
				})
			}
		}
	}
}

// BenchmarkWindow measures the window over two ring buffers, each written
// by one CPU (rule 1 applies), filled in turns of 32 records: a flood
// found after a wait, which the hot ring reads in place.
func BenchmarkWindow(b *testing.B) {
	for _, mode := range []string{"Next", "NextCopy", "Each"} {
		for _, size := range []int{16, 64} {
			b.Run(fmt.Sprintf("%s/size=%d", mode, size), func(b *testing.B) {
				s, fakes := ringBufSet(b, 2, benchSize)
				w := NewWindow(s, WindowConfig{OrderConfig: OrderConfig{MaxDelay: time.Hour, Window: 1 << 62},
					Bytes: 2 * benchSize, OneWriter: func(int) bool { return true }})
				payload := make([]byte, size)
				per := (benchSize - 4096) / (size + 8) * 2
				key := uint64(0)
				b.ReportAllocs()
				b.ResetTimer()
				for done := 0; done < b.N; done += per {
					b.StopTimer()
					for i := range per {
						key++
						binary.NativeEndian.PutUint64(payload, key)
						fakes[i/32%2].Output(b, payload)
					}
					b.StartTimer()
					benchRound(b, s, w, mode, per)
				}
				b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N), "ns/record")
			})
		}
	}
}

// benchRound reads p as a Reader does in mode until nothing is released,
// then flushes the rest, and fails unless it delivered want samples.
func benchRound(b *testing.B, s *Set, p Reading, mode string, want int) {
	n := 0
	fn := func(rec *ring.Record) error {
		benchSink += rec.Key
		n++
		return nil
	}
	var c ring.Copy
	cp, _ := p.(Copier)
	for spins := 0; ; spins++ {
		switch mode {
		case "Each":
			for {
				more, err := p.Each(fn)
				if err != nil {
					b.Fatal(err)
				}
				if !more {
					break
				}
			}
		case "NextCopy", "Next":
			for {
				if mode == "NextCopy" && cp != nil && cp.NextCopy(&c) {
					benchSink += c.Key
					n++
					continue
				}
				rec, i := p.Next()
				if i < 0 {
					break
				}
				fn(rec)
				p.Delivered(i)
			}
		}
		p.Idle()
		switch {
		case s.Flushing() && s.FlushReached(p):
			s.EndFlush()
			if n != want {
				b.Fatalf("delivered %d samples of %d", n, want)
			}
			return
		case !s.Flushing():
			s.RequestFlush()
		case spins > 100:
			b.Fatalf("no end of the flush: %d samples of %d delivered", n, want)
		}
	}
}
