// SPDX-License-Identifier: Apache-2.0

package owner

// The consumer lock of ring buffers and the takeover (ringbufmaps.go,
// presence.go), over fake ring buffers: two sources over one ring, as
// readers in two processes have (one process cannot open two readers of a
// map: claimMap), with a lock folder of the test's own.

import (
	"encoding/binary"
	"errors"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/perfbuf/perfbuf/internal/kernel"
	"github.com/perfbuf/perfbuf/internal/ring"
	"golang.org/x/sys/unix"
)

// fakeLockID is the map ID the fake rings' lock files are named by: no real
// map's (claimMap never sees it).
const fakeLockID = 0xfff0_0000

// source returns a ringBufSource over readers of f's rings, ring i with
// map ID fakeLockID+i, whose consumer locks it took as openRingBufs does,
// in dir.
func (f *fakeBPFRings) source(t testing.TB, dir string) *ringBufSource {
	t.Helper()
	s := &ringBufSource{epfd: -1, grace: func() {}, lockDir: dir}
	for i, r := range f.rings {
		s.rings = append(s.rings, bpfReader(t, r))
		s.fds = append(s.fds, f.fds[i])
		s.names = append(s.names, "fake")
		s.one = append(s.one, false)
		s.ids = append(s.ids, fakeLockID+uint32(i))
	}
	if err := s.lock(); err != nil {
		s.close()
		t.Fatal(err)
	}
	return s
}

// sourceCore returns an owner core over s, as Open makes.
func sourceCore(t testing.TB, s *ringBufSource) *Core {
	t.Helper()
	c, err := newCore(s.opened())
	if err != nil {
		s.close()
		t.Fatal(err)
	}
	c.src = s
	return c
}

// A second reader of a ring buffer takes no record while the first holds
// its consumer lock: its ring has no Stats entry, its read waits. Once the
// first closed, it takes the ring over where the first committed: every
// record is delivered once, by one of the two, the second's after the
// first's Close returned, and its Found is what the first left. In each
// form that reads ring buffers.
func TestRingBufTakeoverAtClose(t *testing.T) {
	const first, second, taken = 100, 100, 40
	forms := []struct {
		name string
		// run reads c's records until stop is closed, calling got for
		// each, and returns the reader's Stats and Close.
		run func(t *testing.T, c *Core, got func(seq uint64), stop chan struct{}) (stats func() []Stats, closeFn func())
	}{
		{"Reader", func(t *testing.T, c *Core, got func(uint64), stop chan struct{}) (func() []Stats, func()) {
			r := NewReader(c, defaultPlan)
			go readerLoop(r, got)
			return r.Stats, func() { r.Close() }
		}},
		{"ordered Reader", func(t *testing.T, c *Core, got func(uint64), stop chan struct{}) (func() []Stats, func()) {
			r := NewReader(c, Plan{Ring: defaultPlan.Ring, Latency: defaultPlan.Latency, Order: order(time.Millisecond)})
			go readerLoop(r, got)
			return r.Stats, func() { r.Close() }
		}},
		{"callback", func(t *testing.T, c *Core, got func(uint64), stop chan struct{}) (func() []Stats, func()) {
			pb := NewPerfBuffer(c, func(_ int, data []byte) { got(binary.NativeEndian.Uint64(data[8:])) }, nil)
			go func() {
				for {
					select {
					case <-stop:
						return
					default:
					}
					if _, err := pb.Poll(time.Second); err != nil {
						return
					}
				}
			}()
			return pb.Stats, func() { pb.Close() }
		}},
		{"Raw", func(t *testing.T, c *Core, got func(uint64), stop chan struct{}) (func() []Stats, func()) {
			r := NewRaw(c)
			go func() {
				for {
					ready, err := r.Wait(time.Second, nil)
					if err != nil {
						return
					}
					for _, i := range ready {
						v, release, err := r.Buffer(i)
						if err != nil {
							return
						}
						var rec Record
						var stop atomic.Bool
						v.Begin()
						v.Each(&rec, math.MaxUint64, &stop, func(rec *Record) error {
							got(binary.NativeEndian.Uint64(rec.Data[8:]))
							return nil
						}, nil)
						v.Cur().CommitCursor()
						release(0)
					}
				}
			}()
			return r.C.Stats, r.C.Close
		}},
	}
	for _, form := range forms {
		t.Run(form.name, func(t *testing.T) {
			f := newFakeBPFRings(t, 1, 4096)
			dir := t.TempDir()
			output := func(from, n uint64) {
				for seq := from; seq < from+n; seq++ {
					f.emit(t, 0, seq, seq, 16)
				}
			}
			output(0, first)

			a := sourceCore(t, f.source(t, dir))
			ra := NewReader(a, defaultPlan)
			t.Cleanup(func() { ra.Close() })

			sb := f.source(t, dir)
			if len(sb.rings) != 0 || len(sb.tk.rings) != 1 {
				t.Errorf("the second source reads %d rings, waits for %d; want 0, 1", len(sb.rings), len(sb.tk.rings))
			}
			// The first reader drops its consumer lock inside Close, once
			// it committed: the second may take over before Close returns,
			// never before Close began.
			var aClosing atomic.Bool
			early := make(chan uint64, 1)
			gotB := make(chan uint64, first+second)
			stop := make(chan struct{})
			defer close(stop)
			stats, closeB := form.run(t, sourceCore(t, sb), func(seq uint64) {
				if !aClosing.Load() {
					select {
					case early <- seq:
					default:
					}
				}
				gotB <- seq
			}, stop)
			defer closeB()
			if st := stats(); len(st) != 0 {
				t.Errorf("the waiting reader's Stats: %+v; want no entry", st)
			}

			ra.SetDeadline(time.Now().Add(10 * time.Second))
			var s Sample
			for want := range uint64(taken) {
				if err := ra.ReadInto(&s); err != nil {
					t.Fatal(err)
				}
				if seq := binary.NativeEndian.Uint64(s.Data[8:]); seq != want {
					t.Fatalf("the first reader read seq %d, want %d", seq, want)
				}
			}
			aClosing.Store(true)
			ra.Close()

			recv := func(from, to uint64) {
				t.Helper()
				for want := from; want < to; want++ {
					select {
					case seq := <-gotB:
						if seq != want {
							t.Fatalf("the second reader delivered seq %d, want %d", seq, want)
						}
					case <-time.After(10 * time.Second):
						t.Fatalf("the second reader delivered nothing past seq %d", want)
					}
				}
			}
			recv(taken, first)
			if st := stats(); len(st) != 1 || st[0].Found != first-taken {
				t.Fatalf("the second reader's Stats after the takeover: %+v; want one ring, Found %d", st, first-taken)
			}
			output(first, second)
			recv(first, first+second)
			select {
			case seq := <-early:
				t.Fatalf("the second reader delivered seq %d before the first one's Close began", seq)
			default:
			}
		})
	}
}

