// SPDX-License-Identifier: Apache-2.0

package policy

// Tests of the ordered window over fake BPF ring buffers (internal/ringtest),
// driven as a Reader's read drives it: Next and Delivered while there is a
// record, and when there is none, the steps of Reader.block (the corruption
// skipped reported, Idle, the flush's end).

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/perfbuf/perfbuf/internal/ring"
	"github.com/perfbuf/perfbuf/internal/ringtest"
)

// windowOver returns a window over n fake ring buffers of size bytes, each
// shared by CPUs (rule 1 releases nothing), MaxDelay an hour and a key
// window larger than the keys (rules 2 and 3 release nothing): the window
// releases its copies only to a Flush.
func windowOver(t *testing.T, n, size int) (*Set, *window, []*ringtest.RingBuf) {
	t.Helper()
	s, fakes := ringBufSet(t, n, size)
	w := NewWindow(s, WindowConfig{OrderConfig: OrderConfig{MaxDelay: time.Hour, Window: 1 << 62}, Bytes: n * size})
	return s, w, fakes
}

// emitKey outputs a 16-byte sample whose first 8 bytes are key.
func emitKey(t *testing.T, f *ringtest.RingBuf, key uint64) {
	t.Helper()
	f.Output(t, binary.NativeEndian.AppendUint64(make([]byte, 0, 16), key)[:16])
}

// readResult is what a read of the window delivered and how it ended.
type readResult struct {
	keys    []uint64
	errs    []error // corruptions reported
	flushed bool    // the flush ended; else the read would wait
}

// blockStep is Reader.block with nothing to deliver: the corruption a
// policy skipped is reported; else Idle, and a flush that reached its end
// ends. It reports whether the read ends (an error, a flush ended, or a
// wait: no flush running) and whether a flush ended.
func blockStep(s *Set, w *window, res *readResult) (ends bool) {
	if s.Corrupt != nil {
		res.errs = append(res.errs, s.Corrupt)
		s.Corrupt = nil
		return true
	}
	w.Idle()
	if s.Flushing() && s.FlushReached(w) {
		s.EndFlush()
		res.flushed = true
		return true
	}
	return !s.Flushing() // not flushing: the read waits; else it reads on
}

// readWindow reads w as reads do one after the other, starting with block
// (firstBlock) or with Next, until one ends the flush or would wait. More
// than 100 steps in a row that deliver nothing and end nothing are a
// spin: what Reader.block did, reading on without waiting, for ever.
func readWindow(t *testing.T, s *Set, w *window, firstBlock bool) readResult {
	t.Helper()
	var res readResult
	idle := 0
	for step := 0; ; step++ {
		if idle > 100 {
			t.Fatalf("spins: %d steps in a row deliver nothing, report nothing and end no flush (delivered %v, errors %v, %d held)",
				idle, res.keys, res.errs, w.copies.held)
		}
		if step > 0 || !firstBlock {
			if rec, i := w.Next(); i >= 0 {
				res.keys = append(res.keys, rec.Key)
				w.Delivered(i)
				idle = 0
				continue
			}
		}
		if blockStep(s, w, &res) {
			if res.flushed || !s.Flushing() {
				return res
			}
			idle = 0 // an error reported: the next read goes on
			continue
		}
		idle++
	}
}

// An ordered Flush ends only once the copies the window held before it
// were delivered. A Flush that came while the read found nothing to
// release (the read's Next done, its block not yet) used to end at once:
// the rings' cursors were at the flush's heads, the window's copies were
// not looked at (1 in 50-200 flushes of a ring per CPU ended with copies
// held: 3,307 of 3,826 delivered).
func TestWindowFlushDeliversHeld(t *testing.T) {
	for _, rings := range []int{1, 3} {
		t.Run(fmt.Sprintf("rings=%d", rings), func(t *testing.T) {
			s, w, fakes := windowOver(t, rings, 4096)
			var want []uint64
			for i, f := range fakes {
				for _, key := range []uint64{50, 30, 40, 10, 20} {
					emitKey(t, f, key+uint64(i))
					want = append(want, key+uint64(i))
				}
			}
			if _, i := w.Next(); i >= 0 || w.copies.held != len(want) {
				t.Fatalf("first read: ring %d, %d held; want nothing released, %d held", i, w.copies.held, len(want))
			}
			s.RequestFlush() // between the read's Next and its block
			res := readWindow(t, s, w, true)
			if !res.flushed || len(res.errs) != 0 {
				t.Fatalf("read: %+v; want the flush ended", res)
			}
			if len(res.keys) != len(want) {
				t.Fatalf("the flush ended with %d of %d copies delivered (%v), %d held", len(res.keys), len(want), res.keys, w.copies.held)
			}
			for j := 1; j < len(res.keys); j++ {
				if res.keys[j] < res.keys[j-1] {
					t.Fatalf("delivered %v: not in key order", res.keys)
				}
			}
		})
	}
}

