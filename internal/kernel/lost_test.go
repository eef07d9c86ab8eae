// SPDX-License-Identifier: Apache-2.0

package kernel

import (
	"os"
	"testing"
)

// FormatLost is true exactly from 6.0 on, where PERF_FORMAT_LOST came.
func TestFormatLost(t *testing.T) {
	major, minor, err := Version()
	if err != nil {
		t.Fatal(err)
	}
	if got, want := FormatLost(), major >= 6; got != want {
		t.Errorf("FormatLost() = %v on kernel %d.%d, want %v", got, major, minor, want)
	}
}

// A ring opened with CountLost reads its count of refused outputs, 0 when
// new, and one opened without it says it has none. Paused, a ring's
// refusals are counted too: selftest/failures makes outputs. Needs CAP_BPF
// and CAP_PERFMON.
func TestLostSamples(t *testing.T) {
	if !FormatLost() {
		t.Skip("kernel before 6.0: no PERF_FORMAT_LOST")
	}
	m := perfEventArray(t)
	page := os.Getpagesize()
	for _, count := range []bool{true, false} {
		p, err := OpenPerfRings(m.FD(), PerfConfig{Pages: 1, PageSize: page, WakeupEvents: 1, CountLost: count}, []int32{0})
		if err != nil {
			t.Fatal(err)
		}
		n, ok, err := LostSamples(p.FD(0))
		if err != nil || ok != count || n != 0 {
			t.Errorf("CountLost %v: LostSamples = %d, %v, %v; want 0, %v, nil", count, n, ok, err, count)
		}
		if err := p.Close(); err != nil {
			t.Fatal(err)
		}
	}
	if _, _, err := LostSamples(-1); err == nil {
		t.Error("LostSamples(-1): no error")
	}
}
