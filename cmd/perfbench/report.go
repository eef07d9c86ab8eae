package main

import (
	"encoding/csv"
	"fmt"
	"io"
	"os"
	"strconv"
	"text/tabwriter"

	"github.com/perfbuf/perfbuf/internal/benchrun"
)

// writeTable prints the results for people.
func writeTable(w io.Writer, r *results) {
	fmt.Fprintf(w, "perfbench: %s\n", r.env)
	fmt.Fprintf(w, "median of %d rounds; spread = (max - min) / median of ns or rate over the rounds\n\n", r.rounds)

	fmt.Fprintf(w, "Drain of pre-filled %s rings, %d samples per measurement (lower ns/sample is better;\n", ringSize(benchrun.DrainPages), r.samples)
	fmt.Fprintf(w, "x C = ns/sample over the C reference's at the same size, in the same rounds: C's for the\n")
	fmt.Fprintf(w, "one-CPU fill, C-2cpu's for the ordered modes' two-CPU fill; C-2cpu's own is over C's)\n")
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "size\tmode\tns/sample\tMB/s\tx C\tallocs/sample\tspread\t")
	for _, d := range r.drain {
		fmt.Fprintf(tw, "%d\t%s\t%.1f\t%.0f\t%.2f\t%.3f\t%.0f%%\t\n",
			d.size, d.mode, d.ns.median(), mbps(d.size, d.ns.median()), d.ratio(), d.allocs.median(), 100*d.ns.spread())
	}
	tw.Flush()

	fmt.Fprintf(w, "\nSustained: a producer on each of %d CPUs, %d samples each of %d bytes, %s rings, wakeup every %d samples\n",
		r.env.cpus, r.sustainedPerCPU, benchrun.SustainedSize, ringSize(benchrun.SustainedPages), benchrun.SustainedWakeup)
	fmt.Fprintf(w, "(higher samples/s is better; x C = rate over the C reference's in the same round; lost and late: worst round)\n")
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "mode\tsamples/s\tx C\tlost\tlate\twall ms\tspread\taccounting\t")
	for _, s := range r.sustained {
		acct := "ok"
		if len(s.check) > 0 {
			acct = fmt.Sprintf("%d bad", len(s.check))
		}
		fmt.Fprintf(tw, "%s\t%.0f\t%.3f\t%d\t%d\t%.0f\t%.0f%%\t%s\t\n",
			s.mode, s.rate.median(), s.ratio(), maxU(s.lost), maxU(s.late), s.wall.median(), 100*s.rate.spread(), acct)
	}
	tw.Flush()
}

// ringSize describes a ring of pages data pages: "64-page (256 KiB)".
func ringSize(pages int) string {
	kib := pages * os.Getpagesize() >> 10
	if kib >= 1024 && kib%1024 == 0 {
		return fmt.Sprintf("%d-page (%d MiB)", pages, kib>>10)
	}
	return fmt.Sprintf("%d-page (%d KiB)", pages, kib)
}

// csvHeader names the CSV columns. Drain rows leave the sustained columns
// empty and the other way round; ratio_to_c is ns over the C reference's
// (benchrun.Reference) for a drain and rate over C's for a sustained run,
// the median of the rounds' ratios.
var csvHeader = []string{
	"kind", "mode", "size", "rounds",
	"ns_per_sample", "ns_min", "ns_max", "mb_per_s", "allocs_per_sample",
	"samples_per_s", "rate_min", "rate_max", "lost_max", "lost_total", "late_max", "wall_ms",
	"ratio_to_c",
}

// writeCSV writes one row per measurement, with medians over the rounds.
func writeCSV(w io.Writer, r *results) error {
	cw := csv.NewWriter(w)
	f := func(v float64, prec int) string { return strconv.FormatFloat(v, 'f', prec, 64) }
	u := func(v uint64) string { return strconv.FormatUint(v, 10) }
	if err := cw.Write(csvHeader); err != nil {
		return err
	}
	for _, d := range r.drain {
		m := d.ns.median()
		row := []string{"drain", d.mode, strconv.Itoa(d.size), strconv.Itoa(len(d.ns)),
			f(m, 2), f(d.ns.min(), 2), f(d.ns.max(), 2), f(mbps(d.size, m), 1), f(d.allocs.median(), 4),
			"", "", "", "", "", "", "",
			f(d.ratio(), 3)}
		if err := cw.Write(row); err != nil {
			return err
		}
	}
	for _, s := range r.sustained {
		row := []string{"sustained", s.mode, strconv.Itoa(benchrun.SustainedSize), strconv.Itoa(len(s.rate)),
			"", "", "", "", "",
			f(s.rate.median(), 0), f(s.rate.min(), 0), f(s.rate.max(), 0), u(maxU(s.lost)), u(sumU(s.lost)), u(maxU(s.late)), f(s.wall.median(), 1),
			f(s.ratio(), 3)}
		if err := cw.Write(row); err != nil {
			return err
		}
	}
	cw.Flush()
	return cw.Error()
}
