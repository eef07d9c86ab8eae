// SPDX-License-Identifier: Apache-2.0

package owner

// What the owner counts per ring, as the root's Stats and Failures
// publish it (perfbuf.Stats documents each count).

import (
	"errors"
	"fmt"
	"time"

	"github.com/perfbuf/perfbuf/internal/ring"
)

// Stats are one ring's counts: perfbuf.Stats, field for field.
type Stats struct {
	Ring, CPU int
	Tally
	Failed              Failures
	NotRun              uint64 // the programs' (programs.go)
	MaxFill, Fill, Size int
	Waiting             time.Duration
}

// Tally are the records of a ring that Stats counts, by fate.
type Tally struct {
	Samples, Lost, Discarded, Left, Found uint64
	Skipped                               uint64 // a Recorder's: left out of snapshots
	Bytes, Late, Corrupt                  uint64
}

// Failures are the outputs that failed before reaching a ring, by cause:
// perfbuf.Failures, field for field.
type Failures struct {
	NoEntry, TooBig, Invalid, NotOnCPU, Other, Full uint64
}

// setCounts puts what a ring parsed, c, on st: every count but the
// owner's (Late, Left, Found) and the reads' (Fill, Size, Failed).
func (st *Stats) setCounts(c *ring.Counts) {
	st.Samples, st.Bytes, st.Lost, st.Discarded = c.Samples, c.Bytes, c.Lost, c.Discarded
	st.Corrupt, st.MaxFill = c.Corrupt, c.MaxFill
}

// The errors that the root exports under the same names (perfbuf's
// errors.go documents them).
var (
	ErrFlushed        = errors.New("reader flushed")
	ErrBusy           = errors.New("ring held by a raw reader")
	ErrMapType        = errors.New("map is neither a perf event array nor a BPF ring buffer")
	ErrSampleTooLarge = errors.New("sample does not fit in the ring")
	ErrMapInUse       = errors.New("map read by another reader")
)

// wrap adds op to a non-nil error.
func wrap(op string, err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("%s: %w", op, err)
}

// Add returns the sum of f's and g's counts, cause by cause.
func (f Failures) Add(g Failures) Failures {
	return Failures{NoEntry: f.NoEntry + g.NoEntry, TooBig: f.TooBig + g.TooBig, Invalid: f.Invalid + g.Invalid,
		NotOnCPU: f.NotOnCPU + g.NotOnCPU, Other: f.Other + g.Other, Full: f.Full + g.Full}
}
