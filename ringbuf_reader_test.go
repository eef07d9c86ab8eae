// SPDX-License-Identifier: Apache-2.0

package perfbuf

// Tests of the owners (Reader, PerfBuffer, RawBuffer) over fake BPF ring
// buffers: busy records, positions that cannot be valid, the ledger at
// Close (issue 29), and a reader opened again over a pinned ring buffer.

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/perfbuf/perfbuf/internal/owner"
	"github.com/perfbuf/perfbuf/internal/ring"
	"github.com/perfbuf/perfbuf/internal/ringtest"
	"github.com/perfbuf/perfbuf/internal/wait"
)

// fakeBPFRings are fake BPF ring buffers, each with an eventfd standing in
// for its map's descriptor: a commit that the kernel's rule makes wake the
// reader (consumer_pos at the record) signals it.
type fakeBPFRings struct {
	rings []*ringtest.RingBuf
	fds   []int
}

func newFakeBPFRings(t testing.TB, n, size int) *fakeBPFRings {
	t.Helper()
	f := &fakeBPFRings{}
	for range n {
		r := ringtest.NewRingBuf(size)
		fd := ringtest.EventFD(t)
		r.OnWake = func() { ringtest.Signal(fd) }
		f.rings = append(f.rings, r)
		f.fds = append(f.fds, fd)
	}
	return f
}

