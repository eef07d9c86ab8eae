// SPDX-License-Identifier: Apache-2.0

// Privileged selftests of readers in two processes over one pinned buffer,
// a perf event array and a ring buffer with its PERFBUF_FAILURE_MAP:
// selftest/bpfbuffer's program (bpfbuffer.bpf.c) loaded with cilium/ebpf,
// run flat out on every CPU by this process (BPF_PROG_TEST_RUN, from a
// thread pinned to the CPU), while each reader is a child process (this
// test binary running TestChild) that logs every sample it delivers. The
// scenarios are an agent's upgrades: the new reader opens then the old one
// closes; the old one closes then the new one opens; the old one is killed
// with SIGKILL; the old one's Close races the new one's open. Every new
// reader reads at once: a ring buffer's waits, blocked, until the old one
// closed or died (its consumer lock), then takes over where the old one
// left off.
//
// At the end every output the program made is accounted for, exactly,
// against the logs, the readers' Stats and the failure map (see check).
// The package needs no cgo: it runs in builds with CGO_ENABLED=0 too.
package crossproc

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/rlimit"
	"github.com/perfbuf/perfbuf"
	"github.com/perfbuf/perfbuf/bpfbuffer/ciliumbuffer"
	"github.com/perfbuf/perfbuf/internal/cpus"
	"github.com/perfbuf/perfbuf/selftest/internal/child"
	"github.com/perfbuf/perfbuf/selftest/internal/ledger"
	"github.com/perfbuf/perfbuf/selftest/internal/pins"
	"golang.org/x/sys/unix"
)

// obj is selftest/bpfbuffer's program, built here by `make bpf` (bpf/crossproc.bpf.c).
const obj = "bpf/crossproc.bpf.o"

// The program's run (bpfbuffer.bpf.c): at most batch records a run, each
// of size bytes through perfbuf_buffer_output (HOW_OUTPUT).
const (
	batch     = 64
	size      = 32
	viaOutput = 0
)

// testRunOnCPU is BPF_F_TEST_RUN_ON_CPU (include/uapi/linux/bpf.h), which
// x/sys/unix lacks.
const testRunOnCPU = 1

// perfPages is the size of a perf ring in pages: small, so that the
// producers outrun the reader and the losses are part of the ledger.
const perfPages = 2

// fixture is the program loaded as one kind, its buffer and failure map
// pinned in dir.
type fixture struct {
	kind      ciliumbuffer.Kind
	coll      *ebpf.Collection
	dir       string
	ringBytes int    // the child's Options.RingBytes (0 for a ring buffer)
	ringSize  int    // the ring's size in bytes (a perf ring's, or the ring buffer's)
	mode      string // the readers': "reader", "ordered" or "callback"
	// beforeLast is what the program saw before it ran with no reader
	// left (finish).
	beforeLast map[int]ledger.Outcome
	cpus       []int
	possible   []int
	runs       []atomic.Uint64 // program runs made, by index in cpus
	stop       chan struct{}
	producers  sync.WaitGroup
	prodErr    chan error
}

// setup loads the program as kind and pins its buffer and failure map. It
// skips without privileges, and fails under CI (CI=true).
func setup(t *testing.T, kind ciliumbuffer.Kind) *fixture {
	t.Helper()
	s, err := ebpf.LoadCollectionSpec(obj)
	if err != nil {
		t.Fatalf("%v (run `make bpf`)", err)
	}
	opts := perfbuf.Options{}
	if kind == ciliumbuffer.PerfEventArray {
		opts.RingBytes = perfPages * os.Getpagesize()
	}
	if _, err := ciliumbuffer.Prepare(s, "events", kind, &opts); err != nil {
		privileged(t, err)
		t.Fatal(err)
	}
	privileged(t, rlimit.RemoveMemlock())
	coll, err := ebpf.NewCollection(s)
	if err != nil {
		privileged(t, err)
		t.Fatalf("load %s: %v", obj, err)
	}
	t.Cleanup(coll.Close)
	online, err := cpus.Online()
	if err != nil {
		t.Fatal(err)
	}
	possible, err := cpus.Possible()
	if err != nil {
		t.Fatal(err)
	}
	f := &fixture{kind: kind, coll: coll, dir: pins.Dir(t), ringBytes: opts.RingBytes, cpus: online, possible: possible}
	f.ringSize = opts.RingBytes
	if kind == ciliumbuffer.RingBuf {
		f.ringSize = int(coll.Maps["events"].MaxEntries())
	}
	for _, name := range []string{"events", "events_failures"} {
		if err := coll.Maps[name].Pin(filepath.Join(f.dir, name)); err != nil {
			t.Fatal(err)
		}
	}
	return f
}

