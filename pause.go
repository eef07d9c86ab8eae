// SPDX-License-Identifier: Apache-2.0

package perfbuf

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
}

// errRingBufPause is Pause's error over ring buffers it cannot pause.
var errRingBufPause = fmt.Errorf("ring buffers pause only through the reader key of Options.FailureMap, for programs that write through bpf/perfbuf.bpf.h: %w", errors.ErrUnsupported)

// set pauses (on) or resumes the output into the rings, unless they are
// so already. perfFDs, for a perf event array, returns every ring's
// event, in buffer index order (rings of CPUs gone offline included); it
// is called under p.mu. Without it, the rings are ring buffers, paused
// through f's reader key: errRingBufPause if f has none. A pause returns
// once the outputs in progress have finished (kernel.WaitWriters); a
// failed one undoes what it did.
func (p *pauser) set(on bool, perfFDs func() []int, f *failureMap) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if perfFDs == nil && (f == nil || !f.reader) {
		return errRingBufPause
	}
	if p.paused == on {
		return nil
	}
	var err error
	if perfFDs != nil {
		err = pausePerf(perfFDs(), on)
	} else {
		err = pauseRingBufs(f, on)
	}
	if err != nil {
		return err
	}
	p.paused = on
	return nil
}

// pausePerf pauses (on) or resumes the perf events fds, ring by ring, and
// after a pause waits for the outputs that had passed its check: they end
// within an RCU grace period (perf_output_begin..end runs with preemption
// off). A failure undoes what it did.
func pausePerf(fds []int, on bool) error {
	for j, fd := range fds {
		if err := kernel.PauseOutput(fd, on); err != nil {
			for _, done := range fds[:j] {
				_ = kernel.PauseOutput(done, !on)
			}
			return fmt.Errorf("ring %d: %w", j, err)
		}
	}
	if !on {
		return nil
	}
	if err := kernel.WaitWriters(); err != nil {
		_ = pausePerf(fds, false)
		return err
	}
	return nil
}

// pauseRingBufs marks f's reader key closed (on), which only the last
// reader alive may do (otherwise ErrMapInUse), or open again.
func pauseRingBufs(f *failureMap, on bool) error {
	if !on {
		return f.resumeReader()
	}
	if err := f.pauseReader(); err != nil {
		return err
	}
	// An output past its test of the mark (__perfbuf_closed) may still
	// reserve and commit: BPF programs run within an RCU read-side
	// section (the sleepable ones within RCU tasks trace, which this does
	// not wait for), and a grace period outlasts them.
	if err := kernel.WaitWriters(); err != nil {
		_ = f.resumeReader()
		return err
	}
	return nil
}

// openPausedEvents opens rings as openGoEvents does, each paused before it
// is stored in its slot (kernel.PerfConfig.Paused), so that no output
// reaches it unpaused: for a CPU that comes online while its owner is
// paused. (libbpf's perf_buffer stores the slot before a pause could be
// made.)
func openPausedEvents(fd int, cfg ringConfig, cpus []int32) (perfEvents, error) {
	kc := cfg.kernel()
	kc.Paused = true
	p, err := kernel.OpenPerfRings(fd, kc, cpus)
	if err != nil {
		return nil, err
	}
	return goEvents{p}, nil
}

// setPaused is the owners' Pause (on) and Resume: see pauser.set. After
// Close, os.ErrClosed.
func (c *core) setPaused(op string, on bool) error {
	if err := c.life.Enter(op); err != nil {
		return err
	}
	defer c.life.Exit()
	var fds func() []int
	var f *failureMap
	if c.src != nil {
		f = c.src.failureCounters()
		if r, ok := c.src.(*rings); ok {
			fds = r.eventFDs
		}
	}
	return wrap(op, c.pause.set(on, fds, f))
}
