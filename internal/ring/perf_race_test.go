// SPDX-License-Identifier: Apache-2.0

package ring

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/perfbuf/perfbuf/internal/ringtest"
)

// TestPerfRingRace runs a producer goroutine that follows the kernel's protocol
// (ringtest.Perf: check the space against data_tail, write the record, then a release
// store of data_head) against a reader that parses and commits concurrently, as a
// policy does: Begin, Each (limited to a quarter ring), CommitCursor (a release store of
// data_tail), and a look with Quiet before it yields. Every sample carries a sequence
// number and a pattern derived from it; the reader checks that every sequence number
// arrives in order, each byte intact. In the lossy mode the producer drops samples when
// the ring is full and reports them with PERF_RECORD_LOST records, as the kernel does;
// the reader checks the counts add up exactly.
func TestPerfRingRace(t *testing.T) {
	total := uint64(3_000_000)
	if ringtest.RaceEnabled() {
		total = 200_000
	}
	if testing.Short() {
		total /= 10
	}
	for _, lossy := range []bool{false, true} {
		for _, steps := range []bool{false, true} {
			t.Run(fmt.Sprintf("lossy=%v/steps=%v", lossy, steps), func(t *testing.T) {
				testPerfRingRace(t, total, lossy, steps)
			})
		}
	}
}

// testPerfRingRace is TestPerfRingRace with Each's function, or with the
// plain samples in runs (steps), stepped through as the root's Batch does.
func testPerfRingRace(t *testing.T, total uint64, lossy, steps bool) {
	f := ringtest.NewPerf(64 << 10)
	r := perfReader(t, f)
	deadline := time.Now().Add(90 * time.Second) // bounds every wait below
	var stop atomic.Bool
	prodErr := make(chan error, 1)
	go func() {
		prodErr <- perfRaceProducer(f, total, lossy, &stop, deadline)
	}()
	defer func() {
		// The producer stops when it is done, when stop is set or at the deadline.
		stop.Store(true)
		select {
		case err := <-prodErr:
			if err != nil {
				t.Error(err)
			}
		case <-time.After(time.Until(deadline) + 10*time.Second):
			t.Error("producer did not stop")
		}
	}()

	var (
		want        uint64 // next sequence number expected
		pendingLost uint64 // lost samples reported but not yet seen as a gap
		lostTotal   uint64
		received    uint64
		buf         []byte
		finished    bool
		drains      int
		rec         Record
		never       atomic.Bool
		limit       = uint64(r.Size() / 4)
	)
	check := func(rec *Record) error {
		switch rec.Type {
		case Lost:
			if !lossy {
				return fmt.Errorf("lost record (%d) from a producer that waits", rec.Lost)
			}
			pendingLost += rec.Lost
			lostTotal += rec.Lost
			return nil
		case Sample:
		default:
			return fmt.Errorf("unexpected record %v at %d", rec.Type, rec.Pos)
		}
		buf = rec.AppendTo(buf[:0])
		if len(buf) < 12 {
			return fmt.Errorf("sample of %d bytes at %d", len(buf), rec.Pos)
		}
		seq := binary.NativeEndian.Uint64(buf)
		k := int(binary.NativeEndian.Uint32(buf[8:]))
		if seq != want+pendingLost {
			return fmt.Errorf("sequence %d, want %d (+%d lost) at %d", seq, want, pendingLost, rec.Pos)
		}
		if k > ringtest.RaceMaxBody || len(buf) != (12+k+4+7)&^7-4 {
			return fmt.Errorf("sequence %d: %d pattern bytes in a %d-byte payload", seq, k, len(buf))
		}
		off := ringtest.RacePatternOff(seq)
		if !bytes.Equal(buf[12:12+k], ringtest.RacePattern[off:off+uint64(k)]) {
			return fmt.Errorf("sequence %d: payload differs", seq)
		}
		for _, c := range buf[12+k:] {
			if c != 0 {
				return fmt.Errorf("sequence %d: padding not zero", seq)
			}
		}
		want, pendingLost = seq+1, 0
		received++
		if seq == total { // the producer's last sample
			finished = true
		}
		return nil
	}

	var sink *Sink
	if steps {
		sink = stepsSink(check)
	}
	for !finished {
		r.Begin()
		n, _, err := r.Each(&rec, limit, &never, check, sink)
		r.CommitCursor()
		drains++
		if err != nil {
			t.Fatalf("after %d samples: %v", received, err)
		}
		if n == 0 && r.Quiet() {
			if time.Now().After(deadline) {
				t.Fatalf("timed out after %d samples", received)
			}
			runtime.Gosched()
		}
	}
	if received+lostTotal != total+1 {
		t.Fatalf("received %d + lost %d, want %d", received, lostTotal, total+1)
	}
	st := r.Counts()
	if st.Samples != received || st.Lost != lostTotal || st.Corrupt != 0 || st.CorruptBytes != 0 || st.Other != 0 || st.MaxFill > r.Size() {
		t.Fatalf("counts %+v; received %d lost %d", st, received, lostTotal)
	}
	if !lossy && lostTotal != 0 {
		t.Fatalf("lost %d", lostTotal)
	}
	t.Logf("%d samples received, %d lost, %d drains", received, lostTotal, drains)
}

