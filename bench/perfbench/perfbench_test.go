// SPDX-License-Identifier: Apache-2.0

package main

import (
	"bytes"
	"encoding/csv"
	"encoding/xml"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/perfbuf/perfbuf/bench/internal/benchrun"
	"github.com/perfbuf/perfbuf/internal/kernel"
)

func TestSeries(t *testing.T) {
	for _, tc := range []struct {
		s            series
		median, sprd float64
	}{
		{series{5}, 5, 0},
		{series{3, 1, 2}, 2, 1},
		{series{4, 1, 3, 2}, 2.5, 3 / 2.5},
		{series{10, 10, 11, 9, 10}, 10, 0.2},
	} {
		if got := tc.s.median(); got != tc.median {
			t.Errorf("%v median = %v, want %v", tc.s, got, tc.median)
		}
		if got := tc.s.spread(); math.Abs(got-tc.sprd) > 1e-12 {
			t.Errorf("%v spread = %v, want %v", tc.s, got, tc.sprd)
		}
	}
	s := series{3, 1, 2}
	s.median()
	if !slices.Equal(s, series{3, 1, 2}) {
		t.Errorf("median sorted its input: %v", s)
	}
}

func TestAxis(t *testing.T) {
	for _, tc := range []struct {
		top  float64
		step float64
		n    int
	}{
		{113, 50, 3}, {190, 50, 4}, {1, 0.5, 2}, {4.2e6, 2e6, 3}, {0, 1, 4}, {400, 100, 4},
	} {
		step, n := axis(tc.top)
		if math.Abs(step-tc.step) > 1e-9 || n != tc.n {
			t.Errorf("axis(%v) = %v, %d; want %v, %d", tc.top, step, n, tc.step, tc.n)
		}
		if step*float64(n) < tc.top {
			t.Errorf("axis(%v) = %v x %d does not reach the top", tc.top, step, n)
		}
	}
	if got := tick(0.1 * 3); got != "0.3" {
		t.Errorf("tick(0.1*3) = %q", got)
	}
}

func TestRotate(t *testing.T) {
	s := []string{"a", "b", "c"}
	if got := rotate(s, 4); !slices.Equal(got, []string{"b", "c", "a"}) {
		t.Errorf("rotate = %v", got)
	}
	if !slices.Equal(s, []string{"a", "b", "c"}) {
		t.Errorf("rotate changed its input: %v", s)
	}
}

// lastSustained is the last sustained mode: sample() has it lose samples.
// C loses some too, in the second round at batch 256 only.
var lastSustained = benchrun.SustainedModes[len(benchrun.SustainedModes)-1]

// sample builds results as two rounds of every measurement would.
func sample() *results {
	r := &results{env: env{cpus: 2, cpu: `Fake <CPU> & "co"`, kernel: "6.1", libbpf: "v1.4", goVer: "go1.24"},
		rounds: 2, samples: 1000, sustainedPerCPU: 500}
	for round := 0; round < 2; round++ {
		for _, size := range benchrun.Sizes {
			modes := rotate(benchrun.DrainModes, round)
			var ns, allocs []float64
			for i := range modes {
				ns = append(ns, float64(size)/10+float64(i+round))
				allocs = append(allocs, 0.001)
			}
			r.addDrainRound(size, modes, ns, allocs)
		}
		for _, batch := range []int{4096, 256} {
			var sustained []benchrun.SustainedResult
			for i, mode := range benchrun.SustainedModes {
				res := benchrun.SustainedResult{Mode: mode, Batch: batch, Emitted: 1000, Received: 1000, Wall: time.Duration(1+i) * time.Millisecond}
				if mode == lastSustained || mode == benchrun.ModeC && batch == 256 && round == 1 {
					res.Failed, res.Lost, res.Late = 10, 10, 3
				}
				sustained = append(sustained, res)
			}
			r.addSustainedRound(sustained)
		}
		for _, rate := range benchrun.QuietRates {
			r.addQuietRound(rate, quietSample(false, rate, round))
			r.addRBQuietRound(rate, quietSample(true, rate, round))
		}
	}
	return r
}

