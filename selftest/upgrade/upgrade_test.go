// SPDX-License-Identifier: Apache-2.0

// Privileged selftests of two processes over one pinned perf event array,
// as an agent's rolling upgrade runs them: the new agent's reader opens,
// then the old agent's closes. Each reader fills its CPUs' slots through a
// map file of its own, and the kernel empties, when that file is released,
// only the slots filled through it that still hold what it put there
// (perf_event_fd_array_release): the old reader's Close leaves the new
// reader's slots alone, in every mode and through both ring openers
// (libbpf's perf_buffer, perfbuf's own). Where a reader can have no file of
// its own (no pin known and no CAP_SYS_ADMIN), or the map has
// BPF_F_PRESERVE_ELEMS, it deletes its slots by key at Close: the outputs
// after it fail, and no slot is left filled.
//
// The maps are loaded with cilium/ebpf, so that the package runs without
// cgo too (make test-nocgo), where perfbuf's own opener is the only one.
package upgrade

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/rlimit"
	"github.com/perfbuf/perfbuf"
	"github.com/perfbuf/perfbuf/internal/cpus"
	"github.com/perfbuf/perfbuf/internal/kernel"
	"github.com/perfbuf/perfbuf/selftest/internal/child"
	"github.com/perfbuf/perfbuf/selftest/internal/pins"
	"golang.org/x/sys/unix"
)

// obj is the emitter (selftest/common/emit.bpf.h) alone, built by `make
// bpf`: its perf event array "events" and its program "emit".
const obj = "bpf/upgrade.bpf.o"

// childEnv, set in a child's environment, says what TestUpgradeChild
// opens: "dir,mode,opener,source,admin" (see spec; admin is "admin" or
// "noadmin").
const childEnv = "PERFBUF_UPGRADE_CHILD"

// perCPU is how many samples the program outputs on each CPU in each of
// the two phases: before the old reader closes, and after.
const perCPU = 10

// testRunOnCPU is BPF_F_TEST_RUN_ON_CPU (include/uapi/linux/bpf.h), which
// x/sys/unix lacks.
const testRunOnCPU = 1

// capSysAdmin is CAP_SYS_ADMIN (include/uapi/linux/capability.h).
const capSysAdmin = 21

// spec is a reader in a child process.
type spec struct {
	mode   string // New, NewReader, NewRaw, NewRecorder
	opener string // libbpf (cgo builds without perfbuf_nolibbpf) or own (perfbuf's opener, forced)
	// source is how it names the map: "fd", a descriptor of the pin
	// (perfbuf.MapFD: no pin known), or "pin", a Map whose PinPath names
	// it.
	source string
	// noAdmin starts it without CAP_SYS_ADMIN (dropped from its
	// bounding set): BPF_MAP_GET_FD_BY_ID fails with EPERM there.
	noAdmin bool
}

// openers are the ring openers of this build: libbpf's where it is linked
// and perfbuf's own.
func openers() []string {
	if libbpfOpener {
		return []string{"libbpf", "own"}
	}
	return []string{"own"}
}

// modes are the readers' constructors.
var modes = []string{"New", "NewReader", "NewRaw", "NewRecorder"}

// fixture is the emitter loaded here, its perf event array pinned in dir.
type fixture struct {
	dir    string
	events *ebpf.Map
	prog   *ebpf.Program
	stats  *ebpf.Map
	cpus   []int
}

// setup loads obj, its perf event array with the map flags flags, and
// pins the array under a directory of pins.Dir. It skips without the
// privileges, and fails under CI.
func setup(t *testing.T, flags uint32) *fixture {
	t.Helper()
	// Before 5.11 the kernel charges maps and programs to RLIMIT_MEMLOCK;
	// cilium/ebpf raises the limit only where it must.
	if err := rlimit.RemoveMemlock(); err != nil {
		t.Fatal(err)
	}
	cs, err := ebpf.LoadCollectionSpec(obj)
	if err != nil {
		t.Fatalf("load %s: %v (run `make bpf`)", obj, err)
	}
	cs.Maps["events"].Flags |= flags
	coll, err := ebpf.NewCollection(cs)
	if err != nil {
		if errors.Is(err, os.ErrPermission) && os.Getenv("CI") != "true" {
			t.Skipf("load %s (needs CAP_BPF, CAP_PERFMON, CAP_SYS_ADMIN): %v", obj, err)
		}
		t.Fatalf("load %s: %v", obj, err)
	}
	t.Cleanup(coll.Close)
	online, err := cpus.Online()
	if err != nil {
		t.Fatal(err)
	}
	f := &fixture{dir: pins.Dir(t), events: coll.Maps["events"], prog: coll.Programs["emit"], stats: coll.Maps["emit_stats"], cpus: online}
	if err := f.events.Pin(filepath.Join(f.dir, "events")); err != nil {
		t.Fatal(err)
	}
	return f
}