// appendPerfRaceSample encodes sample seq with k pattern bytes as a perf record:
// payload = u64 seq, u32 k, k pattern bytes (the payload carries its own length, since
// the kernel pads it).
func appendPerfRaceSample(dst []byte, seq uint64, k int) []byte {
	n := 12 + k
	raw := (n+4+7)&^7 - 4
	size := 8 + 4 + raw
	dst = append(dst[:0], make([]byte, size)...)
	binary.NativeEndian.PutUint32(dst[0:], 9) // PERF_RECORD_SAMPLE
	binary.NativeEndian.PutUint16(dst[6:], uint16(size))
	binary.NativeEndian.PutUint32(dst[8:], uint32(raw))
	binary.NativeEndian.PutUint64(dst[12:], seq)
	binary.NativeEndian.PutUint32(dst[20:], uint32(k))
	off := ringtest.RacePatternOff(seq)
	copy(dst[24:], ringtest.RacePattern[off:off+uint64(k)])
	return dst
}

// perfRaceProducer writes samples 0..total-1 of random sizes, then a last sample total
// that it waits room for. It publishes data_head after a random number of records (at
// least before each wait), like the kernel's nested writers that publish once for
// several records.
func perfRaceProducer(f *ringtest.Perf, total uint64, lossy bool, stop *atomic.Bool, deadline time.Time) error {
	rng := rand.New(rand.NewPCG(1, total))
	var rec []byte
	unpublished := 0
	for seq := uint64(0); seq <= total; seq++ {
		rec = appendPerfRaceSample(rec, seq, rng.IntN(ringtest.RaceMaxBody+1))
		if lossy && seq < total {
			if !f.Write(rec) {
				continue // counted in f.Lost, reported before the next sample that fits
			}
		} else {
			need := uint64(len(rec))
			if f.Lost > 0 {
				need += 24
			}
			for spins := 0; f.Space() < need; spins++ {
				if unpublished > 0 {
					f.Publish()
					unpublished = 0
				}
				if stop.Load() {
					return nil
				}
				if spins%1024 == 0 && time.Now().After(deadline) {
					return fmt.Errorf("producer timed out at sequence %d", seq)
				}
				runtime.Gosched()
			}
			if !f.Write(rec) {
				return fmt.Errorf("sequence %d did not fit", seq)
			}
		}
		unpublished++
		if unpublished >= 1+rng.IntN(8) {
			f.Publish()
			unpublished = 0
		}
	}
	f.Publish()
	return nil
}
