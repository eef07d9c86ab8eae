// SPDX-License-Identifier: Apache-2.0

package perfbuf

import (
	"fmt"
	"testing"
	"time"
)

// The rings' keys interleave record by record, as two CPUs' timestamps do
// under a flood: every record hands the merge on to another ring (the
// root's swap with two rings, its sift with three), with now and then two
// keys in a row on one ring (a run of two). Every record goes in key order,
// none late, once.
func TestOrderedInterleaved(t *testing.T) {
	for _, rings := range []int{2, 3} {
		for _, mode := range []string{"ReadInto", "Each"} {
			t.Run(fmt.Sprintf("%d/%s", rings, mode), func(t *testing.T) {
				const n = 900
				f := newFakeRings(t, rings, 1<<16)
				ringOf := make([]int, n+1)
				for k := 1; k <= n; k++ {
					ringOf[k] = k % rings
					if k%7 == 0 {
						ringOf[k] = ringOf[k-1] // a run of two
					}
					f.emit(t, ringOf[k], uint64(k), uint64(k), 16+k%40)
				}
				for i := range rings { // rule 1 releases everything below
					f.emit(t, i, 1<<40, uint64(n+1+i), 16)
				}
				o := f.ordered(t, Order{MaxDelay: time.Hour})
				got := readOrdered(t, o, mode, n)
				for j, s := range got {
					k := uint64(j + 1)
					if s.Key != k || keyOf(s) != k || seqOf(s.Data) != k || s.Late {
						t.Fatalf("record %d: Key %d, payload's key %d, seq %d, late %v; want key %d", j, s.Key, keyOf(s), seqOf(s.Data), s.Late, k)
					}
					if s.CPU != ringOf[k] {
						t.Fatalf("key %d from cpu %d; it was written to ring %d", k, s.CPU, ringOf[k])
					}
				}
				for _, st := range o.Stats() {
					if st.Late != 0 || st.Dropped != 0 {
						t.Fatalf("ring %d: %d late, %d dropped", st.Ring, st.Late, st.Dropped)
					}
				}
			})
		}
	}
}
