// SPDX-License-Identifier: Apache-2.0

package perfbuf

// Tests of the ordered Reader (Options.Order): the merge, its release
// rules, its runs, and a model check of it (TestOrderedModel,
// FuzzOrderedModel), over fake perf rings and over fake ring buffers. The
// fake rings are in fakes_test.go.

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand"
	"os"
	"reflect"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/perfbuf/perfbuf/internal/ringtest"
	"golang.org/x/sys/unix"
)

// forever is a MaxDelay that never comes: rule 3 never releases, and rule
// 2's window, 73 years in nanoseconds, is past every key of these tests.
const forever = time.Duration(1 << 61)

// The ordered Reader merges rings by key; with every ring holding records
// (rule 1), nothing waits for MaxDelay.
func TestOrderedMerge(t *testing.T) {
	for _, mode := range []string{"ReadInto", "Each", "Batches"} {
		t.Run(mode, func(t *testing.T) {
			const rings, n = 3, 600
			f := newFakeRings(t, rings, 1<<15)
			rng := rand.New(rand.NewSource(1))
			var keys [rings]uint64
			var ringOf [n + rings]int
			for seq := 0; seq < n; seq++ {
				i := rng.Intn(rings)
				keys[i] += uint64(rng.Intn(50)) // equal keys too, across rings and within one
				f.emit(t, i, keys[i], uint64(seq), 16+rng.Intn(64))
				ringOf[seq] = i
			}
			// A last record on each ring with a key above all others lets
			// rule 1 release everything before it.
			for i := 0; i < rings; i++ {
				f.emit(t, i, 1<<40, uint64(n+i), 16)
			}
			o := f.ordered(t, Order{MaxDelay: time.Hour})
			got := readOrdered(t, o, mode, n)
			seen := map[uint64]bool{}
			for j, s := range got {
				if j > 0 && (s.Key < got[j-1].Key || s.Late) {
					t.Fatalf("record %d: key %d after %d (late %v)", j, s.Key, got[j-1].Key, s.Late)
				}
				if s.Key != keyOf(s) {
					t.Fatalf("record %d: Key %d, payload says %d", j, s.Key, keyOf(s))
				}
				seq := seqOf(s.Data)
				if seen[seq] {
					t.Fatalf("seq %d delivered twice", seq)
				}
				seen[seq] = true
				if s.Type != RecordSample || s.CPU != ringOf[seq] {
					t.Fatalf("record %d: seq %d, a %v from cpu %d; it was written to ring %d", j, seq, s.Type, s.CPU, ringOf[seq])
				}
			}
		})
	}
}

// An idle ring holds nothing back forever: a record is released after
// MaxDelay (rule 3) or once a key MaxDelay (in nanoseconds) larger is seen
// (rule 2). A record that then arrives behind a released key is late:
// delivered with Late set, and counted.
func TestOrderedIdleRingAndLate(t *testing.T) {
	const delay = 20 * time.Millisecond
	const ms = uint64(time.Millisecond) // keys in nanoseconds: rule 2's window is 20 ms
	f := newFakeRings(t, 2, 1<<14)
	o := f.ordered(t, Order{MaxDelay: delay})
	f.emit(t, 0, 2*ms, 0, 16)
	o.SetDeadline(time.Now().Add(10 * time.Second))
	got := readN(t, o, 1) // rule 3: after ~20 ms
	if got[0].Key != 2*ms {
		t.Fatalf("first key %d", got[0].Key)
	}
	f.emit(t, 0, 100*ms, 1, 16) // released by rule 2 once 140 ms is seen
	f.emit(t, 0, 140*ms, 2, 16) // the newest: released by rule 3
	f.emit(t, 1, 1*ms, 3, 16)   // behind 2 ms, already released: late
	want, wantLate := []uint64{1 * ms, 100 * ms, 140 * ms}, []bool{true, false, false}
	var keys []uint64
	var late []bool
	for len(keys) < len(want) {
		var s Sample
		if err := o.ReadInto(&s); err != nil {
			t.Fatal(err)
		}
		keys, late = append(keys, s.Key), append(late, s.Late)
	}
	if fmt.Sprint(keys) != fmt.Sprint(want) || fmt.Sprint(late) != fmt.Sprint(wantLate) {
		t.Errorf("keys %v late %v, want %v %v", keys, late, want, wantLate)
	}
	if st := o.Stats(); st.Rings[1].Late != 1 || st.Rings[0].Late != 0 || st.Late != 1 {
		t.Errorf("stats %+v; want ring 1's sample late", st)
	}
}

// Rule 3 with an idle ring: records that the reader first saw together are
// due together, MaxDelay later, not one MaxDelay after another.
func TestOrderedMaxDelayBacklog(t *testing.T) {
	f := newFakeRings(t, 2, 1<<16)
	const delay = 50 * time.Millisecond
	o := f.ordered(t, Order{MaxDelay: delay}) // keys 10 to 510: rule 2 never releases
	const n = 100
	for seq := uint64(0); seq < n; seq++ {
		f.emit(t, 0, 10+seq, seq, 24)
	}
	start := time.Now()
	o.SetDeadline(start.Add(n * delay / 2)) // one MaxDelay after another would take n*delay
	readN(t, o, n)
	if took := time.Since(start); took < delay {
		t.Errorf("released after %v, before MaxDelay %v", took, delay)
	}
	// Records written one at a time while the reader waits, each in a new
	// head snapshot: each is held MaxDelay (less the marks' grain of
	// MaxDelay/32) from when it was written, or longer. (That the marks
	// that date them do not pile up: internal/policy's
	// TestOrderedMarksMerged.)
	const m = 400
	written := map[uint64]time.Time{}
	read := n
	check := func(s Sample) {
		read++
		seq := binary.NativeEndian.Uint64(s.Data[8:])
		if held := time.Since(written[seq]); held < delay-delay/32 {
			t.Fatalf("record %d released after %v, MaxDelay is %v", seq, held, delay)
		}
	}
	for seq := uint64(n); seq < n+m; seq++ {
		written[seq] = time.Now()
		f.emit(t, 0, 10+seq, seq, 24)
		var s Sample
		o.SetDeadline(time.Now().Add(200 * time.Microsecond))
		if err := o.ReadInto(&s); err == nil {
			check(s)
		} else if !errors.Is(err, os.ErrDeadlineExceeded) {
			t.Fatal(err)
		}
	}
	o.SetDeadline(time.Now().Add(10 * time.Second))
	for read < n+m {
		var s Sample
		if err := o.ReadInto(&s); err != nil {
			t.Fatal(err)
		}
		check(s)
	}
}

// Holding records fills rings: past HighWater the reader releases instead
// of letting the ring overflow.
func TestOrderedHighWater(t *testing.T) {
	f := newFakeRings(t, 2, 4096)
	o := f.ordered(t, Order{MaxDelay: time.Hour, HighWater: 1024})
	seq := uint64(0)
	for f.rings[0].Space() > 1024 {
		f.emit(t, 0, 10+seq, seq, 40)
		seq++
	}
	o.SetDeadline(time.Now().Add(10 * time.Second))
	got := readN(t, o, int(seq)-1024/56)
	for j := 1; j < len(got); j++ {
		if got[j].Key < got[j-1].Key {
			t.Fatalf("out of order at %d", j)
		}
	}
	if used := o.r.C.Rings[0].Cur().Used(); used > 2048 {
		t.Errorf("ring still holds %d bytes after releasing past high water", used)
	}
}

// The default HighWater is a quarter of a ring, below the half at which a
// perf ring wakes a Reader within its latency budget: the ring's wakeup
// itself releases what it holds (rule 4) while another ring is idle, so
// that a ring never waits full for its next wakeup. (At three quarters a
// reader woken at half released nothing, and the next wakeup came at a
// full ring.) Only rule 4 can release here: MaxDelay and the budget are
// an hour.
func TestOrderedDefaultHighWater(t *testing.T) {
	const size = 4096
	f := newFakeRings(t, 2, size)
	o := f.reader(t, ReaderOptions{MaxLatency: time.Hour, Order: &Order{MaxDelay: time.Hour}})
	seq := uint64(0)
	for f.rings[0].Space() > size/2 {
		f.emit(t, 0, 10+seq, seq, 40)
		seq++
	}
	f.wake(0)
	o.SetDeadline(time.Now().Add(time.Minute))
	var s Sample
	if err := o.ReadInto(&s); err != nil {
		t.Fatalf("a ring past half, the other idle: %v; want its first record", err)
	}
	if key := binary.NativeEndian.Uint64(s.Data); key != 10 {
		t.Errorf("first record's key %d, want 10", key)
	}
}

// Producers on both rings with timestamps race the ordered reader: output
// is in key order, nothing lost or duplicated, late records counted.
func TestOrderedRace(t *testing.T) {
	n := 50000
	if testing.Short() || ringtest.RaceEnabled() {
		n = 5000
	}
	f := newFakeRings(t, 2, 1<<14)
	o := f.reader(t, ReaderOptions{MaxLatency: time.Millisecond, Order: &Order{MaxDelay: 5 * time.Millisecond}})
	epoch := time.Now()
	var clock sync.Mutex // keys from one clock, as bpf_ktime_get_ns
	now := func() uint64 {
		clock.Lock()
		defer clock.Unlock()
		return uint64(time.Since(epoch))
	}
	var wg sync.WaitGroup
	for i := 0; i < 2; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			for seq := uint64(0); seq < uint64(n); {
				if f.rings[i].Write(ringtest.PerfSample(payload(now(), seq, 24))) {
					seq++
					f.rings[i].Publish()
				} else {
					f.rings[i].Lost = 0
					time.Sleep(20 * time.Microsecond)
				}
			}
		}(i)
	}
	next := [2]uint64{}
	var last uint64
	late := 0
	var s Sample
	o.SetDeadline(time.Now().Add(60 * time.Second))
	for total := 0; total < 2*n; total++ {
		if err := o.ReadInto(&s); err != nil {
			t.Fatalf("after %d: %v", total, err)
		}
		seq := binary.NativeEndian.Uint64(s.Data[8:])
		if seq != next[s.CPU] {
			t.Fatalf("ring %d: seq %d, want %d", s.CPU, seq, next[s.CPU])
		}
		next[s.CPU]++
		if s.Late {
			late++
		} else {
			if s.Key < last {
				t.Fatalf("key %d after %d, not marked late", s.Key, last)
			}
			last = s.Key
		}
	}
	wg.Wait()
	st := o.Stats()
	if int(st.Rings[0].Late+st.Rings[1].Late) != late || int(st.Late) != late {
		t.Errorf("stats count %d late (%d in the sums), saw %d", st.Rings[0].Late+st.Rings[1].Late, st.Late, late)
	}
	t.Logf("%d records, %d late", 2*n, late)
}

