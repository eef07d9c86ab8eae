// SPDX-License-Identifier: Apache-2.0

package benchrun

import (
	"io"
	"math"
	"os"
	"slices"
	"strings"
	"testing"
	"time"
)

// RecordSize agrees with the kernel's layout: a 13-byte output arrives as 20
// bytes in a 32-byte record, and the largest sample a one-page ring takes
// (4052 bytes) needs 4064.
func TestRecordSize(t *testing.T) {
	for n, want := range map[int]int{1: 16, 4: 16, 5: 24, 12: 24, 13: 32, 20: 32, 64: 80, 4052: 4064} {
		if got := RecordSize(n); got != want {
			t.Errorf("RecordSize(%d) = %d, want %d", n, got, want)
		}
	}
}

func TestPerRound(t *testing.T) {
	page := os.Getpagesize()
	for _, size := range Sizes {
		n := PerRound(DrainPages, size)
		used := n * RecordSize(size)
		if used > DrainPages*page-page || used+RecordSize(size) <= DrainPages*page-page {
			t.Errorf("PerRound(%d, %d) = %d: %d bytes of %d", DrainPages, size, n, used, DrainPages*page)
		}
	}
}

func TestSustainedResult(t *testing.T) {
	r := SustainedResult{Mode: "x", Emitted: 90, Failed: 10, Received: 90, Lost: 10, Wall: time.Second / 2}
	if err := r.Check(); err != nil {
		t.Error(err)
	}
	if got := r.Rate(); got != 180 {
		t.Errorf("Rate = %v, want 180", got)
	}
	r.Lost = 9
	if err := r.Check(); err == nil {
		t.Error("lost 9 of 10 failed passed the check")
	}
	if (SustainedResult{}).Rate() != 0 {
		t.Error("rate of an empty result")
	}
}

func TestQuietResultLine(t *testing.T) {
	line := formatQuietResult(900, 2, 3*time.Millisecond, 1500*time.Microsecond, 2500*time.Microsecond, 950, 30, 3*time.Second, 899, 12345)
	rep, err := ParseQuietResult(line)
	if err != nil {
		t.Fatal(err)
	}
	want := QuietReport{Received: 900, Lost: 2, Polls: 899,
		Usage: Usage{CPU: 3 * time.Millisecond, Charged: 4 * time.Millisecond, Voluntary: 950, Involuntary: 30, Wall: 3 * time.Second}}
	if rep != want {
		t.Errorf("parsed %+v from %q; want %+v", rep, line, want)
	}
	// A consumer that does not count its polls leaves them out: 0.
	line = formatQuietResult(900, 2, 0, 0, 0, 0, 0, time.Second, 0, 1)
	if rep, err := ParseQuietResult(line); err != nil || rep.Polls != 0 || strings.Contains(line, "polls") {
		t.Errorf("no polls: %q parsed as %+v, %v", line, rep, err)
	}
	// The C consumer prints the same fields; unknown ones are ignored.
	if _, err := ParseQuietResult("result received=1 lost=0 task_clock_ns=7 utime_us=1 stime_us=2 nvcsw=3 nivcsw=4 wall_us=5 polls=1 extra=6"); err != nil {
		t.Errorf("extra field: %v", err)
	}
	for _, bad := range []string{
		"",
		"ready",
		"result received=1 lost=0 task_clock_ns=7 utime_us=1 stime_us=2 nvcsw=3 nivcsw=4",           // no wall_us
		"result received=1 lost=0 task_clock_ns=7 utime_us=1 stime_us=2 nvcsw=3 nivcsw=4 wall_us=x", // not a number
		"result received=1 lost=0 task_clock_ns=7 utime_us=1 stime_us=2 nvcsw=3 nivcsw=-4 wall_us=5",
		"result received lost=0 utime_us=1 stime_us=2 nvcsw=3 nivcsw=4 wall_us=5",
		"result received=1 lost=0 utime_us=1 stime_us=2 nvcsw=3 nivcsw=4 wall_us=5", // no task_clock_ns
	} {
		if _, err := ParseQuietResult(bad); err == nil {
			t.Errorf("ParseQuietResult(%q) accepted it", bad)
		}
	}
}

func TestQuietResult(t *testing.T) {
	r := QuietResult{Mode: "x", Rate: 300, Emitted: 900, Received: 900, Polls: 450,
		Window: Usage{CPU: 18 * time.Millisecond, Voluntary: 1800, Involuntary: 900, Wall: 3 * time.Second}}
	if err := r.Check(); err != nil {
		t.Error(err)
	}
	for name, tc := range map[string]struct{ got, want float64 }{
		"CPUPerWakeup":       {r.CPUPerWakeup(), 20},
		"SwitchesPerWakeup":  {r.SwitchesPerWakeup(), 3},
		"VoluntaryPerWakeup": {r.VoluntaryPerWakeup(), 2},
		"WakeupsPerSecond":   {r.WakeupsPerSecond(), 600},
		"SwitchesPerSecond":  {r.SwitchesPerSecond(), 900},
		"CPUPerSecond":       {r.CPUPerSecond(), 6},
		"SamplesPerPoll":     {r.SamplesPerPoll(), 2},
	} {
		if math.Abs(tc.got-tc.want) > 1e-9 {
			t.Errorf("%s = %v, want %v", name, tc.got, tc.want)
		}
	}
	r.Received = 899
	if err := r.Check(); err == nil {
		t.Error("899 received of 900 passed the check")
	}
	r.Received, r.Failed = 900, 1
	if err := r.Check(); err == nil {
		t.Error("a failed output not reported lost passed the check")
	}
	idle := QuietResult{Mode: "x"}
	if idle.Check() != nil || idle.CPUPerWakeup() != 0 || idle.WakeupsPerSecond() != 0 || idle.SamplesPerPoll() != 0 {
		t.Errorf("an empty idle result: %v, %v, %v", idle.Check(), idle.CPUPerWakeup(), idle.WakeupsPerSecond())
	}
	if RateName(0) != "idle" || RateName(300) != "300/s" {
		t.Errorf("RateName: %q, %q", RateName(0), RateName(300))
	}
}

func TestQuietModes(t *testing.T) {
	for _, m := range append(slices.Clone(QuietModes), QuietIdleModes...) {
		if got, want := IsQuietGoMode(m, false), m != ModeC; got != want {
			t.Errorf("IsQuietGoMode(%q) = %v", m, got)
		}
	}
	// Over a ring buffer: the modes that read one.
	for _, m := range append(slices.Clone(RBQuietModes), RBQuietIdleModes...) {
		if got, want := IsQuietGoMode(m, true), m != ModeC; got != want {
			t.Errorf("IsQuietGoMode(%q, ring buffer) = %v", m, got)
		}
	}
	for _, list := range [][]string{QuietModes, QuietIdleModes, RBQuietModes, RBQuietIdleModes} {
		if list[0] != ModeC {
			t.Errorf("the C reference is not the first quiet mode of %q", list)
		}
	}
	for _, cfg := range []QuietConsumerConfig{
		{Mode: ModeC, Count: 1, Timeout: time.Second},
		{Mode: ModeReader, Count: -1, Timeout: time.Second},
		{Mode: ModeReader, Count: 1},
		{Mode: ModeC2CPU, RingBuf: true, Count: 1, Timeout: time.Second},
	} {
		if err := QuietConsume(cfg, io.Discard); err == nil {
			t.Errorf("QuietConsume(%+v) accepted it", cfg)
		}
	}
	if _, err := Quiet(nil, QuietConfig{Mode: ModeReader, Rate: 300}); err == nil {
		t.Error("Quiet without a command accepted it")
	}
}
