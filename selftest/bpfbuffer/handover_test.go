// SPDX-License-Identifier: Apache-2.0

package bpfbuffer

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/perfbuf/perfbuf"
	"github.com/perfbuf/perfbuf/bpfbuffer"
	"github.com/perfbuf/perfbuf/selftest/internal/bpftest"
	"github.com/perfbuf/perfbuf/selftest/internal/child"
	"github.com/perfbuf/perfbuf/selftest/internal/pins"
	"golang.org/x/sys/unix"
)

// handoverDir, set in a child's environment, names the bpffs directory of
// the pinned maps that TestHandoverChild reads.
const handoverDir = "PERFBUF_HANDOVER_DIR"

// A pinned ring buffer read across an agent's upgrade: two processes, each
// with its Reader and the same pinned failure map. The new one opens, then
// the old one closes: outputs keep reaching the ring, and the new reader,
// which reads nothing while the old one holds the ring (its consumer
// lock), takes over and receives them all; the last reader's Close marks
// the key closed, and outputs fail from then on (noent). Before it, a
// process that opens a reader and closes it again, while the old one
// reads, takes nothing from the old one either. Every output is accounted for, exactly: what the
// program output == what the readers received + what failed.
// (The old reader's Close marked the key closed for everyone: the new
// reader received only what was in the ring at that Close.)
func TestHandover(t *testing.T) {
	opts := perfbuf.Options{}
	f := setup(t, bpfbuffer.RingBuf, &opts)
	if f.kind != bpfbuffer.RingBuf {
		t.Fatalf("the buffer became a %v", f.kind)
	}
	dir := pins.Dir(t)
	for name, m := range map[string]interface{ Pin(string) error }{"events": f.events, "events_failures": f.failures} {
		if err := m.Pin(filepath.Join(dir, name)); err != nil {
			t.Fatal(err)
		}
	}
	const perCPU = 10
	n := uint64(len(f.cpus))
	produce := func() {
		t.Helper()
		for _, cpu := range f.cpus {
			f.produce(t, cpu, perCPU, 48, viaOutput, 1)
		}
	}
	before := f.outcomes(t)
	failedBefore := bpftest.PerCPU[mapFailures](t, f.mod, "events_failures")

	// The old process's reader (this one).
	old, err := perfbuf.NewReader(f.events, perfbuf.ReaderOptions{Options: perfbuf.Options{FailureMap: f.failures}})
	if err != nil {
		t.Fatal(err)
	}
	defer old.Close()
	var oldGot uint64
	consume := func() {
		t.Helper()
		k, err := old.Consume(func(rec *perfbuf.Record) error {
			if rec.Type == perfbuf.RecordSample {
				oldGot++
			}
			return nil
		})
		if err != nil {
			t.Fatalf("old reader: Consume = %d, %v", k, err)
		}
	}
	produce()
	consume()

	// A new process opens a reader and gives up: the old one reads on.
	tried := startChild(t, dir)
	tried.MustDo(t, "close")
	produce()
	consume()
	if want := 2 * perCPU * n; oldGot != want {
		t.Errorf("the old reader received %d, want %d: another process's reader closing took its outputs", oldGot, want)
	}

	// The upgrade: the new process opens, outputs land in the ring, the
	// old one closes, outputs go on landing, the new one reads them all.
	upgraded := startChild(t, dir)
	produce()
	if got := upgraded.Count(t, "consume"); got != 0 {
		t.Errorf("the new reader received %d while the old one was open, want 0", got)
	}
	if err := old.Close(); err != nil {
		t.Fatal(err)
	}
	oldSt := old.Stats().Rings[0]
	if oldSt.Samples != oldGot || oldSt.Left != perCPU*n {
		t.Errorf("the old reader's Stats: %d samples, %d left; want %d, %d", oldSt.Samples, oldSt.Left, oldGot, perCPU*n)
	}
	produce()
	// A read that waits: the new reader takes the ring over within the
	// takeover's poll, and a Consume before that delivers nothing.
	newGot := upgraded.Count(t, fmt.Sprintf("read %d", 2*perCPU*n))
	produce()
	newGot += upgraded.Count(t, "consume")
	if want := 3 * perCPU * n; newGot != want {
		t.Errorf("the new reader received %d, want %d (%d left by the old one and %d output since)", newGot, want, perCPU*n, 2*perCPU*n)
	}
	closed := upgraded.MustDo(t, "close")
	mark := bpftest.PerCPUAt[readerMark](t, f.mod, "events_failures", 1)

	// The last reader is gone: outputs fail in the program.
	produce()
	after := f.outcomes(t)
	failedAfter := bpftest.PerCPU[mapFailures](t, f.mod, "events_failures")
	var attempts, ok, noent, failed uint64
	for _, cpu := range f.cpus {
		a, b := after[cpu], before[cpu]
		attempts += a.Attempts - b.Attempts
		ok += a.OK - b.OK
		noent += a.NoEnt - b.NoEnt
		failed += failedAfter[cpu].Total() - failedBefore[cpu].Total()
	}
	t.Logf("%d output = received %d (old) + %d (new) + failed %d (noent %d); the new reader at Close: %s",
		attempts, oldGot, newGot, failed, noent, closed)
	if attempts != 6*perCPU*n || ok != oldGot+newGot || attempts != oldGot+newGot+failed || noent != perCPU*n || failed != noent {
		t.Errorf("ledger: %d output, %d into the ring; received %d (old) + %d (new); failed %d (noent %d); want %d output, all received but the last %d (noent); the reader key after the last Close, by CPU: %+v",
			attempts, ok, oldGot, newGot, failed, noent, 6*perCPU*n, perCPU*n, mark)
	}
	if want := fmt.Sprintf("samples %d left 0", newGot); closed != want {
		t.Errorf("the new reader at Close: %s, want %s", closed, want)
	}
}

