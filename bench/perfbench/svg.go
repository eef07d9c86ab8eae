// SPDX-License-Identifier: Apache-2.0

package main

import (
	"bufio"
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"

	"github.com/perfbuf/perfbuf/bench/internal/benchrun"
)

// The chart: a panel per sample size with ns per sample for every mode
// (each panel has its own scale: 1024-byte samples cost ten times 16-byte
// ones), whiskers from the fastest to the slowest round, and below them the
// sustained rates as horizontal bars. Plain SVG 1.1 written by hand.

// modeColor gives each mode its colour; the C reference is grey.
var modeColor = map[string]string{
	benchrun.ModeC:            "#6b6b6b",
	benchrun.ModeC2CPU:        "#a8a8a8",
	benchrun.ModeCallback:     "#1f77b4",
	benchrun.ModeRawZeroCopy:  "#2ca02c",
	benchrun.ModeRawCopy:      "#8fd17e",
	benchrun.ModeReader:       "#ff7f0e",
	benchrun.ModeReaderEach:   "#ffbb78",
	benchrun.ModeReaderBatch:  "#c5b0d5",
	benchrun.ModeOrdered:      "#d62728",
	benchrun.ModeOrderedEach:  "#ff9896",
	benchrun.ModeOrderedBatch: "#e377c2",
}

const (
	svgWidth   = 960
	panelGap   = 14
	panelTop   = 96
	panelH     = 250
	plotTop    = panelTop + 26 // below the panel title
	plotBottom = panelTop + panelH - 22
	susTop     = panelTop + panelH + 30
	susRowH    = 30
	susLeft    = 150 // room for "ordered-each, 4096"
	susRight   = svgWidth - 350
)

var xmlEscaper = strings.NewReplacer("&", "&amp;", "<", "&lt;", ">", "&gt;", `"`, "&quot;")

func esc(s string) string { return xmlEscaper.Replace(s) }

// axis chooses a scale for values up to top: a round step (1, 2 or 5
// times a power of ten) and the number of steps, 3 to 6 of them.
func axis(top float64) (step float64, n int) {
	if top <= 0 || math.IsNaN(top) || math.IsInf(top, 0) {
		return 1, 4
	}
	raw := top / 4
	p := math.Pow(10, math.Floor(math.Log10(raw)))
	step = 10 * p
	for _, m := range []float64{1, 2, 5} {
		if m*p >= raw*(1-1e-9) {
			step = m * p
			break
		}
	}
	return step, int(math.Ceil(top/step - 1e-9))
}

// num formats a value with about three significant digits.
func num(v float64) string {
	switch {
	case v == 0:
		return "0"
	case v >= 100:
		return fmt.Sprintf("%.0f", v)
	case v >= 10:
		return fmt.Sprintf("%.1f", v)
	default:
		return fmt.Sprintf("%.2f", v)
	}
}

// tick formats an axis value: round steps need no padding digits.
func tick(v float64) string { return strconv.FormatFloat(math.Round(v*1e6)/1e6, 'f', -1, 64) }