// A corrupt record in one ring: the ordered Reader delivers the records held
// before it intact (the ring's space is not handed back under them), skips
// the rest of that ring's snapshot, reports that once as a *CorruptError
// (counted), and goes on with what is written after.
func TestOrderedCorrupt(t *testing.T) {
	f := newFakeRings(t, 2, 4096)
	o := f.ordered(t, Order{MaxDelay: time.Hour})
	for seq := uint64(0); seq < 3; seq++ {
		f.emit(t, 0, 10+seq, seq, 200) // 216 bytes each
	}
	f.rings[0].MustWrite(t, ringtest.PerfRecord(unix.PERF_RECORD_SAMPLE, 0, make([]byte, 8))) // at 648, 16 bytes: size 0
	// Parse ahead and hold the three (ring 1 is empty: nothing releases
	// them), hitting the corrupt record.
	o.SetDeadline(time.Now().Add(20 * time.Millisecond))
	var s Sample
	if err := o.ReadInto(&s); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("read: %v, want the deadline (records held)", err)
	}
	// A producer fills whatever space the reader handed back.
	for f.rings[0].Write(ringtest.PerfSample(payload(0, 99, 200))) {
	}
	f.rings[0].Lost = 0
	f.rings[0].Publish()
	o.Flush()
	o.SetDeadline(time.Now().Add(5 * time.Second))
	got := readN(t, o, 3)
	for j, s := range got {
		if seq := seqOf(s.Data); seq != uint64(j) {
			t.Fatalf("record %d: seq %d: overwritten while held", j, seq)
		}
		for k := 16; k < 200; k++ {
			if s.Data[k] != byte(j)+byte(k) {
				t.Fatalf("record %d byte %d overwritten while held", j, k)
			}
		}
	}
	// The rest, written after the corrupt record (key 0: late), and the
	// corruption, reported once; the ring is usable again.
	rest, errs := readUntilFlushed(t, o, "ReadInto")
	var ce *CorruptError
	if len(errs) != 1 || !errors.As(errs[0], &ce) || ce.CPU != 0 || ce.Pos != 648 || ce.Reason != "record size 0" {
		t.Fatalf("errors %v; want one *CorruptError at 648", errs)
	}
	for _, s := range rest {
		if seqOf(s.Data) != 99 || !s.Late || s.CPU != 0 {
			t.Fatalf("after the corrupt record: seq %d late %v cpu %d; want seq 99, late", seqOf(s.Data), s.Late, s.CPU)
		}
	}
	st := o.Stats()
	if r := st.Rings[0]; len(rest) == 0 || r.Samples != uint64(3+len(rest)) || r.Late != uint64(len(rest)) || r.Corrupt != 1 || st.Corrupt != 1 {
		t.Errorf("%d records after the corrupt one; stats %+v; want 1 corruption", len(rest), st)
	}
	f.emit(t, 0, 1000, 7, 200)
	f.emit(t, 1, 1001, 8, 200)
	o.Flush()
	after := readN(t, o, 2)
	if after[0].Key != 1000 || after[1].Key != 1001 {
		t.Errorf("after the skip: keys %d, %d", after[0].Key, after[1].Key)
	}
}

// A model check of the merge. Three small rings are written at random,
// with keys from one clock as timestamps are; rings fill up and lose
// samples, and ring 2's records are often stamped a while before they are
// written, as a delayed CPU's are. They are read with ReadInto and with
// Each in turns, with Flush now and then (which releases what waits), and
// with stalls in which the reader is away and the rings overflow. The key
// window (rule 2: MaxDelay in key units, 500 clock ticks here) and the
// flushes let larger keys go before ring 2's records, which then come
// late. Checked: each ring's samples come in its order, each once; a
// sample that never comes was reported lost; a sample is marked late
// exactly when a larger key went before it; the counts add up to what was
// written.
//
// Under rule 1 alone (no key window, no high water, no Flush until the end)
// nothing may come late: then every record is checked to go in key order.
//
// With more rings (9 here; 3 to 9 when fuzzed) the merge's heap is deeper
// and more rings are idle at a time.
func TestOrderedModel(t *testing.T) {
	for _, mode := range []string{"rules", "rule1"} {
		for _, rings := range []int{3, 9} {
			for seed := int64(1); seed <= 3; seed++ {
				t.Run(fmt.Sprintf("%s/rings=%d/seed=%d", mode, rings, seed), func(t *testing.T) {
					orderedModel(t, mode, rings, seed)
				})
			}
		}
	}
}

func orderedModel(t *testing.T, mode string, rings int, seed int64) {
	const size = 4096
	// More rings share the writes: more steps, and longer stalls, in
	// proportion, so that each ring still overflows now and then.
	steps, period := 4000*rings/3, 500*rings/3
	rule1 := mode == "rule1"
	// The clock's tick is tick key units, so that rule 2's window, MaxDelay
	// in nanoseconds (an hour: rule 3 never releases), is 500 ticks.
	const tick = uint64(time.Hour) / 500
	opts := Order{MaxDelay: time.Hour, HighWater: 3000}
	if rule1 {
		opts.MaxDelay, opts.HighWater = forever, size
	}
	f := newFakeRings(t, rings, size)
	o := f.ordered(t, opts)
	rng := rand.New(rand.NewSource(seed))
	var (
		clock     uint64
		keys      = make([]uint64, rings)
		emitted   = make([]uint64, rings)          // samples written or lost
		lostSeqs  = make([]map[uint64]bool, rings) // samples that found the ring full
		want      = make([]uint64, rings)          // the next seq each ring may deliver
		delivered = make([]uint64, rings)
		lostSeen  = make([]uint64, rings) // counts of the lost records delivered
		lateSeen  int
		last      uint64 // the largest key delivered not late
		ending    bool   // the final Flush: rule 5 may release past ring 2
	)
	for i := range lostSeqs {
		lostSeqs[i] = map[uint64]bool{}
	}
	emit := func(i int, key uint64) {
		seq := emitted[i]
		emitted[i]++
		if !f.rings[i].Write(ringtest.PerfSample(payload(key, seq, 16))) {
			lostSeqs[i][seq] = true
		}
	}
	take := func(cpu int, typ RecordType, lost uint64, data []byte, key uint64, late bool) {
		if typ == RecordLost {
			lostSeen[cpu] += lost
			return
		}
		if k := keyOf(Sample{Data: data}); k != key {
			t.Fatalf("ring %d: Key %d, payload says %d", cpu, key, k)
		}
		seq := binary.NativeEndian.Uint64(data[8:])
		for ; want[cpu] < seq; want[cpu]++ { // skipped: lost
			if !lostSeqs[cpu][want[cpu]] {
				t.Fatalf("ring %d: seq %d skipped, not lost", cpu, want[cpu])
			}
		}
		if seq != want[cpu] {
			t.Fatalf("ring %d: seq %d again or out of order (want %d)", cpu, seq, want[cpu])
		}
		want[cpu]++
		delivered[cpu]++
		if late != (key < last) {
			t.Fatalf("ring %d seq %d: key %d after %d, marked late %v", cpu, seq, key, last, late)
		}
		if late {
			lateSeen++
			if rule1 && !ending {
				t.Fatalf("ring %d seq %d: key %d late under rule 1 alone (after %d)", cpu, seq, key, last)
			}
		} else {
			last = key
		}
	}
	readInto := func() error {
		var s Sample
		err := o.ReadInto(&s)
		if err == nil {
			take(s.CPU, s.Type, s.Lost, s.Data, s.Key, s.Late)
		}
		return err
	}
	each := func(limit int) error {
		n := 0
		stop := errors.New("enough")
		err := o.Each(context.Background(), func(rec *Record) error {
			take(rec.CPU, rec.Type, rec.Lost, rec.AppendTo(nil), rec.Key, rec.Late)
			if n++; n == limit {
				return stop
			}
			return nil
		})
		if err == stop {
			return nil
		}
		return err
	}
	drain := func() { // Flush, and read until it is done
		o.Flush()
		o.SetDeadline(time.Now().Add(10 * time.Second))
		for {
			var err error
			if rng.Intn(2) == 0 {
				err = readInto()
			} else {
				err = each(1 + rng.Intn(50))
			}
			if errors.Is(err, ErrFlushed) {
				return
			}
			if err != nil {
				t.Fatal(err)
			}
		}
	}
	for step := 0; step < steps; step++ {
		r := rng.Intn(100)
		if step%period >= period*4/5 {
			r %= 60 // a stall: the reader is away and the rings fill up
		}
		switch {
		case r < 60: // write a burst on one ring
			i := rng.Intn(rings)
			for n := 1 + rng.Intn(8); n > 0; n-- {
				clock += uint64(1 + rng.Intn(8))
				stamp := clock
				if i == 2 && rng.Intn(3) == 0 {
					stamp -= min(stamp, uint64(rng.Intn(800))) // the window is 500
				}
				keys[i] = max(keys[i], stamp) // a CPU's own records stay in order
				emit(i, keys[i]*tick)
			}
			f.rings[i].Publish()
		case r < 95: // read what the release rule lets go now
			o.SetDeadline(time.Now()) // deliver what may go, then stop
			for {
				var err error
				if rng.Intn(2) == 0 {
					err = readInto()
				} else {
					err = each(1 + rng.Intn(20))
				}
				if errors.Is(err, os.ErrDeadlineExceeded) {
					break
				}
				if err != nil {
					t.Fatal(err)
				}
			}
		default:
			if !rule1 {
				drain()
			}
		}
	}
	// The end: deliver everything, then a last sample on each ring brings
	// the lost counts still pending (the kernel writes a lost record only
	// once a sample fits again).
	ending = true
	drain()
	for i := 0; i < rings; i++ {
		keys[i] = 1 << 60
		emit(i, keys[i])
		f.rings[i].Publish()
	}
	drain()
	st := o.Stats()
	total, lostAll := 0, 0
	for i := 0; i < rings; i++ {
		lostAll += len(lostSeqs[i])
		lost := uint64(len(lostSeqs[i]))
		if lostSeen[i] != lost || st.Rings[i].Lost != lost {
			t.Errorf("ring %d: %d samples lost, lost records say %d, stats %d", i, lost, lostSeen[i], st.Rings[i].Lost)
		}
		if delivered[i]+lost != emitted[i] || st.Rings[i].Samples != delivered[i] {
			t.Errorf("ring %d: %d delivered + %d lost != %d written (stats %+v)",
				i, delivered[i], lost, emitted[i], st.Rings[i])
		}
		total += int(emitted[i])
	}
	var late uint64
	for _, s := range st.Rings {
		late += s.Late
	}
	if int(late) != lateSeen || st.Late != late {
		t.Errorf("%d delivered late; stats count %d late (%d in the sums)", lateSeen, late, st.Late)
	}
	if st.Samples+st.Lost != uint64(total) {
		t.Errorf("sums %+v: %d samples + %d lost, want the %d written", st, st.Samples, st.Lost, total)
	}
	t.Logf("%d written, %d lost, %d delivered late, %d late in all", total, lostAll, lateSeen, late)
	if lostAll == 0 || late == 0 && !rule1 {
		t.Error("the model lost nothing or had nothing late: it tests less than it should")
	}
}

