// SPDX-License-Identifier: Apache-2.0

package policy

// The window's copies by key: runs of rising keys, and a heap of the runs.

// copyRuns holds the window's copies in runs of keys that do not fall (a
// ring's records mostly come in key order: a ring of one CPU is one run),
// and a heap of the runs by their first copy's key (tie its seq, ref the
// run): a copy in key order costs no sift.
type copyRuns struct {
	runs []copyRun
	idle []int // runs with no copy, not in the heap
	heap keyHeap
	last int    // the run the last copy went to; -1: none
	held int    // copies in the runs
	seq  uint64 // copies made: the heap's tie break, arrival order
}

// copyRun is a run of copies whose keys do not fall, oldest first: q[head:].
type copyRun struct {
	q    []heapEntry // key, seq (tie), slot (ref)
	head int
	tail uint64 // the last key added
}

// maxRunScan bounds how many runs add looks at for one that takes a key,
// beyond the last one used: a key that fits none of them starts a run.
const maxRunScan = 8

// runCompact bounds the delivered copies a run keeps at its start: past it,
// and past half the run, the rest moves to the front of its array.
const runCompact = 1024

// add puts a copy in a run: the run the last copy went to if the key does
// not fall below its last, else the first of a few others that takes it,
// else a new run. Copies in key order (a ring of one CPU, or a shared
// ring's records reserved in key order) cost no sift: the heap holds runs,
// and only a run's first copy is in it.
func (c *copyRuns) add(e heapEntry) {
	c.held++
	j := c.last
	if j < 0 || c.runs[j].tail > e.key || c.runs[j].head == len(c.runs[j].q) {
		j = -1
		for k, scanned := 0, 0; k < len(c.heap) && scanned < maxRunScan; k, scanned = k+1, scanned+1 {
			if r := &c.runs[c.heap[k].ref]; r.tail <= e.key {
				j = c.heap[k].ref
				break
			}
		}
	}
	if j < 0 {
		if k := len(c.idle); k > 0 {
			j, c.idle = c.idle[k-1], c.idle[:k-1]
		} else {
			j = len(c.runs)
			c.runs = append(c.runs, copyRun{})
		}
		r := &c.runs[j]
		r.q, r.head, r.tail = append(r.q[:0], e), 0, e.key
		c.heap.push(heapEntry{key: e.key, tie: e.tie, ref: j})
	} else {
		r := &c.runs[j]
		r.q, r.tail = append(r.q, e), e.key
	}
	c.last = j
}

// min returns the smallest copy: the first of the heap's first run.
func (c *copyRuns) min() heapEntry {
	r := &c.runs[c.heap[0].ref]
	return r.q[r.head]
}

// popMin removes the smallest copy and returns it.
func (c *copyRuns) popMin() heapEntry {
	c.held--
	j := c.heap[0].ref
	r := &c.runs[j]
	e := r.q[r.head]
	r.head++
	if r.head == len(r.q) {
		c.heap.pop()
		r.q, r.head = r.q[:0], 0
		c.idle = append(c.idle, j)
		if c.last == j {
			c.last = -1
		}
		return e
	}
	if r.head >= runCompact && r.head*2 >= len(r.q) {
		r.q = r.q[:copy(r.q, r.q[r.head:])] // (a long run keeps its array)
		r.head = 0
	}
	next := r.q[r.head]
	c.heap[0].key, c.heap[0].tie = next.key, next.tie
	c.heap.siftDown()
	return e
}
