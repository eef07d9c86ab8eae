// SPDX-License-Identifier: Apache-2.0

package perfbuf

// The options' checks and defaults. Each constructor checks its options
// first, field by field (Options.check; NewReader's ReaderOptions.plan,
// which also resolves them); then internal/owner checks what depends on
// the kind of map against the maps' info (internal/owner/config.go),
// before anything is claimed or mapped.

import (
	"fmt"
	"math"
	"os"
	"syscall"
	"time"

	"github.com/perfbuf/perfbuf/internal/owner"
	"github.com/perfbuf/perfbuf/internal/policy"
)

// check checks the fields alone, whatever the map: one error per field,
// naming it. Errors match os.ErrInvalid.
func (o *Options) check() error {
	switch {
	case o.RingBytes < 0:
		return fmt.Errorf("options RingBytes %d is negative: %w", o.RingBytes, os.ErrInvalid)
	case o.RingBytes > owner.MaxRingBytes:
		return fmt.Errorf("options RingBytes %d too large: a ring holds at most %d bytes: %w", o.RingBytes, owner.MaxRingBytes, os.ErrInvalid)
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
	for i, fd := range o.Programs {
		if fd < 0 {
			return fmt.Errorf("options Programs[%d]: fd %d: %w", i, fd, syscall.EBADF)
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
		if err := ord.checkKeyOffset(); err != nil {
			return err
		}
		switch {
		case ord.MaxDelay < 0 || ord.HighWater < 0:
			return fmt.Errorf("options Order: negative MaxDelay or HighWater: %w", os.ErrInvalid)
		// Every sample would have key 0. Without MaxSampleSize, each ring
		// is checked when it is opened (owner.RingOptions.keyEnd).
		case o.MaxSampleSize > 0 && ord.KeyOffset+8 > o.MaxSampleSize:
			return fmt.Errorf("options Order KeyOffset %d: the 8-byte key ends at %d, past MaxSampleSize %d, the largest sample: %w",
				ord.KeyOffset, ord.KeyOffset+8, o.MaxSampleSize, os.ErrInvalid)
		}
	}
	return nil
}

// checkKeyOffset checks the field that both a Reader and [Order.Sort] use.
func (ord *Order) checkKeyOffset() error {
	switch {
	case ord.KeyOffset < 0:
		return fmt.Errorf("options Order KeyOffset %d: negative: %w", ord.KeyOffset, os.ErrInvalid)
	// KeyOffset+8 would otherwise overflow when it is compared with a
	// sample's length.
	case ord.KeyOffset > maxKeyOffset-8:
		return fmt.Errorf("options Order KeyOffset %d past the largest sample (%d bytes): %w", ord.KeyOffset, maxKeyOffset, os.ErrInvalid)
	}
	return nil
}

// plan checks o and resolves every setting a Reader takes.
func (o *ReaderOptions) plan() (owner.Plan, error) {
	if err := o.check(); err != nil {
		return owner.Plan{}, err
	}
	p := owner.Plan{Ring: o.ring(), Latency: o.latency()}
	p.Ring.Budget = p.Latency > 0 && o.WakeupEvents == 0 && o.WakeupBytes == 0
	if o.Order != nil {
		c := o.Order.config()
		p.Order = &c
		p.Ring.KeyEnd = o.Order.KeyOffset + 8
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
		MaxDelay:  ord.MaxDelay,
		HighWater: ord.HighWater,
		Stamped:   ord.StampedKeys,
	}
	if c.MaxDelay == 0 {
		c.MaxDelay = 100 * time.Millisecond
	}
	c.Window = uint64(c.MaxDelay.Nanoseconds())
	return c
}

// ring returns the settings that depend on the kind of map, for owner.Open.
func (o *Options) ring() owner.RingOptions {
	return owner.RingOptions{RingBytes: o.RingBytes, WakeupEvents: o.WakeupEvents, WakeupBytes: o.WakeupBytes,
		MaxSampleSize: o.MaxSampleSize, Prepared: o.prepared}
}
