// SPDX-License-Identifier: Apache-2.0

package perfbuf

// What New and NewReader take: one Options for both.

import (
	"fmt"
	"math"
	"os"
	"time"

	"github.com/perfbuf/perfbuf/internal/policy"
)

// Options configures New and NewReader. The ring settings apply to both;
// the others belong to one of them, and the other rejects them with
// os.ErrInvalid. Every option is checked before a ring is opened, mapped
// or claimed; an error names the field, and the kind of map when that is
// why it is refused.
type Options struct {
	// The maps: New and NewReader.

	// Maps are further BPF ring buffers read with the map given to New or
	// NewReader, as libbpf's ring_buffer__add adds them: ring buffers, or
	// arrays of maps whose inner maps are ring buffers. A perf event array
	// is read alone.
	Maps []Map

	// Ring settings: New and NewReader. A ring buffer's size is fixed when
	// its object loads, and its program says when it wakes its reader: of
	// these MaxSampleSize, WakeupBytes and FailureMap apply to ring
	// buffers, and the others are refused for them (os.ErrInvalid).

	// RingBytes sizes each CPU's ring: rounded up to a power of two pages
	// of the host's page size (os.Getpagesize), at least one page. Zero
	// means 256 KiB. An agent that ships one setting for every host sizes
	// its rings in bytes, whatever the page size (4 KiB or 64 KiB).
	RingBytes int

	// WakeupEvents wakes the reader once every WakeupEvents samples
	// (libbpf's perf_buffer_opts.sample_period, the event's
	// wakeup_events). Zero means 1. Larger values cut the producer's and
	// the consumer's cost, but samples below the threshold raise no
	// wakeup: a blocked Poll sleeps on them (a Poll that starts while they
	// are there delivers them at once), and a Reader picks them up within
	// MaxLatency.
	WakeupEvents int

	// WakeupBytes, if set, wakes the reader once a ring holds this many
	// bytes instead (the event's wakeup_watermark). It excludes
	// WakeupEvents > 1 and must be below the ring size.
	//
	// For a ring buffer it is the program's watermark: one that writes
	// through PERFBUF_BUFFER of bpf/perfbuf.bpf.h forces a wakeup at and
	// above it (bpfbuffer.Prepare sets it at load), and the kernel wakes
	// the reader for the first record after it caught up. A Reader woken
	// below the watermark waits up to MaxLatency for it before it drains
	// (it does not commit meanwhile, so no further wakeups come): a
	// wakeup per MaxLatency under light load, not per burst.
	WakeupBytes int

	// MaxSampleSize, if set, is the largest sample the BPF program
	// outputs, in bytes. New fails with ErrSampleTooLarge when a record
	// carrying it, with the kernel's 24-byte lost record in front of it,
	// cannot fit in a ring: the kernel would drop every such sample once
	// one was lost (a one-page ring takes at most 4052 bytes).
	MaxSampleSize int

	// FailureMap, if set, is the BPF-side failure counters of
	// bpf/perfbuf.bpf.h (PERFBUF_FAILURE_MAP): the bpf_perf_event_output
	// calls that failed before reaching a ring, which the kernel counts
	// nowhere else. Stats reads it into each CPU's Failed. It must be such
	// a map (a per-CPU array of one struct perfbuf_failures), or New and
	// NewReader fail with os.ErrInvalid. Over a ring buffer it also counts
	// the readers open, in every process: only the last one's Close marks
	// the reader gone, after which outputs through bpf/perfbuf.bpf.h fail
	// (NoEntry) and Close counts what is left exactly. A reader may so be
	// handed over between processes (docs/failures.md).
	FailureMap Map

	// Callback mode: New only.

	// SampleFunc receives each sample with the CPU it was written on; New
	// requires it unless Raw is set. data aliases ring memory and is valid
	// only during the call: copy what you keep. Its length is the kernel's
	// raw size, padded so that records stay 8-byte aligned (a 13-byte
	// bpf_perf_event_output arrives as 20 bytes), so samples must carry
	// their own length. It runs on the goroutine that called Poll or
	// Consume; a panic in it reaches that caller, and the samples after it
	// are delivered by the next call.
	SampleFunc func(cpu int, data []byte)

	// LostFunc, if set, receives each count of samples the kernel dropped
	// on a CPU because its ring was full. The kernel writes that record
	// only once a later sample fits, so a count can arrive late.
	LostFunc func(cpu int, count uint64)

	// Raw opens the rings for raw mode only (PerfBuffer.Buffer and
	// PerfBuffer.Wait), with no callbacks: SampleFunc and LostFunc must be
	// nil, and Poll, Consume and ConsumeBuffer fail.
	Raw bool

	// Reader: NewReader only.

	// MaxLatency bounds how long a record waits in a ring for a wakeup:
	// the reader drains at least this often while it blocks. With
	// WakeupEvents > 1 (or WakeupBytes) a ring below its threshold raises
	// no wakeup (libbpf#438); this is what still delivers it. Zero means
	// 100 ms with such wakeups and none without them (every sample wakes
	// the reader, and an idle reader sleeps until the next one); negative
	// means wait for wakeups only.
	MaxLatency time.Duration

	// Order, if set, merges the rings in the order of a key; by default
	// each pass drains the fullest ring first (by data_head - data_tail),
	// the one closest to losing samples, up to a quarter of a ring before
	// it moves to the next. A perf event array's only: over a ring buffer
	// NewReader refuses it (errors.ErrUnsupported).
	Order *Order
}

