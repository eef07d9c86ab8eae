// SPDX-License-Identifier: Apache-2.0

package main

// The host measurement's side in perfbench (benchrun.RunHost): the
// consumers' commands, the rounds, and its table and CSV.

import (
	"encoding/csv"
	"fmt"
	"io"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/perfbuf/perfbuf/bench/internal/benchrun"
)

// hostCommand returns the command of mode's consumer in the host
// measurement: the C program at cquiet for C and C-tuned, else this
// executable (self) as a Go consumer; nil for the detached workload.
func hostCommand(mode string, ringBuf bool, self, cquiet string, wrap []string, stderr io.Writer) benchrun.QuietCommand {
	if mode == benchrun.ModeDetached {
		return nil
	}
	return func(count int, timeout time.Duration) *exec.Cmd {
		var argv []string
		if mode == benchrun.ModeC || mode == benchrun.ModeCTuned {
			ms := (timeout + time.Millisecond - 1) / time.Millisecond
			argv = []string{cquiet}
			if ringBuf {
				argv = append(argv, "-ringbuf")
			}
			argv = append(argv, "-pages", strconv.Itoa(benchrun.HostPerfPages), "-latency")
			if mode == benchrun.ModeCTuned {
				argv = append(argv, "-tick-ms", strconv.FormatInt(benchrun.HostBudget.Milliseconds(), 10))
			}
			argv = append(argv, strconv.Itoa(benchrun.QuietMapFD), strconv.Itoa(count), strconv.FormatInt(int64(ms), 10))
		} else {
			argv = append(append([]string{self}, consumerArgs(mode, ringBuf, count, timeout)...), "-host")
		}
		argv = append(slices.Clone(wrap), argv...)
		cmd := exec.Command(argv[0], argv[1:]...)
		cmd.Stderr = stderr
		return cmd
	}
}

// hostModes are the modes measured: those of benchrun that -host-modes
// keeps, without C and C-tuned if their program is missing.
func hostModes(c config, haveC bool) []string {
	var out []string
	for _, m := range benchrun.HostModes {
		isC := m == benchrun.ModeC || m == benchrun.ModeCTuned
		if (!isC || haveC) && (len(c.hostModes) == 0 || slices.Contains(c.hostModes, m)) {
			out = append(out, m)
		}
	}
	return out
}

// parseHostModes parses -host-modes: a subset of benchrun.HostModes, or
// empty for all.
func parseHostModes(s string) ([]string, error) {
	if s == "" {
		return nil, nil
	}
	var out []string
	for _, m := range strings.Split(s, ",") {
		m = strings.TrimSpace(m)
		if !slices.Contains(benchrun.HostModes, m) {
			return nil, fmt.Errorf("-host-modes: unknown mode %q (modes: %s)", m, strings.Join(benchrun.HostModes, ", "))
		}
		out = append(out, m)
	}
	return out, nil
}

// parseHostRates parses -host-rates: events a second, 1 to 10,000,000.
func parseHostRates(s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n <= 0 || n > 10000000 {
			return nil, fmt.Errorf("-host-rates: %q is not a rate in events a second (1-10000000)", f)
		}
		out = append(out, n)
	}
	return out, nil
}

// measureHost runs one round of the host measurement over one ring kind:
// at each rate, every mode in turn (starting with another one each round).
func measureHost(h *benchrun.Host, ringBuf bool, c config, r *results, round int, stderr io.Writer) error {
	self, err := os.Executable()
	if err != nil {
		return fmt.Errorf("host: find perfbench's executable: %w", err)
	}
	name := onlyHost
	if ringBuf {
		name = onlyRBHost
	}
	modes := hostModes(c, cquietMissing(c.cquiet) == "")
	for _, rate := range c.hostRates {
		var res []benchrun.HostResult
		for _, mode := range rotate(modes, round) {
			q, err := benchrun.RunHost(h, benchrun.HostConfig{Mode: mode, RingBuf: ringBuf, Rate: rate, Duration: c.hostDuration,
				Command: hostCommand(mode, ringBuf, self, c.cquiet, c.quietWrap, stderr)})
			if err != nil {
				return err
			}
			res = append(res, q)
			prefix := fmt.Sprintf("round %d/%d  %s %-16s %9s  reached %.0f/s (late by %v at most)  workload %.0f ns (charged %.0f)",
				round+1, c.rounds, name, mode, benchrun.RateName(rate), q.Reached(), q.MaxLag.Round(time.Microsecond),
				q.WorkloadPerEvent(), perEvent(q.WorkloadCharged, q.Calls))
			if mode == benchrun.ModeDetached {
				fmt.Fprintf(stderr, "%s  %d calls\n", prefix, q.Calls)
			} else {
				fmt.Fprintf(stderr, "%s  prog %.0f ns  reader %.0f ns, %.2f csw  latency p50 %v p99 %v max %v  received %d of %d calls, lost %d\n",
					prefix, q.ProgPerEvent(), q.ReaderPerEvent(), q.SwitchesPerEvent(),
					q.Latency.P50.Round(time.Microsecond), q.Latency.P99.Round(time.Microsecond), q.Latency.Max.Round(time.Microsecond),
					q.Received, q.Calls, q.Lost)
			}
			if err := q.Check(); err != nil {
				fmt.Fprintf(stderr, "round %d/%d  %v\n", round+1, c.rounds, err)
			}
		}
		r.addHostRound(res)
	}
	return nil
}