// emit outputs n samples on every online CPU and returns how many of
// them failed in the program (no ring in the CPU's slot, or a full one).
func (f *fixture) emit(t *testing.T, n uint64) uint64 {
	t.Helper()
	before := f.failed(t)
	for _, cpu := range f.cpus {
		ret, err := f.prog.Run(&ebpf.RunOptions{Context: []uint64{n, 32, 0, 0}, CPU: uint32(cpu), Flags: testRunOnCPU})
		if err != nil || ret != 0 {
			t.Fatalf("emit on cpu %d: %d, %v", cpu, ret, err)
		}
	}
	return f.failed(t) - before
}

// failed sums emit_stats.failed over the CPUs.
func (f *fixture) failed(t *testing.T) uint64 {
	t.Helper()
	var vals []struct{ Emitted, Failed, Seq uint64 }
	if err := f.stats.Lookup(uint32(0), &vals); err != nil {
		t.Fatal(err)
	}
	var n uint64
	for _, v := range vals {
		n += v.Failed
	}
	return n
}

// filled returns the online CPUs whose slot holds an event: deleting it
// through the test's own descriptor succeeds (and empties it), where an
// empty slot is ENOENT.
func (f *fixture) filled(t *testing.T) []int {
	t.Helper()
	var out []int
	for _, cpu := range f.cpus {
		err := f.events.Delete(uint32(cpu))
		switch {
		case err == nil:
			out = append(out, cpu)
		case !errors.Is(err, ebpf.ErrKeyNotExist):
			t.Fatalf("delete slot %d: %v", cpu, err)
		}
	}
	return out
}

// upgrade runs the upgrade: the old reader opens, the new one opens,
// outputs, the old one closes, outputs again. It returns what the new one
// delivered of them and how many failed in the program: those after the
// old reader's Close fail if it deleted its slots by key.
func (f *fixture) upgrade(t *testing.T, old, neu spec) (got, failed uint64) {
	t.Helper()
	o := f.start(t, old)
	n := f.start(t, neu)
	failed = f.emit(t, perCPU)
	o.MustDo(t, "close")
	failed += f.emit(t, perCPU)
	got = n.Count(t, "flush")
	n.MustDo(t, "close")
	t.Logf("old %+v, new %+v: the new reader delivered %d of %d, %d failed", old, neu, got, 2*perCPU*len(f.cpus), failed)
	return got, failed
}

// The new agent's reader opens, the old agent's closes: every output made
// after the new one opened reaches it, whatever the old one's mode and
// whichever opener, and once it closes too its slots are empty. (Before
// readers filled their slots through a file of their own, the old
// reader's Close deleted every slot of its CPUs: the new reader delivered
// 20 of 40 on 2 CPUs, the 20 output after that Close failing.)
func TestUpgrade(t *testing.T) {
	for _, opener := range openers() {
		for _, mode := range modes {
			if mode == "NewRecorder" && opener == "libbpf" {
				continue // a Recorder opens its backward rings itself
			}
			t.Run(opener+"/"+mode, func(t *testing.T) {
				f := setup(t, 0)
				got, failed := f.upgrade(t, spec{mode: mode, opener: opener, source: "fd"},
					spec{mode: "NewReader", opener: opener, source: "fd"})
				if want := uint64(2 * perCPU * len(f.cpus)); got != want || failed != 0 {
					t.Errorf("the new reader delivered %d of %d output after it opened, %d failed; want all, none failed", got, want, failed)
				}
				if left := f.filled(t); len(left) != 0 {
					t.Errorf("slots of cpus %v still filled after both readers closed", left)
				}
			})
		}
	}
}

// Without CAP_SYS_ADMIN a reader gets a file of its own from the map's pin
// when its Map names it (PinPath), and the upgrade loses nothing. With a
// bare descriptor it can have none: its Close deletes its CPUs' slots by
// key, the new reader's: what is output after it fails in the program, as
// documented.
func TestUpgradeWithoutAdmin(t *testing.T) {
	perfWithoutAdmin(t)
	for _, opener := range openers() {
		t.Run(opener+"/pin", func(t *testing.T) {
			f := setup(t, 0)
			got, failed := f.upgrade(t, spec{mode: "NewReader", opener: opener, source: "pin", noAdmin: true},
				spec{mode: "NewReader", opener: opener, source: "fd"})
			if want := uint64(2 * perCPU * len(f.cpus)); got != want || failed != 0 {
				t.Errorf("the new reader delivered %d of %d, %d failed; want all, none failed", got, want, failed)
			}
		})
		t.Run(opener+"/fd", func(t *testing.T) {
			f := setup(t, 0)
			got, failed := f.upgrade(t, spec{mode: "NewReader", opener: opener, source: "fd", noAdmin: true},
				spec{mode: "NewReader", opener: opener, source: "fd"})
			if half := uint64(perCPU * len(f.cpus)); got != half || failed != half {
				t.Errorf("the new reader delivered %d, %d failed; want %d each (the old reader's Close deleted the slots)", got, failed, half)
			}
		})
	}
}

