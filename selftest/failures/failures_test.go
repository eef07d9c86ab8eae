// SPDX-License-Identifier: Apache-2.0

// Privileged selftests of the failure counters (bpf/perfbuf.bpf.h,
// Options.FailureMap): failures.bpf.c outputs through perfbuf_output on a
// chosen CPU with BPF_PROG_TEST_RUN, and makes each cause happen on every
// CPU; the readers' Stats must account for every attempt, per CPU and per
// cause.
package failures

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"github.com/aquasecurity/libbpfgo"
	"github.com/perfbuf/perfbuf"
	"github.com/perfbuf/perfbuf/internal/bpfrun"
	"github.com/perfbuf/perfbuf/internal/cpus"
	"github.com/perfbuf/perfbuf/internal/kernel"
	"github.com/perfbuf/perfbuf/internal/owner"
	"github.com/perfbuf/perfbuf/selftest/internal/bpftest"
	"golang.org/x/sys/unix"
)

const obj = "bpf/failures.bpf.o"

// bpf_perf_event_output's flags (include/uapi/linux/bpf.h).
const (
	currentCPU = 0xffffffff // BPF_F_CURRENT_CPU
	badFlag    = 1 << 32    // outside BPF_F_INDEX_MASK: the helper's EINVAL
)

// fixture is failures.bpf.c, loaded.
type fixture struct {
	mod      *libbpfgo.Module
	events   *libbpfgo.BPFMap // a slot per possible CPU
	events1  *libbpfgo.BPFMap // one slot: CPU 0's
	failures *libbpfgo.BPFMap // PERFBUF_FAILURE_MAP
	prog     int
	cpus     []int // online: each has a ring in events
}

func setup(t *testing.T) *fixture {
	t.Helper()
	m := bpftest.Load(t, obj)
	online, err := cpus.Online()
	if err != nil {
		t.Fatal(err)
	}
	return &fixture{
		mod:      m,
		events:   bpftest.Map(t, m, "events"),
		events1:  bpftest.Map(t, m, "events1"),
		failures: bpftest.Map(t, m, "failures"),
		prog:     bpftest.Prog(t, m, "output"),
		cpus:     online,
	}
}

// outputBatch is OUTPUT_BATCH of failures.bpf.c.
const outputBatch = 64

// output makes count outputs of size bytes with flags on cpu, to events
// (map 0) or events1 (map 1).
func (f *fixture) output(t *testing.T, cpu int, count, size, flags, mapIdx uint64) {
	t.Helper()
	for done := uint64(0); done < count; done += outputBatch {
		bpftest.Run(t, f.prog, cpu, min(count-done, outputBatch), size, flags, mapIdx)
	}
}

// outcome mirrors struct outcome: what the program saw on one CPU.
type outcome struct {
	Attempts, OK, NoSpace, NoEntry, TooBig, Invalid, NotOnCPU, Other uint64
}

// failed is o's failures as perfbuf counts them.
func (o outcome) failed() perfbuf.Failures {
	return perfbuf.Failures{NoEntry: o.NoEntry, TooBig: o.TooBig, Invalid: o.Invalid, NotOnCPU: o.NotOnCPU, Other: o.Other}
}

// outcomes reads the program's own per-CPU counts, indexed by CPU.
func (f *fixture) outcomes(t *testing.T) map[int]outcome {
	t.Helper()
	return bpftest.PerCPU[outcome](t, f.mod, "outcomes")
}

// collector counts what a reader delivered per CPU and checks each sample:
// its CPU, its size, its sequence number (increasing).
type collector struct {
	t       *testing.T
	samples map[int]uint64
	lost    map[int]uint64
	lastSeq map[int]uint64
}

func newCollector(t *testing.T) *collector {
	return &collector{t: t, samples: map[int]uint64{}, lost: map[int]uint64{}, lastSeq: map[int]uint64{}}
}

