// SPDX-License-Identifier: Apache-2.0

package main

import (
	"encoding/csv"
	"fmt"
	"io"
	"math"
	"os"
	"strconv"
	"text/tabwriter"

	"github.com/perfbuf/perfbuf/bench/internal/benchrun"
)

// writeTable prints the results for people.
func writeTable(w io.Writer, r *results) {
	fmt.Fprintf(w, "perfbench: %s\n", r.env)
	fmt.Fprintf(w, "median of %d rounds; spread = (max - min) / median of the first figure over the rounds\n", r.rounds)
	if r.threadClock {
		fmt.Fprintf(w, "drains: ns are the draining thread's CPU time (-clock thread), not the time that passed\n")
	}
	fmt.Fprintln(w)

	if len(r.drain) > 0 {
		fmt.Fprintf(w, "Drain of pre-filled %s rings, %d samples per measurement (lower ns/sample is better;\n", ringSize(benchrun.DrainPages), r.samples)
		fmt.Fprintf(w, "x C = ns/sample over the C reference's at the same size, in the same rounds: C's for the\n")
		fmt.Fprintf(w, "one-CPU fill, C-2cpu's for the ordered modes' two-CPU fill; C-2cpu's own is over C's;\n")
		fmt.Fprintf(w, "cilium = cilium/ebpf's perf.Reader.ReadInto)\n")
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintln(tw, "size\tmode\tns/sample\tMB/s\tx C\tallocs/sample\tspread\t")
		for _, d := range r.drain {
			fmt.Fprintf(tw, "%d\t%s\t%.1f\t%.0f\t%.2f\t%.3f\t%.0f%%\t\n",
				d.size, d.mode, d.ns.median(), mbps(d.size, d.ns.median()), d.ratio(), d.allocs.median(), 100*d.ns.spread())
		}
		tw.Flush()
	}
	if len(r.sustained) > 0 {
		if len(r.drain) > 0 {
			fmt.Fprintln(w)
		}
		fmt.Fprintf(w, "Sustained: a producer on each of %d CPUs, %d samples each of %d bytes, flat out in test runs of batch samples,\n",
			r.env.cpus, r.sustainedPerCPU, benchrun.SustainedSize)
		fmt.Fprintf(w, "into %s rings with a wakeup every %d samples (higher samples/s is better; x C = rate over C's at\n",
			ringSize(benchrun.SustainedPages), benchrun.SustainedWakeup)
		fmt.Fprintf(w, "the same batch in the same round; lost and late: worst round; lost %% = of the outputs tried, worst round;\n")
		fmt.Fprintf(w, "lossy: rounds with a loss, of all; beside C: of the rounds in which C lost nothing)\n")
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintln(tw, "batch\tmode\tsamples/s\tx C\tlost\tlost %\tlossy\tbeside C\tlate\twall ms\tspread\taccounting\t")
		for _, s := range r.sustained {
			c := r.sustainedOf(benchrun.ModeC, s.batch)
			lossy, besideC := s.lossyRounds(c)
			fmt.Fprintf(tw, "%d\t%s\t%.0f\t%.3f\t%d\t%.2f\t%d/%d\t%d/%d\t%d\t%.0f\t%.0f%%\t%s\t\n",
				s.batch, s.mode, s.rate.median(), s.ratio(), maxU(s.lost), 100*s.lostF.max(), lossy, len(s.lost), besideC, cleanRounds(c),
				maxU(s.late), s.wall.median(), 100*s.rate.spread(), accounting(s.check))
		}
		tw.Flush()
	}
	if len(r.quiet) > 0 {
		if len(r.drain) > 0 || len(r.sustained) > 0 {
			fmt.Fprintln(w)
		}
		writeQuietTables(w, r)
	}
	if len(r.rbDrain) > 0 || len(r.rbSustained) > 0 {
		if len(r.drain) > 0 || len(r.sustained) > 0 || len(r.quiet) > 0 {
			fmt.Fprintln(w)
		}
		writeRBTables(w, r)
	}
	if len(r.rbQuiet) > 0 {
		if len(r.drain) > 0 || len(r.sustained) > 0 || len(r.quiet) > 0 || len(r.rbDrain) > 0 || len(r.rbSustained) > 0 {
			fmt.Fprintln(w)
		}
		writeRBQuietTables(w, r)
	}
	if len(r.host) > 0 {
		if len(r.drain) > 0 || len(r.sustained) > 0 || len(r.quiet) > 0 || len(r.rbDrain) > 0 || len(r.rbSustained) > 0 || len(r.rbQuiet) > 0 {
			fmt.Fprintln(w)
		}
		writeHostTables(w, r)
	}
}

