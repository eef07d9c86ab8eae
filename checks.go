// SPDX-License-Identifier: Apache-2.0

package perfbuf

// The options' checks and defaults, in one place. Each constructor checks
// its options first, field by field (Options.check; NewReader's
// ReaderOptions.plan, which also resolves them); then openCore checks what
// depends on the kind of map against the maps' info (ringOptions.hostConfig
// for a perf event array's rings, checkRingBuf for each ring buffer),
// before anything is claimed or mapped.

import (
	"cmp"
	"errors"
	"fmt"
	"math"
	"math/bits"
	"os"
	"time"

	"github.com/perfbuf/perfbuf/internal/kernel"
	"github.com/perfbuf/perfbuf/internal/policy"
	"github.com/perfbuf/perfbuf/internal/prepared"
	"github.com/perfbuf/perfbuf/internal/ring"
	"golang.org/x/sys/unix"
)

// check checks the fields alone, whatever the map: one error per field,
// naming it. Errors match os.ErrInvalid.
func (o *Options) check() error {
	switch {
	case o.RingBytes < 0:
		return fmt.Errorf("options RingBytes %d is negative: %w", o.RingBytes, os.ErrInvalid)
	case o.RingBytes > maxRingBytes:
		return fmt.Errorf("options RingBytes %d too large: a ring holds at most %d bytes: %w", o.RingBytes, maxRingBytes, os.ErrInvalid)
	// perf_event_attr.wakeup_events is a u32 that the kernel compares as
	// an int: beyond MaxInt32 it would wake on every sample.
	case o.WakeupEvents < 0 || o.WakeupEvents > math.MaxInt32:
		return fmt.Errorf("options WakeupEvents %d outside [0, %d]: %w", o.WakeupEvents, math.MaxInt32, os.ErrInvalid)
	case o.WakeupBytes < 0 || o.WakeupBytes > math.MaxUint32: // a u32
		return fmt.Errorf("options WakeupBytes %d outside [0, %d]: %w", o.WakeupBytes, uint32(math.MaxUint32), os.ErrInvalid)
	case o.WakeupBytes > 0 && o.WakeupEvents > 1:
		return fmt.Errorf("options WakeupBytes and WakeupEvents both set: %w", os.ErrInvalid)
	case o.MaxSampleSize < 0:
		return fmt.Errorf("options MaxSampleSize %d is negative: %w", o.MaxSampleSize, os.ErrInvalid)
	}
	for i, m := range o.Maps {
		if m == nil {
			return fmt.Errorf("options Maps[%d]: nil map: %w", i, os.ErrInvalid)
		}
	}
	return nil
}

// check checks a Reader's fields: the ring settings' and Order's.
func (o *ReaderOptions) check() error {
	if err := o.Options.check(); err != nil {
		return err
	}
	if ord := o.Order; ord != nil {
		switch {
		case ord.KeyOffset < 0 || ord.MaxDelay < 0 || ord.HighWater < 0:
			return fmt.Errorf("options Order: negative KeyOffset, MaxDelay or HighWater: %w", os.ErrInvalid)
		// KeyOffset+8 would otherwise overflow when it is compared with a
		// sample's length.
		case ord.KeyOffset > maxKeyOffset-8:
			return fmt.Errorf("options Order KeyOffset %d past the largest sample (%d bytes): %w", ord.KeyOffset, maxKeyOffset, os.ErrInvalid)
		// Every sample would have key 0. Without MaxSampleSize, each ring
		// is checked when it is opened (ringOptions.keyEnd).
		case ord.Key == nil && o.MaxSampleSize > 0 && ord.KeyOffset+8 > o.MaxSampleSize:
			return fmt.Errorf("options Order KeyOffset %d: the 8-byte key ends at %d, past MaxSampleSize %d, the largest sample: %w",
				ord.KeyOffset, ord.KeyOffset+8, o.MaxSampleSize, os.ErrInvalid)
		}
	}
	return nil
}

// readerPlan is a Reader's options checked and resolved, once, at
// NewReader's door: what its rings, its wait and its policy take.
type readerPlan struct {
	ring    ringOptions
	latency time.Duration       // MaxLatency resolved (negative: no bound)
	order   *policy.OrderConfig // nil: the fullest ring first
}

