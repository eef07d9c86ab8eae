// SPDX-License-Identifier: Apache-2.0

package perfbuf

// Test fakes: the package's owners (Reader, PerfBuffer, Raw) built over
// the fake perf rings of internal/ringtest (owner.Over).

import (
	"context"
	"errors"
	"testing"

	"github.com/perfbuf/perfbuf/internal/owner"
	"github.com/perfbuf/perfbuf/internal/policy"
	"golang.org/x/sys/unix"

	"github.com/perfbuf/perfbuf/internal/ring"
	"github.com/perfbuf/perfbuf/internal/ringtest"
)

// perfReader returns a RawBuffer over the fake perf ring f, CPU 1.
func perfReader(t testing.TB, f *ringtest.Perf) *RawBuffer {
	t.Helper()
	return newRawBuffer(perfRing(t, f, 1), nil)
}

// perfRing returns a reader of the fake perf ring f, CPU cpu.
func perfRing(t testing.TB, f *ringtest.Perf, cpu int) *ring.Perf {
	t.Helper()
	r, err := ring.NewPerfFromParts(cpu, f.Page, f.Data)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// fakeRings are fake perf rings with an eventfd each standing in for the
// perf event's fd: a producer signals it after publishing, as the kernel's
// wakeup makes the perf fd readable.
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
		out = append(out, perfRing(t, r, f.cpus[i]))
	}
	return out
}

// core returns an owner core over the rings, named as Open names a perf
// event array.
func (f *fakeRings) core(t testing.TB) *owner.Core {
	t.Helper()
	perf := f.perf(t)
	rings := make([]ring.Kind, len(perf))
	for i, rb := range perf {
		rings[i] = rb
	}
	c, err := owner.Over(rings, f.fds, `perf event array "fake"`, nil)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// wake makes ring i's fd readable.
func (f *fakeRings) wake(i int) { ringtest.Signal(f.fds[i]) }

// drainWake makes ring i's fd unreadable again (the kernel's perf_poll
// does this when it reports the ring).
func (f *fakeRings) drainWake(i int) {
	var b [8]byte
	unix.Read(f.fds[i], b[:])
}

// reader returns a Reader over the rings (ordered with opts.Order), closed
// when the test ends.
func (f *fakeRings) reader(t testing.TB, opts ReaderOptions) *Reader {
	t.Helper()
	r, err := f.newReader(t, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	return r
}

// newReader is NewReader's work after the rings are open, over the fake
// rings; the Reader fails if opts do.
func (f *fakeRings) newReader(t testing.TB, opts ReaderOptions) (*Reader, error) {
	t.Helper()
	p, err := opts.plan()
	if err != nil {
		return nil, err
	}
	return newReader(f.core(t), p), nil
}

// ordered returns a Reader over the rings that merges them with ord.
func (f *fakeRings) ordered(t testing.TB, ord Order) *Reader {
	t.Helper()
	return f.reader(t, ReaderOptions{Order: &ord})
}

// setBudget sets a fullest-first Reader's turn and the bytes it reads
// between two commits (internal: the defaults are a quarter of a ring and
// commitChunk). Call it before the first read.
func setBudget(r *Reader, n, chunk int) { r.r.Pol().(*policy.Fullest).SetTurn(n, chunk) }

// payload is a sample carrying a key and a sequence number.
func payload(key, seq uint64, size int) []byte { return ringtest.Keyed(key, seq, size) }

func (f *fakeRings) emit(t testing.TB, ring int, key, seq uint64, size int) {
	t.Helper()
	f.rings[ring].MustWrite(t, ringtest.PerfSample(payload(key, seq, size)))
}

// perfBuffer returns what New returns for sample and lost over the fake
// rings, CPU f.cpus[i] for ring i: newPerfBuffer, New's work after
// openRings, which needs a kernel. Closing it does not free the fake rings.
func (f *fakeRings) perfBuffer(t testing.TB, sample func(int, []byte), lost func(int, uint64)) *PerfBuffer {
	t.Helper()
	pb := newPerfBuffer(f.core(t), sample, lost)
	t.Cleanup(func() { pb.Close() })
	return pb
}

// raw returns what NewRaw returns over the fake rings, closed when the test
// ends.
func (f *fakeRings) raw(t testing.TB) *Raw {
	t.Helper()
	r := newRaw(f.core(t))
	t.Cleanup(func() { r.Close() })
	return r
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

// errStop is a function's error that ends a read, for tests.
var errStop = errors.New("stop")

// eachIn is Each (mode "Each") or the same through Batches (mode
// "Batches"): fn gets every record of every batch, and its error ends the
// loop as it ends Each.
func eachIn(r *Reader, mode string, ctx context.Context, fn func(*Record) error) error {
	if mode != "Batches" {
		return r.Each(ctx, fn)
	}
	for b, err := range r.Batches(ctx) {
		if err != nil {
			return err
		}
		for b.Next() {
			if err := fn(b.Record()); err != nil {
				return err
			}
		}
	}
	panic("Batches ended without an error")
}
