// SPDX-License-Identifier: Apache-2.0

package perfbuf

// Benchmarks of PerfBuffer's callback mode over a fake ring (no kernel).

import (
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/perfbuf/perfbuf/internal/ringtest"
)

// BenchmarkPerfBufferConsume measures callback mode's cost per sample: a
// Consume that hands every sample of a full 256 KiB ring to a SampleFunc
// that reads it, at four payload sizes (the ring of BenchmarkRawDrain).
func BenchmarkPerfBufferConsume(b *testing.B) {
	for _, payload := range []int{16, 64, 256, 1024} {
		b.Run(strconv.Itoa(payload), func(b *testing.B) {
			ring, perLap := benchRing(b, payload)
			f := newFakeRings(b, 1, 8)
			f.rings[0] = ring
			var sum uint64
			pb := f.perfBuffer(b, func(_ int, data []byte) { sum += ringtest.Sum(data) }, nil)
			size := uint64(len(ring.Data))
			samples := 0
			var elapsed time.Duration
			b.ReportAllocs()
			b.ResetTimer()
			for samples < b.N {
				// The next lap, the same full ring (see benchDrain).
				atomic.StoreUint64(&ring.Page.Data_head, atomic.LoadUint64(&ring.Page.Data_tail)+size)
				start := time.Now()
				n, err := pb.Consume()
				elapsed += time.Since(start)
				if n != perLap || err != nil {
					b.Fatalf("Consume = %d, %v; want %d samples", n, err, perLap)
				}
				samples += n
			}
			b.StopTimer()
			ringtest.Sink += sum
			st := pb.Stats()[0]
			b.ReportMetric(float64(elapsed.Nanoseconds())/float64(samples), "ns/sample")
			b.ReportMetric(float64(st.Bytes)/elapsed.Seconds()/1e6, "MB/s")
		})
	}
}