// core returns an owner core over readers of the rings; oneWriter[i]
// says ring i is one CPU's (an ordered Reader's rule 1).
func (f *fakeBPFRings) core(t testing.TB, oneWriter ...bool) *owner.Core {
	t.Helper()
	var rings []ring.Kind
	for _, r := range f.rings {
		rings = append(rings, bpfReader(t, r))
	}
	c, err := owner.Over(rings, f.fds, "", oneWriter)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// reader returns a Reader over the rings, closed when the test ends.
func (f *fakeBPFRings) reader(t testing.TB, opts ReaderOptions) *Reader {
	t.Helper()
	p, err := opts.plan()
	if err != nil {
		t.Fatal(err)
	}
	r := newReader(f.core(t), p)
	t.Cleanup(func() { r.Close() })
	return r
}

// perfBuffer returns a callback-mode PerfBuffer over the rings, closed when
// the test ends.
func (f *fakeBPFRings) perfBuffer(t testing.TB, sample func(int, []byte), lost func(int, uint64)) *PerfBuffer {
	t.Helper()
	pb := newPerfBuffer(f.core(t), sample, lost)
	t.Cleanup(func() { pb.Close() })
	return pb
}

// bpfPayload is an 8-byte sample carrying seq.
func bpfPayload(seq uint64) []byte { return binary.NativeEndian.AppendUint64(nil, seq) }

// seq8 is the seq of a bpfPayload sample, or 1<<63 + its length for a
// sample too short to be one (parsed from the middle of a record, say).
func seq8(data []byte) uint64 {
	if len(data) < 8 {
		return 1<<63 + uint64(len(data))
	}
	return binary.NativeEndian.Uint64(data)
}

// ringBufForm is one way of reading fake ring buffers: it reads once and
// returns the samples delivered (their seq) and the read's error.
type ringBufForm struct {
	name string
	// open builds the reader over f; read reads once, waiting at most
	// until a deadline where the form waits; stats returns the owner's
	// Stats (a RawBuffer's: its ring's).
	open func(t *testing.T, f *fakeBPFRings) (read func() ([]uint64, error), stats func() Stats)
	// reader is the Reader of the last open, for a Reader's form.
	reader *Reader
}

// ringBufForms are every form of reading a ring buffer: callback Poll (with
// a timeout) and Consume, raw Drain of ring 0, and the Reader's ReadInto,
// ReadBatch, Each (with a deadline) and Consume. Each read that waits waits
// at most wait.
func ringBufForms(wait time.Duration) []*ringBufForm {
	forms := []*ringBufForm{
		{name: "callback/Poll", open: func(t *testing.T, f *fakeBPFRings) (func() ([]uint64, error), func() Stats) {
			var got []uint64
			pb := f.perfBuffer(t, func(_ int, data []byte) { got = append(got, seq8(data)) }, nil)
			return func() ([]uint64, error) {
				got = nil
				_, err := pb.Poll(wait)
				return got, err
			}, pb.Stats
		}},
		{name: "callback/Consume", open: func(t *testing.T, f *fakeBPFRings) (func() ([]uint64, error), func() Stats) {
			var got []uint64
			pb := f.perfBuffer(t, func(_ int, data []byte) { got = append(got, seq8(data)) }, nil)
			return func() ([]uint64, error) {
				got = nil
				_, err := pb.Consume()
				return got, err
			}, pb.Stats
		}},
		{name: "raw/Drain", open: func(t *testing.T, f *fakeBPFRings) (func() ([]uint64, error), func() Stats) {
			b := newRawBuffer(bpfReader(t, f.rings[0]), nil)
			return func() ([]uint64, error) {
				var got []uint64
				_, err := b.Drain(func(rec *Record) error {
					got = append(got, seq8(rec.Data))
					return nil
				})
				if err != nil {
					b.SkipCorrupt()
				}
				return got, err
			}, b.Stats
		}},
	}
	for _, mode := range []string{"ReadInto", "ReadBatch", "Each", "Batches", "Consume"} {
		form := &ringBufForm{name: "reader/" + mode}
		form.open = func(t *testing.T, f *fakeBPFRings) (func() ([]uint64, error), func() Stats) {
			r := f.reader(t, ReaderOptions{MaxLatency: -1})
			form.reader = r
			return func() ([]uint64, error) {
				r.SetDeadline(time.Now().Add(wait))
				var got []uint64
				var err error
				switch mode {
				case "ReadInto":
					for err == nil {
						var s Sample
						if err = r.ReadInto(&s); err == nil {
							got = append(got, seq8(s.Data))
						}
					}
				case "ReadBatch":
					for err == nil {
						s := make([]Sample, 4)
						var n int
						n, err = r.ReadBatch(s)
						for _, s := range s[:n] {
							got = append(got, seq8(s.Data))
						}
					}
				case "Each", "Batches":
					err = eachIn(r, mode, context.Background(), func(rec *Record) error {
						got = append(got, seq8(rec.Data))
						return nil
					})
				case "Consume":
					_, err = r.Consume(func(rec *Record) error {
						got = append(got, seq8(rec.Data))
						return nil
					})
				}
				if errors.Is(err, os.ErrDeadlineExceeded) {
					err = nil // waited as for an empty ring
				}
				return got, err
			}, r.Stats
		}
		forms = append(forms, form)
	}
	return forms
}

// A busy record at the consumer position is legal and may last (a program
// preempted or asleep between reserve and submit): every form reads the
// ring as empty (Poll sleeps its timeout, Drain returns 0, the Reader's
// reads wait within their deadline, Consume returns what else there is),
// never spins, and the other ring's records go on flowing. The records
// committed behind the busy one come once it is committed. The Reader's
// forms used to spin past their deadline (fullest.next and endTurn over and
// over).
func TestRingBufBusyEveryForm(t *testing.T) {
	for _, form := range ringBufForms(50 * time.Millisecond) {
		t.Run(form.name, func(t *testing.T) {
			f := newFakeBPFRings(t, 2, 4096)
			read, _ := form.open(t, f)
			f.rings[0].Output(t, bpfPayload(1))
			busy, _ := f.rings[0].Reserve(8)
			f.rings[0].Write(busy, bpfPayload(2))
			behind, _ := f.rings[0].Reserve(8)
			f.rings[0].Write(behind, bpfPayload(3))
			f.rings[0].Commit(behind, false) // committed behind the busy one
			f.rings[1].Output(t, bpfPayload(10))
			want := "[1 10]"
			if form.name == "raw/Drain" {
				want = "[1]"
			}
			var got []uint64
			var err error
			within(t, "read at a busy record", func() { got, err = read() })
			if err != nil || fmt.Sprint(got) != want {
				t.Fatalf("first read: %v, %v; want %s", got, err, want)
			}
			// Still busy: the ring reads as empty, the other flows.
			f.rings[1].Output(t, bpfPayload(11))
			want = "[11]"
			if form.name == "raw/Drain" {
				want = "[]"
			}
			within(t, "read at a busy record", func() { got, err = read() })
			if err != nil || fmt.Sprint(got) != want {
				t.Fatalf("while busy: %v, %v; want %s", got, err, want)
			}
			f.rings[0].Commit(busy, false)
			within(t, "read after the commit", func() { got, err = read() })
			if err != nil || fmt.Sprint(got) != "[2 3]" {
				t.Fatalf("after the commit: %v, %v; want [2 3]", got, err)
			}
		})
	}
}

// A Reader asleep with no timeout, at a ring whose next record is busy, is
// woken by the record's commit: it committed everything before the record,
// so the kernel's commit finds consumer_pos at it and wakes the reader (the
// wake rule, ring.RingBuf.Settle), and the waiter takes that wakeup although
// producer_pos did not move (the commit moves no position). Meanwhile the
// other ring's records flow.
func TestRingBufBusyCommitWakes(t *testing.T) {
	for _, form := range []string{"Reader", "callback"} {
		t.Run(form, func(t *testing.T) {
			f := newFakeBPFRings(t, 2, 4096)
			var read func() ([]uint64, error) // waits with no timeout
			var w *wait.Waiter
			switch form {
			case "Reader":
				r := f.reader(t, ReaderOptions{MaxLatency: -1})
				read = func() ([]uint64, error) {
					var s Sample
					err := r.ReadInto(&s)
					return []uint64{seq8(s.Data)}, err
				}
				w = r.r.C.W
			case "callback":
				var got []uint64
				pb := f.perfBuffer(t, func(_ int, data []byte) { got = append(got, seq8(data)) }, nil)
				read = func() ([]uint64, error) {
					got = nil
					for len(got) == 0 {
						if _, err := pb.Poll(-1); err != nil {
							return got, err
						}
					}
					return got, nil
				}
				w = pb.pb.C.W
			}
			busy, _ := f.rings[0].Reserve(8)
			f.rings[0].Write(busy, bpfPayload(1))
			for seq := uint64(10); seq < 20; seq++ {
				f.rings[1].Output(t, bpfPayload(seq))
				within(t, "read", func() {
					if got, err := read(); err != nil || fmt.Sprint(got) != fmt.Sprint([]uint64{seq}) {
						t.Errorf("read = %v, %v; want %d from the other ring", got, err, seq)
					}
				})
				if t.Failed() {
					t.FailNow()
				}
			}
			type result struct {
				got []uint64
				err error
			}
			done := make(chan result, 1)
			go func() {
				got, err := read()
				done <- result{got, err}
			}()
			// Asleep: the read holds the waiter's turn, in the netpoller.
			for !w.Waiting() {
				select {
				case res := <-done:
					t.Fatalf("read returned %v, %v before the commit", res.got, res.err)
				default:
					time.Sleep(time.Millisecond)
				}
			}
			wakes := f.rings[0].Wakes.Load()
			f.rings[0].Commit(busy, false)
			if f.rings[0].Wakes.Load() != wakes+1 {
				t.Fatal("the commit raised no wakeup: consumer_pos was not at the busy record")
			}
			select {
			case res := <-done:
				if res.err != nil || fmt.Sprint(res.got) != "[1]" {
					t.Fatalf("read after the commit = %v, %v; want [1]", res.got, res.err)
				}
			case <-time.After(5 * time.Second):
				t.Fatal("the commit did not wake the reader")
			}
		})
	}
}

// A busy header that cannot be the kernel's (its length past the producer
// position, or busy and discarded at once) is a *CorruptError in every
// form, counted, and reading goes on past it, as a committed or discarded
// record's length past the producer is. Callback Poll and raw Drain used to
// read such a busy header as busy: 0 records, for good; the Reader's forms
// spun.
func TestRingBufBadBusyEveryForm(t *testing.T) {
	for _, bad := range []struct {
		name   string
		hdr    uint32
		reason string
	}{
		{"length past the producer", 64 | ringtest.BusyBit, "busy record length 64 (72 bytes with header and padding) past producer position 32"},
		{"busy and discarded", 8 | ringtest.BusyBit | ringtest.DiscardBit, "busy and discarded at once"},
		{"committed, length past the producer", 64, "record length 64 (72 bytes with header and padding) past producer position 32"},
		{"discarded, length past the producer", 64 | ringtest.DiscardBit, "record length 64 (72 bytes with header and padding) past producer position 32"},
	} {
		for _, form := range ringBufForms(50 * time.Millisecond) {
			t.Run(bad.name+"/"+form.name, func(t *testing.T) {
				f := newFakeBPFRings(t, 1, 4096)
				read, stats := form.open(t, f)
				f.rings[0].Output(t, bpfPayload(1))
				p, _ := f.rings[0].Reserve(8)
				f.rings[0].Put(p, ringtest.U32(bad.hdr))
				var got []uint64
				var err error
				within(t, "read at a bad busy header", func() { got, err = read() })
				var ce *CorruptError
				if !errors.As(err, &ce) || !strings.Contains(ce.Reason, bad.reason) || ce.Pos != p {
					t.Fatalf("read = %v, %v; want a CorruptError at %d: %q", got, err, p, bad.reason)
				}
				if fmt.Sprint(got) != "[1]" && !strings.HasPrefix(form.name, "reader/") {
					t.Errorf("delivered %v before the error, want [1]", got)
				}
				if st := stats(); st.Corrupt != 1 {
					t.Errorf("stats %+v; want the corruption counted", st)
				}
				f.rings[0].Prod = f.rings[0].Pos[1]
				f.rings[0].Output(t, bpfPayload(2))
				within(t, "read past the error", func() { got, err = read() })
				if err != nil || fmt.Sprint(got) != "[2]" && fmt.Sprint(got) != "[1 2]" {
					t.Fatalf("read past the error: %v, %v; want [2]", got, err)
				}
			})
		}
	}
}

// Positions that cannot be the kernel's are reported by every form on the
// read that meets them, counted, and reading goes on from producer_pos:
// producer_pos behind consumer_pos (also after a Flush, which ReadInto,
// ReadBatch and Each used to end with ErrFlushed without a look at the
// ring); a consumer_pos ahead of producer_pos when the reader opens (never
// reported: once the kernel wrote past it, the reader parsed from the middle
// of a record); a consumer_pos written by someone else while the ring is
// quiet (Consume used to miss it, a later read reported it).
func TestRingBufBadPositionsEveryForm(t *testing.T) {
	for _, tc := range []struct {
		name   string
		before func(t *testing.T, f *ringtest.RingBuf) // before the reader opens
		after  func(t *testing.T, f *ringtest.RingBuf) // after its first read (of an empty ring)
		flush  bool
		reason string
	}{
		{name: "producer behind consumer", after: func(t *testing.T, f *ringtest.RingBuf) {
			f.Output(t, bpfPayload(1))
			f.Pos[0] = 4096
		}, reason: "4096"},
		{name: "producer behind consumer after Flush", after: func(t *testing.T, f *ringtest.RingBuf) {
			f.Output(t, bpfPayload(1))
			f.Pos[0] = 4096
		}, flush: true, reason: "4096"},
		{name: "producer behind consumer at open, after Flush", before: func(t *testing.T, f *ringtest.RingBuf) {
			f.Output(t, bpfPayload(1))
			f.Pos[0] = 4096
		}, after: func(*testing.T, *ringtest.RingBuf) {}, flush: true, reason: "consumer position 4096 past producer position 16"},
		{name: "consumer ahead at open", before: func(t *testing.T, f *ringtest.RingBuf) {
			f.Pos[0] = 16
		}, after: func(t *testing.T, f *ringtest.RingBuf) {
			f.Output(t, make([]byte, 24)) // the kernel writes past it: 0 to 32
		}, reason: "consumer position 16 past producer position 0"},
		{name: "consumer written while quiet", after: func(t *testing.T, f *ringtest.RingBuf) {
			f.Pos[0] = 8
		}, reason: "consumer position changed from 0 to 8 by another writer"},
	} {
		for _, form := range ringBufForms(50 * time.Millisecond) {
			if tc.flush && !strings.HasPrefix(form.name, "reader/") {
				continue
			}
			t.Run(tc.name+"/"+form.name, func(t *testing.T) {
				f := newFakeBPFRings(t, 1, 4096)
				if tc.before != nil {
					tc.before(t, f.rings[0])
				}
				read, stats := form.open(t, f)
				if tc.before == nil {
					within(t, "first read", func() {
						if got, err := read(); len(got) != 0 || err != nil {
							t.Errorf("first read: %v, %v", got, err)
						}
					})
				}
				tc.after(t, f.rings[0]) // (before the first read if the positions were bad at open)
				if tc.flush {
					form.reader.Flush()
				}
				var got []uint64
				var err error
				within(t, "read at bad positions", func() { got, err = read() })
				var ce *CorruptError
				if !errors.As(err, &ce) || !strings.Contains(ce.Reason, tc.reason) {
					t.Fatalf("read = %v, %v; want a CorruptError: %q", got, err, tc.reason)
				}
				if len(got) != 0 {
					t.Errorf("delivered %v from bad positions", got)
				}
				if st := stats(); st.Corrupt != 1 {
					t.Errorf("stats %+v; want the corruption counted once", st)
				}
				// On from producer_pos.
				r := f.rings[0]
				if r.Pos[0] != r.Pos[1] {
					t.Fatalf("consumer_pos %d, producer_pos %d after the error", r.Pos[0], r.Pos[1])
				}
				r.Prod = r.Pos[1]
				r.Output(t, bpfPayload(2))
				within(t, "read past the error", func() { got, err = read() })
				if tc.flush && len(got) == 0 && (err == nil || errors.Is(err, ErrFlushed)) {
					// The Flush is done once the error is reported.
					within(t, "read past the flush", func() { got, err = read() })
				}
				if err != nil || fmt.Sprint(got) != "[2]" {
					t.Fatalf("read past the error: %v, %v; want [2]", got, err)
				}
			})
		}
	}
}

// The ledger at Close is exact for a ring buffer: per ring, the samples
// delivered + Discarded + Left are the records that reached the ring,
// whatever was read before Close. The discarded records left unread used to
// be in no count (Left counts samples, Discarded only what was read).
func TestRingBufCloseLedger(t *testing.T) {
	const outputs = 40
	discarded := func(seq uint64) bool { return seq%3 == 1 }
	for _, form := range []string{"reader", "callback"} {
		for _, read := range []int{0, 1, 5, 13, outputs} {
			t.Run(fmt.Sprintf("%s/read %d", form, read), func(t *testing.T) {
				f := newFakeBPFRings(t, 1, 4096)
				for seq := range uint64(outputs) {
					p, ok := f.rings[0].Reserve(8)
					if !ok {
						t.Fatal("no room")
					}
					f.rings[0].Write(p, bpfPayload(seq))
					f.rings[0].Commit(p, discarded(seq))
				}
				var stats func() Stats
				var closer func() error
				got := 0
				switch form {
				case "reader":
					r := f.reader(t, ReaderOptions{MaxLatency: -1})
					setBudget(r, 7*16, 3*16) // turns that end between records
					r.SetDeadline(time.Now().Add(time.Second))
					var s Sample
					for got < read {
						if err := r.ReadInto(&s); err != nil {
							break
						}
						got++
					}
					stats, closer = r.Stats, r.Close
				case "callback":
					pb := f.perfBuffer(t, func(int, []byte) { got++ }, nil)
					if read > 0 {
						if _, err := pb.Consume(); err != nil {
							t.Fatal(err)
						}
					}
					stats, closer = pb.Stats, pb.Close
				}
				if err := closer(); err != nil {
					t.Fatal(err)
				}
				// The sums, and the one ring's entry.
				all := stats()
				for _, st := range []Stats{all, all.Rings[0]} {
					if st.Samples != uint64(got) || st.Samples+st.Discarded+st.Left != outputs {
						t.Fatalf("delivered %d, stats %+v: %d + discarded %d + left %d != %d outputs",
							got, st, st.Samples, st.Discarded, st.Left, outputs)
					}
				}
			})
		}
	}
}

// Poll over a BPF ring buffer does not sleep on a record that no wakeup will announce: one
// committed while the drain before was still behind it (the reader read its header busy,
// the kernel's commit then found consumer_pos short of it, the reader stored consumer_pos
// up to it). Poll settles the ring first, as a Reader's read does, and drains it. It used to
// wait its whole timeout and return 0, the record left in the ring (with no timeout, for
// good).
func TestPollRingBufMissedWakeup(t *testing.T) {
	f := ringtest.NewRingBuf(4096)
	fd := ringtest.EventFD(t)
	f.OnWake = func() { ringtest.Signal(fd) }
	c, err := owner.Over([]ring.Kind{bpfReader(t, f)}, []int{fd}, "", nil)
	if err != nil {
		t.Fatal(err)
	}
	var got []byte
	pb := newPerfBuffer(c, func(_ int, data []byte) { got = append(got, data[0]) }, nil)
	defer pb.Close()

	f.Output(t, []byte{1, 0, 0, 0, 0, 0, 0, 0}) // wakes: consumer_pos is at it
	busy, ok := f.Reserve(8)                    // reserved before the wait looks
	if !ok {
		t.Fatal("no room")
	}
	f.Write(busy, []byte{2, 0, 0, 0, 0, 0, 0, 0})
	if n, err := pb.Poll(time.Second); n != 1 || err != nil {
		t.Fatalf("first Poll = %d, %v; want the first record", n, err)
	}
	f.CommitMissed(busy)
	// A Poll that waited for nothing to wake it would time out with 0.
	if n, err := pb.Poll(5 * time.Second); n != 1 || err != nil {
		t.Fatalf("second Poll = %d, %v; want the second record", n, err)
	}
	if fmt.Sprint(got) != "[1 2]" {
		t.Errorf("delivered %v, want [1 2]", got)
	}
}

// A record committed between the read's store of consumer_pos and its
// second look at producer_pos, without a wakeup (the commit looked at
// consumer_pos before the store), is read before the reader sleeps: the
// kernel would not wake it for that record.
func TestReaderReadsPastAMissedWakeup(t *testing.T) {
	f := newFakeBPFRings(t, 1, 4096)
	r := f.reader(t, ReaderOptions{MaxLatency: -1})
	rb := r.r.C.Kinds[0].(*ring.RingBuf)
	committed := false
	rb.SettleHook = func() {
		if !committed {
			committed = true
			pos, _ := f.rings[0].Reserve(16)
			f.rings[0].Write(pos, make([]byte, 16))
			f.rings[0].CommitMissed(pos)
		}
	}
	r.SetDeadline(time.Now().Add(10 * time.Second)) // a detector of the stall, not a bound on speed
	var s Sample
	if err := r.ReadInto(&s); err != nil || !committed {
		t.Fatalf("ReadInto = %v (the record committed in Settle: %v)", err, committed)
	}
}

// Within a latency budget a Reader of ring buffers that caught up stores
// consumer_pos at the start of the last record it delivered, not past it:
// the kernel wakes nobody for the records after it, and the reader looks
// again on its timer. A look that finds nothing new stores the tail, so
// that the next record wakes the reader. Another ring's first record, and
// a forced wakeup, still wake it. Without a budget every record after the
// reader caught up raises a wakeup. (The budget is an hour, so that no
// timer looks; each step waits for the reader's state, never for a time.)
func TestReaderRingBufBudget(t *testing.T) {
	const size = 4096
	rec := make([]byte, 40) // 48 bytes a record in the ring
	t.Run("budget", func(t *testing.T) {
		f := newFakeBPFRings(t, 2, size)
		r := f.reader(t, ReaderOptions{MaxLatency: time.Hour})
		var s Sample
		// read reads one record in the background; parked waits until
		// that read is in a wait after wakeups ring wakeups, failing if it
		// returned instead. The wait has looked at the rings in the
		// netpoller (Parked, not only Waiting: holding the turn), so that
		// a record output from then on ends it as a wakeup, not at once.
		var got chan error
		read := func() {
			got = make(chan error, 1)
			go func() { got <- r.ReadInto(&s) }()
		}
		parked := func(wakeups uint64) {
			t.Helper()
			for r.r.C.W.Wakeups() < wakeups || !r.r.C.W.Parked() {
				select {
				case err := <-got:
					t.Fatalf("the read returned (%v, ring %d) while it should wait", err, s.Ring)
				case <-time.After(time.Millisecond):
				}
			}
		}
		wakes := func(want0, want1 int64) {
			t.Helper()
			if w0, w1 := f.rings[0].Wakes.Load(), f.rings[1].Wakes.Load(); w0 != want0 || w1 != want1 {
				t.Fatalf("wakeups raised: ring 0 %d, ring 1 %d; want %d, %d", w0, w1, want0, want1)
			}
		}

		read()
		parked(0)
		first := f.rings[0].Output(t, rec) // ring 0's first record: woken, delivered at once
		if err := <-got; err != nil || s.Ring != 0 {
			t.Fatalf("the first record: %v, ring %d", err, s.Ring)
		}
		if c := atomic.LoadUint64(&f.rings[0].Pos[0]); c != first {
			t.Fatalf("consumer_pos %d after the first record; want %d, its start (held back)", c, first)
		}
		read()
		parked(1)
		for range 10 {
			f.rings[0].Output(t, rec) // no wakeup: consumer_pos is held back
		}
		wakes(1, 0)
		f.rings[1].Output(t, rec) // ring 1's first: woken
		if err := <-got; err != nil || s.Ring != 0 {
			t.Errorf("after ring 1's first record: %v, ring %d; want the fullest, 0", err, s.Ring)
		}
		for range 10 {
			if err := r.ReadInto(&s); err != nil {
				t.Fatal(err)
			}
		}
		wakes(1, 1)

		// A forced wakeup reaches a ring that holds a record back.
		read()
		parked(2)
		pos, ok := f.rings[0].Reserve(len(rec))
		if !ok {
			t.Fatal("no room")
		}
		f.rings[0].CommitForce(pos)
		if err := <-got; err != nil || s.Ring != 0 {
			t.Fatalf("after a forced wakeup: %v, ring %d", err, s.Ring)
		}
		wakes(2, 1)

		// A wait that brought nothing new (its deadline ended it): the
		// next read stores the tails, and ring 0's next record wakes it.
		r.SetDeadline(time.Now().Add(5 * time.Millisecond))
		if err := r.ReadInto(&s); !errors.Is(err, os.ErrDeadlineExceeded) {
			t.Fatalf("a read of nothing: %v", err)
		}
		r.SetDeadline(time.Time{})
		read()
		parked(3)
		for i, rb := range f.rings {
			if c, p := atomic.LoadUint64(&rb.Pos[0]), atomic.LoadUint64(&rb.Pos[1]); c != p {
				t.Fatalf("ring %d: consumer_pos %d, producer_pos %d, after a wait with nothing new; want them equal", i, c, p)
			}
		}
		f.rings[0].Output(t, rec)
		if err := <-got; err != nil {
			t.Fatal(err)
		}
		wakes(3, 1)
	})
	t.Run("no budget", func(t *testing.T) {
		f := newFakeBPFRings(t, 1, size)
		r := f.reader(t, ReaderOptions{MaxLatency: -1})
		r.SetDeadline(time.Now().Add(time.Minute))
		for i := range 5 {
			done := make(chan error, 1)
			var s Sample
			go func() { done <- r.ReadInto(&s) }()
			for !r.r.C.W.Waiting() && len(done) == 0 {
				time.Sleep(time.Millisecond) // the read parks (or has returned)
			}
			f.rings[0].Output(t, rec)
			if err := <-done; err != nil {
				t.Fatal(err)
			}
			if w := f.rings[0].Wakes.Load(); w != int64(i+1) {
				t.Fatalf("record %d: %d wakeups raised, want one a record", i+1, w)
			}
		}
	})
}

// Reopening: a Reader opened again over the memory of ring buffers that a
// closed Reader read (a pinned map opened again) goes on where that one
// stopped, and its Stats say what it found (issue 30, item 7).

// A second Reader over the same ring buffers goes on with the first record
// the first one did not deliver: every record is delivered once, by one of
// the two, none skipped. Close committed everything the first delivered,
// the record a function failed on included, and the second's Found is what
// the first left (Left, and the discarded records among them). Per ring,
// the readers' Samples + Discarded + Left - Found add up to what reached
// the ring while they were open; the first's Found, what was there before
// it. Two rings, as an array of ring buffers with a ring per CPU has.
func TestRingBufReopen(t *testing.T) {
	const perRing = 30
	const samples = 2*perRing - 2*perRing/5 // the first outputs' samples: 1 in 5 discarded
	discarded := func(seq uint64) bool { return seq%5 == 3 }
	for _, form := range []string{"ReadInto", "Consume failing"} {
		for _, read := range []int{0, 1, 7, 30, samples} {
			t.Run(fmt.Sprintf("%s/read %d", form, read), func(t *testing.T) {
				f := newFakeBPFRings(t, 2, 4096)
				outputs := make([]uint64, 2) // records that reached each ring
				wantSamples := map[uint64]bool{}
				output := func(n int) {
					seq := uint64(len(wantSamples)) << 8 // fresh seqs, apart from the discards'
					for i := range 2 * n {
						r := i % 2
						seq++
						p, ok := f.rings[r].Reserve(8)
						if !ok {
							t.Fatal("no room")
						}
						f.rings[r].Write(p, bpfPayload(seq))
						f.rings[r].Commit(p, discarded(seq))
						outputs[r]++
						if !discarded(seq) {
							wantSamples[seq] = true
						}
					}
				}
				output(perRing)
				got := map[uint64]int{}

				r1 := f.reader(t, ReaderOptions{MaxLatency: -1})
				setBudget(r1, 5*16, 2*16) // turns that end between records
				n := 0
				switch form {
				case "ReadInto":
					r1.SetDeadline(time.Now().Add(time.Second))
					var s Sample
					for n < read {
						if err := r1.ReadInto(&s); err != nil {
							t.Fatalf("ReadInto after %d: %v", n, err)
						}
						got[seq8(s.Data)]++
						n++
					}
				case "Consume failing":
					// The function fails on the read-th record: delivered all
					// the same (the read does not give it again).
					errFull := errors.New("full")
					for n < read {
						_, err := r1.Consume(func(rec *Record) error {
							got[seq8(rec.Data)]++
							n++
							if n == read {
								return errFull
							}
							return nil
						})
						if err != nil && !errors.Is(err, errFull) || err == nil && n < read {
							t.Fatalf("Consume after %d: %v", n, err)
						}
					}
				}
				if err := r1.Close(); err != nil {
					t.Fatal(err)
				}
				st1 := r1.Stats().Rings

				r2 := f.reader(t, ReaderOptions{MaxLatency: -1})
				opened := r2.Stats().Rings
				output(5) // and more while it reads
				if _, err := r2.Consume(func(rec *Record) error {
					got[seq8(rec.Data)]++
					return nil
				}); err != nil {
					t.Fatal(err)
				}
				if err := r2.Close(); err != nil {
					t.Fatal(err)
				}
				st2 := r2.Stats().Rings

				for seq := range wantSamples {
					if got[seq] != 1 {
						t.Errorf("sample %d delivered %d times", seq, got[seq])
					}
				}
				if len(got) != len(wantSamples) {
					t.Errorf("delivered %d different samples, want %d", len(got), len(wantSamples))
				}
				var samples1 uint64
				for i := range 2 {
					a, b := st1[i], st2[i]
					samples1 += a.Samples
					if a.Found != perRing || opened[i].Found != b.Found {
						t.Errorf("ring %d: Found %d at the first opening, %d and %d at the second's; want %d, what was output before it", i, a.Found, opened[i].Found, b.Found, perRing)
					}
					// What the first left, discarded records included, is
					// what the second found: it counts them again.
					if b.Found < a.Left || b.Found-a.Left > a.Discarded {
						t.Errorf("ring %d: found %d, the first reader left %d (discarded %d)", i, b.Found, a.Left, a.Discarded)
					}
					sum := a.Samples + a.Discarded + a.Left - a.Found + b.Samples + b.Discarded + b.Left - b.Found
					if sum+a.Found != outputs[i] || b.Left != 0 {
						t.Errorf("ring %d: Stats %+v then %+v: sum %d, want %d, nothing left", i, a, b, sum, outputs[i])
					}
				}
				if samples1 != uint64(n) {
					t.Errorf("the first reader delivered %d, its Samples say %d", n, samples1)
				}
			})
		}
	}
}
