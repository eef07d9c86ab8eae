// SPDX-License-Identifier: Apache-2.0

package main

// Privileged tests: the real BPF program (built by `make bpf`), attached to
// the execve tracepoints, with known commands exec'd by the test.

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"github.com/perfbuf/perfbuf"
	"github.com/perfbuf/perfbuf/internal/kernel"
)

// requirePrivileges skips the test without root or kernel BTF, except under
// CI (CI=true), where a privileged test that cannot run must fail.
func requirePrivileges(t *testing.T) {
	t.Helper()
	reason := ""
	if os.Geteuid() != 0 {
		reason = "needs root (CAP_BPF, CAP_PERFMON, CAP_SYS_ADMIN)"
	} else if _, err := os.Stat("/sys/kernel/btf/vmlinux"); err != nil {
		reason = "needs kernel BTF: " + err.Error()
	}
	if reason == "" {
		return
	}
	if os.Getenv("CI") == "true" {
		t.Fatalf("privileged test cannot run under CI: %s", reason)
	}
	t.Skipf("privileged test: %s", reason)
}

func openTestTracer(t *testing.T, cfg tracerConfig) *tracer {
	t.Helper()
	requirePrivileges(t)
	tr, err := openTracer(cfg)
	if err != nil {
		t.Fatal(err) // a missing object says to run `make bpf`
	}
	t.Cleanup(tr.close)
	return tr
}

// traced is one exec as the reader delivered it.
type traced struct {
	ev  event
	cpu int
	key uint64
}

// collect flushes the reader and returns every exec it delivers until the
// flush completes. Everything the test exec'd before is in the rings by
// then: the exit tracepoint runs before the exec'd process can exit.
func collect(t *testing.T, tr *tracer) []traced {
	t.Helper()
	tr.rd.SetDeadline(time.Now().Add(10 * time.Second))
	tr.rd.Flush()
	var (
		out []traced
		s   perfbuf.Sample
	)
	for {
		err := tr.rd.ReadInto(&s)
		if errors.Is(err, perfbuf.ErrFlushed) {
			break
		}
		if err != nil {
			t.Fatalf("read: %v", err)
		}
		if s.Type == perfbuf.RecordLost {
			t.Errorf("cpu %d lost %d events", s.CPU, s.Lost)
			continue
		}
		var ev event
		if err := decodeEvent(s.Data, &ev); err != nil {
			t.Fatalf("cpu %d: %v", s.CPU, err)
		}
		if s.Late {
			t.Errorf("late event (ts %d) on cpu %d: %+v", s.Key, s.CPU, ev)
		}
		out = append(out, traced{ev: ev, cpu: s.CPU, key: s.Key})
	}
	for i, tc := range out {
		if tc.key != tc.ev.TS {
			t.Errorf("event %d: key %d, ts %d: the reader must order by ts", i, tc.key, tc.ev.TS)
		}
		if i > 0 && tc.ev.TS < out[i-1].ev.TS {
			t.Errorf("event %d at %d after event %d at %d: not in timestamp order", i, tc.ev.TS, i-1, out[i-1].ev.TS)
		}
	}
	return out
}

// find returns the events whose second argument is token.
func find(got []traced, token string) []traced {
	var out []traced
	for _, tc := range got {
		if len(tc.ev.Args) > 1 && tc.ev.Args[1] == token {
			out = append(out, tc)
		}
	}
	return out
}

// findOne is find that wants exactly one event.
func findOne(t *testing.T, got []traced, token string) event {
	t.Helper()
	m := find(got, token)
	if len(m) != 1 {
		t.Fatalf("%d events with token %s among %d, want 1: %+v", len(m), token, len(got), m)
	}
	return m[0].ev
}

func newToken() string {
	return fmt.Sprintf("perfbuf-test-%d-%x", os.Getpid(), rand.Uint64())
}

func ownComm(t *testing.T) string {
	b, err := os.ReadFile("/proc/self/comm")
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSuffix(string(b), "\n")
}

func runOK(t *testing.T, cmd *exec.Cmd) int {
	t.Helper()
	if err := cmd.Run(); err != nil {
		t.Fatalf("%s: %v", cmd, err)
	}
	return cmd.Process.Pid
}

