// SPDX-License-Identifier: Apache-2.0

package perfbuf

// Flight-recorder mode: Recorder keeps overwritable rings (backward perf
// rings, ring buffers in overwrite mode) that no one consumes, and copies
// their newest records on demand. How it opens, pauses and counts is
// internal/owner's (recorder.go), the parse internal/snapshot's.

import "github.com/perfbuf/perfbuf/internal/owner"

// Recorder keeps the newest records of a map's rings, for a flight
// recorder: the kernel overwrites the oldest, and nothing is read until
// [Recorder.Snapshot]. Its methods may be called from any goroutine. While
// paused it keeps its records; a perf ring's first after Resume is the
// lost record of the outputs it refused.
type Recorder struct {
	Rings
	r *owner.Recorder
}

// NewRecorder opens m's rings as overwritable rings: a backward perf ring
// on every online CPU, or ring buffers in overwrite mode
// (BPF_F_RB_OVERWRITE, kernel 6.19; bpfbuffer's Prepare with Overwrite).
// A perf ring wakes [Rings.EpollFD] as WakeupEvents or WakeupBytes say,
// else once half of it was written, for a caller that takes
// Snapshot(..., true) when woken; over ring buffers both must be zero.
// Errors: as [NewReader]'s; os.ErrInvalid for a ring buffer not in
// overwrite mode, errors.ErrUnsupported on a kernel without it.
func NewRecorder(m Map, opts Options) (*Recorder, error) {
	const op = "new Recorder"
	if err := opts.check(); err != nil {
		return nil, wrap(op, err)
	}
	r, err := owner.OpenRecorder(m, opts.ring(), ownerMaps(opts.Maps), opts.FailureMap, opts.Programs)
	if err != nil {
		return nil, wrap(op, err)
	}
	return &Recorder{Rings{r}, r}, nil
}

// Snapshot copies the newest whole records of every ring into buf and
// appends them to dst, oldest first: a perf event array's merged by the
// time of each sample (Key), ring buffers' ring after ring ([Order.Sort]
// merges them by a key of their own); Data aliases buf. Each ring is read as it was at one instant, after an RCU
// grace period; records overwritten while copied are left out, and with
// onlyNew so are those the previous Snapshot read. buf is shared among the
// rings; what does not fit is left out (counted in [Stats] as Left), and a
// ring whose newest record does not fit gives an error wrapping
// io.ErrShortBuffer with the records.
func (r *Recorder) Snapshot(buf []byte, dst []Record, onlyNew bool) ([]Record, error) {
	return r.r.Snapshot(buf, dst, onlyNew)
}