// privileged fails the test if err says it lacks the privileges under CI
// (CI=true), and skips it elsewhere.
func privileged(t *testing.T, err error) {
	t.Helper()
	if errors.Is(err, os.ErrPermission) {
		if os.Getenv("CI") == "true" {
			t.Fatalf("privileged selftest cannot run under CI (needs CAP_BPF, CAP_PERFMON, CAP_SYS_ADMIN): %v", err)
		}
		t.Skipf("privileged selftest (needs CAP_BPF, CAP_PERFMON, CAP_SYS_ADMIN): %v", err)
	}
}

// produce starts a producer on every online CPU: a goroutine locked to a
// thread pinned to the CPU, which runs the program on it, batch records a
// run, until stopProducers.
func (f *fixture) produce(t *testing.T) {
	t.Helper()
	f.runs = make([]atomic.Uint64, len(f.cpus))
	f.stop = make(chan struct{})
	f.prodErr = make(chan error, len(f.cpus))
	prog := f.coll.Programs["produce"]
	for i, cpu := range f.cpus {
		f.producers.Add(1)
		go func() {
			defer f.producers.Done()
			runtime.LockOSThread() // never unlocked: the thread ends with the goroutine
			var set unix.CPUSet
			set.Set(cpu)
			if err := unix.SchedSetaffinity(0, &set); err != nil {
				f.prodErr <- fmt.Errorf("pin to cpu %d: %w", cpu, err)
				return
			}
			opts := &ebpf.RunOptions{Context: []uint64{batch, size, viaOutput, 1}, CPU: uint32(cpu), Flags: testRunOnCPU}
			for {
				select {
				case <-f.stop:
					return
				default:
				}
				if ret, err := prog.Run(opts); err != nil || ret != 0 {
					f.prodErr <- fmt.Errorf("run on cpu %d: %d, %w", cpu, ret, err)
					return
				}
				f.runs[i].Add(1)
			}
		}()
	}
	t.Cleanup(f.stopProducers)
}

// stopProducers stops the producers and waits until they have returned.
func (f *fixture) stopProducers() {
	select {
	case <-f.stop:
	default:
		close(f.stop)
	}
	f.producers.Wait()
}

// wait returns once every producer made n more runs.
func (f *fixture) wait(t *testing.T, n uint64) {
	t.Helper()
	start := make([]uint64, len(f.runs))
	for i := range f.runs {
		start[i] = f.runs[i].Load()
	}
	for i := range f.runs {
		for f.runs[i].Load() < start[i]+n {
			select {
			case err := <-f.prodErr:
				t.Fatal(err)
			case <-time.After(time.Millisecond):
			}
		}
	}
}

// until returns once c logged n samples. It fails the test if c logs
// none while the first CPU's producer makes ten phases' runs (a reader
// that stopped), which bounds nothing but the wait for one that stalled.
func (f *fixture) until(t *testing.T, c *agent, n int) {
	t.Helper()
	// A reader within its latency budget delivers nothing for up to the
	// budget after a wakeup, while the producers may run thousands of
	// times (a ring full fails their outputs fast): a stall is both many
	// runs and seconds without a sample.
	last, since, sinceT := c.logged(), f.runs[0].Load(), time.Now()
	for last < n {
		f.wait(t, 1)
		if now := c.logged(); now != last {
			last, since, sinceT = now, f.runs[0].Load(), time.Now()
		} else if idle := f.runs[0].Load() - since; idle > 10*phase() && time.Since(sinceT) > 5*time.Second {
			t.Fatalf("%s logged %d samples, and none more while the producer of cpu %d ran the program %d times; want %d (%s)",
				c.Name, now, f.cpus[0], idle, n, c.why())
		}
	}
}

