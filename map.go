// SPDX-License-Identifier: Apache-2.0

package perfbuf

// The BPF map a reader reads: what names it (Map). The checks on it and
// the claim that makes one reader per map in this process are the
// owner's (internal/owner/maps.go).

import "github.com/perfbuf/perfbuf/internal/owner"

// Map is a BPF map to read: a *libbpfgo.BPFMap, ciliumbuffer.Map of a
// *ebpf.Map, or a [MapFD]. The readers keep a duplicate of its descriptor.
// A Map with a PinPath() string method lets a perf event array's reader
// empty at Close only the slots it filled (docs/failures.md).
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
