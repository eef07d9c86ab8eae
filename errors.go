// SPDX-License-Identifier: Apache-2.0

package perfbuf

// The package's errors: the sentinels and the error of a corrupt ring. A
// sentinel's text fits either kind of map; the context names the kind and
// the map (internal/owner, Core.Name).

import (
	"github.com/perfbuf/perfbuf/internal/owner"
	"github.com/perfbuf/perfbuf/internal/ring"
	"github.com/perfbuf/perfbuf/internal/wait"
)

// Errors returned by this package, each wrapped with context.
var (
	// ErrMapType: the map is not one a reader reads (a perf event array,
	// BPF ring buffers, an array of ring buffers), or the descriptor is not
	// a BPF map.
	ErrMapType = owner.ErrMapType
	// ErrSampleTooLarge: MaxSampleSize cannot fit in a ring.
	ErrSampleTooLarge = owner.ErrSampleTooLarge
	// ErrMapInUse: another Reader, PerfBuffer or Raw of this process reads the
	// map (a perf event array has one ring slot per CPU, so one reader;
	// a ring buffer one consumer position).
	ErrMapInUse = owner.ErrMapInUse
	// ErrBusy: the ring is held by a RawBuffer (see Raw.Buffer).
	ErrBusy = owner.ErrBusy
	// ErrReentrant: a call made from inside a callback (New's sample or
	// lost function, an Each or Consume function, an All loop) would wait for a
	// call in progress, perhaps the one running the callback.
	ErrReentrant = wait.ErrReentrant
	// ErrFlushed: a Reader delivered everything that was in the rings when
	// Flush was called.
	ErrFlushed = owner.ErrFlushed
)

// ErrCorrupt is what a *[CorruptError] matches: a ring held a record or
// position the kernel never writes.
var ErrCorrupt = ring.ErrCorrupt

// CorruptError describes a ring record, or ring position, that cannot be
// valid: its fields are Ring and CPU (the ring's buffer index and CPU, -1
// for a ring shared by CPUs), Pos (the bad record's position, or the
// consumer position), Size (the record's size, or the bad producer
// position) and Reason. It matches [ErrCorrupt].
type CorruptError = ring.CorruptError
