// SPDX-License-Identifier: Apache-2.0

package main

import (
	"bytes"
	"encoding/csv"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/perfbuf/perfbuf/bench/internal/benchrun"
	"github.com/perfbuf/perfbuf/internal/bpfrun"
)

// requirePrivileges skips the test when it cannot load BPF programs, except
// under CI (CI=true), where a privileged test that cannot run must fail.
func requirePrivileges(t *testing.T) {
	t.Helper()
	err := bpfrun.CheckPrivileges()
	if err == nil {
		return
	}
	if os.Getenv("CI") == "true" {
		t.Fatalf("privileged test cannot run under CI: %v", err)
	}
	t.Skipf("privileged test: %v", err)
}

// TestMain lets the test binary be the quiet measurement's Go consumer, as
// perfbench is: the quiet measurement runs its own executable again with
// consumerFlag first.
func TestMain(m *testing.M) {
	if isConsumer(os.Args[1:]) {
		os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
	}
	os.Exit(m.Run())
}

func TestConsumerArgs(t *testing.T) {
	for _, tc := range []struct {
		ringBuf bool
		modes   []string
	}{
		{false, []string{benchrun.ModeCallback, benchrun.ModeReader, benchrun.ModeReaderEach, benchrun.ModeReaderNoLatency, benchrun.ModeOrdered}},
		{true, []string{benchrun.ModeCallback, benchrun.ModeReader, benchrun.ModeReaderEach}},
	} {
		for _, mode := range tc.modes {
			args := consumerArgs(mode, tc.ringBuf, 900, 8*time.Second)
			if !isConsumer(args) {
				t.Fatalf("%v does not make a consumer", args)
			}
			c, err := parseConsumer(args, io.Discard)
			want := benchrun.QuietConsumerConfig{Mode: mode, MapFD: benchrun.QuietMapFD, RingBuf: tc.ringBuf, Count: 900, Timeout: 8 * time.Second}
			if err != nil || c != want {
				t.Errorf("parseConsumer(%q) = %+v, %v; want %+v", args, c, err, want)
			}
		}
	}
	for _, bad := range [][]string{
		{consumerFlag, "C", "-count", "1", "-timeout", "1s"}, // C is a program of its own
		{consumerFlag, "raw-copy", "-count", "1", "-timeout", "1s"},
		{consumerFlag, "reader", "-count", "-1", "-timeout", "1s"},
		{consumerFlag, "reader", "-count", "1"}, // no timeout
		{consumerFlag, "reader", "-map-fd", "-3", "-timeout", "1s"},
		{consumerFlag, "reader", "-timeout", "1s", "extra"},
		{consumerFlag, "reader", "-rounds", "3", "-timeout", "1s"}, // perfbench's own flags are not the consumer's
	} {
		if _, err := parseConsumer(bad, io.Discard); err == nil {
			t.Errorf("parseConsumer(%q) accepted it", bad)
		}
	}
	if isConsumer(nil) || isConsumer([]string{"-rounds", "3", consumerFlag}) {
		t.Error("isConsumer of arguments that do not start with " + consumerFlag)
	}
	var stderr bytes.Buffer
	if got := run([]string{consumerFlag, "C"}, io.Discard, &stderr); got != 2 || !strings.Contains(stderr.String(), "not a Go consumer mode") {
		t.Errorf("run as a C consumer: status %d, %q", got, stderr.String())
	}
}

