// SPDX-License-Identifier: Apache-2.0

// Privileged selftests of callback mode over real rings: callback.bpf.c
// emits samples on a chosen CPU through BPF_PROG_TEST_RUN.
package callback

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"os"
	"reflect"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"github.com/perfbuf/perfbuf"
	"github.com/perfbuf/perfbuf/internal/cpus"
	"github.com/perfbuf/perfbuf/internal/kernel"
	"github.com/perfbuf/perfbuf/selftest/internal/bpftest"
	"golang.org/x/sys/unix"
)

const obj = "bpf/callback.bpf.o"

// emitMaxSize is the largest sample callback.bpf.c emits (its
// EMIT_MAX_SIZE): TestLargestSample fills a page with one.
const emitMaxSize = 16384

func setup(t *testing.T) *bpftest.Fixture { return bpftest.Setup(t, obj) }

// ringOpts are rings of pages pages.
func ringOpts(pages int) perfbuf.Options {
	return perfbuf.Options{RingBytes: bpftest.RingBytes(pages)}
}

// discard is a sample function for tests that do not look at the samples.
func discard(int, []byte) {}

// checkAccounting checks the collector against the emitter, and the
// PerfBuffer's Stats against the collector: each ring's, and the sums'
// samples.
func checkAccounting(t *testing.T, c *bpftest.Collector, f *bpftest.Fixture, pb *perfbuf.PerfBuffer) {
	t.Helper()
	c.CheckAccounting(t, f)
	st := pb.Stats()
	c.CheckStats(t, st.Rings)
	var samples uint64
	for _, n := range c.Samples {
		samples += uint64(n)
	}
	if st.Samples != samples {
		t.Errorf("Stats sums %d samples; %d delivered", st.Samples, samples)
	}
}

// finishes runs fn on a goroutine of its own and reports whether it returned
// within d; if not (a deadlock), the goroutine is left behind.
func finishes(d time.Duration, fn func()) bool {
	done := make(chan struct{})
	go func() {
		defer close(done)
		fn()
	}()
	select {
	case <-done:
		return true
	case <-time.After(d):
		return false
	}
}

func newPB(t *testing.T, f *bpftest.Fixture, sample func(int, []byte), lost func(int, uint64), opts perfbuf.Options) *perfbuf.PerfBuffer {
	t.Helper()
	pb, err := perfbuf.New(f.Events, sample, lost, opts)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() { pb.Close() })
	if pb.BufferCount() != len(f.CPUs) {
		t.Fatalf("BufferCount %d, want %d", pb.BufferCount(), len(f.CPUs))
	}
	rings := pb.Stats().Rings
	if len(rings) != pb.BufferCount() {
		t.Fatalf("Stats has %d rings, BufferCount %d", len(rings), pb.BufferCount())
	}
	for i, st := range rings {
		if st.CPU != f.CPUs[i] {
			t.Fatalf("ring %d: %+v; want CPU %d", i, st, f.CPUs[i])
		}
	}
	return pb
}

// flush drains the rings, emits one small sample per CPU so that the kernel
// writes the LOST record it holds back until a sample fits, then drains again.
func flush(t *testing.T, f *bpftest.Fixture, pb *perfbuf.PerfBuffer) {
	t.Helper()
	if _, err := pb.Consume(); err != nil {
		t.Fatalf("Consume: %v", err)
	}
	for _, cpu := range f.CPUs {
		f.Emit(t, cpu, 1, 8, 0)
	}
	if _, err := pb.Consume(); err != nil {
		t.Fatalf("Consume: %v", err)
	}
}

// A one-page ring overloaded on every CPU: exact accounting.
func TestAccountingOverload(t *testing.T) {
	f := setup(t)
	c := bpftest.NewCollector()
	pb := newPB(t, f, c.Sample, c.LostFn, ringOpts(1))
	for round := 0; round < 20; round++ {
		for _, cpu := range f.CPUs {
			f.Emit(t, cpu, 300, 40, 64) // 40..103 bytes, overflows 4 KiB
		}
		if round%2 == 0 {
			if _, err := pb.Poll(0); err != nil {
				t.Fatalf("Poll: %v", err)
			}
		}
	}
	flush(t, f, pb)
	checkAccounting(t, c, f, pb)
	for _, cpu := range f.CPUs {
		if c.Lost[cpu] == 0 {
			t.Errorf("cpu %d: no samples lost: the test did not overload the ring", cpu)
		}
	}
}

// Lost counts reach the lost function with the CPU that lost them.
func TestLostCarriesCPU(t *testing.T) {
	f := setup(t)
	if len(f.CPUs) < 2 {
		t.Skip("needs two CPUs")
	}
	quiet, busy := f.CPUs[0], f.CPUs[1]
	c := bpftest.NewCollector()
	pb := newPB(t, f, c.Sample, c.LostFn, ringOpts(1))
	f.Emit(t, busy, 1000, 64, 0) // only the busy CPU overflows
	f.Emit(t, quiet, 10, 64, 0)
	flush(t, f, pb)
	checkAccounting(t, c, f, pb)
	if c.Lost[quiet] != 0 || c.Lost[busy] == 0 {
		t.Errorf("lost by cpu: %v; want only cpu %d", c.Lost, busy)
	}
}