// why says why c delivers nothing, for a test that waited for it in vain:
// the error its read ended with, or, if its read goes on, what a drain
// then delivers.
func (c *agent) why() string {
	before := c.logged()
	if _, err := c.Do("drain"); err != nil {
		return err.Error()
	}
	return fmt.Sprintf("its read went on; a drain then logged %d more", c.logged()-before)
}

// agent is a reader in a child process (TestChild).
type agent struct {
	*child.Process
	log    string
	killed bool
	stats  perfbuf.Stats // at its Close
}

// open starts a child reading f's pinned maps and waits until its Reader
// is open. It returns an error rather than failing, so that it can run
// beside another child's command.
func (f *fixture) open(t *testing.T, name string) (*agent, error) {
	t.Helper()
	kind := "ringbuf"
	if f.kind == ciliumbuffer.PerfEventArray {
		kind = "perf"
	}
	log := filepath.Join(t.TempDir(), name+".log")
	p, err := child.Start(t, child.Spec{
		Name:          name,
		Test:          "TestChild",
		Env:           []string{childEnv + "=" + strings.Join([]string{f.dir, kind, strconv.Itoa(f.ringBytes), log, f.mode}, ",")},
		Prefix:        "crossproc",
		KillAtCleanup: true,
	})
	if err != nil {
		return nil, err
	}
	c := &agent{Process: p, log: log}
	if ans, err := c.Answer(); err != nil || ans != "open" {
		return nil, fmt.Errorf("%s: %q, %v; want open", name, ans, err)
	}
	return c, nil
}

// mustOpen is open, failing the test on an error.
func (f *fixture) mustOpen(t *testing.T, name string) *agent {
	t.Helper()
	c, err := f.open(t, name)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// mustDo sends cmd and fails the test unless the answer is want.
func (c *agent) mustDo(t *testing.T, cmd, want string) {
	t.Helper()
	if ans, err := c.Do(cmd); err != nil || ans != want {
		t.Fatalf("%s: %s: %q, %v; want %q", c.Name, cmd, ans, err, want)
	}
}

// close closes the child's Reader and keeps its Stats.
func (c *agent) close() error {
	ans, err := c.Do("close")
	if err != nil {
		return err
	}
	js, ok := strings.CutPrefix(ans, "closed ")
	if !ok {
		return fmt.Errorf("%s: close: %q", c.Name, ans)
	}
	if err := json.Unmarshal([]byte(js), &c.stats); err != nil {
		return fmt.Errorf("%s: close: %w", c.Name, err)
	}
	return c.Cmd.Wait()
}

// mustClose is close, failing the test on an error.
func (c *agent) mustClose(t *testing.T) {
	t.Helper()
	if err := c.close(); err != nil {
		t.Fatal(err)
	}
}

// kill kills the child with SIGKILL and waits for its end.
func (c *agent) kill(t *testing.T) {
	t.Helper()
	if err := c.Kill(); err != nil {
		t.Fatal(err)
	}
	c.killed = true
}

// logged returns how many samples the child has logged so far.
func (c *agent) logged() int {
	st, err := os.Stat(c.log)
	if err != nil {
		return 0
	}
	return int(st.Size() / logEntry)
}

// entry is a logged sample.
type entry struct {
	cpu int
	seq uint64
}

// entries reads the child's log.
func (c *agent) entries(t *testing.T) []entry {
	t.Helper()
	b, err := os.ReadFile(c.log)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		t.Fatal(err)
	}
	if torn := len(b) % logEntry; torn != 0 && c.killed && len(b)%os.Getpagesize() == 0 {
		// SIGKILL cut the last entry's write(2) where it crossed into a
		// new page (generic_perform_write stops at a page for a fatal
		// signal): its sample's function had not returned, so the sample
		// was not committed, and the next reader delivers it.
		b = b[:len(b)-torn]
	} else if torn != 0 {
		t.Fatalf("%s: log of %d bytes, not whole entries", c.Name, len(b))
	}
	out := make([]entry, 0, len(b)/logEntry)
	for ; len(b) > 0; b = b[logEntry:] {
		out = append(out, entry{int(binary.NativeEndian.Uint32(b)), binary.NativeEndian.Uint64(b[4:])})
	}
	return out
}