// quietSample is one round of quiet runs at rate, over a ring buffer with
// ringBuf: C costs 10 µs a wakeup, each mode after it 5 µs more, plus round
// µs, and the program 200 ns a sample, 1 µs more each mode; the last mode
// loses 1; C counts its polls, a sample each but in round
// 1 at 3000/s, 1.5.
func quietSample(ringBuf bool, rate, round int) []benchrun.QuietResult {
	modes := quietModes(config{}, ringBuf, rate, true)
	n := uint64(3 * rate)
	var out []benchrun.QuietResult
	for _, mode := range rotate(modes, round) {
		k := slices.Index(modes, mode)
		res := benchrun.QuietResult{Mode: mode, Rate: rate, Emitted: n, Received: n,
			Window: benchrun.Usage{Voluntary: int64(k+1) * 30, Involuntary: 3, Wall: 3 * time.Second}}
		res.Window.CPU = time.Duration(n) * time.Duration(10+5*k+round) * time.Microsecond
		// The program's own time: 200 ns a sample plus 1 µs a mode.
		res.Prog = kernel.ProgStats{Runs: n, RunTime: time.Duration(n) * time.Duration(200+1000*k) * time.Nanosecond}
		if rate == 0 {
			res.Window.CPU = time.Duration(k+1) * time.Millisecond
		}
		if k == len(modes)-1 && rate > 0 {
			res.Failed, res.Lost = 1, 1
		}
		if mode == benchrun.ModeC {
			res.Polls = n
			if round == 1 && rate == 3000 {
				res.Polls = n * 2 / 3
			}
		}
		out = append(out, res)
	}
	return out
}

func TestResults(t *testing.T) {
	r := sample()
	if len(r.drain) != len(benchrun.Sizes)*len(benchrun.DrainModes) {
		t.Fatalf("%d drain measurements", len(r.drain))
	}
	first := r.drain[0]
	if first.mode != benchrun.ModeC || first.size != benchrun.Sizes[0] || len(first.ns) != 2 {
		t.Errorf("first drain row %+v, want C at the smallest size over 2 rounds", first)
	}
	if got := first.ratio(); got != 1 {
		t.Errorf("C's ratio to itself = %v", got)
	}
	if len(r.sustained) != 2*len(benchrun.SustainedModes) || r.sustained[0].batch != 256 || r.sustained[0].mode != benchrun.ModeC {
		t.Fatalf("%d sustained rows, the first %+v; want C at batch 256 first", len(r.sustained), r.sustained[0])
	}
	if got := r.sustainedOf(benchrun.ModeCallback, 4096).ratio(); math.Abs(got-0.5) > 1e-9 {
		t.Errorf("callback rate ratio = %v, want 0.5", got)
	}
	// Each batch's rows pair with C's rounds at that batch.
	for _, tc := range []struct{ batch, lossy, besideC, clean int }{{4096, 2, 2, 2}, {256, 2, 1, 1}} {
		c := r.sustainedOf(benchrun.ModeC, tc.batch)
		if lossy, besideC := r.sustainedOf(lastSustained, tc.batch).lossyRounds(c); lossy != tc.lossy || besideC != tc.besideC || cleanRounds(c) != tc.clean {
			t.Errorf("%s at %d: %d lossy rounds, %d beside C's %d clean ones; want %d, %d, %d",
				lastSustained, tc.batch, lossy, besideC, cleanRounds(c), tc.lossy, tc.besideC, tc.clean)
		}
	}
	c := r.sustainedOf(benchrun.ModeC, 4096)
	if lossy, _ := c.lossyRounds(c); lossy != 0 {
		t.Errorf("C at 4096: %d lossy rounds, want 0", lossy)
	}
	if errs := r.accountingErrors(); len(errs) != 0 {
		t.Errorf("accounting errors %v", errs)
	}
	// The table: a row per batch and mode, with its lossy rounds and those
	// beside C.
	var table bytes.Buffer
	writeTable(&table, r)
	// The last mode's wall is len(SustainedModes) times C's (sample).
	n := float64(len(benchrun.SustainedModes))
	rate, ratio := fmt.Sprintf("%.0f", 1000/(n*1e-3)), fmt.Sprintf("%.3f", 1/n)
	for _, want := range [][]string{
		{"batch", "mode", "samples/s", "x C", "lost", "lost %", "lossy", "beside C"},
		{"256", lastSustained, rate, ratio, "10", "0.99", "2/2", "1/1"},
		{"4096", lastSustained, rate, ratio, "10", "0.99", "2/2", "2/2"},
	} {
		if !regexp.MustCompile(`(?m)^ *` + strings.Join(want, ` +`) + ` `).MatchString(table.String()) {
			t.Errorf("the table lacks a line %q:\n%s", want, table.String())
		}
	}
	addSustained(&r.sustained, benchrun.SustainedModes, benchrun.SustainedResult{Mode: benchrun.ModeReader, Emitted: 10, Received: 9, Wall: time.Millisecond}, 1)
	if errs := r.accountingErrors(); len(errs) != 1 {
		t.Errorf("accounting errors %v, want one", errs)
	}
	r.addQuietRound(0, []benchrun.QuietResult{{Mode: benchrun.ModeReader, Emitted: 0, Received: 1}})
	if errs := r.accountingErrors(); len(errs) != 2 {
		t.Errorf("accounting errors %v, want two (a sample received while idle)", errs)
	}
}