// FuzzOrderedModel runs the model check of TestOrderedModel with seeds the
// fuzzer picks, in each of its modes: mode%2 picks the mode and mode/2 the
// number of rings, 3 to 9.
func FuzzOrderedModel(f *testing.F) {
	f.Add(int64(1), uint8(0))
	f.Add(int64(7), uint8(1))
	f.Add(int64(3), uint8(2*6))
	modes := []string{"rules", "rule1"}
	f.Fuzz(func(t *testing.T, seed int64, mode uint8) {
		orderedModel(t, modes[int(mode)%len(modes)], 3+int(mode)/len(modes)%7, seed)
	})
}

// The ordered Reader's MaxFill counts the records already waiting in a ring
// when the reader is created (its first head snapshot).
func TestOrderedMaxFillAtStart(t *testing.T) {
	f := newFakeRings(t, 2, 4096)
	for seq := uint64(0); seq < 5; seq++ {
		f.emit(t, 0, 10+seq, seq, 40)
	}
	want := int(f.rings[0].Head)
	o := f.ordered(t, Order{MaxDelay: time.Hour})
	o.Flush()
	o.SetDeadline(time.Now().Add(5 * time.Second))
	if n := readFlushed(t, o); n != 5 {
		t.Fatalf("flushed %d records", n)
	}
	if st := o.Stats(); st.Rings[0].MaxFill < want || st.MaxFill != st.Rings[0].MaxFill {
		t.Errorf("MaxFill %d (sums %d), but %d bytes were waiting in the ring", st.Rings[0].MaxFill, st.MaxFill, want)
	}
}

// After data_head moved backwards (a corrupt head, resynchronised by
// SkipCorrupt), the ordered Reader's look-ahead starts again from the
// cursor. It used to resume where it had scanned to, beyond the new head,
// and parse unpublished memory with no bound: garbage there made it panic.
func TestOrderedHeadBackwards(t *testing.T) {
	f := newFakeRings(t, 2, 1024)
	o := f.ordered(t, Order{MaxDelay: time.Hour})
	for seq := uint64(0); seq < 4; seq++ {
		f.emit(t, 0, 10+seq, seq, 16) // 32-byte records at 0, 32, 64, 96
	}
	// Garbage past the head (never published): a sample whose sizes do not
	// fit the 1024-byte ring.
	bad := f.rings[0].Data[128:]
	binary.NativeEndian.PutUint32(bad[0:], unix.PERF_RECORD_SAMPLE)
	binary.NativeEndian.PutUint16(bad[6:], 65528)
	binary.NativeEndian.PutUint32(bad[8:], 65000)

	var s Sample
	read := func(d time.Duration) (err error) {
		defer func() {
			if p := recover(); p != nil {
				err = fmt.Errorf("panic: %v", p)
			}
		}()
		o.SetDeadline(time.Now().Add(d))
		s = Sample{}
		return o.ReadInto(&s)
	}
	if err := read(20 * time.Millisecond); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("read 1: %v", err) // front 10 held, look-ahead scanned to 128
	}
	page := &f.rings[0].Page.Data_head
	atomic.StoreUint64(page, 64) // head moves backwards (corrupt)
	if err := read(20 * time.Millisecond); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("read 2: %v", err)
	}
	o.Flush()
	if err := read(time.Second); err != nil || s.Key != 10 {
		t.Fatalf("read 3: key %d, %v; want 10", s.Key, err) // by rule 5
	}
	// The head that moved backwards is passed over, and skips nothing: the
	// records at 32, 64 and 96, below the last valid head, are genuine. The
	// read that found it delivers 11, the next one reports it, once.
	if err := read(time.Second); err != nil || s.Key != 11 {
		t.Fatalf("read 4: key %d, %v; want 11", s.Key, err)
	}
	err := read(time.Second)
	var ce *CorruptError
	if !errors.As(err, &ce) || ce.Reason != "head moved backwards from 128 to 64" {
		t.Fatalf("read 5: %v; want the head moving backwards reported", err)
	}
	if st := o.Stats().Rings[0]; st.Corrupt != 1 {
		t.Errorf("stats %+v; want 1 corruption", st)
	}
	// The Flush took data_head, 64: it ended with the record at 32.
	if err := read(time.Second); !errors.Is(err, ErrFlushed) {
		t.Fatalf("read 6: %v", err)
	}
	// The producer's next write brings data_head back: 12 and 13 come out,
	// held for ring 1 until a Flush.
	f.emit(t, 0, 14, 4, 16)
	if err := read(20 * time.Millisecond); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("read 7: key %d, %v; want the 12 held", s.Key, err)
	}
	o.Flush()
	for _, want := range []uint64{12, 13, 14} {
		if err := read(time.Second); err != nil || s.Key != want {
			t.Fatalf("read: key %d, %v; want %d", s.Key, err, want)
		}
	}
	if err := read(time.Second); !errors.Is(err, ErrFlushed) {
		t.Fatalf("last read: %v", err)
	}
	if st := o.Stats().Rings[0]; st.Samples != 5 || st.Corrupt != 1 {
		t.Errorf("stats %+v; want 5 samples (nothing skipped), 1 corruption", st)
	}
}

// The ordered Reader counts lost samples as it delivers their lost record,
// as it counts samples: not when its look-ahead parses the record, while a
// sample before it is still held.
func TestOrderedLostCountedWhenDelivered(t *testing.T) {
	f := newFakeRings(t, 2, 4096)
	o := f.ordered(t, Order{MaxDelay: time.Hour})
	f.emit(t, 0, 10, 0, 16)
	f.rings[0].MustWrite(t, ringtest.PerfLost(0, 7))
	f.emit(t, 0, 20, 1, 16)
	// Ring 1 is empty: the 10 is held, and the look-ahead (rule 2) parses
	// the lost record behind it.
	o.SetDeadline(time.Now().Add(20 * time.Millisecond))
	var s Sample
	if err := o.ReadInto(&s); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("read: key %d, %v; want the 10 held", s.Key, err)
	}
	if st := o.Stats(); st.Lost != 0 || st.Samples != 0 {
		t.Errorf("nothing delivered, stats count %d lost, %d samples", st.Lost, st.Samples)
	}
	o.Flush()
	o.SetDeadline(time.Now().Add(5 * time.Second))
	if n := readFlushed(t, o); n != 3 {
		t.Fatalf("flushed %d records, want 3", n)
	}
	if st := o.Stats(); st.Lost != 7 || st.Samples != 2 || st.Rings[0].Lost != 7 {
		t.Errorf("all delivered, stats count %d lost, %d samples; want 7, 2", st.Lost, st.Samples)
	}
}

// A blocked ordered Reader waits for the smallest front to be due (rule 3),
// the only one that can go next. It used to take the earliest due time of
// every front, so once a larger key was due it spun until the smallest was.
// The spin is seen in the CPU time of the reading thread alone: a wait
// takes next to none of it, however loaded the host, where a spin takes
// whatever share of a CPU the host gives it.
func TestOrderedWaitsForTheSmallest(t *testing.T) {
	hostScheduled(t)
	f := newFakeRings(t, 3, 4096) // ring 2 stays idle: rule 1 never applies
	const delay = 200 * time.Millisecond
	o := f.reader(t, ReaderOptions{MaxLatency: -1, Order: &Order{MaxDelay: delay}})
	start := time.Now()
	f.emit(t, 1, 20, 0, 16)
	var s Sample
	o.SetDeadline(time.Now().Add(10 * time.Millisecond))
	if err := o.ReadInto(&s); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatal(err) // ring 1's 20 seen at ~0
	}
	// The read below spins, with the bug, from the 20's due time (~200 ms)
	// to its deadline (275 ms), and the 10 is due 75 ms after it: room for
	// a loaded host's delays either side.
	time.Sleep(150*time.Millisecond - time.Since(start))
	f.emit(t, 0, 10, 1, 16) // a smaller key, seen at ~150 ms or later: due at ~350 ms
	o.SetDeadline(start.Add(275 * time.Millisecond))
	runtime.LockOSThread() // the read runs on this thread: its CPU time is the read's
	defer runtime.UnlockOSThread()
	cpu0 := threadCPU()
	wall0 := time.Now()
	err := o.ReadInto(&s)
	cpu, wall := threadCPU()-cpu0, time.Since(wall0)
	if !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("read: key %d, %v", s.Key, err)
	}
	if cpu > wall/3 {
		t.Errorf("blocked read used %v of its thread's CPU in %v (busy-waiting)", cpu, wall)
	}
}