func TestQuietCommand(t *testing.T) {
	cmd := quietCommand(benchrun.ModeC, false, "/self", "/c/perfbench-cquiet", nil, io.Discard)(900, 5500*time.Microsecond)
	if want := []string{"/c/perfbench-cquiet", "3", "900", "6"}; !slices.Equal(cmd.Args, want) {
		t.Errorf("C command %q, want %q (the timeout rounded up to ms)", cmd.Args, want)
	}
	cmd = quietCommand(benchrun.ModeOrdered, false, "/self", "/c/perfbench-cquiet", []string{"perf", "stat", "--"}, io.Discard)(0, 3*time.Second)
	want := append([]string{"perf", "stat", "--", "/self"}, consumerArgs(benchrun.ModeOrdered, false, 0, 3*time.Second)...)
	if !slices.Equal(cmd.Args, want) || cmd.Path == "" {
		t.Errorf("wrapped Go command %q, want %q", cmd.Args, want)
	}
	// Over a ring buffer, both consumers are told so.
	cmd = quietCommand(benchrun.ModeC, true, "/self", "/c/perfbench-cquiet", nil, io.Discard)(900, 8*time.Second)
	if want := []string{"/c/perfbench-cquiet", "-ringbuf", "3", "900", "8000"}; !slices.Equal(cmd.Args, want) {
		t.Errorf("ring buffer C command %q, want %q", cmd.Args, want)
	}
	cmd = quietCommand(benchrun.ModeReader, true, "/self", "/c/perfbench-cquiet", nil, io.Discard)(900, 8*time.Second)
	if !slices.Contains(cmd.Args, "-ringbuf") {
		t.Errorf("ring buffer Go command %q without -ringbuf", cmd.Args)
	}
}

func TestQuietModeLists(t *testing.T) {
	all := allQuietModes()
	if want := []string{"C", "callback", "raw-zerocopy", "reader", "reader-nolatency", "reader-batch", "reader-each", "cilium", "ordered", "reader-holdoff"}; !slices.Equal(all, want) {
		t.Errorf("allQuietModes = %q, want %q", all, want)
	}
	var c config
	if got := quietModes(c, false, 300, true); !slices.Equal(got, benchrun.QuietModes) {
		t.Errorf("at 300/s: %q", got)
	}
	if got := quietModes(c, false, 0, false); !slices.Equal(got, benchrun.QuietIdleModes[1:]) {
		t.Errorf("idle without C: %q", got)
	}
	if got := quietModes(c, true, 300, true); !slices.Equal(got, benchrun.RBQuietModes) {
		t.Errorf("ring buffer at 300/s: %q", got)
	}
	if got := quietModes(c, true, 0, true); !slices.Equal(got, benchrun.RBQuietIdleModes) {
		t.Errorf("ring buffer idle: %q", got)
	}
	c.quietModes = []string{benchrun.ModeReaderNoLatency, benchrun.ModeC}
	if got := quietModes(c, false, 300, true); !slices.Equal(got, []string{benchrun.ModeC, benchrun.ModeReaderNoLatency}) {
		t.Errorf("at 300/s, of C and reader-nolatency: %q", got)
	}
	if got := quietModes(c, false, 0, true); !slices.Equal(got, []string{benchrun.ModeC, benchrun.ModeReaderNoLatency}) {
		t.Errorf("idle, of C and reader-nolatency: %q", got)
	}
	c.quietModes = []string{benchrun.ModeReaderNoLatency}
	if got := quietModes(c, true, 0, true); len(got) != 0 {
		t.Errorf("ring buffer idle, of reader-nolatency: %q", got)
	}
	if got := quietModes(c, true, 300, true); !slices.Equal(got, c.quietModes) {
		t.Errorf("ring buffer at 300/s, of reader-nolatency: %q", got)
	}
}

