// SPDX-License-Identifier: Apache-2.0

package perfbuf

// Tests of the options and argument checks of New and NewReader, and of
// PerfBuffer's callback mode over fake rings (raw mode is RawBuffer's:
// rawbuf_test.go).

import (
	"errors"
	"fmt"
	"math"
	"os"
	"reflect"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/perfbuf/perfbuf/internal/owner"
	"github.com/perfbuf/perfbuf/internal/ring"
	"github.com/perfbuf/perfbuf/internal/ringtest"
)

// The options' fields are checked alone, whatever the map: one error per
// field, naming it. What depends on a ring's size (a sample that does not
// fit, WakeupBytes not below the ring, the host's memory) is checked
// against the map: internal/owner's TestRingConfig.
func TestOptionsCheck(t *testing.T) {
	const page = 4096
	good := []Options{
		{},
		{RingBytes: 1 * page},
		{RingBytes: 1024 * page, WakeupEvents: 64},
		{RingBytes: 2 * page, WakeupBytes: 4096},
		{RingBytes: 1 * page, MaxSampleSize: 4052},
		{RingBytes: 4 * page, WakeupEvents: math.MaxInt32},
		{RingBytes: owner.MaxRingBytes},
	}
	for _, o := range good {
		if err := o.check(); err != nil {
			t.Errorf("%+v: %v", o, err)
		}
	}
	for _, c := range []struct {
		o    Options
		text string
	}{
		{Options{RingBytes: -1}, "options RingBytes -1 is negative"},
		{Options{RingBytes: math.MinInt}, "negative"},
		{Options{RingBytes: math.MaxInt}, "too large"},
		{Options{RingBytes: owner.MaxRingBytes + 1}, "too large"},
		{Options{WakeupEvents: -1}, "options WakeupEvents -1 outside"},
		{Options{WakeupBytes: -1}, "options WakeupBytes -1 outside"},
		{Options{WakeupBytes: 100, WakeupEvents: 2}, "options WakeupBytes and WakeupEvents both set"},
		{Options{MaxSampleSize: -5}, "options MaxSampleSize -5 is negative"},
		// wakeup_events is a u32 the kernel reads as an int: past
		// MaxInt32 it woke on every sample (1<<32+1 became 1).
		{Options{WakeupEvents: math.MaxInt32 + 1}, "options WakeupEvents"},
		{Options{WakeupEvents: 1<<32 + 1}, "options WakeupEvents"},
		{Options{Maps: []Map{MapFD(3), nil}}, "options Maps[1]: nil map"},
	} {
		if err := c.o.check(); !errors.Is(err, os.ErrInvalid) || !strings.Contains(err.Error(), c.text) {
			t.Errorf("%+v: %v, want os.ErrInvalid saying %q", c.o, err, c.text)
		}
	}
	// A negative program descriptor is no descriptor, as a negative MapFD.
	if err := (&Options{Programs: []int{5, -1}}).check(); !errors.Is(err, syscall.EBADF) || !strings.Contains(err.Error(), "options Programs[1]: fd -1") {
		t.Errorf("Programs with -1: %v, want EBADF naming Programs[1]", err)
	}
	// What the owner takes: the fields as set.
	o := Options{RingBytes: 3 * page, WakeupEvents: 2, MaxSampleSize: 100}
	if ro := o.ring(); ro.RingBytes != o.RingBytes || ro.WakeupEvents != 2 || ro.WakeupBytes != 0 || ro.MaxSampleSize != 100 || ro.Budget || ro.KeyEnd != 0 {
		t.Errorf("ring settings of %+v: %+v", o, ro)
	}
}