// hostScheduled skips a test whose assertions rest on the host scheduling
// the test's threads as a CPU would run them: under an emulator (qemu-user,
// make test-arm64 and test-bigendian set PERFBUF_TEST_EMULATOR) a thread's
// time is mostly the emulator's, and a timer fires when the emulator gets
// to it.
func hostScheduled(t *testing.T) {
	t.Helper()
	if emu := os.Getenv("PERFBUF_TEST_EMULATOR"); emu != "" {
		t.Skipf("depends on the host's scheduling, which %s does not give", emu)
	}
}

// An ordered Reader's Each looks at ctx at least every 256 records, and
// after each run (a ring's records that go one after the other by rule 1,
// at most a sixteenth of the ring: 128 records here): a context cancelled
// from fn ends Each before 256 more records. (Runs were not counted: Each
// went on for 256 picks, each with its run, here all 600 records.)
func TestOrderedEachRunChecksContext(t *testing.T) {
	f := newFakeRings(t, 2, 1<<16)
	const n = 600
	for seq := uint64(0); seq < n; seq++ {
		f.emit(t, 0, 1+seq, seq, 16)
	}
	f.emit(t, 1, 1<<40, 0, 16) // the other ring's front lies beyond them all: one run
	o := f.ordered(t, Order{KeyOffset: 0})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	got := 0
	err := o.Each(ctx, func(rec *Record) error {
		if got++; got == 10 {
			cancel()
		}
		return nil
	})
	if !errors.Is(err, context.Canceled) || got >= 10+256 {
		t.Fatalf("Each: %v after %d records; want context.Canceled within 256 records of the cancel", err, got)
	}
}

// An ordered run: ring 0's records go one after the other while the other
// rings hold later keys (rule 1), through RawBuffer.each keyed, and stop at
// what a run may not deliver (a lost record, a sample that straddles the
// ring's end, whose key straddles too) for next to place. The records
// come in key order, each once, with their CPU and key, and the Stats are
// exact.
func TestOrderedRun(t *testing.T) {
	const n, size = 100, 1 << 14
	recSize := len(ringtest.PerfSample(payload(0, 0, 16))) // 32
	for _, mode := range []string{"Each", "Batches", "ReadInto", "ReadBatch"} {
		t.Run(mode, func(t *testing.T) {
			f := newFakeRings(t, 3, size)
			// Ring 0 starts 16 bytes before a multiple of its size, less
			// 60 samples and the lost record: the 61st sample straddles
			// the end, and its key with it.
			start := uint64(3*size - 16 - 60*recSize - 24)
			f.rings[0] = ringtest.NewPerfAt(size, start)
			o := f.ordered(t, Order{MaxDelay: time.Hour})
			for seq := uint64(0); seq < n; seq++ {
				if seq == 40 {
					f.rings[0].MustWrite(t, ringtest.PerfLost(0, 7))
				}
				f.emit(t, 0, 1+seq, seq, 16)
			}
			f.emit(t, 1, 1000, n, 16)
			f.emit(t, 2, 2000, n+1, 16)
			if straddles := f.rings[0].Data[size-16:]; binary.NativeEndian.Uint32(straddles) != unix.PERF_RECORD_SAMPLE {
				t.Fatal("no record 16 bytes before the ring's end")
			}
			o.SetDeadline(time.Now().Add(5 * time.Second))
			got := readSome(t, o, mode, n+1)
			seq := uint64(0)
			for j, s := range got {
				if s.CPU != 0 || s.Late {
					t.Fatalf("record %d: cpu %d, late %v", j, s.CPU, s.Late)
				}
				if j == 40 {
					if s.Type != RecordLost || s.Lost != 7 {
						t.Fatalf("record 40: %v (%d lost); want the lost record", s.Type, s.Lost)
					}
					continue
				}
				if s.Type != RecordSample || seqOf(s.Data) != seq || s.Key != 1+seq || keyOf(s) != s.Key {
					t.Fatalf("record %d: %v, seq %d, key %d; want seq %d, key %d", j, s.Type, seqOf(s.Data), s.Key, seq, 1+seq)
				}
				seq++
			}
			// The other rings' records come after, once flushed.
			o.Flush()
			rest, errs := readUntilFlushed(t, o, mode)
			if len(rest) != 2 || len(errs) != 0 || rest[0].Key != 1000 || rest[1].Key != 2000 || rest[0].CPU != 1 || rest[1].CPU != 2 {
				t.Fatalf("after the run: %+v, errors %v", rest, errs)
			}
			want := Stats{CPU: -1, Samples: n + 2, Bytes: (n + 2) * 20, Lost: 7, MaxFill: n*recSize + 24, Size: 3 * size, Rings: []Stats{
				{CPU: 0, Samples: n, Bytes: n * 20, Lost: 7, MaxFill: n*recSize + 24, Size: size},
				{CPU: 1, Samples: 1, Bytes: 20, MaxFill: recSize, Size: size},
				{CPU: 2, Samples: 1, Bytes: 20, MaxFill: recSize, Size: size},
			}}
			if st := o.Stats(); !reflect.DeepEqual(st, want) {
				t.Errorf("stats %+v\nwant %+v", st, want)
			}
			if f.rings[0].Page.Data_tail != f.rings[0].Head {
				t.Errorf("ring 0 committed to %d, its head is %d", f.rings[0].Page.Data_tail-start, f.rings[0].Head-start)
			}
		})
	}
}

// readSome reads n records with mode's read (Each, ReadInto, or ReadBatch
// in batches of 7) and fails at any error.
func readSome(t *testing.T, r *Reader, mode string, n int) []Sample {
	t.Helper()
	var got []Sample
	switch mode {
	case "Each", "Batches":
		stop := errors.New("enough")
		err := eachIn(r, mode, context.Background(), func(rec *Record) error {
			got = append(got, Sample{CPU: rec.CPU, Type: rec.Type, Data: rec.AppendTo(nil), Lost: rec.Lost, Key: rec.Key, Late: rec.Late})
			if len(got) == n {
				return stop
			}
			return nil
		})
		if err != stop {
			t.Fatalf("Each: %v after %d records", err, len(got))
		}
	case "ReadInto":
		got = readN(t, r, n)
	case "ReadBatch":
		batch := make([]Sample, 7)
		for len(got) < n {
			k, err := r.ReadBatch(batch[:min(len(batch), n-len(got))])
			if err != nil {
				t.Fatalf("ReadBatch: %v after %d records", err, len(got))
			}
			for _, s := range batch[:k] {
				s.Data = bytes.Clone(s.Data)
				got = append(got, s)
			}
		}
	default:
		t.Fatalf("no read mode %q", mode)
	}
	return got
}

// A key below one already delivered, within a run: the run stops before
// it, and the merge delivers it Late; the run goes on from the largest key
// delivered, in every read form (Each's runs call fn from the ring's loop,
// ReadBatch's copy in it, ReadInto's go through Next).
func TestOrderedRunLate(t *testing.T) {
	keys := []uint64{1, 2, 3, 5, 4, 6, 7, 6, 8}
	for _, mode := range []string{"Each", "Batches", "ReadInto", "ReadBatch"} {
		t.Run(mode, func(t *testing.T) {
			f := newFakeRings(t, 2, 1<<14)
			o := f.ordered(t, Order{MaxDelay: time.Hour})
			for seq, key := range keys {
				f.emit(t, 0, key, uint64(seq), 16)
			}
			f.emit(t, 1, 100, 100, 16)
			// Ring 0's records go by rule 1 (ring 1 shows a larger key),
			// ring 1's at the Flush.
			o.SetDeadline(time.Now().Add(5 * time.Second))
			got := readSome(t, o, mode, len(keys))
			o.Flush()
			rest, errs := readUntilFlushed(t, o, mode)
			got = append(got, rest...)
			var late []uint64
			var order []uint64
			for _, s := range got {
				order = append(order, s.Key)
				if s.Late {
					late = append(late, s.Key)
				}
				if s.Key != keyOf(s) {
					t.Errorf("key %d, the sample's %d", s.Key, keyOf(s))
				}
			}
			if len(errs) != 0 || fmt.Sprint(order) != "[1 2 3 5 4 6 7 6 8 100]" || fmt.Sprint(late) != "[4 6]" {
				t.Errorf("keys %v, late %v, errors %v; want [1 2 3 5 4 6 7 6 8 100], late [4 6]", order, late, errs)
			}
		})
	}
}

// Negative Order fields are refused.
func TestOrderInvalid(t *testing.T) {
	f := newFakeRings(t, 1, 4096)
	for _, ord := range []Order{{KeyOffset: -1}, {MaxDelay: -time.Second}, {HighWater: -1}} {
		if _, err := f.newReader(t, ReaderOptions{Order: &ord}); !errors.Is(err, os.ErrInvalid) {
			t.Errorf("%+v: %v, want os.ErrInvalid", ord, err)
		}
	}
}

