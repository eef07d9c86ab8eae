// SPDX-License-Identifier: Apache-2.0

package perfbuf

// The rings' configuration: checked, and its defaults resolved, in one place
// for New and NewReader.

import (
	"fmt"
	"math"
	"math/bits"
	"os"

	"github.com/perfbuf/perfbuf/internal/kernel"
	"github.com/perfbuf/perfbuf/internal/ring"
	"golang.org/x/sys/unix"
)

// ringOptions are Options' settings that depend on the kind of map, as
// the caller set them: the ring settings, and whether Order is set.
type ringOptions struct {
	ringBytes, wakeupEvents, wakeupBytes, maxSampleSize int
	ordered                                             bool
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

// config checks o for rings of pages of pageSize bytes on a host with
// memory bytes of RAM: a ring must be smaller than that (the kernel pins
// every page of every CPU's ring). Errors match os.ErrInvalid, or
// ErrSampleTooLarge.
func (o ringOptions) config(pageSize int, memory uint64) (ringConfig, error) {
	pages, err := o.pages(pageSize)
	if err != nil {
		return ringConfig{}, err
	}
	if uint64(pages*pageSize) >= memory {
		return ringConfig{}, fmt.Errorf("options RingBytes: a ring of %d pages (%d bytes) does not fit in the host's %d bytes of memory: %w", pages, pages*pageSize, memory, os.ErrInvalid)
	}
	c := ringConfig{pages: pages, pageSize: pageSize, wakeupEvents: max(o.wakeupEvents, 1), wakeupBytes: o.wakeupBytes}
	ringBytes := c.ringBytes()
	// perf_event_attr.wakeup_events is a u32 that the kernel compares as
	// an int: beyond MaxInt32 it would wake on every sample.
	if o.wakeupEvents < 0 || o.wakeupEvents > math.MaxInt32 {
		return ringConfig{}, fmt.Errorf("options WakeupEvents %d outside [0, %d]: %w", o.wakeupEvents, math.MaxInt32, os.ErrInvalid)
	}
	if o.wakeupBytes < 0 || o.wakeupBytes >= ringBytes || o.wakeupBytes > math.MaxUint32 { // a u32
		return ringConfig{}, fmt.Errorf("options WakeupBytes %d outside [0, %d), the ring's size: %w", o.wakeupBytes, ringBytes, os.ErrInvalid)
	}
	if o.wakeupBytes > 0 && o.wakeupEvents > 1 {
		return ringConfig{}, fmt.Errorf("options WakeupBytes and WakeupEvents both set: %w", os.ErrInvalid)
	}
	if o.maxSampleSize < 0 {
		return ringConfig{}, fmt.Errorf("options MaxSampleSize %d is negative: %w", o.maxSampleSize, os.ErrInvalid)
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

// pages resolves the ring size in bytes to a number of pages: a power of
// two, at most maxRingBytes.
func (o ringOptions) pages(pageSize int) (int, error) {
	n := o.ringBytes
	switch {
	case n < 0:
		return 0, fmt.Errorf("options RingBytes %d is negative: %w", n, os.ErrInvalid)
	case n > maxRingBytes:
		return 0, fmt.Errorf("options RingBytes %d too large: a ring holds at most %d bytes: %w", n, maxRingBytes, os.ErrInvalid)
	case n == 0:
		n = defaultRingBytes
	}
	// Whole pages, then the next power of two (the kernel maps 2^n data
	// pages).
	pages := (n + pageSize - 1) / pageSize
	return 1 << bits.Len(uint(pages-1)), nil
}

// maxRingBytes bounds a ring's data area: far above what a kernel maps
// (perf's ring buffer keeps a page array of at most a few MiB), and low
// enough that no size computed from it overflows an int.
const maxRingBytes = 1 << 40

// maxRecordSize is the largest record perf_event_header.size (a u16) holds,
// rounded down to the 8-byte alignment of records.
const maxRecordSize = 65528

// checkRingBuf checks the options that depend on a ring buffer's size
// against the map info describes: WakeupBytes below it, and a record of
// MaxSampleSize within it. Errors: ErrMapType for a map that is not a ring
// buffer, os.ErrInvalid, ErrSampleTooLarge.
func (o ringOptions) checkRingBuf(info mapDesc) error {
	size := uint64(info.maxEntries)
	switch {
	case info.typ != mapTypeRingBuf:
		return fmt.Errorf("map %q has type %s (%d), with ring buffers: %w", info.name, kernel.MapTypeName(info.typ), info.typ, ErrMapType)
	case uint64(o.wakeupBytes) >= size:
		return fmt.Errorf("options WakeupBytes %d not below the %d-byte ring of %v: %w", o.wakeupBytes, size, info, os.ErrInvalid)
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