// Callback mode's Poll adds and drains the ring that its takeover won even
// when the takeover's poke went to an earlier Poll, whose wait had ended
// for its timeout just before, and whose check of the wake took it: the
// ring not added yet, and nothing left to wake the next Poll. Poll then
// waited on a set without the ring, for good, until a Consume
// (selftest/crossproc's NewThenOldCloses in callback mode, 5.10 guest).
func TestPollAfterTakeoverPokeTaken(t *testing.T) {
	const n = 10
	f := newFakeBPFRings(t, 1, 4096)
	dir := t.TempDir()
	for seq := range uint64(n) {
		f.emit(t, 0, seq, seq, 16)
	}
	ra := NewReader(sourceCore(t, f.source(t, dir)), defaultPlan)
	var got []uint64
	pb := NewPerfBuffer(sourceCore(t, f.source(t, dir)), func(_ int, data []byte) {
		got = append(got, binary.NativeEndian.Uint64(data[8:]))
	}, nil)
	defer pb.Close()
	ra.Close()
	// The takeover's goroutine wins the lock, sets Pending, then pokes.
	// (A takeover that never pokes is the test binary's -test.timeout to
	// report, with the goroutines' stacks.)
	for !pb.C.W.Woken() {
		time.Sleep(time.Millisecond)
	}
	pb.C.W.ClearWake() // the earlier Poll's check, after its wait's timeout
	k, err := pb.Poll(100 * time.Millisecond)
	if err != nil || k != n || len(got) != n {
		t.Fatalf("Poll after the takeover's poke was taken: %d, %v, delivered %v; want %d", k, err, got, n)
	}
}

// readerLoop reads r until it fails, calling got with each sample's seq.
func readerLoop(r *Reader, got func(uint64)) {
	var s Sample
	for {
		if err := r.ReadInto(&s); err != nil {
			return
		}
		got(binary.NativeEndian.Uint64(s.Data[8:]))
	}
}