// writeRBTables prints the BPF ring buffer measurements.
func writeRBTables(w io.Writer, r *results) {
	if len(r.rbDrain) > 0 {
		fmt.Fprintf(w, "BPF ring buffer drain: a %d MiB ring buffer filled to %d%%, %d samples per measurement (lower ns/sample is better;\n",
			benchrun.RBBytes>>20, benchrun.RBFillPercent, r.samples)
		fmt.Fprintf(w, "x C = ns/sample over C's in the same rounds; C = ring_buffer__consume, callback = PerfBuffer.Consume,\n")
		fmt.Fprintf(w, "raw-zerocopy = RawBuffer.Drain, reader = Reader.ReadInto, reader-each = Reader.Each, reader-consume = Reader.Consume,\n")
		fmt.Fprintf(w, "cilium = cilium/ebpf ringbuf.Reader.ReadInto, libbpfgo = libbpfgo RingBuffer's channel)\n")
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintln(tw, "size\tmode\tns/sample\tMB/s\tx C\tallocs/sample\tspread\t")
		for _, d := range r.rbDrain {
			fmt.Fprintf(tw, "%d\t%s\t%.1f\t%.0f\t%.2f\t%.3f\t%.0f%%\t\n",
				d.size, d.mode, d.ns.median(), mbps(d.size, d.ns.median()), d.ratio(), d.allocs.median(), 100*d.ns.spread())
		}
		tw.Flush()
	}
	if len(r.rbSustained) > 0 {
		if len(r.rbDrain) > 0 {
			fmt.Fprintln(w)
		}
		fmt.Fprintf(w, "BPF ring buffer saturation: a producer on each of %d CPUs, %d samples each of %d bytes, flat out into one %d MiB\n",
			r.env.cpus, r.sustainedPerCPU, benchrun.SustainedSize, benchrun.RBBytes>>20)
		fmt.Fprintf(w, "ring buffer in test runs of batch samples (higher samples/s is better; x C = rate over C's in the same round;\n")
		fmt.Fprintf(w, "lost = the program's failed outputs (the ring was full), worst round; lost %% = of the outputs tried, worst round;\n")
		fmt.Fprintf(w, "lossy: rounds with a loss, of all; beside C: of the rounds in which C lost nothing)\n")
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintln(tw, "batch\tmode\tsamples/s\tx C\tlost\tlost %\tlossy\tbeside C\twall ms\tspread\taccounting\t")
		for _, s := range r.rbSustained {
			c := sustainedIn(r.rbSustained, benchrun.ModeC, s.batch)
			lossy, besideC := s.lossyRounds(c)
			fmt.Fprintf(tw, "%d\t%s\t%.0f\t%.3f\t%d\t%.2f\t%d/%d\t%d/%d\t%.0f\t%.0f%%\t%s\t\n",
				s.batch, s.mode, s.rate.median(), s.ratio(), maxU(s.lost), 100*s.lostF.max(), lossy, len(s.lost), besideC, cleanRounds(c),
				s.wall.median(), 100*s.rate.spread(), accounting(s.check))
		}
		tw.Flush()
	}
}

