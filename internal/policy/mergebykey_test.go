// SPDX-License-Identifier: Apache-2.0

package policy

import (
	"cmp"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/perfbuf/perfbuf/internal/ring"
)

// MergeByKey over any number of rings, their times out of order here and
// there (a program that interrupted another): the order of a stable sort
// of the whole by time, lost records keyed by the sample after them.
func TestMergeByKey(t *testing.T) {
	rnd := rand.New(rand.NewPCG(1, 2))
	var scratch []ring.Record
	for round := range 200 {
		var recs []ring.Record
		for i := range rnd.IntN(6) {
			var key uint64
			for range rnd.IntN(40) {
				key += uint64(rnd.IntN(5))
				rec := ring.Record{Type: ring.Sample, Ring: i, Key: key, Pos: uint64(len(recs))}
				switch rnd.IntN(10) {
				case 0:
					rec.Key -= min(rec.Key, 3) // an interrupted program's
				case 1:
					rec.Type, rec.Key = ring.Lost, 0
				}
				recs = append(recs, rec)
			}
		}
		want := slices.Clone(recs)
		for k := len(want) - 1; k >= 0; k-- {
			if want[k].Type != ring.Lost {
				continue
			}
			if k+1 < len(want) && want[k+1].Ring == want[k].Ring {
				want[k].Key = want[k+1].Key
			} else if k > 0 && want[k-1].Ring == want[k].Ring {
				want[k].Key = want[k-1].Key
			}
		}
		slices.SortStableFunc(want, func(a, b ring.Record) int { return cmp.Compare(a.Key, b.Key) })
		scratch = MergeByKey(recs, scratch)
		for k := range recs {
			if recs[k].Ring != want[k].Ring || recs[k].Pos != want[k].Pos || recs[k].Key != want[k].Key {
				t.Fatalf("round %d: record %d is ring %d's %d at %d, want ring %d's %d at %d",
					round, k, recs[k].Ring, recs[k].Pos, recs[k].Key, want[k].Ring, want[k].Pos, want[k].Key)
			}
		}
	}
}

// BenchmarkMergeByKey: a snapshot's merge of 100,000 records from two
// rings whose times interleave, as two CPUs writing flat out leave them
// (ns a record).
func BenchmarkMergeByKey(b *testing.B) {
	const n = 50000
	recs := make([]ring.Record, 2*n)
	for i := range n {
		recs[i] = ring.Record{Ring: 0, Key: uint64(2 * i)}
		recs[n+i] = ring.Record{Ring: 1, Key: uint64(2*i + 1)}
	}
	work := make([]ring.Record, len(recs))
	var scratch []ring.Record
	b.ReportAllocs()
	for b.Loop() {
		copy(work, recs)
		scratch = MergeByKey(work, scratch)
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(len(recs)), "ns/record")
}
