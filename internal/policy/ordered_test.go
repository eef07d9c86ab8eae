// SPDX-License-Identifier: Apache-2.0

package policy

// Tests of the in-place merge over fake perf rings (ordered.go,
// release.go), driven as a Reader's read drives it. Its clock is moved
// by moving o.start back, never waited for.

import (
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/perfbuf/perfbuf/internal/ring"
	"github.com/perfbuf/perfbuf/internal/ringtest"
	"golang.org/x/sys/unix"
)

// holdAll is an Order that releases by rule 1, 4 and 5 only.
var holdAll = OrderConfig{MaxDelay: time.Hour, Window: 1 << 62}

// Rule 1 releases the smallest front while every ring shows one at least
// as large; the rest goes to a Flush, in key order, none late; the counts
// published are the delivered ones.
func TestOrderedMerge(t *testing.T) {
	s, fakes := perfSet(t, 3, 4096)
	for k := uint64(1); k <= 9; k++ {
		emitPerf(t, fakes[(k-1)%3], k, 16)
	}
	o := NewOrdered(s, holdAll)
	first, _ := readAll(t, s, o)
	rest := flushAll(t, s, o)
	all := append(first, rest...)
	if fmt.Sprint(keysOf(all)) != "[1 2 3 4 5 6 7 8 9]" || len(first) == 0 || len(rest) == 0 {
		t.Fatalf("rule 1 released %v, the flush %v", keysOf(first), keysOf(rest))
	}
	for _, g := range all {
		if g.late || g.ring != int(g.key-1)%3 {
			t.Fatalf("delivered %+v", g)
		}
	}
	for i := range s.Rings {
		o.CommitPublish(i)
		if tl := s.Tallies[i]; tl.Samples != 3 {
			t.Errorf("ring %d: %+v", i, tl)
		}
		if f := fakes[i]; f.Page.Data_tail != f.Page.Data_head {
			t.Errorf("ring %d committed to %d of %d", i, f.Page.Data_tail, f.Page.Data_head)
		}
	}
}

// A lost record carries no key: it goes at once. A key below one delivered
// is Late, delivered and counted.
func TestOrderedLostAndLate(t *testing.T) {
	s, fakes := perfSet(t, 2, 4096)
	o := NewOrdered(s, holdAll)
	emitPerf(t, fakes[0], 10, 16)
	fakes[1].Put(ringtest.PerfLost(0, 3))
	fakes[1].Publish()
	out := flushAll(t, s, o)
	if len(out) != 2 || out[0].typ != ring.Lost || out[0].lost != 3 || out[1].key != 10 {
		t.Fatalf("delivered %+v; want the lost record, then 10", out)
	}
	emitPerf(t, fakes[1], 5, 16)
	emitPerf(t, fakes[1], 20, 16)
	out = flushAll(t, s, o)
	if want := "[{1 1 5 true 0} {1 1 20 false 0}]"; fmt.Sprint(out) != want {
		t.Fatalf("delivered %v, want %v", out, want)
	}
	if tl := s.Tallies[1]; tl.Late != 1 {
		t.Fatalf("tally %+v", tl)
	}
	o.CommitPublish(1)
	if tl := s.Tallies[1]; tl.Lost != 3 || tl.Samples != 2 {
		t.Fatalf("tally %+v: lost %d, samples %d; want 3 and 2", tl, tl.Lost, tl.Samples)
	}
}

