// SPDX-License-Identifier: Apache-2.0

package policy

// A merge of records already read, each ring's together: a flight
// recorder's snapshot (internal/owner's Recorder), through the merges'
// heap (heap.go).

import (
	"cmp"
	"slices"

	"github.com/perfbuf/perfbuf/internal/ring"
)

// MergeByKey puts recs, each ring's records together and oldest first, in
// the order of their Key, ring by ring where keys are equal, through
// scratch (returned, grown to len(recs)). A lost record has no key of its
// own: it keeps its place before the sample it was written with (the next
// of its ring), or after its ring's last sample.
//
// Within a ring the keys rise but where a program interrupted another
// between its clock read and its reservation (an NMI's): each ring's run is
// insertion-sorted first, which costs little on so few inversions, and the
// runs are merged through the heap of their fronts, O(n log rings). A run
// far out of order (keys that are not times) is sorted in O(n log n).
func MergeByKey(recs, scratch []ring.Record) []ring.Record {
	type run struct{ next, end int } // recs[next:end] are left
	var runs []run
	for k := 0; k < len(recs); {
		end := k + 1
		for end < len(recs) && recs[end].Ring == recs[k].Ring {
			end++
		}
		sortRun(recs[k:end])
		runs = append(runs, run{k, end})
		k = end
	}
	if len(runs) < 2 {
		return scratch
	}
	// The tie is the run's index: runs are in ring order.
	h := make(keyHeap, 0, len(runs))
	for i, r := range runs {
		h.push(heapEntry{key: recs[r.next].Key, tie: uint64(i), ref: i})
	}
	scratch = slices.Grow(scratch[:0], len(recs))
	for len(h) > 0 {
		r := &runs[h[0].ref]
		scratch = append(scratch, recs[r.next])
		if r.next++; r.next == r.end {
			h.pop()
		} else {
			h[0].key = recs[r.next].Key
			h.siftDown()
		}
	}
	copy(recs, scratch)
	return scratch[:0]
}

// SortByKey sets each sample's Key to the u64 at offset in its payload, in
// host byte order (0 for a sample too short to hold it), and puts recs in
// the order of their keys as MergeByKey does: the root's Order.Sort, for
// records read without an order, such as a snapshot of ring buffers. The
// caller bounds offset: 0 <= offset <= math.MaxInt-8.
func SortByKey(recs []ring.Record, offset int) {
	k := keyReader{offset: offset, end: offset + 8}
	for i := range recs {
		if recs[i].Type == ring.Sample {
			recs[i].Key = k.key(&recs[i])
		}
	}
	MergeByKey(recs, nil)
}

// sortRun gives run's lost records the key of the sample after them (else
// before them), then sorts run by key, stably: only a smaller key moves
// down, by insertion while that has moved fewer than sortMoves records a
// record, then by slices.SortStableFunc, so that a run far out of order
// costs O(n log n), not O(n²).
func sortRun(run []ring.Record) {
	for j := len(run) - 1; j >= 0; j-- {
		switch {
		case run[j].Type != ring.Lost:
		case j+1 < len(run):
			run[j].Key = run[j+1].Key
		case j > 0:
			run[j].Key = run[j-1].Key
		}
	}
	moves, most := 0, sortMoves*len(run)
	for j := 1; j < len(run); j++ {
		for i := j; i > 0 && run[i].Key < run[i-1].Key; i-- {
			run[i], run[i-1] = run[i-1], run[i]
			moves++
		}
		// run[:j+1] is sorted stably, and so stays in order among itself
		// and before the rest where keys are equal.
		if moves > most {
			slices.SortStableFunc(run, func(a, b ring.Record) int { return cmp.Compare(a.Key, b.Key) })
			return
		}
	}
}

// sortMoves is how many places a record may move, on average, before
// sortRun stops inserting: a snapshot's few NMI inversions move far less.
const sortMoves = 8