// Every size from 1 byte up, odd ones included, through rings that wrap:
// each sample arrives with its padded length and intact content.
func TestSizes(t *testing.T) {
	f := setup(t)
	c := bpftest.NewCollector()
	pb := newPB(t, f, c.Sample, c.LostFn, ringOpts(2)) // 8 KiB: most records straddle the end at some point
	for size := uint64(1); size <= 700; size += 10 {
		for _, cpu := range f.CPUs {
			f.Emit(t, cpu, 10, size, 10) // sizes size..size+9, < 8 KiB in all
		}
		if _, err := pb.Consume(); err != nil {
			t.Fatal(err)
		}
	}
	// Large samples near the ring size wrap on every other record.
	for _, size := range []uint64{3000, 4001, 5555, 8192 - 20 - 8} {
		for _, cpu := range f.CPUs {
			f.Emit(t, cpu, 1, size, 0)
			if _, err := pb.Consume(); err != nil {
				t.Fatal(err)
			}
		}
	}
	flush(t, f, pb)
	checkAccounting(t, c, f, pb)
	for _, cpu := range f.CPUs {
		if c.Lost[cpu] != 0 {
			t.Errorf("cpu %d lost %d samples draining after every burst", cpu, c.Lost[cpu])
		}
	}
}

// The largest sample a one-page ring takes is a page less 44 bytes (4052
// on 4 KiB pages): its record (8-byte header, u32 size, the data: a page
// less 32) beside the 24-byte lost record the kernel writes in front of it
// after a loss leaves the 8 bytes the kernel keeps free. New's
// MaxSampleSize check agrees with what the kernel does: a lost sample of
// that size is followed by its lost count and by the next sample. (The
// check took a page less 20, 4076: a sample that fits only an empty ring,
// and after one loss every later one was lost too, the count never
// delivered.)
func TestLargestSample(t *testing.T) {
	f := setup(t)
	largest, wedge := bpftest.Page-44, bpftest.Page-20
	if wedge > emitMaxSize {
		t.Fatalf("%d-byte pages: the emitter's samples (at most %d bytes, EMIT_MAX_SIZE in bpf/callback.bpf.c) cannot fill a page", bpftest.Page, emitMaxSize)
	}
	for _, n := range []int{largest + 1, wedge} {
		if _, err := perfbuf.New(f.Events, discard, nil, perfbuf.Options{RingBytes: bpftest.RingBytes(1), MaxSampleSize: n}); !errors.Is(err, perfbuf.ErrSampleTooLarge) {
			t.Fatalf("New with MaxSampleSize %d: %v, want ErrSampleTooLarge", n, err)
		}
	}
	cpu := f.CPUs[0]
	// Each size in a ring of its own: two samples, the second lost (the
	// ring is full), then a third after draining, which must carry the
	// lost count in front of it. wedge shows the wedge the check prevents.
	for _, size := range []uint64{uint64(largest), uint64(wedge)} {
		c := bpftest.NewCollector()
		o := ringOpts(1)
		if size == uint64(largest) {
			o.MaxSampleSize = largest
		}
		pb, err := perfbuf.New(f.Events, c.Sample, c.LostFn, o)
		if err != nil {
			t.Fatal(err)
		}
		before := f.Stats(t)[cpu]
		f.Emit(t, cpu, 2, size, 0)
		if _, err := pb.Consume(); err != nil {
			t.Fatal(err)
		}
		f.Emit(t, cpu, 1, size, 0)
		if _, err := pb.Consume(); err != nil {
			t.Fatal(err)
		}
		st := f.Stats(t)[cpu].Sub(before)
		pb.Close()
		t.Logf("%d-byte samples: emitted %d failed %d | received %d lost %d", size, st.Emitted, st.Failed, c.Samples[cpu], c.Lost[cpu])
		wedged := st.Emitted != 2 || st.Failed != 1 || c.Samples[cpu] != 2 || c.Lost[cpu] != 1
		if size == uint64(largest) && wedged {
			t.Errorf("%d-byte samples in a one-page ring: want 2 received and 1 lost", size)
		}
		if size == uint64(wedge) && !wedged {
			t.Errorf("%d-byte samples did not wedge the ring: the kernel's limit is not what New checks", size)
		}
	}
}

// A panic in the sample function reaches the caller; the rest of the batch is
// delivered by the next call, nothing twice.
func TestPanicInSampleFunc(t *testing.T) {
	f := setup(t)
	c := bpftest.NewCollector()
	n := 0
	sample := func(cpu int, data []byte) {
		n++
		c.Sample(cpu, data)
		if n == 3 || n == 7 {
			panic("boom")
		}
	}
	pb := newPB(t, f, sample, c.LostFn, ringOpts(4))
	for _, cpu := range f.CPUs {
		f.Emit(t, cpu, 10, 64, 0)
	}
	panics := 0
	for i := 0; i < 5; i++ {
		func() {
			defer func() {
				if r := recover(); r != nil {
					panics++
				}
			}()
			_, err := pb.Consume()
			if err != nil {
				t.Fatal(err)
			}
		}()
	}
	if panics != 2 {
		t.Errorf("%d panics reached Consume's caller, want 2", panics)
	}
	checkAccounting(t, c, f, pb)
}

// Poll and Consume from several goroutines while samples arrive: drains
// are serialised, accounting stays exact.
func TestConcurrentPollConsume(t *testing.T) {
	f := setup(t)
	c := bpftest.NewCollector()
	pb := newPB(t, f, c.Sample, c.LostFn, ringOpts(8))
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for g := 0; g < 3; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				var err error
				if g == 0 {
					_, err = pb.Consume()
				} else {
					_, err = pb.Poll(10 * time.Millisecond)
				}
				if err != nil {
					t.Error(err)
					return
				}
			}
		}(g)
	}
	for round := 0; round < 50; round++ {
		for _, cpu := range f.CPUs {
			f.Emit(t, cpu, 100, 16, 200)
		}
	}
	close(stop)
	wg.Wait()
	flush(t, f, pb)
	checkAccounting(t, c, f, pb)
}