// Rule 3's timer while one CPU emits and the other is idle: every record
// waits for MaxDelay, and while samples keep coming (each with its ring's
// wakeup), the reader sets its timer not once a sample but about once its
// slack (MaxDelay/2). Once they stop, the last records are released by the
// timer: nothing else comes to release them.
func TestOrderedTimerKept(t *testing.T) {
	hostScheduled(t)
	f := newFakeRings(t, 2, 1<<16)
	const delay = 80 * time.Millisecond
	const gap = 4 * time.Millisecond
	const n = 60 // 240 ms of samples: three MaxDelays
	// Rule 3 alone: no key is ever a window (80 ms in nanoseconds)
	// larger, and no latency budget's timer (a wakeup a sample).
	o := f.reader(t, ReaderOptions{MaxLatency: -1, Order: &Order{MaxDelay: delay}})
	written := make([]time.Time, n)
	go func() {
		for seq := range uint64(n) {
			written[seq] = time.Now() // before the publish, which the read pairs with
			if !f.rings[0].Write(ringtest.PerfSample(payload(10+seq, seq, 24))) {
				t.Errorf("no room for record %d", seq)
			}
			f.rings[0].Publish()
			f.wake(0)
			time.Sleep(gap)
		}
	}()
	o.SetDeadline(time.Now().Add(10 * time.Second))
	var late time.Duration
	for i := range n {
		var s Sample
		if err := o.ReadInto(&s); err != nil {
			t.Fatalf("read %d of %d: %v", i, n, err)
		}
		seq := binary.NativeEndian.Uint64(s.Data[8:])
		held := time.Since(written[seq])
		if held < delay-delay/32 {
			t.Fatalf("record %d released after %v, MaxDelay is %v", seq, held, delay)
		}
		late = max(late, held-delay)
	}
	// Without the slack every wait moves the deadline: about one a sample.
	// With it, one a slack while samples come a gap apart, and one more for
	// each pause of the writer (a loaded host's) long enough that the
	// deadline kept has passed.
	pauses := 0
	for seq := 1; seq < n; seq++ {
		if written[seq].Sub(written[seq-1]) > delay/4 {
			pauses++
		}
	}
	if sets := o.r.C.W.Sets(); sets > n/2+pauses {
		t.Errorf("%d deadlines set for %d samples a %v apart (%d pauses of the writer)", sets, n, gap, pauses)
	}
	t.Logf("%d samples, %d deadlines set, released at most %v after MaxDelay", n, o.r.C.W.Sets(), late)
}

// readOrdered reads n samples from o with mode, ReadInto or Each (copied
// out of the records), within 10 s: nothing the tests write may wait on
// MaxDelay.
func readOrdered(t *testing.T, o *Reader, mode string, n int) []Sample {
	t.Helper()
	o.SetDeadline(time.Now().Add(10 * time.Second))
	if mode == "ReadInto" {
		return readN(t, o, n)
	}
	var got []Sample
	stop := errors.New("enough")
	err := o.Each(context.Background(), func(rec *Record) error {
		s := Sample{CPU: rec.CPU, Type: rec.Type, Data: rec.AppendTo(nil), Key: rec.Key, Late: rec.Late}
		if got = append(got, s); len(got) == n {
			return stop
		}
		return nil
	})
	if err != stop {
		t.Fatalf("Each: %v after %d records", err, len(got))
	}
	return got
}

// Tests of the ordered Reader over BPF ring buffers (policy.NewWindow): the
// records copied out into a window, each ring committed up to its oldest
// copy not delivered; the release rules over copies; the ledger with
// records held.

// ordered returns an ordered Reader over the fake ring buffers, closed when
// the test ends; oneWriter[i] says ring i is one CPU's (rule 1).
func (f *fakeBPFRings) ordered(t testing.TB, ord Order, oneWriter ...bool) *Reader {
	t.Helper()
	p, err := (&ReaderOptions{Order: &ord}).plan()
	if err != nil {
		t.Fatal(err)
	}
	r := newReader(f.core(t, oneWriter...), p)
	t.Cleanup(func() { r.Close() })
	return r
}

// emit outputs a sample with key and seq (16 bytes, then size-16 more) to
// ring i.
func (f *fakeBPFRings) emit(t testing.TB, i int, key, seq uint64, size int) {
	t.Helper()
	f.rings[i].Output(t, payload(key, seq, size))
}

// flushAll flushes o and returns what it reads until ErrFlushed.
func flushAll(t *testing.T, o *Reader) []Sample {
	t.Helper()
	o.SetDeadline(time.Now().Add(10 * time.Second))
	o.Flush()
	var got []Sample
	for {
		var s Sample
		err := o.ReadInto(&s)
		if errors.Is(err, ErrFlushed) {
			return got
		}
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, s)
	}
}

// readReleased reads what o releases, each read given wait to deliver,
// until one delivers nothing.
func readReleased(t *testing.T, o *Reader, wait time.Duration) []Sample {
	t.Helper()
	var got []Sample
	for {
		o.SetDeadline(time.Now().Add(wait))
		var s Sample
		err := o.ReadInto(&s)
		if errors.Is(err, os.ErrDeadlineExceeded) {
			return got
		}
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, s)
	}
}

// keys returns the samples' keys.
func keys(got []Sample) []uint64 {
	var k []uint64
	for _, s := range got {
		k = append(k, s.Key)
	}
	return k
}

// A ring buffer written by several CPUs holds its records in the order they
// were reserved: the window sorts them (here released by rule 3).
func TestOrderedRingBufSorts(t *testing.T) {
	f := newFakeBPFRings(t, 1, 4096)
	o := f.ordered(t, Order{MaxDelay: 20 * time.Millisecond})
	for seq, key := range []uint64{50, 30, 40, 10, 20} {
		f.emit(t, 0, key, uint64(seq), 16)
	}
	o.SetDeadline(time.Now().Add(10 * time.Second))
	got := readN(t, o, 5)
	if fmt.Sprint(keys(got)) != "[10 20 30 40 50]" {
		t.Fatalf("keys %v", keys(got))
	}
	for _, s := range got {
		if s.Late || s.Key != keyOf(s) {
			t.Fatalf("sample %+v", s)
		}
	}
}

// Rule 1 over rings of one CPU each: a key goes as soon as every ring has
// shown one at least as large, without waiting for MaxDelay; over a shared
// ring it does not apply.
func TestOrderedRingBufOneWriter(t *testing.T) {
	for _, one := range []bool{true, false} {
		t.Run(fmt.Sprintf("oneWriter=%v", one), func(t *testing.T) {
			f := newFakeBPFRings(t, 2, 4096)
			o := f.ordered(t, Order{MaxDelay: time.Hour}, one, one)
			for seq, key := range []uint64{1, 3, 5} {
				f.emit(t, 0, key, uint64(seq), 16)
			}
			for seq, key := range []uint64{2, 4} {
				f.emit(t, 1, key, uint64(10+seq), 16)
			}
			got := readReleased(t, o, 100*time.Millisecond)
			want := "[1 2 3 4]" // 5 waits for ring 1 to show a key >= 5
			if !one {
				want = "[]"
			}
			if fmt.Sprint(keys(got)) != want {
				t.Fatalf("keys %v, want %s", keys(got), want)
			}
			if !one {
				return
			}
			f.emit(t, 1, 6, 20, 16)
			o.SetDeadline(time.Now().Add(10 * time.Second))
			if got := readN(t, o, 1); got[0].Key != 5 {
				t.Fatalf("then key %d", got[0].Key)
			}
		})
	}
}

// The records the window holds keep their ring's space up to the oldest
// not delivered: a reader killed holding them leaves them in the ring for
// the next one (docs/failures.md). The kernel raises no wakeup meanwhile,
// and the read still returns by its deadline (it neither spins nor
// sleeps past it); once the copies keep more than half the ring, rule 4
// releases them, so that the ring never fills behind held records.
func TestOrderedRingBufKeepsSpaceOfCopies(t *testing.T) {
	f := newFakeBPFRings(t, 1, 4096)
	o := f.ordered(t, Order{MaxDelay: time.Hour})
	// Twice the ring's size in all, every record held by rules 1 to 3
	// (one shared ring: only rule 3, an hour, would release one), and
	// read every 16 records, 384 bytes, before the ring is an eighth full
	// (rule 4's hot ring).
	const n = 2 * 4096 / 32
	seen := map[uint64]bool{}
	for seq := range uint64(n) {
		if seq%16 == 0 {
			o.SetDeadline(time.Now().Add(20 * time.Millisecond))
			for {
				var s Sample
				err := o.ReadInto(&s)
				if errors.Is(err, os.ErrDeadlineExceeded) {
					break
				}
				if err != nil || seen[s.Key] {
					t.Fatalf("read: %v, %+v (again: %v)", err, s, seen[s.Key])
				}
				seen[s.Key] = true
			}
			if c := f.rings[0].Pos[0]; seq == 16 && c != 0 {
				t.Fatalf("after the read: consumer_pos %d; want 0, the oldest copy's", c)
			}
		}
		f.emit(t, 0, n-seq, seq, 16) // (keys falling: all of them held; fails when the ring has no room)
	}
	if len(seen) == 0 {
		t.Fatal("rule 4 released nothing: the ring could not have filled")
	}
	for _, s := range flushAll(t, o) {
		if seen[s.Key] {
			t.Fatalf("key %d delivered twice", s.Key)
		}
		seen[s.Key] = true
	}
	if len(seen) != n {
		t.Fatalf("delivered %d of %d", len(seen), n)
	}
	// Everything delivered: consumer_pos is at the last record, held back
	// within the budget (see TestReaderRingBufBudget), and Close stores
	// the end.
	if c, p := f.rings[0].Pos[0], f.rings[0].Pos[1]; p-c != 24 {
		t.Fatalf("after the flush: consumer_pos %d, producer_pos %d; want one 24-byte record between", c, p)
	}
	o.Close()
	if c, p := f.rings[0].Pos[0], f.rings[0].Pos[1]; c != p {
		t.Fatalf("after Close: consumer_pos %d, producer_pos %d", c, p)
	}
}

