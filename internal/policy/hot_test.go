// SPDX-License-Identifier: Apache-2.0

package policy

// Tests of the window's hot ring: a ring buffer the reader fell behind,
// read in place rather than copied. The hold is set, never waited for.

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/perfbuf/perfbuf/internal/ring"
)

// readForm reads w in one of a Reader's forms until none is to deliver
// now, the read not waiting (NoWait) as a busy reader does not: "Next"
// (Next and Delivered), "NextCopy" (ReadInto's copy first), "Each",
// "CopyInto" (ReadBatch's, in batches of 7).
func readForm(t *testing.T, s *Set, w *window, form string) []got {
	t.Helper()
	var out []got
	for range 1000 {
		switch form {
		case "NextCopy":
			var c ring.Copy
			if w.NextCopy(&c) {
				if c.Key != payloadKeyOf(c.Data) {
					t.Fatalf("key %d, payload's %d", c.Key, payloadKeyOf(c.Data))
				}
				out = append(out, got{c.Ring, c.Type, c.Key, c.Late, 0})
				continue
			}
			fallthrough
		case "Next":
			rec, i := w.Next()
			if i < 0 {
				return out
			}
			if rec.Key != payloadKey(rec) {
				t.Fatalf("key %d, payload's %d", rec.Key, payloadKey(rec))
			}
			out = append(out, got{i, rec.Type, rec.Key, rec.Late, 0})
			w.Delivered(i)
		case "CopyInto":
			// The owner's copy function: one record into the batch, the
			// loop ended once it is full.
			sink := ring.Sink{Into: make([]ring.Copy, 7), Room: 1 << 20}
			full := errors.New("full")
			more := w.CopyInto(&sink, func(rec *ring.Record) error {
				ring.SetCopy(&sink.Into[sink.N], rec)
				if sink.Took(rec.Len()) {
					return full
				}
				return nil
			})
			for _, c := range sink.Into[:sink.N] {
				if c.Key != payloadKeyOf(c.Data) {
					t.Fatalf("key %d, payload's %d", c.Key, payloadKeyOf(c.Data))
				}
				out = append(out, got{c.Ring, c.Type, c.Key, c.Late, 0})
			}
			if !more {
				return out
			}
		case "Each":
			more, err := w.Each(func(rec *ring.Record) error {
				if rec.Key != payloadKey(rec) {
					t.Fatalf("key %d, payload's %d", rec.Key, payloadKey(rec))
				}
				out = append(out, got{rec.Ring, rec.Type, rec.Key, rec.Late, 0})
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
	t.Fatalf("no end after %v", out)
	return nil
}

// A ring found more than an eighth full at an intake made while the reader
// was delivering is read in place: its records go at once, merged with the
// window's copies, the smaller key first; a record that comes later with a
// smaller key than one delivered is Late and counted. Within the hold it
// stays hot; a look that finds it empty past the hold cools it, and the
// window holds records again. Without the hot ring, rule 2 (a key window of
// 1,000) would hold every key above 100.
func TestWindowHot(t *testing.T) {
	for _, form := range []string{"Next", "NextCopy", "Each"} {
		t.Run(form, func(t *testing.T) {
			// (8 KiB: the copy of 1,100 keeps the ring's space behind it,
			// under half the ring: rule 4 does not release it.)
			s, fakes := ringBufSet(t, 1, 8192)
			f := fakes[0]
			w := NewWindow(s, WindowConfig{OrderConfig: OrderConfig{MaxDelay: time.Hour, Window: 1000}, Bytes: 4096})
			w.hot.hold = time.Hour
			for _, key := range []uint64{10, 1100, 300} {
				f.Output(t, keyed(key, 64))
			}
			if got := readForm(t, s, w, form); fmt.Sprint(keysOf(got)) != "[10]" || w.hot.ring >= 0 {
				t.Fatalf("first read: %v, hot %d; want 10 by rule 2, none hot", keysOf(got), w.hot.ring)
			}
			// While the reader is busy (no wait since its intake), 30
			// records of 72 bytes, 2,160 of the ring's 8,192; the seventh
			// one's key, 200, comes after 250 to 390.
			w.NoWait()
			hot := []uint64{250, 350, 360, 370, 380, 390, 200}
			want := []uint64{250, 300, 350, 360, 370, 380, 390, 200}
			for k := uint64(400); len(hot) < 30; k += 10 {
				hot, want = append(hot, k), append(want, k)
			}
			for _, key := range hot {
				f.Output(t, keyed(key, 64))
			}
			w.take.look = true // (a read's next intake)
			got := readForm(t, s, w, form)
			if fmt.Sprint(keysOf(got)) != fmt.Sprint(want) || w.hot.ring != 0 {
				t.Fatalf("keys %v, hot %d\nwant %v, hot 0", keysOf(got), w.hot.ring, want)
			}
			for _, g := range got {
				if g.late != (g.key == 200) {
					t.Fatalf("%+v", g)
				}
			}
			if s.Tallies[0].Late != 1 {
				t.Fatalf("tally %+v", s.Tallies[0])
			}
			// Within the hold, the ring stays hot: what comes goes at
			// once, before the window's 1,100.
			f.Output(t, keyed(700, 64))
			f.Output(t, keyed(710, 64))
			w.take.look = true
			if got := readForm(t, s, w, form); fmt.Sprint(keysOf(got)) != "[700 710]" {
				t.Fatalf("within the hold: %v", keysOf(got))
			}
			// A look that finds the ring empty past the hold cools it: the
			// window holds again, until a Flush.
			w.hot.hold = 0
			w.take.look = true
			if got := readForm(t, s, w, form); len(got) != 0 || w.hot.ring != -1 {
				t.Fatalf("more: %v, hot %d", keysOf(got), w.hot.ring)
			}
			w.Idle()
			f.Output(t, keyed(900, 64))
			f.Output(t, keyed(800, 64))
			w.take.look = true
			if got := readForm(t, s, w, form); len(got) != 0 {
				t.Fatalf("held: %v", keysOf(got))
			}
			if got := flushAll(t, s, w); fmt.Sprint(keysOf(got)) != "[800 900 1100]" {
				t.Fatalf("flushed %v", keysOf(got))
			}
			w.CommitPublish(0)
			if tl := s.Tallies[0]; tl.Samples != 37 || tl.Late != 1 || f.Pos[0] != f.Pos[1] {
				t.Fatalf("after the flush: %+v, consumer %d of %d", tl, f.Pos[0], f.Pos[1])
			}
		})
	}
}

// A late record of the hot ring goes as a copy's would: marked Late and
// counted, in every form; late against the largest key delivered, also by
// the ring's loop (its run's last).
func TestWindowHotLate(t *testing.T) {
	for _, form := range []string{"Next", "NextCopy", "Each", "CopyInto"} {
		t.Run(form, func(t *testing.T) {
			s, fakes := ringBufSet(t, 1, 4096)
			w := NewWindow(s, WindowConfig{OrderConfig: OrderConfig{MaxDelay: time.Hour, Window: 1 << 62}, Bytes: 4096})
			w.hot.hold = time.Hour
			w.NoWait()
			// 50 records of 72 bytes, 3,600 of 4,096: hot at the first
			// intake; the 20th key, 5, comes after 10 to 190, the 31st,
			// 285, after 290.
			var keys []uint64
			for k := uint64(10); len(keys) < 50; k += 10 {
				if len(keys) == 19 {
					keys = append(keys, 5)
				}
				if len(keys) == 30 {
					keys = append(keys, k-15)
				}
				keys = append(keys, k)
			}
			for _, k := range keys {
				fakes[0].Output(t, keyed(k, 64))
			}
			got := readForm(t, s, w, form)
			if fmt.Sprint(keysOf(got)) != fmt.Sprint(keys) {
				t.Fatalf("keys %v\nwant %v", keysOf(got), keys)
			}
			for _, g := range got {
				if g.late != (g.key == 5 || g.key == 285) {
					t.Fatalf("key %d late %v", g.key, g.late)
				}
			}
			if tl := s.Tallies[0]; tl.Late != 2 {
				t.Fatalf("tally %+v", tl)
			}
		})
	}
}

// A burst that came while the reader waited is copied and ordered; the
// same with the producers writing a chunk while the intake copied one is
// a flood: the ring becomes hot, and the rest is read in place.
func TestWindowFloodAfterWait(t *testing.T) {
	for _, flood := range []bool{false, true} {
		t.Run(fmt.Sprint("flood=", flood), func(t *testing.T) {
			s, fakes := ringBufSet(t, 1, 4096)
			f := fakes[0]
			chunk := commitChunk(4096)
			var extra []uint64 // written during the intake
			for k := uint64(1000); len(extra)*72 < chunk; k += 10 {
				extra = append(extra, k)
			}
			w := NewWindow(s, WindowConfig{OrderConfig: OrderConfig{MaxDelay: time.Hour, Window: 1 << 62},
				Bytes: 4096, OneWriter: func(int) bool { return true }})
			wrote := !flood
			w.take.stageF = func(rec *ring.Record) error {
				if !wrote { // at the intake's first copy
					wrote = true
					for _, key := range extra {
						f.Output(t, keyed(key, 64))
					}
				}
				return w.stage(rec)
			}
			w.hot.hold = time.Hour
			for key := uint64(100); key < 300; key += 10 { // 20 records: 1,440 of 4,096
				f.Output(t, keyed(key, 64))
			}
			out := readForm(t, s, w, "Next")
			if flood != (w.hot.ring == 0) {
				t.Fatalf("hot %d after the intake", w.hot.ring)
			}
			if !flood {
				out = append(out, flushAll(t, s, w)...)
			}
			n := 20
			if flood {
				n += len(extra)
			}
			if len(out) != n {
				t.Fatalf("%d delivered, want %d: %v", len(out), n, keysOf(out))
			}
			for j := 1; j < len(out); j++ {
				if out[j].key < out[j-1].key || out[j].late {
					t.Fatalf("not in order: %v", keysOf(out))
				}
			}
		})
	}
}

// The arena keeps its chunks for reuse as its copies go, and a payload
// larger than a chunk gets one of its own, dropped once free.
func TestArena(t *testing.T) {
	var a arena
	a.reserve(2 * chunkSize)
	if len(a.spare) != 2 || a.bytes != 0 {
		t.Fatalf("reserve: %d spare, %d bytes", len(a.spare), a.bytes)
	}
	var refs []arenaRef
	for range 3 * chunkSize / 1024 {
		ref, buf := a.alloc(1000)
		buf[0], buf[999] = 1, 2
		refs = append(refs, ref)
	}
	if a.used != 3*chunkSize/1024*1000 || a.bytes != 3*chunkSize {
		t.Fatalf("used %d, bytes %d", a.used, a.bytes)
	}
	big, buf := a.alloc(2 * chunkSize)
	if len(buf) != 2*chunkSize || len(a.bytesOf(big)) != 2*chunkSize {
		t.Fatal("a large payload's room")
	}
	for _, r := range refs {
		if b := a.bytesOf(r); b[0] != 1 || b[999] != 2 {
			t.Fatal("a payload changed")
		}
		a.release(r)
	}
	a.release(big)
	if _, _ = a.alloc(8); a.used != 8 || a.bytes != chunkSize {
		t.Fatalf("after release: used %d, bytes %d", a.used, a.bytes)
	}
	big, _ = a.alloc(3 * chunkSize) // in the slot the first large chunk left
	a.release(big)
}

// A hot ring's records go in place while the window holds a copy of the
// ring with a larger key; the copy keeps the ring's space behind it, so
// once the records delivered since pass half the ring, rule 4 releases the
// copy first, and the producers find room. Without it the ring filled
// behind the copy while the reader delivered every record in place.
func TestWindowHotReleasesKeptHalf(t *testing.T) {
	s, fakes := ringBufSet(t, 1, 4096)
	f := fakes[0]
	w := NewWindow(s, WindowConfig{OrderConfig: OrderConfig{MaxDelay: time.Hour, Window: 1 << 40}, Bytes: 4096})
	w.hot.hold = time.Hour
	f.Output(t, keyed(1<<30, 64)) // held: no rule releases it
	if got := readForm(t, s, w, "Next"); len(got) != 0 {
		t.Fatalf("first read: %v", keysOf(got))
	}
	w.NoWait() // the reader is busy: an eighth of the ring makes it hot
	var got []got
	hot := false
	for k := uint64(1); k <= 200; k++ { // 200 records of 72 bytes: 3.5 rings
		f.Output(t, keyed(k, 64)) // (fails when the ring has no room)
		if k%8 == 0 {
			w.take.look = true
			got = append(got, readForm(t, s, w, "Next")...)
			hot = hot || w.hot.ring == 0
		}
	}
	if !hot {
		t.Fatal("the ring never went hot")
	}
	got = append(got, flushAll(t, s, w)...)
	if len(got) != 201 {
		t.Fatalf("delivered %d of 201: %v", len(got), keysOf(got))
	}
	if keysOf(got)[200] == 1<<30 {
		t.Fatalf("the copy of %d went last: rule 4 never released it", uint64(1<<30))
	}
}