// Close while another goroutine blocks in Poll: Poll returns promptly with
// os.ErrClosed, nothing crashes or hangs. 1000 rounds.
func TestCloseWhilePolling(t *testing.T) {
	f := setup(t)
	rounds := 1000
	if testing.Short() {
		rounds = 100
	}
	var worst time.Duration
	for i := 0; i < rounds; i++ {
		pb, err := perfbuf.New(f.Events, discard, nil, perfbuf.Options{RingBytes: 1 << 12})
		if err != nil {
			t.Fatal(err)
		}
		started := make(chan struct{})
		done := make(chan error, 1)
		go func() {
			close(started)
			_, err := pb.Poll(-1)
			done <- err
		}()
		<-started
		if i%2 == 0 {
			runtime.Gosched() // sometimes close before Poll waits, sometimes after
		}
		closed := time.Now()
		pb.Close()
		select {
		case err := <-done:
			worst = max(worst, time.Since(closed))
			if !errors.Is(err, os.ErrClosed) {
				t.Fatalf("round %d: Poll returned %v, want os.ErrClosed", i, err)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("round %d: Poll still blocked 5s after Close", i)
		}
		pb.Close() // idempotent
	}
	t.Logf("%d rounds; slowest Poll return after Close: %v", rounds, worst)
}

// loadProg loads a program of type typ that returns 0, closed at cleanup.
func loadProg(t *testing.T, typ uint32) int {
	t.Helper()
	insns := []uint64{
		0xb7, // r0 = 0 (BPF_ALU64 | BPF_MOV | BPF_K)
		0x95, // exit (BPF_JMP | BPF_EXIT)
	}
	license := []byte("GPL\x00")
	var attr [48]byte // union bpf_attr, BPF_PROG_LOAD: prog_type, insn_cnt, insns, license
	binary.NativeEndian.PutUint32(attr[0:], typ)
	binary.NativeEndian.PutUint32(attr[4:], uint32(len(insns)))
	binary.NativeEndian.PutUint64(attr[8:], uint64(uintptr(unsafe.Pointer(&insns[0]))))
	binary.NativeEndian.PutUint64(attr[16:], uint64(uintptr(unsafe.Pointer(&license[0]))))
	// The verifier gives up with EAGAIN when a signal is pending (the Go
	// runtime's preemption signals come often under QEMU): try again, as
	// libbpf's sys_bpf_prog_load does.
	var fd uintptr
	var errno syscall.Errno
	for try := 0; try < 5; try++ {
		if fd, _, errno = syscall.Syscall(unix.SYS_BPF, unix.BPF_PROG_LOAD, uintptr(unsafe.Pointer(&attr[0])), uintptr(len(attr))); errno != syscall.EAGAIN {
			break
		}
	}
	runtime.KeepAlive(insns)
	runtime.KeepAlive(license)
	if errno != 0 {
		t.Fatalf("load program of type %d: %v", typ, errno)
	}
	t.Cleanup(func() { syscall.Close(int(fd)) })
	return int(fd)
}

func countPerfMaps(t *testing.T) int {
	b, err := os.ReadFile("/proc/self/maps")
	if err != nil {
		t.Fatal(err)
	}
	return strings.Count(string(b), "perf_event")
}

// 1000 New/Close cycles, and 1000 NewReader/Close cycles, leave
// descriptors and mappings as they were: 100 of each in the VM guests
// (PERFBUF_VMTEST=1), where a cycle of 8 CPUs' rings costs about 30 ms under
// TCG, the most of any guest's time; a leak of one a cycle shows in either.
func TestNewCloseLeaks(t *testing.T) {
	f := setup(t)
	n := 1000
	if os.Getenv("PERFBUF_VMTEST") == "1" {
		n = 100
	}
	cycles := map[string]func(){
		"New": func() {
			pb, err := perfbuf.New(f.Events, discard, nil, perfbuf.Options{RingBytes: bpftest.RingBytes(2)})
			if err != nil {
				t.Fatal(err)
			}
			if _, err := pb.Poll(0); err != nil {
				t.Fatal(err)
			}
			pb.Close()
		},
		"NewReader": func() {
			r, err := perfbuf.NewReader(f.Events, perfbuf.ReaderOptions{Options: perfbuf.Options{RingBytes: bpftest.RingBytes(2)}})
			if err != nil {
				t.Fatal(err)
			}
			r.SetDeadline(time.Now())
			if err := r.ReadInto(new(perfbuf.Sample)); !errors.Is(err, os.ErrDeadlineExceeded) {
				t.Fatalf("read past the deadline: %v", err)
			}
			r.Close()
		},
	}
	for name, cycle := range cycles {
		cycle() // let the runtime open what it opens once
		fds, maps := bpftest.OpenFDs(t), countPerfMaps(t)
		for range n {
			cycle()
		}
		if got := bpftest.OpenFDs(t); got != fds {
			t.Errorf("%s: open descriptors: %d before, %d after %d cycles", name, fds, got, n)
		}
		if got := countPerfMaps(t); got != maps {
			t.Errorf("%s: perf_event mappings: %d before, %d after %d cycles", name, maps, got, n)
		}
	}
}

// Bad input gets a clear error before anything is created.
func TestErrors(t *testing.T) {
	f := setup(t)

	_, err := perfbuf.New(bpftest.Map(t, f.Mod, "not_perf"), discard, nil, perfbuf.Options{})
	if !errors.Is(err, perfbuf.ErrMapType) || !strings.Contains(err.Error(), "hash") {
		t.Errorf("hash map: %v; want ErrMapType naming the type", err)
	}

	dup, err := syscall.Dup(f.Events.FileDescriptor())
	if err != nil {
		t.Fatal(err)
	}
	syscall.Close(dup)
	_, err = perfbuf.New(perfbuf.MapFD(dup), discard, nil, perfbuf.Options{})
	if !errors.Is(err, syscall.EBADF) {
		t.Errorf("closed fd: %v; want EBADF", err)
	}
	var errno syscall.Errno
	if !errors.As(err, &errno) {
		t.Errorf("closed fd: %v is not a syscall.Errno underneath", err)
	}

	null, err := os.Open("/dev/null")
	if err != nil {
		t.Fatal(err)
	}
	defer null.Close()
	if _, err = perfbuf.New(perfbuf.MapFD(null.Fd()), discard, nil, perfbuf.Options{}); !errors.Is(err, syscall.EINVAL) {
		t.Errorf("non-BPF fd: %v; want EINVAL", err)
	}

	// A program's fd is no map, though BPF_OBJ_GET_INFO_BY_FD answers for
	// it: its prog info used to be read as a map's ("has type xskmap
	// (17)"), and a program whose type number is the perf event array's
	// (BPF_PROG_TYPE_SCHED_ACT, 4) passed as one and failed with a bare
	// EINVAL later.
	progs := map[string]int{"raw_tp program": f.Prog, "sched_act program": loadProg(t, 4)}
	for name, fd := range progs {
		_, err := perfbuf.New(perfbuf.MapFD(fd), discard, nil, perfbuf.Options{})
		if !errors.Is(err, perfbuf.ErrMapType) || !strings.Contains(err.Error(), "not a BPF map") {
			t.Errorf("%s fd: %v; want ErrMapType saying it is not a BPF map", name, err)
		}
	}

	for _, bytes := range []int{-1, -4096, 1<<40 + 1, 1 << 62} {
		if _, err := perfbuf.New(f.Events, discard, nil, perfbuf.Options{RingBytes: bytes}); !errors.Is(err, os.ErrInvalid) {
			t.Errorf("RingBytes %d: %v; want os.ErrInvalid", bytes, err)
		}
		if _, err := perfbuf.NewReader(f.Events, perfbuf.ReaderOptions{Options: perfbuf.Options{RingBytes: bytes}}); !errors.Is(err, os.ErrInvalid) {
			t.Errorf("NewReader with RingBytes %d: %v; want os.ErrInvalid", bytes, err)
		}
	}

	pb, err := perfbuf.New(perfbuf.MapFD(f.Events.FileDescriptor()), discard, nil, perfbuf.Options{RingBytes: 1 << 12})
	if err != nil {
		t.Fatal(err)
	}
	n := pb.BufferCount()
	for _, i := range []int{-1, n, n + 100} {
		if _, err := pb.ConsumeBuffer(i); !errors.Is(err, os.ErrInvalid) {
			t.Errorf("ConsumeBuffer(%d): %v; want os.ErrInvalid", i, err)
		}
		if _, err := pb.BufferFD(i); !errors.Is(err, os.ErrInvalid) {
			t.Errorf("BufferFD(%d): %v; want os.ErrInvalid", i, err)
		}
	}
	if fd, err := pb.BufferFD(0); err != nil || fd < 0 {
		t.Errorf("BufferFD(0) = %d, %v", fd, err)
	}
	if fd, err := pb.EpollFD(); err != nil || fd < 0 {
		t.Errorf("EpollFD() = %d, %v", fd, err)
	}
	pb.Close()
	calls := map[string]func() error{
		"Poll":          func() error { _, err := pb.Poll(0); return err },
		"Consume":       func() error { _, err := pb.Consume(); return err },
		"ConsumeBuffer": func() error { _, err := pb.ConsumeBuffer(0); return err },
		"BufferFD":      func() error { _, err := pb.BufferFD(0); return err },
		"EpollFD":       func() error { _, err := pb.EpollFD(); return err },
	}
	for name, call := range calls {
		if err := call(); !errors.Is(err, os.ErrClosed) {
			t.Errorf("%s after Close: %v; want os.ErrClosed", name, err)
		}
	}
	if err := pb.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}

	// The same of a Raw, whose Buffer takes the index too.
	raw, err := perfbuf.NewRaw(perfbuf.MapFD(f.Events.FileDescriptor()), perfbuf.Options{RingBytes: 1 << 12})
	if err != nil {
		t.Fatal(err)
	}
	n = raw.BufferCount()
	for _, i := range []int{-1, n, n + 100} {
		if _, err := raw.Buffer(i); !errors.Is(err, os.ErrInvalid) {
			t.Errorf("Raw.Buffer(%d): %v; want os.ErrInvalid", i, err)
		}
		if _, err := raw.BufferFD(i); !errors.Is(err, os.ErrInvalid) {
			t.Errorf("Raw.BufferFD(%d): %v; want os.ErrInvalid", i, err)
		}
	}
	raw.Close()
	rawCalls := map[string]func() error{
		"Buffer":   func() error { _, err := raw.Buffer(0); return err },
		"Wait":     func() error { _, err := raw.Wait(0, nil); return err },
		"BufferFD": func() error { _, err := raw.BufferFD(0); return err },
		"EpollFD":  func() error { _, err := raw.EpollFD(); return err },
	}
	for name, call := range rawCalls {
		if err := call(); !errors.Is(err, os.ErrClosed) {
			t.Errorf("Raw.%s after Close: %v; want os.ErrClosed", name, err)
		}
	}
	if err := raw.Close(); err != nil {
		t.Errorf("second Raw.Close: %v", err)
	}

	// A Reader's, the same methods (Rings'): its rings' perf events and
	// the epoll set its reads wait in.
	rd, err := perfbuf.NewReader(perfbuf.MapFD(f.Events.FileDescriptor()), perfbuf.ReaderOptions{Options: perfbuf.Options{RingBytes: 1 << 12}})
	if err != nil {
		t.Fatal(err)
	}
	if got := rd.BufferCount(); got != n {
		t.Errorf("Reader.BufferCount %d, Raw's %d", got, n)
	}
	link := func(fd int, err error) string {
		if err != nil {
			return err.Error()
		}
		l, err := os.Readlink(fmt.Sprintf("/proc/self/fd/%d", fd))
		if err != nil {
			return err.Error()
		}
		return l
	}
	if l := link(rd.BufferFD(0)); l != "anon_inode:[perf_event]" {
		t.Errorf("Reader.BufferFD(0) is %q, want a perf event", l)
	}
	if l := link(rd.EpollFD()); l != "anon_inode:[eventpoll]" {
		t.Errorf("Reader.EpollFD() is %q, want an epoll set", l)
	}
	if _, err := rd.BufferFD(n); !errors.Is(err, os.ErrInvalid) {
		t.Errorf("Reader.BufferFD(%d): %v; want os.ErrInvalid", n, err)
	}
	rd.Close()
	if _, err := rd.EpollFD(); !errors.Is(err, os.ErrClosed) {
		t.Errorf("Reader.EpollFD after Close: %v; want os.ErrClosed", err)
	}
}

