// SPDX-License-Identifier: Apache-2.0

package policy

import (
	"cmp"
	"encoding/binary"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/perfbuf/perfbuf/internal/ring"
)

// MergeByKey over any number of rings, their times out of order here and
// there (a program that interrupted another), or keys that are not times
// at all (sortRun's fallback): the order of a stable sort of the whole by
// key, lost records keyed by the sample after them.
func TestMergeByKey(t *testing.T) {
	rnd := rand.New(rand.NewPCG(1, 2))
	var scratch []ring.Record
	for round := range 400 {
		random := round%2 == 1 // keys in no order, from few values: many ties
		var recs []ring.Record
		for i := range rnd.IntN(6) {
			var key uint64
			for range rnd.IntN(200) {
				key += uint64(rnd.IntN(5))
				rec := ring.Record{Type: ring.Sample, Ring: i, Key: key, Pos: uint64(len(recs))}
				if random {
					rec.Key = rnd.Uint64N(20)
				}
				switch rnd.IntN(10) {
				case 0:
					rec.Key -= min(rec.Key, 3) // an interrupted program's
				case 1:
					rec.Type, rec.Key = ring.Lost, 0
				}
				recs = append(recs, rec)
			}
		}
		want := byKeyStably(recs)
		scratch = MergeByKey(recs, scratch)
		for k := range recs {
			if recs[k].Ring != want[k].Ring || recs[k].Pos != want[k].Pos || recs[k].Key != want[k].Key {
				t.Fatalf("round %d: record %d is ring %d's %d at %d, want ring %d's %d at %d",
					round, k, recs[k].Ring, recs[k].Pos, recs[k].Key, want[k].Ring, want[k].Pos, want[k].Key)
			}
		}
	}
}

// byKeyStably is MergeByKey's contract written plainly: lost records take
// the key of their ring's next record (else its previous), then a stable
// sort of the whole by key.
func byKeyStably(recs []ring.Record) []ring.Record {
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
	return want
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

// SortByKey reads each sample's key wherever it lies (whole in Data,
// straddling Data and Wrapped, cut short) and sorts as MergeByKey.
func TestSortByKey(t *testing.T) {
	const offset = 4
	rnd := rand.New(rand.NewPCG(3, 4))
	for round := range 200 {
		var recs, want []ring.Record
		for i := range 1 + rnd.IntN(4) {
			for range rnd.IntN(50) {
				key := rnd.Uint64N(1000)
				payload := binary.NativeEndian.AppendUint64(make([]byte, offset, 20), key)
				payload = append(payload, 0xee, 0xee, 0xee, 0xee)
				rec := ring.Record{Type: ring.Sample, Ring: i, Pos: uint64(len(recs)), Data: payload}
				switch rnd.IntN(8) {
				case 0: // wrapped at any byte, the key's included
					cut := rnd.IntN(len(payload))
					rec.Data, rec.Wrapped = payload[:cut], payload[cut:]
				case 1: // too short to hold the key, by one byte or more
					rec.Data, key = payload[:rnd.IntN(offset+8)], 0
				case 2:
					rec.Type, rec.Data, key = ring.Lost, nil, 0
				}
				recs = append(recs, rec)
				rec.Key = key
				want = append(want, rec)
			}
		}
		want = byKeyStably(want)
		SortByKey(recs, offset)
		for k := range recs {
			if recs[k].Ring != want[k].Ring || recs[k].Pos != want[k].Pos || recs[k].Key != want[k].Key {
				t.Fatalf("round %d: record %d is ring %d's %d with key %d, want ring %d's %d with key %d",
					round, k, recs[k].Ring, recs[k].Pos, recs[k].Key, want[k].Ring, want[k].Pos, want[k].Key)
			}
		}
	}
}

// BenchmarkMergeByKeyDisorder: one ring of 20,000 records whose keys are
// in no order (keys that are not times), which insertion alone sorts in
// O(n²) (ns a record).
func BenchmarkMergeByKeyDisorder(b *testing.B) {
	rnd := rand.New(rand.NewPCG(5, 6))
	recs := make([]ring.Record, 20000)
	for i := range recs {
		recs[i] = ring.Record{Type: ring.Sample, Key: rnd.Uint64()}
	}
	work := make([]ring.Record, len(recs))
	for b.Loop() {
		copy(work, recs)
		MergeByKey(work, nil)
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(len(recs)), "ns/record")
}