// A blocked ordered Reader whose window holds copies waits: their ring's
// consumer_pos stays at the oldest copy, so the kernel would wake no one
// for the ring's next records, and the read sleeps on its timers (here its
// deadline) rather than read again and again. The spin is seen in the CPU
// time of the reading thread alone (see TestOrderedWaitsForTheSmallest).
func TestOrderedRingBufHeldWaits(t *testing.T) {
	hostScheduled(t)
	for _, latency := range []time.Duration{0, -1} {
		t.Run(fmt.Sprintf("MaxLatency=%v", latency), func(t *testing.T) {
			f := newFakeBPFRings(t, 1, 4096)
			o := f.reader(t, ReaderOptions{MaxLatency: latency, Order: &Order{MaxDelay: time.Hour}})
			for seq, key := range []uint64{30, 10, 20} {
				f.emit(t, 0, key, uint64(seq), 16)
			}
			runtime.LockOSThread() // the read runs on this thread: its CPU time is the read's
			defer runtime.UnlockOSThread()
			o.SetDeadline(time.Now().Add(100 * time.Millisecond))
			cpu0, wall0 := threadCPU(), time.Now()
			var s Sample
			err := o.ReadInto(&s)
			cpu, wall := threadCPU()-cpu0, time.Since(wall0)
			if !errors.Is(err, os.ErrDeadlineExceeded) {
				t.Fatalf("read: key %d, %v; want the copies held", s.Key, err)
			}
			if c := f.rings[0].Pos[0]; c != 0 {
				t.Fatalf("consumer_pos %d; want 0, the oldest copy's", c)
			}
			if cpu > wall/3 {
				t.Errorf("blocked read used %v of its thread's CPU in %v (busy-waiting)", cpu, wall)
			}
		})
	}
}

// A full window releases its smallest key early rather than lose a record
// (rule 4): a record that comes later with a smaller key is Late, counted,
// and delivered; the ledger is exact.
func TestOrderedRingBufWindowFull(t *testing.T) {
	f := newFakeBPFRings(t, 1, 4096)
	// 16-byte payloads take 16 bytes of the window each: 4 fit.
	o := f.ordered(t, Order{MaxDelay: time.Hour, HighWater: 64})
	for seq, key := range []uint64{10, 20, 30, 40, 50, 5} {
		f.emit(t, 0, key, uint64(seq), 16)
	}
	o.SetDeadline(time.Now().Add(10 * time.Second))
	got := readN(t, o, 2)
	if fmt.Sprint(keys(got)) != "[10 20]" || got[0].Late || got[1].Late {
		t.Fatalf("early: %v", got)
	}
	o.Flush()
	n := readFlushed(t, o)
	st := o.Stats()
	if n != 4 || st.Samples != 6 || st.Late != 1 || st.Left != 0 || st.Rings[0].Samples != 6 {
		t.Fatalf("flushed %d, stats %+v", n, st)
	}
}

// A burst that came while the reader waited is copied and ordered, however
// full it left the ring: the hot ring is for a reader the producers outpace.
func TestOrderedRingBufBurstOrdered(t *testing.T) {
	f := newFakeBPFRings(t, 1, 4096)
	o := f.ordered(t, Order{MaxDelay: 20 * time.Millisecond})
	want := burstKeys(40) // 2,880 bytes of 4,096
	for seq, key := range want {
		f.emit(t, 0, key, uint64(seq), 64)
	}
	o.SetDeadline(time.Now().Add(10 * time.Second))
	inOrder(t, readN(t, o, len(want)), want)
}

// burstKeys returns n keys as two CPUs' records come in one ring buffer,
// each second one 15 below its place: 100, 95, 120, 115, ...
func burstKeys(n int) []uint64 {
	var k []uint64
	for seq := range uint64(n) {
		key := 100 + seq*10
		if seq%2 == 1 {
			key -= 15
		}
		k = append(k, key)
	}
	return k
}

// inOrder fails the test unless got holds the keys of want sorted, none
// Late.
func inOrder(t *testing.T, got []Sample, want []uint64) {
	t.Helper()
	for _, s := range got {
		if s.Late {
			t.Fatalf("late: %v", keys(got))
		}
	}
	sorted := slices.Sorted(slices.Values(want))
	if fmt.Sprint(keys(got)) != fmt.Sprint(sorted) {
		t.Fatalf("keys %v\nwant %v", keys(got), sorted)
	}
}

// A burst that came below the ring's wakeup threshold while the reader was
// parked (commits that raised no wakeup), found when the wait timed out:
// the reader waited, so the burst is copied and ordered, not read hot. A
// wait that returned at once because the ring had moved would have made
// the ring hot.
func TestOrderedRingBufBurstWithoutWakeup(t *testing.T) {
	f := newFakeBPFRings(t, 1, 4096)
	o := f.ordered(t, Order{MaxDelay: 20 * time.Millisecond})
	type result struct {
		s   Sample
		err error
	}
	done := make(chan result, 1)
	o.SetDeadline(time.Now().Add(300 * time.Millisecond))
	go func() {
		var s Sample
		err := o.ReadInto(&s)
		done <- result{s, err}
	}()
	for w := o.r.C.W; !w.Parked(); time.Sleep(time.Millisecond) {
		select {
		case res := <-done:
			t.Fatalf("read returned %v before the burst", res.err)
		default:
		}
	}
	want := burstKeys(40) // 2,880 bytes of 4,096, no wakeup
	for seq, key := range want {
		p := payload(key, uint64(seq), 64)
		pos, ok := f.rings[0].Reserve(len(p))
		if !ok {
			t.Fatal("no room")
		}
		f.rings[0].Write(pos, p)
		f.rings[0].CommitMissed(pos)
	}
	var got []Sample
	res := <-done
	switch {
	case res.err == nil:
		got = append(got, res.s)
	case !errors.Is(res.err, os.ErrDeadlineExceeded):
		t.Fatal(res.err)
	}
	o.SetDeadline(time.Now().Add(10 * time.Second))
	inOrder(t, append(got, readN(t, o, len(want)-len(got))...), want)
}

// The window is made at NewReader with room for a full ring's copies: the
// first intake of a flood, here two thirds of a 256 KiB ring in 64-byte
// samples, allocates nothing, where growing the window started garbage
// collections that held the intake, and the ring, for milliseconds. Nor
// do the intakes after it (each made a method value).
func TestOrderedRingBufIntakesAllocate(t *testing.T) {
	if raceDetector {
		t.Skip("allocations are counted without -race (make test-nocgo)")
	}
	// The counts are the process's: an allocation of the runtime's or of
	// another test's goroutine may fall between (once in about twenty
	// runs of the package). An intake that allocates does in every try.
	var failed string
	for try := 0; try < 3; try++ {
		if failed = intakeAllocations(t); failed == "" {
			return
		}
	}
	t.Error(failed)
}

// intakeAllocations is a try of TestOrderedRingBufIntakesAllocate: what it
// found wrong, or "".
func intakeAllocations(t *testing.T) string {
	const size = 256 << 10
	f := newFakeBPFRings(t, 1, size)
	ord := Order{MaxDelay: time.Hour} // nothing released: keys 1000 on, an hour's window
	o := f.ordered(t, ord)
	empty := newFakeBPFRings(t, 1, size).ordered(t, ord)
	// A read that does not wait (its deadline past) takes the ring in and
	// releases nothing; beside it, the same reads of an empty ring: their
	// errors' allocations.
	mallocs := func(o *Reader, reads int, fill func()) uint64 {
		o.SetDeadline(time.Unix(1, 0))
		s := Sample{Data: make([]byte, 0, 64)}
		var before, after runtime.MemStats
		m := uint64(0)
		for range reads {
			fill()
			runtime.ReadMemStats(&before)
			err := o.ReadInto(&s)
			runtime.ReadMemStats(&after)
			if !errors.Is(err, os.ErrDeadlineExceeded) {
				t.Fatalf("read: %v, key %d", err, s.Key)
			}
			m += after.Mallocs - before.Mallocs
		}
		return m
	}
	n := 0
	emit := func(k int) {
		for range k {
			f.emit(t, 0, uint64(1000+n), uint64(n), 64)
			n++
		}
	}
	failed := ""
	base := mallocs(empty, 1, func() {})
	// A quarter of the ring, then 50 intakes of 10: the copies span less
	// than half of it, past which rule 4 releases (the window keeps the
	// space of what it holds).
	if m := mallocs(o, 1, func() { emit((size / 4) / 72) }); m > base+2 {
		failed = fmt.Sprintf("the first intake of %d samples made %d allocations, a read of an empty ring %d", n, m, base)
	}
	// All taken in and held: nothing delivered, and the ring's space kept
	// for the copies not delivered (a successor would deliver them).
	if st := o.Stats().Rings[0]; st.Fill != n*72 || st.Samples != 0 || st.Waiting == 0 {
		t.Fatalf("not all taken in and held (%d bytes of copies): %+v", n*72, st)
	}
	const reads = 50
	base = mallocs(empty, reads, func() {})
	if m := mallocs(o, reads, func() { emit(10) }); m > base+2 && failed == "" {
		failed = fmt.Sprintf("%d intakes of 10 samples made %d allocations, %d reads of an empty ring %d", reads, m, reads, base)
	}
	if got := flushAll(t, o); len(got) != n || got[0].Key != 1000 {
		t.Fatalf("flushed %d samples, want %d", len(got), n)
	}
	return failed
}

// hourKey is a key unit for an Order of MaxDelay an hour: rule 2's window,
// an hour in nanoseconds, is 1000 of them.
const hourKey = uint64(time.Hour) / 1000