func perEvent(d time.Duration, n int) float64 {
	if n <= 0 {
		return 0
	}
	return float64(d.Nanoseconds()) / float64(n)
}

// hostStat is one host measurement (a mode, a kind, a rate) over the
// rounds.
type hostStat struct {
	mode    string
	ringBuf bool
	rate    int
	reached series // calls a second the workload made
	// Per event, in ns: the program's own time, the workload thread's
	// task clock, that less the detached workload's in the same round
	// (empty without a detached run), and the consumer's task clock.
	prog, workload, added, reader series
	charged                       series // the workload thread's CPU time a call (CLOCK_THREAD_CPUTIME_ID), ns
	csw                           series // the consumer's context switches an event
	p50, p99, maxLat              series // delivery latency, µs
	lost                          []uint64
	check                         []error
}

// addHostRound adds one round of host runs at one rate and kind.
func (r *results) addHostRound(round []benchrun.HostResult) {
	var base float64
	haveBase := false
	for _, res := range round {
		if res.Mode == benchrun.ModeDetached {
			base, haveBase = res.WorkloadPerEvent(), true
		}
	}
	for _, res := range round {
		h := hostIn(r.host, res.Mode, res.RingBuf, res.Rate)
		if h == nil {
			h = &hostStat{mode: res.Mode, ringBuf: res.RingBuf, rate: res.Rate}
			r.host = append(r.host, h)
			slices.SortStableFunc(r.host, func(a, b *hostStat) int {
				switch {
				case a.ringBuf != b.ringBuf:
					return boolOrder(a.ringBuf) - boolOrder(b.ringBuf)
				case a.rate != b.rate:
					return a.rate - b.rate
				}
				return slices.Index(benchrun.HostModes, a.mode) - slices.Index(benchrun.HostModes, b.mode)
			})
		}
		h.reached = append(h.reached, res.Reached())
		h.workload = append(h.workload, res.WorkloadPerEvent())
		h.charged = append(h.charged, perEvent(res.WorkloadCharged, res.Calls))
		if haveBase {
			h.added = append(h.added, res.WorkloadPerEvent()-base)
		}
		if res.Mode != benchrun.ModeDetached {
			h.prog = append(h.prog, res.ProgPerEvent())
			h.reader = append(h.reader, res.ReaderPerEvent())
			h.csw = append(h.csw, res.SwitchesPerEvent())
			h.p50 = append(h.p50, us(res.Latency.P50))
			h.p99 = append(h.p99, us(res.Latency.P99))
			h.maxLat = append(h.maxLat, us(res.Latency.Max))
			h.lost = append(h.lost, res.Lost)
		}
		if err := res.Check(); err != nil {
			h.check = append(h.check, err)
		}
	}
}

func boolOrder(b bool) int {
	if b {
		return 1
	}
	return 0
}

func us(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1e3 }

func hostIn(list []*hostStat, mode string, ringBuf bool, rate int) *hostStat {
	for _, h := range list {
		if h.mode == mode && h.ringBuf == ringBuf && h.rate == rate {
			return h
		}
	}
	return nil
}

// medianText is s's median with prec decimals, or "-" for no values.
func medianText(s series, prec int) string {
	if len(s) == 0 {
		return "-"
	}
	return strconv.FormatFloat(s.median(), 'f', prec, 64)
}