// Each delivers a ring's keys below the other fronts in runs through the
// ring's loop; a run stops at a key above its bound, or a lost record, and
// the merge goes on in key order. ReadInto's way (Next) takes the same
// runs record by record.
func TestOrderedRuns(t *testing.T) {
	for _, form := range []string{"Each", "Next"} {
		t.Run(form, func(t *testing.T) {
			s, fakes := perfSet(t, 2, 1<<14)
			var want []uint64
			for k := uint64(0); k < 40; k++ {
				emitPerf(t, fakes[0], 100+k, 16)
				emitPerf(t, fakes[1], 140+k, 16)
				want = append(want, 100+k, 140+k)
			}
			fakes[0].Put(ringtest.PerfLost(0, 1))
			fakes[0].Publish()
			emitPerf(t, fakes[0], 500, 16)
			emitPerf(t, fakes[1], 501, 16)
			want = append(want, 500, 501)
			slices.Sort(want)
			o := NewOrdered(s, holdAll)
			var out []got
			if form == "Each" {
				for {
					more, err := o.Each(func(rec *ring.Record) error {
						if rec.Type == ring.Sample && rec.Key != payloadKey(rec) {
							t.Fatalf("key %d, payload's %d", rec.Key, payloadKey(rec))
						}
						out = append(out, got{rec.Ring, rec.Type, rec.Key, rec.Late, rec.Lost})
						return nil
					})
					if err != nil {
						t.Fatal(err)
					}
					if !more {
						break
					}
				}
			} else {
				out, _ = readAll(t, s, o)
			}
			out = append(out, flushAll(t, s, o)...)
			if fmt.Sprint(keysOf(out)) != fmt.Sprint(want) {
				t.Fatalf("keys %v\nwant %v", keysOf(out), want)
			}
			lost := 0
			for _, g := range out {
				if g.late {
					t.Fatalf("late: %+v", g)
				}
				if g.typ == ring.Lost {
					lost++
				}
			}
			if lost != 1 {
				t.Fatalf("%d lost records delivered", lost)
			}
		})
	}
}

// Each stops at the function's error, and at Close (Stop), with what it
// delivered committed by the next CommitPublish.
func TestOrderedEachStops(t *testing.T) {
	s, fakes := perfSet(t, 1, 4096)
	for k := range uint64(10) {
		emitPerf(t, fakes[0], k, 16)
	}
	o := NewOrdered(s, holdAll)
	errStop := errors.New("stop")
	n := 0
	if more, err := o.Each(func(*ring.Record) error { n++; return errStop }); !more || err != errStop || n != 1 {
		t.Fatalf("Each = %v, %v after %d records; want the function's error after one", more, err, n)
	}
	s.Stop.Store(true)
	if more, err := o.Each(func(*ring.Record) error { n++; return nil }); !more || err != nil || n != 2 {
		t.Fatalf("Each at Close = %v, %v after %d records; want a stop after one", more, err, n)
	}
}

// Rule 2: a key Window larger parsed ahead (scanAhead) releases the keys
// below it, although a ring shows nothing; rule 4: a ring past HighWater
// releases the smallest; rule 3: a front held MaxDelay (by the merge's
// own clock, moved here) is due.
func TestOrderedReleaseRules(t *testing.T) {
	for _, rule := range []string{"window", "highwater", "maxdelay"} {
		t.Run(rule, func(t *testing.T) {
			s, fakes := perfSet(t, 2, 4096)
			cfg := holdAll
			switch rule {
			case "window":
				cfg.Window = 10
			case "highwater":
				cfg.HighWater = 1
			}
			o := NewOrdered(s, cfg)
			for _, k := range []uint64{1, 2, 50} {
				emitPerf(t, fakes[0], k, 16)
			}
			out, _ := readAll(t, s, o)
			switch rule {
			case "window":
				if fmt.Sprint(keysOf(out)) != "[1 2]" {
					t.Fatalf("released %v, want 1 2 (50 within the window of the newest)", keysOf(out))
				}
			case "highwater":
				if fmt.Sprint(keysOf(out)) != "[1 2 50]" {
					t.Fatalf("released %v, want all", keysOf(out))
				}
			case "maxdelay":
				if len(out) != 0 {
					t.Fatalf("released %v before MaxDelay", keysOf(out))
				}
				timeout, slack := o.Idle()
				if timeout <= 0 || timeout > time.Hour || slack != time.Hour/2 {
					t.Fatalf("Idle = %v, %v; want up to MaxDelay, slack MaxDelay/2", timeout, slack)
				}
				o.start = o.start.Add(-2 * time.Hour)
				if out, _ := readAll(t, s, o); fmt.Sprint(keysOf(out)) != "[1 2 50]" {
					t.Fatalf("released %v after MaxDelay, want all", keysOf(out))
				}
			}
		})
	}
}