// ring returns the settings that depend on the kind of map, for
// config.go and ringbufs.go.
func (o *Options) ring() ringOptions {
	return ringOptions{ringBytes: o.RingBytes, wakeupEvents: o.WakeupEvents, wakeupBytes: o.WakeupBytes,
		maxSampleSize: o.MaxSampleSize, ordered: o.Order != nil}
}

// checkNew checks the fields that are not New's.
func (o *Options) checkNew() error {
	switch {
	case o.MaxLatency != 0 || o.Order != nil:
		return fmt.Errorf("options MaxLatency or Order set: they are NewReader's: %w", os.ErrInvalid)
	case o.Raw && (o.SampleFunc != nil || o.LostFunc != nil):
		return fmt.Errorf("options Raw with SampleFunc or LostFunc: %w", os.ErrInvalid)
	case !o.Raw && o.SampleFunc == nil:
		return fmt.Errorf("no SampleFunc (set Raw to read the rings with Buffer only): %w", os.ErrInvalid)
	}
	return nil
}

// checkReader checks the fields that are NewReader's, and that New's are not set.
func (o *Options) checkReader() error {
	if o.SampleFunc != nil || o.LostFunc != nil || o.Raw {
		return fmt.Errorf("options SampleFunc, LostFunc or Raw set: they are New's: %w", os.ErrInvalid)
	}
	if ord := o.Order; ord != nil {
		return ord.check()
	}
	return nil
}

// Order makes a Reader merge the rings in nondecreasing order of a key (a
// timestamp, typically): see Options.Order and the release rule below.
//
// The release rule. A CPU's records come in key order, but an idle CPU may
// still produce an earlier record. The smallest key among the rings' next
// records is released when
//
//  1. every ring has shown a key at least as large (nothing earlier can come
//     from a CPU whose keys only grow), or
//  2. a key KeyWindow (default MaxDelay, as nanoseconds) larger has been
//     seen on any ring (while records wait, the reader parses ahead to find
//     the newest keys), or
//  3. the reader first saw it MaxDelay ago (to within MaxDelay/32), or
//  4. a ring is filled past HighWater: release rather than lose, or
//  5. a Flush or Close is under way.
//
// The rules are applied whenever the reader looks: on every wakeup of a
// ring and every read. A reader that no wakeup comes to wakes itself for
// rule 3 by a timer, which may fire up to MaxDelay/2 late; so while
// samples keep coming it makes no wakeups of its own, and once they stop
// the last records held wait at most 3/2 MaxDelay.
//
// Rules 2 and 3 can release a record before an earlier one arrives; such a
// record, delivered after a larger key, is late: counted in Stats, and
// delivered with Late set, or dropped with DropLate. Lost records carry no
// key and are delivered as soon as they are reached.
//
// The records stay in the rings until delivered: each ring's next record is
// parsed in place, and a ring's tail is committed as its records go.
type Order struct {
	// KeyOffset is where the key sits in each sample: a u64 in the host's
	// byte order, as a BPF program stores it, such as a bpf_ktime_get_ns()
	// stamp. A sample too short to hold it has key 0.
	KeyOffset int
	// Key, if set, computes the key instead; data is the whole payload
	// (copied when it straddles the ring's end) and valid during the call.
	Key func(data []byte) uint64

	// MaxDelay is how long a record may be held back waiting for an
	// earlier one from another CPU, both in wall-clock time since the
	// reader first saw it (up to half as much more when no wakeup comes: see
	// rule 3) and, by default, in key units read as nanoseconds (see
	// KeyWindow). Zero means 100 ms.
	MaxDelay time.Duration
	// KeyWindow, if set, replaces MaxDelay in key units: a record is
	// released once a key KeyWindow larger has been seen.
	KeyWindow uint64

	// DropLate drops late samples instead of delivering them marked Late.
	// Either way they are counted.
	DropLate bool

	// HighWater is the ring fill, in bytes, above which records are
	// released even if an earlier one might still come: holding records
	// fills the rings, and a full ring loses samples. Zero means three
	// quarters of the ring.
	HighWater int
}

// config is the Order as the merge takes it, defaults resolved but for
// those that depend on the ring size.
func (ord *Order) config() policy.OrderConfig {
	c := policy.OrderConfig{
		KeyOffset: ord.KeyOffset,
		Key:       ord.Key,
		MaxDelay:  ord.MaxDelay,
		Window:    ord.KeyWindow,
		DropLate:  ord.DropLate,
		HighWater: ord.HighWater,
	}
	if c.MaxDelay == 0 {
		c.MaxDelay = 100 * time.Millisecond
	}
	if c.Window == 0 {
		c.Window = uint64(c.MaxDelay.Nanoseconds())
	}
	return c
}

// maxKeyOffset bounds Order.KeyOffset: no sample is larger than a record's u16 size.
const maxKeyOffset = math.MaxUint16

// check rejects what cannot work: negative fields, and a key offset that no sample can
// reach (KeyOffset+8 would otherwise overflow when it is compared with a sample's length).
func (ord *Order) check() error {
	switch {
	case ord.KeyOffset < 0 || ord.MaxDelay < 0 || ord.HighWater < 0:
		return fmt.Errorf("negative Order field: %w", os.ErrInvalid)
	case ord.KeyOffset > maxKeyOffset-8:
		return fmt.Errorf("order key offset %d past the largest sample (%d bytes): %w", ord.KeyOffset, maxKeyOffset, os.ErrInvalid)
	}
	return nil
}