func TestTraceExecs(t *testing.T) {
	tr := openTestTracer(t, tracerConfig{uid: -1, includeFailed: true, maxArgs: 20})
	me := uint32(os.Getpid())

	ok := newToken()
	okPID := runOK(t, exec.Command("/bin/true", ok, "a", "b"))

	failTok := newToken()
	failPath := "/nonexistent-" + failTok + "/x"
	if err := exec.Command(failPath, failTok, "fail").Run(); !errors.Is(err, syscall.ENOENT) {
		t.Fatalf("exec %s: %v, want ENOENT", failPath, err)
	}

	many := newToken()
	long := strings.Repeat("L", 300)
	argv := []string{many, long}
	for i := len(argv) + 1; i < 30; i++ {
		argv = append(argv, fmt.Sprintf("arg%d", i))
	}
	manyPID := runOK(t, exec.Command("/bin/true", argv...))

	// Execs from many goroutines, so from both CPUs, to exercise ordering.
	par := newToken()
	var wg sync.WaitGroup
	for i := 0; i < 16; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := exec.Command("/bin/true", par).Run(); err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()

	got := collect(t, tr)

	ev := findOne(t, got, ok)
	want := event{TS: ev.TS, PID: uint32(okPID), PPID: me, UID: 0, Ret: 0, Comm: "true",
		Args: []string{"/bin/true", ok, "a", "b"}}
	if !equalEvent(ev, want) {
		t.Errorf("exec of /bin/true:\n got %+v\nwant %+v", ev, want)
	}

	ev = findOne(t, got, failTok)
	// A failed exec keeps the caller's image: the comm is the test's.
	want = event{TS: ev.TS, PID: ev.PID, PPID: me, UID: 0, Ret: -int32(syscall.ENOENT), Comm: ownComm(t),
		Args: []string{failPath, failTok, "fail"}}
	if !equalEvent(ev, want) || ev.PID == me {
		t.Errorf("failed exec:\n got %+v\nwant %+v (pid of a child)", ev, want)
	}

	ev = findOne(t, got, many)
	wantArgs := append([]string{"/bin/true", many, long[:argSize-1]}, argv[2:19]...)
	if ev.PID != uint32(manyPID) || !ev.Truncated || !slices.Equal(ev.Args, wantArgs) {
		t.Errorf("29 args with --max-args 20: got pid %d truncated %v args %q\nwant pid %d truncated args %q",
			ev.PID, ev.Truncated, ev.Args, manyPID, wantArgs)
	}

	// Every parallel exec is traced, or the kernel skipped one of its
	// programs' runs (recursion_misses: a BPF program was already running
	// on that CPU), which the program never saw: seen under TCG on 7.3 and
	// in the arm64 guest, never a lost or failed output.
	if n := len(find(got, par)); n != 16 {
		skipped, serr := skippedRuns(tr)
		// What the program and the reader counted, to tell a missed
		// exec from a lost or failed output.
		kc, err := tr.kernelCounts()
		stats := tr.rd.Stats()
		notRun := stats.NotRun // (Options.Programs)
		report := fmt.Sprintf("%d of 16 parallel execs traced; kernel counts %+v (%v), programs skipped %s (reader's NotRun %d), execs in flight left %s, reader stats %+v; every event: %+v",
			n, kc, err, recursionMisses(tr), notRun, inFlight(tr), stats, got)
		if n > 16 || serr != nil || uint64(16-n) > skipped || notRun < skipped { // (read after skipped)
			t.Error(report)
		} else {
			t.Log(report)
		}
	}
	cpus := map[int]bool{}
	for _, tc := range got {
		cpus[tc.cpu] = true
	}
	t.Logf("%d events from %d cpus, in timestamp order", len(got), len(cpus))
}

// recursionMisses says how many times the kernel skipped each of tr's
// programs: a BPF program was already running on that CPU.
func recursionMisses(tr *tracer) string {
	var out []string
	for _, tp := range execTracepoints {
		n, err := progMisses(tr, tp)
		out = append(out, fmt.Sprintf("%s: %d (%v)", tp, n, err))
	}
	return strings.Join(out, ", ")
}

// execTracepoints are the tracepoints of execsnoop's programs.
var execTracepoints = []string{"sys_enter_execve", "sys_exit_execve"}