// phase is how many program runs (of batch records, on every CPU) each
// step of a scenario lasts: 64,000 outputs per CPU, many times what a
// ring holds, or a third of that with -test.short.
func phase() uint64 {
	if testing.Short() {
		return 300
	}
	return 1000
}

// scenario is an upgrade: it takes the fixture with producers running,
// and returns the readers in the order they opened, all closed or killed,
// the last one drained before its Close with the producers stopped.
type scenario struct {
	name string
	run  func(t *testing.T, f *fixture) []*agent
	// gapless: a reader is open from the first output to the last
	// Close, so that no output may fail for want of one (noent).
	gapless bool
	// ringBufOnly: the old reader reads on while the new one is open,
	// which a perf event array's does not (the new one took its slots).
	ringBufOnly bool
	// orderedOnly: the scenario is about an ordered Reader's window.
	orderedOnly bool
}

var scenarios = []scenario{
	{"NewThenOldCloses", func(t *testing.T, f *fixture) []*agent {
		old := f.mustOpen(t, "old")
		f.produce(t)
		old.mustDo(t, "read", "reading")
		f.wait(t, phase())
		neu := f.mustOpen(t, "new")
		neu.mustDo(t, "read", "reading")
		f.wait(t, phase())
		old.mustClose(t)
		f.until(t, neu, neu.logged()+1) // (a ring buffer's: taken over)
		f.wait(t, phase())
		return f.finish(t, old, neu)
	}, true, false, false},
	{"NewWaitsForOld", func(t *testing.T, f *fixture) []*agent {
		// A ring buffer's new reader, blocked in its read from before
		// the old one's Close, delivers nothing until that Close
		// returned, then everything after what the old one delivered
		// (check: the logs follow each other).
		old := f.mustOpen(t, "old")
		f.produce(t)
		old.mustDo(t, "read", "reading")
		f.wait(t, phase())
		neu := f.mustOpen(t, "new")
		neu.mustDo(t, "read", "reading")
		f.wait(t, phase())
		if n := neu.logged(); f.kind == ciliumbuffer.RingBuf && n != 0 {
			t.Fatalf("the new reader delivered %d samples while the old one read", n)
		}
		before := old.logged()
		f.until(t, old, before+1) // the old one reads on meanwhile
		old.mustClose(t)
		f.until(t, neu, 1)
		f.wait(t, phase())
		return f.finish(t, old, neu)
	}, true, true, false},
	{"OldKilledNewWaiting", func(t *testing.T, f *fixture) []*agent {
		// The old reader dies while the new one waits in its read: the
		// new one takes over at the old one's last commit.
		old := f.mustOpen(t, "old")
		f.produce(t)
		old.mustDo(t, "read", "reading")
		neu := f.mustOpen(t, "new")
		neu.mustDo(t, "read", "reading")
		seed := uint64(time.Now().UnixNano())
		at := old.logged() + 1 + rand.New(rand.NewPCG(seed, 0)).IntN(int(phase())*batch/4)
		t.Logf("seed %d: SIGKILL once the old reader logged %d samples", seed, at)
		f.until(t, old, at)
		old.kill(t)
		f.until(t, neu, 1)
		f.wait(t, phase())
		return f.finish(t, old, neu)
	}, true, true, false},
	{"OldClosesThenNew", func(t *testing.T, f *fixture) []*agent {
		old := f.mustOpen(t, "old")
		f.produce(t)
		old.mustDo(t, "read", "reading")
		f.wait(t, phase())
		old.mustClose(t)
		f.wait(t, phase())
		neu := f.mustOpen(t, "new")
		neu.mustDo(t, "read", "reading")
		f.wait(t, phase())
		return f.finish(t, old, neu)
	}, false, false, false},
	{"OldKilled", func(t *testing.T, f *fixture) []*agent {
		old := f.mustOpen(t, "old")
		f.produce(t)
		old.mustDo(t, "read", "reading")
		// A point of the old reader's reading, at random.
		seed := uint64(time.Now().UnixNano())
		at := 1 + rand.New(rand.NewPCG(seed, 0)).IntN(int(phase())*batch/4)
		t.Logf("seed %d: SIGKILL once the old reader logged %d samples", seed, at)
		f.until(t, old, at)
		old.kill(t)
		f.wait(t, phase())
		neu := f.mustOpen(t, "new")
		neu.mustDo(t, "read", "reading")
		f.wait(t, phase())
		return f.finish(t, old, neu)
	}, false, false, false},
	{"OldKilledHolding", func(t *testing.T, f *fixture) []*agent {
		// An ordered Reader over a ring buffer dies holding copies in
		// its window: the producers flat out, then stopped; once the old
		// reader drained the ring and cooled (its hot ring: a look that
		// finds it empty 10 ms after the last that found it behind),
		// bursts small enough to be copied (below an eighth of the ring)
		// until, once it looked at the ring, the ring holds bytes it has
		// not committed (its copies, held: orderedKeys' MaxDelay is
		// long), then SIGKILL; the new reader, opened with the producers
		// flat out again, delivers the copies the old one held, and what
		// it delivered after the oldest of them again. Flat out, a reader is behind the producers: it reads
		// the ring in place and holds no copy when it dies.
		old := f.mustOpen(t, "old")
		f.produce(t)
		old.mustDo(t, "read", "reading")
		f.wait(t, phase())
		f.stopProducers()
		for try := 0; ; try++ {
			if try == 200 {
				t.Fatalf("the old reader held no copy after %d bursts", try)
			}
			for n := old.logged(); ; n = old.logged() {
				time.Sleep(20 * time.Millisecond) // (a wait for the reader to drain and cool; no bound asserted)
				if old.logged() == n {
					break
				}
			}
			f.burst(t, 1)
			// (A wait for the reader to look at the ring and copy the
			// burst: it looks every 7/8 of MaxLatency, 10 ms, at the
			// latest.)
			time.Sleep(30 * time.Millisecond)
			if ans, err := old.Do("held"); err != nil || ans != "held 0" && ans != "held 1" {
				t.Fatalf("held: %q, %v", ans, err)
			} else if ans == "held 1" {
				t.Logf("SIGKILL with copies held, after %d bursts, once the old reader logged %d samples", try+1, old.logged())
				break
			}
		}
		old.kill(t)
		f.produce(t)
		f.wait(t, phase())
		neu := f.mustOpen(t, "new")
		neu.mustDo(t, "read", "reading")
		f.wait(t, phase())
		return f.finish(t, old, neu)
	}, false, true, true},
	{"NewKilled", func(t *testing.T, f *fixture) []*agent {
		// The new agent dies during the upgrade; a third one takes
		// over once the old one closed. A ring buffer's new reader dies
		// waiting in its read (two readers do not read it at once); a
		// perf event array's reads, its slots go with it, and the old
		// reader gets nothing more.
		old := f.mustOpen(t, "old")
		f.produce(t)
		old.mustDo(t, "read", "reading")
		f.wait(t, phase())
		neu := f.mustOpen(t, "new")
		neu.mustDo(t, "read", "reading")
		if f.kind == ciliumbuffer.PerfEventArray {
			seed := uint64(time.Now().UnixNano())
			at := 1 + rand.New(rand.NewPCG(seed, 0)).IntN(int(phase())*batch/4)
			t.Logf("seed %d: SIGKILL once the new reader logged %d samples", seed, at)
			f.until(t, neu, at)
		} else {
			f.wait(t, phase())
		}
		neu.kill(t)
		f.wait(t, phase())
		old.mustClose(t)
		f.wait(t, phase())
		third := f.mustOpen(t, "third")
		third.mustDo(t, "read", "reading")
		f.wait(t, phase())
		return f.finish(t, old, neu, third)
	}, false, false, false},
	{"CloseRacesOpen", func(t *testing.T, f *fixture) []*agent {
		old := f.mustOpen(t, "old")
		f.produce(t)
		old.mustDo(t, "read", "reading")
		f.wait(t, phase())
		var (
			neu     *agent
			openErr error
			opened  = make(chan struct{})
		)
		go func() {
			defer close(opened)
			neu, openErr = f.open(t, "new")
		}()
		closeErr := old.close()
		<-opened
		if err := errors.Join(closeErr, openErr); err != nil {
			t.Fatal(err)
		}
		neu.mustDo(t, "read", "reading")
		f.until(t, neu, 1) // (a ring buffer's: taken over, if it waited)
		f.wait(t, phase())
		return f.finish(t, old, neu)
	}, false, false, false},
}

