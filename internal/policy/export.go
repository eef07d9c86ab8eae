// SPDX-License-Identifier: Apache-2.0

package policy

// Views of a policy's state for the owners' tests.

import "time"

// SetBudget sets a fullest-first policy's turn, in bytes, and the bytes
// between its commits (at most the turn's).
func SetBudget(p Reading, n, chunk int) { p.(*Fullest).setBudget(n, chunk) }

// Marks returns how many marks (rule 3) an ordered policy holds per ring.
func Marks(p Reading) []int {
	o := p.(*ordered)
	n := make([]int, len(o.rs))
	for i := range o.rs {
		n[i] = len(o.rs[i].marks)
	}
	return n
}

// SetHotHold sets how long an ordered window's hot ring stays hot after a
// look found it more than an eighth full (hotHold).
func SetHotHold(p Reading, d time.Duration) { p.(*window).hold = d }

// Hot is the ordered window's hot ring, or -1 (window.hot).
func Hot(p Reading) int { return p.(*window).hot }

// CommitChunk is how many bytes of a ring of size bytes a read delivers
// or copies between two commits (commitChunk).
func CommitChunk(size int) int { return commitChunk(size) }