// The ratio to C pairs each round's measurements: the median of the
// rounds' ratios, not the ratio of the medians (which mixes a slow round of
// one mode with a fast round of the other).
func TestRatioPairsRounds(t *testing.T) {
	r := &results{}
	modes := []string{benchrun.ModeC, benchrun.ModeReader}
	for _, ns := range [][]float64{{1, 2}, {10, 11}, {10, 30}} {
		r.addDrainRound(64, modes, ns, []float64{0, 0})
	}
	if got := r.drainOf(benchrun.ModeReader, 64).ratio(); got != 2 {
		t.Errorf("ratio %v, want 2 (rounds 2, 1.1, 3); the medians' ratio is 1.1", got)
	}
	// The ordered modes go against the C reference over their fill, which
	// goes against C.
	r.addDrainRound(16, []string{benchrun.ModeC, benchrun.ModeC2CPU, benchrun.ModeOrdered}, []float64{1, 2, 5}, []float64{0, 0, 0})
	if o, c2 := r.drainOf(benchrun.ModeOrdered, 16).ratio(), r.drainOf(benchrun.ModeC2CPU, 16).ratio(); o != 2.5 || c2 != 2 {
		t.Errorf("ordered %v (want 2.5), C-2cpu %v (want 2)", o, c2)
	}
}

