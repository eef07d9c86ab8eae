// SPDX-License-Identifier: Apache-2.0

package benchrun

// Delivery latency: how late a record reaches its consumer. The host
// measurement's programs write bpf_ktime_get_ns() at HostKtimeOffset of
// each record; the consumer notes CLOCK_MONOTONIC, the same clock, when it
// is handed the record, and reports the percentiles of the differences.

import (
	"encoding/binary"
	"fmt"
	"slices"
	"time"

	"golang.org/x/sys/unix"
)

// Percentile returns the p-th percentile (0 < p <= 100) of sorted by
// nearest rank: the value at rank ceil(p n / 100), the largest for 100; 0
// for no values. The C consumer (cquiet.c) computes the same.
func Percentile(sorted []int64, p int) int64 {
	n := len(sorted)
	if n == 0 {
		return 0
	}
	rank := (p*n + 99) / 100
	return sorted[max(rank, 1)-1]
}

// Summarize sorts lat (ns) and returns its median, 99th percentile and
// largest.
func Summarize(lat []int64) Latency {
	slices.Sort(lat)
	return Latency{N: uint64(len(lat)), P50: time.Duration(Percentile(lat, 50)),
		P99: time.Duration(Percentile(lat, 99)), Max: time.Duration(Percentile(lat, 100))}
}

// latencies notes the delivery latency of up to a set number of records,
// in memory taken and faulted in before the measured window.
type latencies struct {
	ns    []int64
	clock monoClock
}

// newLatencies returns room for n records' latencies.
func newLatencies(n int) *latencies {
	ns := make([]int64, n)
	for i := range ns {
		ns[i] = 1 // faulted in now, not in the window
	}
	return &latencies{ns: ns[:0], clock: newMonoClock()}
}

// note notes the latency of the record data, if it holds a ktime and
// there is room; l may be nil.
func (l *latencies) note(data []byte) {
	if l == nil || len(l.ns) == cap(l.ns) || len(data) < HostKtimeOffset+8 {
		return
	}
	l.ns = append(l.ns, l.clock.now()-int64(binary.NativeEndian.Uint64(data[HostKtimeOffset:])))
}

// format is the fields of the "result" line that report the latencies
// (ParseQuietResult), with a leading space; "" for a nil l.
func (l *latencies) format() string {
	if l == nil {
		return ""
	}
	s := Summarize(l.ns)
	return fmt.Sprintf(" lat_n=%d lat_p50_ns=%d lat_p99_ns=%d lat_max_ns=%d", s.N, s.P50.Nanoseconds(), s.P99.Nanoseconds(), s.Max.Nanoseconds())
}

// monoClock reads CLOCK_MONOTONIC through Go's monotonic clock (the vDSO,
// not x/sys/unix's clock_gettime system call): the runtime's clock is
// CLOCK_MONOTONIC less an offset, measured once.
type monoClock struct {
	base time.Time
	off  int64 // CLOCK_MONOTONIC at base
}

// newMonoClock measures the offset: the system call read between two
// reads of the runtime's clock, the closest of a few tries.
func newMonoClock() monoClock {
	c := monoClock{base: time.Now()}
	best := time.Duration(-1)
	for range 5 {
		var ts unix.Timespec
		a := time.Since(c.base)
		if unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts) != nil {
			continue
		}
		b := time.Since(c.base)
		if best < 0 || b-a < best {
			best, c.off = b-a, ts.Nano()-int64(a+(b-a)/2)
		}
	}
	return c
}

// now is CLOCK_MONOTONIC in ns.
func (c monoClock) now() int64 { return c.off + int64(time.Since(c.base)) }