// burst runs the program runs times on every CPU, batch records a run,
// with the producers stopped.
func (f *fixture) burst(t *testing.T, runs int) {
	t.Helper()
	prog := f.coll.Programs["produce"]
	for _, cpu := range f.cpus {
		for range runs {
			opts := &ebpf.RunOptions{Context: []uint64{batch, size, viaOutput, 1}, CPU: uint32(cpu), Flags: testRunOnCPU}
			if ret, err := prog.Run(opts); err != nil || ret != 0 {
				t.Fatalf("run on cpu %d: %d, %v", cpu, ret, err)
			}
		}
	}
}

// finish stops the producers, drains the last reader and closes it, then
// runs the program again on every CPU: every output fails (noent).
func (f *fixture) finish(t *testing.T, readers ...*agent) []*agent {
	t.Helper()
	f.stopProducers()
	last := readers[len(readers)-1]
	last.mustDo(t, "drain", "drained")
	last.mustClose(t)
	// No reader is left: outputs fail in the program, counted (noent).
	before := f.outcomes(t)
	prog := f.coll.Programs["produce"]
	for _, cpu := range f.cpus {
		for range afterRuns {
			opts := &ebpf.RunOptions{Context: []uint64{batch, size, viaOutput, 1}, CPU: uint32(cpu), Flags: testRunOnCPU}
			if ret, err := prog.Run(opts); err != nil || ret != 0 {
				t.Fatalf("run on cpu %d: %d, %v", cpu, ret, err)
			}
		}
	}
	after := f.outcomes(t)
	f.beforeLast = before
	for _, cpu := range f.cpus {
		a, b := after[cpu], before[cpu]
		if n, noent := a.Attempts-b.Attempts, a.NoEnt-b.NoEnt; n != afterRuns*batch || noent != n {
			t.Errorf("cpu %d: %d outputs after the last Close, %d failed (noent); want %d, all", cpu, n, noent, afterRuns*batch)
		}
	}
	return readers
}