// perfWithoutAdmin makes perf_event_open work without CAP_SYS_ADMIN for
// the test. Debian's kernels default perf_event_paranoid to 3, where their
// patch refuses perf_event_open without CAP_SYS_ADMIN: no reader without it
// exists there. Inside a VM of make vmtest (PERFBUF_VMTEST) the test sets it
// to 2 and back; on a host it leaves the host's setting alone and skips.
func perfWithoutAdmin(t *testing.T) {
	// Without CAP_PERFMON (a container whose runtime grants only some
	// capabilities), per-CPU events need CAP_SYS_ADMIN: no reader without it.
	if perfmon, err := hasCap(unix.CAP_PERFMON); err != nil {
		t.Fatal(err)
	} else if !perfmon {
		t.Skip("no CAP_PERFMON here: a reader without CAP_SYS_ADMIN cannot open per-CPU perf events")
	}
	const sysctl = "/proc/sys/kernel/perf_event_paranoid"
	was, err := os.ReadFile(sysctl)
	if err != nil {
		t.Fatal(err)
	}
	if level, err := strconv.Atoi(strings.TrimSpace(string(was))); err != nil || level <= 2 {
		return
	}
	if os.Getenv("PERFBUF_VMTEST") != "1" {
		t.Skipf("perf_event_paranoid %s: perf_event_open needs CAP_SYS_ADMIN on this host (Debian's patch), so no reader without it can open rings", strings.TrimSpace(string(was)))
	}
	if err := os.WriteFile(sysctl, []byte("2"), 0); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.WriteFile(sysctl, was, 0) })
}

// Over a map with BPF_F_PRESERVE_ELEMS the kernel empties no slot when a
// map file is released, so a reader, in every mode, deletes its slots by
// key at Close: no slot is left filled after Close.
func TestPreserveElems(t *testing.T) {
	for _, opener := range openers() {
		for _, mode := range modes {
			if mode == "NewRecorder" && opener == "libbpf" {
				continue
			}
			t.Run(opener+"/"+mode, func(t *testing.T) {
				f := setup(t, unix.BPF_F_PRESERVE_ELEMS)
				c := f.start(t, spec{mode: mode, opener: opener, source: "pin"})
				if failed := f.emit(t, perCPU); failed != 0 {
					t.Fatalf("%d outputs failed with the reader open", failed)
				}
				c.MustDo(t, "close")
				if left := f.filled(t); len(left) != 0 {
					t.Errorf("slots of cpus %v still filled after Close", left)
				}
			})
		}
	}
}

// reader is a reader in another process: this test binary running
// TestUpgradeChild.
type reader struct {
	*child.Process
}

// start starts a child reading f's pinned map as s says, and waits until
// its reader is open.
func (f *fixture) start(t *testing.T, s spec) *reader {
	t.Helper()
	admin := "admin"
	if s.noAdmin {
		admin = "noadmin"
	}
	cs := child.Spec{
		Name:   "child",
		Test:   "TestUpgradeChild",
		Env:    []string{childEnv + "=" + strings.Join([]string{f.dir, s.mode, s.opener, s.source, admin}, ",")},
		Prefix: "upgrade",
	}
	if s.noAdmin {
		cs.Start = func(cmd *exec.Cmd) error { return startWithout(cmd, capSysAdmin) }
	}
	c := &reader{Process: child.MustStart(t, cs)}
	if ans := c.MustAnswer(t); ans != "open" {
		t.Fatalf("child: %q, want open", ans)
	}
	return c
}

// startWithout starts cmd without the capability cap: from a thread of its
// own whose bounding set lacks it, which the child inherits; a child
// running as root then has it in none of its sets. The thread ends with
// the goroutine (LockOSThread without an unlock).
func startWithout(cmd *exec.Cmd, cap uintptr) error {
	done := make(chan error)
	go func() {
		runtime.LockOSThread()
		if err := unix.Prctl(unix.PR_CAPBSET_DROP, cap, 0, 0, 0); err != nil {
			done <- fmt.Errorf("drop capability %d from the bounding set: %w", cap, err)
			return
		}
		done <- cmd.Start()
	}()
	return <-done
}

