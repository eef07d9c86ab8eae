// SPDX-License-Identifier: Apache-2.0

package main

// Privileged tests of PID namespaces: execsnoop prints PIDs as its own
// namespace numbers them (what ps shows beside it), not as the kernel does,
// so that it and its tests work in a container without the host's PID
// namespace.

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/perfbuf/perfbuf/cmd/internal/tool"
	"golang.org/x/sys/unix"
)

// envOwnPIDNS marks the run of this test binary that TestInOwnPIDNamespace
// starts as the init of a new PID namespace, in a new mount namespace.
const envOwnPIDNS = "EXECSNOOP_TEST_OWN_PIDNS"

// initPIDNSIno is the inode number of the initial PID namespace
// (PROC_PID_INIT_INO in include/linux/proc_ns.h).
const initPIDNSIno = 0xeffffffc

func TestMain(m *testing.M) {
	if os.Getenv(envOwnPIDNS) != "" {
		if err := mountOwnProc(); err != nil {
			fmt.Fprintf(os.Stderr, "execsnoop tests in a PID namespace of their own: %v\n", err)
			os.Exit(1)
		}
	}
	os.Exit(m.Run())
}

// mountOwnProc mounts a /proc of the process's PID namespace over /proc, in
// its own mount namespace, as a container has: its /proc/self/status then
// shows one NSpid, whatever the namespace's depth.
func mountOwnProc() error {
	if err := unix.Mount("none", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("make / private: %w", err)
	}
	if err := unix.Mount("proc", "/proc", "proc", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
		return fmt.Errorf("mount proc: %w", err)
	}
	return nil
}

// startInNewNS starts cmd, whose SysProcAttr asks for new namespaces; a
// missing privilege stops the test with one line that says so.
func startInNewNS(t *testing.T, cmd *exec.Cmd) {
	t.Helper()
	if err := cmd.Start(); err != nil {
		if errors.Is(err, syscall.EPERM) {
			t.Fatalf("cannot create a PID namespace (%v): it needs CAP_SYS_ADMIN; run the tests privileged (docs/docker.md)", err)
		}
		t.Fatalf("%s: %v", cmd, err)
	}
}

// nestedTests are the tests that TestInOwnPIDNamespace runs again as the
// init of a PID namespace of their own: every test that compares the PIDs
// it knows with those traced.
var nestedTests = []string{
	"TestTraceExecs", "TestKernelFilters", "TestRunDemo", "TestEmptyArgv", "TestExecFromThread",
	"TestBuiltInObjectLoads", "TestBPFObjPathLoads", "TestOwnExecPIDs", "TestChildPIDNamespace",
}

// The PID-checking tests pass as the init (PID 1) of a new PID namespace
// with its own /proc, as in a container started without --pid=host. (They
// failed there: execsnoop printed the kernel's PIDs, "exec of pid 3 traced
// as pid 27648".)
func TestInOwnPIDNamespace(t *testing.T) {
	requirePrivileges(t)
	if os.Getenv(envOwnPIDNS) != "" {
		t.Skip("already in a PID namespace of its own")
	}
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, exe, "-test.run=^("+strings.Join(nestedTests, "|")+")$",
		"-test.count=1", "-test.v", "-test.timeout=150s")
	cmd.Env = append(os.Environ(), envOwnPIDNS+"=1")
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWPID | syscall.CLONE_NEWNS}
	var out bytes.Buffer
	cmd.Stdout = &out
	cmd.Stderr = &out
	startInNewNS(t, cmd)
	err = cmd.Wait()
	var missing []string
	for _, name := range nestedTests {
		if !bytes.Contains(out.Bytes(), []byte("--- PASS: "+name+" ")) {
			missing = append(missing, name)
		}
	}
	if err != nil || len(missing) > 0 {
		// Prefixed, so that its "--- FAIL" lines are not counted as ours.
		var b strings.Builder
		for sc := bufio.NewScanner(&out); sc.Scan(); {
			fmt.Fprintf(&b, "  nested| %s\n", sc.Text())
		}
		t.Fatalf("as init of a PID namespace of their own: %v; not passed: %s\n%s", err, strings.Join(missing, " "), b.String())
	}
	t.Logf("%d tests passed as init of a PID namespace of their own", len(nestedTests))
}

// The test's own exec, failing so that the test goes on, is traced with the
// PID and PPID that getpid and getppid give: in TestInOwnPIDNamespace,
// PID 1, and PPID 0 for a parent outside the namespace, as /proc shows it.
func TestOwnExecPIDs(t *testing.T) {
	tr := openTestTracer(t, tracerConfig{uid: -1, includeFailed: true, maxArgs: 20})
	tok := newToken()
	path := "/nonexistent-" + tok
	if err := syscall.Exec(path, []string{path, tok}, nil); !errors.Is(err, syscall.ENOENT) {
		t.Fatalf("exec %s: %v, want ENOENT", path, err)
	}
	ev := findOne(t, collect(t, tr), tok)
	if pid, ppid := uint32(os.Getpid()), uint32(os.Getppid()); ev.PID != pid || ev.PPID != ppid {
		t.Errorf("own exec traced as pid %d ppid %d, want pid %d ppid %d", ev.PID, ev.PPID, pid, ppid)
	}
}