func (c *collector) sample(cpu int, data []byte) {
	if len(data) < 16 {
		c.t.Errorf("cpu %d: %d-byte sample", cpu, len(data))
		return
	}
	seq := binary.NativeEndian.Uint64(data)
	from := int(binary.NativeEndian.Uint32(data[8:]))
	size := int(binary.NativeEndian.Uint32(data[12:]))
	if from != cpu || len(data) != (size+4+7)&^7-4 {
		c.t.Errorf("cpu %d: sample seq %d says cpu %d, %d bytes; delivered %d bytes", cpu, seq, from, size, len(data))
	}
	if c.samples[cpu] > 0 && seq <= c.lastSeq[cpu] {
		c.t.Errorf("cpu %d: seq %d after %d", cpu, seq, c.lastSeq[cpu])
	}
	c.lastSeq[cpu] = seq
	c.samples[cpu]++
}

func (c *collector) lostFn(cpu int, n uint64) { c.lost[cpu] += n }

// mode is a reader under test: it drains what the rings hold into a
// collector, and has Stats and Close.
type mode struct {
	drain func(t *testing.T)
	stats func() perfbuf.Stats
	close func()
}

// callbackMode opens a PerfBuffer on events with the failure map.
func callbackMode(t *testing.T, events perfbuf.Map, opts perfbuf.Options, c *collector) mode {
	t.Helper()
	pb, err := perfbuf.New(events, c.sample, c.lostFn, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pb.Close() })
	return mode{
		drain: func(t *testing.T) {
			t.Helper()
			if _, err := pb.Consume(); err != nil {
				t.Fatal(err)
			}
		},
		stats: pb.Stats,
		close: func() { pb.Close() },
	}
}

