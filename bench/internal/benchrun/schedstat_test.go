// SPDX-License-Identifier: Apache-2.0

package benchrun

import (
	"runtime"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

func TestParseSchedstat(t *testing.T) {
	got, err := parseSchedstat("1680985 1896921 8\n")
	if err != nil || got != (schedTimes{ran: 1680985, waited: 1896921}) {
		t.Errorf("parseSchedstat = %+v, %v", got, err)
	}
	for _, bad := range []string{"", "1 2", "1 2 3 4", "a 2 3", "1 -2 3"} {
		if _, err := parseSchedstat(bad); err == nil {
			t.Errorf("parseSchedstat(%q) took it", bad)
		}
	}
}

// schedDelta counts the threads that started since (from zero), leaves out
// those skipped, and does not let a thread ID reused by a younger thread
// count backwards.
func TestSchedDelta(t *testing.T) {
	before := map[int]schedTimes{1: {10, 5}, 2: {100, 50}, 3: {7, 7}}
	after := map[int]schedTimes{1: {15, 9}, 2: {300, 90}, 3: {2, 1}, 4: {20, 30}}
	if got, want := schedDelta(before, after, []int{2}), (schedTimes{ran: 25, waited: 34}); got != want {
		t.Errorf("schedDelta = %+v, want %+v", got, want)
	}
}

// readSched finds this thread, and counts the CPU time it spends as the
// thread's own clock does (both are the scheduler's sum_exec_runtime;
// schedstat's lags by what ran since the last tick or switch).
func TestReadSched(t *testing.T) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	tid := unix.Gettid()
	s0, err := readSched()
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := s0[tid]; !ok {
		t.Fatalf("thread %d not in %v", tid, s0)
	}
	c0 := threadCPU()
	for time.Duration(threadCPU()-c0) < 40*time.Millisecond {
	}
	s1, err := readSched()
	if err != nil {
		t.Fatal(err)
	}
	if d := s1[tid].ran - s0[tid].ran; d < 20*time.Millisecond {
		t.Errorf("40 ms of the thread's CPU time ran %v by schedstat", d)
	}
}
