package main

import (
	"bytes"
	"encoding/csv"
	"encoding/xml"
	"errors"
	"flag"
	"io"
	"math"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/perfbuf/perfbuf/internal/benchrun"
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
		var sustained []benchrun.SustainedResult
		for i, mode := range benchrun.SustainedModes {
			res := benchrun.SustainedResult{Mode: mode, Emitted: 1000, Received: 1000, Wall: time.Duration(1+i) * time.Millisecond}
			if mode == lastSustained {
				res.Failed, res.Lost, res.Late = 10, 10, 3
			}
			sustained = append(sustained, res)
		}
		r.addSustainedRound(sustained)
	}
	return r
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
	if got := r.sustainedOf(benchrun.ModeCallback).ratio(); math.Abs(got-0.5) > 1e-9 {
		t.Errorf("callback rate ratio = %v, want 0.5", got)
	}
	if errs := r.accountingErrors(); len(errs) != 0 {
		t.Errorf("accounting errors %v", errs)
	}
	r.addSustained(benchrun.SustainedResult{Mode: benchrun.ModeReader, Emitted: 10, Received: 9, Wall: time.Millisecond}, 1)
	if errs := r.accountingErrors(); len(errs) != 1 {
		t.Errorf("accounting errors %v, want one", errs)
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
	if want := 1 + len(benchrun.Sizes)*len(benchrun.DrainModes) + len(benchrun.SustainedModes); len(rows) != want {
		t.Fatalf("%d rows, want %d", len(rows), want)
	}
	for _, row := range rows {
		if len(row) != len(csvHeader) {
			t.Fatalf("row %v has %d fields, header %d", row, len(row), len(csvHeader))
		}
	}
	last := rows[len(rows)-1]
	if last[0] != "sustained" || last[1] != lastSustained || last[12] != "10" || last[13] != "20" {
		t.Errorf("last row %v", last)
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
	// Background, legend, 4 panel frames, 24 drain bars, 4 sustained bars.
	if want := 1 + len(benchrun.DrainModes) + len(benchrun.Sizes) + len(benchrun.Sizes)*len(benchrun.DrainModes) + len(benchrun.SustainedModes); rects != want {
		t.Errorf("%d rects, want %d", rects, want)
	}
}

func TestFlags(t *testing.T) {
	c, err := parseFlags(nil, io.Discard)
	if err != nil || c.rounds != 5 || c.csv != "build/perfbench.csv" || c.svg != "docs/perfbench.svg" {
		t.Errorf("defaults %+v, %v", c, err)
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