// A waiting reader's read waits until its deadline, as any read, and
// Close returns it; a wait with the ring's map descriptor readable (the
// ring holds records) does not spin: the waiting ring is not polled.
func TestRingBufWaitingRead(t *testing.T) {
	f := newFakeBPFRings(t, 1, 4096)
	dir := t.TempDir()
	a := sourceCore(t, f.source(t, dir))
	ra := NewReader(a, defaultPlan)
	defer ra.Close()
	f.emit(t, 0, 1, 1, 16) // the eventfd is readable from here on
	var one [8]byte
	binary.NativeEndian.PutUint64(one[:], 1)
	unix.Write(f.fds[0], one[:])

	rb := NewReader(sourceCore(t, f.source(t, dir)), defaultPlan)
	rb.SetDeadline(time.Now().Add(50 * time.Millisecond))
	var s Sample
	if err := rb.ReadInto(&s); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("a waiting reader's read: %v; want os.ErrDeadlineExceeded", err)
	}
	if n := rb.C.W.Wakeups(); n != 0 {
		t.Fatalf("%d wakeups of a reader with no ring", n)
	}
	rb.SetDeadline(time.Time{})
	done := make(chan error, 1)
	go func() { done <- rb.ReadInto(&s) }()
	rb.Close()
	select {
	case err := <-done:
		if !errors.Is(err, os.ErrClosed) {
			t.Fatalf("a waiting reader's read after Close: %v; want os.ErrClosed", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Close did not return a waiting reader's read")
	}
}

// The consumer lock's file: one per map ID in the lock folder; a folder
// the reader may not create (EPERM, EACCES, EROFS) leaves it reading
// without a lock; any other error fails the opening, naming the path.
func TestConsumerLockFile(t *testing.T) {
	dir := t.TempDir()
	l, err := openConsumerLock(dir, 7)
	if err != nil || l == nil {
		t.Fatalf("openConsumerLock: %v, %v", l, err)
	}
	defer l.release()
	if _, err := os.Stat(filepath.Join(dir, "ringbuf-7")); err != nil {
		t.Fatal(err)
	}
	other, err := openConsumerLock(dir, 7)
	if err != nil {
		t.Fatal(err)
	}
	for i, want := range []bool{true, false} { // l's, then other's
		if got, err := []*consumerLock{l, other}[i].try(); got != want || err != nil {
			t.Fatalf("try %d: %v, %v; want %v", i, got, err, want)
		}
	}
	other.release()

	// sysfs refuses a folder to anyone (EPERM).
	if l, err := openConsumerLock("/sys/perfbuf-lock-test", 7); l != nil || err != nil {
		t.Errorf("a lock folder refused: %v, %v; want no lock, no error", l, err)
	}
	f := newFakeBPFRings(t, 1, 4096)
	s := f.source(t, "/sys/perfbuf-lock-test")
	defer s.close()
	if len(s.rings) != 1 || slices.ContainsFunc(s.locks, func(l *consumerLock) bool { return l != nil }) {
		t.Errorf("a source without a lock folder reads %d rings, locks %v; want 1, none", len(s.rings), s.locks)
	}

	notDir := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(notDir, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	_, err = openConsumerLock(notDir, 7)
	if !errors.Is(err, syscall.ENOTDIR) || !strings.Contains(err.Error(), notDir) {
		t.Errorf("a lock folder that is a file: %v; want ENOTDIR naming %s", err, notDir)
	}
	s = &ringBufSource{epfd: -1, lockDir: notDir}
	s.rings, s.fds, s.names, s.one, s.ids = []*ring.RingBuf{bpfReader(t, f.rings[0])}, f.fds, []string{"fake"}, []bool{false}, []uint32{fakeLockID}
	if err := s.lock(); !errors.Is(err, syscall.ENOTDIR) {
		t.Errorf("lock with a lock folder that is a file: %v; want ENOTDIR", err)
	}
}

// Open over real ring buffers: a map alone and the ring buffers in the
// slots of an array of maps (its empty slots passed over), in that order.
// The settings are checked against each before anything is claimed; a
// map claimed cannot be opened again until Close frees and unclaims it.
func TestOpenRingBufs(t *testing.T) {
	page := os.Getpagesize()
	newRingBuf := func(name string) int {
		t.Helper()
		fd, err := kernel.CreateRingBuf(name, uint32(page), 0)
		privileged(t, "create a ring buffer", err)
		t.Cleanup(func() { unix.Close(fd) })
		return fd
	}
	a, b := newRingBuf("pb_owner_a"), newRingBuf("pb_owner_b")
	arr, err := kernel.CreateArrayOfMaps("pb_owner_arr", 4, a)
	privileged(t, "create an array of maps", err)
	t.Cleanup(func() { unix.Close(arr) })
	if err := kernel.UpdateSlot(arr, 2, b); err != nil {
		t.Fatal(err)
	}

	_, err = Open(mapFD(a), RingOptions{RingBytes: 2 * page}, []Map{mapFD(arr)}, nil, nil)
	if !errors.Is(err, os.ErrInvalid) || !strings.Contains(err.Error(), "options RingBytes") {
		t.Fatalf("Open with another RingBytes: %v; want os.ErrInvalid naming RingBytes", err)
	}
	c, err := Open(mapFD(a), RingOptions{}, []Map{mapFD(arr)}, nil, nil)
	if err != nil {
		t.Fatal(err) // (a refusal above claimed nothing)
	}
	NewRaw(c) // starts c
	if n, want := c.Count(), 2; n != want {
		t.Errorf("%d rings, want %d: the map's and slot 2's", n, want)
	}
	if got, want := c.Name(), `ring buffer "pb_owner_a" and 1 more maps`; got != want {
		t.Errorf("Name() = %q, want %q", got, want)
	}
	for i, st := range c.Stats() {
		if st.Ring != i || st.CPU != -1 || st.Size != page {
			t.Errorf("Stats()[%d] = %+v; want ring %d, CPU -1, %d bytes", i, st, i, page)
		}
	}
	if _, err := Open(mapFD(b), RingOptions{}, nil, nil, nil); !errors.Is(err, ErrMapInUse) {
		t.Errorf("Open of a map read: %v; want ErrMapInUse", err)
	}
	c.Close()
	again, err := Open(mapFD(b), RingOptions{}, nil, nil, nil)
	if err != nil {
		t.Fatalf("Open after Close: %v", err)
	}
	NewRaw(again)
	again.Close()
}
