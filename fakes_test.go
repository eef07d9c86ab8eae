// SPDX-License-Identifier: Apache-2.0

package perfbuf

// Test fakes: perf rings in Go memory with a producer that follows the
// kernel's protocol, and the package's owners (core, Reader, PerfBuffer)
// built over them.

import (
	"encoding/binary"
	"fmt"
	"sync/atomic"
	"testing"

	"github.com/perfbuf/perfbuf/internal/kernel"
	"github.com/perfbuf/perfbuf/internal/policy"
	"golang.org/x/sys/unix"

	"github.com/perfbuf/perfbuf/internal/ring"
	"github.com/perfbuf/perfbuf/internal/ringtest"
)

// fakeRing is a perf ring in Go memory with a producer that follows the kernel's protocol
// (kernel/events/ring_buffer.c): check the space against data_tail, write the record at the
// producer's private head, then publish data_head with a release store.
type fakeRing struct {
	page *unix.PerfEventMmapPage
	data []byte
	head uint64 // the producer's private head (kernel: rb->head)
	lost uint64 // samples dropped for lack of space and not yet reported
}

func newFakeRing(size int) *fakeRing {
	return &fakeRing{page: new(unix.PerfEventMmapPage), data: make([]byte, size)}
}

// newFakeRingAt starts the ring at position pos (data_head = data_tail = pos).
func newFakeRingAt(size int, pos uint64) *fakeRing {
	f := newFakeRing(size)
	f.head = pos
	f.page.Data_head, f.page.Data_tail = pos, pos
	return f
}

func (f *fakeRing) reader(t testing.TB) *RawBuffer {
	t.Helper()
	return newRawBuffer(f.ring(t, 1), nil)
}

// perf returns the perf ring a RawBuffer over a fake ring reads.
func (b *RawBuffer) perf() *ring.Perf { return b.r.(*ring.Perf) }