// A consumer_pos that another consumer wrote is a *CorruptError for the
// ordered window as for the other policies, met at its next intake, and
// the flush ends with what the window held delivered. The window used to
// look at producer_pos only (Refresh): moved forward, the record the other
// consumer took was copied and delivered again, unreported; moved back, a
// Flush never ended (RingBuf.Reached waits for consumer_pos to be the
// reader's own), and the read spun.
func TestWindowConsumerMovedByAnother(t *testing.T) {
	for _, move := range []string{"back", "forward"} {
		for _, flush := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/flush=%v", move, flush), func(t *testing.T) {
				s, w, fakes := windowOver(t, 2, 4096)
				f := fakes[0]
				for _, key := range []uint64{12, 10, 11} {
					emitKey(t, f, key)
				}
				emitKey(t, fakes[1], 13)
				if _, i := w.Next(); i >= 0 || w.copies.held != 4 {
					t.Fatalf("first read: ring %d, %d held; want nothing released, 4 held", i, w.copies.held)
				}
				switch move {
				case "back": // another consumer moves it behind the reader's (its oldest copy's)
					atomic.StoreUint64(&f.Pos[0], atomic.LoadUint64(&f.Pos[0])-8)
				case "forward": // another consumer took the next record, 20
					emitKey(t, f, 20)
					emitKey(t, f, 21)
					atomic.StoreUint64(&f.Pos[0], atomic.LoadUint64(&f.Pos[0])+24)
				}
				if flush {
					s.RequestFlush()
				}
				res := readWindow(t, s, w, false)
				var ce *ring.CorruptError
				if len(res.errs) != 1 || !errors.As(res.errs[0], &ce) || !strings.Contains(ce.Reason, "by another writer") {
					t.Fatalf("reads: %+v; want one CorruptError: consumer position changed by another writer", res)
				}
				for _, k := range res.keys {
					if k == 20 {
						t.Fatalf("delivered %v: 20, which the other consumer took", res.keys)
					}
				}
				if flush && (!res.flushed || fmt.Sprint(res.keys) != "[10 11 12 13]") {
					t.Fatalf("reads: %+v; want the flush ended with 10 11 12 13 delivered", res)
				}
				// On from producer_pos, the reader's own again.
				if c, p := atomic.LoadUint64(&f.Pos[0]), atomic.LoadUint64(&f.Pos[1]); c != p {
					t.Fatalf("consumer_pos %d, producer_pos %d after the error", c, p)
				}
			})
		}
	}
}

// The window's copies come out in key order, each once, however their
// keys fall in the ring: random, nearly rising, or several rising runs
// interleaved (13 CPUs' records in one ring, round robin).
func TestWindowCopyRuns(t *testing.T) {
	for _, shape := range []string{"random", "rising", "interleaved"} {
		t.Run(shape, func(t *testing.T) {
			const n = 3000
			rng := rand.New(rand.NewSource(1))
			s, fakes := ringBufSet(t, 1, 1<<17)
			w := NewWindow(s, WindowConfig{OrderConfig: OrderConfig{MaxDelay: time.Hour, Window: 1 << 62}, Bytes: 1 << 17})
			for seq := range uint64(n) {
				var key uint64
				switch shape {
				case "random":
					key = uint64(rng.Intn(500))
				case "rising":
					key = seq + uint64(rng.Intn(20)) // a little disorder
				case "interleaved":
					key = seq%13*1000 + seq/13
				}
				p := keyed(key, 16)
				binary.NativeEndian.PutUint64(p[8:], seq)
				fakes[0].Output(t, p)
			}
			out := flushAll(t, s, w)
			if len(out) != n {
				t.Fatalf("%d delivered of %d", len(out), n)
			}
			for j := 1; j < len(out); j++ {
				if out[j].key < out[j-1].key || out[j].late {
					t.Fatalf("record %d: key %d after %d", j, out[j].key, out[j-1].key)
				}
			}
			if w.copies.held != 0 || len(w.copies.heap) != 0 || w.arena.used != 0 {
				t.Fatalf("after the flush: %d held, %d runs in the heap, %d bytes used", w.copies.held, len(w.copies.heap), w.arena.used)
			}
		})
	}
}

