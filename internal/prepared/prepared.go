// SPDX-License-Identifier: Apache-2.0

// Package prepared carries what a loader's Prepare (bpfbuffer,
// ciliumbuffer) made of a buffer to the reader opened over it, so that a
// map that is not that object is refused, with the fix: a collection made
// from the spec before Prepare changed it, say, which holds the buffer as
// compiled. perfbuf.Options holds a *Buffer, unexported; Prepare stores it
// with Set, which package perfbuf installs.
package prepared

import (
	"fmt"
	"os"
	"slices"

	"golang.org/x/sys/unix"
)

// Buffer is a buffer as Prepare made it: what the map a reader is given
// must be.
type Buffer struct {
	Name string // the buffer's map: "events"
	Plan string // what Prepare made of it, for errors: "ringbuf of 8192 bytes"
	// Type is the map's BPF_MAP_TYPE_*: PERF_EVENT_ARRAY, RINGBUF, or for
	// a ring per CPU ARRAY_OF_MAPS (the array) or RINGBUF (one of Rings).
	Type      uint32
	Rings     []string // a ring per CPU: its rings' names, "events_0", as they may be given
	Size      uint32   // ring buffers: each ring's max_entries
	Overwrite bool     // ring buffers: in overwrite mode (BPF_F_RB_OVERWRITE)
	Fix       string   // what to do: "call ciliumbuffer.Prepare before ebpf.NewCollection"
}

// mapFlagRBOverwrite is BPF_F_RB_OVERWRITE (kernel.MapFlagRBOverwrite).
const mapFlagRBOverwrite = 1 << 19

// Check returns nil if the map of type typ (a BPF_MAP_TYPE_*), max_entries
// size, map_flags flags and name is b's map, else an error matching
// os.ErrInvalid that names what Prepare made and b.Fix. A nil b checks
// nothing. An empty name (a kernel without map names) is not checked.
func (b *Buffer) Check(typ, size, flags uint32, name string) error {
	if b == nil {
		return nil
	}
	ring := typ == unix.BPF_MAP_TYPE_RINGBUF
	var ok bool
	switch {
	case b.Type != unix.BPF_MAP_TYPE_ARRAY_OF_MAPS:
		ok = typ == b.Type
	case typ == unix.BPF_MAP_TYPE_ARRAY_OF_MAPS:
		// The kernel keeps 15 characters of a name.
		ok = name == "" || name == b.Name[:min(len(b.Name), unix.BPF_OBJ_NAME_LEN-1)]
	default:
		ok = ring && (name == "" || slices.Contains(b.Rings, name))
	}
	if ok && ring {
		ok = size == b.Size && (flags&mapFlagRBOverwrite != 0) == b.Overwrite
	}
	if ok {
		return nil
	}
	return fmt.Errorf("not the %s that Prepare made of %q (a collection or object made before Prepare holds the buffer as compiled): %s: %w",
		b.Plan, b.Name, b.Fix, os.ErrInvalid)
}

// Set stores b in opts, a *perfbuf.Options, for the readers opened with
// it. Package perfbuf sets it at init: it owns the field.
var Set func(opts any, b *Buffer)