// Execs in a PID namespace below the test's, traced three ways at once: as
// that namespace numbers them, as the test's own does, as the kernel does.
// In the child namespace, its init (a shell) is PID 1 with PPID 0 (its
// parent is outside), the shell's child is PID 2 with PPID 1, and the test's
// own exec, outside it, is not output but counted. (execsnoop printed the
// kernel's PIDs only.)
func TestChildPIDNamespace(t *testing.T) {
	requirePrivileges(t)
	tok := newToken()
	sh := exec.Command("/bin/sh", "-c", `read _ && /bin/true "$0" child && exec /bin/true "$0" init`, tok)
	sh.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWPID}
	stdin, err := sh.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	startInNewNS(t, sh)
	t.Cleanup(func() { sh.Process.Kill(); sh.Wait() })
	inChild := openTestTracer(t, tracerConfig{uid: -1, maxArgs: 20, pidns: fmt.Sprintf("/proc/%d/ns/pid", sh.Process.Pid)})
	inOwn := openTestTracer(t, tracerConfig{uid: -1, maxArgs: 20})
	inKernel := openTestTracer(t, tracerConfig{uid: -1, maxArgs: 20, kernelPIDs: true})
	// The shell waits for this line, so that its execs come after the attach.
	if _, err := stdin.Write([]byte("\n")); err != nil {
		t.Fatal(err)
	}
	if err := sh.Wait(); err != nil {
		t.Fatalf("shell in a new PID namespace: %v", err)
	}
	outside := uint32(runOK(t, exec.Command("/bin/true", tok, "outside")))
	me, shPID := uint32(os.Getpid()), uint32(sh.Process.Pid)

	// roles returns the events of tr by their last argument.
	roles := func(name string, tr *tracer) (map[string]event, kernelCounts) {
		t.Helper()
		m := map[string]event{}
		for _, tc := range find(collect(t, tr), tok) {
			if len(tc.ev.Args) != 3 {
				t.Fatalf("%s: args %q", name, tc.ev.Args)
			}
			if _, dup := m[tc.ev.Args[2]]; dup {
				t.Fatalf("%s: two events for the %s exec", name, tc.ev.Args[2])
			}
			m[tc.ev.Args[2]] = tc.ev
		}
		kc, err := tr.kernelCounts()
		if err != nil {
			t.Fatal(err)
		}
		return m, kc
	}
	type ids struct{ pid, ppid uint32 }
	check := func(name string, m map[string]event, role string, want ids) {
		t.Helper()
		ev, ok := m[role]
		if !ok {
			t.Errorf("%s: the %s exec not traced", name, role)
			return
		}
		if want.pid == 0 { // a PID this test cannot know
			want.pid = ev.PID
		}
		if got := (ids{ev.PID, ev.PPID}); got != want {
			t.Errorf("%s: the %s exec traced as pid %d ppid %d, want pid %d ppid %d", name, role, got.pid, got.ppid, want.pid, want.ppid)
		}
	}

	m, kc := roles("child's numbers", inChild)
	check("child's numbers", m, "init", ids{1, 0})
	check("child's numbers", m, "child", ids{2, 1})
	if ev, ok := m["outside"]; ok {
		t.Errorf("child's numbers: the exec outside the namespace traced as pid %d ppid %d", ev.PID, ev.PPID)
	}
	if kc.otherPIDNS < 1 {
		t.Errorf("child's numbers: %d execs counted outside the namespace, want at least 1 (the test's)", kc.otherPIDNS)
	}

	m, _ = roles("own numbers", inOwn)
	check("own numbers", m, "init", ids{shPID, me})
	check("own numbers", m, "child", ids{0, shPID})
	check("own numbers", m, "outside", ids{outside, me})

	m, kc = roles("kernel's numbers", inKernel)
	if kc.otherPIDNS != 0 {
		t.Errorf("kernel's numbers: %d execs counted outside a namespace", kc.otherPIDNS)
	}
	if ino, err := tool.PIDNamespace(""); err != nil || ino != initPIDNSIno {
		// In a namespace of its own, the test knows no kernel PIDs.
		for _, role := range []string{"init", "child", "outside"} {
			if ev, ok := m[role]; !ok || ev.PID == 0 || ev.PPID == 0 {
				t.Errorf("kernel's numbers: the %s exec: %+v (traced %v)", role, ev, ok)
			}
		}
		return
	}
	check("kernel's numbers", m, "init", ids{shPID, me})
	check("kernel's numbers", m, "child", ids{0, shPID})
	check("kernel's numbers", m, "outside", ids{outside, me})
}
