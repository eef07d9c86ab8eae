// SPDX-License-Identifier: Apache-2.0

package perfbuf

// Flight-recorder mode: Recorder keeps overwritable rings (backward perf
// rings, ring buffers in overwrite mode) that no one consumes, and copies
// their newest records on demand. How it opens, pauses and counts is
// internal/owner's (recorder.go), the parse internal/snapshot's.

import "github.com/perfbuf/perfbuf/internal/owner"

// Recorder keeps the newest records of a map's rings, for a flight
// recorder: the kernel overwrites the oldest records instead of waiting for
// a reader, nothing is consumed, and nothing is read until
// [Recorder.Snapshot]. Its methods may be called from any goroutine; they
// run one at a time. While it is paused ([Rings.Pause]) its snapshots
// return the same records; a perf ring's first record after Resume is the
// lost record of the outputs it refused.
type Recorder struct {
	Rings
	r *owner.Recorder
}

// NewRecorder opens m's rings as overwritable rings: for a perf event
// array, a backward ring on every online CPU, mapped read-only (CPUs that
// come online later get none); for a BPF ring buffer, or an array of them
// and opts.Maps, each must be in overwrite mode (map flag
// BPF_F_RB_OVERWRITE, kernel 6.19). WakeupEvents and WakeupBytes must be
// zero.
//
// Errors: as [NewReader]'s; os.ErrInvalid for a ring buffer not in
// overwrite mode, errors.ErrUnsupported if the kernel has none.
func NewRecorder(m Map, opts Options) (*Recorder, error) {
	const op = "new Recorder"
	if err := opts.checkRecorder(); err != nil {
		return nil, wrap(op, err)
	}
	r, err := owner.OpenRecorder(m, opts.ring(), ownerMaps(opts.Maps), opts.FailureMap, opts.Programs)
	if err != nil {
		return nil, wrap(op, err)
	}
	return &Recorder{Rings{r}, r}, nil
}

// Snapshot copies the newest whole records of every ring into buf and
// returns them appended to dst: ring after ring, in buffer index order,
// each ring's oldest first. Data aliases buf. Each ring is read as it was
// at its own instant, when its newest position was loaded, while the
// programs write on (or at Pause); records overwritten while
// they were copied are left out. Each ring waits for an RCU grace period
// (milliseconds; none for a paused perf ring): programs that rewrite a
// ring within it leave little to return, and a snapshot taken under Pause
// returns the whole ring. With onlyNew, a ring's records written before
// the previous Snapshot read it are left out.
//
// buf is shared out among the rings: a ring that holds less than an equal
// part gets what it holds, the others share the rest equally; a ring keeps
// its newest records that fit. What a snapshot leaves out is counted in
// [Stats] (Left). If a ring's newest record does not fit in its part,
// the error wraps io.ErrShortBuffer; the records returned are valid with
// it. Other errors: os.ErrClosed, the kernel's errno from the wait for
// writers.
func (r *Recorder) Snapshot(buf []byte, dst []Record, onlyNew bool) ([]Record, error) {
	return r.r.Snapshot(buf, dst, onlyNew)
}