// pinned is a Map that names its pin, as libbpfgo's *BPFMap does.
type pinned struct {
	fd   int
	path string
}

func (p pinned) FileDescriptor() int { return p.fd }
func (p pinned) PinPath() string     { return p.path }

// TestUpgradeChild is the child of the tests above: a reader of the perf
// event array pinned in the directory $PERFBUF_UPGRADE_CHILD names, opened
// as it says (spec). It answers "open" once its reader is open, then, a
// line each: "flush" (a NewReader) with the samples delivered up to a
// Flush, "close" with "closed", and exits.
func TestUpgradeChild(t *testing.T) {
	env := os.Getenv(childEnv)
	if env == "" {
		t.Skip("the child of TestUpgrade")
	}
	srv := child.Serve(t, "upgrade")
	answer, fail := srv.Answer, srv.Fail
	args := strings.Split(env, ",")
	if len(args) != 5 {
		fail(fmt.Errorf("%s=%q: want dir,mode,opener,source,admin", childEnv, env))
	}
	dir, mode, opener, source := args[0], args[1], args[2], args[3]
	if admin, err := hasCap(capSysAdmin); err != nil {
		fail(err)
	} else if admin != (args[4] == "admin") {
		fail(fmt.Errorf("CAP_SYS_ADMIN %v, want %s", admin, args[4]))
	}
	path := filepath.Join(dir, "events")
	m, err := ebpf.LoadPinnedMap(path, nil)
	if err != nil {
		fail(err)
	}
	defer m.Close()
	var pm perfbuf.Map = perfbuf.MapFD(m.FD())
	if source == "pin" {
		pm = pinned{m.FD(), path}
	}
	switch opener {
	case "own":
		kernel.ForcePerfRings.Store(true)
	case "libbpf":
	default:
		fail(fmt.Errorf("unknown opener %q", opener))
	}
	opts := perfbuf.Options{RingBytes: os.Getpagesize()}
	before := kernel.OpenedPerfRings()
	var (
		closeFn func() error
		r       *perfbuf.Reader
	)
	switch mode {
	case "New":
		pb, err := perfbuf.New(pm, func(int, []byte) {}, nil, opts)
		if err != nil {
			fail(err)
		}
		closeFn = pb.Close
	case "NewReader":
		r, err = perfbuf.NewReader(pm, perfbuf.ReaderOptions{Options: opts})
		if err != nil {
			fail(err)
		}
		closeFn = r.Close
	case "NewRaw":
		raw, err := perfbuf.NewRaw(pm, opts)
		if err != nil {
			fail(err)
		}
		closeFn = raw.Close
	case "NewRecorder":
		rec, err := perfbuf.NewRecorder(pm, opts)
		if err != nil {
			fail(err)
		}
		closeFn = rec.Close
	default:
		fail(fmt.Errorf("unknown mode %q", mode))
	}
	defer closeFn()
	ownRings := kernel.OpenedPerfRings() - before
	if mode != "NewRecorder" && (opener == "own") != (ownRings > 0) {
		fail(fmt.Errorf("opener %s: perfbuf's opener opened %d rings", opener, ownRings))
	}
	answer("open")
	srv.Commands(func(cmd string) bool {
		switch cmd {
		case "flush":
			if r == nil {
				fail(fmt.Errorf("flush: a %s is no Reader", mode))
			}
			var got uint64
			var s perfbuf.Sample
			r.Flush()
			for {
				err := r.ReadInto(&s)
				if errors.Is(err, perfbuf.ErrFlushed) {
					break
				}
				if err != nil {
					fail(err)
				}
				got++
			}
			answer("%d", got)
		case "close":
			if err := closeFn(); err != nil {
				fail(err)
			}
			answer("closed")
			return true
		default:
			fail(fmt.Errorf("unknown command %q", cmd))
		}
		return false
	})
}

// hasCap reports whether this process has the capability cap in its
// effective set (/proc/self/status, CapEff).
func hasCap(cap uint) (bool, error) {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return false, err
	}
	for line := range strings.Lines(string(b)) {
		if hex, ok := strings.CutPrefix(line, "CapEff:"); ok {
			v, err := strconv.ParseUint(strings.TrimSpace(hex), 16, 64)
			if err != nil {
				return false, fmt.Errorf("CapEff %q: %w", hex, err)
			}
			return v&(1<<cap) != 0, nil
		}
	}
	return false, errors.New("no CapEff in /proc/self/status")
}
