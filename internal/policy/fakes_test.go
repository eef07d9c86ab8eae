// SPDX-License-Identifier: Apache-2.0

package policy

// Sets of fake rings (internal/ringtest) for the policies' tests, and a
// read loop that drives a policy as a Reader's read does.

import (
	"encoding/binary"
	"testing"

	"github.com/perfbuf/perfbuf/internal/ring"
	"github.com/perfbuf/perfbuf/internal/ringtest"
)

// perfSet returns a Set over n fake perf rings of size bytes, ring i of
// CPU i.
func perfSet(t testing.TB, n, size int) (*Set, []*ringtest.Perf) {
	t.Helper()
	s := &Set{Latency: -1}
	var fakes []*ringtest.Perf
	for i := range n {
		f := ringtest.NewPerf(size)
		p, err := ring.NewPerfFromParts(i, f.Page, f.Data)
		if err != nil {
			t.Fatal(err)
		}
		s.Push(p)
		fakes = append(fakes, f)
	}
	return s, fakes
}

// ringBufSet returns a Set over n fake ring buffers of size bytes, each
// shared by CPUs.
func ringBufSet(t testing.TB, n, size int) (*Set, []*ringtest.RingBuf) {
	t.Helper()
	s := &Set{Latency: -1}
	var fakes []*ringtest.RingBuf
	for range n {
		f := ringtest.NewRingBuf(size)
		rb, err := ring.NewRingBufFromParts(-1, &f.Pos[0], &f.Pos[1], f.Data)
		if err != nil {
			t.Fatal(err)
		}
		s.Push(rb)
		fakes = append(fakes, f)
	}
	return s, fakes
}

// keyed returns an n-byte payload (at least 8) whose first 8 bytes are key.
func keyed(key uint64, n int) []byte {
	b := make([]byte, max(n, 8))
	binary.NativeEndian.PutUint64(b, key)
	return b
}

// emitPerf writes and publishes a sample of payload n bytes with key.
func emitPerf(t *testing.T, f *ringtest.Perf, key uint64, n int) {
	t.Helper()
	f.MustWrite(t, ringtest.PerfSample(keyed(key, n)))
}

// got is a record delivered: its ring, type, key and lost count.
type got struct {
	ring int
	typ  ring.RecordType
	key  uint64
	late bool
	lost uint64
}

// keysOf returns the samples' keys.
func keysOf(gs []got) []uint64 {
	var k []uint64
	for _, g := range gs {
		if g.typ == ring.Sample {
			k = append(k, g.key)
		}
	}
	return k
}

// payloadKey reads the key a test wrote at a payload's start.
func payloadKey(rec *ring.Record) uint64 {
	b := rec.AppendTo(nil)
	if len(b) < 8 {
		return 0
	}
	return binary.NativeEndian.Uint64(b)
}

// readAll reads p as a Reader's ReadInto does, Next and Delivered a
// record, until none is to deliver now; a Flush requested is taken up and
// run to its end. It returns what was delivered and the corruptions
// reported.
func readAll(t *testing.T, s *Set, p Reading) ([]got, []error) {
	t.Helper()
	var out []got
	var errs []error
	for idle := 0; ; {
		if idle > 100 {
			t.Fatalf("spins: %d reads in a row deliver nothing (delivered %v)", idle, out)
		}
		if rec, i := p.Next(); i >= 0 {
			if rec.Ring != i {
				t.Fatalf("record of ring %d delivered for ring %d", rec.Ring, i)
			}
			out = append(out, got{i, rec.Type, rec.Key, rec.Late, rec.Lost})
			p.Delivered(i)
			idle = 0
			continue
		}
		if s.Corrupt != nil {
			errs, s.Corrupt = append(errs, s.Corrupt), nil
			continue
		}
		p.Idle()
		if s.Flushing() {
			if s.FlushReached(p) {
				s.EndFlush()
				return out, errs
			}
			idle++
			continue
		}
		return out, errs
	}
}

// flushAll requests a Flush and reads to its end.
func flushAll(t *testing.T, s *Set, p Reading) []got {
	t.Helper()
	s.RequestFlush()
	out, errs := readAll(t, s, p)
	if len(errs) > 0 {
		t.Fatalf("flush: %v", errs)
	}
	return out
}
