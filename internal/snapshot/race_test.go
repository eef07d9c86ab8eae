// SPDX-License-Identifier: Apache-2.0

package snapshot

import (
	"errors"
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
)

// Snapshots of a BPF ring buffer in overwrite mode while a producer goroutine goes on
// writing, as the kernel's producers do: every record handed out is whole (its payload
// matches its seq) and the records of one snapshot are in write order. The producer yields
// after each step (runtime.Gosched) rather than spin, so that it never holds a P the
// snapshots need; with two Ps the two run at once. Run with -race: the fake producer's
// stores and the parser's loads are atomic, as the kernel's and ours are.
func TestBPFRace(t *testing.T) {
	const size = 4096
	f := newFakeRB(size)
	var stop atomic.Bool
	var written atomic.Uint64
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for seq := uint64(0); !stop.Load(); seq++ {
			p := payload(seq, 9+int(seq*53%200))
			pos, ok := f.reserve(len(p))
			if !ok {
				continue // never with one producer that commits before it reserves again
			}
			runtime.Gosched() // reserved, not written: busy for a while
			f.write(pos, p)
			if seq%7 == 0 {
				runtime.Gosched() // written, not committed
			}
			f.commit(pos, seq%13 == 0)
			written.Store(seq + 1)
			runtime.Gosched()
		}
	}()
	defer wg.Wait()
	defer stop.Store(true)

	buf := make([]byte, size)
	var recs []Record
	var total Counts
	var returned int
	for range 3000 {
		s, err := BPF(f.ring(), buf, recs, BPFOptions{})
		if err != nil {
			t.Fatal(err)
		}
		recs = s.Records
		if s.Corrupt {
			t.Fatalf("corrupt snapshot of a ring the producer writes correctly: %+v", s.Counts)
		}
		last := int64(-1)
		for _, r := range s.Records {
			seq, ok := checkPayload(r.Data)
			if !ok {
				t.Fatalf("torn record handed out at %d (seq %d): % x", r.Pos, seq, r.Data)
			}
			if int64(seq) <= last || seq%13 == 0 {
				t.Fatalf("seq %d after %d (discarded every 13th)", seq, last)
			}
			last = int64(seq)
		}
		returned += len(s.Records)
		total.Busy += s.Busy
		total.Discarded += s.Discarded
		total.Overwritten += s.Overwritten
		if s.Lapped {
			total.Lapped = true
		}
		runtime.Gosched()
	}
	t.Logf("%d records written, %d returned by 3000 snapshots; skipped: %d busy, %d discarded, %d overwritten while copied",
		written.Load(), returned, total.Busy, total.Discarded, total.Overwritten)
}

// Snapshots of a backward perf ring taken as internal/kernel takes them: pause the output,
// wait for the writers in flight (here a mutex that each write holds, as each of the
// kernel's writes runs inside an RCU read-side section), copy, resume. Writes refused
// while paused are counted, as the kernel counts them lost. Run with -race.
func TestPerfRace(t *testing.T) {
	const size = 2048
	f := newFakePerf(size)
	var (
		stop, paused atomic.Bool
		inWrite      sync.Mutex // held by each write: what WaitWriters waits for
		refused      atomic.Uint64
		wg           sync.WaitGroup
	)
	wg.Add(1)
	go func() {
		defer wg.Done()
		for seq := uint64(0); !stop.Load(); {
			inWrite.Lock()
			if paused.Load() {
				refused.Add(1)
			} else {
				f.sample(payload(seq, 9+int(seq*31%150)))
				seq++
			}
			inWrite.Unlock()
			runtime.Gosched()
		}
	}()
	defer wg.Wait()
	defer stop.Store(true)

	buf := make([]byte, size)
	var recs []Record
	returned := 0
	for range 2000 {
		// PERF_EVENT_IOC_PAUSE_OUTPUT, then WaitWriters: once the lock is ours, no
		// write is in flight, and every later one sees the pause.
		inWrite.Lock()
		paused.Store(true)
		inWrite.Unlock()
		s, err := Perf(f.ring(), buf, recs, PerfOptions{})
		paused.Store(false)
		if err != nil {
			t.Fatal(err)
		}
		recs = s.Records
		if s.Corrupt || s.Overwritten != 0 {
			t.Fatalf("paused ring: %+v", s.Counts)
		}
		last := int64(-1)
		for _, r := range s.Records {
			seq, ok := checkPayload(r.Data)
			if !ok || int64(seq) != last+1 && last >= 0 {
				t.Fatalf("record at %d: seq %d (intact %v) after %d", r.Pos, seq, ok, last)
			}
			last = int64(seq)
		}
		returned += len(s.Records)
		runtime.Gosched()
	}
	t.Logf("2000 snapshots returned %d records; %d writes refused while paused", returned, refused.Load())
}