// budget reports whether the plan holds wakeups off within its latency,
// MaxLatency's budget: no WakeupEvents or WakeupBytes says otherwise
// (ringOptions.budget).
func (p readerPlan) budget() bool { return p.ring.budget }

// plan checks o and resolves every setting a Reader takes.
func (o *ReaderOptions) plan() (readerPlan, error) {
	if err := o.check(); err != nil {
		return readerPlan{}, err
	}
	p := readerPlan{ring: o.ring(), latency: o.latency()}
	p.ring.budget = p.latency > 0 && o.WakeupEvents == 0 && o.WakeupBytes == 0
	if o.Order != nil {
		c := o.Order.config()
		p.order = &c
		if o.Order.Key == nil {
			p.ring.keyEnd = o.Order.KeyOffset + 8
		}
	}
	return p, nil
}

// maxKeyOffset bounds Order.KeyOffset: no sample is larger than a record's
// u16 size.
const maxKeyOffset = math.MaxUint16

// latency is MaxLatency resolved: the budget, how late a record may be
// delivered, and how long a blocked read waits at most for a wakeup
// (negative: no bound, and no timer).
func (o *ReaderOptions) latency() time.Duration {
	switch {
	case o.MaxLatency < 0:
		return -1
	case o.MaxLatency > 0:
		return o.MaxLatency
	}
	return defaultMaxLatency
}

// defaultMaxLatency is a Reader's latency budget when MaxLatency is zero:
// 10 ms, below what a person or a pipeline notices, and long enough that
// at 10,000 records a second the wakeups the reader asks of the programs
// cost them a few percent of their own time (docs/performance.md).
const defaultMaxLatency = 10 * time.Millisecond

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
		Stamped:   ord.StampedKeys,
	}
	if c.MaxDelay == 0 {
		c.MaxDelay = 100 * time.Millisecond
	}
	if c.Window == 0 {
		c.Window = uint64(c.MaxDelay.Nanoseconds())
	}
	return c
}

// ring returns the settings that depend on the kind of map, for openCore.
func (o *Options) ring() ringOptions {
	return ringOptions{ringBytes: o.RingBytes, wakeupEvents: o.WakeupEvents, wakeupBytes: o.WakeupBytes,
		maxSampleSize: o.MaxSampleSize, prepared: o.prepared}
}

// ringOptions are Options' settings that depend on the kind of map, as
// the caller set them.
type ringOptions struct {
	ringBytes, wakeupEvents, wakeupBytes, maxSampleSize int
	recorder                                            bool // a Recorder's: ring buffers in overwrite mode only
	// budget is a Reader's latency budget without WakeupEvents or
	// WakeupBytes: a perf ring wakes its reader half full (the event's
	// watermark), and the Reader's timer takes what is below it.
	budget bool
	// keyEnd is an ordered Reader's KeyOffset+8, where its key ends: a
	// ring must hold a sample that long. Zero: no key read at an offset.
	keyEnd int
	// prepared, if set, is the buffer a loader's Prepare made: the map
	// given must be it (checkPrepared).
	prepared *prepared.Buffer
}

// checkPrepared checks the map given, whose info is info, against what
// Prepare made of the buffer, if Prepare completed the Options: a map
// of another type, size or overwrite mode, or a ring buffer that is not
// one of a ring per CPU's, is refused naming the fix (os.ErrInvalid).
func (o ringOptions) checkPrepared(info mapDesc) error {
	err := o.prepared.Check(info.typ, info.maxEntries, info.flags, info.name)
	if err == nil {
		return nil
	}
	what := info.String()
	if info.typ == mapTypeRingBuf {
		what += fmt.Sprintf(" of %d bytes", info.maxEntries)
		if info.flags&kernel.MapFlagRBOverwrite != 0 {
			what += " in overwrite mode"
		}
	}
	return fmt.Errorf("%s is %w", what, err)
}

// ringConfig is ringOptions checked, with the defaults resolved: what
// openRings opens and what the C side receives.
type ringConfig struct {
	pages        int // data pages per ring, a power of two
	pageSize     int
	wakeupEvents int // >= 1; 1 when wakeupBytes is set
	wakeupBytes  int // 0: wake by events
}

