// SPDX-License-Identifier: Apache-2.0

// Privileged selftests of a buffer whose kind is chosen at load
// (package bpfbuffer, PERFBUF_BUFFER of bpf/perfbuf.bpf.h): bpfbuffer.bpf.c
// is loaded once as a ring buffer and once as a perf event array (the
// choice of Any, a ring per CPU here, is percpu_test.go's), each read by the same perfbuf.NewReader with the
// same Options; it counts every attempt and its result itself, and the
// test accounts for every record, a full ring's and every failure's
// included, against what perfbuf reports.
package bpfbuffer

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/aquasecurity/libbpfgo"
	"github.com/perfbuf/perfbuf"
	"github.com/perfbuf/perfbuf/bpfbuffer"
	"github.com/perfbuf/perfbuf/internal/bpfrun"
	"github.com/perfbuf/perfbuf/internal/cpus"
	"github.com/perfbuf/perfbuf/selftest/internal/bpftest"
	"github.com/perfbuf/perfbuf/selftest/internal/ledger"
	"golang.org/x/sys/unix"
)

const obj = "bpf/bpfbuffer.bpf.o"

// The program's limits (bpfbuffer.bpf.c): the largest reserve
// (SAMPLE_MAX), the most records a run makes (BATCH), the ring's size as
// compiled (RING_SIZE).
const (
	sampleMax = 256
	batch     = 64
	ringSize  = 64 << 10
)

// How produce writes (enum how).
const (
	viaOutput  = iota // perfbuf_buffer_output
	viaReserve        // perfbuf_buffer_reserve, _submit
	viaDiscard        // the same, discarding every `every`-th
	viaTooBig         // perfbuf_buffer_reserve above SAMPLE_MAX
	viaInner          // perfbuf_ringbuf_output to an empty map-in-map slot
	viaStamped        // a 32-byte reserve, perfbuf_stamp's key at offset 16
)

var quiet sync.Once

// open opens the object without loading it, closed at cleanup.
func open(t testing.TB) *libbpfgo.Module {
	t.Helper()
	return openObj(t, obj)
}