// writeQuietTables prints the quiet measurement over perf event arrays:
// per wakeup at each rate, per second while idle.
func writeQuietTables(w io.Writer, r *results) {
	fmt.Fprintf(w, "Quiet: one %d-byte sample per wakeup (WakeupEvents 1, %s rings), emitted on CPU %d at a steady rate\n",
		benchrun.QuietSize, ringSize(benchrun.QuietPages), benchrun.QuietCPU)
	fmt.Fprintf(w, "for %v, or none (idle); each consumer is a process of its own, unpinned, measured from its first wait\n", r.quietDuration)
	fmt.Fprintf(w, "to its last sample (CPU: the task clock of all its threads, as perf stat counts it; context switches: getrusage). Modes: C = perf_buffer__poll,\n")
	fmt.Fprintf(w, "callback = PerfBuffer.Poll, raw-zerocopy = Raw.Wait and RawBuffer.Drain, reader = Reader.ReadInto (MaxLatency\n")
	fmt.Fprintf(w, "100 ms), reader-nolatency = the same with MaxLatency -1, reader-batch = Reader.ReadBatch (64 Samples a call),\n")
	fmt.Fprintf(w, "reader-each = Reader.Each, cilium = cilium/ebpf's perf.Reader.ReadInto (WakeupEvents 1), ordered = Reader with Order (KeyOffset 8), ReadInto,\n")
	fmt.Fprintf(w, "reader-holdoff = Reader.ReadBatch with WakeupEvents above the run's samples and MaxLatency 10 ms.\n")
	writeQuietRows(w, r, r.quiet, "(WakeupEvents 1)")
}

// writeRBQuietTables prints the quiet measurement over a BPF ring buffer
// (rbquiet), as writeQuietTables.
func writeRBQuietTables(w io.Writer, r *results) {
	fmt.Fprintf(w, "BPF ring buffer quiet: one %d-byte sample per wakeup into one %d MiB ring buffer (the program outputs with\n",
		benchrun.QuietSize, benchrun.RBBytes>>20)
	fmt.Fprintf(w, "no flags: the kernel wakes the reader at each commit that finds it caught up), emitted on CPU %d at a steady\n", benchrun.QuietCPU)
	fmt.Fprintf(w, "rate for %v, or none (idle); each consumer is measured as in the quiet measurement. Modes:\n", r.quietDuration)
	fmt.Fprintf(w, "C = ring_buffer__poll, callback = PerfBuffer.Poll, raw-zerocopy = Raw.Wait and RawBuffer.Drain, reader =\n")
	fmt.Fprintf(w, "Reader.ReadInto, reader-batch = Reader.ReadBatch, reader-each = Reader.Each, cilium = cilium/ebpf's ringbuf.Reader.ReadInto,\n")
	fmt.Fprintf(w, "ordered = Reader with Order, ReadInto, reader-holdoff = Reader.ReadBatch with WakeupBytes half the ring and\n")
	fmt.Fprintf(w, "MaxLatency 10 ms (the reader commits nothing after a wakeup, so the kernel raises none until its timer).\n")
	writeQuietRows(w, r, r.rbQuiet, "(at these rates the reader has caught up)")
}

// writeQuietRows prints a quiet measurement's tables, list's rows: per
// wakeup at each rate, per second while idle; why says why a sample is a
// wakeup.
func writeQuietRows(w io.Writer, r *results, list []*quietStat, why string) {
	var active, idle []*quietStat
	for _, q := range list {
		if q.rate == 0 {
			idle = append(idle, q)
		} else {
			active = append(active, q)
		}
	}
	if r.quietNoC != "" {
		fmt.Fprintf(w, "No C rows, and no x C: the C consumer did not run (%s).\n", r.quietNoC)
	}
	if len(active) > 0 {
		fmt.Fprintf(w, "\nPer wakeup, which is per sample: every sample raises a wakeup of its own %s,\n", why)
		fmt.Fprintf(w, "and the figures are divided by the samples received (lower is better; x C = CPU per wakeup over C's in the\n")
		fmt.Fprintf(w, "same round; samples/poll = samples per poll that delivered any, worst round, for the consumers that count\n")
		fmt.Fprintf(w, "their polls, C and callback: 1.00 is a sample a wakeup; lost: worst round; prog ns/sample: the producing\n")
		fmt.Fprintf(w, "program's own time a sample, BPF_ENABLE_STATS, the wakeup it raises included; %s wakes on its\n", benchrun.ModeReaderHoldOff)
		fmt.Fprintf(w, "timer, so its figures are per sample, not per wakeup):\n")
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintln(tw, "rate\tmode\tus CPU/wakeup\tcsw/wakeup\tvoluntary\tx C\tsamples/poll\tprog ns/sample\tlost\tspread\taccounting\t")
		for _, q := range active {
			fmt.Fprintf(tw, "%s\t%s\t%.1f\t%.2f\t%.2f\t%s\t%s\t%.0f\t%d\t%.0f%%\t%s\t\n",
				benchrun.RateName(q.rate), q.mode, q.cpu.median(), q.csw.median(), q.vcsw.median(),
				ratioText(q.ratio()), perPollText(q.perPoll), q.prog.median(), maxU(q.lost), 100*q.cpu.spread(), accounting(q.check))
		}
		tw.Flush()
	}
	if len(idle) > 0 {
		fmt.Fprintf(w, "\nIdle, per second (wakeups = voluntary context switches: sleeps that a wakeup ended):\n")
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintln(tw, "mode\twakeups/s\tcsw/s\tCPU ms/s\tspread\taccounting\t")
		for _, q := range idle {
			fmt.Fprintf(tw, "%s\t%.1f\t%.1f\t%.3f\t%.0f%%\t%s\t\n",
				q.mode, q.wakeups.median(), q.cswSec.median(), q.cpuSec.median(), 100*q.wakeups.spread(), accounting(q.check))
		}
		tw.Flush()
	}
}