// ringBytes is the size of each ring's data area.
func (c ringConfig) ringBytes() int { return c.pages * c.pageSize }

// defaultRingBytes is the size of a ring when RingBytes is zero.
const defaultRingBytes = 256 << 10

// hostConfig is config for this host: its page size and memory.
func (o ringOptions) hostConfig() (ringConfig, error) {
	var si unix.Sysinfo_t
	memory := uint64(math.MaxUint64) // unknown: no limit but maxRingBytes
	if unix.Sysinfo(&si) == nil {
		memory = uint64(si.Totalram) * uint64(si.Unit)
	}
	return o.config(os.Getpagesize(), memory)
}

// config checks o, whose fields check passed, for a perf event array's
// rings of pages of pageSize bytes on a host with memory bytes of RAM: a
// ring must be smaller than that (the kernel pins every page of every CPU's
// ring). Errors match os.ErrInvalid, or ErrSampleTooLarge.
func (o ringOptions) config(pageSize int, memory uint64) (ringConfig, error) {
	pages := roundPages(cmp.Or(o.ringBytes, defaultRingBytes), pageSize)
	if uint64(pages*pageSize) >= memory {
		return ringConfig{}, fmt.Errorf("options RingBytes: a ring of %d pages (%d bytes) does not fit in the host's %d bytes of memory: %w", pages, pages*pageSize, memory, os.ErrInvalid)
	}
	c := ringConfig{pages: pages, pageSize: pageSize, wakeupEvents: max(o.wakeupEvents, 1), wakeupBytes: o.wakeupBytes}
	ringBytes := c.ringBytes()
	if o.budget {
		c.wakeupBytes = ringBytes / 2
	}
	if o.wakeupBytes >= ringBytes {
		return ringConfig{}, fmt.Errorf("options WakeupBytes %d not below the %d-byte ring: %w", o.wakeupBytes, ringBytes, os.ErrInvalid)
	}
	// A sample's record is its 8-byte header, its u32 size and the
	// sample, 8-aligned, beside a lost record (below).
	if largest := min(ringBytes-8-ring.PerfLostSize, maxRecordSize)&^7 - 12; o.keyEnd > largest {
		return ringConfig{}, fmt.Errorf("options Order KeyOffset %d: the 8-byte key ends at %d, past the largest sample a ring of %d bytes holds (%d bytes): %w",
			o.keyEnd-8, o.keyEnd, ringBytes, largest, os.ErrInvalid)
	}
	if o.maxSampleSize > 0 {
		need := ring.PerfSampleSize(min(o.maxSampleSize, maxRecordSize)) // (no overflow)
		// The kernel keeps one record slot free (CIRC_SPACE leaves a
		// byte, and records are 8-aligned), and a record's size is a u16.
		// Once a sample is lost, perf_output_begin writes the pending lost
		// record in the same reservation as the next sample: a sample that
		// fits only without it would be lost again and again, into an
		// empty ring too, and the lost count would never arrive.
		room := ringBytes - 8 - ring.PerfLostSize
		if need > room || need > maxRecordSize {
			return ringConfig{}, fmt.Errorf("options MaxSampleSize %d needs a %d-byte record, a ring of %d bytes holds %d beside a lost record (limit %d): %w",
				o.maxSampleSize, need, ringBytes, room, maxRecordSize, ErrSampleTooLarge)
		}
	}
	return c, nil
}

// roundPages is n bytes as whole pages of pageSize bytes, then the next
// power of two: the kernel maps 2^n data pages.
func roundPages(n, pageSize int) int {
	pages := (n + pageSize - 1) / pageSize
	return 1 << bits.Len(uint(pages-1))
}

// maxRingBytes bounds a ring's data area: far above what a kernel maps
// (perf's ring buffer keeps a page array of at most a few MiB), and low
// enough that no size computed from it overflows an int.
const maxRingBytes = 1 << 40

// maxRecordSize is the largest record perf_event_header.size (a u16) holds,
// rounded down to the 8-byte alignment of records.
const maxRecordSize = 65528