func TestCSV(t *testing.T) {
	var buf bytes.Buffer
	if err := writeCSV(&buf, sample()); err != nil {
		t.Fatal(err)
	}
	rows, err := csv.NewReader(&buf).ReadAll()
	if err != nil {
		t.Fatal(err)
	}
	nquiet := 2*len(benchrun.QuietModes) + len(benchrun.QuietIdleModes)
	nrbquiet := 2*len(benchrun.RBQuietModes) + len(benchrun.RBQuietIdleModes)
	if want := 1 + len(benchrun.Sizes)*len(benchrun.DrainModes) + 2*len(benchrun.SustainedModes) + nquiet + nrbquiet; len(rows) != want {
		t.Fatalf("%d rows, want %d", len(rows), want)
	}
	col := map[string]int{}
	for i, name := range csvHeader {
		col[name] = i
	}
	for _, row := range rows {
		if len(row) != len(csvHeader) {
			t.Fatalf("row %v has %d fields, header %d", row, len(row), len(csvHeader))
		}
	}
	last := rows[len(rows)-1-nquiet-nrbquiet]
	if last[0] != "sustained" || last[1] != lastSustained || last[col["lost_max"]] != "10" || last[col["lost_total"]] != "20" ||
		last[col["batch"]] != "4096" || last[col["lost_frac_max"]] != "0.00990" {
		t.Errorf("last sustained row %v", last)
	}
	// The quiet rows: by rate, idle last, C first at each.
	quiet := rows[len(rows)-nquiet-nrbquiet : len(rows)-nrbquiet]
	rbquiet := rows[len(rows)-nrbquiet:]
	rbc3000 := rbquiet[len(benchrun.RBQuietModes)]
	first, c3000, idle := quiet[0], quiet[len(benchrun.QuietModes)], quiet[2*len(benchrun.QuietModes)]
	for _, tc := range []struct {
		row            []string
		col, want, why string
	}{
		{first, "kind", "quiet", "kind"},
		{first, "mode", benchrun.ModeC, "C first"},
		{first, "samples_per_s", "300", "rate"},
		{first, "ratio_to_c", "1.000", "C over itself"},
		{first, "cpu_us_per_wakeup", "10.50", "median of 10 and 11 µs"},
		{first, "vcsw_per_wakeup", "0.033", "30 of 900"},
		{first, "samples_per_poll", "1.000", "a sample a poll"},
		{quiet[1], "samples_per_poll", "", "callback's polls not counted here"},
		{c3000, "samples_per_s", "3000", "rate"},
		{quiet[len(benchrun.QuietModes)-1], "lost_total", "2", "the last mode lost 1 a round"},
		{quiet[1], "ratio_to_c", "1.477", "callback: 15/10 and 16/11, the median of the rounds' ratios"},
		{idle, "samples_per_s", "0", "idle"},
		{idle, "ratio_to_c", "", "no ratio while idle"},
		{idle, "cpu_us_per_wakeup", "", "no per-wakeup figure while idle"},
		{idle, "wakeups_per_s", "10.00", "30 in 3 s"},
		{idle, "cpu_ms_per_s", "0.3333", "1 ms in 3 s"},
		{rbquiet[0], "kind", "rbquiet", "kind"},
		{rbquiet[0], "mode", benchrun.ModeC, "C first"},
		{rbquiet[len(benchrun.RBQuietModes)-1], "mode", benchrun.ModeReaderHoldOff, "its last mode"},
		{rbc3000, "samples_per_s", "3000", "rate"},
		{rbc3000, "samples_per_poll", "1.500", "the worst round's"},
		{rbc3000, "prog_ns_per_sample", "200.0", "the program's own time a sample"},
		{rbquiet[len(rbquiet)-1], "samples_per_s", "0", "idle last"},
	} {
		if got := tc.row[col[tc.col]]; got != tc.want {
			t.Errorf("%s of %v = %q, want %q (%s)", tc.col, tc.row[:2], got, tc.want, tc.why)
		}
	}
}

func TestSVG(t *testing.T) {
	var buf bytes.Buffer
	if err := writeSVG(&buf, sample()); err != nil {
		t.Fatal(err)
	}
	d := xml.NewDecoder(&buf)
	rects, texts := 0, []string{}
	for {
		tok, err := d.Token()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("not well-formed XML: %v", err)
		}
		switch tok := tok.(type) {
		case xml.StartElement:
			if tok.Name.Local == "rect" {
				rects++
			}
		case xml.CharData:
			texts = append(texts, string(tok))
		}
	}
	all := strings.Join(texts, "|")
	if !strings.Contains(all, `Fake <CPU> & "co"`) {
		t.Errorf("environment text lost its escaping round trip: %q", all)
	}
	// Background, legend, 4 panel frames, the drain bars, a sustained bar
	// per mode and batch.
	if want := 1 + len(benchrun.DrainModes) + len(benchrun.Sizes) + len(benchrun.Sizes)*len(benchrun.DrainModes) + 2*len(benchrun.SustainedModes); rects != want {
		t.Errorf("%d rects, want %d", rects, want)
	}
}