// writeSVG draws r.
func writeSVG(w io.Writer, r *results) error {
	bw := bufio.NewWriter(w)
	p := func(format string, args ...any) { fmt.Fprintf(bw, format, args...) }

	nsus := len(r.sustained)
	height := susTop + 28 + nsus*susRowH + 26
	p(`<?xml version="1.0" encoding="UTF-8"?>` + "\n")
	p(`<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="DejaVu Sans, Helvetica, Arial, sans-serif">`+"\n",
		svgWidth, height, svgWidth, height)
	p(`<rect width="100%%" height="100%%" fill="#ffffff"/>` + "\n")
	p(`<text x="16" y="28" font-size="18" font-weight="bold">perfbuf: every mode beside the C reference (libbpf from C)</text>` + "\n")
	p(`<text x="16" y="48" font-size="11" fill="#444">%s</text>`+"\n", esc(r.env.String()))
	p(`<text x="16" y="64" font-size="11" fill="#444">Drain of pre-filled %s rings, %d samples each: ns per sample (lower is better), median of %d rounds, whiskers best to worst</text>`+"\n",
		ringSize(benchrun.DrainPages), r.samples, r.rounds)

	// Legend.
	x := 16
	for _, m := range benchrun.DrainModes {
		p(`<rect x="%d" y="74" width="12" height="12" fill="%s"/>`, x, modeColor[m])
		p(`<text x="%d" y="84" font-size="12">%s</text>`+"\n", x+16, esc(m))
		x += 24 + 8*len(m) + 10
	}

	// One panel per size.
	sizes := benchrun.Sizes
	panelW := (svgWidth - 16*2 - panelGap*(len(sizes)-1)) / len(sizes)
	for i, size := range sizes {
		left := 16 + i*(panelW+panelGap)
		drawPanel(p, r, size, left, panelW)
	}

	// Sustained rates.
	p(`<text x="16" y="%d" font-size="14" font-weight="bold">Sustained: a producer on each of %d CPUs, %d-byte samples, %s rings, wakeup every %d samples</text>`+"\n",
		susTop, r.env.cpus, benchrun.SustainedSize, ringSize(benchrun.SustainedPages), benchrun.SustainedWakeup)
	p(`<text x="16" y="%d" font-size="11" fill="#444">samples per second of wall time (higher is better), median of %d rounds, whiskers worst to best; rows: mode, samples per test run; lost and late: worst round</text>`+"\n",
		susTop+16, r.rounds)
	top := susTop + 28
	var maxRate float64
	for _, s := range r.sustained {
		maxRate = max(maxRate, s.rate.max())
	}
	step, steps := axis(maxRate)
	scale := step * float64(steps)
	xOf := func(v float64) float64 { return susLeft + (susRight-susLeft)*v/scale }
	for k := 0; k <= steps; k++ {
		v := step * float64(k)
		gx := xOf(v)
		p(`<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="#e3e3e3"/>`, gx, top, gx, top+nsus*susRowH)
		p(`<text x="%.1f" y="%d" font-size="10" fill="#666" text-anchor="middle">%sM</text>`+"\n", gx, top+nsus*susRowH+14, tick(v/1e6))
	}
	for j, s := range r.sustained {
		y := top + j*susRowH + 4
		med := s.rate.median()
		p(`<text x="%d" y="%d" font-size="12" text-anchor="end">%s, %d</text>`, susLeft-8, y+15, esc(s.mode), s.batch)
		p(`<rect x="%d" y="%d" width="%.1f" height="%d" fill="%s"><title>%s, test runs of %d: %.0f samples/s</title></rect>`,
			susLeft, y, xOf(med)-susLeft, susRowH-10, modeColor[s.mode], esc(s.mode), s.batch, med)
		p(`<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="#222"/>`, xOf(s.rate.min()), y+10, xOf(s.rate.max()), y+10)
		note := fmt.Sprintf("%.2f M/s, %.2fx C, lost %d", med/1e6, s.ratio(), maxU(s.lost))
		if lost := maxU(s.lost); lost > 0 {
			note += fmt.Sprintf(" (%.0f%%)", 100*s.lostF.max())
		}
		if late := maxU(s.late); late > 0 {
			note += fmt.Sprintf(", late %d", late)
		}
		if len(s.check) > 0 {
			note += ", ACCOUNTING MISMATCH"
		}
		p(`<text x="%d" y="%d" font-size="12">%s</text>`+"\n", susRight+10, y+15, esc(note))
	}
	p("</svg>\n")
	return bw.Flush()
}

// drawPanel draws the bars of one sample size.
func drawPanel(p func(string, ...any), r *results, size, left, width int) {
	var bars []*drainStat
	var top float64
	for _, d := range r.drain {
		if d.size == size {
			bars = append(bars, d)
			top = max(top, d.ns.max())
		}
	}
	step, steps := axis(top * 1.08) // room for the labels
	scale := step * float64(steps)
	plotLeft, plotRight := left+34, left+width-4
	yOf := func(v float64) float64 {
		return plotBottom - float64(plotBottom-plotTop)*v/scale
	}
	p(`<rect x="%d" y="%d" width="%d" height="%d" fill="none" stroke="#cccccc"/>`+"\n", left, panelTop, width, panelH)
	p(`<text x="%d" y="%d" font-size="13" font-weight="bold" text-anchor="middle">%d-byte samples</text>`+"\n",
		left+width/2, panelTop+17, size)
	for k := 0; k <= steps; k++ {
		v := step * float64(k)
		y := yOf(v)
		p(`<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="#e3e3e3"/>`, plotLeft, y, plotRight, y)
		p(`<text x="%d" y="%.1f" font-size="10" fill="#666" text-anchor="end">%s</text>`+"\n", plotLeft-4, y+3, tick(v))
	}
	if len(bars) == 0 {
		return
	}
	slot := float64(plotRight-plotLeft) / float64(len(bars))
	bw := slot * 0.72
	for j, d := range bars {
		med := d.ns.median()
		bx := float64(plotLeft) + slot*float64(j) + (slot-bw)/2
		y := yOf(med)
		cx := bx + bw/2
		p(`<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="%s"><title>%s, %d bytes: %.2f ns/sample (%.2fx C)</title></rect>`,
			bx, y, bw, plotBottom-y, modeColor[d.mode], esc(d.mode), size, med, d.ratio())
		p(`<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#222"/>`, cx, yOf(d.ns.min()), cx, yOf(d.ns.max()))
		p(`<text x="%.1f" y="%.1f" font-size="8.5" text-anchor="middle">%s</text>`+"\n", cx, yOf(d.ns.max())-3, num(med))
		p(`<text x="%.1f" y="%d" font-size="8.5" fill="#444" text-anchor="middle">%.1f</text>`+"\n", cx, plotBottom+12, d.ratio())
	}
	p(`<text x="%d" y="%d" font-size="9" fill="#666">x C:</text>`+"\n", left+4, plotBottom+12)
}
