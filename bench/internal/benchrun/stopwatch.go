// SPDX-License-Identifier: Apache-2.0

package benchrun

import (
	"runtime"
	"time"

	"golang.org/x/sys/unix"
)

// Stopwatch is a Timer for use outside testing: it adds up the time and the
// heap allocations between StartTimer and StopTimer, as testing.B does.
//
// With Thread set it adds up the CPU time of the thread that runs the timed
// part instead of the time that passed (CLOCK_THREAD_CPUTIME_ID, the
// goroutine locked to its thread meanwhile): on a machine shared with other
// busy processes, the time a drain waits for a CPU is not counted. Only
// for a timed part that runs on the calling goroutine alone (not
// libbpfgo's channel).
type Stopwatch struct {
	Thread bool

	running  bool
	start    time.Time
	startCPU int64  // the thread's CPU time at StartTimer, with Thread
	base     uint64 // the allocation count at StartTimer

	Elapsed time.Duration // in the timed parts
	Mallocs uint64        // allocations in the timed parts
}

func (s *Stopwatch) StartTimer() {
	if s.running {
		return
	}
	s.base = mallocs()
	s.running = true
	if s.Thread {
		runtime.LockOSThread()
		s.startCPU = threadCPU()
		return
	}
	s.start = time.Now()
}

func (s *Stopwatch) StopTimer() {
	if !s.running {
		return
	}
	if s.Thread {
		s.Elapsed += time.Duration(threadCPU() - s.startCPU)
		runtime.UnlockOSThread()
	} else {
		s.Elapsed += time.Since(s.start)
	}
	s.running = false
	s.Mallocs += mallocs() - s.base
}

// threadCPU is the calling thread's CPU time in nanoseconds.
func threadCPU() int64 {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_THREAD_CPUTIME_ID, &ts); err != nil {
		panic("clock_gettime(CLOCK_THREAD_CPUTIME_ID): " + err.Error()) // Linux has had it since 2.6.12
	}
	return ts.Nano()
}

// mallocs is the number of heap allocations so far. ReadMemStats stops the
// world but counts exactly (runtime/metrics counts small objects only when
// their span is refilled); it runs outside the timed parts.
func mallocs() uint64 {
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.Mallocs
}
