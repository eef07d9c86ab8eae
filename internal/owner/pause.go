// SPDX-License-Identifier: Apache-2.0

package owner

// Pause and Resume, written once for every owner of rings (Reader and
// PerfBuffer through the owner core, and Recorder): a perf event array's
// rings through PERF_EVENT_IOC_PAUSE_OUTPUT on each ring's event, ring
// buffers through the reader key of the failure map (failuremap.go). The
// owners say when; this file says how.

import (
	"errors"
	"fmt"
	"sync"

	"github.com/perfbuf/perfbuf/internal/kernel"
)

// pauser is the pause state of one owner's rings. mu serialises set with
// itself and with the opening of a ring for a CPU that comes online
// (rings.add, which holds it): a ring opened while paused opens paused
// (openPausedEvents), and one opened before a pause is in the list that
// pause goes through.
type pauser struct {
	mu     sync.Mutex
	paused bool // from a Pause that worked to a Resume that worked
	// grace waits until the outputs in progress at a pause have finished:
	// kernel.WaitWriters, an RCU grace period.
	grace func() error
}

// pauseTarget is what a pause changes: a perf event array's rings
// (perfFDs returns every ring's event, in buffer index order, rings of
// CPUs gone offline included), or else ring buffers, paused through f's
// reader key.
type pauseTarget struct {
	perfFDs func() []int
	f       *failureMap
}

// errRingBufPause is Pause's error over ring buffers it cannot pause.
var errRingBufPause = fmt.Errorf("ring buffers pause only through the reader key of Options.FailureMap, for programs that write through bpf/perfbuf.bpf.h: %w", errors.ErrUnsupported)

// set pauses (on) or resumes the output into the rings, unless they are
// so already; op names the call in errors. in runs change over the
// owner's rings while they are the owner's to change (a core: within its
// lifetime, so that once closed in fails and changes nothing), and returns
// its error wrapped with op, or its own. Without perfFDs the rings are
// ring buffers, paused through f's reader key: errRingBufPause if f has
// none. A pause returns once the outputs in progress have finished
// (p.grace); a failed one undoes what it did.
//
// The wait runs outside in, under p.mu only: a Close meanwhile need not
// wait for it, nor do the reads it wakes (a grace period takes a second
// and more on a loaded host). A pause whose owner closed meanwhile has
// nothing left to undo.
func (p *pauser) set(op string, on bool, in func(change func(pauseTarget) error) error) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	wait := false
	err := in(func(t pauseTarget) error {
		if t.perfFDs == nil && (t.f == nil || !t.f.reader) {
			return errRingBufPause
		}
		if p.paused == on {
			return nil
		}
		var err error
		if t.perfFDs != nil {
			err = pausePerf(t.perfFDs(), on)
		} else {
			err = pauseRingBufs(t.f, on)
		}
		if err != nil {
			return err
		}
		p.paused, wait = on, on
		return nil
	})
	if err != nil || !wait {
		return err
	}
	if err := p.grace(); err != nil {
		_ = in(func(t pauseTarget) error {
			if t.perfFDs != nil {
				_ = pausePerf(t.perfFDs(), false)
			} else {
				_ = t.f.resumeReader()
			}
			p.paused = false
			return nil
		})
		return fmt.Errorf("%s: %w", op, err)
	}
	return nil
}

// pausePerf pauses (on) or resumes the perf events fds, ring by ring. A
// failure undoes what it did. The outputs that had passed the check of a
// pause end within an RCU grace period (perf_output_begin..end runs with
// preemption off): set waits for them.
func pausePerf(fds []int, on bool) error {
	for j, fd := range fds {
		if err := kernel.PauseOutput(fd, on); err != nil {
			for _, done := range fds[:j] {
				_ = kernel.PauseOutput(done, !on)
			}
			return fmt.Errorf("ring %d: %w", j, err)
		}
	}
	return nil
}

// pauseRingBufs marks f's reader key closed (on), which only the last
// reader alive may do (otherwise ErrMapInUse), or open again. An output
// past its test of the mark (__perfbuf_closed) may still reserve and
// commit: BPF programs run within an RCU read-side section (the sleepable
// ones within RCU tasks trace, which set's wait does not cover), and a
// grace period outlasts them: set waits for it.
func pauseRingBufs(f *failureMap, on bool) error {
	if !on {
		return f.resumeReader()
	}
	return f.pauseReader()
}

// openPausedEvents opens rings as openGoEvents does, each paused before it
// is stored in its slot (kernel.PerfConfig.Paused), so that no output
// reaches it unpaused: for a CPU that comes online while its owner is
// paused. (libbpf's perf_buffer stores the slot before a pause could be
// made.)
func openPausedEvents(fd int, cfg RingConfig, cpus []int32) (PerfEvents, error) {
	kc := cfg.kernel()
	kc.Paused = true
	p, err := kernel.OpenPerfRings(fd, kc, cpus)
	if err != nil {
		return nil, err
	}
	return goEvents{p}, nil
}