// perPollText is the rounds' largest samples per poll with two decimals
// (1.00: every poll that delivered a sample delivered one), or "-" for a
// consumer that does not count its polls.
func perPollText(s series) string {
	if len(s) == 0 {
		return "-"
	}
	return strconv.FormatFloat(s.max(), 'f', 2, 64)
}

// ratioText is a ratio to C with two decimals, or "-" without one.
func ratioText(x float64) string {
	if math.IsNaN(x) {
		return "-"
	}
	return strconv.FormatFloat(x, 'f', 2, 64)
}

// accounting is "ok", or how many rounds had an accounting mismatch.
func accounting(bad []error) string {
	if len(bad) > 0 {
		return fmt.Sprintf("%d bad", len(bad))
	}
	return "ok"
}

// ringSize describes a ring of pages data pages: "64-page (256 KiB)".
func ringSize(pages int) string {
	kib := pages * os.Getpagesize() >> 10
	if kib >= 1024 && kib%1024 == 0 {
		return fmt.Sprintf("%d-page (%d MiB)", pages, kib>>10)
	}
	return fmt.Sprintf("%d-page (%d KiB)", pages, kib)
}

// csvHeader names the CSV columns. Each kind of row fills the columns that
// apply to it and leaves the others empty: drain rows the ns ones,
// sustained rows the rate ones, quiet rows (one per mode and rate)
// cpu_us_per_wakeup to cpu_ms_per_s, with samples_per_s the rate emitted
// (0: idle), lost_* and wall_ms (the measured window). The ring buffer
// rows, rbdrain and rbsustained, fill the columns of drain and sustained
// rows, an rbsustained row's lost counts being the program's failed
// outputs. Sustained and rbsustained rows fill batch (samples per test run)
// and lost_frac_max (the worst round's lost over the outputs tried). The
// rbquiet rows, over a BPF ring buffer, fill the quiet rows' columns, their
// lost counts being the program's failed outputs; a quiet or rbquiet row
// of a consumer that counts its polls fills samples_per_poll (the worst
// round's samples per poll that delivered any), and at a rate
// prog_ns_per_sample (the producing program's own time a sample, the
// wakeup it raises included). ratio_to_c is the median
// of the rounds' ratios:
// ns over the C reference's (benchrun.Reference) for a drain, rate over
// C's for a sustained run, CPU per wakeup over C's for a quiet one (empty
// while idle, or without C).
var csvHeader = []string{
	"kind", "mode", "size", "rounds",
	"ns_per_sample", "ns_min", "ns_max", "mb_per_s", "allocs_per_sample",
	"samples_per_s", "rate_min", "rate_max", "lost_max", "lost_total", "late_max", "wall_ms",
	"ratio_to_c",
	"cpu_us_per_wakeup", "csw_per_wakeup", "vcsw_per_wakeup", "wakeups_per_s", "csw_per_s", "cpu_ms_per_s",
	"batch", "lost_frac_max",
	"samples_per_poll", "prog_ns_per_sample",
}

