// SPDX-License-Identifier: Apache-2.0

package perfbuf

// What the constructors take: Options, the ring settings of every mode, and
// ReaderOptions, a Reader's. Checked in checks.go.

import (
	"time"

	"github.com/perfbuf/perfbuf/internal/prepared"
)

// Options are the ring settings, the same for every mode: [NewReader] (in
// [ReaderOptions]), [New] and [NewRaw]. The zero value suits most maps. They
// are checked before any ring is claimed or mapped; an error names the field,
// and the kind of map when that is why it is refused.
type Options struct {
	// Maps are further BPF ring buffers to read with the map given: ring
	// buffers, or arrays of maps of ring buffers. A perf event array is
	// read alone.
	Maps []Map

	// RingBytes is each ring's size, rounded up to a power of two pages.
	// Zero means 256 KiB for a perf event array's rings, which the reader
	// makes, and the map's own size for a ring buffer, whose size is set
	// when its object loads (a RingBytes that disagrees with it is refused).
	RingBytes int

	// WakeupEvents wakes the reader once every WakeupEvents samples of a
	// perf ring (the event's wakeup_events; zero means 1, or, for a
	// Reader, its latency budget: see MaxLatency). Samples below it raise
	// no wakeup: a Reader takes them within MaxLatency. Ring buffers
	// refuse it: see WakeupBytes.
	WakeupEvents int

	// WakeupBytes, if set, wakes the reader once a ring holds this many
	// bytes, instead of WakeupEvents: for a perf ring the kernel's
	// watermark; for a ring buffer, a program that writes through
	// bpf/perfbuf.bpf.h forces the wakeup (bpfbuffer.Prepare sets it at
	// load) and a Reader woken earlier waits for it, within MaxLatency.
	WakeupBytes int

	// MaxSampleSize, if set, is the largest sample the programs write.
	// A ring that cannot hold one is refused with [ErrSampleTooLarge].
	MaxSampleSize int

	// FailureMap, if set, is the programs' PERFBUF_FAILURE_MAP of
	// bpf/perfbuf.bpf.h: the outputs that failed before reaching a ring,
	// which [Stats] reports in Failed (docs/failures.md). Over ring
	// buffers it also tells the programs when the last reader is gone.
	FailureMap Map

	// Programs, if set, are the descriptors of the BPF programs that write
	// to the rings (libbpfgo's BPFProg.FileDescriptor, cilium/ebpf's
	// Program.FD): [Stats] reports the runs of theirs that the kernel
	// skipped in NotRun, events that no ring or failure map can count.
	// The reader holds duplicates until Close.
	Programs []int

	// prepared is what bpfbuffer's or ciliumbuffer's Prepare made of the
	// buffer, which completed these Options: the map given must be it.
	prepared *prepared.Buffer
}

func init() {
	prepared.Set = func(opts any, b *prepared.Buffer) { opts.(*Options).prepared = b }
}

// ReaderOptions configures [NewReader].
type ReaderOptions struct {
	Options

	// MaxLatency is the latency budget: how late a record may be
	// delivered. Within it the Reader asks the fewest wakeups of the
	// programs, each of which costs the writing program many times its
	// own work (docs/performance.md): over a perf event array the kernel
	// wakes it once a ring is half full; over ring buffers it keeps the
	// ring's consumer position at the last record it delivered, so that
	// the kernel wakes it for the first record after a quiet spell and
	// for none while records keep coming. While it waits it looks at the
	// rings every seven eighths of MaxLatency, so that a record is
	// delivered within it (a ring must hold what the programs write in a
	// budget at their peak rate, unless they force a wakeup: see
	// WakeupBytes). Zero means 10 ms; negative, no budget: the reader is
	// woken for every record (libbpf's and cilium/ebpf's way) and sets no
	// timer. With WakeupEvents or WakeupBytes set, they say when the
	// kernel wakes the reader, and MaxLatency bounds the wait of what is
	// below them.
	MaxLatency time.Duration

	// Order, if set, delivers the records in the order of a key. Without
	// it the fullest ring goes first, a quarter of a ring at a time.
	Order *Order
}

// Order makes a [Reader] deliver records in nondecreasing order of a key,
// a u64 in each sample such as a bpf_ktime_get_ns() stamp. The smallest
// key among the rings goes when
//
//  1. every ring has shown a key at least as large (with StampedKeys, an
//     empty ring buffer shows the time it was found empty), or
//  2. a key MaxDelay (in nanoseconds) larger has been seen on any ring, or
//  3. the reader first saw it MaxDelay ago, or
//  4. a ring holds more than HighWater bytes: release rather than lose, or
//  5. a Flush or Close is under way.
//
// A sample released by rules 2 to 4 ahead of a smaller key that came later
// is delivered with Late set, and counted in [Stats]. Lost records go as
// soon as they are reached. Rule 1 needs rings that one CPU writes each (a
// perf event array, a ring buffer per CPU); over a ring buffer shared by
// CPUs, set MaxDelay to the disorder the programs make, or use
// StampedKeys. docs/ordered.md has the rules' details over ring buffers.
type Order struct {
	// KeyOffset is where the key sits in each sample, in the host's byte
	// order. A sample too short to hold it has key 0. NewReader refuses
	// a key that ends past MaxSampleSize or the largest sample a ring holds.
	KeyOffset int

	// MaxDelay is how long a record may wait for a smaller key from
	// another ring. Zero means 100 ms.
	MaxDelay time.Duration

	// StampedKeys says that the keys are bpf_ktime_get_ns() read after the
	// record's reservation (perfbuf_stamp in bpf/perfbuf.bpf.h), so that
	// over ring buffers a record goes at the next look after its key, not
	// at MaxDelay.
	StampedKeys bool

	// HighWater is rule 4's fill, in bytes. Zero means a quarter of a
	// ring; over ring buffers, the rings' total size (docs/ordered.md).
	HighWater int
}
