// SPDX-License-Identifier: Apache-2.0

package perfbuf

// What is counted per ring: Stats, and the BPF side's failed outputs.

import (
	"fmt"
	"time"

	"github.com/perfbuf/perfbuf/internal/owner"
	"github.com/perfbuf/perfbuf/internal/ring"
)

// Stats counts one ring's records. The owners' Stats return an entry per
// ring, in buffer index order; with a FailureMap, a CPU without a ring of
// its own may get an entry too (Ring -1), for its failures; with
// Options.Programs, their skipped runs (NotRun) come in an entry of their
// own (Ring and CPU -1) once there are some, or in the one entry of a ring
// buffer read alone.
//
// Once a [Reader], [PerfBuffer] or [Raw] is closed, what the programs
// output (or, with Options.Programs, would have) is
//
//	Samples + Dropped + Lost + Discarded + Left + Failed.Total() + NotRun
//
// summed over the entries of a CPU for a perf event array (a CPU that came
// back online has two rings), in its one entry for a ring buffer read
// alone, and over every entry for several ring buffers (each CPU's failures
// come in an entry of its own); the programs' entry (Ring and CPU -1), if
// any, adds their runs not run. A perf ring has no Discarded; a ring buffer
// no Lost (a full ring is Failed.Full). A [Recorder] counts what its
// snapshots returned and left out; what the kernel overwrote is not counted.
//
// A reader of a pinned ring buffer opened after another one closed goes on
// where that one stopped (see [Reader]) and counts what it finds there as
// Found; the identity over readers opened one after another is in
// docs/failures.md, "Reopening a pinned buffer". A perf event array's
// Found is always 0: its rings are the reader's own.
//
// Records carry no time: Waiting is an upper bound, the time since the
// reader (at a commit) or a Stats call last saw the ring with no record
// written before then still undelivered; records already in a ring at
// opening count from the opening.
//
// A read counts what it delivered when it commits the ring's space, once
// a chunk of the ring or its turn on the ring is read: the last records a
// ReadInto or ReadBatch returned are counted by the next read, or at
// Close, not before.
type Stats struct {
	Ring int // the ring's buffer index, or -1
	CPU  int // the ring's CPU, or -1 for a ring shared by CPUs

	Samples   uint64   // samples delivered
	Dropped   uint64   // late samples dropped (Order.DropLate)
	Lost      uint64   // samples a full or paused perf ring refused: its event's count (6.0), else as its lost records report
	Discarded uint64   // records the programs discarded (bpf_ringbuf_discard)
	Left      uint64   // samples left in the ring at Close
	Found     uint64   // records (samples and discarded) in a ring buffer when the reader opened it
	Failed    Failures // outputs that failed before reaching the ring (with a FailureMap)
	// NotRun is the runs of Options.Programs that the kernel skipped
	// (recursion_misses of bpf_prog_info, 5.12; 0 before): a BPF program
	// was already running on the CPU, say an exec traced from inside
	// another tracing program's run. Their outputs were never made. It is
	// the programs', not a ring's: see Stats for the entry that holds it.
	NotRun uint64

	Skipped uint64 // Recorder: records a snapshot left out (no room, overwritten while copied, not committed)
	// Overwritten is, for a Recorder's ring buffer, the bytes (headers
	// included) the kernel has overwritten unread, as its overwrite
	// position tells; 0 for a perf ring, which does not tell.
	Overwritten uint64

	Bytes        uint64 // the payload bytes of Samples and Dropped
	Late         uint64 // samples delivered or dropped after a larger key (Order)
	Other        uint64 // perf records of other types, skipped
	Corrupt      uint64 // corruptions found, each reported once as a *CorruptError
	CorruptBytes uint64 // bytes skipped past them: what they hid is not counted above
	MaxFill      int    // the most bytes seen waiting in the ring
	Fill         int    // bytes waiting in the ring at the call (0 after Close)
	Size         int    // the ring's size in bytes

	// DeletesSlot says that Close deletes this perf ring's slot from the
	// map by key, whoever filled it since: the reader has no map file of
	// its own (no pin known and no CAP_SYS_ADMIN: see [Map]), or the map
	// has BPF_F_PRESERVE_ELEMS. False: Close releases the reader's own map
	// file, and the kernel empties the slot only if it still holds this
	// reader's ring, so that a reader in another process that filled it
	// since keeps it (docs/failures.md, "Two readers of one perf event
	// array").
	DeletesSlot bool

	Waiting time.Duration // at most how long the oldest record not delivered has waited (0: none)
	Held    time.Duration // Order: how long the reader has held back the record it holds (0: none)
}

// Failures counts the outputs that failed before reaching a ring, by
// cause, as bpf/perfbuf.bpf.h counts them in a FailureMap: its struct
// perfbuf_failures, field for field. They are the map's counts since the
// programs loaded; after Close, those when the rings were freed.
type Failures struct {
	NoEntry  uint64 // ENOENT: no ring in the CPU's slot (or no reader: see FailureMap)
	TooBig   uint64 // E2BIG: the CPU's index is past the map's max_entries
	Invalid  uint64 // EINVAL: flags the helper rejects; a reserve above the buffer's max sample
	NotOnCPU uint64 // EOPNOTSUPP: the slot's ring is another CPU's, or its event was stopped
	Other    uint64 // any other errno
	Full     uint64 // a ring buffer without room for the record
}

// Total is the number of failed outputs of every cause.
func (f Failures) Total() uint64 {
	return f.NoEntry + f.TooBig + f.Invalid + f.NotOnCPU + f.Other + f.Full
}

// Add returns the sum of f's and g's counts, cause by cause.
func (f Failures) Add(g Failures) Failures {
	return Failures{NoEntry: f.NoEntry + g.NoEntry, TooBig: f.TooBig + g.TooBig, Invalid: f.Invalid + g.Invalid,
		NotOnCPU: f.NotOnCPU + g.NotOnCPU, Other: f.Other + g.Other, Full: f.Full + g.Full}
}

// setCounts puts what a ring parsed, c, on st: every count but the owner's
// (Late, Dropped, Left) and the reads' (Fill, Size, Failed).
func (st *Stats) setCounts(c *ring.Counts) {
	st.Samples, st.Bytes, st.Lost, st.Other, st.Discarded = c.Samples, c.Bytes, c.Lost, c.Other, c.Discarded
	st.Corrupt, st.CorruptBytes, st.MaxFill = c.Corrupt, c.CorruptBytes, c.MaxFill
}

// publish returns the owner's counts (internal/owner) as Stats.
func publish(in []owner.Stats) []Stats {
	st := make([]Stats, len(in))
	for i, s := range in {
		st[i] = Stats{Ring: s.Ring, CPU: s.CPU, Samples: s.Samples, Dropped: s.Dropped, Lost: s.Lost,
			Discarded: s.Discarded, Left: s.Left, Found: s.Found, Failed: Failures(s.Failed), NotRun: s.NotRun,
			Skipped: s.Skipped, Overwritten: s.Overwritten, Bytes: s.Bytes, Late: s.Late, Other: s.Other,
			Corrupt: s.Corrupt, CorruptBytes: s.CorruptBytes, MaxFill: s.MaxFill, Fill: s.Fill, Size: s.Size,
			DeletesSlot: s.DeletesSlot, Waiting: s.Waiting, Held: s.Held}
	}
	return st
}

// wrap adds op to a non-nil error.
func wrap(op string, err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("%s: %w", op, err)
}
