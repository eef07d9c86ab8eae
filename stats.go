// SPDX-License-Identifier: Apache-2.0

package perfbuf

// What is counted per ring: Stats, and the BPF side's failed outputs.

import "github.com/perfbuf/perfbuf/internal/ring"

// Stats counts what was read from one ring. Every mode reports the same
// fields; those a mode has no use for stay zero.
//
// Stats methods return one entry per ring, in buffer index order. A CPU may
// have two rings (one opened at New, one when it came back online), and
// with a FailureMap, CPUs without a ring that had failures get an entry of
// their own after the rings'; sum entries by CPU for per-CPU totals.
//
// Per CPU, once the owner is closed, what the BPF program emitted is
// Samples + Lost + Left + Failed.Total() (docs/failures.md).
type Stats struct {
	Ring         int    // the ring's buffer index (-1 for a CPU's failures without a ring)
	CPU          int    // the CPU behind the ring
	Samples      uint64 // samples delivered (and late samples dropped: see Dropped)
	Bytes        uint64 // their payload bytes, as delivered (kernel padding included)
	Lost         uint64 // samples the kernel reported lost (at Close, also in lost records left unread)
	Other        uint64 // records of other types, skipped
	Corrupt      uint64 // corrupt records or heads found, each reported once as a *CorruptError
	CorruptBytes uint64 // bytes skipped past them
	Late         uint64 // ordered Reader: samples delivered (or dropped) behind a larger key
	Dropped      uint64 // ordered Reader with DropLate: late samples dropped
	Left         uint64 // samples left unread in the ring at Close
	Discarded    uint64 // ring buffers: records the BPF program discarded (bpf_ringbuf_discard), skipped (at Close, also those left unread)
	MaxFill      int    // the most bytes seen waiting in the ring
	Fill         int    // bytes waiting in the ring when Stats was called (0 after Close)
	Size         int    // the ring's data area in bytes: Fill and MaxFill are of it
	// Failed counts the CPU's failed bpf_perf_event_output calls, with a
	// FailureMap; on the CPU's latest ring's entry. They are the map's
	// counts, which the BPF program keeps from its load on, so outputs
	// before New (to a slot with no ring yet: NoEntry) count too. After
	// Close they are the counts when the rings were freed, once every
	// output that was running then had finished. New reads the map once;
	// a later read that fails (for want of kernel memory) leaves the counts
	// of the last one that worked.
	Failed Failures
}

// Failures counts a CPU's outputs that failed before reaching a ring, by
// cause, as bpf/perfbuf.bpf.h counts them in a failure map
// (Options.FailureMap).
//
// For a perf event array, a full ring (ENOSPC) is not among them: the
// kernel reports those samples in a lost record, counted in Stats.Lost,
// and per CPU, once the reader is closed, the outputs attempted are
// Samples + Lost + Left + Failed.Total().
//
// A ring buffer reports nothing lost: a record it had no room for is
// counted here, in Full, by the BPF program. Its one ring is every CPU's
// (Stats.CPU -1), so each CPU's failures come in entries of their own
// (Ring -1) after the ring's, and per ring, once the reader is closed, the
// outputs attempted are Samples + Discarded + Left + the CPUs'
// Failed.Total().
type Failures struct {
	NoEntry  uint64 // ENOENT: the CPU's slot in the map holds no ring; for a ring buffer, a NULL inner map
	TooBig   uint64 // E2BIG: the CPU's index is past the map's max_entries
	Invalid  uint64 // EINVAL: flags the helper rejects; a reserve above PERFBUF_BUFFER's max sample
	NotOnCPU uint64 // EOPNOTSUPP: the slot's ring is another CPU's, or its event was stopped
	Other    uint64 // any other errno
	Full     uint64 // ring buffers: no room for the record (bpf_ringbuf_reserve NULL, bpf_ringbuf_output EAGAIN)
}

// Total is the number of failed calls of every cause.
func (f Failures) Total() uint64 {
	return f.NoEntry + f.TooBig + f.Invalid + f.NotOnCPU + f.Other + f.Full
}

// setCounts puts what a ring parsed, c, on st: every count but the owner's
// (Late, Dropped, Left) and the reads' (Fill, Size, Failed).
func (st *Stats) setCounts(c *ring.Counts) {
	st.Samples, st.Bytes, st.Lost, st.Other, st.Discarded = c.Samples, c.Bytes, c.Lost, c.Other, c.Discarded
	st.Corrupt, st.CorruptBytes, st.MaxFill = c.Corrupt, c.CorruptBytes, c.MaxFill
}