// A perf ring read while a producer goes on writing, with Settle waiting for the writer
// in flight (what WaitWriters does) instead of a pause: every record returned is whole
// and in order, and nothing is refused. Run with -race.
func TestPerfRaceSettle(t *testing.T) {
	const size = 2048
	f := newFakePerf(size)
	var (
		stop    atomic.Bool
		inWrite sync.Mutex // held by each write: what Settle waits for
		wg      sync.WaitGroup
	)
	wg.Add(1)
	go func() {
		defer wg.Done()
		for seq := uint64(0); !stop.Load(); seq++ {
			inWrite.Lock()
			f.sample(payload(seq, 9+int(seq*31%150)))
			inWrite.Unlock()
			runtime.Gosched()
		}
	}()
	defer wg.Wait()
	defer stop.Store(true)
	settles := 0
	settle := func() error {
		inWrite.Lock() // once it is ours, the write in flight has published its head
		settles++
		inWrite.Unlock()
		return nil
	}

	buf := make([]byte, size)
	var recs []Record
	returned, overwritten := 0, uint64(0)
	for range 2000 {
		s, err := Perf(f.ring(), buf, recs, PerfOptions{Settle: settle})
		if err != nil {
			t.Fatal(err)
		}
		recs = s.Records
		if s.Corrupt {
			t.Fatalf("corrupt: %+v", s.Counts)
		}
		last := int64(-1)
		for _, r := range s.Records {
			seq, ok := checkPayload(r.Data)
			if !ok || int64(seq) != last+1 && last >= 0 {
				t.Fatalf("record at %d: seq %d (intact %v) after %d", r.Pos, seq, ok, last)
			}
			last = int64(seq)
		}
		returned += len(s.Records)
		overwritten += s.Overwritten
		runtime.Gosched()
	}
	t.Logf("%d snapshots returned %d records; %d dropped as overwritten while copied", settles, returned, overwritten)
}

// A writer that publishes during Settle reused the oldest records' bytes: they are
// dropped, the newer ones kept.
func TestPerfSettleDrops(t *testing.T) {
	f := newFakePerf(128)
	for i := range uint64(8) {
		f.sample(payload(i, 12)) // 24 bytes each: the window holds 3..7 (120 bytes)
	}
	settle := func() error { f.sample(payload(8, 12)); return nil } // reuses 3's bytes
	s, err := Perf(f.ring(), make([]byte, 256), nil, PerfOptions{Settle: settle})
	if err != nil {
		t.Fatal(err)
	}
	wantSamples(t, s, []uint64{4, 5, 6, 7})
	if s.Overwritten != 1 {
		t.Errorf("counts %+v, want 1 overwritten", s.Counts)
	}
	if _, err := Perf(f.ring(), make([]byte, 256), nil, PerfOptions{Settle: func() error { return syscall.EINTR }}); !errors.Is(err, syscall.EINTR) {
		t.Errorf("settle error: %v", err)
	}
}
