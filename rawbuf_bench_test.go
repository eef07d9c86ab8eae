// SPDX-License-Identifier: Apache-2.0

package perfbuf

import (
	"encoding/binary"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// benchSink keeps the payload sums alive so that the compiler cannot drop the reads.
var benchSink uint64

// sumPayload reads every byte of p: 8 bytes at a time (four words per step while it can),
// then the tail bytes. It stands for a consumer that looks at the whole payload.
func sumPayload(p []byte) uint64 {
	var s0, s1 uint64
	for len(p) >= 32 {
		s0 += binary.NativeEndian.Uint64(p[0:8]) + binary.NativeEndian.Uint64(p[8:16])
		s1 += binary.NativeEndian.Uint64(p[16:24]) + binary.NativeEndian.Uint64(p[24:32])
		p = p[32:]
	}
	for len(p) >= 8 {
		s0 += binary.NativeEndian.Uint64(p)
		p = p[8:]
	}
	if len(p) >= 4 {
		s1 += uint64(binary.NativeEndian.Uint32(p))
		p = p[4:]
	}
	for _, c := range p {
		s0 += uint64(c)
	}
	return s0 + s1
}

// benchRing fills a 256 KiB ring completely (head = tail + size) with samples of the given
// payload size, plus one record of another type that pads the ring to exactly its size.
// Every lap of the ring then holds the same records at the same offsets, so the benchmark
// hands the reader a full ring again by moving data_head one ring size on.
func benchRing(b *testing.B, payload int) (*fakeRing, int) {
	const size = 256 << 10
	f := newFakeRing(size)
	rec := fakeSample(make([]byte, payload))
	for i := range rec[12:] {
		rec[12+i] = byte(i)
	}
	n := 0
	for f.head+uint64(len(rec)) <= size-8 {
		f.put(rec)
		n++
	}
	if pad := size - f.head; pad > 0 {
		f.put(fakeRecord(unix.PERF_RECORD_THROTTLE, uint16(pad), make([]byte, pad-8)))
	}
	if f.head != size {
		b.Fatalf("ring filled to %d", f.head)
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
	rb := f.reader(b)
	var sum uint64
	var buf []byte
	var fn func(rec *Record) error
	if copying {
		buf = make([]byte, 0, 2048)
		fn = func(rec *Record) error {
			buf = rec.AppendTo(buf[:0])
			sum += sumPayload(buf)
			return nil
		}
	} else {
		fn = func(rec *Record) error {
			sum += sumPayload(rec.Data)
			if len(rec.Wrapped) > 0 {
				sum += sumPayload(rec.Wrapped)
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
		atomic.StoreUint64(&f.page.Data_head, rb.perf().tail+size)
		start := time.Now()
		n, err := rb.Drain(fn)
		elapsed += time.Since(start)
		if err != nil || n != perLap+1 {
			b.Fatalf("Drain = %d, %v; want %d records", n, err, perLap+1)
		}
		samples += perLap
	}
	b.StopTimer()
	benchSink += sum
	st := rb.Stats()
	if st.Samples != uint64(samples) {
		b.Fatalf("stats: %d samples, want %d", st.Samples, samples)
	}
	b.ReportMetric(float64(elapsed.Nanoseconds())/float64(samples), "ns/sample")
	// MB/s of payload as delivered, the kernel's padding included (68 bytes for a 64-byte sample).
	b.ReportMetric(float64(st.Bytes)/elapsed.Seconds()/1e6, "MB/s")
}
