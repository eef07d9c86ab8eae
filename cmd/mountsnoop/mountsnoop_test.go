// SPDX-License-Identifier: Apache-2.0

package main

// Privileged tests: the real BPF program (built by `make bpf`), attached to
// the mount and umount tracepoints, with `events` made a BPF ring buffer
// and a perf event array in turn; the test makes known calls itself, on a
// thread of its own in a private mount namespace, so that nothing else on
// the machine sees them.

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/perfbuf/perfbuf"
	"github.com/perfbuf/perfbuf/bpfbuffer"
	"golang.org/x/sys/unix"
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

// kinds are the buffer kinds every privileged test runs with: what the
// kernel allows (a ring buffer per CPU from Linux 5.8), one ring buffer
// shared by every CPU (the C tool's), and a perf event array forced.
var kinds = []bpfbuffer.Kind{bpfbuffer.Any, bpfbuffer.RingBuf, bpfbuffer.PerfEventArray}

func openTestTracer(t *testing.T, cfg tracerConfig) *tracer {
	t.Helper()
	requirePrivileges(t)
	tr, err := openTracer(cfg)
	if err != nil {
		t.Fatal(err) // a missing object says to run `make bpf`
	}
	t.Cleanup(tr.close)
	if cfg.buffer != bpfbuffer.Any && tr.kind != cfg.buffer {
		t.Fatalf("asked for a %v, got a %v", cfg.buffer, tr.kind)
	}
	return tr
}

// collect flushes the reader and returns every event it delivers until the
// flush completes: everything the test's calls wrote, as the exit
// tracepoint has run before the call returns.
func collect(t *testing.T, tr *tracer) []event {
	t.Helper()
	tr.rd.SetDeadline(time.Now().Add(10 * time.Second))
	tr.rd.Flush()
	var (
		out []event
		s   perfbuf.Sample
	)
	for {
		err := tr.rd.ReadInto(&s)
		if errors.Is(err, perfbuf.ErrFlushed) {
			return out
		}
		if err != nil {
			t.Fatalf("read: %v", err)
		}
		if s.Type == perfbuf.RecordLost {
			t.Errorf("cpu %d lost %d events", s.CPU, s.Lost)
			continue
		}
		if s.Late {
			t.Errorf("ring %d: a late event (key %d) in a flush of what the rings held", s.Ring, s.Key)
		}
		if tr.kind != bpfbuffer.PerfEventArray && s.CPU != -1 {
			t.Errorf("a ring buffer's record with cpu %d, want -1", s.CPU)
		}
		var ev event
		if err := decodeEvent(s.Data, &ev); err != nil {
			t.Fatalf("cpu %d: %v", s.CPU, err)
		}
		out = append(out, ev)
	}
}

// nsThread is what ran on the test's private thread.
type nsThread struct {
	tid   uint32
	mntNS uint32
	errs  []error // each call's result, in order
}