// writeHostTables prints the host measurement, a table for each kind.
func writeHostTables(w io.Writer, r *results) {
	fmt.Fprintf(w, "Host: what an event costs the whole host. A tracepoint program on getppid(2) writes a %d-byte record\n", benchrun.HostRecordSize)
	fmt.Fprintf(w, "(seq, bpf_ktime_get_ns) for each call of one workload thread, pinned to CPU %d, calling at the rate for %v on an\n",
		benchrun.HostCPU, r.hostDuration)
	fmt.Fprintf(w, "absolute clock; rings: %s per CPU (perf), %d MiB (ring buffer). Per event, median of the rounds: prog = the\n",
		ringSize(benchrun.HostPerfPages), benchrun.HostRBBytes>>20)
	fmt.Fprintf(w, "program's own time (BPF_ENABLE_STATS run_time_ns/run_cnt), workload = the workload thread's task clock a call,\n")
	fmt.Fprintf(w, "+workload = that less the detached workload's (no program) in the same round, reader = the consumer's task\n")
	fmt.Fprintf(w, "clock (all its threads) a record, csw = its context switches a record, latency = CLOCK_MONOTONIC at delivery less\n")
	fmt.Fprintf(w, "the record's ktime, µs; lost: worst round (ring buffer: failed outputs). Modes: C = libbpf's defaults\n")
	fmt.Fprintf(w, "(perf_buffer__poll, a wakeup a record; ring_buffer__poll), C-tuned = libbpf draining every %v on a timer\n", benchrun.HostBudget)
	fmt.Fprintf(w, "(perf: watermark half a ring; ring buffer: the program writes with BPF_RB_NO_WAKEUP), cilium = cilium/ebpf's\n")
	fmt.Fprintf(w, "readers on their defaults, reader-batch = perfbuf's Reader on its defaults (ReadBatch), reader-nolatency = MaxLatency -1,\n")
	fmt.Fprintf(w, "%s = MaxLatency %v; detached = the workload alone.\n", benchrun.ModeReaderBudget, benchrun.HostBudget)
	if r.quietNoC != "" {
		fmt.Fprintf(w, "No C rows: the C consumer did not run (%s).\n", r.quietNoC)
	}
	for _, ringBuf := range []bool{false, true} {
		var rows []*hostStat
		for _, h := range r.host {
			if h.ringBuf == ringBuf {
				rows = append(rows, h)
			}
		}
		if len(rows) == 0 {
			continue
		}
		title := "Perf event array"
		if ringBuf {
			title = "BPF ring buffer"
		}
		fmt.Fprintf(w, "\n%s:\n", title)
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintln(tw, "rate\tmode\treached/s\tprog ns\tworkload ns\t+workload ns\treader ns\tcsw\tp50 µs\tp99 µs\tmax µs\tlost\tspread\taccounting\t")
		for _, h := range rows {
			lost := "-"
			if len(h.lost) > 0 {
				lost = strconv.FormatUint(maxU(h.lost), 10)
			}
			spread := h.workload.spread()
			if len(h.prog) > 0 {
				spread = h.prog.spread()
			}
			fmt.Fprintf(tw, "%s\t%s\t%.0f\t%s\t%.0f\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%.0f%%\t%s\t\n",
				benchrun.RateName(h.rate), h.mode, h.reached.median(), medianText(h.prog, 0), h.workload.median(), medianText(h.added, 0),
				medianText(h.reader, 0), medianText(h.csw, 3), medianText(h.p50, 0), medianText(h.p99, 0), medianText(h.maxLat, 0),
				lost, 100*spread, accounting(h.check))
		}
		tw.Flush()
	}
}

// hostCSVHeader names the host CSV's columns: a row per kind, rate and
// mode, medians over the rounds; ns are per event, latencies in µs;
// workload_charged_ns is the workload thread's CPU time a call as the
// scheduler charged it (CLOCK_THREAD_CPUTIME_ID), beside its task clock;
// spread is prog's (the workload's for detached).
var hostCSVHeader = []string{
	"kind", "mode", "rate", "rounds", "reached_per_s",
	"prog_ns", "workload_ns", "added_workload_ns", "workload_charged_ns", "reader_ns", "csw",
	"latency_p50_us", "latency_p99_us", "latency_max_us", "lost_max", "spread", "accounting_errors",
}

// writeHostCSV writes the host measurement's rows.
func writeHostCSV(w io.Writer, r *results) error {
	cw := csv.NewWriter(w)
	if err := cw.Write(hostCSVHeader); err != nil {
		return err
	}
	med := func(s series, prec int) string {
		if len(s) == 0 {
			return ""
		}
		return csvFloat(s.median(), prec)
	}
	for _, h := range r.host {
		kind, spread, lost := onlyHost, h.workload.spread(), ""
		if h.ringBuf {
			kind = onlyRBHost
		}
		if len(h.prog) > 0 {
			spread = h.prog.spread()
		}
		if len(h.lost) > 0 {
			lost = csvUint(maxU(h.lost))
		}
		row := []string{kind, h.mode, strconv.Itoa(h.rate), strconv.Itoa(len(h.reached)), med(h.reached, 0),
			med(h.prog, 1), med(h.workload, 1), med(h.added, 1), med(h.charged, 1), med(h.reader, 1), med(h.csw, 3),
			med(h.p50, 1), med(h.p99, 1), med(h.maxLat, 1), lost, csvFloat(spread, 3), strconv.Itoa(len(h.check))}
		if err := cw.Write(row); err != nil {
			return err
		}
	}
	cw.Flush()
	return cw.Error()
}