// An ordered Reader's key must fit in the largest sample: MaxSampleSize
// when it is set (at the door), else the largest a ring holds (each ring,
// as it is opened).
func TestOrderKeyFits(t *testing.T) {
	const page = 4096
	for _, c := range []struct {
		name string
		o    ReaderOptions
		says string // "": accepted
	}{
		{"past MaxSampleSize", ReaderOptions{Options: Options{MaxSampleSize: 56}, Order: &Order{KeyOffset: 200}},
			"options Order KeyOffset 200: the 8-byte key ends at 208, past MaxSampleSize 56"},
		{"one byte past MaxSampleSize", ReaderOptions{Options: Options{MaxSampleSize: 56}, Order: &Order{KeyOffset: 49}},
			"past MaxSampleSize 56"},
		{"ending at MaxSampleSize", ReaderOptions{Options: Options{MaxSampleSize: 56}, Order: &Order{KeyOffset: 48}}, ""},
	} {
		_, err := c.o.plan()
		if c.says == "" && err != nil || c.says != "" && (!errors.Is(err, os.ErrInvalid) || !strings.Contains(err.Error(), c.says)) {
			t.Errorf("%s: %v; want %q", c.name, err, c.says)
		}
	}
	// Without MaxSampleSize, the key's end goes to the owner, which checks
	// it against each ring as it is opened (internal/owner's TestKeyEnd).
	for _, off := range []int{0, 4044, 4045, 65000} {
		o := ReaderOptions{Options: Options{RingBytes: page}, Order: &Order{KeyOffset: off}}
		p, err := o.plan()
		if err != nil {
			t.Fatalf("KeyOffset %d: %v", off, err)
		}
		if p.Ring.KeyEnd != off+8 {
			t.Errorf("KeyOffset %d: the key ends at %d, want %d", off, p.Ring.KeyEnd, off+8)
		}
	}
}

func TestSampleRecordSize(t *testing.T) {
	for n, want := range map[int]int{0: 16, 1: 16, 4: 16, 5: 24, 12: 24, 13: 32, 64: 80, 4076: 4088, 4077: 4096} {
		if got := ring.PerfSampleSize(n); got != want {
			t.Errorf("ring.PerfSampleSize(%d) = %d, want %d", n, got, want)
		}
		// What the fake producer writes, as the kernel does.
		if got := len(ringtest.PerfSample(make([]byte, n))); got != want {
			t.Errorf("a %d-byte sample makes a %d-byte record, want %d", n, got, want)
		}
	}
}

