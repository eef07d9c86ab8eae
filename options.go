// SPDX-License-Identifier: Apache-2.0

package perfbuf

// What the constructors take: Options, the ring settings of every mode, and
// ReaderOptions, a Reader's. Checked in checks.go.

import (
	"time"

	"github.com/perfbuf/perfbuf/internal/prepared"
)

// Options are the ring settings of every mode. The zero value suits most
// maps. They are checked before any ring is opened; an error names the
// field, and the kind of map when that is why it is refused.
type Options struct {
	// Maps are more BPF ring buffers (or arrays of them) to read with the
	// map given. A perf event array is read alone.
	Maps []Map

	// RingBytes is a perf ring's size, rounded up to a power of two pages
	// (zero: 256 KiB). A ring buffer's is its map's: a RingBytes that
	// disagrees with it is refused.
	RingBytes int

	// WakeupEvents wakes the reader once every WakeupEvents samples of a
	// perf ring (zero: every sample, or a Reader's MaxLatency decides).
	WakeupEvents int

	// WakeupBytes wakes the reader once a ring holds this many bytes:
	// a perf ring's watermark; over a ring buffer, programs that write
	// through bpf/perfbuf.bpf.h force the wakeup (docs/bpfbuffer.md).
	WakeupBytes int

	// MaxSampleSize is the largest sample the programs write: a ring that
	// cannot hold one is refused with [ErrSampleTooLarge].
	MaxSampleSize int

	// FailureMap is the programs' PERFBUF_FAILURE_MAP (bpf/perfbuf.bpf.h):
	// the outputs that failed before reaching a ring (docs/failures.md).
	FailureMap Map

	// Programs are the descriptors of the programs that write to the
	// rings: [Stats] counts the runs the kernel skipped as NotRun.
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

	// MaxLatency is how late a record may be delivered. Within it the
	// Reader asks the fewest wakeups of the programs, each of which costs
	// a program many times its own work (docs/performance.md), and looks
	// at the rings itself in time. Zero means 10 ms; negative, a wakeup a
	// record, as libbpf and cilium/ebpf do.
	MaxLatency time.Duration

	// Order delivers the records in the order of a key. Without it the
	// fullest ring goes first.
	Order *Order
}

// Order makes a [Reader] deliver records in nondecreasing order of a key,
// a u64 in each sample such as a bpf_ktime_get_ns() stamp. The smallest
// key goes when every ring has shown one as large, when a key MaxDelay
// (in nanoseconds) larger was seen, when it has waited MaxDelay, when a
// ring holds more than HighWater bytes, or at Flush and Close; a sample
// that a smaller key follows is delivered with Late set. Over a ring
// buffer shared by CPUs, use StampedKeys or a MaxDelay as large as the
// disorder (docs/ordered.md).
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

	// HighWater is the fill, in bytes, past which a ring's keys go early.
	// Zero means a quarter of a ring; over ring buffers, the rings' total
	// size (docs/ordered.md).
	HighWater int
}
