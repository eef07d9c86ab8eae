// SPDX-License-Identifier: Apache-2.0

package policy

// The merges' heap: the ordered merge's rings whose next record is a
// sample, by that sample's key (ordered.go); the runs of the window's copies
// by their first key (copyruns.go); a snapshot's rings by their next
// record's key (mergebykey.go).

import "math"

// keyHeap is a binary min-heap of entries, smallest key first and, for
// equal keys, the smaller tie, so that the merge is deterministic.
type keyHeap []heapEntry

// heapEntry is a key (a copy, so that a sift reads only the heap), its tie
// break and what it stands for: for the ordered merge a ring, whose index
// is both the tie and ref; for the window a copy, in arrival order (tie)
// and in its slot (ref).
type heapEntry struct {
	key uint64
	tie uint64
	ref int
}

func (a heapEntry) before(b heapEntry) bool {
	return a.key < b.key || a.key == b.key && a.tie < b.tie
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

// pop removes the root and returns it.
func (h *keyHeap) pop() heapEntry {
	s := *h
	top, n := s[0], len(s)-1
	s[0] = s[n]
	*h = s[:n]
	h.siftDown()
	return top
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
	switch len(h) {
	case 0, 1:
		return math.MaxUint64
	case 2:
		return h[1].key
	}
	return min(h[1].key, h[2].key)
}
