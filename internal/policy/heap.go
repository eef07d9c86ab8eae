// SPDX-License-Identifier: Apache-2.0

package policy

// The ordered merge's heap: the rings whose next record is a sample, by
// that sample's key.

import "math"

// keyHeap is a binary min-heap of (key, ring), smallest key first and, for
// equal keys, the lower ring index, so that the merge is deterministic.
type keyHeap []heapEntry

type heapEntry struct {
	key  uint64 // the ring's front key (a copy, so that a sift reads only the heap)
	ring int
}

func (a heapEntry) before(b heapEntry) bool {
	return a.key < b.key || a.key == b.key && a.ring < b.ring
}

// push adds an entry.
func (h *keyHeap) push(e heapEntry) {
	s := append(*h, e)
	for j := len(s) - 1; j > 0; {
		up := (j - 1) / 2
		if !s[j].before(s[up]) {
			break
		}
		s[j], s[up] = s[up], s[j]
		j = up
	}
	*h = s
}

// popRoot removes the root and returns its ring.
func (h *keyHeap) popRoot() int {
	s := *h
	i, n := s[0].ring, len(s)-1
	s[0] = s[n]
	*h = s[:n]
	h.siftDown()
	return i
}

// siftDown moves the root down to its place (after its key grew).
func (h keyHeap) siftDown() {
	for j := 0; ; {
		c := 2*j + 1
		if c >= len(h) {
			return
		}
		if c+1 < len(h) && h[c+1].before(h[c]) {
			c++
		}
		if !h[c].before(h[j]) {
			return
		}
		h[j], h[c] = h[c], h[j]
		j = c
	}
}

// second returns the smallest key after the root's (a child of the root),
// or the largest key if the root is alone.
func (h keyHeap) second() uint64 {
	key := uint64(math.MaxUint64)
	for _, c := range h[1:min(3, len(h))] {
		key = min(key, c.key)
	}
	return key
}