// checkRingBuf checks the options against a ring buffer, whose info is
// info: the overwrite mode for a Recorder and no other owner
// (errors.ErrUnsupported naming 6.19 on an older kernel), RingBytes its
// size if set, no WakeupEvents, WakeupBytes below its size, and a record
// of MaxSampleSize within it. Errors: ErrMapType for a map that is not a
// ring buffer, os.ErrInvalid, ErrSampleTooLarge, errors.ErrUnsupported.
func (o ringOptions) checkRingBuf(info mapDesc) error {
	size := uint64(info.maxEntries)
	page := os.Getpagesize()
	switch {
	case info.typ != mapTypeRingBuf:
		return fmt.Errorf("map %q has type %s (%d), with ring buffers: %w", info.name, kernel.MapTypeName(info.typ), info.typ, ErrMapType)
	case !o.recorder && info.flags&kernel.MapFlagRBOverwrite != 0:
		// The kernel moves past the oldest records without regard for the
		// consumer position: a reader would parse overwritten bytes.
		return fmt.Errorf("%v is in overwrite mode (BPF_F_RB_OVERWRITE), which only a Recorder reads: %w", info, errors.ErrUnsupported)
	case o.recorder && info.flags&kernel.MapFlagRBOverwrite == 0:
		if err := kernel.ProbeRingOverwrite(); errors.Is(err, errors.ErrUnsupported) {
			return fmt.Errorf("recorder over %v: a Recorder reads a ring buffer only in overwrite mode; prepare the buffer with Prepare(..., Any, Overwrite()) (bpfbuffer or ciliumbuffer), which makes a perf event array on this kernel: %w", info, err)
		}
		return fmt.Errorf("recorder over %v: not in overwrite mode (map flag BPF_F_RB_OVERWRITE): prepare the buffer with Prepare(..., Overwrite()) (bpfbuffer or ciliumbuffer), or declare the map with BPF_F_RB_OVERWRITE: %w", info, os.ErrInvalid)
	case o.ringBytes != 0 && uint64(roundPages(o.ringBytes, page)*page) != size:
		return fmt.Errorf("options RingBytes %d (%d rounded to pages): %v holds %d bytes, set when its object loaded: %w",
			o.ringBytes, roundPages(o.ringBytes, page)*page, info, size, os.ErrInvalid)
	case o.wakeupEvents != 0:
		return fmt.Errorf("options WakeupEvents does not apply to %v: the program says when it wakes its reader (see WakeupBytes): %w", info, os.ErrInvalid)
	case uint64(o.wakeupBytes) >= size:
		return fmt.Errorf("options WakeupBytes %d not below the %d-byte ring of %v: %w", o.wakeupBytes, size, info, os.ErrInvalid)
	// The largest record (below) holds a sample of size-16 bytes.
	case o.keyEnd > 0 && uint64(o.keyEnd) > size-16:
		return fmt.Errorf("options Order KeyOffset %d: the 8-byte key ends at %d, past the largest sample the %d-byte ring of %v holds (%d bytes): %w",
			o.keyEnd-8, o.keyEnd, size, info, size-16, os.ErrInvalid)
	}
	// __bpf_ringbuf_reserve keeps a record (its 8-byte header included,
	// rounded up to 8 bytes) and everything unread below the ring's size:
	// a record takes at most size-8 bytes.
	if n := uint64(o.maxSampleSize); n > 0 && ring.RingBufRecordSize(n) > size-8 {
		return fmt.Errorf("options MaxSampleSize %d does not fit the %d-byte ring of %v with its 8-byte header: %w",
			n, size, info, ErrSampleTooLarge)
	}
	return nil
}

// checkRecorder checks a Recorder's fields: the ring settings', and no
// wakeup, since nothing waits for one.
func (o *Options) checkRecorder() error {
	if err := o.check(); err != nil {
		return err
	}
	if o.WakeupEvents != 0 || o.WakeupBytes != 0 {
		return fmt.Errorf("options WakeupEvents and WakeupBytes do not apply to a Recorder, which is never woken: %w", os.ErrInvalid)
	}
	return nil
}