// skippedRuns is how many runs of the exec programs the kernel skipped
// since the tracer loaded them (recursion_misses of both).
func skippedRuns(tr *tracer) (uint64, error) {
	var total uint64
	for _, tp := range execTracepoints {
		n, err := progMisses(tr, tp)
		if err != nil {
			return 0, err
		}
		total += n
	}
	return total, nil
}

// progMisses is the recursion_misses of the program on tracepoint tp.
func progMisses(tr *tracer, tp string) (uint64, error) {
	prog, err := tr.mod.GetProgram("tracepoint__syscalls__" + tp)
	if err != nil {
		return 0, err
	}
	return kernel.ProgRecursionMisses(prog.FileDescriptor())
}

// inFlight lists the PIDs in the program's map of execs in flight: an
// exec whose entry ran and whose exit did not.
func inFlight(tr *tracer) string {
	m, err := tr.mod.GetMap("execs")
	if err != nil {
		return err.Error()
	}
	var pids []uint32
	for it := m.Iterator(); it.Next(); {
		pids = append(pids, binary.NativeEndian.Uint32(it.Key()))
	}
	return fmt.Sprint(pids)
}

func equalEvent(a, b event) bool {
	return a.TS == b.TS && a.PID == b.PID && a.PPID == b.PPID && a.UID == b.UID && a.Ret == b.Ret &&
		a.Comm == b.Comm && a.Truncated == b.Truncated && slices.Equal(a.Args, b.Args)
}

// The uid filter and the failed-exec filter run in the kernel.
func TestKernelFilters(t *testing.T) {
	const uid = 4242
	tr := openTestTracer(t, tracerConfig{uid: uid, includeFailed: false, maxArgs: 20})
	as := func(cmd *exec.Cmd) *exec.Cmd {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uid, Gid: uid}}
		return cmd
	}

	root := newToken()
	runOK(t, exec.Command("/bin/true", root))
	user := newToken()
	userPID := runOK(t, as(exec.Command("/bin/true", user)))
	failTok := newToken()
	if err := as(exec.Command("/nonexistent-"+failTok, failTok)).Run(); err == nil {
		t.Fatal("exec of a nonexistent path succeeded")
	}

	got := collect(t, tr)
	if m := find(got, root); len(m) != 0 {
		t.Errorf("uid 0 exec traced with -u %d: %+v", uid, m)
	}
	if m := find(got, failTok); len(m) != 0 {
		t.Errorf("failed exec traced without -x: %+v", m)
	}
	ev := findOne(t, got, user)
	if ev.UID != uid || ev.PID != uint32(userPID) || ev.Ret != 0 {
		t.Errorf("exec as uid %d: %+v (pid %d)", uid, ev, userPID)
	}
	for _, tc := range got {
		if tc.ev.UID != uid {
			t.Errorf("event of uid %d with -u %d: %+v", tc.ev.UID, uid, tc.ev)
		}
	}
}

// The whole command, in-process: --demo with JSON output, until 0.1 s
// after the demo.
func TestRunDemo(t *testing.T) {
	requirePrivileges(t)
	var stdout, stderr bytes.Buffer
	// -d counts from the demo's end: 0.1 s, shorter than the pauses
	// between its commands alone, still sees all of them. (It counted
	// from the start: the 16 KiB-page arm64 guest, under emulation on a
	// loaded host, ran the last command, the failed exec, after -d 2.)
	code := run([]string{"--demo", "-x", "--json", "-d", "0.1"}, &stdout, &stderr)
	if code != 0 {
		t.Fatalf("exit %d\nstderr:\n%s", code, stderr.String())
	}
	me := uint32(os.Getpid())
	var sawEcho, sawFail, sawTrunc bool
	sc := bufio.NewScanner(&stdout)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var j jsonEvent
		if err := json.Unmarshal(sc.Bytes(), &j); err != nil {
			t.Fatalf("line %q: %v", sc.Text(), err)
		}
		if j.PPID != me || len(j.Args) == 0 {
			continue
		}
		switch j.Args[0] {
		case "/bin/echo":
			sawEcho = sawEcho || (j.Comm == "echo" && j.Ret == 0 && slices.Equal(j.Args[1:], []string{"hello", "from", "perfbuf"}))
			sawTrunc = sawTrunc || (j.ArgsTruncated && len(j.Args) == 20)
		case "/nonexistent/perfbuf-demo":
			sawFail = j.Ret == -int32(syscall.ENOENT)
		}
	}
	if !sawEcho || !sawFail || !sawTrunc {
		t.Errorf("demo: echo %v, failed exec %v, truncated args %v; stdout:\n%s", sawEcho, sawFail, sawTrunc, stdout.String())
	}
	if !strings.Contains(stderr.String(), "execs traced") || !strings.Contains(stderr.String(), "0 lost") {
		t.Errorf("no summary, or events lost; stderr:\n%s", stderr.String())
	}
}