// writeCSV writes one row per measurement, with medians over the rounds.
func writeCSV(w io.Writer, r *results) error {
	cw := csv.NewWriter(w)
	f, u := csvFloat, csvUint
	if err := cw.Write(csvHeader); err != nil {
		return err
	}
	drains := func(kind string, list []*drainStat) error {
		for _, d := range list {
			m := d.ns.median()
			row := []string{kind, d.mode, strconv.Itoa(d.size), strconv.Itoa(len(d.ns)),
				f(m, 2), f(d.ns.min(), 2), f(d.ns.max(), 2), f(mbps(d.size, m), 1), f(d.allocs.median(), 4),
				"", "", "", "", "", "", "",
				f(d.ratio(), 3),
				"", "", "", "", "", "",
				"", "", "", ""}
			if err := cw.Write(row); err != nil {
				return err
			}
		}
		return nil
	}
	sustained := func(kind string, list []*sustainedStat) error {
		for _, s := range list {
			batch, lostFrac := "", ""
			if s.batch > 0 {
				batch, lostFrac = strconv.Itoa(s.batch), f(s.lostF.max(), 5)
			}
			row := []string{kind, s.mode, strconv.Itoa(benchrun.SustainedSize), strconv.Itoa(len(s.rate)),
				"", "", "", "", "",
				f(s.rate.median(), 0), f(s.rate.min(), 0), f(s.rate.max(), 0), u(maxU(s.lost)), u(sumU(s.lost)), u(maxU(s.late)), f(s.wall.median(), 1),
				f(s.ratio(), 3),
				"", "", "", "", "", "",
				batch, lostFrac, "", ""}
			if err := cw.Write(row); err != nil {
				return err
			}
		}
		return nil
	}
	if err := drains("drain", r.drain); err != nil {
		return err
	}
	if err := sustained("sustained", r.sustained); err != nil {
		return err
	}
	quiets := func(kind string, list []*quietStat) error {
		for _, q := range list {
			if err := cw.Write(quietRow(kind, q)); err != nil {
				return err
			}
		}
		return nil
	}
	if err := quiets("quiet", r.quiet); err != nil {
		return err
	}
	if err := drains("rbdrain", r.rbDrain); err != nil {
		return err
	}
	if err := sustained("rbsustained", r.rbSustained); err != nil {
		return err
	}
	if err := quiets("rbquiet", r.rbQuiet); err != nil {
		return err
	}
	cw.Flush()
	return cw.Error()
}

// quietRow is q's CSV row, of kind quiet or rbquiet.
func quietRow(kind string, q *quietStat) []string {
	perWakeup := []string{"", "", ""}
	xc := ""
	if q.rate > 0 {
		perWakeup = []string{csvFloat(q.cpu.median(), 2), csvFloat(q.csw.median(), 3), csvFloat(q.vcsw.median(), 3)}
		if x := q.ratio(); !math.IsNaN(x) {
			xc = csvFloat(x, 3)
		}
	}
	perPoll, prog := "", ""
	if len(q.perPoll) > 0 {
		perPoll = csvFloat(q.perPoll.max(), 3)
	}
	if q.rate > 0 {
		prog = csvFloat(q.prog.median(), 1)
	}
	row := []string{kind, q.mode, strconv.Itoa(benchrun.QuietSize), strconv.Itoa(len(q.wall)),
		"", "", "", "", "",
		strconv.Itoa(q.rate), "", "", csvUint(maxU(q.lost)), csvUint(sumU(q.lost)), "", csvFloat(q.wall.median(), 1),
		xc}
	row = append(row, perWakeup...)
	return append(row, csvFloat(q.wakeups.median(), 2), csvFloat(q.cswSec.median(), 2), csvFloat(q.cpuSec.median(), 4),
		"", "", perPoll, prog)
}

func csvFloat(v float64, prec int) string { return strconv.FormatFloat(v, 'f', prec, 64) }
func csvUint(v uint64) string             { return strconv.FormatUint(v, 10) }