// New needs a sample function; lost may be nil. A refused New leaves the
// map free.
func TestNewNeedsSampleFunc(t *testing.T) {
	f := setup(t)
	lost := func(int, uint64) {}
	for name, l := range map[string]func(int, uint64){"no functions": nil, "lost only": lost} {
		pb, err := perfbuf.New(f.Events, nil, l, perfbuf.Options{RingBytes: 1 << 12})
		if !errors.Is(err, os.ErrInvalid) {
			t.Errorf("New with %s: %v; want os.ErrInvalid", name, err)
		}
		if pb != nil {
			pb.Close()
		}
	}
	c := bpftest.NewCollector()
	pb := newPB(t, f, c.Sample, nil, ringOpts(1))
	f.Emit(t, f.CPUs[0], 3, 32, 0)
	if n, err := pb.Consume(); n != 3 || err != nil {
		t.Errorf("Consume after the refused News: %d samples, %v; want 3", n, err)
	}
}

// Close counts what callback mode left in the rings as Discarded, in bytes:
// every record of the samples emitted and not consumed (8 + round_up(size+4,
// 8) bytes each), on the ring of the CPU that emitted them only, also when
// the ring is full. Consume, then Close, is the lossless stop: it discards
// nothing.
func TestCloseDiscards(t *testing.T) {
	f := setup(t)
	cpu := f.CPUs[len(f.CPUs)-1]
	for _, tc := range []struct {
		name              string
		count, size, span uint64
		consume           bool
	}{
		{"left", 80, 1, 40, false}, // sizes 1..40: 16- to 48-byte records
		{"consumed", 80, 1, 40, true},
		{"full", 300, 40, 0, false}, // 56-byte records: 73 fit, the rest are lost
	} {
		c := bpftest.NewCollector()
		pb, err := perfbuf.New(f.Events, c.Sample, c.LostFn, ringOpts(1))
		if err != nil {
			t.Fatal(err)
		}
		before := f.Stats(t)[cpu]
		f.Emit(t, cpu, tc.count, tc.size, tc.span)
		em := f.Stats(t)[cpu].Sub(before)
		if tc.span != 0 && em.Failed != 0 {
			t.Fatalf("%s: %d samples failed; the test expects all to fit", tc.name, em.Failed)
		}
		var emitted uint64 // bytes
		for i := range em.Emitted {
			emitted += uint64(bpftest.RecordSize(int(tc.size + i%max(tc.span, 1))))
		}
		if tc.consume {
			if got, err := pb.Consume(); uint64(got) != em.Emitted || err != nil {
				t.Errorf("%s: Consume = %d, %v; want %d samples", tc.name, got, err, em.Emitted)
			}
		}
		pb.Close()
		c.Check(t)
		stats := pb.Stats()
		c.CheckStats(t, stats.Rings)
		left := em.Emitted
		if tc.consume {
			left = 0
		}
		if stats.Left != left {
			t.Errorf("%s: %d samples left at Close in all, want %d", tc.name, stats.Left, left)
		}
		for _, st := range stats.Rings {
			var want uint64
			if st.CPU == cpu {
				t.Logf("%s: cpu %d: emitted %d (%d bytes), failed %d | delivered %d, %d left",
					tc.name, cpu, em.Emitted, emitted, em.Failed, st.Samples, st.Left)
				if !tc.consume {
					want = em.Emitted
				}
			}
			if st.Left != want {
				t.Errorf("%s: cpu %d: %d samples left at Close, want %d", tc.name, st.CPU, st.Left, want)
			}
			// A full ring's losses, never reported in a lost record: the
			// kernel's count of refused outputs (6.0).
			if st.CPU == cpu && kernel.FormatLost() && st.Lost != em.Failed {
				t.Errorf("%s: cpu %d: %d lost at Close, want the %d outputs that failed", tc.name, cpu, st.Lost, em.Failed)
			}
		}
		if pb.Close(); !reflect.DeepEqual(pb.Stats(), stats) {
			t.Errorf("%s: a second Close changed the stats: %+v, then %+v", tc.name, stats, pb.Stats())
		}
	}
}