// buildHelper returns the helper of testdata/helper.c: the prebuilt binary
// named by EXECSNOOP_TEST_HELPER (a VM without a compiler: scripts/vmtest.sh),
// or one compiled here with gcc.
func buildHelper(t *testing.T) string {
	t.Helper()
	if bin := os.Getenv("EXECSNOOP_TEST_HELPER"); bin != "" {
		return bin
	}
	bin := filepath.Join(t.TempDir(), "helper")
	if out, err := exec.Command("gcc", "-O1", "-pthread", "-o", bin, filepath.Join("testdata", "helper.c")).CombinedOutput(); err != nil {
		t.Fatalf("gcc: %v\n%s", err, out)
	}
	return bin
}

// execve with an empty argv ({NULL}) is reported with the filename alone.
// (The program read argv[1] without checking argv[0], past the NULL, and
// reported whatever memory followed as arguments.)
func TestEmptyArgv(t *testing.T) {
	tr := openTestTracer(t, tracerConfig{uid: -1, includeFailed: true, maxArgs: 20})
	bin := buildHelper(t)
	tok := newToken()
	cmd := exec.Command(bin, "empty", tok)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("helper: %v\n%s", err, out)
	}
	pid := uint32(cmd.Process.Pid)
	got := collect(t, tr)
	for _, tc := range got {
		if tc.ev.PID == pid && tc.ev.Comm == "true" {
			if slices.Contains(tc.ev.Args, tok) {
				t.Errorf("exec with argc 0 reported with args %q: %q lies past argv's NULL", tc.ev.Args, tok)
			}
			return
		}
	}
	t.Fatalf("exec of /bin/true by pid %d not traced", pid)
}

// An exec whose path the program cannot read (its page not yet faulted in:
// bpf_probe_read_user_str cannot fault) is reported with its arguments, as
// the C tool reports it, and an empty path. (The program returned at once,
// and the exec was reported with no arguments at all.)
func TestUnreadablePathKeepsArgs(t *testing.T) {
	tr := openTestTracer(t, tracerConfig{uid: -1, includeFailed: true, maxArgs: 20})
	bin := buildHelper(t)
	tok := newToken()
	file := filepath.Join(t.TempDir(), "path")
	if err := os.WriteFile(file, []byte("/bin/true\x00"), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "untouched", tok, file)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("helper: %v\n%s", err, out)
	}
	m := find(collect(t, tr), tok)
	if len(m) != 1 {
		t.Fatalf("exec with an untouched path: %d events carry its argument, want 1", len(m))
	}
	if ev := m[0].ev; ev.Ret != 0 || len(ev.Args) != 2 || ev.Args[1] != tok {
		t.Errorf("exec with an untouched path: ret %d args %q; want 0 and [<path or empty> %s]", ev.Ret, ev.Args, tok)
	}
}