func TestFlags(t *testing.T) {
	c, err := parseFlags(nil, io.Discard)
	if err != nil || c.rounds != 5 || c.csv != "build/perfbench.csv" || c.svg != "docs/perfbench.svg" {
		t.Errorf("defaults %+v, %v", c, err)
	}
	if !slices.Equal(c.only, measurements) || !slices.Equal(c.quietRates, benchrun.QuietRates) || c.quietModes != nil ||
		c.quietDuration != benchrun.QuietDuration || !filepath.IsAbs(c.cquiet) || !strings.HasSuffix(c.cquiet, "/build/perfbench-cquiet") {
		t.Errorf("quiet defaults %+v", c)
	}
	c, err = parseFlags([]string{"-only", "quiet", "-quiet-rates", "idle,1000", "-quiet-modes", "reader,C", "-quiet-wrap", "perf  stat --"}, io.Discard)
	if err != nil || !slices.Equal(c.only, []string{"quiet"}) || !c.runs(onlyQuiet) || c.runs(onlyDrain) ||
		!slices.Equal(c.quietRates, []int{0, 1000}) || !slices.Equal(c.quietModes, []string{"reader", "C"}) ||
		!slices.Equal(c.quietWrap, []string{"perf", "stat", "--"}) {
		t.Errorf("quiet flags: %+v, %v", c, err)
	}
	for _, bad := range [][]string{
		{"-only", "quiet,fast"}, {"-only", ""}, {"-quiet-rates", "0"}, {"-quiet-rates", "300,"}, {"-quiet-rates", "fast"},
		{"-quiet-modes", "raw-copy"}, {"-quiet-duration", "0s"},
	} {
		if _, err := parseFlags(bad, io.Discard); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
	if _, err := parseFlags([]string{"-rounds", "0"}, io.Discard); err == nil {
		t.Error("-rounds 0 accepted")
	}
	if _, err := parseFlags([]string{"extra"}, io.Discard); err == nil {
		t.Error("extra argument accepted")
	}
	if _, err := parseFlags([]string{"-h"}, io.Discard); !errors.Is(err, flag.ErrHelp) {
		t.Errorf("-h: %v", err)
	}
}

// The ring buffer rows: drains over C in the same round, saturation runs
// over C at the same batch in the same round, loss as a fraction of the
// outputs tried; the table and the CSV carry them.
func TestRBResults(t *testing.T) {
	r := &results{env: env{cpus: 2}, rounds: 2, samples: 100, sustainedPerCPU: 50}
	for round := range 2 {
		for _, size := range benchrun.Sizes {
			modes := rotate(benchrun.RBDrainModes, round)
			ns := make([]float64, len(modes))
			for i, m := range modes {
				ns[i] = float64(1 + slices.Index(benchrun.RBDrainModes, m))
			}
			r.addRBDrainRound(size, modes, ns, make([]float64, len(modes)))
		}
		for _, batch := range []int{4096, 256} {
			var runs []benchrun.SustainedResult
			for i, mode := range benchrun.RBSustainedModes {
				res := benchrun.SustainedResult{Mode: mode, Batch: batch, Emitted: 1000, Received: 1000, Wall: time.Duration(1+i) * time.Millisecond}
				if mode == benchrun.ModeCilium && batch == 4096 {
					res.Emitted, res.Received, res.Failed, res.Lost = 750, 750, 250, 250
				}
				runs = append(runs, res)
			}
			r.addRBSustainedRound(runs)
		}
	}
	if len(r.rbDrain) != len(benchrun.Sizes)*len(benchrun.RBDrainModes) || len(r.drain) != 0 {
		t.Fatalf("%d ring buffer drain rows, %d perf ones", len(r.rbDrain), len(r.drain))
	}
	if d := drainIn(r.rbDrain, benchrun.ModeCilium, 64); d == nil || d.ratio() != float64(1+slices.Index(benchrun.RBDrainModes, benchrun.ModeCilium)) {
		t.Errorf("cilium's drain row %+v", d)
	}
	if r.rbSustained[0].batch != 256 || r.rbSustained[0].mode != benchrun.ModeC {
		t.Errorf("first saturation row %+v, want C at batch 256", r.rbSustained[0])
	}
	c := sustainedIn(r.rbSustained, benchrun.ModeC, 4096)
	cil := sustainedIn(r.rbSustained, benchrun.ModeCilium, 4096)
	if lossy, besideC := cil.lossyRounds(c); lossy != 2 || besideC != 2 || cil.lostF.max() != 0.25 {
		t.Errorf("cilium at 4096: %d lossy rounds, %d beside C, lost fraction %v", lossy, besideC, cil.lostF.max())
	}
	if got := sustainedIn(r.rbSustained, benchrun.ModeCallback, 256).ratio(); math.Abs(got-0.5) > 1e-9 {
		t.Errorf("callback at 256: rate over C %v, want 0.5", got)
	}
	if errs := r.accountingErrors(); len(errs) != 0 {
		t.Errorf("accounting errors %v", errs)
	}

	var table bytes.Buffer
	writeTable(&table, r)
	for _, want := range []string{"BPF ring buffer drain", "BPF ring buffer saturation", "reader-consume", "libbpfgo"} {
		if !strings.Contains(table.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, table.String())
		}
	}
	var buf bytes.Buffer
	if err := writeCSV(&buf, r); err != nil {
		t.Fatal(err)
	}
	rows, err := csv.NewReader(&buf).ReadAll()
	if err != nil {
		t.Fatal(err)
	}
	if want := 1 + len(r.rbDrain) + len(r.rbSustained); len(rows) != want {
		t.Fatalf("%d rows, want %d", len(rows), want)
	}
	col := map[string]int{}
	for i, name := range csvHeader {
		col[name] = i
	}
	last := rows[len(rows)-1]
	if last[col["kind"]] != "rbsustained" || last[col["batch"]] != "4096" || last[col["mode"]] != benchrun.ModeLibbpfgo {
		t.Errorf("last row %v", last)
	}
	for _, row := range rows[1:] {
		if row[col["mode"]] == benchrun.ModeCilium && row[col["batch"]] == "4096" && row[col["lost_frac_max"]] != "0.25000" {
			t.Errorf("cilium at 4096: %v", row)
		}
		if row[col["kind"]] == "rbdrain" && row[col["batch"]] != "" {
			t.Errorf("a drain row with a batch: %v", row)
		}
	}
}

