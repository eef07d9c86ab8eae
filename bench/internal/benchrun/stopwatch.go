// SPDX-License-Identifier: Apache-2.0

package benchrun

import (
	"runtime"
	"time"
)

// Stopwatch is a Timer for use outside testing: it adds up the time and the
// heap allocations between StartTimer and StopTimer, as testing.B does.
type Stopwatch struct {
	running bool
	start   time.Time
	base    uint64 // the allocation count at StartTimer

	Elapsed time.Duration // in the timed parts
	Mallocs uint64        // allocations in the timed parts
}

func (s *Stopwatch) StartTimer() {
	if s.running {
		return
	}
	s.base = mallocs()
	s.running = true
	s.start = time.Now()
}

func (s *Stopwatch) StopTimer() {
	if !s.running {
		return
	}
	s.Elapsed += time.Since(s.start)
	s.running = false
	s.Mallocs += mallocs() - s.base
}

// mallocs is the number of heap allocations so far. ReadMemStats stops the
// world but counts exactly (runtime/metrics counts small objects only when
// their span is refilled); it runs outside the timed parts.
func mallocs() uint64 {
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.Mallocs
}