// The marks that date the records (rule 3) are merged within MaxDelay/32
// and dropped once their records went: a ring read in many head snapshots
// holds few of them.
func TestOrderedMarksMerged(t *testing.T) {
	s, fakes := perfSet(t, 2, 1<<16)
	cfg := holdAll
	cfg.MaxDelay = 32 * time.Second // marks merged within a second
	o := NewOrdered(s, cfg)
	for k := range uint64(400) {
		emitPerf(t, fakes[0], 10+k, 16)
		o.Next() // a head snapshot each
		if n := len(o.rs[0].marks); n > 1 {
			t.Fatalf("%d marks after %d snapshots within the grain", n, k+1)
		}
	}
	for k := range uint64(10) {
		o.start = o.start.Add(-2 * time.Second) // the grain passes
		emitPerf(t, fakes[0], 500+k, 16)
		o.Next()
	}
	if n := len(o.rs[0].marks); n < 5 {
		t.Fatalf("%d marks for snapshots a grain apart", n)
	}
	flushAll(t, s, o)
	emitPerf(t, fakes[0], 1000, 16)
	o.Next()
	if n := len(o.rs[0].marks); n != 1 {
		t.Fatalf("%d marks after the records went, want the new one's", n)
	}
}

// A key at KeyOffset that the ring's end cuts in two is read as if in one
// piece; a sample too short for the key has key 0.
func TestOrderedKeys(t *testing.T) {
	const size = 4096
	f := ringtest.NewPerfAt(size, size-16) // the second record's key straddles the end
	p, err := ring.NewPerfFromParts(0, f.Page, f.Data)
	if err != nil {
		t.Fatal(err)
	}
	s := &Set{Latency: -1}
	s.Push(p)
	o := NewOrdered(s, holdAll)
	emitPerf(t, f, 7, 4) // a 4-byte payload, padded: 16 bytes, wrapped
	emitPerf(t, f, 0x1122334455667788, 24)
	emitPerf(t, f, 0x2000000000000000, 16)
	out := flushAll(t, s, o)
	if fmt.Sprint(keysOf(out)) != fmt.Sprint([]uint64{7, 0x1122334455667788, 0x2000000000000000}) {
		t.Fatalf("keys %x", keysOf(out))
	}
}

// A corrupt record is skipped to the ring's head and reported; the
// records after it are delivered.
func TestOrderedCorrupt(t *testing.T) {
	s, fakes := perfSet(t, 2, 4096)
	o := NewOrdered(s, holdAll)
	emitPerf(t, fakes[0], 1, 16)
	fakes[0].Put(ringtest.PerfRecord(unix.PERF_RECORD_SAMPLE, 4, make([]byte, 8))) // size below the header's
	fakes[0].Publish()
	emitPerf(t, fakes[1], 2, 16)
	s.RequestFlush()
	out, errs := readAll(t, s, o)
	var ce *ring.CorruptError
	if len(errs) != 1 || !errors.As(errs[0], &ce) {
		t.Fatalf("errors %v; want one CorruptError", errs)
	}
	if fmt.Sprint(keysOf(out)) != "[1 2]" {
		t.Fatalf("delivered %v", keysOf(out))
	}
	emitPerf(t, fakes[0], 3, 16)
	if out := flushAll(t, s, o); fmt.Sprint(keysOf(out)) != "[3]" {
		t.Fatalf("after the corruption: %v", keysOf(out))
	}
}

// A ring added (a CPU online) joins the merge: rule 1 waits for it.
func TestOrderedAddRing(t *testing.T) {
	s, fakes := perfSet(t, 1, 4096)
	o := NewOrdered(s, holdAll)
	f := ringtest.NewPerf(4096)
	p, err := ring.NewPerfFromParts(1, f.Page, f.Data)
	if err != nil {
		t.Fatal(err)
	}
	emitPerf(t, f, 1, 16)
	s.Push(p)
	o.AddRing(1)
	emitPerf(t, fakes[0], 2, 16)
	out := flushAll(t, s, o)
	if fmt.Sprint(keysOf(out)) != "[1 2]" || out[0].ring != 1 {
		t.Fatalf("delivered %+v", out)
	}
}