// -batches sets the test-run sizes of both saturation measurements, the
// perf event array's (sustained) and the ring buffer's (rbsustained).
func TestBatchesFlag(t *testing.T) {
	c, err := parseFlags([]string{"-only", "rbdrain,rbsustained,sustained", "-batches", "64, 4096"}, io.Discard)
	if err != nil || !c.runs(onlyRBDrain) || !c.runs(onlyRBSustain) || !c.runs(onlySustained) || c.runs(onlyDrain) ||
		!slices.Equal(c.batches, []int{64, 4096}) {
		t.Errorf("%+v, %v", c, err)
	}
	if c, _ := parseFlags(nil, io.Discard); !slices.Equal(c.batches, benchrun.SustainedBatches) || !slices.Equal(c.batches, []int{256, 4096}) {
		t.Errorf("default batches %v, want %v", c.batches, benchrun.SustainedBatches)
	}
	for _, bad := range []string{"0", "4097", "256,", "x"} {
		if _, err := parseFlags([]string{"-batches", bad}, io.Discard); err == nil {
			t.Errorf("-batches %q accepted", bad)
		}
	}
	if _, err := parseFlags([]string{"-rb-batches", "256"}, io.Discard); err == nil {
		t.Error("-rb-batches, renamed -batches, accepted")
	}
}