// A window made over no ring (every ring buffer waiting for its consumer
// lock) delivers nothing and does not spin; rings added later (AddRing, a
// ring taken over) are read as those it was made with, rule 1 included for
// rings that OneWriter names. NewWindow used to read the first ring's size.
func TestWindowRingsAddedLater(t *testing.T) {
	s := &Set{Latency: -1}
	var one []bool
	w := NewWindow(s, WindowConfig{OrderConfig: OrderConfig{MaxDelay: time.Hour, Window: 1 << 62}, Bytes: 2 * 4096,
		OneWriter: func(i int) bool { return one[i] }})
	if res := readWindow(t, s, w, false); len(res.keys) != 0 || len(res.errs) != 0 {
		t.Fatalf("a window over no ring read %+v", res)
	}
	for i, keys := range [][]uint64{{1, 3, 5}, {2, 4}} {
		f := ringtest.NewRingBuf(4096)
		for _, key := range keys {
			emitKey(t, f, key)
		}
		rb, err := ring.NewRingBufFromParts(-1, &f.Pos[0], &f.Pos[1], f.Data)
		if err != nil {
			t.Fatal(err)
		}
		one = append(one, true)
		s.Push(rb)
		w.AddRing(i)
	}
	if res := readWindow(t, s, w, false); fmt.Sprint(res.keys) != "[1 2 3 4]" {
		t.Fatalf("read %v; want [1 2 3 4] (5 waits for ring 1 to show a key >= 5)", res.keys)
	}
	s.RequestFlush()
	if res := readWindow(t, s, w, false); !res.flushed || fmt.Sprint(res.keys) != "[5]" {
		t.Fatalf("flush: %+v; want [5], flushed", res)
	}
}

// The consumer position the window publishes for a ring never passes a
// record it copied and has not delivered: a reader that dies holding
// copies leaves them in the ring, and the next reader delivers them. The
// window used to commit every record as it copied it, so that a copy not
// yet delivered was lost with a reader killed (issue 47, item 3).
func TestWindowCommitsBehindHeld(t *testing.T) {
	for _, rings := range []int{1, 3} {
		t.Run(fmt.Sprintf("rings=%d", rings), func(t *testing.T) {
			const size = 4096
			s, fakes := ringBufSet(t, rings, size)
			// Rule 2 releases a key 40 behind the newest: the window holds
			// the disordered recent keys and delivers the older ones.
			w := NewWindow(s, WindowConfig{OrderConfig: OrderConfig{MaxDelay: time.Hour, Window: 40}, Bytes: rings * size})
			rnd := rand.New(rand.NewSource(47))
			type rec struct {
				ring int
				pos  uint64
			}
			pending := map[uint64]rec{} // emitted, not delivered, by key
			check := func(when string) {
				t.Helper()
				for key, r := range pending {
					if c := atomic.LoadUint64(&fakes[r.ring].Pos[0]); int64(r.pos-c) < 0 {
						t.Fatalf("%s: ring %d's consumer_pos %d passed key %d at %d, copied and not delivered (%d held)",
							when, r.ring, c, key, r.pos, w.copies.held)
					}
				}
			}
			heldBehind := 0 // deliveries with copies held
			deliver := func(rec *ring.Record, i int) {
				check("before Delivered")
				if w.copies.held > 0 {
					heldBehind++
				}
				delete(pending, rec.Key)
				w.Delivered(i)
			}
			next := uint64(1000)
			delivered := 0
			for round := 0; round < 400; round++ {
				for range rnd.Intn(12) {
					i := rnd.Intn(rings)
					key := next + uint64(rnd.Intn(60)) // disorder within 60
					next += 3
					if _, dup := pending[key]; dup {
						continue
					}
					f := fakes[i]
					pos, ok := f.Reserve(16)
					if !ok {
						continue // full behind the copies held
					}
					f.Write(pos, binary.NativeEndian.AppendUint64(make([]byte, 0, 16), key)[:16])
					f.Commit(pos, false)
					pending[key] = rec{i, pos}
				}
				for range rnd.Intn(8) {
					rec, i := w.Next()
					check("after Next")
					if i < 0 {
						break
					}
					deliver(rec, i)
					delivered++
				}
				if rnd.Intn(4) == 0 {
					w.Idle()
					check("after Idle")
				}
			}
			if heldBehind == 0 {
				t.Fatalf("%d delivered, none with copies held: the test proves nothing", delivered)
			}
			s.RequestFlush()
			res := readWindow(t, s, w, false)
			if !res.flushed || len(res.keys)+delivered == 0 {
				t.Fatalf("flush: %+v", res)
			}
			for _, k := range res.keys {
				delete(pending, k)
			}
			if len(pending) != 0 {
				t.Fatalf("%d records not delivered after the flush", len(pending))
			}
			for i, f := range fakes {
				if c, p := atomic.LoadUint64(&f.Pos[0]), atomic.LoadUint64(&f.Pos[1]); c != p {
					t.Fatalf("ring %d: consumer_pos %d, producer_pos %d after the flush", i, c, p)
				}
			}
		})
	}
}

