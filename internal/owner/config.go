// SPDX-License-Identifier: Apache-2.0

package owner

// The ring settings that depend on the kind of map, checked against the
// maps' info before anything is claimed or mapped: RingOptions.hostConfig
// for a perf event array's rings, checkRingBuf for each ring buffer.

import (
	"cmp"
	"errors"
	"fmt"
	"math"
	"math/bits"
	"os"

	"github.com/perfbuf/perfbuf/internal/kernel"
	"github.com/perfbuf/perfbuf/internal/prepared"
	"github.com/perfbuf/perfbuf/internal/ring"
	"golang.org/x/sys/unix"
)

// RingOptions are Options' settings that depend on the kind of map, as
// the caller set them.
type RingOptions struct {
	RingBytes, WakeupEvents, WakeupBytes, MaxSampleSize int
	overwrite                                           bool // a recorder's: ring buffers in overwrite mode only
	// budget is a reader's latency budget without WakeupEvents or
	// WakeupBytes: a perf ring wakes its reader half full (the event's
	// watermark), and the reader's timer takes what is below it.
	Budget bool
	// KeyEnd is an ordered reader's KeyOffset+8, where its key ends: a
	// ring must hold a sample that long. Zero: no key read at an offset.
	KeyEnd int
	// prepared, if set, is the buffer a loader's Prepare made: the map
	// given must be it (checkPrepared).
	Prepared *prepared.Buffer
}