// Close called from inside the sample function stops delivery at once: that call is
// the last, and the rings are freed when the Consume running it returns; no
// deadlock. The samples left in the ring are counted as Discarded.
func TestCloseFromCallback(t *testing.T) {
	f := setup(t)
	var pb *perfbuf.PerfBuffer
	calls := 0
	pb = newPB(t, f, func(int, []byte) {
		calls++
		pb.Close()
	}, nil, ringOpts(1))
	const size = 32
	f.Emit(t, f.CPUs[0], 5, size, 0)
	if !finishes(5*time.Second, func() {
		if _, err := pb.Consume(); err != nil {
			t.Errorf("Consume: %v", err)
		}
	}) {
		t.Fatal("Consume deadlocked after Close from the sample function")
	}
	if _, err := pb.Consume(); !errors.Is(err, os.ErrClosed) {
		t.Errorf("Consume after Close: %v", err)
	}
	if calls != 1 {
		t.Errorf("the sample function ran %d times; want once, then Close", calls)
	}
	st := pb.Stats().Rings[0]
	if st.Samples != 1 || st.Left != 4 {
		t.Errorf("stats %+v; want 1 sample delivered and 4 left", st)
	}
}

// After the sample function panicked in Poll, the next Poll delivers the rest
// without waiting: they are in rings whose readiness epoll has reported
// already. (Poll(-1) used to wait for a wakeup that would not come.)
func TestPollAfterPanicDeliversRest(t *testing.T) {
	f := setup(t)
	var mu sync.Mutex
	calls := 0
	pb := newPB(t, f, func(int, []byte) {
		mu.Lock()
		calls++
		n := calls
		mu.Unlock()
		if n == 1 {
			panic("boom")
		}
	}, nil, ringOpts(1))
	f.Emit(t, f.CPUs[0], 10, 32, 0)
	func() {
		defer func() { recover() }()
		pb.Poll(-1)
		t.Fatal("first Poll did not panic")
	}()
	done := make(chan int, 1)
	go func() {
		n, _ := pb.Poll(-1)
		done <- n
	}()
	select {
	case n := <-done:
		if n != 9 {
			t.Errorf("second Poll delivered %d, want 9", n)
		}
	case <-time.After(3 * time.Second):
		mu.Lock()
		got := calls
		mu.Unlock()
		t.Errorf("Poll(-1) still blocked after 3s with %d of 10 samples delivered: it waits for a wakeup that was spent", got)
		pb.Close()
		<-done
	}
}