// New and NewReader check their arguments before they look at the map, and
// the map before they open anything: no kernel is needed for these.
func TestNewChecks(t *testing.T) {
	sample := func(int, []byte) {}
	closed, err := unix.Open("/dev/null", unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	unix.Close(closed)
	cases := []struct {
		name string
		new  func() error
		want error
		msg  string
	}{
		{"no sample function", func() error { _, err := New(MapFD(-1), nil, nil, Options{}); return err }, os.ErrInvalid, "new PerfBuffer: nil sample function"},
		{"options first", func() error { _, err := New(MapFD(-1), sample, nil, Options{RingBytes: -3}); return err }, os.ErrInvalid, "new PerfBuffer: options RingBytes -3"},
		{"raw options first", func() error { _, err := NewRaw(nil, Options{WakeupBytes: 100, WakeupEvents: 2}); return err }, os.ErrInvalid, "new Raw: options WakeupBytes and WakeupEvents both set"},
		{"nil map", func() error { _, err := New(nil, sample, nil, Options{}); return err }, os.ErrInvalid, "new PerfBuffer: nil map"},
		{"negative fd", func() error { _, err := New(MapFD(-1), sample, nil, Options{}); return err }, syscall.EBADF, "new PerfBuffer: map fd -1"},
		{"closed fd", func() error { _, err := NewRaw(MapFD(closed), Options{}); return err }, syscall.EBADF, "new Raw: map fd"},
		{"nil map in Maps", func() error { _, err := NewRaw(MapFD(-1), Options{Maps: []Map{nil}}); return err }, os.ErrInvalid, "new Raw: options Maps[0]: nil map"},
		{"reader options", func() error {
			_, err := NewReader(MapFD(-1), ReaderOptions{Options: Options{RingBytes: -3}})
			return err
		}, os.ErrInvalid, "new reader: options RingBytes -3"},
		{"reader order", func() error {
			_, err := NewReader(MapFD(-1), ReaderOptions{Order: &Order{KeyOffset: -1}})
			return err
		}, os.ErrInvalid, "new reader: options Order KeyOffset -1: negative"},
		{"sort offset", func() error { return Order{KeyOffset: -1}.Sort(nil) }, os.ErrInvalid, "sort: options Order KeyOffset -1: negative"},
		{"sort offset past a sample", func() error { return Order{KeyOffset: 65530}.Sort(nil) }, os.ErrInvalid, "sort: options Order KeyOffset 65530 past the largest sample"},
		{"reader nil map", func() error { _, err := NewReader(nil, ReaderOptions{}); return err }, os.ErrInvalid, "new reader: nil map"},
		{"reader negative fd", func() error { _, err := NewReader(MapFD(-1), ReaderOptions{}); return err }, syscall.EBADF, "new reader: map fd -1: no map (a name the collection or module does not hold"},
	}
	for _, c := range cases {
		err := c.new()
		if !errors.Is(err, c.want) || !strings.HasPrefix(err.Error(), c.msg) {
			t.Errorf("%s: %v; want %v, %q", c.name, err, c.want, c.msg)
		}
	}
	if fd := MapFD(7).FileDescriptor(); fd != 7 {
		t.Errorf("MapFD(7).FileDescriptor() = %d", fd)
	}
}

// delivery is one call of SampleFunc or LostFunc.
type delivery struct {
	cpu  int
	data string
	lost uint64
}

// String quotes data alone, so that %q prints a []delivery readably.
func (d delivery) String() string { return fmt.Sprintf("{cpu %d %q lost %d}", d.cpu, d.data, d.lost) }

// recording returns a PerfBuffer over the fake rings whose callbacks
// append what they receive to *got.
func (f *fakeRings) recording(t testing.TB, got *[]delivery) *PerfBuffer {
	t.Helper()
	sample, lost := recorder(got)
	return f.perfBuffer(t, sample, lost)
}

// recorder returns callbacks for New that append what they receive to *got.
func recorder(got *[]delivery) (sample func(int, []byte), lost func(int, uint64)) {
	return func(cpu int, data []byte) { *got = append(*got, delivery{cpu: cpu, data: string(data)}) },
		func(cpu int, n uint64) { *got = append(*got, delivery{cpu: cpu, lost: n}) }
}

// Consume hands every ring's samples to SampleFunc and lost counts to
// LostFunc, with the CPU behind the ring (not its index), a sample that
// straddles the ring's end made contiguous; records of other types are
// skipped. Without LostFunc, lost counts are counted only. Stats has each
// ring's counts and their sums.
func TestPerfBufferConsume(t *testing.T) {
	for _, withLost := range []bool{true, false} {
		f := newFakeRings(t, 3, 4096)
		f.cpus = []int{0, 2, 5}
		f.rings[0] = ringtest.NewPerfAt(256, 3*256-16) // the first sample straddles the end
		wrapped := ringtest.Pattern(20, 1)
		f.rings[0].MustWrite(t, ringtest.PerfSample(wrapped))
		f.rings[0].MustWrite(t, ringtest.PerfLost(1, 7))
		f.rings[0].MustWrite(t, ringtest.PerfRecord(unix.PERF_RECORD_THROTTLE, 16, make([]byte, 8)))
		f.rings[0].MustWrite(t, ringtest.PerfSample([]byte("a")))
		f.rings[1].MustWrite(t, ringtest.PerfSample([]byte("hello, world")))
		f.rings[1].MustWrite(t, ringtest.PerfSample(nil))
		var got []delivery
		sample, lost := recorder(&got)
		if !withLost {
			lost = nil
		}
		pb := f.perfBuffer(t, sample, lost)
		// Consume counts the records delivered: the samples and the lost record.
		if n, err := pb.Consume(); n != 5 || err != nil {
			t.Fatalf("Consume = %d, %v; want 4 samples and a lost record", n, err)
		}
		// The kernel pads an n-byte sample to round_up(n+4, 8)-4 bytes.
		want := []delivery{{0, string(wrapped), 0}, {0, "", 7}, {0, "a\x00\x00\x00", 0}, {2, "hello, world", 0}, {2, "\x00\x00\x00\x00", 0}}
		if !withLost {
			want = slices.Delete(want, 1, 2)
		}
		if !reflect.DeepEqual(got, want) {
			t.Errorf("got %q\nwant %q", got, want)
		}
		wantStats := Stats{CPU: -1, Samples: 4, Bytes: 40, Lost: 7, MaxFill: 32 + 24 + 16 + 16, Size: 256 + 2*4096, Rings: []Stats{
			{CPU: 0, Samples: 2, Bytes: 24, Lost: 7, MaxFill: 32 + 24 + 16 + 16, Size: 256},
			{CPU: 2, Samples: 2, Bytes: 16, MaxFill: 24 + 16, Size: 4096},
			{CPU: 5, Size: 4096},
		}}
		if st := pb.Stats(); !reflect.DeepEqual(st, wantStats) {
			t.Errorf("stats %+v\nwant %+v", st, wantStats)
		}
		for i, ring := range f.rings {
			if ring.Page.Data_tail != ring.Head {
				t.Errorf("ring %d committed to %d, head %d", i, ring.Page.Data_tail, ring.Head)
			}
		}
		if n, err := pb.Consume(); n != 0 || err != nil || len(got) != len(want) {
			t.Errorf("second Consume = %d, %v, %d deliveries", n, err, len(got)-len(want))
		}
		if n, err := pb.ConsumeBuffer(1); n != 0 || err != nil {
			t.Errorf("ConsumeBuffer(1) = %d, %v", n, err)
		}
	}
}

// Poll drains every ring that holds records once a ring's head has moved
// (a wakeup ends its wait); with nothing new it returns 0 once the timeout
// passes. Close ends a Poll blocked without a
// timeout at once; every call after Close fails with os.ErrClosed, and the
// buffer's indexes stay valid.
func TestPerfBufferPoll(t *testing.T) {
	f := newFakeRings(t, 2, 4096)
	var got []delivery
	pb := f.recording(t, &got)
	start := time.Now()
	if n, err := pb.Poll(20 * time.Millisecond); n != 0 || err != nil || time.Since(start) < 20*time.Millisecond {
		t.Fatalf("Poll with nothing ready = %d, %v after %v", n, err, time.Since(start))
	}
	f.emit(t, 0, 0, 0, 16)
	f.emit(t, 1, 0, 1, 16)
	f.wake(1)
	if n, err := pb.Poll(5 * time.Second); n != 2 || err != nil || len(got) != 2 || got[0].cpu != 0 || got[1].cpu != 1 {
		t.Fatalf("Poll with two rings written = %d, %v, %+v; want both samples", n, err, got)
	}
	f.drainWake(1)
	if n, err := pb.Poll(0); n != 0 || err != nil {
		t.Fatalf("Poll(0) = %d, %v", n, err)
	}
	// A sample written while nobody waits ends the next wait at once,
	// wakeup or not (the netpoller forgets events that nobody waited for).
	f.emit(t, 1, 0, 2, 16)
	if n, err := pb.Poll(5 * time.Second); n != 1 || err != nil || len(got) != 3 {
		t.Fatalf("Poll after a write = %d, %v, %+v; want the sample", n, err, got)
	}
	// While it waits, a write with its wakeup ends the wait.
	go func() {
		time.Sleep(20 * time.Millisecond)
		f.emit(t, 0, 0, 3, 16)
		f.wake(0)
	}()
	if n, err := pb.Poll(5 * time.Second); n != 1 || err != nil || len(got) != 4 || got[3].cpu != 0 {
		t.Fatalf("Poll woken by ring 0 = %d, %v, %+v", n, err, got)
	}
	f.drainWake(0)

	done := make(chan error, 1)
	go func() {
		_, err := pb.Poll(-1)
		done <- err
	}()
	time.Sleep(10 * time.Millisecond) // let it block; correctness does not depend on it
	if err := pb.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}
	select {
	case err := <-done:
		if !errors.Is(err, os.ErrClosed) {
			t.Errorf("blocked Poll after Close: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Poll still blocked 5s after Close")
	}
	for name, call := range map[string]func() error{
		"Poll":          func() error { _, err := pb.Poll(0); return err },
		"Consume":       func() error { _, err := pb.Consume(); return err },
		"ConsumeBuffer": func() error { _, err := pb.ConsumeBuffer(0); return err },
		"BufferFD":      func() error { _, err := pb.BufferFD(0); return err },
		"EpollFD":       func() error { _, err := pb.EpollFD(); return err },
	} {
		if err := call(); !errors.Is(err, os.ErrClosed) {
			t.Errorf("%s after Close: %v, want os.ErrClosed", name, err)
		}
	}
	if err := pb.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	if cpu := pb.Stats().Rings[1].CPU; pb.BufferCount() != 2 || cpu != 1 {
		t.Errorf("after Close: BufferCount %d, ring 1's CPU %d", pb.BufferCount(), cpu)
	}
}

// Indexes out of range are invalid arguments.
func TestPerfBufferIndex(t *testing.T) {
	f := newFakeRings(t, 2, 4096)
	f.cpus = []int{1, 3}
	pb := f.perfBuffer(t, func(int, []byte) {}, nil)
	for _, i := range []int{-1, 2} {
		if _, err := pb.ConsumeBuffer(i); !errors.Is(err, os.ErrInvalid) {
			t.Errorf("ConsumeBuffer(%d): %v", i, err)
		}
		if _, err := pb.BufferFD(i); !errors.Is(err, os.ErrInvalid) {
			t.Errorf("BufferFD(%d): %v", i, err)
		}
	}
	if st := pb.Stats(); len(st.Rings) != 2 || st.Rings[1].CPU != 3 {
		t.Errorf("Stats %+v; want ring 1 of CPU 3", st)
	}
	if fd, err := pb.BufferFD(1); fd != f.fds[1] || err != nil {
		t.Errorf("BufferFD(1) = %d, %v; want %d", fd, err, f.fds[1])
	}
}

// Raw's indexes out of range are invalid arguments, a ring has one
// RawBuffer at a time, and Raw reads nothing itself.
func TestRawIndex(t *testing.T) {
	f := newFakeRings(t, 2, 4096)
	f.emit(t, 0, 0, 0, 16)
	rw := f.raw(t)
	for _, i := range []int{-1, 2} {
		if _, err := rw.Buffer(i); !errors.Is(err, os.ErrInvalid) {
			t.Errorf("Buffer(%d): %v", i, err)
		}
		if _, err := rw.BufferFD(i); !errors.Is(err, os.ErrInvalid) {
			t.Errorf("BufferFD(%d): %v", i, err)
		}
	}
	b, err := rw.Buffer(0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := rw.Buffer(0); !errors.Is(err, ErrBusy) {
		t.Errorf("second Buffer(0): %v, want ErrBusy", err)
	}
	b.Release()
	b, err = rw.Buffer(0)
	if err != nil {
		t.Fatalf("Buffer(0) after Release: %v", err)
	}
	b.Release()
	if f.rings[0].Page.Data_tail != 0 {
		t.Error("Raw read the ring")
	}
}

// A corrupt ring: Consume delivers its good records and the other rings',
// skips it to its head, counts it, and returns a *CorruptError; the next
// call goes on.
func TestPerfBufferCorrupt(t *testing.T) {
	f := newFakeRings(t, 2, 4096)
	var got []delivery
	pb := f.recording(t, &got)
	f.emit(t, 0, 0, 0, 16)
	f.rings[0].MustWrite(t, ringtest.PerfRecord(unix.PERF_RECORD_SAMPLE, 0, make([]byte, 8))) // at 32, 16 bytes: size 0
	f.emit(t, 0, 0, 1, 16)                                                                    // skipped with it
	f.emit(t, 1, 0, 2, 16)
	n, err := pb.Consume()
	var ce *CorruptError
	if n != 2 || !errors.As(err, &ce) || !errors.Is(err, ErrCorrupt) || ce.CPU != 0 || ce.Pos != 32 ||
		err.Error() != `consume perf event array "fake": read ring 0 (cpu 0) at 32: record size 0: corrupt ring record` {
		t.Fatalf("Consume = %d, %v; want 2 samples and the corrupt record", n, err)
	}
	if len(got) != 2 || seqOf([]byte(got[0].data)) != 0 || seqOf([]byte(got[1].data)) != 2 {
		t.Errorf("delivered %q", got)
	}
	st := pb.Stats()
	if r := st.Rings; r[0].Samples != 1 || r[0].Corrupt != 1 || r[0].Fill != 0 || r[1].Samples != 1 || r[1].Corrupt != 0 || st.Corrupt != 1 {
		t.Errorf("stats %+v", st)
	}
	if f.rings[0].Page.Data_tail != f.rings[0].Head {
		t.Errorf("ring 0 committed to %d, not skipped to its head %d", f.rings[0].Page.Data_tail, f.rings[0].Head)
	}
	f.emit(t, 0, 0, 3, 16)
	if n, err := pb.Consume(); n != 1 || err != nil {
		t.Errorf("Consume after the report = %d, %v", n, err)
	}
	f.rings[1].MustWrite(t, ringtest.PerfRecord(unix.PERF_RECORD_SAMPLE, 12, make([]byte, 8)))
	if n, err := pb.ConsumeBuffer(1); n != 0 || !errors.As(err, &ce) || ce.CPU != 1 || !strings.HasPrefix(err.Error(), `consume ring 1 of perf event array "fake": `) {
		t.Errorf("ConsumeBuffer(1) = %d, %v; want ring 1's corruption", n, err)
	}
	if st := pb.Stats(); st.Rings[1].Corrupt != 1 || st.Rings[1].Fill != 0 || st.Corrupt != 2 {
		t.Errorf("stats %+v; want ring 1's corruption skipped, and 2 in the sums", st)
	}
}

// Close counts what is left in the rings as Left; Consume then Close
// loses nothing.
func TestPerfBufferCloseDiscards(t *testing.T) {
	for _, consume := range []bool{true, false} {
		f := newFakeRings(t, 2, 4096)
		pb := f.perfBuffer(t, func(int, []byte) {}, nil)
		f.emit(t, 0, 0, 0, 16)
		f.emit(t, 0, 0, 1, 16)
		f.emit(t, 1, 0, 2, 40)
		if consume {
			if n, err := pb.Consume(); n != 3 || err != nil {
				t.Fatalf("Consume = %d, %v", n, err)
			}
		}
		pb.Close()
		st := pb.Stats()
		want := [2]uint64{0, 0}
		if !consume {
			want = [2]uint64{2, 1}
		}
		if r := st.Rings; r[0].Left != want[0] || r[1].Left != want[1] || st.Left != want[0]+want[1] || st.Samples+st.Left != 3 {
			t.Errorf("consume %v: left %d and %d samples (Stats %+v), want %v", consume, r[0].Left, r[1].Left, st, want)
		}
	}
}

// Close from SampleFunc makes that call the last: the drain stops there,
// commits what was delivered, and Close counts the rest as Left.
func TestPerfBufferCloseFromCallback(t *testing.T) {
	f := newFakeRings(t, 2, 4096)
	var pb *PerfBuffer
	calls, after := 0, 0
	closed := false
	pb = f.perfBuffer(t, func(int, []byte) {
		if closed {
			after++
		}
		if calls++; calls == 2 {
			pb.Close()
			closed = true
		}
	}, nil)
	for seq := uint64(0); seq < 3; seq++ {
		f.emit(t, 0, 0, seq, 16)
		f.emit(t, 1, 0, seq, 16)
	}
	if n, err := pb.Consume(); n != 2 || err != nil || calls != 2 || after != 0 {
		t.Fatalf("Consume = %d, %v after %d calls (%d after Close); want 2, nil", n, err, calls, after)
	}
	st := pb.Stats()
	if r := st.Rings; r[0].Samples != 2 || r[0].Left != 1 || r[1].Samples != 0 || r[1].Left != 3 || st.Samples+st.Left != 6 {
		t.Errorf("stats %+v; want 2 samples delivered, 1 and 3 left", st)
	}
	if _, err := pb.Consume(); !errors.Is(err, os.ErrClosed) {
		t.Errorf("Consume after Close: %v", err)
	}
}

// A call from inside SampleFunc that would wait for the drain running it
// fails with ErrReentrant; another goroutine's call waits for it.
func TestPerfBufferReentrant(t *testing.T) {
	f := newFakeRings(t, 2, 4096)
	var pb *PerfBuffer
	var nested map[string]error
	var then func() // what the SampleFunc does once the nested calls are made
	pb = f.perfBuffer(t, func(int, []byte) {
		if nested != nil {
			if then != nil {
				then()
			}
			return
		}
		nested = map[string]error{}
		_, nested["Poll"] = pb.Poll(0)
		_, nested["Consume"] = pb.Consume()
		_, nested["ConsumeBuffer"] = pb.ConsumeBuffer(1)
	}, nil)
	f.emit(t, 0, 0, 0, 16)
	f.emit(t, 1, 0, 1, 16)
	within(t, "Consume calling itself", func() {
		if n, err := pb.Consume(); n != 2 || err != nil {
			t.Errorf("Consume = %d, %v", n, err)
		}
	})
	if len(nested) != 3 {
		t.Fatalf("nested calls %v", nested)
	}
	for name, err := range nested {
		if !errors.Is(err, ErrReentrant) {
			t.Errorf("%s from SampleFunc: %v, want ErrReentrant", name, err)
		}
	}

	started, release := make(chan struct{}), make(chan struct{})
	then = func() {
		close(started)
		<-release
	}
	f.emit(t, 0, 0, 2, 16)
	first := make(chan error, 1)
	go func() {
		_, err := pb.Consume()
		first <- err
	}()
	<-started
	waited := make(chan error, 1)
	go func() {
		_, err := pb.Consume()
		waited <- err
	}()
	select {
	case err := <-waited:
		t.Errorf("Consume on another goroutine returned %v while SampleFunc ran", err)
	case <-time.After(50 * time.Millisecond):
	}
	close(release)
	within(t, "Consume after the drain", func() {
		if err := <-first; err != nil {
			t.Errorf("first Consume: %v", err)
		}
		if err := <-waited; err != nil {
			t.Errorf("waiting Consume: %v", err)
		}
	})
}

// A panic in SampleFunc reaches the caller; the sample it panicked on counts
// as delivered (committed), and the next Poll delivers the rest without
// waiting for a wakeup, whose readiness the cut drain spent.
func TestPerfBufferPanic(t *testing.T) {
	f := newFakeRings(t, 2, 4096)
	var got []string
	calls := 0
	pb := f.perfBuffer(t, func(cpu int, data []byte) {
		calls++
		got = append(got, fmt.Sprintf("%d/%d", cpu, seqOf(data)))
		if calls == 2 {
			panic("boom")
		}
	}, nil)
	for seq := uint64(0); seq < 4; seq++ {
		f.emit(t, 0, 0, seq, 16)
	}
	f.emit(t, 1, 0, 4, 16)
	f.wake(0)
	f.wake(1)
	func() {
		defer func() {
			if p := recover(); p != "boom" {
				t.Errorf("recovered %v, want the SampleFunc's panic", p)
			}
		}()
		pb.Poll(time.Second)
		t.Error("Poll returned")
	}()
	if f.rings[0].Page.Data_tail != 2*32 {
		t.Errorf("after the panic, ring 0 committed to %d, want 64 (the sample it panicked on included)", f.rings[0].Page.Data_tail)
	}
	if st := pb.Stats().Rings[0]; st.Samples != 2 {
		t.Errorf("after the panic, stats %+v; want 2 samples", st)
	}
	f.drainWake(0)
	f.drainWake(1)
	within(t, "Poll after a panic", func() {
		if n, err := pb.Poll(-1); n != 3 || err != nil {
			t.Errorf("Poll after the panic = %d, %v; want the other 3", n, err)
		}
	})
	if fmt.Sprint(got) != "[0/0 0/1 0/2 0/3 1/4]" {
		t.Errorf("delivered %v", got)
	}
}

// Close frees the rings only once every RawBuffer is released, and counts
// what is left in them then.
func TestRawHeld(t *testing.T) {
	f := newFakeRings(t, 2, 4096)
	rw := f.raw(t)
	f.emit(t, 0, 0, 0, 16)
	b, err := rw.Buffer(0)
	if err != nil {
		t.Fatal(err)
	}
	rw.Close()
	if _, err := rw.Wait(0, nil); !errors.Is(err, os.ErrClosed) {
		t.Errorf("Wait after Close: %v", err)
	}
	if d := rw.Stats().Rings[0].Left; d != 0 || rw.r.C.W.Freed() {
		t.Errorf("freed while a ring was held (left %d)", d)
	}
	b.Release()
	if d := rw.Stats().Rings[0].Left; d != 1 || !rw.r.C.W.Freed() {
		t.Errorf("not freed at release: left %d, want 1", d)
	}
}

// Every corrupt ring the parser knows (ringtest.PerfCorrupts), through callback
// mode: Consume delivers the good records before it, reports it once as a
// *CorruptError, counts it, and delivers the ring's next samples. libbpf's
// own parser, which callback mode used before, hangs or crashes on these.
func TestPerfBufferCorruptCases(t *testing.T) {
	for _, c := range ringtest.PerfCorrupts() {
		t.Run(c.Name, func(t *testing.T) {
			f := newFakeRings(t, 1, 1024)
			ring := ringtest.NewPerfAt(1024, 1<<20+c.At)
			f.rings[0].Page, f.rings[0].Data, f.rings[0].Head = ring.Page, ring.Data, ring.Head
			bad := f.rings[0].Head
			for i, r := range c.Recs {
				if i == len(c.Recs)-1 {
					bad = f.rings[0].Head
				}
				f.rings[0].Put(r)
			}
			f.rings[0].Publish()
			var got []delivery
			pb := f.recording(t, &got)
			n, err := pb.Consume()
			var ce *CorruptError
			if !errors.As(err, &ce) || ce.Pos != bad || !strings.Contains(ce.Reason, c.Reason) {
				t.Fatalf("Consume = %d, %v; want %q at %d", n, err, c.Reason, bad)
			}
			if n != len(c.Recs)-1 || len(got) != n {
				t.Fatalf("%d samples delivered before the corrupt record, want %d", n, len(c.Recs)-1)
			}
			if n, err := pb.Consume(); n != 0 || err != nil {
				t.Fatalf("second Consume = %d, %v: reported more than once", n, err)
			}
			// The producer goes on from its own head.
			f.rings[0].MustWrite(t, ringtest.PerfSample([]byte("after")))
			if n, err := pb.Consume(); n != 1 || err != nil {
				t.Fatalf("Consume after the corruption = %d, %v; want the new sample", n, err)
			}
			if st := pb.Stats().Rings[0]; st.Corrupt != 1 || st.Samples != uint64(len(c.Recs)) {
				t.Fatalf("stats %+v", st)
			}
		})
	}
}

// A Reader's latency budget (MaxLatency; zero means 10 ms) holds wakeups
// off unless WakeupEvents or WakeupBytes say when to wake, or MaxLatency
// is negative: then its perf rings wake it half full (the watermark, set
// by the owner: internal/owner's TestRingConfig), and it looks every
// budget. New and NewRaw keep a wakeup a sample.
func TestReaderBudgetPlan(t *testing.T) {
	for _, c := range []struct {
		name          string
		o             ReaderOptions
		latency       time.Duration
		budget        bool
		events, bytes int // the ring settings handed on
	}{
		{"defaults", ReaderOptions{}, 10 * time.Millisecond, true, 0, 0},
		{"a budget", ReaderOptions{MaxLatency: 2 * time.Millisecond}, 2 * time.Millisecond, true, 0, 0},
		{"no budget", ReaderOptions{MaxLatency: -1}, -1, false, 0, 0},
		{"wakeup events", ReaderOptions{Options: Options{WakeupEvents: 8}}, 10 * time.Millisecond, false, 8, 0},
		{"wakeup bytes", ReaderOptions{Options: Options{WakeupBytes: 1024}}, 10 * time.Millisecond, false, 0, 1024},
	} {
		p, err := c.o.plan()
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if p.Latency != c.latency || p.Ring.Budget != c.budget || p.Ring.WakeupEvents != c.events || p.Ring.WakeupBytes != c.bytes {
			t.Errorf("%s: latency %v, budget %v, wakeup events %d, bytes %d; want %v, %v, %d, %d",
				c.name, p.Latency, p.Ring.Budget, p.Ring.WakeupEvents, p.Ring.WakeupBytes, c.latency, c.budget, c.events, c.bytes)
		}
	}
	if ro := (&Options{}).ring(); ro.Budget {
		t.Error("New's and NewRaw's ring settings hold wakeups off; want a wakeup a sample")
	}
}

// The Recorder's options are checked before the map is looked at.
// (Wakeups apply to its perf rings: selftest/overwrite.)
func TestRecorderOptions(t *testing.T) {
	for _, o := range []Options{{WakeupEvents: -1}, {WakeupBytes: 64, WakeupEvents: 2}, {RingBytes: -1}} {
		_, err := NewRecorder(MapFD(-1), o)
		if !errors.Is(err, os.ErrInvalid) || !strings.HasPrefix(err.Error(), "new Recorder: options ") {
			t.Errorf("%+v: %v", o, err)
		}
	}
}
