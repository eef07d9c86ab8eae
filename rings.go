// SPDX-License-Identifier: Apache-2.0

package perfbuf

// Rings: what every owner of a map's rings (Reader, PerfBuffer, Raw,
// Recorder) shares, declared once; each embeds it.

import "github.com/perfbuf/perfbuf/internal/owner"

// Rings is a map's rings as a [Reader], [PerfBuffer], [Raw] or [Recorder]
// opened them; each embeds it, and its methods are theirs. They may be
// called from any goroutine, also from a read's function or a callback.
type Rings struct{ o ringsOwner }

// ringsOwner is what Rings calls: an *owner.Core (the readers) or an
// *owner.Recorder.
type ringsOwner interface {
	Close()
	Stats() []owner.Stats
	SetPaused(op string, on bool) error
	Wakeups() uint64
	Count() int
	BufferFD(i int) (int, error)
	EpollFD() (int, error)
	Name() string
}

// Close stops the owner: a blocked read, Poll or Wait returns an error
// matching os.ErrClosed at once, and the rings are freed (after the
// outputs in progress end) once no call is in progress: a read, drain or
// Snapshot returns first, and a Raw's rings wait for every RawBuffer's
// release. What is still in the rings is counted as Left (a Reader's: call
// Flush and read first to deliver it). Close may be called any number of
// times.
func (r Rings) Close() error {
	r.o.Close()
	return nil
}

// Stats returns the counts of every ring (see [Stats]), also after Close.
func (r Rings) Stats() Stats { return publish(r.o.Stats(), r.o.Wakeups()) }

// Pause stops the output into every ring, once the outputs in progress
// have finished, until [Rings.Resume]; reads still find what is in the
// rings. A perf ring counts what it refused as a [RecordLost] after
// Resume. Over ring buffers, outputs through bpf/perfbuf.bpf.h fail with
// Failed.NoEntry, others go on; without a FailureMap the error wraps
// errors.ErrUnsupported (docs/failures.md).
func (r Rings) Pause() error { return r.o.SetPaused("pause "+r.o.Name(), true) }

// Resume undoes Pause. Errors: as Pause's.
func (r Rings) Resume() error { return r.o.SetPaused("resume "+r.o.Name(), false) }

// BufferCount returns the number of rings (perf_buffer__buffer_cnt): one
// per CPU at the opening, then one more for each CPU that came online
// since (a read, drain or Wait opens its ring).
func (r Rings) BufferCount() int { return r.o.Count() }

// BufferFD returns ring i's perf event descriptor (perf_buffer__buffer_fd),
// or for a ring buffer its map's. It is the owner's: do not close it.
// Errors: os.ErrInvalid for an index out of range, os.ErrClosed.
func (r Rings) BufferFD(i int) (int, error) { return r.o.BufferFD(i) }

// EpollFD returns an epoll descriptor over every ring
// (perf_buffer__epoll_fd), for a caller that waits in its own loop and
// then calls a Reader's Consume, a PerfBuffer's Consume, a Raw's
// Wait(0, nil) or a Recorder's Snapshot. It is the owner's: do not close
// it. Errors: os.ErrClosed; errors.ErrUnsupported for a Recorder over ring
// buffers.
func (r Rings) EpollFD() (int, error) { return r.o.EpollFD() }
