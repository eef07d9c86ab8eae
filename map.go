// SPDX-License-Identifier: Apache-2.0

package perfbuf

// The BPF map a reader reads: what names it (Map). The checks on it and
// the claim that makes one reader per map in this process are the
// owner's (internal/owner/maps.go).

import "github.com/perfbuf/perfbuf/internal/owner"

// Map is a BPF map to read: *libbpfgo.BPFMap satisfies it, as does
// ciliumbuffer.Map of a *ebpf.Map, and [MapFD] wraps a descriptor. The
// readers keep a duplicate of its descriptor: the caller's may be closed
// once the constructor returns.
//
// A reader of a perf event array fills its slots through a map file of
// its own, opened from the map's pin when the Map has a PinPath() string
// method that names it (libbpfgo's *BPFMap has), else from the map's ID
// (which needs CAP_SYS_ADMIN), so that its Close empties only the slots it
// filled: a reader of the same map in another process, opened since, keeps
// its own. Without such a file, its Close deletes its CPUs' slots, whoever
// filled them ([Stats].DeletesSlot; docs/failures.md).
type Map interface {
	FileDescriptor() int
}

// MapFD is a bare map file descriptor that satisfies Map.
type MapFD int

// FileDescriptor returns fd.
func (fd MapFD) FileDescriptor() int { return int(fd) }

// ownerMaps is maps as the owner (internal/owner) takes them.
func ownerMaps(maps []Map) []owner.Map {
	out := make([]owner.Map, len(maps))
	for i, m := range maps {
		out[i] = m
	}
	return out
}
