// SPDX-License-Identifier: Apache-2.0

package benchrun

// The quiet measurement's CPU count: the task clock, as perf stat counts
// it, of every thread of the consumer's process.
//
// getrusage's CPU time (utime + stime) is the scheduler's sum_exec_runtime,
// counted, not sampled, but on this VM it charges a thread that sleeps and
// wakes 3-5x what perf's task clock counts for it, and that charge moves
// with the host's load: a C loop of 900 3.3 ms sleeps took 40-229 ms by
// getrusage (and /proc/self/schedstat, the same count) and 14-15 ms by
// perf stat -e task-clock, run after run. The quiet figures at 300 samples
// a second were that charge, spread by hundreds of percent over the rounds.
// The task clock counts the time the thread runs, from its switch in to its
// switch out: what a wakeup costs.

import (
	"encoding/binary"
	"fmt"
	"os"
	"strconv"
	"unsafe"

	"golang.org/x/sys/unix"
)

// TaskClock counts the task clock of every thread of this process: one
// perf software counter per thread that exists when it is opened, each
// inherited by the threads that thread starts afterwards (the kernel adds
// an inherited counter's count to its parent's when read).
type TaskClock struct{ fds []int }

// OpenTaskClock opens the counters. A thread started between its listing
// of the threads and the opening of its parent's counter goes uncounted;
// open it when the process is settled (its reader open).
func OpenTaskClock() (*TaskClock, error) {
	ents, err := os.ReadDir("/proc/self/task")
	if err != nil {
		return nil, fmt.Errorf("open task clock: %w", err)
	}
	tc := &TaskClock{}
	for _, e := range ents {
		tid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		attr := unix.PerfEventAttr{
			Type:   unix.PERF_TYPE_SOFTWARE,
			Config: unix.PERF_COUNT_SW_TASK_CLOCK,
			Size:   uint32(unsafe.Sizeof(unix.PerfEventAttr{})),
			Bits:   unix.PerfBitInherit,
		}
		fd, err := unix.PerfEventOpen(&attr, tid, -1, -1, unix.PERF_FLAG_FD_CLOEXEC)
		if err == unix.ESRCH {
			continue // the thread exited
		}
		if err != nil {
			tc.Close()
			return nil, fmt.Errorf("open task clock of thread %d: %w", tid, err)
		}
		tc.fds = append(tc.fds, fd)
	}
	return tc, nil
}

// OpenThreadTaskClock opens one counter: the task clock of the calling
// thread alone. Lock the goroutine to its thread first.
func OpenThreadTaskClock() (*TaskClock, error) {
	attr := unix.PerfEventAttr{
		Type:   unix.PERF_TYPE_SOFTWARE,
		Config: unix.PERF_COUNT_SW_TASK_CLOCK,
		Size:   uint32(unsafe.Sizeof(unix.PerfEventAttr{})),
	}
	fd, err := unix.PerfEventOpen(&attr, 0, -1, -1, unix.PERF_FLAG_FD_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("open task clock of this thread: %w", err)
	}
	return &TaskClock{fds: []int{fd}}, nil
}

// Read returns the task clock of the process's threads so far, in ns.
func (tc *TaskClock) Read() (uint64, error) {
	var sum uint64
	var b [8]byte
	for _, fd := range tc.fds {
		if n, err := unix.Read(fd, b[:]); err != nil || n != len(b) {
			return 0, fmt.Errorf("read task clock: %d bytes, %v", n, err)
		}
		sum += binary.NativeEndian.Uint64(b[:])
	}
	return sum, nil
}

// Close closes the counters.
func (tc *TaskClock) Close() {
	for _, fd := range tc.fds {
		unix.Close(fd)
	}
	tc.fds = nil
}