// checkPrepared checks the map given, whose info is info, against what
// Prepare made of the buffer, if Prepare completed the Options: a map
// of another type, size or overwrite mode, or a ring buffer that is not
// one of a ring per CPU's, is refused naming the fix (os.ErrInvalid).
func (o RingOptions) checkPrepared(info mapDesc) error {
	err := o.Prepared.Check(info.typ, info.maxEntries, info.flags, info.name)
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

// RingConfig is RingOptions checked, with the defaults resolved: what
// openRings opens and what the C side receives.
type RingConfig struct {
	Pages        int // data pages per ring, a power of two
	PageSize     int
	WakeupEvents int // >= 1; 1 when WakeupBytes is set
	WakeupBytes  int // 0: wake by events
}

// RingBytes is the size of each ring's data area.
func (c RingConfig) RingBytes() int { return c.Pages * c.PageSize }

// DefaultRingBytes is the size of a ring when RingBytes is zero.
const DefaultRingBytes = 256 << 10

// HostConfig is Config for this host: its page size and memory.
func (o RingOptions) HostConfig() (RingConfig, error) {
	var si unix.Sysinfo_t
	memory := uint64(math.MaxUint64) // unknown: no limit but MaxRingBytes
	if unix.Sysinfo(&si) == nil {
		memory = uint64(si.Totalram) * uint64(si.Unit)
	}
	return o.Config(os.Getpagesize(), memory)
}

// Config checks o, whose fields check passed, for a perf event array's
// rings of pages of pageSize bytes on a host with memory bytes of RAM: a
// ring must be smaller than that (the kernel pins every page of every CPU's
// ring). Errors match os.ErrInvalid, or ErrSampleTooLarge.
func (o RingOptions) Config(pageSize int, memory uint64) (RingConfig, error) {
	pages := roundPages(cmp.Or(o.RingBytes, DefaultRingBytes), pageSize)
	if uint64(pages*pageSize) >= memory {
		return RingConfig{}, fmt.Errorf("options RingBytes: a ring of %d pages (%d bytes) does not fit in the host's %d bytes of memory: %w", pages, pages*pageSize, memory, os.ErrInvalid)
	}
	c := RingConfig{Pages: pages, PageSize: pageSize, WakeupEvents: max(o.WakeupEvents, 1), WakeupBytes: o.WakeupBytes}
	ringBytes := c.RingBytes()
	if o.Budget {
		c.WakeupBytes = ringBytes / 2
	}
	if o.WakeupBytes >= ringBytes {
		return RingConfig{}, fmt.Errorf("options WakeupBytes %d not below the %d-byte ring: %w", o.WakeupBytes, ringBytes, os.ErrInvalid)
	}
	// A sample's record is its 8-byte header, its u32 size and the
	// sample, 8-aligned, beside a lost record (below).
	if largest := min(ringBytes-8-ring.PerfLostSize, maxRecordSize)&^7 - 12; o.KeyEnd > largest {
		return RingConfig{}, fmt.Errorf("options Order KeyOffset %d: the 8-byte key ends at %d, past the largest sample a ring of %d bytes holds (%d bytes): %w",
			o.KeyEnd-8, o.KeyEnd, ringBytes, largest, os.ErrInvalid)
	}
	if o.MaxSampleSize > 0 {
		need := ring.PerfSampleSize(min(o.MaxSampleSize, maxRecordSize)) // (no overflow)
		// The kernel keeps one record slot free (CIRC_SPACE leaves a
		// byte, and records are 8-aligned), and a record's size is a u16.
		// Once a sample is lost, perf_output_begin writes the pending lost
		// record in the same reservation as the next sample: a sample that
		// fits only without it would be lost again and again, into an
		// empty ring too, and the lost count would never arrive.
		room := ringBytes - 8 - ring.PerfLostSize
		if need > room || need > maxRecordSize {
			return RingConfig{}, fmt.Errorf("options MaxSampleSize %d needs a %d-byte record, a ring of %d bytes holds %d beside a lost record (limit %d): %w",
				o.MaxSampleSize, need, ringBytes, room, maxRecordSize, ErrSampleTooLarge)
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

// MaxRingBytes bounds a ring's data area: far above what a kernel maps
// (perf's ring buffer keeps a page array of at most a few MiB), and low
// enough that no size computed from it overflows an int.
const MaxRingBytes = 1 << 40

// maxRecordSize is the largest record perf_event_header.size (a u16) holds,
// rounded down to the 8-byte alignment of records.
const maxRecordSize = 65528

// checkRingBuf checks the options against a ring buffer, whose info is
// info: the overwrite mode for a recorder and no other owner
// (errors.ErrUnsupported naming 6.19 on an older kernel), RingBytes its
// size if set, no WakeupEvents, WakeupBytes below its size (none for a
// recorder), and a record
// of MaxSampleSize within it. Errors: ErrMapType for a map that is not a
// ring buffer, os.ErrInvalid, ErrSampleTooLarge, errors.ErrUnsupported.
func (o RingOptions) checkRingBuf(info mapDesc) error {
	size := uint64(info.maxEntries)
	page := os.Getpagesize()
	switch {
	case info.typ != mapTypeRingBuf:
		return fmt.Errorf("map %q has type %s (%d), with ring buffers: %w", info.name, kernel.MapTypeName(info.typ), info.typ, ErrMapType)
	case !o.overwrite && info.flags&kernel.MapFlagRBOverwrite != 0:
		// The kernel moves past the oldest records without regard for the
		// consumer position: a reader would parse overwritten bytes.
		return fmt.Errorf("%v is in overwrite mode (BPF_F_RB_OVERWRITE), which only a Recorder reads: %w", info, errors.ErrUnsupported)
	case o.overwrite && info.flags&kernel.MapFlagRBOverwrite == 0:
		if err := kernel.ProbeRingOverwrite(); errors.Is(err, errors.ErrUnsupported) {
			return fmt.Errorf("recorder over %v: a Recorder reads a ring buffer only in overwrite mode; prepare the buffer with Prepare(..., Any, Overwrite()) (bpfbuffer or ciliumbuffer), which makes a perf event array on this kernel: %w", info, err)
		}
		return fmt.Errorf("recorder over %v: not in overwrite mode (map flag BPF_F_RB_OVERWRITE): prepare the buffer with Prepare(..., Overwrite()) (bpfbuffer or ciliumbuffer), or declare the map with BPF_F_RB_OVERWRITE: %w", info, os.ErrInvalid)
	case o.RingBytes != 0 && uint64(roundPages(o.RingBytes, page)*page) != size:
		return fmt.Errorf("options RingBytes %d (%d rounded to pages): %v holds %d bytes, set when its object loaded: %w",
			o.RingBytes, roundPages(o.RingBytes, page)*page, info, size, os.ErrInvalid)
	case o.WakeupEvents != 0:
		return fmt.Errorf("options WakeupEvents does not apply to %v: the program says when it wakes its reader (see WakeupBytes): %w", info, os.ErrInvalid)
	// A Recorder moves no consumer position: the kernel's wakeups and
	// poll would count bytes it never reads.
	case o.overwrite && o.WakeupBytes != 0:
		return fmt.Errorf("options WakeupBytes does not apply to a Recorder over %v: it waits for no ring buffer: %w", info, os.ErrInvalid)
	case uint64(o.WakeupBytes) >= size:
		return fmt.Errorf("options WakeupBytes %d not below the %d-byte ring of %v: %w", o.WakeupBytes, size, info, os.ErrInvalid)
	// The largest record (below) holds a sample of size-16 bytes.
	case o.KeyEnd > 0 && uint64(o.KeyEnd) > size-16:
		return fmt.Errorf("options Order KeyOffset %d: the 8-byte key ends at %d, past the largest sample the %d-byte ring of %v holds (%d bytes): %w",
			o.KeyEnd-8, o.KeyEnd, size, info, size-16, os.ErrInvalid)
	}
	// __bpf_ringbuf_reserve keeps a record (its 8-byte header included,
	// rounded up to 8 bytes) and everything unread below the ring's size:
	// a record takes at most size-8 bytes.
	if n := uint64(o.MaxSampleSize); n > 0 && ring.RingBufRecordSize(n) > size-8 {
		return fmt.Errorf("options MaxSampleSize %d does not fit the %d-byte ring of %v with its 8-byte header: %w",
			n, size, info, ErrSampleTooLarge)
	}
	return nil
}