// readerMode opens a Reader on events with the failure map.
func readerMode(t *testing.T, events perfbuf.Map, opts perfbuf.Options, c *collector) mode {
	t.Helper()
	r, err := perfbuf.NewReader(events, perfbuf.ReaderOptions{Options: perfbuf.Options{RingBytes: opts.RingBytes, FailureMap: opts.FailureMap}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	return mode{
		drain: func(t *testing.T) {
			t.Helper()
			r.SetDeadline(time.Now().Add(10 * time.Second))
			r.Flush()
			var s perfbuf.Sample
			for {
				err := r.ReadInto(&s)
				if errors.Is(err, perfbuf.ErrFlushed) {
					return
				}
				if err != nil {
					t.Fatal(err)
				}
				if s.Type == perfbuf.RecordLost {
					c.lostFn(s.CPU, s.Lost)
				} else {
					c.sample(s.CPU, s.Data)
				}
			}
		},
		stats: r.Stats,
		close: func() { r.Close() },
	}
}

var modes = []struct {
	name string
	open func(*testing.T, perfbuf.Map, perfbuf.Options, *collector) mode
}{
	{"callback", callbackMode},
	{"reader", readerMode},
}

// Per CPU and per cause, every output is accounted for: received +
// lost + failed == attempted, exactly, with the program's own counts of
// what the helper returned, and each cause made to happen on every CPU:
//
//	ok          10 outputs of 64 bytes, and one after the ring filled
//	ENOSPC      40 of 200 bytes a 4 KiB page (bpftest.Scale) into a one-page ring without draining it
//	EINVAL       5 with a flag bit outside the index mask
//	E2BIG        6 with the index max_entries
//	EOPNOTSUPP   7 with the index of another online CPU (2+ CPUs)
//	ENOENT       8 after the CPU's slot was deleted from the map
func TestFailureAccounting(t *testing.T) {
	for _, m := range modes {
		t.Run(m.name, func(t *testing.T) {
			f := setup(t)
			c := newCollector(t)
			rd := m.open(t, f.events, perfbuf.Options{RingBytes: 1 << 12, FailureMap: f.failures}, c)
			maxEntries := uint64(f.events.MaxEntries())
			if maxEntries == 0 {
				t.Fatal("events has max_entries 0 after load")
			}

			want := map[int]outcome{}
			for _, cpu := range f.cpus {
				f.output(t, cpu, 10, 64, currentCPU, 0)
			}
			rd.drain(t)
			// 18 of 200 bytes fit in a 4 KiB page: 40 a 4 KiB page
			// overflow it, and each larger page takes as many more.
			fill := uint64(40 * bpftest.Scale())
			for _, cpu := range f.cpus {
				f.output(t, cpu, fill, 200, currentCPU, 0)
			}
			rd.drain(t)
			for _, cpu := range f.cpus {
				f.output(t, cpu, 1, 64, currentCPU, 0) // brings the lost record
				f.output(t, cpu, 5, 64, currentCPU|badFlag, 0)
				f.output(t, cpu, 6, 64, maxEntries, 0)
				w := outcome{Attempts: 30 + fill, Invalid: 5, TooBig: 6, NoEntry: 8}
				if len(f.cpus) > 1 {
					other := f.cpus[0]
					if other == cpu {
						other = f.cpus[1]
					}
					f.output(t, cpu, 7, 64, uint64(other), 0)
					w.Attempts += 7
					w.NotOnCPU = 7
				}
				want[cpu] = w
			}
			if len(f.cpus) < 2 {
				t.Logf("one online cpu: no other CPU's slot for EOPNOTSUPP")
			}
			rd.drain(t)
			for _, cpu := range f.cpus {
				key := uint32(cpu)
				if err := f.events.DeleteKey(unsafe.Pointer(&key)); err != nil {
					t.Fatalf("delete cpu %d's slot: %v", cpu, err)
				}
				f.output(t, cpu, 8, 64, currentCPU, 0)
			}
			rd.drain(t)

			live := rd.stats()
			got := f.outcomes(t)
			check(t, f.cpus, got, want, c, live)
			rd.close()
			if after := rd.stats(); !reflect.DeepEqual(failedByCPU(after), failedByCPU(live)) || after.Failed != live.Failed {
				t.Errorf("Failed after Close %v (sums %+v), before %v (sums %+v)", failedByCPU(after), after.Failed, failedByCPU(live), live.Failed)
			}
		})
	}
}

// check compares, per CPU, what the program saw (got), what the test made
// happen (want: the failures exactly; the ok and ENOSPC split depends on
// the ring, so only their sum), what the reader delivered (c), and its
// Stats, each CPU's ring and the sums; and logs the accounting.
func check(t *testing.T, online []int, got, want map[int]outcome, c *collector, stats perfbuf.Stats) {
	t.Helper()
	byCPU := map[int]perfbuf.Stats{}
	for _, s := range stats.Rings {
		if _, dup := byCPU[s.CPU]; dup {
			t.Errorf("two rings for cpu %d", s.CPU)
		}
		byCPU[s.CPU] = s
	}
	for cpu, o := range got {
		if _, ok := want[cpu]; !ok && o != (outcome{}) {
			t.Errorf("cpu %d (not online) has outcomes %+v", cpu, o)
		}
	}
	var attempts uint64
	var failedAll perfbuf.Failures
	for _, cpu := range online {
		o, w, s := got[cpu], want[cpu], byCPU[cpu]
		failed := o.failed()
		attempts += o.Attempts
		failedAll = perfbuf.Failures{NoEntry: failedAll.NoEntry + failed.NoEntry, TooBig: failedAll.TooBig + failed.TooBig,
			Invalid: failedAll.Invalid + failed.Invalid, NotOnCPU: failedAll.NotOnCPU + failed.NotOnCPU, Other: failedAll.Other + failed.Other}
		t.Logf("cpu %d: attempted %d = received %d + lost %d + failed %d (noent %d, e2big %d, einval %d, opnotsupp %d, other %d)",
			cpu, o.Attempts, s.Samples, s.Lost, s.Failed.Total(),
			s.Failed.NoEntry, s.Failed.TooBig, s.Failed.Invalid, s.Failed.NotOnCPU, s.Failed.Other)
		if o.Attempts != w.Attempts || failed != w.failed() || o.OK+o.NoSpace != w.Attempts-w.failed().Total() {
			t.Errorf("cpu %d: the program saw %+v; the test made %+v", cpu, o, w)
		}
		if o.NoSpace == 0 {
			t.Errorf("cpu %d: no output found the ring full", cpu)
		}
		if s.Failed != failed {
			t.Errorf("cpu %d: Stats.Failed %+v, the program saw %+v", cpu, s.Failed, failed)
		}
		if c.samples[cpu] != o.OK || c.lost[cpu] != o.NoSpace {
			t.Errorf("cpu %d: received %d, lost %d; the program output %d, %d found the ring full", cpu, c.samples[cpu], c.lost[cpu], o.OK, o.NoSpace)
		}
		if s.Samples != c.samples[cpu] || s.Lost != c.lost[cpu] {
			t.Errorf("cpu %d: Stats say %d samples, %d lost; delivered %d, %d", cpu, s.Samples, s.Lost, c.samples[cpu], c.lost[cpu])
		}
		if s.Samples+s.Lost+s.Failed.Total() != o.Attempts {
			t.Errorf("cpu %d: %d received + %d lost + %d failed != %d attempted", cpu, s.Samples, s.Lost, s.Failed.Total(), o.Attempts)
		}
	}
	// The sums: every CPU has a ring, so they are the rings'.
	if stats.Failed != failedAll || stats.Samples+stats.Lost+stats.Failed.Total()+stats.NotRun != attempts {
		t.Errorf("sums %+v: the program attempted %d, failed %+v", stats, attempts, failedAll)
	}
}

// failedByCPU returns the Failed of each ring of st, by its CPU.
func failedByCPU(st perfbuf.Stats) map[int]perfbuf.Failures {
	out := map[int]perfbuf.Failures{}
	for _, s := range st.Rings {
		out[s.CPU] = s.Failed
	}
	return out
}

// The failures of a CPU without a ring are in the Stats' sums, not in a
// ring's entry: events1 has one slot, so only CPU 0 has a ring, and every
// other CPU's outputs fail with E2BIG.
func TestFailuresWithoutRing(t *testing.T) {
	f := setup(t)
	if f.cpus[0] != 0 {
		t.Fatalf("cpu 0 is offline (online: %v): events1's one slot is cpu 0's", f.cpus)
	}
	for _, m := range modes {
		t.Run(m.name, func(t *testing.T) {
			c := newCollector(t)
			rd := m.open(t, f.events1, perfbuf.Options{FailureMap: f.failures}, c)
			base := f.outcomes(t) // the failure map is the fixture's: its counts go on
			for i, cpu := range f.cpus {
				f.output(t, cpu, uint64(3+i), 32, currentCPU, 1)
			}
			rd.drain(t)
			got := f.outcomes(t)
			ring0 := perfbuf.Stats{CPU: 0, Samples: 3, Bytes: 3 * 36} // 32 bytes padded to 36
			want := perfbuf.Stats{CPU: -1, Samples: ring0.Samples, Bytes: ring0.Bytes, Rings: []perfbuf.Stats{ring0}}
			for _, cpu := range f.cpus[1:] {
				want.Failed.TooBig += got[cpu].TooBig
			}
			st := rd.stats()
			rd.close()
			st.Fill, st.MaxFill, st.Size, st.Wakeups = 0, 0, 0, 0 // not this test's
			for i := range st.Rings {
				st.Rings[i].Fill, st.Rings[i].MaxFill, st.Rings[i].Size = 0, 0, 0
			}
			if !reflect.DeepEqual(st, want) {
				t.Errorf("Stats:\n got %+v\nwant %+v", st, want)
			}
			for i, cpu := range f.cpus[1:] {
				if n := got[cpu].TooBig - base[cpu].TooBig; n != uint64(4+i) {
					t.Errorf("cpu %d: %d outputs failed with E2BIG, want %d", cpu, n, 4+i)
				}
				t.Logf("cpu %d (no ring): %d outputs failed with E2BIG; the map's since load: %d",
					cpu, got[cpu].TooBig-base[cpu].TooBig, got[cpu].TooBig)
			}
			if c.samples[0] != 3 || len(c.samples) != 1 {
				t.Errorf("received %v, want 3 samples on cpu 0", c.samples)
			}
		})
	}
}

// New and NewReader refuse a FailureMap that is not a PERFBUF_FAILURE_MAP
// with os.ErrInvalid, and a bad descriptor as they refuse a bad event map,
// before they open anything: no descriptor stays open and the event map is
// not left claimed.
func TestBadFailureMaps(t *testing.T) {
	f := setup(t)
	prog, err := unix.Dup(f.prog)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(prog)
	devNull, err := os.Open(os.DevNull)
	if err != nil {
		t.Fatal(err)
	}
	defer devNull.Close()
	closed, err := unix.Dup(f.failures.FileDescriptor())
	if err != nil {
		t.Fatal(err)
	}
	unix.Close(closed)
	cases := []struct {
		name string
		m    perfbuf.Map
		want error
		msg  string
	}{
		{"hash", bpftest.Map(t, f.mod, "bad_type"), os.ErrInvalid, `failure map "bad_type" has type hash (1)`},
		{"value size", bpftest.Map(t, f.mod, "bad_value"), os.ErrInvalid, `failure map "bad_value" has 8-byte values`},
		{"event map", f.events, os.ErrInvalid, `failure map "events" has type perf_event_array (4)`},
		{"version 0", bpftest.Map(t, f.mod, "old_version"), os.ErrInvalid,
			`failure map "old_version" is of bpf/perfbuf.bpf.h version 0 (max_entries 1); this perfbuf reads version 1 (max_entries 2): rebuild the BPF programs`},
		{"version 2", bpftest.Map(t, f.mod, "new_version"), os.ErrInvalid,
			`failure map "new_version" is of bpf/perfbuf.bpf.h version 2 (max_entries 3); this perfbuf reads version 1 (max_entries 2): upgrade perfbuf`},
		{"write-only", bpftest.Map(t, f.mod, "write_only"), os.ErrPermission, `failure map "write_only": read: `},
		{"program", perfbuf.MapFD(prog), os.ErrInvalid, "is not a BPF map (anon_inode:bpf-prog)"},
		{"not BPF", perfbuf.MapFD(devNull.Fd()), syscall.EINVAL, "is not a BPF map (/dev/null)"},
		{"closed", perfbuf.MapFD(closed), syscall.EBADF, fmt.Sprintf("failure map fd %d: ", closed)},
		{"negative", perfbuf.MapFD(-1), syscall.EBADF, "failure map fd -1: "},
	}
	// A reader opened and closed first: what the process opens once (the
	// runtime's netpoller) is open before the count.
	pb, err := perfbuf.NewRaw(f.events, perfbuf.Options{FailureMap: f.failures})
	if err != nil {
		t.Fatal(err)
	}
	pb.Close()
	fds := bpftest.OpenFDs(t)
	for _, c := range cases {
		_, err := perfbuf.NewRaw(f.events, perfbuf.Options{FailureMap: c.m})
		if !errors.Is(err, c.want) || !strings.Contains(err.Error(), c.msg) {
			t.Errorf("New, %s: %v; want %v, %q", c.name, err, c.want, c.msg)
		}
		_, err = perfbuf.NewReader(f.events, perfbuf.ReaderOptions{Options: perfbuf.Options{FailureMap: c.m}})
		if !errors.Is(err, c.want) || !strings.Contains(err.Error(), c.msg) {
			t.Errorf("NewReader, %s: %v; want %v, %q", c.name, err, c.want, c.msg)
		}
		t.Logf("%s: %v", c.name, err)
	}
	if now := bpftest.OpenFDs(t); now != fds {
		t.Errorf("%d descriptors open after the failed calls, %d before", now, fds)
	}

	// The good map, through a descriptor of the caller's that it closes
	// after New: perfbuf's own keeps the map readable until Close, and
	// Close closes it.
	own, err := unix.Dup(f.failures.FileDescriptor())
	if err != nil {
		t.Fatal(err)
	}
	pb, err = perfbuf.NewRaw(f.events, perfbuf.Options{FailureMap: perfbuf.MapFD(own)})
	if err != nil {
		t.Fatalf("New after the failures (the map must not stay claimed): %v", err)
	}
	unix.Close(own)
	for _, cpu := range f.cpus {
		f.output(t, cpu, 2, 64, currentCPU|badFlag, 0)
	}
	st := pb.Stats()
	for cpu, fl := range failedByCPU(st) {
		if fl.Invalid != 2 {
			t.Errorf("cpu %d: Failed %+v after its caller's descriptor was closed, want Invalid 2", cpu, fl)
		}
	}
	if n := uint64(len(f.cpus)); st.Failed.Invalid != 2*n || len(st.Rings) != len(f.cpus) {
		t.Errorf("sums: Failed %+v over %d rings after its caller's descriptor was closed, want Invalid %d over %d", st.Failed, len(st.Rings), 2*n, n)
	}
	pb.Close()
	if now := bpftest.OpenFDs(t); now != fds {
		t.Errorf("%d descriptors open after Close, %d before New", now, fds)
	}
}

// Close in the middle of production leaves no sample out of the count.
// Per CPU, every output that reached a ring was delivered or is counted as
// left at Close, exactly, for every read form and at any moment: Close
// takes the rings out of the map and waits for the outputs already
// running (an RCU grace period) before it counts what is left. Outputs
// after that fail in the program (ENOENT, counted by the failure map), and
// lost records cannot report more than the program saw fail with ENOSPC.
// (Counting before the rings left the map missed 640-2,689 samples in
// 83-102 of 1,000 such Closes per form.)
func TestCloseLedger(t *testing.T) {
	f := setup(t)
	iterations := 25
	if testing.Short() {
		iterations = 5
	}
	forms := []string{"callback/Poll", "fullest/ReadInto", "fullest/Each", "ordered/ReadInto", "ordered/Each"}
	for _, form := range forms {
		t.Run(form, func(t *testing.T) {
			var short int
			for it := range iterations {
				short += closeDuringProduction(t, f, form, time.Duration(it%8)*2*time.Millisecond, 64)
			}
			t.Logf("%d of %d Closes found samples left in the rings", short, iterations)
		})
	}
}

// closeDuringProduction runs one producer per CPU flat out, reads with form
// from rings of pages pages, closes after delay while the producers go on,
// and checks the ledger: exactly where owner.CloseExact says so, the losses
// included. It returns 1 if Close left samples in the rings.
func closeDuringProduction(t *testing.T, f *fixture, form string, delay time.Duration, pages int) int {
	t.Helper()
	before := f.outcomes(t)
	opts := perfbuf.Options{RingBytes: bpftest.RingBytes(pages), FailureMap: f.failures}
	delivered := map[int]uint64{}
	var mu sync.Mutex
	count := func(cpu int) {
		mu.Lock()
		delivered[cpu]++
		mu.Unlock()
	}
	var stats func() perfbuf.Stats
	var closeFn func()
	var read func() error
	policy, how, _ := strings.Cut(form, "/")
	if policy == "callback" {
		pb, err := perfbuf.New(f.events, func(cpu int, _ []byte) { count(cpu) }, nil, opts)
		if err != nil {
			t.Fatal(err)
		}
		stats, closeFn = pb.Stats, func() { pb.Close() }
		read = func() error {
			for {
				if _, err := pb.Poll(5 * time.Millisecond); err != nil {
					return err
				}
			}
		}
	} else {
		ropts := perfbuf.ReaderOptions{Options: opts}
		if policy == "ordered" {
			ropts.Order = &perfbuf.Order{KeyOffset: 0, MaxDelay: time.Millisecond}
		}
		r, err := perfbuf.NewReader(f.events, ropts)
		if err != nil {
			t.Fatal(err)
		}
		stats, closeFn = r.Stats, func() { r.Close() }
		read = func() error {
			if how == "Each" {
				return r.Each(context.Background(), func(rec *perfbuf.Record) error {
					if rec.Type == perfbuf.RecordSample {
						count(rec.CPU)
					}
					return nil
				})
			}
			var s perfbuf.Sample
			for {
				if err := r.ReadInto(&s); err != nil {
					return err
				}
				if s.Type == perfbuf.RecordSample {
					count(s.CPU)
				}
			}
		}
	}

	stop := make(chan struct{})
	var producers sync.WaitGroup
	var runErr atomic.Value
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
				if _, err := bpfrun.Run(f.prog, cpu, outputBatch, 64, currentCPU, 0); err != nil {
					runErr.Store(err)
					return
				}
			}
		}()
	}
	readDone := make(chan error, 1)
	go func() { readDone <- read() }()
	time.Sleep(delay)
	closeFn()
	select {
	case err := <-readDone:
		if !errors.Is(err, os.ErrClosed) {
			t.Errorf("%s: read ended with %v, want os.ErrClosed", form, err)
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("%s: read still blocked 10 s after Close", form)
	}
	time.Sleep(time.Millisecond) // outputs after Close: they fail in the program
	close(stop)
	producers.Wait()
	if err := runErr.Load(); err != nil {
		t.Fatal(err)
	}

	after := f.outcomes(t)
	left := 0
	for cpu, st := range perCPU(stats()) {
		ok := after[cpu].OK - before[cpu].OK
		nospc := after[cpu].NoSpace - before[cpu].NoSpace
		if st.Samples != delivered[cpu] {
			t.Errorf("%s: cpu %d: Stats say %d samples, %d delivered", form, cpu, st.Samples, delivered[cpu])
		}
		if st.Samples+st.Left != ok || st.Lost > nospc {
			t.Errorf("%s, Close after %v: cpu %d: delivered %d + left %d != %d outputs into the ring (lost %d of %d ENOSPC)",
				form, delay, cpu, st.Samples, st.Left, ok, st.Lost, nospc)
		}
		d := delta(before[cpu], after[cpu])
		if failed := d.failed().Total(); owner.CloseExact() && (st.Lost != nospc || st.Samples+st.Lost+st.Left+failed != d.Attempts) {
			t.Errorf("%s, Close after %v: cpu %d: %d attempts != delivered %d + lost %d + left %d + failed %d (ENOSPC %d)",
				form, delay, cpu, d.Attempts, st.Samples, st.Lost, st.Left, failed, nospc)
		}
		if st.Left > 0 {
			left = 1
		}
	}
	return left
}

