// SPDX-License-Identifier: Apache-2.0

package main

import (
	"bytes"
	"encoding/csv"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/perfbuf/perfbuf/bench/internal/benchrun"
)

func TestHostFlags(t *testing.T) {
	c, err := parseFlags(nil, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(c.hostRates, benchrun.HostRates) || c.hostModes != nil || c.hostDuration != benchrun.HostDuration {
		t.Errorf("defaults: rates %v, modes %v, duration %v", c.hostRates, c.hostModes, c.hostDuration)
	}
	if c.runs(onlyHost) || c.runs(onlyRBHost) {
		t.Error("the host measurements run by default")
	}
	c, err = parseFlags([]string{"-only", "host,rbhost", "-host-rates", "1000, 10000", "-host-modes", "C-tuned,reader-10ms", "-host-duration", "2s"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if !c.runs(onlyHost) || !c.runs(onlyRBHost) || !slices.Equal(c.hostRates, []int{1000, 10000}) ||
		!slices.Equal(c.hostModes, []string{benchrun.ModeCTuned, benchrun.ModeReaderBudget}) || c.hostDuration != 2*time.Second {
		t.Errorf("parsed %+v", c)
	}
	for _, bad := range [][]string{
		{"-host-rates", "0"},
		{"-host-rates", "idle"}, // the quiet measurement's, not this one's
		{"-host-rates", "20000000"},
		{"-host-modes", "ordered"},
		{"-host-duration", "0s"},
		{"-only", "hosts"},
	} {
		if _, err := parseFlags(bad, io.Discard); err == nil {
			t.Errorf("%q parsed", bad)
		}
	}
}

func TestHostCommand(t *testing.T) {
	for _, tc := range []struct {
		mode    string
		ringBuf bool
		want    []string
	}{
		{benchrun.ModeC, false, []string{"/c/cquiet", "-pages", "256", "-latency", "3", "900", "8001"}},
		{benchrun.ModeC, true, []string{"/c/cquiet", "-ringbuf", "-pages", "256", "-latency", "3", "900", "8001"}},
		{benchrun.ModeCTuned, false, []string{"/c/cquiet", "-pages", "256", "-latency", "-tick-ms", "10", "3", "900", "8001"}},
		{benchrun.ModeCTuned, true, []string{"/c/cquiet", "-ringbuf", "-pages", "256", "-latency", "-tick-ms", "10", "3", "900", "8001"}},
		{benchrun.ModeReaderBudget, true, append(append([]string{"/self"}, consumerArgs(benchrun.ModeReaderBudget, true, 900, 8000500*time.Microsecond)...), "-host")},
	} {
		cmd := hostCommand(tc.mode, tc.ringBuf, "/self", "/c/cquiet", nil, io.Discard)(900, 8000500*time.Microsecond)
		if !slices.Equal(cmd.Args, tc.want) {
			t.Errorf("%s (ring buffer %v): %q, want %q", tc.mode, tc.ringBuf, cmd.Args, tc.want)
		}
	}
	if hostCommand(benchrun.ModeDetached, false, "/self", "/c/cquiet", nil, io.Discard) != nil {
		t.Error("the detached workload has a consumer")
	}
	// Every Go mode's command is one the consumer accepts.
	for _, mode := range benchrun.HostModes {
		if !benchrun.IsHostGoMode(mode) {
			continue
		}
		args := hostCommand(mode, false, "/self", "/c/cquiet", nil, io.Discard)(10, time.Second).Args[1:]
		c, err := parseConsumer(args, io.Discard)
		if err != nil || !c.Host || c.Mode != mode {
			t.Errorf("%q: %+v, %v", args, c, err)
		}
	}
	// A quiet mode is not a host one, nor the reverse.
	for _, args := range [][]string{
		{consumerFlag, benchrun.ModeOrdered, "-host", "-count", "1", "-timeout", "1s"},
		{consumerFlag, benchrun.ModeReaderBudget, "-count", "1", "-timeout", "1s"},
	} {
		if _, err := parseConsumer(args, io.Discard); err == nil {
			t.Errorf("%q parsed", args)
		}
	}
}

func TestHostModesFilter(t *testing.T) {
	if got := hostModes(config{}, true); !slices.Equal(got, benchrun.HostModes) {
		t.Errorf("all: %v", got)
	}
	got := hostModes(config{}, false)
	if slices.Contains(got, benchrun.ModeC) || slices.Contains(got, benchrun.ModeCTuned) || len(got) != len(benchrun.HostModes)-2 {
		t.Errorf("without the C program: %v", got)
	}
	got = hostModes(config{hostModes: []string{benchrun.ModeReaderBudget, benchrun.ModeDetached}}, true)
	if want := []string{benchrun.ModeDetached, benchrun.ModeReaderBudget}; !slices.Equal(got, want) {
		t.Errorf("-host-modes: %v, want %v (in HostModes' order)", got, want)
	}
}

// hostRun is a made-up run: a workload of 1000 calls in a second whose
// thread ran workload, and a consumer that received them all.
func hostRun(mode string, ringBuf bool, rate int, workload, prog time.Duration) benchrun.HostResult {
	r := benchrun.HostResult{Mode: mode, RingBuf: ringBuf, Rate: rate, Calls: 1000, Elapsed: time.Second, Workload: workload, WorkloadCharged: 2 * workload}
	if mode != benchrun.ModeDetached {
		r.Emitted, r.Received = 1000, 1000
		r.Prog.RunTime, r.Prog.Runs = prog, 1000
		r.Window = benchrun.Usage{CPU: 20 * time.Millisecond, Voluntary: 1000}
		r.Latency = benchrun.Latency{N: 1000, P50: 30 * time.Microsecond, P99: 9 * time.Millisecond, Max: 12 * time.Millisecond}
	}
	return r
}

// The rounds' medians, the workload less the detached one's in the same
// round, perf rows before ring buffer ones, and the table and CSV of them.
func TestHostResults(t *testing.T) {
	r := &results{rounds: 2, hostDuration: time.Second}
	for round, base := range []time.Duration{5 * time.Millisecond, 7 * time.Millisecond} {
		for _, ringBuf := range []bool{true, false} {
			r.addHostRound([]benchrun.HostResult{
				hostRun(benchrun.ModeReaderBudget, ringBuf, 1000, base+time.Millisecond, time.Millisecond),
				hostRun(benchrun.ModeDetached, ringBuf, 1000, base, 0),
				hostRun(benchrun.ModeC, ringBuf, 1000, base+time.Duration(10+round)*time.Millisecond, 10*time.Millisecond),
			})
		}
	}
	r.addHostRound([]benchrun.HostResult{hostRun(benchrun.ModeC, false, 10000, 30*time.Millisecond, 10*time.Millisecond)})
	var order []string
	for _, h := range r.host {
		order = append(order, strconv.FormatBool(h.ringBuf)+" "+strconv.Itoa(h.rate)+" "+h.mode)
	}
	want := []string{"false 1000 detached", "false 1000 C", "false 1000 reader-10ms", "false 10000 C",
		"true 1000 detached", "true 1000 C", "true 1000 reader-10ms"}
	if !slices.Equal(order, want) {
		t.Fatalf("rows %q, want %q", order, want)
	}
	c := r.host[1]
	if c.workload.median() != 16500 || c.added.median() != 10500 || c.prog.median() != 10000 || c.reader.median() != 20000 ||
		c.csw.median() != 1 || c.p99.median() != 9000 || len(r.host[3].added) != 0 {
		t.Errorf("C at 1000/s: %+v; C at 10000/s without a detached run: added %v", c, r.host[3].added)
	}

	var out bytes.Buffer
	writeTable(&out, r)
	for _, s := range []string{"Perf event array:", "BPF ring buffer:", "+workload ns", "p99 µs", "MaxLatency 10ms"} {
		if !strings.Contains(out.String(), s) {
			t.Errorf("the table has no %q:\n%s", s, out.String())
		}
	}
	if i, j := strings.Index(out.String(), "Perf event array:"), strings.Index(out.String(), "BPF ring buffer:"); i > j {
		t.Errorf("ring buffer rows first:\n%s", out.String())
	}
	out.Reset()
	if err := writeHostCSV(&out, r); err != nil {
		t.Fatal(err)
	}
	rows, err := csv.NewReader(&out).ReadAll()
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != len(r.host)+1 || !slices.Equal(rows[0], hostCSVHeader) {
		t.Fatalf("%d rows, header %q", len(rows), rows[0])
	}
	col := map[string]int{}
	for i, name := range rows[0] {
		col[name] = i
	}
	row := rows[2]
	for name, want := range map[string]string{"kind": onlyHost, "mode": benchrun.ModeC, "rate": "1000", "rounds": "2",
		"workload_ns": "16500.0", "added_workload_ns": "10500.0", "workload_charged_ns": "33000.0", "latency_p99_us": "9000.0", "lost_max": "0", "accounting_errors": "0"} {
		if row[col[name]] != want {
			t.Errorf("C row: %s = %q, want %q (%q)", name, row[col[name]], want, row)
		}
	}
	if det := rows[1]; det[col["prog_ns"]] != "" || det[col["lost_max"]] != "" || det[col["added_workload_ns"]] != "0.0" {
		t.Errorf("detached row %q: a program's or a reader's figures", det)
	}
	if rows[5][col["kind"]] != onlyRBHost {
		t.Errorf("ring buffer row %q", rows[5])
	}
}

// A short run of each kind with the C consumers (when built) and the
// Reader: every call recorded and delivered, a latency for each.
func TestHostRun(t *testing.T) {
	requirePrivileges(t)
	t.Setenv("GORACE", strings.TrimSpace(os.Getenv("GORACE")+" atexit_sleep_ms=0"))
	cquiet, _ := filepath.Abs("../../build/perfbench-cquiet")
	haveC := cquietMissing(cquiet) == ""
	csvPath := filepath.Join(t.TempDir(), "host.csv")
	var stdout, stderr bytes.Buffer
	args := []string{"-bpf-obj", "bpf/perfbench.bpf.o", "-rb-obj", "bpf/rbbench.bpf.o", "-host-obj", "bpf/hostbench.bpf.o",
		"-only", "host,rbhost", "-rounds", "1", "-host-duration", "200ms", "-host-rates", "1000",
		"-host-modes", "detached,C,C-tuned,reader-batch", "-cquiet", cquiet, "-csv", "", "-svg", "", "-host-csv", csvPath}
	status := run(args, &stdout, &stderr)
	t.Logf("C consumer %v:\n%s%s", haveC, stdout.String(), stderr.String())
	if status != 0 {
		t.Fatalf("perfbench %q: status %d", args, status)
	}
	f, err := os.Open(csvPath)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	rows, err := csv.NewReader(f).ReadAll()
	if err != nil {
		t.Fatal(err)
	}
	col := map[string]int{}
	for i, name := range rows[0] {
		col[name] = i
	}
	want := 2 * len(hostModes(config{hostModes: []string{"detached", "C", "C-tuned", "reader-batch"}}, haveC))
	if len(rows)-1 != want {
		t.Fatalf("%d rows, want %d", len(rows)-1, want)
	}
	for _, row := range rows[1:] {
		if row[col["accounting_errors"]] != "0" {
			t.Errorf("accounting: %q", row)
		}
		if row[col["mode"]] == benchrun.ModeDetached {
			continue
		}
		if row[col["lost_max"]] != "0" || row[col["prog_ns"]] == "" || row[col["latency_max_us"]] == "" {
			t.Errorf("row %q: a loss, or no program time or latency", row)
		}
	}
}

// A consumer whose records do not all come (here: it is told of more
// calls than the workload makes, as a ring buffer's failed outputs are
// never delivered) is stopped once the calls are made, and reports what it
// read, before its own timeout.
func TestHostStopsConsumer(t *testing.T) {
	requirePrivileges(t)
	t.Setenv("GORACE", strings.TrimSpace(os.Getenv("GORACE")+" atexit_sleep_ms=0"))
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cquiet, _ := filepath.Abs("../../build/perfbench-cquiet")
	h, err := benchrun.OpenHost("bpf/hostbench.bpf.o")
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	modes := []string{benchrun.ModeCilium, benchrun.ModeReaderBatch}
	if cquietMissing(cquiet) == "" {
		modes = append(modes, benchrun.ModeC)
	}
	for _, ringBuf := range []bool{false, true} {
		for _, mode := range modes {
			var timeout time.Duration
			cmd := hostCommand(mode, ringBuf, self, cquiet, nil, io.Discard)
			res, err := benchrun.RunHost(h, benchrun.HostConfig{Mode: mode, RingBuf: ringBuf, Rate: 1000, Duration: 50 * time.Millisecond,
				Command: func(count int, d time.Duration) *exec.Cmd {
					timeout = d
					return cmd(count+10, d)
				}})
			if err != nil {
				t.Fatalf("%s (ring buffer %v): %v", mode, ringBuf, err)
			}
			if res.Calls != 50 || res.Received != 50 || res.Window.Wall >= timeout {
				t.Errorf("%s (ring buffer %v): %d calls, received %d, in a window of %v: not stopped before its timeout %v",
					mode, ringBuf, res.Calls, res.Received, res.Window.Wall, timeout)
			}
		}
	}
}
