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
	ErrMapType        = owner.ErrMapType        // not a perf event array or ring buffer (or array of them)
	ErrSampleTooLarge = owner.ErrSampleTooLarge // MaxSampleSize cannot fit in a ring
	ErrMapInUse       = owner.ErrMapInUse       // another owner in this process reads the map
	ErrBusy           = owner.ErrBusy           // a RawBuffer holds the ring
	ErrReentrant      = wait.ErrReentrant       // a call from a callback would wait for itself
	ErrFlushed        = owner.ErrFlushed        // a Reader delivered what was there at Flush
)

// ErrCorrupt is what a *[CorruptError] matches: a ring held a record or
// position the kernel never writes.
var ErrCorrupt = ring.ErrCorrupt

// CorruptError describes a record or position that cannot be valid, by
// its Ring, CPU, Pos, Size and Reason. It matches [ErrCorrupt].
type CorruptError = ring.CorruptError