// A ring's space stays taken from its oldest copy not delivered on: once
// the copies keep more than half of it, rule 4 releases them, so that its
// producers still find room. Here every key falls (each held by rules 1 to
// 3) and the reader looks every 16 records, before the hot ring's eighth:
// without rule 4's look at the ring, the 171st record found no room.
func TestWindowReleasesRingKeptHalf(t *testing.T) {
	s, w, fakes := windowOver(t, 1, 4096)
	f := fakes[0]
	const n = 400
	var got []uint64
	for k := range n {
		if k%16 == 0 {
			res := readWindow(t, s, w, false)
			got = append(got, res.keys...)
		}
		emitKey(t, f, uint64(n-k)) // (fails when the ring has no room)
	}
	got = append(got, readWindow(t, s, w, false).keys...)
	if len(got) == 0 || w.copies.held == 0 {
		t.Fatalf("%d delivered, %d held; want rule 4 to release some, the window to hold the rest", len(got), w.copies.held)
	}
	s.RequestFlush()
	res := readWindow(t, s, w, false)
	if len(got)+len(res.keys) != n || !res.flushed {
		t.Fatalf("%d delivered before the flush, %d by it; want %d", len(got), len(res.keys), n)
	}
}

// Once Close stopped the reader, the window takes nothing more in: with
// HandOver, Each delivers every copy held, in key order, and returns; the
// records not taken in stay in the ring, and the commit stops before them.
// Without it, Each returns after one record.
func TestWindowStopHandsOver(t *testing.T) {
	for _, handOver := range []bool{true, false} {
		t.Run(fmt.Sprintf("HandOver=%v", handOver), func(t *testing.T) {
			s, w, fakes := windowOver(t, 1, 4096)
			for _, key := range []uint64{50, 30, 40} {
				emitKey(t, fakes[0], key)
			}
			if _, i := w.Next(); i >= 0 || w.copies.held != 3 {
				t.Fatalf("first read: ring %d, %d held; want nothing released, 3 held", i, w.copies.held)
			}
			taken := fakes[0].Pos[1] // the copies' end
			emitKey(t, fakes[0], 10) // after the window's last look: not taken in
			s.HandOver.Store(handOver)
			s.Stop.Store(true)
			var keys []uint64
			more, err := w.Each(func(rec *ring.Record) error {
				keys = append(keys, rec.Key)
				return nil
			})
			want := []uint64{30, 40, 50}
			if !handOver {
				want = want[:1]
			}
			if err != nil || !slices.Equal(keys, want) || more != !handOver {
				t.Fatalf("Each at Stop: %v, more %v, %v; want %v", keys, more, err, want)
			}
			w.CommitPublish(0)
			if c := atomic.LoadUint64(&fakes[0].Pos[0]); c != taken {
				t.Fatalf("committed to %d; want %d, the record not taken in left in the ring", c, taken)
			}
			if h := w.Held(0); h != uint64(3-len(keys)) {
				t.Fatalf("Held %d after %d delivered", h, len(keys))
			}
		})
	}
}