// A reader killed with SIGKILL (the OOM killer's way) leaves nothing that
// changes what the next reader or the programs see: the next agent's Pause
// works, and its Close, the last of a live reader, makes the programs'
// outputs fail, counted. Every output is accounted for, exactly. (The dead
// reader's count stayed in the reader key: Pause failed with ErrMapInUse,
// and outputs after the last Close landed in a ring nobody read.)
func TestReaderKilled(t *testing.T) {
	opts := perfbuf.Options{}
	f := setup(t, bpfbuffer.RingBuf, &opts)
	dir := pins.Dir(t)
	for name, m := range map[string]interface{ Pin(string) error }{"events": f.events, "events_failures": f.failures} {
		if err := m.Pin(filepath.Join(dir, name)); err != nil {
			t.Fatal(err)
		}
	}
	const perCPU = 10
	n := uint64(len(f.cpus))
	produce := func() {
		t.Helper()
		for _, cpu := range f.cpus {
			f.produce(t, cpu, perCPU, 48, viaOutput, 1)
		}
	}
	before := f.outcomes(t)
	failedBefore := bpftest.PerCPU[mapFailures](t, f.mod, "events_failures")

	killed := startChild(t, dir)
	produce() // into the ring, for the next reader
	if err := killed.Kill(); err != nil {
		t.Fatal(err)
	}

	r, err := perfbuf.NewReader(f.events, perfbuf.ReaderOptions{Options: perfbuf.Options{FailureMap: f.failures}})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if err := r.Pause(); err != nil {
		t.Fatalf("Pause after the other reader was killed: %v", err)
	}
	produce() // refused: paused
	if err := r.Resume(); err != nil {
		t.Fatal(err)
	}
	produce()
	var got uint64
	if _, err := r.Consume(func(rec *perfbuf.Record) error {
		if rec.Type == perfbuf.RecordSample {
			got++
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	produce() // refused: no reader alive
	after := f.outcomes(t)
	failedAfter := bpftest.PerCPU[mapFailures](t, f.mod, "events_failures")
	var attempts, noent, failed uint64
	for _, cpu := range f.cpus {
		attempts += after[cpu].Attempts - before[cpu].Attempts
		noent += after[cpu].NoEnt - before[cpu].NoEnt
		failed += failedAfter[cpu].Total() - failedBefore[cpu].Total()
	}
	st := r.Stats().Rings[0]
	t.Logf("%d output = received %d + failed %d (noent %d) + left %d", attempts, got, failed, noent, st.Left)
	if got != 2*perCPU*n || noent != 2*perCPU*n || failed != noent || st.Left != 0 || attempts != got+failed {
		t.Errorf("received %d, failed %d (noent %d), left %d of %d output; want %d received (before the kill and after Resume) and %d failed as noent (paused, and after the last Close)",
			got, failed, noent, st.Left, attempts, 2*perCPU*n, 2*perCPU*n)
	}
}

// readerMark is a CPU's value of the failure map's reader key (key 1):
// Closed is 1 once the last reader closed (bpf/perfbuf.bpf.h).
type readerMark struct {
	Closed uint64
	_      [5]uint64
}

// mapFailures is a CPU's value of a failure map: struct perfbuf_failures
// of bpf/perfbuf.bpf.h, a ring buffer's full ring (Stats.Lost) included.
type mapFailures struct {
	NoEntry, TooBig, Invalid, NotOnCPU, Other, Full uint64
}

// Total is the number of failed outputs of every cause.
func (f mapFailures) Total() uint64 {
	return f.NoEntry + f.TooBig + f.Invalid + f.NotOnCPU + f.Other + f.Full
}

// startChild starts a reader in another process (this test binary
// running TestHandoverChild) over the maps pinned in dir, and waits until
// its reader is open.
func startChild(t *testing.T, dir string) *child.Process {
	t.Helper()
	c := child.MustStart(t, child.Spec{Name: "child", Test: "TestHandoverChild", Env: []string{handoverDir + "=" + dir}, Prefix: "handover"})
	if got := c.MustAnswer(t); got != "open" {
		t.Fatalf("child: %q, want open", got)
	}
	return c
}

// TestHandoverChild is the child of TestHandover: a reader of the maps
// pinned in $PERFBUF_HANDOVER_DIR, opened through cilium/ebpf. It answers
// "open" once its reader is open, then, a line each: "consume" with the
// samples Consume delivered, "read N" with the samples ReadBatch delivered
// once it delivered N (or, failing, when 10 s passed), "close" with the
// sums of the reader's Stats, and exits.
func TestHandoverChild(t *testing.T) {
	dir := os.Getenv(handoverDir)
	if dir == "" {
		t.Skip("the child of TestHandover")
	}
	s := child.Serve(t, "handover")
	answer, fail := s.Answer, s.Fail
	events, err := ebpf.LoadPinnedMap(filepath.Join(dir, "events"), nil)
	if err != nil {
		fail(err)
	}
	defer events.Close()
	failures, err := ebpf.LoadPinnedMap(filepath.Join(dir, "events_failures"), nil)
	if err != nil {
		fail(err)
	}
	defer failures.Close()
	r, err := perfbuf.NewReader(perfbuf.MapFD(events.FD()), perfbuf.ReaderOptions{Options: perfbuf.Options{FailureMap: perfbuf.MapFD(failures.FD())}})
	if err != nil {
		fail(err)
	}
	defer r.Close()
	answer("open")
	s.Commands(func(cmd string) bool {
		switch cmd {
		case "consume":
			var got uint64
			if _, err := r.Consume(func(rec *perfbuf.Record) error {
				if rec.Type == perfbuf.RecordSample {
					got++
				}
				return nil
			}); err != nil {
				fail(err)
			}
			answer("%d", got)
		case "close":
			if err := r.Close(); err != nil {
				fail(err)
			}
			st := r.Stats()
			answer("samples %d left %d", st.Samples, st.Left)
			return true
		default:
			var want int
			if _, err := fmt.Sscanf(cmd, "read %d", &want); err != nil {
				fail(fmt.Errorf("unknown command %q", cmd))
			}
			r.SetDeadline(time.Now().Add(10 * time.Second))
			got, s := 0, make([]perfbuf.Sample, want)
			for got < want {
				n, err := r.ReadBatch(s[:want-got])
				if err != nil {
					fail(err)
				}
				got += n
			}
			answer("%d", got)
		}
		return false
	})
}

// The readers' locks (internal/owner/presence.go) are perfbuf's own: a
// program that holds an flock(2) on a descriptor of the kernel's
// anonymous inode (an eventfd here; every BPF map, epoll set and timerfd
// shares it) stalls no reader's open, Pause or Close. (The reader key was locked with flock on the map's
// descriptor, and all three waited for such a lock, without a bound.)
func TestReaderKeyUnrelatedLock(t *testing.T) {
	opts := perfbuf.Options{}
	f := setup(t, bpfbuffer.RingBuf, &opts)
	efd, err := unix.Eventfd(0, unix.EFD_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(efd)
	if err := unix.Flock(efd, unix.LOCK_EX|unix.LOCK_NB); err != nil {
		t.Fatal(err)
	}
	defer unix.Flock(efd, unix.LOCK_UN)
	done := make(chan error, 1)
	go func() {
		r, err := perfbuf.NewReader(f.events, perfbuf.ReaderOptions{Options: perfbuf.Options{FailureMap: f.failures}})
		if err == nil {
			err = errors.Join(r.Pause(), r.Resume(), r.Close())
		}
		done <- err
	}()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(30 * time.Second): // a detector of the stall, not a bound on speed
		t.Fatal("NewReader, Pause, Resume and Close still waiting after 30 s beside an flock on an eventfd")
	}
}