func TestCquietMissing(t *testing.T) {
	dir := t.TempDir()
	exe, plain := filepath.Join(dir, "exe"), filepath.Join(dir, "plain")
	if err := os.WriteFile(exe, nil, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(plain, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if why := cquietMissing(exe); why != "" {
		t.Errorf("an executable is missing: %s", why)
	}
	for _, p := range []string{plain, dir, filepath.Join(dir, "none")} {
		if why := cquietMissing(p); why == "" {
			t.Errorf("%s is not missing", p)
		}
	}
}

// The quiet rows pair each round's figures with C's of the same round, have
// no ratio without C, and sort by rate (idle last), then mode.
func TestQuietResults(t *testing.T) {
	r := &results{}
	for round, cpu := range [][2]time.Duration{{10, 20}, {10, 11}, {20, 60}} {
		var res []benchrun.QuietResult
		modes := []string{benchrun.ModeC, benchrun.ModeReader}
		for _, mode := range rotate(modes, round) {
			k := slices.Index(modes, mode)
			res = append(res, benchrun.QuietResult{Mode: mode, Rate: 300, Emitted: 100, Received: 100,
				Window: benchrun.Usage{CPU: 100 * cpu[k] * time.Microsecond, Wall: time.Second}})
		}
		r.addQuietRound(300, res)
	}
	r.addQuietRound(0, []benchrun.QuietResult{{Mode: benchrun.ModeReader, Window: benchrun.Usage{Voluntary: 10, Wall: time.Second}}})
	r.addQuietRound(3000, []benchrun.QuietResult{{Mode: benchrun.ModeReader, Rate: 3000, Emitted: 1, Received: 1}})
	if got := r.quietOf(benchrun.ModeReader, 300).ratio(); got != 2 {
		t.Errorf("ratio %v, want 2 (rounds 2, 1.1, 3); the medians' ratio is 1.1", got)
	}
	if got := r.quietOf(benchrun.ModeReader, 3000).ratio(); got == got {
		t.Errorf("ratio without C %v, want NaN", got)
	}
	var order []string
	for _, q := range r.quiet {
		order = append(order, benchrun.RateName(q.rate)+" "+q.mode)
	}
	if want := []string{"300/s C", "300/s reader", "3000/s reader", "idle reader"}; !slices.Equal(order, want) {
		t.Errorf("order %q, want %q", order, want)
	}
	var buf bytes.Buffer
	r.quietNoC = "build/perfbench-cquiet: no such file"
	r.quietDuration = 3 * time.Second
	writeTable(&buf, r)
	out := buf.String()
	for _, want := range []string{"Per wakeup", "Idle, per second", "No C rows", "3000/s  reader", "10.0"} {
		if !strings.Contains(out, want) {
			t.Errorf("table lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "Drain of") || strings.Contains(out, "Sustained:") {
		t.Errorf("table has sections that were not measured:\n%s", out)
	}
}

// TestQuietRun runs a short quiet measurement end to end, as `perfbench
// -only quiet` does, and its ring buffer form (rbquiet): the emitter on CPU
// 0, every Go consumer (this test binary run again, see TestMain) at 300
// samples a second and idle, each with its accounting checked, and the
// table and CSV written. The C consumer runs only if `make bench` has built
// it (../../build/perfbench-cquiet; the VMs have none); without it the test
// checks that perfbench says it skipped it and measured the rest. Needs
// root.
func TestQuietRun(t *testing.T) {
	requirePrivileges(t)
	// A consumer built with -race (this test binary) would sleep a second
	// at exit (the race runtime's atexit_sleep_ms), for each of ten.
	t.Setenv("GORACE", strings.TrimSpace(os.Getenv("GORACE")+" atexit_sleep_ms=0"))
	for _, kind := range []string{onlyQuiet, onlyRBQuiet} {
		t.Run(kind, func(t *testing.T) { testQuietRun(t, kind) })
	}
}

func testQuietRun(t *testing.T, kind string) {
	ringBuf := kind == onlyRBQuiet
	cquiet, _ := filepath.Abs("../../build/perfbench-cquiet")
	haveC := cquietMissing(cquiet) == ""
	csvPath := filepath.Join(t.TempDir(), "quiet.csv")
	var stdout, stderr bytes.Buffer
	args := []string{"-bpf-obj", "bpf/perfbench.bpf.o", "-rb-obj", "bpf/rbbench.bpf.o", "-only", kind, "-rounds", "1",
		"-quiet-duration", "250ms", "-quiet-rates", "300,idle", "-cquiet", cquiet, "-csv", csvPath, "-svg", ""}
	start := time.Now()
	status := run(args, &stdout, &stderr)
	t.Logf("%v, C consumer %v:\n%s%s", time.Since(start).Round(time.Millisecond), haveC, stdout.String(), stderr.String())
	if status != 0 {
		t.Fatalf("perfbench %q: status %d", args, status)
	}
	if skipped := strings.Contains(stderr.String(), "skipping the C consumer"); skipped == haveC {
		t.Errorf("C consumer built %v, and perfbench said it skipped it: %v", haveC, skipped)
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
	got := map[string][]string{}
	for _, row := range rows[1:] {
		if row[col["kind"]] != kind {
			t.Errorf("a row of another measurement: %v", row)
		}
		got[row[col["samples_per_s"]]+" "+row[col["mode"]]] = row
	}
	if len(got) != len(rows)-1 {
		t.Errorf("%d rows, %d measurements", len(rows)-1, len(got))
	}
	for _, rate := range []int{300, 0} {
		modes := quietModes(config{}, ringBuf, rate, haveC)
		if least := map[bool]int{false: 4, true: 2}[ringBuf]; len(modes) < least {
			t.Fatalf("%d modes at %s", len(modes), benchrun.RateName(rate))
		}
		for _, mode := range modes {
			row := got[strconv.Itoa(rate)+" "+mode]
			if row == nil {
				t.Errorf("no row for %s at %s", mode, benchrun.RateName(rate))
				continue
			}
			if rate > 0 && (row[col["cpu_us_per_wakeup"]] == "" || row[col["cpu_us_per_wakeup"]] == "0.00") {
				t.Errorf("%s at %s: no CPU per wakeup: %v", mode, benchrun.RateName(rate), row)
			}
			if lost := row[col["lost_total"]]; lost != "0" {
				t.Errorf("%s at %s lost %s samples", mode, benchrun.RateName(rate), lost)
			}
			// C and callback count their polls, each of at least a
			// sample; the readers do not.
			perPoll := row[col["samples_per_poll"]]
			if mode == benchrun.ModeC || mode == benchrun.ModeCallback {
				if n, err := strconv.ParseFloat(perPoll, 64); rate > 0 && (err != nil || n < 1) {
					t.Errorf("%s at %s: samples per poll %q", mode, benchrun.RateName(rate), perPoll)
				}
			} else if perPoll != "" {
				t.Errorf("%s at %s: samples per poll %q from a consumer that does not count polls", mode, benchrun.RateName(rate), perPoll)
			}
		}
	}
	// run returns 1 on an accounting error; the table says ok for each row.
	if n := strings.Count(stdout.String(), " ok\n"); n != len(rows)-1 {
		t.Errorf("%d rows with accounting ok, want %d", n, len(rows)-1)
	}
}

// The ring buffer's quiet rows (rbquiet) have a section of their own, after
// the perf ones, with samples per poll where the consumer counted them.
func TestRBQuietTable(t *testing.T) {
	r := sample()
	var buf bytes.Buffer
	writeTable(&buf, r)
	out := buf.String()
	perf, rb := strings.Index(out, "\nQuiet: one"), strings.Index(out, "\nBPF ring buffer quiet: one")
	if perf < 0 || rb < perf {
		t.Fatalf("no ring buffer quiet section after the perf one:\n%s", out)
	}
	for _, want := range []string{"C = ring_buffer__poll", "samples/poll"} {
		if !strings.Contains(out[rb:], want) {
			t.Errorf("the ring buffer quiet section lacks %q:\n%s", want, out[rb:])
		}
	}
	for _, want := range [][]string{
		{"300/s", "C", "10.5", `\S+`, `\S+`, "1.00", "1.00", "200", "0"},
		{"3000/s", "C", "10.5", `\S+`, `\S+`, "1.00", "1.50", "200", "0"},
		{"3000/s", "reader-nolatency", "30.5", `\S+`, `\S+`, `\S+`, "-", "4200", "0"},
		{"3000/s", "reader-each", "40.5", `\S+`, `\S+`, `\S+`, "-", "6200", "0"},
		{"3000/s", "cilium", "45.5", `\S+`, `\S+`, `\S+`, "-", "7200", "0"},
		{"3000/s", "ordered", "50.5", `\S+`, `\S+`, `\S+`, "-", "8200", "0"},
		{"3000/s", "reader-holdoff", "55.5", `\S+`, `\S+`, `\S+`, "-", "9200", "1"},
	} {
		if !regexp.MustCompile(`(?m)^ *` + strings.Join(want, ` +`) + ` `).MatchString(out[rb:]) {
			t.Errorf("the ring buffer quiet section lacks a line %q:\n%s", want, out[rb:])
		}
	}
}
