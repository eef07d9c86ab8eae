// SPDX-License-Identifier: Apache-2.0

package perfbuf

// What is counted per ring: Stats, and the BPF side's failed outputs.

import (
	"fmt"
	"time"

	"github.com/perfbuf/perfbuf/internal/owner"
)

// Stats are an owner's counts ([Rings.Stats]): the sums over its rings,
// and each ring's own in Rings, entry i for buffer index i.
//
// Once a [Reader], [PerfBuffer] or [Raw] is closed, what the programs
// output (or, with Options.Programs, would have) is, in the sums,
//
//	Samples + Lost + Discarded + Left + Failed.Total() + NotRun
//
// and, but for NotRun, in the entries of each CPU's perf rings, or of a
// ring buffer read alone. Over several ring buffers the failures are in
// the sums only. A read counts records when
// it commits them: the last a ReadInto returned are counted by the next
// read, or at Close. docs/failures.md has the ledger's details.
type Stats struct {
	CPU int // the ring's CPU; -1 for a ring shared by CPUs, and in the sums

	Samples   uint64   // samples delivered
	Lost      uint64   // samples a full ring had no room for (a paused perf ring's too)
	Discarded uint64   // records the programs discarded (bpf_ringbuf_discard)
	Left      uint64   // samples left in the ring at Close; a Recorder's left out of a snapshot
	Found     uint64   // records in a ring buffer when the reader opened it
	Failed    Failures // outputs that failed before reaching a ring (with a FailureMap)
	NotRun    uint64   // runs of Options.Programs that the kernel skipped (recursion_misses, 5.12)
	Bytes     uint64   // the payload bytes of Samples
	Late      uint64   // samples delivered after a larger key (Order)
	Corrupt   uint64   // corruptions got past, each reported once as a *CorruptError

	Size    int           // the ring's size in bytes
	Fill    int           // bytes waiting in the ring at the call (0 after Close)
	MaxFill int           // the most bytes seen waiting (in the sums: the largest ring's)
	Waiting time.Duration // at most how long the oldest record not delivered has waited

	Wakeups uint64  // blocked reads, Polls and Waits that a wakeup ended (in the sums only)
	Rings   []Stats // each ring's counts (in the sums only)
}

// Failures counts the outputs that failed before reaching a ring, by
// cause, as bpf/perfbuf.bpf.h counts them in a FailureMap (a ring buffer
// without room is counted as Lost). They are the map's counts since the
// programs loaded; after Close, those when the rings were freed.
type Failures struct {
	NoEntry  uint64 // ENOENT: no ring in the CPU's slot, or no reader (see Options.FailureMap)
	TooBig   uint64 // E2BIG: the CPU's index is past the map's max_entries
	Invalid  uint64 // EINVAL: flags the helper rejects; a reserve above the buffer's max sample
	NotOnCPU uint64 // EOPNOTSUPP: the slot's ring is another CPU's, or its event was stopped
	Other    uint64 // any other errno
}

// Total is the number of failed outputs of every cause.
func (f Failures) Total() uint64 {
	return f.NoEntry + f.TooBig + f.Invalid + f.NotOnCPU + f.Other
}

// publish returns the owner's counts (internal/owner: an entry a ring,
// then entries of no ring's for failures and skipped runs) as Stats, and
// wakeups as the sums' Wakeups.
func publish(in []owner.Stats, wakeups uint64) Stats {
	sum := Stats{CPU: -1, Wakeups: wakeups}
	for _, s := range in {
		st := Stats{CPU: s.CPU, Samples: s.Samples, Lost: s.Lost + s.Failed.Full, Discarded: s.Discarded,
			Left: s.Left + s.Skipped, Found: s.Found, Failed: Failures{NoEntry: s.Failed.NoEntry,
				TooBig: s.Failed.TooBig, Invalid: s.Failed.Invalid, NotOnCPU: s.Failed.NotOnCPU, Other: s.Failed.Other},
			Bytes: s.Bytes, Late: s.Late, Corrupt: s.Corrupt, Size: s.Size, Fill: s.Fill, MaxFill: s.MaxFill,
			Waiting: s.Waiting}
		sum.add(&st)
		sum.NotRun += s.NotRun
		if s.Ring >= 0 {
			sum.Rings = append(sum.Rings, st)
		}
	}
	return sum
}

// add puts a ring's counts st in the sums s.
func (s *Stats) add(st *Stats) {
	s.Samples += st.Samples
	s.Lost += st.Lost
	s.Discarded += st.Discarded
	s.Left += st.Left
	s.Found += st.Found
	s.Failed.NoEntry += st.Failed.NoEntry
	s.Failed.TooBig += st.Failed.TooBig
	s.Failed.Invalid += st.Failed.Invalid
	s.Failed.NotOnCPU += st.Failed.NotOnCPU
	s.Failed.Other += st.Failed.Other
	s.Bytes += st.Bytes
	s.Late += st.Late
	s.Corrupt += st.Corrupt
	s.Size += st.Size
	s.Fill += st.Fill
	s.MaxFill = max(s.MaxFill, st.MaxFill)
	s.Waiting = max(s.Waiting, st.Waiting)
}

// wrap adds op to a non-nil error.
func wrap(op string, err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("%s: %w", op, err)
}