// eachAll runs Each until it reports nothing more to deliver now.
func eachAll(t *testing.T, o Reading) []got {
	t.Helper()
	var out []got
	for {
		more, err := o.Each(func(rec *ring.Record) error {
			out = append(out, got{rec.Ring, rec.Type, rec.Key, rec.Late, rec.Lost})
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		if !more {
			return out
		}
	}
}

// Rule 2 counts the key that ends a run of Each: the run notes it for its
// ring only, and the merge must still count it among the newest keys.
// Ring 0's run stops at 500 (beyond ring 2's 3); once ring 2 is empty, ring
// 1's 5 goes by rule 2 because of that 500, while the 500 itself waits.
func TestOrderedRunNewest(t *testing.T) {
	s, fakes := perfSet(t, 3, 4096)
	cfg := holdAll
	cfg.Window = 100
	o := NewOrdered(s, cfg)
	emitPerf(t, fakes[0], 1, 16)
	emitPerf(t, fakes[0], 500, 16)
	emitPerf(t, fakes[1], 5, 16)
	emitPerf(t, fakes[2], 3, 16)
	if out := eachAll(t, o); fmt.Sprint(keysOf(out)) != "[1 3 5]" {
		t.Errorf("Each delivered %v; want [1 3 5] (500 held)", keysOf(out))
	}
}

// Rule 2 with an idle ring: the merge parses ahead of a ring's front to
// find a key Window later, and releases the front then; the newest record
// stays held. A record written after the merge's last head snapshot is
// found by a new one.
func TestOrderedWindowLookAhead(t *testing.T) {
	s, fakes := perfSet(t, 2, 1<<14)
	cfg := holdAll
	cfg.Window = 1000
	o := NewOrdered(s, cfg)
	for _, key := range []uint64{5000, 5500, 6000, 7000} {
		emitPerf(t, fakes[0], key, 16)
	}
	out, _ := readAll(t, s, o) // 7000 - 1000 = 6000: everything up to 6000 goes
	if fmt.Sprint(out) != "[{0 1 5000 false 0} {0 1 5500 false 0} {0 1 6000 false 0}]" {
		t.Fatalf("delivered %v; want 5000 5500 6000, 7000 held", out)
	}
	o.CommitPublish(0)
	if tl := s.Tallies[0]; tl.Samples != 3 || tl.Late != 0 {
		t.Errorf("tally %+v", tl)
	}
	emitPerf(t, fakes[0], 8500, 16)
	if out, _ := readAll(t, s, o); fmt.Sprint(keysOf(out)) != "[7000]" {
		t.Fatalf("after 8500: %v; want 7000", keysOf(out))
	}
}

// A run goes on during a flush, record by record (Next, as ReadInto reads),
// while its records lie before the ring's flush head, and the flush ends
// where it ended when every record of a flush went through the merge: what
// the rings held at the Flush goes, with what came since with smaller keys
// (key order), and nothing past that before the flush is reached.
func TestOrderedRunDuringFlush(t *testing.T) {
	s, fakes := perfSet(t, 2, 1<<14)
	for k := uint64(1); k <= 40; k++ {
		emitPerf(t, fakes[0], k, 16)
	}
	emitPerf(t, fakes[1], 1000, 16)
	o := NewOrdered(s, holdAll)
	s.RequestFlush()
	var keys []uint64
	for n := 0; ; n++ {
		if n > 200 {
			t.Fatalf("the flush not reached after %d reads: %v", n, keys)
		}
		if rec, i := o.Next(); i >= 0 {
			keys = append(keys, rec.Key)
			o.Delivered(i)
			if len(keys) == 10 { // written during the flush, past the heads
				for k := uint64(41); k <= 50; k++ {
					emitPerf(t, fakes[0], k, 16)
				}
				emitPerf(t, fakes[0], 3000, 16)
				emitPerf(t, fakes[1], 2000, 16)
			}
			continue
		}
		if !s.Flushing() || !s.FlushReached(o) {
			t.Fatalf("nothing to deliver and the flush not reached: %v", keys)
		}
		s.EndFlush()
		break
	}
	var want []uint64
	for k := uint64(1); k <= 50; k++ {
		want = append(want, k)
	}
	want = append(want, 1000)
	if fmt.Sprint(keys) != fmt.Sprint(want) {
		t.Fatalf("the flush delivered %v\nwant %v", keys, want)
	}
	if rest := keysOf(flushAll(t, s, o)); fmt.Sprint(rest) != "[2000 3000]" {
		t.Fatalf("after the flush: %v, want [2000 3000]", rest)
	}
}