// ring returns a reader of the ring, CPU cpu.
func (f *fakeRing) ring(t testing.TB, cpu int) *ring.Perf {
	t.Helper()
	r, err := ring.NewPerfFromParts(cpu, f.page, f.data)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// space is the kernel's CIRC_SPACE(head, tail, size): it leaves one byte unused, so with
// 8-byte records the ring never fills completely.
func (f *fakeRing) space() uint64 {
	// Pairs with the reader's StoreUint64 of data_tail (kernel: READ_ONCE + smp_mb in perf_output_begin).
	tail := atomic.LoadUint64(&f.page.Data_tail)
	return (tail - f.head - 1) & uint64(len(f.data)-1)
}

// put writes raw bytes at the producer's head, wrapping at the ring's end. No space check.
func (f *fakeRing) put(p []byte) {
	off := int(f.head & uint64(len(f.data)-1))
	n := copy(f.data[off:], p)
	copy(f.data, p[n:])
	f.head += uint64(len(p))
}

// publish makes everything written so far visible to the reader.
func (f *fakeRing) publish() {
	// Release, like smp_store_release(&user_page->data_head) in perf_output_put_handle.
	atomic.StoreUint64(&f.page.Data_head, f.head)
}

// fakeSample encodes a PERF_RECORD_SAMPLE carrying payload, padded as the kernel pads
// bpf_perf_event_output data: raw size round_up(n+4, 8)-4.
func fakeSample(payload []byte) []byte {
	raw := (len(payload)+4+7)&^7 - 4
	rec := make([]byte, 8+4+raw)
	binary.NativeEndian.PutUint32(rec[0:], unix.PERF_RECORD_SAMPLE)
	binary.NativeEndian.PutUint16(rec[6:], uint16(len(rec)))
	binary.NativeEndian.PutUint32(rec[8:], uint32(raw))
	copy(rec[12:], payload)
	return rec
}

// fakeLost encodes a PERF_RECORD_LOST.
func fakeLost(id, lost uint64) []byte {
	rec := make([]byte, 24)
	binary.NativeEndian.PutUint32(rec[0:], unix.PERF_RECORD_LOST)
	binary.NativeEndian.PutUint16(rec[6:], 24)
	binary.NativeEndian.PutUint64(rec[8:], id)
	binary.NativeEndian.PutUint64(rec[16:], lost)
	return rec
}

// fakeRecord encodes a record of any type with the given body; size is the header's size field.
func fakeRecord(typ uint32, size uint16, body []byte) []byte {
	rec := make([]byte, 8+len(body))
	binary.NativeEndian.PutUint32(rec[0:], typ)
	binary.NativeEndian.PutUint16(rec[6:], size)
	copy(rec[8:], body)
	return rec
}

// write writes one record if it fits, as perf_output_begin does; otherwise it counts a lost
// sample. Pending lost samples are reported first with a PERF_RECORD_LOST in the same
// reservation. It does not publish.
func (f *fakeRing) write(rec []byte) bool {
	need := uint64(len(rec))
	if f.lost > 0 {
		need += 24
	}
	if f.space() < need {
		f.lost++
		return false
	}
	if f.lost > 0 {
		f.put(fakeLost(0, f.lost))
		f.lost = 0
	}
	f.put(rec)
	return true
}

// mustWrite writes and publishes one record.
func (f *fakeRing) mustWrite(t testing.TB, rec []byte) {
	t.Helper()
	if !f.write(rec) {
		t.Fatalf("no room for a %d-byte record", len(rec))
	}
	f.publish()
}

// fakePadded returns payload padded with zeros as the kernel pads it.
func fakePadded(payload []byte) []byte {
	out := make([]byte, (len(payload)+4+7)&^7-4)
	copy(out, payload)
	return out
}

// fakeCollect reads every record up to the head snapshot without committing.

// fakeRings are fake perf rings with an eventfd each standing in for the
// perf event's fd: a producer signals it after publishing, as the kernel's
// wakeup makes the perf fd readable.
type fakeRings struct {
	rings []*fakeRing
	fds   []int
	cpus  []int // the CPU behind ring i; i unless a test says otherwise
}

func newFakeRings(t testing.TB, n, size int) *fakeRings {
	t.Helper()
	f := &fakeRings{}
	for i := 0; i < n; i++ {
		f.rings = append(f.rings, newFakeRing(size))
		f.cpus = append(f.cpus, i)
		fd, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
		if err != nil {
			t.Fatal(err)
		}
		f.fds = append(f.fds, fd)
		t.Cleanup(func() { unix.Close(fd) })
	}
	return f
}

// perf returns readers of the rings, CPU f.cpus[i] for ring i.
func (f *fakeRings) perf(t testing.TB) []*ring.Perf {
	t.Helper()
	var out []*ring.Perf
	for i, r := range f.rings {
		out = append(out, r.ring(t, f.cpus[i]))
	}
	return out
}

// core returns an owner core over the rings, with src (nil for none) as
// what it opened.
func (f *fakeRings) core(t testing.TB, src *rings) *core {
	t.Helper()
	var c *core
	var err error
	perf, fds := f.perf(t), f.fds
	if src != nil {
		perf, fds = src.ring, src.fds
	}
	rings := make([]ring.Kind, len(perf))
	for i, rb := range perf {
		rings[i] = rb
	}
	c, err = newCore(rings, fds)
	if err != nil {
		t.Fatal(err)
	}
	// Named as openCore names a perf event array.
	c.what = describeMaps(mapDesc{typ: mapTypePerfEventArray, name: "fake"}, 0)
	if src != nil { // (a nil *rings in the interface would not be nil)
		c.src = src
	}
	return c
}

// wake makes ring i's fd readable.
func (f *fakeRings) wake(i int) {
	var one [8]byte
	binary.NativeEndian.PutUint64(one[:], 1)
	unix.Write(f.fds[i], one[:])
}

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
	r, err := f.newReader(t, nil, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	return r
}

// newReader is NewReader's work after the rings are open, over the fake
// rings or src's; the Reader fails if opts do.
func (f *fakeRings) newReader(t testing.TB, src *rings, opts ReaderOptions) (*Reader, error) {
	t.Helper()
	p, err := opts.plan()
	if err != nil {
		return nil, err
	}
	return newReader(f.core(t, src), p), nil
}

// ordered returns a Reader over the rings that merges them with ord.
func (f *fakeRings) ordered(t testing.TB, ord Order) *Reader {
	t.Helper()
	return f.reader(t, ReaderOptions{Order: &ord})
}

// setBudget sets a fullest-first Reader's turn and the bytes it reads
// between two commits (internal: the defaults are a quarter of a ring and
// commitChunk). Call it before the first read.
func setBudget(r *Reader, n, chunk int) { policy.SetBudget(r.pol, n, chunk) }

// payload is a sample carrying a key and a sequence number.
func payload(key, seq uint64, size int) []byte {
	p := make([]byte, max(size, 16))
	binary.NativeEndian.PutUint64(p, key)
	binary.NativeEndian.PutUint64(p[8:], seq)
	for i := 16; i < len(p); i++ {
		p[i] = byte(seq) + byte(i)
	}
	return p
}

func (f *fakeRings) emit(t testing.TB, ring int, key, seq uint64, size int) {
	t.Helper()
	f.rings[ring].mustWrite(t, fakeSample(payload(key, seq, size)))
}

// perfBuffer returns what New returns for sample and lost over the fake
// rings, CPU f.cpus[i] for ring i: newPerfBuffer, New's work after
// openRings, which needs a kernel. Closing it does not free the fake rings.
func (f *fakeRings) perfBuffer(t testing.TB, sample func(int, []byte), lost func(int, uint64)) *PerfBuffer {
	t.Helper()
	return f.newPerfBuffer(t, nil, sample, lost)
}

// newPerfBuffer is New's work after the rings are open, over the fake
// rings or src's, closed when the test ends.
func (f *fakeRings) newPerfBuffer(t testing.TB, src *rings, sample func(int, []byte), lost func(int, uint64)) *PerfBuffer {
	t.Helper()
	pb := newPerfBuffer(f.core(t, src), sample, lost)
	t.Cleanup(func() { pb.Close() })
	return pb
}

// raw returns what NewRaw returns over the fake rings, closed when the test
// ends.
func (f *fakeRings) raw(t testing.TB) *Raw {
	t.Helper()
	return f.newRaw(t, nil)
}

// newRaw is NewRaw's work after the rings are open, over the fake rings or
// src's, closed when the test ends.
func (f *fakeRings) newRaw(t testing.TB, src *rings) *Raw {
	t.Helper()
	r := newRaw(f.core(t, src))
	t.Cleanup(func() { r.Close() })
	return r
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

// bpfReader returns a reader of the fake ring buffer f.
func bpfReader(t testing.TB, f *ringtest.RingBuf) *ring.RingBuf {
	t.Helper()
	r, err := ring.NewRingBufFromParts(-1, &f.Pos[0], &f.Pos[1], f.Data)
	if err != nil {
		t.Fatal(err)
	}
	return r
}