// A large WakeupEvents, up to MaxInt32, is taken as it is: no wakeup after
// one sample. Beyond, New refuses it (attr.wakeup_events is a u32 that the
// kernel reads as an int: 1<<31 woke on every sample, and 1<<32+1 was
// truncated to 1).
func TestWakeupEventsLarge(t *testing.T) {
	f := setup(t)
	try := func(wakeup int) int {
		pb, err := perfbuf.New(f.Events, discard, nil, perfbuf.Options{RingBytes: bpftest.RingBytes(4), WakeupEvents: wakeup})
		if err != nil {
			t.Logf("WakeupEvents %d: New: %v", wakeup, err)
			return -1
		}
		defer pb.Close()
		pb.Poll(0) // the ring's state at the start
		// A sample written while Poll is parked, below the threshold,
		// raises no wakeup: the Poll sleeps its whole timeout, then
		// delivers what is there. (One written before a Poll starts is
		// delivered at once: a Poll looks at the rings.)
		const timeout = 300 * time.Millisecond
		type result struct {
			n       int
			err     error
			elapsed time.Duration
		}
		done := make(chan result, 1)
		start := time.Now()
		go func() {
			n, err := pb.Poll(timeout)
			done <- result{n, err, time.Since(start)}
		}()
		if !bpftest.Parked("perfbuf.(*PerfBuffer).Poll", 30*time.Second) {
			t.Fatal("Poll never parked in the netpoller")
		}
		f.Emit(t, f.CPUs[0], 1, 32, 0)
		r := <-done
		t.Logf("WakeupEvents %d: Poll delivered %d after %v", wakeup, r.n, r.elapsed)
		if r.err != nil {
			t.Fatal(r.err)
		}
		if r.elapsed < timeout {
			return 1 // woken before its timeout, without a wakeup
		}
		if n, err := pb.Poll(0); r.n+n != 1 || err != nil {
			t.Fatalf("WakeupEvents %d: %d samples, then %d, %v; want the one", wakeup, r.n, n, err)
		}
		return 0
	}
	if try(1<<30) != 0 {
		t.Fatalf("WakeupEvents 1<<30: a sample woke Poll before its timeout")
	}
	if try(math.MaxInt32) != 0 {
		t.Errorf("WakeupEvents MaxInt32: a sample woke Poll before its timeout")
	}
	if _, err := perfbuf.New(f.Events, discard, nil, perfbuf.Options{WakeupEvents: math.MaxInt32 + 1}); !errors.Is(err, os.ErrInvalid) {
		t.Errorf("WakeupEvents MaxInt32+1: New: %v, want os.ErrInvalid", err)
	}
}