// perCPU sums a reader's rings' Stats by CPU.
func perCPU(stats perfbuf.Stats) map[int]perfbuf.Stats {
	out := map[int]perfbuf.Stats{}
	for _, s := range stats.Rings {
		a := out[s.CPU]
		a.Samples += s.Samples
		a.Lost += s.Lost
		a.Left += s.Left
		out[s.CPU] = a
	}
	return out
}

// fdKinds counts this process's descriptors by what /proc/self/fd says
// they are ("anon_inode:[eventpoll]", "anon_inode:[perf_event]",
// "anon_inode:bpf-map", "socket", ...).
func fdKinds(t *testing.T) map[string]int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]int{}
	for _, e := range ents {
		l, err := os.Readlink("/proc/self/fd/" + e.Name())
		if err != nil {
			continue // the directory's own descriptor, closed by now
		}
		if strings.HasPrefix(l, "socket:") {
			l = "socket"
		}
		out[l]++
	}
	return out
}

// added is what b holds beyond a.
func added(a, b map[string]int) map[string]int {
	out := map[string]int{}
	for k, n := range b {
		if d := n - a[k]; d != 0 {
			out[k] = d
		}
	}
	return out
}

// An owner holds what it needs beyond its perf events, and no more: two
// epoll sets (libbpf's, EpollFD, and the one its waits park on), a
// duplicate of the perf event array and one of the failure map when it has
// one, and the process's one uevent socket for CPU hotplug, which the first
// owner opens and the others share. (Each owner held an eventfd and a
// uevent socket of its own too.) The process's array of maps for grace
// periods (kernel.WaitWriters), made at the first Close, is made first.
func TestOwnerDescriptors(t *testing.T) {
	f := setup(t)
	if err := kernel.WaitWriters(); err != nil {
		t.Fatal(err)
	}
	before := fdKinds(t)
	r, err := perfbuf.NewReader(f.events, perfbuf.ReaderOptions{Options: perfbuf.Options{RingBytes: 1 << 12, FailureMap: f.failures}})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	first := added(before, fdKinds(t))
	delete(first, "anon_inode:[perf_event]")
	if first["anon_inode:[eventpoll]"] != 2 || first["anon_inode:bpf-map"] != 2 || first["socket"] > 1 || len(first) > 3 {
		t.Errorf("the first owner (with a failure map) holds %v beyond its perf events; want 2 epoll sets, the maps' duplicates and the uevent socket", first)
	}

	mid := fdKinds(t)
	pb, err := perfbuf.New(f.events1, func(int, []byte) {}, nil, perfbuf.Options{RingBytes: 1 << 12})
	if err != nil {
		t.Fatal(err)
	}
	second := added(mid, fdKinds(t))
	if n := second["anon_inode:[perf_event]"]; n != 1 {
		t.Errorf("the second owner holds %d perf events, want 1 (events1 has one slot)", n)
	}
	delete(second, "anon_inode:[perf_event]")
	if want := map[string]int{"anon_inode:[eventpoll]": 2, "anon_inode:bpf-map": 1}; !reflect.DeepEqual(second, want) {
		t.Errorf("the second owner holds %v beyond its perf events; want %v", second, want)
	}
	pb.Close()
	r.Close()
	if left := added(before, fdKinds(t)); len(left) != 0 {
		t.Errorf("after both closed, %v more descriptors than before", left)
	}
}