// Each over a hot ring with no copy in the window runs the ring's own loop
// (eachHot): keys and Late as record by record, counted; the ledger exact.
func TestOrderedRingBufHotEach(t *testing.T) {
	// Each calls fn from the ring's loop; Batches steps through its runs;
	// ReadBatch (in batches of 7) copies in it: all stop the loop before
	// the late key, which goes alone.
	for _, mode := range []string{"Each", "Batches", "ReadBatch"} {
		t.Run(mode, func(t *testing.T) {
			f := newFakeBPFRings(t, 1, 4096)
			o := f.ordered(t, Order{MaxDelay: time.Hour})
			f.emit(t, 0, 10*hourKey, 0, 64) // goes by rule 2
			f.emit(t, 0, 1100*hourKey, 1, 64)
			o.SetDeadline(time.Now().Add(10 * time.Second))
			if got := readN(t, o, 1); got[0].Key != 10*hourKey {
				t.Fatalf("first %d", got[0].Key/hourKey)
			}
			want := []uint64{1100}        // the window's copy, then the ring's records
			for seq := range uint64(30) { // 2,160 bytes of 4,096
				key := 1200 + seq*10
				if seq == 20 {
					key = 1150 // after 1,390: late
				}
				f.emit(t, 0, key*hourKey, 2+seq, 64)
				want = append(want, key)
			}
			var got []uint64
			check := func(key uint64, late bool, data []byte) {
				if key != binary.NativeEndian.Uint64(data) || late != (key == 1150*hourKey) {
					t.Fatalf("record key %d, late %v", key/hourKey, late)
				}
				got = append(got, key/hourKey)
			}
			o.SetDeadline(time.Now().Add(20 * time.Millisecond))
			var err error
			longest := 0 // Batches's longest batch
			switch mode {
			case "Each":
				err = o.Each(context.Background(), func(rec *Record) error {
					check(rec.Key, rec.Late, rec.Data)
					return nil
				})
			case "Batches":
				for b, e := range o.Batches(context.Background()) {
					if err = e; e != nil {
						break
					}
					k := 0
					for ; b.Next(); k++ {
						rec := b.Record()
						check(rec.Key, rec.Late, rec.Data)
					}
					longest = max(longest, k)
				}
			default:
				batch := make([]Sample, 7)
				for err == nil {
					var k int
					k, err = o.ReadBatch(batch)
					for _, s := range batch[:k] {
						check(s.Key, s.Late, s.Data)
					}
				}
			}
			if !errors.Is(err, os.ErrDeadlineExceeded) {
				t.Fatal(err)
			}
			if fmt.Sprint(got) != fmt.Sprint(want) {
				t.Fatalf("keys %v\nwant %v", got, want)
			}
			if mode == "Batches" && longest < 2 {
				// (runs end at the intake's chunk: 256 bytes of this ring)
				t.Fatalf("the longest batch: %d records; want the hot ring's runs stepped in place", longest)
			}
			o.Close()
			if st := o.Stats(); st.Samples != 32 || st.Late != 1 || st.Left != 0 || st.Rings[0].Late != 1 {
				t.Fatalf("stats %+v", st)
			}
		})
	}
}

// Close while a hot ring's next record is parsed and a copy went before
// it: the record parsed is still the ring's, counted Left, not delivered.
func TestOrderedRingBufHotCloseLedger(t *testing.T) {
	f := newFakeBPFRings(t, 1, 4096)
	o := f.ordered(t, Order{MaxDelay: time.Hour})
	for seq, key := range []uint64{10, 1100, 600} { // 10 goes by rule 2
		f.emit(t, 0, key*hourKey, uint64(seq), 64)
	}
	o.SetDeadline(time.Now().Add(10 * time.Second))
	if got := readN(t, o, 1); got[0].Key != 10*hourKey {
		t.Fatalf("first %d", got[0].Key/hourKey)
	}
	const hot = 30 // 2,160 bytes of 4,096
	for seq := range uint64(hot) {
		f.emit(t, 0, (700+seq)*hourKey, 3+seq, 64)
	}
	if got := readN(t, o, 1); got[0].Key != 600*hourKey { // the copy before 700, parsed
		t.Fatalf("second %d", got[0].Key/hourKey)
	}
	o.Close()
	st := o.Stats()
	if st.Samples != 2 || st.Left != hot+1 || st.Bytes != 128 || st.Rings[0].Left != hot+1 {
		t.Fatalf("after Close: samples %d (%d bytes), left %d; %d emitted", st.Samples, st.Bytes, st.Left, 3+hot)
	}
}

// Close counts the records the window holds as Left: delivered + left ==
// emitted, for any number read first.
func TestOrderedRingBufCloseLedger(t *testing.T) {
	const outputs = 20
	for _, read := range []int{0, 1, 7, outputs} {
		t.Run(fmt.Sprintf("read %d", read), func(t *testing.T) {
			f := newFakeBPFRings(t, 2, 4096)
			o := f.ordered(t, Order{MaxDelay: time.Hour}, true, true)
			for seq := range uint64(outputs) {
				f.emit(t, int(seq%2), seq, seq, 24)
			}
			// Rule 1 releases all but ring 1's last key, 19; a Flush the rest.
			if read == outputs {
				o.Flush()
			}
			o.SetDeadline(time.Now().Add(10 * time.Second))
			readN(t, o, read)
			o.Close()
			var samples, left uint64
			st := o.Stats()
			for _, s := range st.Rings {
				samples, left = samples+s.Samples, left+s.Left
			}
			if samples != uint64(read) || samples+left != outputs || st.Samples != samples || st.Left != left {
				t.Fatalf("read %d: samples %d + left %d, %d outputs (sums %+v)", read, samples, left, outputs, st)
			}
		})
	}
}

// Close hands over: an Each that Close interrupts from another goroutine
// delivers the copies its window holds, which are no longer in the ring,
// before it returns os.ErrClosed; a Close from the read's own function
// asks for no more, and they count as Left. delivered + left == emitted
// either way.
func TestOrderedRingBufCloseHandsOver(t *testing.T) {
	for _, inside := range []bool{false, true} {
		t.Run(fmt.Sprintf("from the function %v", inside), func(t *testing.T) {
			// Rounds, for a race that a Close from outside lost: the read
			// found the reader closed before Close had said to hand over,
			// and left the window's copy undelivered (Core.Close).
			for round := range 100 {
				closeHandsOver(t, inside, round)
			}
		})
	}
}

// closeHandsOver is a round of TestOrderedRingBufCloseHandsOver.
func closeHandsOver(t *testing.T, inside bool, round int) {
	t.Helper()
	const outputs = 20
	f := newFakeBPFRings(t, 2, 4096)
	o := f.ordered(t, Order{MaxDelay: time.Hour}, true, true)
	for seq := range uint64(outputs) {
		f.emit(t, int(seq%2), seq, seq, 24)
	}
	// Rule 1 releases all but ring 1's last key, 19, which waits.
	var keys []uint64
	released := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		done <- o.Each(context.Background(), func(rec *Record) error {
			keys = append(keys, rec.Key)
			if len(keys) == outputs-1 {
				if inside {
					o.Close()
				}
				close(released)
			}
			return nil
		})
	}()
	<-released
	o.Close()
	if err := <-done; !errors.Is(err, os.ErrClosed) {
		t.Fatalf("round %d: Each after Close: %v", round, err)
	}
	want := outputs
	if inside {
		want--
	}
	if len(keys) != want || !slices.IsSorted(keys) {
		t.Fatalf("round %d: delivered keys %v; want 0 to %d", round, keys, want-1)
	}
	var samples, left uint64
	st := o.Stats()
	for _, s := range st.Rings {
		samples, left = samples+s.Samples, left+s.Left
	}
	if samples != uint64(want) || samples+left != outputs || st.Samples != samples || st.Left != left {
		t.Fatalf("round %d: samples %d + left %d, %d outputs; %d delivered (sums %+v)", round, samples, left, outputs, len(keys), st)
	}
}

// A busy record (reserved, not committed) holds back only its own ring, as
// an empty one does: the other ring's keys above the busy ring's newest
// wait for its commit, or MaxDelay.
func TestOrderedRingBufBusy(t *testing.T) {
	f := newFakeBPFRings(t, 2, 4096)
	o := f.ordered(t, Order{MaxDelay: time.Hour}, true, true)
	f.emit(t, 0, 1, 0, 16)
	busy, ok := f.rings[0].Reserve(16)
	if !ok {
		t.Fatal("no room")
	}
	f.rings[0].Write(busy, payload(3, 1, 16))
	f.emit(t, 1, 2, 2, 16)
	f.emit(t, 1, 4, 3, 16)
	o.SetDeadline(time.Now().Add(10 * time.Second))
	if got := readN(t, o, 1); got[0].Key != 1 {
		t.Fatalf("first %d", got[0].Key)
	}
	o.SetDeadline(time.Now().Add(50 * time.Millisecond))
	var s Sample
	if err := o.ReadInto(&s); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("with ring 0 busy: %v, key %d", err, s.Key)
	}
	f.rings[0].Commit(busy, false) // wakes the reader: consumer_pos is at it
	f.emit(t, 0, 5, 4, 16)
	o.SetDeadline(time.Now().Add(10 * time.Second))
	if got := readN(t, o, 3); fmt.Sprint(keys(got)) != "[2 3 4]" {
		t.Fatalf("then %v", keys(got))
	}
}

