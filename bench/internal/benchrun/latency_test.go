// SPDX-License-Identifier: Apache-2.0

package benchrun

import (
	"encoding/binary"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

func monoNow(t *testing.T) int64 {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		t.Fatal(err)
	}
	return ts.Nano()
}

// Percentile is by nearest rank, as the C consumer computes it.
func TestPercentile(t *testing.T) {
	hundred := make([]int64, 100)
	for i := range hundred {
		hundred[i] = int64(i + 1)
	}
	for _, tc := range []struct {
		sorted []int64
		p      int
		want   int64
	}{
		{nil, 50, 0},
		{[]int64{7}, 50, 7},
		{[]int64{7}, 100, 7},
		{[]int64{1, 2}, 50, 1},
		{[]int64{1, 2, 3}, 50, 2},
		{[]int64{1, 2, 3, 4}, 99, 4},
		{hundred, 50, 50},
		{hundred, 99, 99},
		{hundred, 100, 100},
		{hundred, 1, 1},
	} {
		if got := Percentile(tc.sorted, tc.p); got != tc.want {
			t.Errorf("Percentile(%d values, %d) = %d, want %d", len(tc.sorted), tc.p, got, tc.want)
		}
	}
	// 1000 values, one of them far out: the 99th percentile is not it.
	// Sorted: 1-499, 501-1000, 1e9.
	lat := make([]int64, 1000)
	for i := range lat {
		lat[i] = int64(1000 - i) // descending: Summarize sorts
	}
	lat[500] = 1e9
	s := Summarize(lat)
	if want := (Latency{N: 1000, P50: 501, P99: 991, Max: 1e9}); s != want {
		t.Errorf("Summarize = %+v, want %+v", s, want)
	}
}

// A consumer notes a record's latency from the ktime at HostKtimeOffset,
// up to its room, and reports it in fields ParseQuietResult reads.
func TestLatencies(t *testing.T) {
	l := newLatencies(2)
	rec := make([]byte, HostRecordSize)
	binary.NativeEndian.PutUint64(rec[HostKtimeOffset:], uint64(l.clock.now()))
	l.note(rec)
	l.note(rec[:HostKtimeOffset+7]) // too short: no ktime
	l.note(rec)
	l.note(rec) // no room
	if len(l.ns) != 2 {
		t.Fatalf("noted %d latencies, want 2", len(l.ns))
	}
	for _, ns := range l.ns {
		if ns < 0 {
			t.Errorf("latency %d ns: the clock ran back", ns)
		}
	}
	(*latencies)(nil).note(rec) // a consumer that does not note them
	line := formatQuietResult(2, 0, 0, 0, 0, 0, 0, time.Second, 0, 0) + l.format()
	rep, err := ParseQuietResult(line)
	if err != nil {
		t.Fatal(err)
	}
	if rep.Latency.N != 2 || rep.Latency.Max != time.Duration(max(l.ns[0], l.ns[1])) {
		t.Errorf("%q parsed as %+v", line, rep.Latency)
	}
	if (*latencies)(nil).format() != "" {
		t.Error("a nil latencies reports fields")
	}
	if _, err := ParseQuietResult(strings.Replace(line, " lat_p99_ns=", " lat_p98_ns=", 1)); err == nil {
		t.Error("lat_n without lat_p99_ns parsed")
	}
}

// The consumer's clock is CLOCK_MONOTONIC, the clock of bpf_ktime_get_ns.
func TestMonoClock(t *testing.T) {
	c := newMonoClock()
	a := c.now()
	ts := monoNow(t)
	b := c.now()
	// Orders only: a <= ts <= b, within the offset's error (the
	// calibrating system call's time). Another clock (CLOCK_REALTIME, the
	// runtime's own origin) is off by far more than the second allowed
	// for a calibration preempted every time.
	if ts < a-int64(time.Second) || ts > b+int64(time.Second) {
		t.Errorf("CLOCK_MONOTONIC %d is not between the clock's reads %d and %d", ts, a, b)
	}
}