// A Reader holds the map until Close, as a PerfBuffer does: a second Reader
// or a PerfBuffer on it is refused meanwhile, and once it is closed the map
// can be read again, by either.
func TestReaderReopen(t *testing.T) {
	f := setup(t)
	cpu := f.CPUs[0]
	r, err := perfbuf.NewReader(f.Events, perfbuf.ReaderOptions{Options: perfbuf.Options{RingBytes: 1 << 12}})
	if err != nil {
		t.Fatal(err)
	}
	if r2, err := perfbuf.NewReader(f.Events, perfbuf.ReaderOptions{Options: perfbuf.Options{RingBytes: 1 << 12}}); !errors.Is(err, perfbuf.ErrMapInUse) {
		t.Errorf("second NewReader on the map: %v; want ErrMapInUse", err)
		if r2 != nil {
			r2.Close()
		}
	}
	if pb, err := perfbuf.New(f.Events, discard, nil, perfbuf.Options{RingBytes: 1 << 12}); !errors.Is(err, perfbuf.ErrMapInUse) {
		t.Errorf("New on the map a Reader reads: %v; want ErrMapInUse", err)
		if pb != nil {
			pb.Close()
		}
	}
	r.Close()

	r, err = perfbuf.NewReader(f.Events, perfbuf.ReaderOptions{Options: perfbuf.Options{RingBytes: 1 << 12}})
	if err != nil {
		t.Fatalf("NewReader after the first Reader was closed: %v", err)
	}
	f.Emit(t, cpu, 2, 32, 0)
	r.SetDeadline(time.Now().Add(5 * time.Second))
	r.Flush()
	c := bpftest.NewCollector()
	var s perfbuf.Sample
	for {
		err := r.ReadInto(&s)
		if errors.Is(err, perfbuf.ErrFlushed) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		c.Sample(s.CPU, s.Data)
	}
	r.Close()
	if c.Samples[cpu] != 2 {
		t.Errorf("the reopened Reader read %v; want 2 samples from cpu %d", c.Samples, cpu)
	}
	c.Check(t)

	pb := newPB(t, f, c.Sample, c.LostFn, ringOpts(1))
	f.Emit(t, cpu, 3, 32, 0)
	if n, err := pb.Consume(); n != 3 || err != nil {
		t.Errorf("PerfBuffer after the Reader was closed: Consume = %d, %v; want 3 samples", n, err)
	}
}

// Buffer indexes follow the online CPUs, not CPU numbers: with a CPU in the
// middle offline (scripts/vmtest.sh takes CPU PERFBUF_OFFLINE_CPU offline in
// its guests, never on a host), BufferCount, Stats' Rings (their CPUs), RawBuffer.Stats().CPU
// and both readers name the online CPUs only, and every sample emitted on
// one arrives with that CPU.
func TestRingsFollowOnlineCPUs(t *testing.T) {
	f := setup(t)
	online, err := cpus.Online()
	if err != nil {
		t.Fatal(err)
	}
	if s := os.Getenv("PERFBUF_OFFLINE_CPU"); s != "" {
		off, err := strconv.Atoi(s)
		if err != nil {
			t.Fatalf("PERFBUF_OFFLINE_CPU=%q: %v", s, err)
		}
		if slices.Contains(online, off) {
			t.Fatalf("cpu %d should be offline; online: %v", off, online)
		}
		// No ring and no CPU to run on: the kernel refuses the test run.
		if err := f.TryEmit(off, 1, 8, 0); !errors.Is(err, syscall.ENXIO) {
			t.Errorf("emit on offline cpu %d: %v, want ENXIO", off, err)
		}
		t.Logf("cpu %d offline; rings on %v", off, online)
	}
	if !slices.Equal(f.CPUs, online) {
		t.Fatalf("emitter cpus %v, online %v", f.CPUs, online)
	}
	c := bpftest.NewCollector()
	pb := newPB(t, f, c.Sample, c.LostFn, ringOpts(1)) // checks BufferCount and Stats' CPUs against online
	var statCPUs []int
	for _, s := range pb.Stats().Rings {
		statCPUs = append(statCPUs, s.CPU)
	}
	if !slices.Equal(statCPUs, online) {
		t.Errorf("Stats CPUs %v, want %v", statCPUs, online)
	}
	pb.Close()
	raw, err := perfbuf.NewRaw(f.Events, ringOpts(1))
	if err != nil {
		t.Fatal(err)
	}
	for i, cpu := range online {
		rb, err := raw.Buffer(i)
		if err != nil {
			t.Fatal(err)
		}
		if rb.Stats().CPU != cpu {
			t.Errorf("Buffer(%d).Stats().CPU = %d, want %d", i, rb.Stats().CPU, cpu)
		}
		rb.Release()
	}
	raw.Close()

	// Each Reader, fullest-first and ordered: one sample per online CPU,
	// each delivered with its CPU.
	for _, ordered := range []bool{false, true} {
		ro := perfbuf.ReaderOptions{Options: perfbuf.Options{RingBytes: 1 << 12}}
		if ordered {
			ro.Order = &perfbuf.Order{KeyOffset: 8}
		}
		r, err := perfbuf.NewReader(f.Events, ro)
		if err != nil {
			t.Fatal(err)
		}
		for _, cpu := range online {
			f.Emit(t, cpu, 1, 32, 0)
		}
		r.SetDeadline(time.Now().Add(5 * time.Second))
		r.Flush()
		got := map[int]int{}
		var s perfbuf.Sample
		for {
			err := r.ReadInto(&s)
			if errors.Is(err, perfbuf.ErrFlushed) {
				break
			}
			if err != nil {
				t.Fatal(err)
			}
			if h, err := bpftest.Check(s.Data, s.CPU); err != nil {
				t.Error(err)
			} else if int(h.CPU) != s.CPU {
				t.Errorf("sample from cpu %d delivered for cpu %d", h.CPU, s.CPU)
			}
			got[s.CPU]++
		}
		var statCPUs []int
		for _, st := range r.Stats().Rings {
			statCPUs = append(statCPUs, st.CPU)
			if got[st.CPU] != 1 || st.Samples != 1 {
				t.Errorf("ordered %v: cpu %d: %d samples read, stats say %d; want 1", ordered, st.CPU, got[st.CPU], st.Samples)
			}
		}
		if !slices.Equal(statCPUs, online) || len(got) != len(online) {
			t.Errorf("ordered %v: stats cpus %v, samples from %v; want %v", ordered, statCPUs, got, online)
		}
		r.Close()
	}
}

