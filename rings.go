// SPDX-License-Identifier: Apache-2.0

package perfbuf

// Rings: what the owners that read a map's rings as they fill (Reader,
// PerfBuffer, Raw) share, declared once; each embeds it.

import "github.com/perfbuf/perfbuf/internal/owner"

// Rings is a map's rings as a [Reader], a [PerfBuffer] or a [Raw] opened
// them; each embeds it, and its methods are theirs. They may be called from
// any goroutine, also from a read's function or a callback.
type Rings struct{ c *owner.Core }

// Close stops the owner: a blocked read, Poll or Wait returns an error
// matching os.ErrClosed at once, and the rings are freed (after the
// outputs in progress end: an RCU grace period) once no call is in
// progress: a read or drain running a function or callback stops after it
// returns, and a Raw's rings once every RawBuffer is released. A Pause or
// Resume in progress delays neither. What is still in the rings is counted
// in Stats as Left (a Reader's: call Flush and read first to deliver it;
// see [Reader] for what a reopened ring buffer goes on from). Close may be
// called any number of times.
func (r Rings) Close() error {
	r.c.Close()
	return nil
}

// Stats returns each ring's counts, in buffer index order (see [Stats]),
// also after Close. A Raw's rings count what was left in them at Close and
// the losses the kernel counted that no lost record reported; what a
// RawBuffer reads is in its own Stats.
func (r Rings) Stats() []Stats { return publish(r.c.Stats()) }

// Pause stops the output into every ring and returns once the outputs in
// progress have finished, until [Rings.Resume]. Reads, drains and Waits
// while paused still find what is in the rings, then block. Pausing while
// paused does nothing, as does resuming while not; after Close both fail
// with os.ErrClosed.
//
// A perf event array's rings are paused by the kernel
// (PERF_EVENT_IOC_PAUSE_OUTPUT; the ring of a CPU that comes online
// meanwhile opens paused). It refuses the outputs (bpf_perf_event_output
// returns ENOSPC) and counts them: a ring's next output after Resume comes
// after a lost record of that count, delivered as a [RecordLost] and
// counted in [Stats] Lost. The kernel reports that count only then: on a
// ring closed paused, or not written again, it is counted nowhere.
//
// Ring buffers have no such switch: Pause marks the reader key of
// Options.FailureMap closed, as the last reader's Close does. Outputs
// through bpf/perfbuf.bpf.h then fail in the program, counted in [Stats]
// Failed.NoEntry; other outputs are not stopped. Without a FailureMap
// whose reader key counts this owner, the error wraps
// errors.ErrUnsupported; while another process's reader holds the key
// open, [ErrMapInUse].
func (r Rings) Pause() error { return r.c.SetPaused("pause "+r.c.Name(), true) }

// Resume undoes Pause: the outputs reach the rings again. Errors: as
// Pause's.
func (r Rings) Resume() error { return r.c.SetPaused("resume "+r.c.Name(), false) }

// Wakeups counts the blocked reads, Polls and Waits that a ring's wakeup
// ended (not a timeout, Close, Flush or a deadline).
func (r Rings) Wakeups() uint64 { return r.c.W.Wakeups() }

// FollowsCPUs reports whether samples of CPUs that come online after the
// rings were opened are read: always for ring buffers; for a perf event
// array, when the CPU uevent socket opened (not in a user namespace:
// docs/kernels.md).
func (r Rings) FollowsCPUs() bool { return r.c.FollowsCPUs() }

// BufferCount returns the number of rings (perf_buffer__buffer_cnt): one
// per CPU at the opening, then one more for each CPU that came online
// since (a read, drain or Wait opens its ring). It opens nothing, and stays
// valid after Close.
func (r Rings) BufferCount() int { return r.c.Count() }

// BufferFD returns ring i's perf event descriptor (perf_buffer__buffer_fd),
// or for a ring buffer its map's. It is the owner's: do not close it.
// Errors: os.ErrInvalid for an index out of range, os.ErrClosed.
func (r Rings) BufferFD(i int) (int, error) { return r.c.BufferFD(i) }

// EpollFD returns an epoll descriptor over every ring
// (perf_buffer__epoll_fd), for a caller that waits in its own loop, then
// calls Consume (callback mode) or Wait(0, nil) (raw mode), which also
// take in the rings of CPUs that came online. It is the owner's: do not
// close it. Errors: os.ErrClosed.
func (r Rings) EpollFD() (int, error) { return r.c.EpollFD() }