// A model check: random keys on rings of one writer, every form of read,
// delivered in key order within what rule 1 allows, each exactly once.
func TestOrderedRingBufModel(t *testing.T) {
	for seed := range int64(20) {
		rng := rand.New(rand.NewSource(seed))
		rings := 1 + rng.Intn(4)
		f := newFakeBPFRings(t, rings, 1<<14)
		one := make([]bool, rings)
		for i := range one {
			one[i] = true
		}
		o := f.ordered(t, Order{MaxDelay: time.Hour}, one...)
		o.SetDeadline(time.Now().Add(10 * time.Second))
		next := make([]uint64, rings)
		var seq uint64
		var got []Sample
		for round := 0; round < 20; round++ {
			for k := rng.Intn(30); k > 0; k-- {
				i := rng.Intn(rings)
				next[i] += uint64(rng.Intn(5))
				f.emit(t, i, next[i], seq, 16+8*rng.Intn(4))
				seq++
			}
			// Every ring shows the round's bound: rule 1 releases all
			// keys below it.
			bound := uint64(round+1) * 1000
			for i := range rings {
				next[i] = bound
				f.emit(t, i, bound, seq, 16)
				seq++
			}
			got = append(got, readReleased(t, o, 5*time.Millisecond)...)
			if n := len(got); n == 0 || got[n-1].Key != bound {
				t.Fatalf("seed %d round %d: %d delivered, not up to %d", seed, round, n, bound)
			}
		}
		seen := map[uint64]bool{}
		for j, s := range got {
			if j > 0 && s.Key < got[j-1].Key || s.Late {
				t.Fatalf("seed %d: key %d after %d", seed, s.Key, got[j-1].Key)
			}
			if sq := binary.NativeEndian.Uint64(s.Data[8:]); seen[sq] {
				t.Fatalf("seed %d: seq %d twice", seed, sq)
			} else {
				seen[sq] = true
			}
		}
	}
}

// Producers that follow the kernel's protocol write two ring buffers of one
// CPU each, keys from one clock, while an ordered Reader reads them and is
// closed at a random point once they are done: each ring's records come in
// its order, keys never fall but for those marked Late (counted), and
// delivered + left == written.
func TestOrderedRingBufRace(t *testing.T) {
	n := 20000
	if testing.Short() || ringtest.RaceEnabled() {
		n = 3000
	}
	for round := range 3 {
		f := newFakeBPFRings(t, 2, 1<<12)
		o := f.ordered(t, Order{MaxDelay: 5 * time.Millisecond}, true, true)
		epoch := time.Now()
		var clock sync.Mutex // keys from one clock, as bpf_ktime_get_ns
		var wg sync.WaitGroup
		for i := range 2 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for seq := uint64(0); seq < uint64(n); {
					clock.Lock()
					key := uint64(time.Since(epoch))
					pos, ok := f.rings[i].Reserve(24)
					clock.Unlock()
					if !ok {
						time.Sleep(20 * time.Microsecond)
						continue
					}
					f.rings[i].Write(pos, payload(key, seq, 24))
					f.rings[i].Commit(pos, false)
					seq++
				}
			}()
		}
		read := make(chan int)
		var next [2]uint64
		late := 0
		go func() {
			var last uint64
			var s Sample
			got := 0
			for o.ReadInto(&s) == nil {
				got++
				if seq := binary.NativeEndian.Uint64(s.Data[8:]); seq != next[s.Ring] {
					t.Errorf("ring %d: seq %d, want %d", s.Ring, seq, next[s.Ring])
				}
				next[s.Ring]++
				if s.Late {
					late++
				} else if s.Key < last {
					t.Errorf("key %d after %d, not marked late", s.Key, last)
				} else {
					last = s.Key
				}
			}
			read <- got
		}()
		wg.Wait()
		time.Sleep(time.Duration(rand.Intn(5000)) * time.Microsecond)
		o.Close()
		got := <-read
		var samples, left, lateStats uint64
		st := o.Stats()
		for _, s := range st.Rings {
			samples, left, lateStats = samples+s.Samples, left+s.Left, lateStats+s.Late
		}
		if st.Samples != samples || st.Left != left || st.Late != lateStats {
			t.Fatalf("round %d: sums %+v, the rings' %d samples, %d left, %d late", round, st, samples, left, lateStats)
		}
		if samples != uint64(got) || samples+left != uint64(2*n) || lateStats != uint64(late) {
			t.Fatalf("round %d: read %d; stats %d delivered + %d left of %d written, %d late (%d seen)",
				round, got, samples, left, 2*n, lateStats, late)
		}
		t.Logf("round %d: %d read, %d left at Close, %d late", round, got, left, late)
	}
}

// orderedReadOnce reads o once in one of the Reader's forms (ReadInto,
// ReadBatch, Each, Consume) and returns the keys delivered and the error.
// Each ends at its first error; Consume at the end of what it may deliver
// now (a running Flush's end included).
func orderedReadOnce(o *Reader, mode string) ([]uint64, error) {
	var got []uint64
	fn := func(rec *Record) error {
		got = append(got, rec.Key)
		return nil
	}
	switch mode {
	case "ReadInto":
		var s Sample
		err := o.ReadInto(&s)
		if err == nil {
			got = append(got, s.Key)
		}
		return got, err
	case "ReadBatch":
		s := make([]Sample, 2)
		n, err := o.ReadBatch(s)
		for _, s := range s[:n] {
			got = append(got, s.Key)
		}
		return got, err
	case "Each", "Batches":
		err := eachIn(o, mode, context.Background(), fn)
		return got, err
	}
	_, err := o.Consume(fn)
	return got, err
}

// An ordered Reader over ring buffers, one or an array of them, reports a
// consumer_pos another consumer moved as a *CorruptError, as the unordered
// forms do (docs/failures.md), in every form; a Flush then ends with what
// it held delivered, and a read with no deadline after it waits. The window
// used to look at producer_pos only: moved forward, the record the other
// consumer took was delivered again, unreported; moved back, every read
// after a Flush spun until its deadline (os.ErrDeadlineExceeded here), and
// without one for ever.
func TestOrderedRingBufConsumerMoved(t *testing.T) {
	for _, rings := range []int{1, 2} {
		for _, move := range []string{"back", "forward"} {
			for _, mode := range []string{"ReadInto", "ReadBatch", "Each", "Batches", "Consume"} {
				t.Run(fmt.Sprintf("rings=%d/%s/%s", rings, move, mode), func(t *testing.T) {
					f := newFakeBPFRings(t, rings, 4096)
					o := f.ordered(t, Order{MaxDelay: time.Hour})
					want := []uint64{10, 11, 12}
					for seq, key := range []uint64{12, 10, 11} {
						f.emit(t, 0, key, uint64(seq), 16)
					}
					if rings > 1 {
						f.emit(t, 1, 13, 3, 16)
						want = append(want, 13)
					}
					o.SetDeadline(time.Now().Add(20 * time.Millisecond))
					if got, err := orderedReadOnce(o, mode); len(got) != 0 || err != nil && !errors.Is(err, os.ErrDeadlineExceeded) {
						t.Fatalf("first read: %v, %v; want the copies held", got, err)
					}
					r := f.rings[0]
					switch move {
					case "back": // another consumer moves it behind the reader's (its oldest copy's)
						atomic.StoreUint64(&r.Pos[0], atomic.LoadUint64(&r.Pos[0])-8)
					case "forward": // another consumer took the next record, 20
						f.emit(t, 0, 20, 4, 16)
						f.emit(t, 0, 21, 5, 16)
						atomic.StoreUint64(&r.Pos[0], atomic.LoadUint64(&r.Pos[0])+24)
					}
					o.Flush()
					var got []uint64
					var corrupt []error
					for call := 0; ; call++ {
						if call > 20 {
							t.Fatalf("no end of the flush after 20 reads: delivered %v, errors %v", got, corrupt)
						}
						// A generous deadline: every read here has its records
						// there, or an error to report; running into it is a spin.
						o.SetDeadline(time.Now().Add(10 * time.Second))
						keys, err := orderedReadOnce(o, mode)
						got = append(got, keys...)
						var ce *CorruptError
						if errors.As(err, &ce) {
							corrupt = append(corrupt, err)
							continue
						}
						if errors.Is(err, ErrFlushed) || err == nil && mode == "Consume" {
							break
						}
						if err != nil {
							t.Fatalf("read %d: %v (delivered %v, errors %v)", call, err, got, corrupt)
						}
					}
					var ce *CorruptError
					if len(corrupt) != 1 || !errors.As(corrupt[0], &ce) || ce.Ring != 0 || !strings.Contains(ce.Reason, "by another writer") {
						t.Fatalf("errors %v; want one CorruptError of ring 0: consumer position changed by another writer", corrupt)
					}
					if fmt.Sprint(got) != fmt.Sprint(want) {
						t.Fatalf("the flush delivered %v; want %v (20 was the other consumer's)", got, want)
					}
					if c, p := atomic.LoadUint64(&r.Pos[0]), atomic.LoadUint64(&r.Pos[1]); c != p {
						t.Fatalf("consumer_pos %d, producer_pos %d after the error", c, p)
					}
					// A read with no deadline waits, and the ring's next
					// record, flushed, ends it.
					if mode == "Consume" {
						return
					}
					r.Prod = r.Pos[1]
					o.SetDeadline(time.Time{})
					done := make(chan error, 1)
					var late []uint64
					go func() {
						var err error
						late, err = orderedReadOnce(o, mode)
						done <- err
					}()
					for give := time.Now().Add(10 * time.Second); !o.r.C.W.Waiting(); {
						select {
						case err := <-done:
							t.Fatalf("a read with no deadline returned %v, %v without waiting", late, err)
						default:
						}
						if time.Now().After(give) {
							t.Fatal("a read with no deadline never waits")
						}
						time.Sleep(time.Millisecond)
					}
					f.emit(t, 0, 30, 6, 16)
					o.Flush()
					within(t, "the read after the next record", func() {
						err := <-done
						if len(late) == 0 || late[0] != 30 || err != nil && !errors.Is(err, ErrFlushed) {
							t.Errorf("the read with no deadline: %v, %v; want 30", late, err)
						}
					})
				})
			}
		}
	}
}

// The rings' keys interleave record by record, as two CPUs' timestamps do
// under a flood: every record hands the merge on to another ring (the
// root's swap with two rings, its sift with three), with now and then two
// keys in a row on one ring (a run of two). Every record goes in key order,
// none late, once.
func TestOrderedInterleaved(t *testing.T) {
	for _, rings := range []int{2, 3} {
		for _, mode := range []string{"ReadInto", "Each", "Batches"} {
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
				for i, st := range o.Stats().Rings {
					if st.Late != 0 {
						t.Fatalf("ring %d: %d late", i, st.Late)
					}
				}
			})
		}
	}
}