// afterRuns is how many runs of the program, of batch outputs, each CPU
// makes once the last reader closed.
const afterRuns = 4

// outcomes reads the program's own counts, by CPU: the kernel returns one
// value per possible CPU, in the order of the possible CPUs.
func (f *fixture) outcomes(t *testing.T) map[int]ledger.Outcome {
	t.Helper()
	var vals []ledger.Outcome
	if err := f.coll.Maps["outcomes"].Lookup(uint32(0), &vals); err != nil {
		t.Fatal(err)
	}
	out := map[int]ledger.Outcome{}
	for k, cpu := range f.possible {
		out[cpu] = vals[k]
	}
	return out
}

// TestUpgrade runs each scenario over each kind, with readers in each
// mode, and checks the ledger.
func TestUpgrade(t *testing.T) {
	for _, kind := range []ciliumbuffer.Kind{ciliumbuffer.PerfEventArray, ciliumbuffer.RingBuf} {
		for _, mode := range []string{"reader", "ordered", "callback"} {
			for _, sc := range scenarios {
				if sc.ringBufOnly && kind != ciliumbuffer.RingBuf || sc.orderedOnly && mode != "ordered" {
					continue
				}
				t.Run(kind.String()+"/"+mode+"/"+sc.name, func(t *testing.T) {
					f := setup(t, kind)
					f.mode = mode
					start := time.Now()
					readers := sc.run(t, f)
					f.check(t, readers)
					for _, cpu := range f.cpus {
						if n := f.beforeLast[cpu].NoEnt; sc.gapless && n != 0 {
							t.Errorf("cpu %d: %d outputs failed for want of a reader (noent) while one was open", cpu, n)
						}
					}
					t.Logf("%v", time.Since(start).Round(time.Millisecond))
				})
			}
		}
	}
}