// A successful execve from a thread other than the leader is traced, and
// leaves nothing in the map of execs in flight. (That map was keyed by
// thread id; at sys_exit the thread has the leader's id, so the exec was
// dropped uncounted and its entry leaked: 10240 such execs, and nothing
// more was traced.)
func TestExecFromThread(t *testing.T) {
	tr := openTestTracer(t, tracerConfig{uid: -1, includeFailed: true, maxArgs: 20})
	bin := buildHelper(t)
	tok := newToken()
	cmd := exec.Command(bin, "thread", tok)
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("helper: %v\n%s", err, out)
	}
	tid, err := strconv.ParseUint(strings.TrimSpace(string(out)), 10, 32)
	if err != nil {
		t.Fatalf("helper output %q: %v", out, err)
	}
	got := collect(t, tr)
	if m := find(got, tok); len(m) != 1 {
		t.Errorf("exec from a non-leader thread (pid %d, tid %d): %d events, want 1",
			cmd.Process.Pid, tid, len(m))
	}
	// The map is keyed by the kernel's tgid, which a test in a PID
	// namespace of its own does not know: look for the token instead.
	execs, err := tr.mod.GetMap("execs")
	if err != nil {
		t.Fatal(err)
	}
	it := execs.Iterator()
	for it.Next() {
		v, err := execs.GetValue(unsafe.Pointer(&it.Key()[0]))
		if err != nil {
			continue // gone since
		}
		var ev event
		if decodeEvent(v, &ev) == nil && slices.Contains(ev.Args, tok) {
			t.Errorf("execs[%d] left behind after the process exited: a leak that fills the map (10240 entries)",
				binary.NativeEndian.Uint32(it.Key()))
		}
	}
	if err := it.Err(); err != nil {
		t.Errorf("iterate execs: %v", err)
	}
}

// Events dropped because a ring was full are counted even when no later
// event fits to carry the kernel's lost record: the BPF program counts its
// failed outputs (kernelCounts). A burst just before the end used to go
// neither delivered nor counted.
func TestLossAtTheEndCounted(t *testing.T) {
	tr := openTestTracer(t, tracerConfig{uid: -1, includeFailed: true, maxArgs: totalMaxArgs})
	tok := newToken()
	argv := []string{tok}
	for len(argv) < totalMaxArgs {
		argv = append(argv, strings.Repeat(fmt.Sprint(len(argv)%10), argSize-1))
	}
	const n = 120 // ~7.7 KiB each: far more than two 256 KiB rings hold
	for i := 0; i < n; i++ {
		if err := exec.Command("/bin/true", argv...).Run(); err != nil {
			t.Fatal(err)
		}
	}
	tr.rd.Flush()
	var (
		s               perfbuf.Sample
		delivered, lost uint64
	)
	for {
		err := tr.rd.ReadInto(&s)
		if err != nil {
			break
		}
		if s.Type == perfbuf.RecordLost {
			lost += s.Lost
			continue
		}
		var ev event
		if decodeEvent(s.Data, &ev) == nil && len(ev.Args) > 1 && ev.Args[1] == tok {
			delivered++
		}
	}
	kc, err := tr.kernelCounts()
	if err != nil {
		t.Fatal(err)
	}
	dropped, untraced := kc.notOutput, kc.untraced
	// Other execs on the machine may be dropped too: at least ours.
	if delivered+dropped < n || dropped < lost {
		t.Errorf("%d execs: %d delivered, %d counted dropped (%d reported lost by the rings, %d untraced)",
			n, delivered, dropped, lost, untraced)
	}
	t.Logf("%d execs: %d delivered, %d dropped, %d reported lost by the rings", n, delivered, dropped, lost)
}

// traceOne execs /bin/true with a token and wants the exec traced once.
func traceOne(t *testing.T, tr *tracer) {
	t.Helper()
	tok := newToken()
	pid := runOK(t, exec.Command("/bin/true", tok))
	if ev := findOne(t, collect(t, tr), tok); ev.PID != uint32(pid) {
		t.Errorf("exec of pid %d traced as pid %d", pid, ev.PID)
	}
}

// The built-in object loads and traces from any working directory, with no
// object file in sight: the executable stands on its own.
func TestBuiltInObjectLoads(t *testing.T) {
	requirePrivileges(t)
	t.Chdir(t.TempDir())
	traceOne(t, openTestTracer(t, tracerConfig{uid: -1, maxArgs: 20}))
}

// --bpf-obj loads the object it names (TestBPFObjOverrides shows that it
// is the one opened).
func TestBPFObjPathLoads(t *testing.T) {
	requirePrivileges(t)
	obj, err := bpfDir.ReadFile(embeddedObj)
	if err != nil {
		t.Fatal(err) // errNoObject: run make bpf
	}
	path := filepath.Join(t.TempDir(), "copy.bpf.o")
	if err := os.WriteFile(path, obj, 0o644); err != nil {
		t.Fatal(err)
	}
	traceOne(t, openTestTracer(t, tracerConfig{objPath: path, uid: -1, maxArgs: 20}))
}
