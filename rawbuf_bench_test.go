// SPDX-License-Identifier: Apache-2.0

package perfbuf

import (
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/perfbuf/perfbuf/internal/ringtest"
)

// benchRing fills a 256 KiB ring completely (head = tail + size) with samples of the given
// payload size, plus one record of another type that pads the ring to exactly its size.
// Every lap of the ring then holds the same records at the same offsets, so the benchmark
// hands the reader a full ring again by moving data_head one ring size on.
func benchRing(b *testing.B, payload int) (*ringtest.Perf, int) {
	const size = 256 << 10
	f := ringtest.NewPerf(size)
	rec := ringtest.PerfSample(make([]byte, payload))
	for i := range rec[12:] {
		rec[12+i] = byte(i)
	}
	n := 0
	for f.Head+uint64(len(rec)) <= size-8 {
		f.Put(rec)
		n++
	}
	if pad := size - f.Head; pad > 0 {
		f.Put(ringtest.PerfRecord(unix.PERF_RECORD_THROTTLE, uint16(pad), make([]byte, pad-8)))
	}
	if f.Head != size {
		b.Fatalf("ring filled to %d", f.Head)
	}
	return f, n
}

func BenchmarkRawDrain(b *testing.B) {
	for _, mode := range []string{"zerocopy", "copy"} {
		for _, payload := range []int{16, 64, 256, 1024} {
			b.Run(mode+"/"+strconv.Itoa(payload), func(b *testing.B) {
				benchDrain(b, mode == "copy", payload)
			})
		}
	}
}

func benchDrain(b *testing.B, copying bool, payload int) {
	f, perLap := benchRing(b, payload)
	rb := perfReader(b, f)
	var sum uint64
	var buf []byte
	var fn func(rec *Record) error
	if copying {
		buf = make([]byte, 0, 2048)
		fn = func(rec *Record) error {
			buf = rec.AppendTo(buf[:0])
			sum += ringtest.Sum(buf)
			return nil
		}
	} else {
		fn = func(rec *Record) error {
			sum += ringtest.Sum(rec.Data)
			if len(rec.Wrapped) > 0 {
				sum += ringtest.Sum(rec.Wrapped)
			}
			return nil
		}
	}
	size := uint64(rb.Size())
	samples := 0
	var elapsed time.Duration
	b.ReportAllocs()
	b.ResetTimer()
	for samples < b.N {
		// Hand the reader the next lap, the same full ring: a release store of data_head as
		// the kernel's perf_output_put_handle does, for the acquire load in Begin.
		atomic.StoreUint64(&f.Page.Data_head, atomic.LoadUint64(&f.Page.Data_tail)+size)
		start := time.Now()
		n, err := rb.Drain(fn)
		elapsed += time.Since(start)
		if err != nil || n != perLap+1 {
			b.Fatalf("Drain = %d, %v; want %d records", n, err, perLap+1)
		}
		samples += perLap
	}
	b.StopTimer()
	ringtest.Sink += sum
	st := rb.Stats()
	if st.Samples != uint64(samples) {
		b.Fatalf("stats: %d samples, want %d", st.Samples, samples)
	}
	b.ReportMetric(float64(elapsed.Nanoseconds())/float64(samples), "ns/sample")
	// MB/s of payload as delivered, the kernel's padding included (68 bytes for a 64-byte sample).
	b.ReportMetric(float64(st.Bytes)/elapsed.Seconds()/1e6, "MB/s")
}