// inPrivateMountNS runs calls on a thread of its own, in a mount namespace
// of its own in which every mount is private, so that neither its mounts
// nor their propagation reach the machine; the thread ends with it (the
// goroutine exits locked to it). It returns the thread's id, its
// namespace's inode, and what each call returned.
func inPrivateMountNS(t *testing.T, calls ...func() error) nsThread {
	t.Helper()
	type result struct {
		th  nsThread
		err error
	}
	ch := make(chan result, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread exits with the goroutine
		var r result
		defer func() { ch <- r }()
		// On one CPU, the first it may run on: with a ring per CPU, the
		// thread's events go to one ring, as with a ring shared by every
		// CPU.
		var set unix.CPUSet
		if r.err = unix.SchedGetaffinity(0, &set); r.err != nil {
			r.err = fmt.Errorf("sched_getaffinity: %w", r.err)
			return
		}
		for cpu := 0; ; cpu++ {
			if set.IsSet(cpu) {
				set.Zero()
				set.Set(cpu)
				break
			}
		}
		if r.err = unix.SchedSetaffinity(0, &set); r.err != nil {
			r.err = fmt.Errorf("sched_setaffinity: %w", r.err)
			return
		}
		if r.err = unix.Unshare(unix.CLONE_NEWNS); r.err != nil {
			r.err = fmt.Errorf("unshare(CLONE_NEWNS): %w", r.err)
			return
		}
		if r.err = unix.Mount("none", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); r.err != nil {
			r.err = fmt.Errorf("make / private: %w", r.err)
			return
		}
		var st unix.Stat_t
		if r.err = unix.Stat("/proc/thread-self/ns/mnt", &st); r.err != nil {
			return
		}
		r.th = nsThread{tid: uint32(unix.Gettid()), mntNS: uint32(st.Ino)}
		for _, c := range calls {
			r.th.errs = append(r.th.errs, c())
		}
	}()
	r := <-ch
	if r.err != nil {
		t.Fatal(r.err)
	}
	return r.th
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

// ofThread returns the events of thread tid.
func ofThread(evs []event, tid uint32) []event {
	var out []event
	for _, ev := range evs {
		if ev.TID == tid {
			out = append(out, ev)
		}
	}
	return out
}

// Every field of five known calls, on both buffer kinds: a mount that
// makes every mount private, a mount, a umount, a umount that fails, a mount of a file system type that does not
// exist (whose name the event cuts to 7 bytes, as the C tool's does).
func TestTraceMounts(t *testing.T) {
	for _, kind := range kinds {
		t.Run(kind.String(), func(t *testing.T) {
			tr := openTestTracer(t, tracerConfig{buffer: kind})
			// Another tracer, for another process only: sees none of the calls.
			other := openTestTracer(t, tracerConfig{buffer: kind, pid: 1})
			t.Logf("events is a %v", tr.kind)

			tok := newToken()
			dir := filepath.Join(t.TempDir(), tok)
			if err := os.Mkdir(dir, 0o755); err != nil {
				t.Fatal(err)
			}
			missing := filepath.Join(dir, "missing")
			const flags = unix.MS_NOSUID | unix.MS_NODEV
			data := "size=16k,mode=0700"
			th := inPrivateMountNS(t,
				func() error { return unix.Mount(tok, dir, "tmpfs", flags, data) },
				func() error { return unix.Unmount(dir, 0) },
				func() error { return unix.Unmount(missing, unix.MNT_DETACH) },
				func() error { return unix.Mount(tok+"-bad", dir, "perfbufnofs", unix.MS_RDONLY, "") },
			)
			wantErrs := []error{nil, nil, unix.ENOENT, unix.ENODEV}
			for i, err := range th.errs {
				if err != wantErrs[i] {
					t.Fatalf("call %d: %v, want %v", i, err, wantErrs[i])
				}
			}

			got := ofThread(collect(t, tr), th.tid)
			pid, comm := uint32(os.Getpid()), ownComm(t)
			want := []event{
				{Op: opMount, Flags: unix.MS_REC | unix.MS_PRIVATE, Src: "none", Dest: "/"}, // inPrivateMountNS's
				{Op: opMount, Flags: flags, Ret: 0, Src: tok, Dest: dir, FS: "tmpfs", Data: data},
				{Op: opUmount, Flags: 0, Ret: 0, Dest: dir},
				{Op: opUmount, Flags: unix.MNT_DETACH, Ret: -int32(unix.ENOENT), Dest: missing},
				{Op: opMount, Flags: unix.MS_RDONLY, Ret: -int32(unix.ENODEV), Src: tok + "-bad", Dest: dir, FS: "perfbuf"},
			}
			if len(got) != len(want) {
				t.Fatalf("%d events of thread %d, want %d: %+v", len(got), th.tid, len(want), got)
			}
			for i, ev := range got {
				w := want[i]
				w.TS, w.Delta = ev.TS, ev.Delta
				w.PID, w.TID, w.MntNS, w.Comm = pid, th.tid, th.mntNS, comm
				if ev != w {
					t.Errorf("event %d:\n got %+v\nwant %+v", i, ev, w)
				}
				if ev.Delta == 0 || ev.Delta > uint64(10*time.Second) {
					t.Errorf("event %d: latency %d ns", i, ev.Delta)
				}
				if i > 0 && ev.TS < got[i-1].TS { // delivered in ts order (Order)
					t.Errorf("event %d at %d after event %d at %d", i, ev.TS, i-1, got[i-1].TS)
				}
			}
			var p printer
			line := string(p.appendEvent(nil, &got[1]))
			wantLine := fmt.Sprintf("%-16s %-7d %-7d %-11d mount(\"%s\", \"%s\", \"tmpfs\", MS_NOSUID | MS_NODEV, \"%s\") = 0\n",
				comm, pid, th.tid, th.mntNS, tok, dir, data)
			if line != wantLine {
				t.Errorf("line:\n got %q\nwant %q", line, wantLine)
			}
			if evs := ofThread(collect(t, other), th.tid); len(evs) != 0 {
				t.Errorf("-p 1 traced the test's calls: %+v", evs)
			}
		})
	}
}

// Calls made on two CPUs in turn (one thread, moved between them), read
// after the last: the reader delivers them in the order they were made, the
// CPUs' rings merged by the events' ts, on every kind (with a ring per CPU
// or a perf event array they are in two rings; the default Reader, without
// Order, drained one ring, then the other). With one CPU allowed, the calls
// are all on it.
func TestOrderAcrossCPUs(t *testing.T) {
	const umounts = 20 // 10 a CPU; with inPrivateMountNS's mount, 21 fit in one 256 KiB ring
	var set unix.CPUSet
	if err := unix.SchedGetaffinity(0, &set); err != nil {
		t.Fatalf("sched_getaffinity: %v", err)
	}
	var cpus []int
	for cpu := 0; len(cpus) < 2 && cpu < 1024; cpu++ {
		if set.IsSet(cpu) {
			cpus = append(cpus, cpu)
		}
	}
	if len(cpus) < 2 {
		t.Logf("one CPU allowed (%v): every call on it", cpus)
		cpus = append(cpus, cpus[0])
	}
	for _, kind := range kinds {
		t.Run(kind.String(), func(t *testing.T) {
			tr := openTestTracer(t, tracerConfig{buffer: kind, pid: os.Getpid()})
			dir := t.TempDir()
			var fns []func() error
			for i := range umounts {
				cpu := cpus[i%2]
				path := filepath.Join(dir, fmt.Sprintf("missing-%02d-cpu%d", i, cpu))
				fns = append(fns, func() error {
					var on unix.CPUSet
					on.Set(cpu)
					// The calling thread moves to cpu before this returns.
					if err := unix.SchedSetaffinity(0, &on); err != nil {
						return fmt.Errorf("sched_setaffinity to cpu %d: %w", cpu, err)
					}
					if err := unix.Unmount(path, 0); err != unix.ENOENT {
						return fmt.Errorf("umount %s: %v, want ENOENT", path, err)
					}
					return nil
				})
			}
			th := inPrivateMountNS(t, fns...)
			for i, err := range th.errs {
				if err != nil {
					t.Fatalf("call %d: %v", i, err)
				}
			}
			var got []string
			for _, ev := range ofThread(collect(t, tr), th.tid) {
				if ev.Op == opUmount {
					got = append(got, filepath.Base(ev.Dest))
				}
			}
			var want []string
			for i := range umounts {
				want = append(want, fmt.Sprintf("missing-%02d-cpu%d", i, cpus[i%2]))
			}
			if !slices.Equal(got, want) {
				t.Errorf("umounts in the order\n%v\nwant the order they were made in\n%v", got, want)
			}
			var rings []string
			for i, s := range tr.rd.Stats().Rings {
				if s.Samples > 0 {
					rings = append(rings, fmt.Sprintf("ring %d (cpu %d): %d", i, s.CPU, s.Samples))
				}
			}
			t.Logf("%v: %d umounts on cpus %v; %s", tr.kind, len(got), cpus, strings.Join(rings, ", "))
		})
	}
}

// Calls the ring cannot hold while nobody reads: every one is accounted
// for once the reader is closed, as lost: the ring buffer's surplus as the
// failure map counts its full reserves, the perf event array's as lost
// records. Only this process's calls are traced (-p).
func TestFullRing(t *testing.T) {
	// 29 events of 8776 bytes fit in 256 KiB; inPrivateMountNS's mount of
	// / is one more call.
	const umounts = 40
	const calls = umounts + 1
	for _, kind := range kinds {
		t.Run(kind.String(), func(t *testing.T) {
			tr := openTestTracer(t, tracerConfig{buffer: kind, pid: os.Getpid()})
			missing := filepath.Join(t.TempDir(), "missing")
			var fns []func() error
			for range umounts {
				fns = append(fns, func() error { return unix.Unmount(missing, 0) })
			}
			th := inPrivateMountNS(t, fns...)
			got := collect(t, tr)
			if n := len(ofThread(got, th.tid)); n != len(got) {
				t.Errorf("%d events of other threads with -p %d", len(got)-n, os.Getpid())
			}
			tr.rd.Close()
			st := tr.rd.Stats()
			perfFull, err := tr.perfFull()
			if err != nil {
				t.Fatal(err)
			}
			samples, left, f := st.Samples, st.Left, st.Failed
			// The lost records the kernel wrote, or the BPF program's count
			// where it wrote none (no event came after the ring filled); a
			// ring buffer's full reserves.
			lost := max(st.Lost, perfFull)
			if samples != uint64(len(got)) || samples+lost+left+f.Total() != calls {
				t.Errorf("%d read; %d samples + %d lost + %d left + %d failed, want %d in all",
					len(got), samples, lost, left, f.Total(), calls)
			}
			perRing := uint64(ringBytes / (eventSize + 8)) // a ring buffer record's header
			if tr.kind != bpfbuffer.PerfEventArray && (samples != perRing || st.Lost != calls-perRing || f.Total() != 0) {
				t.Errorf("ring buffer: %d samples, %d lost, %d failed; want %d, %d and 0", samples, st.Lost, f.Total(), perRing, calls-perRing)
			}
			var summary bytes.Buffer
			writeSummary(&summary, tr.kind, counts{events: samples, perfFull: perfFull}, st, time.Second)
			wantText := fmt.Sprintf("%d calls traced, %d lost in", samples, calls-samples)
			if !strings.Contains(summary.String(), wantText) {
				t.Errorf("summary without the full ring:\n%s", summary.String())
			}
			t.Logf("summary:\n%s", summary.String())
		})
	}
}

// The whole command, in-process, on every kind: mounts made until it ends
// are printed, and the summary names the buffer's kind.
func TestRun(t *testing.T) {
	requirePrivileges(t)
	for _, kind := range kinds {
		t.Run(kind.String(), func(t *testing.T) {
			tok := newToken()
			dir := filepath.Join(t.TempDir(), tok)
			if err := os.Mkdir(dir, 0o755); err != nil {
				t.Fatal(err)
			}
			var stdout, stderr bytes.Buffer
			done := make(chan int)
			go func() {
				done <- run([]string{"-t", "--duration", "1.5", "--buffer", kind.String()}, &stdout, &stderr)
			}()
			// Mount until the command ends: the first may come before it attached.
			var code int
		loop:
			for i := 0; ; i++ {
				src := fmt.Sprintf("%s-%d", tok, i)
				inPrivateMountNS(t, func() error { return unix.Mount(src, dir, "tmpfs", 0, "size=4k") })
				select {
				case code = <-done:
					break loop
				case <-time.After(50 * time.Millisecond):
				}
			}
			if code != 0 {
				t.Fatalf("exit %d\nstderr:\n%s", code, stderr.String())
			}
			lines := strings.Split(stdout.String(), "\n")
			if lines[0] != fmt.Sprintf("%-8s %-16s %-7s %-7s %-11s %s", "TIME", "COMM", "PID", "TID", "MNT_NS", "CALL") {
				t.Errorf("header %q", lines[0])
			}
			re := regexp.MustCompile(`^\d\d:\d\d:\d\d \S+ +\d+ +\d+ +\d+ +mount\("` + regexp.QuoteMeta(tok) +
				`-\d+", "` + regexp.QuoteMeta(dir) + `", "tmpfs", 0x0, "size=4k"\) = 0$`)
			n := 0
			for _, l := range lines {
				if strings.Contains(l, tok) {
					if !re.MatchString(l) {
						t.Errorf("line %q", l)
					}
					n++
				}
			}
			if n == 0 {
				t.Errorf("no mount traced\nstdout:\n%s", stdout.String())
			}
			wantKind := "from " + kindText(kind)
			if kind == bpfbuffer.Any {
				wantKind = "from a " // a ring buffer per CPU, or a perf event array on an old kernel
			}
			if !strings.Contains(stderr.String(), " calls traced, 0 lost") || !strings.Contains(stderr.String(), wantKind) {
				t.Errorf("summary:\n%s", stderr.String())
			}
			t.Logf("%d mounts traced; stderr:\n%s", n, stderr.String())
		})
	}
}