// openObj opens the BPF object at path, closed at the test's end.
func openObj(t testing.TB, obj string) *libbpfgo.Module {
	t.Helper()
	bpftest.RequirePrivileges(t)
	if _, err := os.Stat(obj); err != nil {
		t.Fatalf("%v (run `make bpf`)", err)
	}
	quiet.Do(func() {
		libbpfgo.SetLoggerCbs(libbpfgo.Callbacks{LogFilters: []func(int, string) bool{
			func(level int, _ string) bool { return level == libbpfgo.LibbpfDebugLevel },
		}})
	})
	m, err := libbpfgo.NewModuleFromFileArgs(libbpfgo.NewModuleArgs{BPFObjPath: obj, SkipMemlockBump: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(m.Close)
	return m
}

type fixture struct {
	mod      *libbpfgo.Module
	kind     bpfbuffer.Kind
	events   *libbpfgo.BPFMap
	failures *libbpfgo.BPFMap
	prog     int
	cpus     []int
}

// setup opens the object, prepares its buffer as want with opts, and loads
// it.
func setup(t testing.TB, want bpfbuffer.Kind, opts *perfbuf.Options, more ...bpfbuffer.Option) *fixture {
	t.Helper()
	m := open(t)
	kind, err := bpfbuffer.Prepare(m, "events", want, opts, more...)
	if err != nil {
		t.Fatal(err)
	}
	if err := m.BPFLoadObject(); err != nil {
		t.Fatalf("load as %v: %v", kind, err)
	}
	online, err := cpus.Online()
	if err != nil {
		t.Fatal(err)
	}
	return &fixture{
		mod:      m,
		kind:     kind,
		events:   bpftest.Map(t, m, "events"),
		failures: bpftest.Map(t, m, "events_failures"),
		prog:     bpftest.Prog(t, m, "produce"),
		cpus:     online,
	}
}

// produce runs the program on cpu: count records of size bytes, how.
func (f *fixture) produce(t *testing.T, cpu int, count, size, how, every uint64) {
	t.Helper()
	for done := uint64(0); done < count; done += batch {
		bpftest.Run(t, f.prog, cpu, min(count-done, batch), size, how, every)
	}
}

// outcomes reads the program's own counts, by CPU.
func (f *fixture) outcomes(t *testing.T) map[int]ledger.Outcome {
	t.Helper()
	return bpftest.PerCPU[ledger.Outcome](t, f.mod, "outcomes")
}

// collector counts what a reader delivered, per CPU as the sample says,
// and checks each sample.
type collector struct {
	t    *testing.T
	kind bpfbuffer.Kind
	got  map[int]uint64
}

func (c *collector) sample(recCPU int, data []byte) {
	if len(data) < 16 {
		c.t.Errorf("%d-byte sample", len(data))
		return
	}
	cpu := int(binary.NativeEndian.Uint32(data[8:]))
	size := int(binary.NativeEndian.Uint32(data[12:]))
	want := -1 // a ring buffer's record is every CPU's
	if c.kind == bpfbuffer.PerfEventArray {
		want = cpu
	}
	if recCPU != want {
		c.t.Errorf("a sample written on cpu %d delivered for cpu %d, want %d", cpu, recCPU, want)
	}
	if len(data) < size {
		c.t.Errorf("cpu %d: %d bytes, the sample says %d", cpu, len(data), size)
	}
	c.got[cpu]++
}

func (c *collector) consume(t *testing.T, r *perfbuf.Reader) {
	t.Helper()
	var buf []byte
	if _, err := r.Consume(func(rec *perfbuf.Record) error {
		if rec.Type == perfbuf.RecordSample {
			buf = rec.AppendTo(buf[:0])
			c.sample(rec.CPU, buf)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}

// One program, loaded as a ring buffer and as a perf event array (Any's
// ring per CPU: TestRingPerCPU), read by the same NewReader with
// the same Options. On each CPU: outputs before the reader opens, outputs
// and reserves that reach the buffer, discards, reserves above the
// buffer's max sample (einval), outputs to a missing inner ring buffer
// (noent), a full ring (a ring buffer's full, a perf ring's lost samples),
// and samples left at Close. Every attempt is accounted for, per CPU for a
// perf event array, per ring (the CPUs' failures summed) for a ring
// buffer.
func TestBothKinds(t *testing.T) {
	for _, tc := range []struct {
		name string
		want bpfbuffer.Kind
		got  bpfbuffer.Kind
	}{
		{"ring buffer forced", bpfbuffer.RingBuf, bpfbuffer.RingBuf},
		{"perf forced", bpfbuffer.PerfEventArray, bpfbuffer.PerfEventArray},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// One page: a ring buffer of a page, or a page per CPU.
			opts := perfbuf.Options{RingBytes: bpftest.RingBytes(1)}
			f := setup(t, tc.want, &opts)
			if f.kind != tc.got {
				t.Fatalf("Prepare chose %v, want %v", f.kind, tc.got)
			}
			checkMaps(t, f)

			for _, cpu := range f.cpus {
				f.produce(t, cpu, 3, 48, viaOutput, 1) // before the reader: perf slots are empty
			}
			opts.FailureMap = f.failures
			r, err := perfbuf.NewReader(f.events, perfbuf.ReaderOptions{Options: opts})
			if err != nil {
				t.Fatal(err)
			}
			defer r.Close()
			c := &collector{t: t, kind: f.kind, got: map[int]uint64{}}
			for _, cpu := range f.cpus {
				f.produce(t, cpu, 5, 48, viaOutput, 1)
				f.produce(t, cpu, 5, 32, viaReserve, 1)
				f.produce(t, cpu, 4, 200, viaReserve, 1) // 256-byte reserves
				f.produce(t, cpu, 8, 32, viaDiscard, 4)  // 2 discarded
				f.produce(t, cpu, 2, 32, viaTooBig, 1)
				f.produce(t, cpu, 3, 48, viaInner, 1)
			}
			c.consume(t, r)
			// A full ring: 40 records of 200 bytes into one page, not read
			// (40 fill a 4 KiB page; a larger page, as many more).
			for _, cpu := range f.cpus {
				f.produce(t, cpu, 40*uint64(bpftest.Scale()), 200, viaOutput, 1)
			}
			c.consume(t, r)
			// A perf ring reports its lost samples once a later one fits.
			for _, cpu := range f.cpus {
				f.produce(t, cpu, 1, 48, viaOutput, 1)
			}
			c.consume(t, r)
			for _, cpu := range f.cpus {
				f.produce(t, cpu, 3, 48, viaOutput, 1) // left at Close
			}
			if err := r.Close(); err != nil {
				t.Fatal(err)
			}
			ledger.Check(t, f.kind == bpfbuffer.RingBuf, f.cpus, f.outcomes(t), c.got, r.Stats())
		})
	}
}

// checkMaps checks what the object became: the map's type and size, and
// whether the scratch map was created.
func checkMaps(t *testing.T, f *fixture) {
	t.Helper()
	scratch := bpftest.Map(t, f.mod, "events_scratch")
	switch f.kind {
	case bpfbuffer.RingBuf:
		if typ, n := f.events.Type(), f.events.MaxEntries(); typ != libbpfgo.MapTypeRingbuf || int(n) != bpftest.Page {
			t.Errorf("events: %v of %d bytes, want a ring buffer of %d (RingBytes: a page)", typ, n, bpftest.Page)
		}
		// libbpf holds a placeholder descriptor for a map it did not
		// create: not a BPF map.
		if _, err := libbpfgo.GetMapInfoByFD(scratch.FileDescriptor()); err == nil {
			t.Errorf("events_scratch created for a ring buffer")
		}
	case bpfbuffer.PerfEventArray:
		possible, err := cpus.Possible()
		if err != nil {
			t.Fatal(err)
		}
		if typ, n := f.events.Type(), f.events.MaxEntries(); typ != libbpfgo.MapTypePerfEventArray || int(n) != possible[len(possible)-1]+1 {
			t.Errorf("events: %v of %d entries, want a perf event array of %d", typ, n, possible[len(possible)-1]+1)
		}
		if _, err := libbpfgo.GetMapInfoByFD(scratch.FileDescriptor()); err != nil {
			t.Errorf("events_scratch not created for a perf event array: %v", err)
		}
	}
}

// The BPF side's wakeup watermark (Options.WakeupBytes, set at load): a
// ring buffer's reader is woken for the first record after it caught up
// (the kernel's rule, with the default flags), and, with a watermark, for
// every record committed at or above it (BPF_RB_FORCE_WAKEUP); without
// one, for no other. The wakeups are seen as edges of an edge-triggered
// epoll on the map; nothing reads the ring, so it never catches up.
func TestWakeupWatermark(t *testing.T) {
	for _, tc := range []struct {
		name  string
		how   uint64
		size  uint64
		rec   int // the ring's bytes per record: 8-byte header, rounded up to 8
		mark  int
		wakes []bool
	}{
		{"output, libbpf's default", viaOutput, 48, 56, 0, []bool{true, false, false, false}},
		{"output, watermark of 3 records", viaOutput, 48, 56, 3 * 56, []bool{true, false, true, true}},
		{"reserve, libbpf's default", viaReserve, 32, 40, 0, []bool{true, false, false, false}},
		{"reserve, watermark of 3 records", viaReserve, 32, 40, 3 * 40, []bool{true, false, true, true}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			opts := perfbuf.Options{WakeupBytes: tc.mark}
			f := setup(t, bpfbuffer.RingBuf, &opts)
			// The size is settled at load; the watermark stays, for the
			// Reader, which holds its wakeups back (Options.WakeupBytes).
			if opts.WakeupBytes != tc.mark || opts.RingBytes != 0 {
				t.Fatalf("Options after Prepare %+v: want RingBytes cleared, WakeupBytes %d kept", opts, tc.mark)
			}
			ep, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
			if err != nil {
				t.Fatal(err)
			}
			defer unix.Close(ep)
			fd := f.events.FileDescriptor()
			ev := unix.EpollEvent{Events: unix.EPOLLIN | unix.EPOLLET, Fd: int32(fd)}
			if err := unix.EpollCtl(ep, unix.EPOLL_CTL_ADD, fd, &ev); err != nil {
				t.Fatal(err)
			}
			for i, want := range tc.wakes {
				f.produce(t, f.cpus[0], 1, tc.size, tc.how, 1)
				// The kernel wakes from an irq_work, run at once on the
				// CPU the record was written on; a wakeup that is not
				// seen within the wait did not happen.
				wait := 100
				if want {
					wait = 2000
				}
				evs := make([]unix.EpollEvent, 1)
				n, err := unix.EpollWait(ep, evs, wait)
				for errors.Is(err, unix.EINTR) {
					n, err = unix.EpollWait(ep, evs, wait)
				}
				if err != nil {
					t.Fatal(err)
				}
				if got := n == 1; got != want {
					t.Errorf("record %d (%d bytes unread): woken %v, want %v", i+1, (i+1)*tc.rec, got, want)
				}
			}
		})
	}
}

// Prepare refuses what it cannot do the same way for both kinds, a map
// that PERFBUF_BUFFER did not declare, and an object already loaded; it
// leaves a perf event array's ring settings for NewReader.
func TestPrepareErrors(t *testing.T) {
	m := open(t)
	for name, c := range map[string]struct {
		mapName string
		want    bpfbuffer.Kind
		opts    perfbuf.Options
		err     error
	}{
		"no such kind":                   {"events", bpfbuffer.Kind(7), perfbuf.Options{}, os.ErrInvalid},
		"WakeupEvents":                   {"events", bpfbuffer.Any, perfbuf.Options{WakeupEvents: 4}, os.ErrInvalid},
		"negative RingBytes":             {"events", bpfbuffer.Any, perfbuf.Options{RingBytes: -1}, os.ErrInvalid},
		"huge RingBytes":                 {"events", bpfbuffer.RingBuf, perfbuf.Options{RingBytes: 1 << 40}, os.ErrInvalid},
		"watermark at size":              {"events", bpfbuffer.RingBuf, perfbuf.Options{RingBytes: bpftest.RingBytes(2), WakeupBytes: bpftest.RingBytes(2)}, os.ErrInvalid},
		"watermark at the declared size": {"events", bpfbuffer.RingBuf, perfbuf.Options{WakeupBytes: ringSize}, os.ErrInvalid},
		"no such map":                    {"nope", bpfbuffer.Any, perfbuf.Options{}, nil},
		"not a PERFBUF_BUFFER":           {"outcomes", bpfbuffer.Any, perfbuf.Options{}, nil},
	} {
		opts := c.opts
		kind, err := bpfbuffer.Prepare(m, c.mapName, c.want, &opts)
		if err == nil || c.err != nil && !errors.Is(err, c.err) || kind != 0 {
			t.Errorf("%s: Prepare = %v, %v; want an error matching %v", name, kind, err, c.err)
		}
		t.Logf("%s: %v", name, err)
	}
	opts := perfbuf.Options{RingBytes: bpftest.RingBytes(2), WakeupBytes: 1024}
	if kind, err := bpfbuffer.Prepare(m, "events", bpfbuffer.PerfEventArray, &opts); kind != bpfbuffer.PerfEventArray || err != nil {
		t.Fatalf("Prepare = %v, %v", kind, err)
	}
	if opts.RingBytes != bpftest.RingBytes(2) || opts.WakeupBytes != 1024 {
		t.Errorf("Options after Prepare as a perf event array %+v: want RingBytes and WakeupBytes kept for NewReader", opts)
	}
	if err := m.BPFLoadObject(); err != nil {
		t.Fatal(err)
	}
	if _, err := bpfbuffer.Prepare(m, "events", bpfbuffer.Any, nil); err == nil {
		t.Error("Prepare after load succeeded")
	}
	if s := fmt.Sprint(bpfbuffer.Any, bpfbuffer.RingBuf, bpfbuffer.PerfEventArray); s != "any ringbuf perf_event_array" {
		t.Errorf("kinds print as %q", s)
	}
}

// Prepare called wrongly says what to do, and changes nothing: with no
// module, for a buffer prepared already into another object (a ring
// buffer after a perf event array: the map would keep 4-byte keys, and the
// load fail with EINVAL), or once the object is loaded. Prepared again the
// same way, it does nothing more, and the object loads as prepared.
func TestPrepareMisuse(t *testing.T) {
	bpftest.RequirePrivileges(t)
	if kind, err := bpfbuffer.Prepare(nil, "events", bpfbuffer.Any, nil); kind != 0 || !errors.Is(err, os.ErrInvalid) {
		t.Errorf("Prepare(nil) = %v, %v; want os.ErrInvalid", kind, err)
	} else {
		t.Logf("nil module: %v", err)
	}

	m := open(t)
	opts := perfbuf.Options{RingBytes: bpftest.RingBytes(2), WakeupBytes: 1024}
	for i := range 2 { // the same, twice
		o := opts
		if kind, err := bpfbuffer.Prepare(m, "events", bpfbuffer.RingBuf, &o); kind != bpfbuffer.RingBuf || err != nil || o.RingBytes != 0 || o.WakeupBytes != 1024 {
			t.Fatalf("Prepare #%d = %v, %v, Options %+v; want ringbuf, RingBytes cleared", i+1, kind, err, o)
		}
	}
	for name, c := range map[string]struct {
		want bpfbuffer.Kind
		opts perfbuf.Options
	}{
		"another kind":      {bpfbuffer.PerfEventArray, perfbuf.Options{RingBytes: bpftest.RingBytes(2), WakeupBytes: 1024}},
		"another size":      {bpfbuffer.RingBuf, perfbuf.Options{RingBytes: bpftest.RingBytes(4), WakeupBytes: 1024}},
		"another watermark": {bpfbuffer.Any, perfbuf.Options{RingBytes: bpftest.RingBytes(2)}},
	} {
		o := c.opts
		kind, err := bpfbuffer.Prepare(m, "events", c.want, &o)
		if kind != 0 || !errors.Is(err, bpfbuffer.ErrPrepared) || o.RingBytes != c.opts.RingBytes {
			t.Errorf("%s: Prepare = %v, %v, Options %+v; want ErrPrepared, Options unchanged", name, kind, err, o)
		}
		t.Logf("%s: %v", name, err)
	}
	// The same as the first: RingBytes 0 keeps the size the map has.
	o := perfbuf.Options{WakeupBytes: 1024}
	if kind, err := bpfbuffer.Prepare(m, "events", bpfbuffer.RingBuf, &o); kind != bpfbuffer.RingBuf || err != nil {
		t.Errorf("Prepare the same way a third time = %v, %v", kind, err)
	}
	if err := m.BPFLoadObject(); err != nil {
		t.Fatalf("load after Prepare thrice: %v", err)
	}
	events := bpftest.Map(t, m, "events")
	if typ, n := events.Type(), events.MaxEntries(); typ != libbpfgo.MapTypeRingbuf || int(n) != bpftest.RingBytes(2) {
		t.Errorf("events: %v of %d bytes, want a ring buffer of %d (2 pages)", typ, n, bpftest.RingBytes(2))
	}
	for _, want := range []bpfbuffer.Kind{bpfbuffer.Any, bpfbuffer.RingBuf, bpfbuffer.PerfEventArray} {
		o := opts
		kind, err := bpfbuffer.Prepare(m, "events", want, &o)
		if kind != 0 || !errors.Is(err, bpfbuffer.ErrLoaded) || !strings.Contains(err.Error(), "before BPFLoadObject") || o.RingBytes != opts.RingBytes {
			t.Errorf("Prepare %v after load = %v, %v; want ErrLoaded, saying to call it before BPFLoadObject", want, kind, err)
		}
		t.Logf("after load, %v: %v", want, err)
	}
}

// A load that failed leaves no map descriptor, but the object is loaded
// for libbpf, which refuses every change with EBUSY: Prepare says so as
// ErrLoaded, with libbpf's errno kept.
func TestPrepareAfterFailedLoad(t *testing.T) {
	m := open(t)
	// A perf event array under a program compiled for a ring buffer
	// (events_config left as compiled): the verifier refuses it.
	events := bpftest.Map(t, m, "events")
	for _, err := range []error{events.SetType(libbpfgo.MapTypePerfEventArray), events.SetKeySize(4), events.SetValueSize(4), events.SetMaxEntries(1)} {
		if err != nil {
			t.Fatal(err)
		}
	}
	if err := m.BPFLoadObject(); err == nil {
		t.Fatal("the load succeeded")
	}
	kind, err := bpfbuffer.Prepare(m, "events", bpfbuffer.Any, nil)
	if kind != 0 || !errors.Is(err, bpfbuffer.ErrLoaded) || !errors.Is(err, syscall.EBUSY) || !strings.Contains(err.Error(), "before BPFLoadObject") {
		t.Errorf("Prepare after a failed load = %v, %v; want ErrLoaded and EBUSY, saying to call it before BPFLoadObject", kind, err)
	}
	t.Logf("after a failed load: %v", err)
}

// What Prepare remembers is per module: the same buffer of two modules
// may be prepared each its own way.
func TestPrepareModules(t *testing.T) {
	a, b := open(t), open(t)
	if _, err := bpfbuffer.Prepare(a, "events", bpfbuffer.RingBuf, nil); err != nil {
		t.Fatal(err)
	}
	if kind, err := bpfbuffer.Prepare(b, "events", bpfbuffer.PerfEventArray, nil); kind != bpfbuffer.PerfEventArray || err != nil {
		t.Fatalf("another module's buffer: %v, %v", kind, err)
	}
	for _, m := range []*libbpfgo.Module{a, b} {
		if err := m.BPFLoadObject(); err != nil {
			t.Fatal(err)
		}
	}
}

// NewReader checks every option against the map before it claims or maps
// a ring or writes the failure map: with the buffer read by another
// Reader, a bad option is reported as itself, naming the field and the
// kind of map, not as ErrMapInUse; and a Reader refused, for an option or
// for the map in use, leaves the failure map's reader key as it was
// (closed: the program's outputs fail as noent).
func TestReaderOptionsFirst(t *testing.T) {
	for _, tc := range []struct {
		want  bpfbuffer.Kind
		what  string
		cases map[string]struct {
			opts  perfbuf.ReaderOptions
			err   error
			field string
		}
	}{
		{bpfbuffer.RingBuf, `ring buffer "events"`, map[string]struct {
			opts  perfbuf.ReaderOptions
			err   error
			field string
		}{
			"WakeupBytes":   {perfbuf.ReaderOptions{Options: perfbuf.Options{WakeupBytes: ringSize}}, os.ErrInvalid, "WakeupBytes"},
			"MaxSampleSize": {perfbuf.ReaderOptions{Options: perfbuf.Options{MaxSampleSize: ringSize - 15}}, perfbuf.ErrSampleTooLarge, "MaxSampleSize"},
			"RingBytes":     {perfbuf.ReaderOptions{Options: perfbuf.Options{RingBytes: 4096}}, os.ErrInvalid, "RingBytes"},
			"WakeupEvents":  {perfbuf.ReaderOptions{Options: perfbuf.Options{WakeupEvents: 2}}, os.ErrInvalid, "WakeupEvents"},
		}},
		{bpfbuffer.PerfEventArray, `perf event array "events"`, map[string]struct {
			opts  perfbuf.ReaderOptions
			err   error
			field string
		}{
			"WakeupBytes":   {perfbuf.ReaderOptions{Options: perfbuf.Options{RingBytes: bpftest.Page, WakeupBytes: bpftest.Page}}, os.ErrInvalid, "WakeupBytes"},
			"MaxSampleSize": {perfbuf.ReaderOptions{Options: perfbuf.Options{RingBytes: bpftest.Page, MaxSampleSize: bpftest.Page}}, perfbuf.ErrSampleTooLarge, "MaxSampleSize"},
		}},
	} {
		t.Run(tc.want.String(), func(t *testing.T) {
			opts := perfbuf.Options{}
			f := setup(t, tc.want, &opts)
			opts.FailureMap = f.failures
			r, err := perfbuf.NewReader(f.events, perfbuf.ReaderOptions{Options: opts})
			if err != nil {
				t.Fatal(err)
			}
			for name, c := range tc.cases {
				r2, err := perfbuf.NewReader(f.events, c.opts)
				if err == nil {
					r2.Close()
				}
				if !errors.Is(err, c.err) || errors.Is(err, perfbuf.ErrMapInUse) ||
					!strings.Contains(err.Error(), "options "+c.field) || !strings.Contains(err.Error(), tc.what) {
					t.Errorf("%s, the map read by another Reader: %v; want %v, naming %s and %s", name, err, c.err, c.field, tc.what)
				}
				t.Logf("%s: %v", name, err)
			}
			r.Close()
			if tc.want != bpfbuffer.RingBuf {
				return // a perf event array's outputs fail without a reader anyway
			}
			// Closed, the Reader marked the failure map's reader key:
			// outputs fail as noent, and go on failing while a Reader
			// is refused.
			noent := func() uint64 {
				var n uint64
				for _, o := range f.outcomes(t) {
					n += o.NoEnt
				}
				return n
			}
			for name, c := range tc.cases {
				c.opts.FailureMap = f.failures
				if r2, err := perfbuf.NewReader(f.events, c.opts); err == nil {
					r2.Close()
					t.Fatalf("%s: NewReader succeeded", name)
				}
				before := noent()
				f.produce(t, f.cpus[0], 1, 48, viaOutput, 1)
				if got := noent() - before; got != 1 {
					t.Errorf("%s: NewReader refused, then an output: %d failed as noent, want 1 (the reader key opened)", name, got)
				}
			}
			// Refused past the options (the map in use by a Reader
			// without the failure map), the same.
			other, err := perfbuf.NewReader(f.events, perfbuf.ReaderOptions{})
			if err != nil {
				t.Fatal(err)
			}
			defer other.Close()
			if r2, err := perfbuf.NewReader(f.events, perfbuf.ReaderOptions{Options: opts}); !errors.Is(err, perfbuf.ErrMapInUse) {
				if err == nil {
					r2.Close()
				}
				t.Fatalf("NewReader of a map in use: %v", err)
			}
			before := noent()
			f.produce(t, f.cpus[0], 1, 48, viaOutput, 1)
			if got := noent() - before; got != 1 {
				t.Errorf("NewReader refused as ErrMapInUse, then an output: %d failed as noent, want 1 (the reader key opened)", got)
			}
		})
	}
}

// The errors over either kind name it and the map: a ring buffer's never
// say "perf"; the sentinels match as ever.
func TestErrorsNameTheKind(t *testing.T) {
	for _, tc := range []struct {
		want bpfbuffer.Kind
		what string
	}{
		{bpfbuffer.RingBuf, `ring buffer "events"`},
		{bpfbuffer.PerfEventArray, `perf event array "events"`},
	} {
		t.Run(tc.want.String(), func(t *testing.T) {
			opts := perfbuf.Options{}
			f := setup(t, tc.want, &opts)
			check := func(call string, err, is error, want string) {
				t.Helper()
				if !errors.Is(err, is) || !strings.Contains(err.Error(), want) {
					t.Errorf("%s: %v; want %v, saying %q", call, err, is, want)
				}
				if tc.want == bpfbuffer.RingBuf && strings.Contains(err.Error(), "perf") {
					t.Errorf("%s over a ring buffer: %q names a perf kind", call, err)
				}
				t.Logf("%s: %v", call, err)
			}
			r, err := perfbuf.NewReader(f.events, perfbuf.ReaderOptions{Options: opts})
			if err != nil {
				t.Fatal(err)
			}
			_, err = perfbuf.NewReader(f.events, perfbuf.ReaderOptions{Options: opts})
			check("a second NewReader", err, perfbuf.ErrMapInUse, tc.what+" (id ")
			check("a second NewReader", err, perfbuf.ErrMapInUse, ": map read by another reader")
			_, err = perfbuf.NewRaw(f.events, perfbuf.Options{})
			check("New beside a Reader", err, perfbuf.ErrMapInUse, tc.what+" (id ")
			var s perfbuf.Sample
			r.Flush()
			check("ReadInto after Flush", r.ReadInto(&s), perfbuf.ErrFlushed, "read "+tc.what+": reader flushed")
			r.Close()
			check("ReadInto after Close", r.ReadInto(&s), os.ErrClosed, "read "+tc.what+": ")
			_, err = r.Consume(func(*perfbuf.Record) error { return nil })
			check("Consume after Close", err, os.ErrClosed, "consume "+tc.what+": ")

			sample := func(int, []byte) {}
			_, err = perfbuf.New(f.events, sample, nil, perfbuf.Options{MaxSampleSize: 1 << 20})
			check("New with MaxSampleSize too large", err, perfbuf.ErrSampleTooLarge, tc.what)
			pb, err := perfbuf.New(f.events, sample, nil, perfbuf.Options{})
			if err != nil {
				t.Fatal(err)
			}
			pb.Close()
			_, err = pb.Poll(0)
			check("Poll after Close", err, os.ErrClosed, "poll "+tc.what+": ")
			raw, err := perfbuf.NewRaw(f.events, perfbuf.Options{})
			if err != nil {
				t.Fatal(err)
			}
			raw.Close()
			_, err = raw.Wait(0, nil)
			check("Wait after Close", err, os.ErrClosed, "wait "+tc.what+": ")
		})
	}
}

// A program started without Prepare is the ring buffer it was compiled as.
func TestWithoutPrepare(t *testing.T) {
	m := open(t)
	if err := m.BPFLoadObject(); err != nil {
		t.Fatal(err)
	}
	events := bpftest.Map(t, m, "events")
	if typ, n := events.Type(), events.MaxEntries(); typ != libbpfgo.MapTypeRingbuf || n != ringSize {
		t.Fatalf("events: %v of %d bytes, want the ring buffer of %d compiled", typ, n, ringSize)
	}
	r, err := perfbuf.NewReader(events, perfbuf.ReaderOptions{Options: perfbuf.Options{FailureMap: bpftest.Map(t, m, "events_failures")}})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	online, err := cpus.Online()
	if err != nil {
		t.Fatal(err)
	}
	bpftest.Run(t, bpftest.Prog(t, m, "produce"), online[0], 2, 48, viaOutput, 1)
	var s perfbuf.Sample
	done := make(chan error, 1)
	go func() {
		for range 2 {
			if err := r.ReadInto(&s); err != nil {
				done <- err
				return
			}
		}
		done <- nil
	}()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("two records not read within 5 s")
	}
}

// Close during production leaves no record of a ring buffer out of the
// count, as for perf event arrays: Close marks the reader closed in the
// failure map, which PERFBUF_BUFFER's outputs check, waits for an RCU grace
// period, and then counts what is left; outputs after that fail in the
// program (noent). Every record that got into the rings is delivered,
// discarded or left, exactly; a reader that opens again finds what the last
// one left, ring by ring (Stats.Found), delivers it and is written to. A
// shared ring buffer, and a ring per CPU (the rings that bpfbuffer.Maps
// hands over, every CPU's producer on its own ring).
func TestRingBufCloseLedger(t *testing.T) {
	for _, tc := range []struct {
		name string
		kind bpfbuffer.Kind
		more []bpfbuffer.Option
	}{
		{"ring buffer", bpfbuffer.RingBuf, nil},
		{"ring per CPU", bpfbuffer.RingBufPerCPU, []bpfbuffer.Option{bpfbuffer.CPUsPerRing(1)}},
	} {
		t.Run(tc.name, func(t *testing.T) { testRingBufCloseLedger(t, tc.kind, tc.more) })
	}
}

func testRingBufCloseLedger(t *testing.T, kind bpfbuffer.Kind, more []bpfbuffer.Option) {
	opts := perfbuf.Options{}
	if kind == bpfbuffer.RingBufPerCPU {
		opts.RingBytes = bpftest.RingBytes(16)
	}
	f := setup(t, kind, &opts, more...)
	if f.kind != kind {
		t.Fatalf("the buffer became a %v", f.kind)
	}
	m, opts, err := bpfbuffer.Maps(f.mod, "events", opts)
	if err != nil {
		t.Fatal(err)
	}
	// leftByRing returns each ring's Left in stats.
	leftByRing := func(stats perfbuf.Stats) map[int]uint64 {
		left := map[int]uint64{}
		for i, e := range stats.Rings {
			left[i] = e.Left
		}
		return left
	}
	// checkFound checks that each ring of stats found what the last reader
	// left in it (no discards here).
	checkFound := func(it int, stats perfbuf.Stats, carried map[int]uint64) {
		t.Helper()
		for i, e := range stats.Rings {
			if e.Found != carried[i] {
				t.Errorf("iteration %d: ring %d found %d, the last reader left %d", it, i, e.Found, carried[i])
			}
		}
	}
	carried := map[int]uint64{} // left by the previous reader, per ring: the next one reads it first
	var carriedAll uint64
	for it, delay := range []time.Duration{0, time.Millisecond, 3 * time.Millisecond, 8 * time.Millisecond} {
		before := f.outcomes(t)
		r, err := perfbuf.NewReader(m, perfbuf.ReaderOptions{Options: opts})
		if err != nil {
			t.Fatal(err)
		}
		checkFound(it, r.Stats(), carried)
		stop := make(chan struct{})
		var producers sync.WaitGroup
		for _, cpu := range f.cpus {
			producers.Add(1)
			go func() {
				defer producers.Done()
				for {
					select {
					case <-stop:
						return
					default:
					}
					if _, err := bpfrun.Run(f.prog, cpu, batch, 48, viaOutput, 1); err != nil {
						t.Error(err)
						return
					}
				}
			}()
		}
		readDone := make(chan error, 1)
		go func() {
			var s perfbuf.Sample
			for {
				if err := r.ReadInto(&s); err != nil {
					readDone <- err
					return
				}
			}
		}()
		time.Sleep(delay)
		r.Close()
		if err := <-readDone; !errors.Is(err, os.ErrClosed) {
			t.Errorf("read ended with %v", err)
		}
		// Outputs after Close: the producers' for a while, and one made
		// here, so that there is one however the producers were
		// scheduled (a loaded host ran none in 2 ms).
		time.Sleep(2 * time.Millisecond)
		f.produce(t, f.cpus[0], 1, 48, viaOutput, 1)
		close(stop)
		producers.Wait()
		after := f.outcomes(t)
		var ok, noent uint64
		for _, cpu := range f.cpus {
			d := after[cpu]
			ok += d.OK - before[cpu].OK
			noent += d.NoEnt - before[cpu].NoEnt
		}
		stats := r.Stats()
		checkFound(it, stats, carried)
		st, left := stats, leftByRing(stats)
		t.Logf("Close after %v: %d output into the rings + %d left before (found %d) = delivered %d + discarded %d + left %d; %d refused after Close (noent)",
			delay, ok, carriedAll, st.Found, st.Samples, st.Discarded, st.Left, noent)
		if st.Samples+st.Discarded+st.Left != ok+carriedAll || st.Found != carriedAll {
			t.Errorf("iteration %d: delivered %d + discarded %d + left %d != %d output into the rings + %d left before (found %d)", it, st.Samples, st.Discarded, st.Left, ok, carriedAll, st.Found)
		}
		carried, carriedAll = left, st.Left
		if noent == 0 {
			t.Errorf("iteration %d: no output refused after Close: the program did not see the reader gone", it)
		}
	}
	r, err := perfbuf.NewReader(m, perfbuf.ReaderOptions{Options: opts})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	checkFound(4, r.Stats(), carried)
	if n, err := r.Consume(func(*perfbuf.Record) error { return nil }); uint64(n) != carriedAll || err != nil {
		t.Errorf("a reader opened again: Consume = %d, %v; want the %d left", n, err, carriedAll)
	}
	f.produce(t, f.cpus[0], 3, 48, viaOutput, 1)
	if n, err := r.Consume(func(*perfbuf.Record) error { return nil }); n != 3 || err != nil {
		t.Errorf("a reader opened again: Consume = %d, %v; want 3 new records (written: the reader is open again)", n, err)
	}
}
