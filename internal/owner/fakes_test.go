// SPDX-License-Identifier: Apache-2.0

package owner

// Test fakes: owner cores, Readers and PerfBuffers over the fake rings of
// internal/ringtest, each with an eventfd standing in for its perf event
// or its map's descriptor.

import (
	"fmt"
	"testing"
	"time"

	"github.com/perfbuf/perfbuf/internal/kernel"
	"github.com/perfbuf/perfbuf/internal/policy"
	"github.com/perfbuf/perfbuf/internal/ring"
	"github.com/perfbuf/perfbuf/internal/ringtest"
)

// mapFD is a bare descriptor as a Map.
type mapFD int

func (fd mapFD) FileDescriptor() int { return int(fd) }

// defaultPlan is a Reader's plan with the root's default options: a
// latency budget of 10 ms.
var defaultPlan = Plan{Ring: RingOptions{Budget: true}, Latency: 10 * time.Millisecond}

// fakeRings are fake perf rings: a producer signals a ring's eventfd after
// publishing, as the kernel's wakeup makes the perf fd readable.
type fakeRings struct {
	rings []*ringtest.Perf
	fds   []int
	cpus  []int // the CPU behind ring i; i unless a test says otherwise
}

func newFakeRings(t testing.TB, n, size int) *fakeRings {
	t.Helper()
	f := &fakeRings{}
	for i := 0; i < n; i++ {
		f.rings = append(f.rings, ringtest.NewPerf(size))
		f.cpus = append(f.cpus, i)
		f.fds = append(f.fds, ringtest.EventFD(t))
	}
	return f
}

// perf returns readers of the rings, CPU f.cpus[i] for ring i.
func (f *fakeRings) perf(t testing.TB) []*ring.Perf {
	t.Helper()
	var out []*ring.Perf
	for i, r := range f.rings {
		rb, err := ring.NewPerfFromParts(f.cpus[i], r.Page, r.Data)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, rb)
	}
	return out
}

// core returns an owner core over the rings, named as Open names a perf
// event array; over src's rings, with src as what opened them, if src is
// not nil.
func (f *fakeRings) core(t testing.TB, src *rings) *Core {
	t.Helper()
	if src == nil {
		var kinds []ring.Kind
		for _, rb := range f.perf(t) {
			kinds = append(kinds, rb)
		}
		c, err := Over(kinds, f.fds, `perf event array "fake"`, nil)
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	c, err := newCore(src.opened())
	if err != nil {
		t.Fatal(err)
	}
	c.src, c.what = src, `perf event array "fake"`
	return c
}

// wake makes ring i's fd readable.
func (f *fakeRings) wake(i int) { ringtest.Signal(f.fds[i]) }

// payload is a sample carrying a key and a sequence number.
func payload(key, seq uint64, size int) []byte { return ringtest.Keyed(key, seq, size) }

func (f *fakeRings) emit(t testing.TB, ring int, key, seq uint64, size int) {
	t.Helper()
	f.rings[ring].MustWrite(t, ringtest.PerfSample(payload(key, seq, size)))
}

// reader returns a Reader over the rings, or src's, with the plan p,
// closed when the test ends.
func (f *fakeRings) reader(t testing.TB, src *rings, p Plan) *Reader {
	t.Helper()
	r := NewReader(f.core(t, src), p)
	t.Cleanup(r.C.Close)
	return r
}

// perfBuffer returns a PerfBuffer over the rings, or src's, closed when
// the test ends.
func (f *fakeRings) perfBuffer(t testing.TB, src *rings, sample func(int, []byte), lost func(int, uint64)) *PerfBuffer {
	t.Helper()
	pb := NewPerfBuffer(f.core(t, src), sample, lost)
	t.Cleanup(pb.C.Close)
	return pb
}

// hotRings returns rings over f's fake rings that track CPUs through a
// test's CPUWatch (no socket: watch.Note plays the kernel's uevent), with
// CPUs below limit allowed a ring. A CPU that comes online gets the next
// ring of spare, whose CPUs must match.
func (f *fakeRings) hotRings(t testing.TB, limit int, spare *fakeRings) *rings {
	t.Helper()
	r := &rings{limit: limit, watch: &kernel.CPUWatch{}}
	for i, rb := range f.perf(t) {
		r.push(int32(f.cpus[i]), rb, f.fds[i], ringSrc{})
	}
	spareRaw := spare.perf(t)
	next := 0
	r.openCPU = func(cpu int32) (*ring.Perf, int, ringSrc, error) {
		if next == len(spareRaw) || spare.cpus[next] != int(cpu) {
			return nil, 0, ringSrc{}, fmt.Errorf("no spare ring for cpu %d", cpu)
		}
		next++
		return spareRaw[next-1], spare.fds[next-1], ringSrc{}, nil
	}
	return r
}

// fakeBPFRings are fake BPF ring buffers: a commit that the kernel's rule
// makes wake the reader (consumer_pos at the record) signals the ring's
// eventfd.
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

// bpfReader returns a reader of the fake ring buffer f.
func bpfReader(t testing.TB, f *ringtest.RingBuf) *ring.RingBuf {
	t.Helper()
	r, err := ring.NewRingBufFromParts(-1, &f.Pos[0], &f.Pos[1], f.Data)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// within runs fn and fails the test if it has not returned within 5s.
func within(t *testing.T, what string, fn func()) {
	t.Helper()
	done := make(chan struct{})
	go func() {
		defer close(done)
		fn()
	}()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatalf("%s: still blocked after 5s", what)
	}
}

// The root's names, for tests written against them.
type (
	Sample = ring.Copy
	Record = ring.Record
)

// order is an Order of the root's: keys at offset 0, MaxDelay maxDelay,
// the key window its nanoseconds.
func order(maxDelay time.Duration) *policy.OrderConfig {
	return &policy.OrderConfig{MaxDelay: maxDelay, Window: uint64(maxDelay.Nanoseconds())}
}

// The root's methods over the owner's Reader and PerfBuffer: what
// perfbuf.Reader and perfbuf.PerfBuffer call.
func (r *Reader) Close()                { r.C.Close() }
func (r *Reader) Stats() []Stats        { return r.C.Stats() }
func (r *Reader) Pause() error          { return r.C.SetPaused("pause "+r.C.Name(), true) }
func (r *Reader) Resume() error         { return r.C.SetPaused("resume "+r.C.Name(), false) }
func (pb *PerfBuffer) Close()           { pb.C.Close() }
func (pb *PerfBuffer) Stats() []Stats   { return pb.C.Stats() }
func (pb *PerfBuffer) BufferCount() int { return pb.C.Count() }
func (pb *PerfBuffer) Pause() error     { return pb.C.SetPaused("pause "+pb.C.Name(), true) }
func (pb *PerfBuffer) Resume() error    { return pb.C.SetPaused("resume "+pb.C.Name(), false) }

// Total is the number of failed outputs of every cause.
func (f Failures) Total() uint64 {
	return f.NoEntry + f.TooBig + f.Invalid + f.NotOnCPU + f.Other + f.Full
}

// emit outputs a sample with key and seq (16 bytes, then size-16 more) to
// ring i.
func (f *fakeBPFRings) emit(t testing.TB, i int, key, seq uint64, size int) {
	t.Helper()
	f.rings[i].Output(t, payload(key, seq, size))
}
