// SPDX-License-Identifier: Apache-2.0

package main

import (
	"bytes"
	"os/exec"
	"runtime"
	"strings"
	"testing"
	"time"
	"unsafe"

	"github.com/perfbuf/perfbuf"
	"github.com/perfbuf/perfbuf/cmd/internal/tool"
	"github.com/perfbuf/perfbuf/cmd/internal/tooltest"
	"github.com/perfbuf/perfbuf/internal/cpus"
	"golang.org/x/sys/unix"
)

// The summary reports failed outputs by cause, in total (the sums), per
// ring, and those of no ring (a CPU that has none, in the sums only) on a
// line of their own; with none, it says nothing of them.
func TestSummaryFailures(t *testing.T) {
	rings := []perfbuf.Stats{
		{CPU: 0, Samples: 4},
		{CPU: 1, Samples: 2, Failed: perfbuf.Failures{NotOnCPU: 2, Other: 1}},
	}
	// CPU 3 has no ring (it came online later): its failures are no ring's.
	stats := tooltest.Sums(perfbuf.Stats{Failed: perfbuf.Failures{NoEntry: 5}}, rings...)
	var sum bytes.Buffer
	writeSummary(&sum, counts{events: 6, shown: 6}, stats, time.Second)
	for _, want := range []string{
		", 8 failed outputs (ENOENT 5, EOPNOTSUPP 2, other 1) in 1.0s\n",
		"  cpu 1        2 events      0 lost      0 out of order  3 failed outputs (EOPNOTSUPP 2, other 1)\n",
		"  no ring  5 failed outputs (ENOENT 5)\n",
	} {
		if !strings.Contains(sum.String(), want) {
			t.Errorf("summary:\n%s\nwant it to contain %q", sum.String(), want)
		}
	}
	if n := strings.Count(sum.String(), "\n"); n != 5 {
		t.Errorf("summary: %d lines, want 5 (a blank, the totals, 2 rings, no ring's):\n%s", n, sum.String())
	}
	sum.Reset()
	writeSummary(&sum, counts{events: 4, shown: 4}, tooltest.Sums(perfbuf.Stats{}, rings[0]), time.Second)
	if strings.Contains(sum.String(), "failed") {
		t.Errorf("summary without failures mentions them:\n%s", sum.String())
	}
	if got := tool.FailuresText(perfbuf.Failures{TooBig: 1}); got != "1 failed output (E2BIG 1)" {
		t.Errorf("one failure: %q", got)
	}
}

// An exec whose event finds no ring in its CPU's slot is not lost
// silently: the program's failure map counts it (ENOENT) on that CPU, the
// reader's Stats carry it, and the summary says so.
func TestFailedOutputsCounted(t *testing.T) {
	tr := openTestTracer(t, tracerConfig{uid: -1, includeFailed: true, maxArgs: 20})
	online, err := cpus.Online()
	if err != nil {
		t.Fatal(err)
	}
	cpu := online[len(online)-1]
	events, err := tr.mod.GetMap("events")
	if err != nil {
		t.Fatal(err)
	}
	key := uint32(cpu)
	if err := events.DeleteKey(unsafe.Pointer(&key)); err != nil {
		t.Fatalf("delete cpu %d's slot: %v", cpu, err)
	}
	tok := newToken()
	done := make(chan error)
	go func() {
		// The thread stays locked, with its affinity, until the
		// goroutine ends; then the runtime ends the thread. The child
		// inherits the affinity, so its exec's event is output on cpu.
		runtime.LockOSThread()
		var set unix.CPUSet
		set.Set(cpu)
		if err := unix.SchedSetaffinity(0, &set); err != nil {
			done <- err
			return
		}
		done <- exec.Command("/bin/true", tok).Run()
	}()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if m := find(collect(t, tr), tok); len(m) != 0 {
		t.Errorf("exec on cpu %d delivered with its slot deleted: %+v", cpu, m)
	}
	stats := tr.rd.Stats()
	var failed perfbuf.Failures
	for _, s := range stats.Rings {
		if s.CPU == cpu {
			failed = s.Failed // the CPU's latest ring has its failures
		}
	}
	// Other execs on the machine may fail there too: at least ours.
	if failed.NoEntry < 1 || failed.Total() != failed.NoEntry {
		t.Errorf("cpu %d: Failed %+v, want ENOENT only, at least 1", cpu, failed)
	}
	var sum bytes.Buffer
	writeSummary(&sum, counts{}, stats, time.Second)
	if !strings.Contains(sum.String(), "failed output") || !strings.Contains(sum.String(), "(ENOENT ") {
		t.Errorf("summary does not report the failed output:\n%s", sum.String())
	}
	t.Logf("cpu %d, its slot deleted: %s", cpu, tool.FailuresText(failed))
}
