// SPDX-License-Identifier: Apache-2.0

package perfbuf

// Fuzzing a Reader over several ring buffers (an array of ring buffers, a
// ring per CPU: issue 30, item 9): one ring of arbitrary bytes and
// positions among rings that a producer following the kernel's protocol
// wrote, some of them empty.

import (
	"errors"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/perfbuf/perfbuf/internal/ringtest"
)

// FuzzReaderRingBufs reads rings 0..n-1 with one Reader; ring bad holds
// arbitrary bytes at arbitrary positions, each other ring counts[i]
// records (0: an empty ring), every third discarded. Consume must never
// panic, loop or hand out memory outside a ring; the only errors are
// *CorruptErrors of ring bad; every other ring's samples arrive once, in
// order, and its Stats after Close say so exactly (no corruption, nothing
// left, its discards counted). The bad ring's Stats count what it
// delivered. With n's top bit, the Reader is ordered (the window of
// copies: each good ring's keys, its seqs, rise), and each Consume
// follows a Flush.
//
// With move, another consumer stores a good ring's consumer_pos (a record
// boundary, behind or ahead of the reader's) before one of the first four
// Consumes: the read reports a *CorruptError of that ring ("by another
// writer"), once, and reads on (or, moved ahead while the reader had parsed
// nothing of that ring, takes it as its start: an upgrade's new reader); the ring's samples arrive at most once,
// in order, and none of those the other consumer took that the reader had
// not seen (past its last look at producer_pos). Every Consume runs
// under a deadline that it never meets: a read that spins (an ordered
// Flush that never ended) runs into it.
func FuzzReaderRingBufs(f *testing.F) {
	f.Add([]byte{}, uint8(2), uint8(0), uint64(0), uint64(0), []byte{3, 5}, uint8(0))
	f.Add(make([]byte, 64), uint8(4), uint8(3), uint64(4), uint64(64), []byte{0, 7, 1, 9}, uint8(0))
	f.Add([]byte{8, 0, 0, 0, 0, 0, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8}, uint8(3), uint8(1), uint64(0), uint64(16), []byte{2, 0, 4}, uint8(0))
	f.Add([]byte{0xff, 0xff, 0xff, 0x7f}, uint8(2), uint8(1), uint64(4096), uint64(8192), []byte{1, 1}, uint8(0))
	f.Add(make([]byte, 64), uint8(0x84), uint8(3), uint64(4), uint64(64), []byte{0, 7, 1, 9}, uint8(0))
	f.Add([]byte{8, 0, 0, 0, 0, 0, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8}, uint8(0x83), uint8(1), uint64(0), uint64(16), []byte{2, 0, 4}, uint8(0))
	f.Add(make([]byte, 64), uint8(0xc1), uint8(1), uint64(4), uint64(64), []byte{39, 38}, uint8(0))
	f.Add([]byte{0xff, 0xff, 0xff, 0x7f}, uint8(0xc2), uint8(2), uint64(0), uint64(1000), []byte{37, 39, 0}, uint8(0))
	f.Add(make([]byte, 64), uint8(0x81), uint8(0), uint64(0), uint64(0), []byte{0, 9}, uint8(0x03))    // ordered, forward over 2 records
	f.Add(make([]byte, 64), uint8(0x82), uint8(0), uint64(0), uint64(0), []byte{0, 9, 6}, uint8(0x10)) // ordered, back to the start
	f.Add(make([]byte, 64), uint8(0xc1), uint8(0), uint64(0), uint64(0), []byte{0, 30}, uint8(0x05))   // the hot ring, forward before the first read
	f.Add(make([]byte, 64), uint8(0xc1), uint8(0), uint64(0), uint64(0), []byte{0, 30}, uint8(0x2f))   // the hot ring, back
	f.Add(make([]byte, 64), uint8(0x01), uint8(0), uint64(0), uint64(0), []byte{0, 9}, uint8(0x03))    // fullest first, forward
	// Fullest first: the move while a pass is begun, after another ring's
	// error ended the Consume before ring 0's turn (a commit used to write
	// over the other consumer's position).
	f.Add([]byte("9"), uint8(0x39), uint8(1), uint64(0), uint64(64), []byte{121}, uint8(0x5d))
	f.Fuzz(func(t *testing.T, mem []byte, n, bad uint8, cons, prod uint64, counts []byte, move uint8) {
		// n: rings-1 in bits 0-1; bit 7 ordered; bit 6, rings of 1 KiB,
		// which 9 records or more fill past an eighth, and an ordered read
		// first without a Flush, KeyWindow 1, the second half of each
		// ring's records written from inside it (the window's hot ring:
		// an intake while the reader delivers).
		size := 4096
		if n&0x40 != 0 {
			size = 1024
		}
		rings := int(n%4) + 1
		badRing := int(bad) % rings
		fr := newFakeBPFRings(t, rings, size)
		want := make([][]uint64, rings)
		discards := make([]uint64, rings)
		starts := make([][]uint64, rings)         // each good ring's records' positions
		seqAt := make([]map[uint64]uint64, rings) // and their seqs
		write := func(i, from, to int) {
			rb := fr.rings[i]
			for j := from; j < to; j++ {
				seq := uint64(i)<<32 | uint64(j)
				p, ok := rb.Reserve(8)
				if !ok {
					t.Fatal("no room")
				}
				starts[i] = append(starts[i], p)
				if seqAt[i] == nil {
					seqAt[i] = map[uint64]uint64{}
				}
				seqAt[i][p] = seq
				rb.Write(p, bpfPayload(seq))
				discard := j%3 == 2
				rb.Commit(p, discard)
				if discard {
					discards[i]++
				} else {
					want[i] = append(want[i], seq)
				}
			}
		}
		ordered := n&0x80 != 0
		busy := ordered && n&0x40 != 0
		later := make([]int, rings)    // records written during the first read
		found := make([]uint64, rings) // and before it, at opening
		for i, rb := range fr.rings {
			if i == badRing {
				rb.Put(0, mem[:min(len(mem), size)])
				rb.Pos[0], rb.Pos[1], rb.Prod = cons, prod, prod
				continue
			}
			var c int
			if i < len(counts) {
				c = int(counts[i] % 40)
			}
			now := c
			if busy {
				now = c / 2
			}
			write(i, 0, now)
			later[i], found[i] = c, uint64(now)
		}
		writeLater := func() {
			for i := range later {
				if c := later[i]; c > 0 {
					write(i, c/2, c)
					later[i] = 0
				}
			}
		}
		var r *Reader
		switch {
		case busy:
			r = fr.ordered(t, Order{MaxDelay: time.Hour, KeyWindow: 1})
		case ordered:
			r = fr.ordered(t, Order{MaxDelay: time.Hour})
		default:
			r = fr.reader(t, ReaderOptions{MaxLatency: -1})
			setBudget(r, 5*16, 2*16) // turns that end between records
		}
		// The other consumer: ring moved (a good one), before Consume
		// moveAt, to a record boundary picked by move's low bits.
		moved, moveAt := -1, int(move>>4)&3
		if move != 0 && rings > 1 {
			moved = (badRing + 1 + int(move>>6)%(rings-1)) % rings
		}
		var taken map[uint64]bool // seqs the other consumer took
		movedFrom, movedTo := uint64(0), uint64(0)
		got := make([][]uint64, rings)
		for call := 0; ; call++ {
			if call > 64 {
				t.Fatal("Consume still delivering or failing after 64 calls")
			}
			flush := ordered && (call > 0 || n&0x40 == 0)
			if busy && call > 0 {
				writeLater() // (if the first read delivered nothing)
			}
			if moved >= 0 && call == moveAt {
				rb := fr.rings[moved]
				movedFrom, movedTo = atomic.LoadUint64(&rb.Pos[0]), rb.Prod
				if k := int(move&15) % (len(starts[moved]) + 1); k < len(starts[moved]) {
					movedTo = starts[moved][k]
				}
				// The records the other consumer took that the reader has not
				// seen (past its head snapshot) are that consumer's alone;
				// those the reader saw, it may deliver too.
				seen := r.r.C.Rings[moved].Cur().Head()
				taken = map[uint64]bool{}
				for _, p := range starts[moved] {
					if seq, ok := seqAt[moved][p]; ok && int64(p-max(movedFrom, seen)) >= 0 && int64(p-movedTo) < 0 {
						taken[seq] = true
					}
				}
				atomic.StoreUint64(&rb.Pos[0], movedTo)
			}
			if flush {
				r.Flush() // (the window releases nothing else but a hot ring: shared rings, MaxDelay an hour)
			}
			r.SetDeadline(time.Now().Add(10 * time.Second)) // (never met, but by a spin)
			k, err := r.Consume(func(rec *Record) error {
				i := rec.Ring
				if i < 0 || i >= rings {
					t.Fatalf("record of ring %d", i)
				}
				if !ordered { // (the window hands out copies)
					checkInRing(t, fr.rings[i], rec.Data)
				}
				got[i] = append(got[i], seq8(rec.Data))
				if busy {
					writeLater()
				}
				return nil
			})
			var ce *CorruptError
			switch {
			case errors.Is(err, os.ErrDeadlineExceeded):
				t.Fatalf("Consume %d spins: %v", call, err)
			case err != nil && errors.As(err, &ce) && ce.Ring == moved && movedFrom != movedTo:
				if !strings.Contains(ce.Reason, "by another writer") {
					t.Fatalf("Consume: %v; want ring %d's consumer position changed by another writer", err, moved)
				}
			case err != nil && (!errors.As(err, &ce) || ce.Ring != badRing):
				t.Fatalf("Consume: %v; only ring %d may be corrupt", err, badRing)
			}
			if err == nil && k == 0 && (flush || !ordered) && (moved < 0 || call >= moveAt) {
				break
			}
		}
		if err := r.Close(); err != nil {
			t.Fatal(err)
		}
		for _, st := range r.Stats() {
			i := st.Ring
			if i == moved {
				// At most once, in order, none the other consumer took; the
				// move reported once; nothing left behind.
				k := 0
				for _, seq := range got[i] {
					for k < len(want[i]) && want[i][k] != seq {
						k++
					}
					if k == len(want[i]) || taken[seq] {
						t.Fatalf("ring %d (consumer_pos moved from %d to %d): delivered %v, want a part of %v without %v", i, movedFrom, movedTo, got[i], want[i], taken)
					}
					k++
				}
				// Reported once; or, moved forward while the reader had
				// parsed nothing of the ring, taken as its start (adopted).
				corrupt := uint64(0)
				if movedFrom != movedTo {
					corrupt = 1
				}
				adopted := int64(movedTo-movedFrom) > 0 && st.Corrupt == 0
				if st.Samples != uint64(len(got[i])) || st.Corrupt != corrupt && !adopted || st.Left != 0 {
					t.Errorf("ring %d (consumer_pos moved from %d to %d): delivered %d, Stats %+v; want %d corruption, nothing left", i, movedFrom, movedTo, len(got[i]), st, corrupt)
				}
				continue
			}
			if i == badRing {
				if st.Samples != uint64(len(got[i])) {
					t.Errorf("ring %d (arbitrary): delivered %d, Stats %+v", i, len(got[i]), st)
				}
				continue
			}
			if len(got[i]) != len(want[i]) {
				t.Fatalf("ring %d: delivered %v, want %v", i, got[i], want[i])
			}
			for j := range want[i] {
				if got[i][j] != want[i][j] {
					t.Fatalf("ring %d: delivered %v, want %v", i, got[i], want[i])
				}
			}
			if st.Samples != uint64(len(want[i])) || st.Discarded != discards[i] || st.Left != 0 || st.Corrupt != 0 || st.Found != found[i] {
				t.Errorf("ring %d: Stats %+v; want %d samples, %d discarded, %d found at opening, nothing left or corrupt", i, st, len(want[i]), discards[i], found[i])
			}
		}
	})
}

// checkInRing checks that data lies in rb's data area (both copies).
func checkInRing(t *testing.T, rb *ringtest.RingBuf, data []byte) {
	t.Helper()
	if len(data) == 0 {
		return
	}
	lo := uintptr(unsafe.Pointer(unsafe.SliceData(rb.Data)))
	p := uintptr(unsafe.Pointer(unsafe.SliceData(data)))
	if p < lo || p+uintptr(len(data)) > lo+uintptr(len(rb.Data)) {
		t.Fatalf("a record of %d bytes at %#x, outside the ring's area [%#x, %#x)", len(data), p, lo, lo+uintptr(len(rb.Data)))
	}
}
