// SPDX-License-Identifier: Apache-2.0

package benchrun

// What the scheduler did with a sustained run's consumer: how long its
// threads ran and how long they waited, runnable, for a CPU
// (/proc/self/task/TID/schedstat: sum_exec_runtime, run_delay). Under a
// flood the consumer shares the CPUs with the producers, and the time it
// waits for one is time the rings fill with nobody reading them.

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// schedTimes is one thread's schedstat: its time on a CPU and its time
// runnable on a runqueue, since it started.
type schedTimes struct{ ran, waited time.Duration }

// readSched returns the schedstat of every thread of this process, by
// thread ID.
func readSched() (map[int]schedTimes, error) {
	ents, err := os.ReadDir("/proc/self/task")
	if err != nil {
		return nil, fmt.Errorf("schedstat: %w", err)
	}
	out := make(map[int]schedTimes, len(ents))
	for _, e := range ents {
		tid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/self/task/" + e.Name() + "/schedstat")
		if errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ESRCH) {
			continue // the thread exited
		}
		if err != nil {
			return nil, fmt.Errorf("schedstat: %w", err)
		}
		t, err := parseSchedstat(string(b))
		if err != nil {
			return nil, fmt.Errorf("schedstat of thread %d: %w", tid, err)
		}
		out[tid] = t
	}
	return out, nil
}

// parseSchedstat parses a schedstat line: "ran waited timeslices", the
// first two in ns.
func parseSchedstat(s string) (schedTimes, error) {
	f := strings.Fields(s)
	if len(f) != 3 {
		return schedTimes{}, fmt.Errorf("%q: want 3 fields", s)
	}
	var v [2]int64
	for i := range v {
		n, err := strconv.ParseInt(f[i], 10, 64)
		if err != nil || n < 0 {
			return schedTimes{}, fmt.Errorf("%q: field %d is not a count", s, i+1)
		}
		v[i] = n
	}
	return schedTimes{ran: time.Duration(v[0]), waited: time.Duration(v[1])}, nil
}

// schedDelta sums what the threads of after, but those of skip, ran and
// waited since before (a thread missing from before started since).
func schedDelta(before, after map[int]schedTimes, skip []int) schedTimes {
	var d schedTimes
	for tid, a := range after {
		if slices.Contains(skip, tid) {
			continue
		}
		b := before[tid]
		d.ran += max(a.ran-b.ran, 0)
		d.waited += max(a.waited-b.waited, 0)
	}
	return d
}