// A second PerfBuffer on a map that one already reads is refused, through
// any fd of the map: it used to take the map's slots over, so that the
// first received nothing, and once closed left the first dead. Once the
// first is closed, the map can be read again.
func TestSecondReaderOfMapRefused(t *testing.T) {
	f := setup(t)
	c := bpftest.NewCollector()
	pb := newPB(t, f, c.Sample, c.LostFn, ringOpts(1))
	dup, err := syscall.Dup(f.Events.FileDescriptor())
	if err != nil {
		t.Fatal(err)
	}
	defer syscall.Close(dup)
	for name, m := range map[string]perfbuf.Map{"same fd": f.Events, "dup fd": perfbuf.MapFD(dup)} {
		pb2, err := perfbuf.New(m, discard, nil, perfbuf.Options{RingBytes: 1 << 12})
		if !errors.Is(err, perfbuf.ErrMapInUse) {
			t.Errorf("second New on the %s: %v; want ErrMapInUse", name, err)
		}
		if pb2 != nil {
			pb2.Close()
		}
		r, err := perfbuf.NewReader(m, perfbuf.ReaderOptions{Options: perfbuf.Options{RingBytes: 1 << 12}})
		if !errors.Is(err, perfbuf.ErrMapInUse) {
			t.Errorf("NewReader on the %s: %v; want ErrMapInUse", name, err)
		}
		if r != nil {
			r.Close()
		}
	}
	cpu := f.CPUs[0]
	f.Emit(t, cpu, 3, 32, 0)
	if n, err := pb.Consume(); n != 3 || err != nil {
		t.Errorf("first PerfBuffer after the second New: Consume = %d, %v; want 3 samples", n, err)
	}
	pb.Close()
	pb3, err := perfbuf.New(perfbuf.MapFD(dup), discard, nil, perfbuf.Options{RingBytes: 1 << 12})
	if err != nil {
		t.Fatalf("New after the first was closed: %v", err)
	}
	defer pb3.Close()
	f.Emit(t, cpu, 2, 32, 0)
	if n, err := pb3.Consume(); n != 2 || err != nil {
		t.Errorf("new PerfBuffer: Consume = %d, %v; want 2 samples", n, err)
	}
}

// Poll, Consume and ConsumeBuffer called from inside the sample or lost
// function fail with ErrReentrant: they used to wait for the drain running
// the callback, forever.
func TestCallFromCallbackReentrant(t *testing.T) {
	f := setup(t)
	calls := map[string]func(pb *perfbuf.PerfBuffer) error{
		"Poll":          func(pb *perfbuf.PerfBuffer) error { _, err := pb.Poll(-1); return err },
		"Consume":       func(pb *perfbuf.PerfBuffer) error { _, err := pb.Consume(); return err },
		"ConsumeBuffer": func(pb *perfbuf.PerfBuffer) error { _, err := pb.ConsumeBuffer(0); return err },
	}
	for name, call := range calls {
		for _, lost := range []bool{false, true} {
			var pb *perfbuf.PerfBuffer
			var got error
			var once sync.Once
			armed := !lost
			in := func() {
				if armed {
					once.Do(func() { got = call(pb) })
				}
			}
			sample := func(int, []byte) {
				if !lost {
					in()
				}
			}
			var err error
			if pb, err = perfbuf.New(f.Events, sample, func(int, uint64) { in() }, ringOpts(1)); err != nil {
				t.Fatal(err)
			}
			cpu := pb.Stats().Rings[0].CPU
			if lost {
				f.Emit(t, cpu, 500, 64, 0) // overflows: the next sample brings a lost record
				if _, err := pb.ConsumeBuffer(0); err != nil {
					t.Fatal(err)
				}
				armed = true
			}
			f.Emit(t, cpu, 2, 32, 0)
			if !finishes(5*time.Second, func() { pb.ConsumeBuffer(0) }) {
				t.Fatalf("%s from inside a callback (lost %v): deadlock", name, lost)
			}
			if !errors.Is(got, perfbuf.ErrReentrant) {
				t.Errorf("%s from inside a callback (lost %v): %v, want ErrReentrant", name, lost, got)
			}
			pb.Close()
		}
	}
}
