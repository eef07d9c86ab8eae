// SPDX-License-Identifier: Apache-2.0

// Command perfbench measures every way of reading a perf event array side
// by side, in one run: the C reference (libbpf's perf_buffer driven from C),
// perfbuf's callback mode, raw zero-copy and copying drains, and the
// Reader, fullest-first and ordered; and every way of reading a BPF ring
// buffer beside libbpf's ring_buffer from C, cilium/ebpf's ringbuf.Reader
// and libbpfgo's RingBuffer.
//
// Six measurements, all from bench/internal/benchrun (the Go benchmarks in
// bench/selftest run the first two with the same code):
//
//   - drain: BPF fills a ring (untimed), one timed pass reads every sample
//     and every byte; ns per sample at 16, 64, 256 and 1024 bytes.
//   - sustained: one producer per CPU emits 64-byte samples flat out, in
//     test runs of 256 and 4096 samples (-batches), while the mode
//     consumes; samples per second of wall time, and samples lost.
//   - quiet: one sample per wakeup at a few hundred and a few thousand
//     samples a second, and none (idle), with each consumer in a process
//     of its own; CPU time and context switches per wakeup (per second
//     while idle). The C consumer is a program of its own (-cquiet, built
//     by `make bench`); without it, the C rows are skipped, with a note.
//   - rbdrain: drain over a 4 MiB BPF ring buffer filled to 90 %
//     (-rb-obj), at the same sizes.
//   - rbsustained: one producer per CPU emits 64-byte samples flat out into
//     one 4 MiB ring buffer, in test runs of 256 and 4096 samples
//     (-batches), while the mode consumes; samples per second, and the
//     samples the BPF program failed to output (the ring was full).
//   - rbquiet: quiet over the 4 MiB ring buffer, C = ring_buffer__poll
//     (the same -cquiet program), the Go modes that read ring buffers.
//   - host and rbhost (only when -only names them): what an event costs
//     the whole host, over a perf event array and over a ring buffer: a
//     tracepoint program on getppid(2) (-host-obj) records the calls of a
//     workload thread made at set rates (-host-rates); per event, the
//     program's own time, the workload's CPU, the consumer's CPU and
//     context switches, and the records' delivery latency, for libbpf
//     on its defaults and hand-tuned (the -cquiet program), cilium/ebpf
//     and perfbuf's Reader; the table also goes to -host-csv.
//
// Each measurement is repeated in -rounds rounds (the order of the modes
// rotates from round to round) and reported as the median, with the spread
// (max-min)/median, because a small VM is noisy; -only picks measurements.
// It prints a line per measurement on stderr, a table on stdout, and writes
// the results as CSV (-csv) and as an SVG bar chart of the drain and
// sustained figures (-svg).
//
// It needs root (CAP_BPF, CAP_PERFMON, CAP_SYS_ADMIN) and kernel BTF, and
// the BPF object built by `make bpf` (see -bpf-obj).
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/perfbuf/perfbuf/bench/internal/benchrun"
	"github.com/perfbuf/perfbuf/bench/internal/cref"
	"github.com/perfbuf/perfbuf/internal/bpfrun"
)

// config is the parsed command line.
type config struct {
	obj       string
	rbObj     string // the ring buffer emitter
	batches   []int  // samples per test run of the sustained and rbsustained runs
	rounds    int
	samples   int // per drain measurement
	sustained int // per CPU, per sustained measurement
	csv, svg  string
	only      []string // measurements to run, of measurements
	// threadClock: the drains count their thread's CPU time, not the time
	// that passed (-clock thread; benchrun.Stopwatch.Thread).
	threadClock bool

	cquiet        string        // the C consumer of the quiet measurement
	quietDuration time.Duration // of each quiet run
	quietRates    []int         // samples per second; 0: idle
	quietModes    []string      // nil: every mode
	quietWrap     []string      // a command the consumers run under

	hostObj      string // the host measurement's BPF object
	hostRates    []int  // events a second
	hostModes    []string
	hostDuration time.Duration
	hostCSV      string
}

// The measurements, as -only names them.
const (
	onlyDrain     = "drain"
	onlySustained = "sustained"
	onlyQuiet     = "quiet"
	onlyRBDrain   = "rbdrain"
	onlyRBSustain = "rbsustained"
	onlyRBQuiet   = "rbquiet"
	onlyHost      = "host"
	onlyRBHost    = "rbhost"
)

// measurements are those -only runs by default; the host ones run when
// named.
var measurements = []string{onlyDrain, onlySustained, onlyQuiet, onlyRBDrain, onlyRBSustain, onlyRBQuiet}

// allMeasurements are those -only accepts.
var allMeasurements = append(slices.Clone(measurements), onlyHost, onlyRBHost)

// runs reports whether the measurement m is to run.
func (c config) runs(m string) bool { return slices.Contains(c.only, m) }

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func parseFlags(args []string, stderr io.Writer) (config, error) {
	var c config
	fs := flag.NewFlagSet("perfbench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&c.obj, "bpf-obj", "bench/perfbench/bpf/perfbench.bpf.o", "BPF object built by `make bpf`")
	fs.StringVar(&c.rbObj, "rb-obj", "bench/perfbench/bpf/rbbench.bpf.o", "the ring buffer measurements' BPF object, built by `make bpf`")
	batches := fs.String("batches", batchesText(benchrun.SustainedBatches),
		fmt.Sprintf("sustained and rbsustained: samples per test run (at most %d), one set of runs each", benchrun.MaxBatch))
	fs.IntVar(&c.rounds, "rounds", 5, "rounds of every measurement; the median is reported")
	fs.IntVar(&c.samples, "samples", 500000, "samples per drain measurement")
	fs.IntVar(&c.sustained, "sustained", 1000000, "samples per CPU per sustained measurement (perf and ring buffer)")
	fs.StringVar(&c.csv, "csv", "build/perfbench.csv", "CSV output (empty: none)")
	fs.StringVar(&c.svg, "svg", "docs/perfbench.svg", "SVG chart output (empty: none; drawn when drain and sustained run)")
	clock := fs.String("clock", "wall", "drain and rbdrain: wall (the time that passed) or thread (the draining thread's CPU time, for a machine shared with busy processes; no libbpfgo row)")
	only := fs.String("only", strings.Join(measurements, ","), "the measurements to run, of "+strings.Join(allMeasurements, ","))
	fs.StringVar(&c.cquiet, "cquiet", "build/perfbench-cquiet", "the C consumer of quiet and rbquiet, built by make bench (missing: no C rows)")
	fs.DurationVar(&c.quietDuration, "quiet-duration", benchrun.QuietDuration, "quiet and rbquiet: how long each consumer is fed (or left idle)")
	rates := fs.String("quiet-rates", "300,3000,idle", "quiet and rbquiet: samples per second, or idle")
	modes := fs.String("quiet-modes", "", "quiet and rbquiet: the modes to run, of "+strings.Join(allQuietModes(), ",")+" (empty: all)")
	fs.StringVar(&c.hostObj, "host-obj", "bench/perfbench/bpf/hostbench.bpf.o", "host and rbhost: the BPF object built by `make bpf`")
	hostRates := fs.String("host-rates", ratesText(benchrun.HostRates), "host and rbhost: events a second")
	hostModes := fs.String("host-modes", "", "host and rbhost: the modes to run, of "+strings.Join(benchrun.HostModes, ",")+" (empty: all)")
	fs.DurationVar(&c.hostDuration, "host-duration", benchrun.HostDuration, "host and rbhost: how long the workload runs at each rate")
	fs.StringVar(&c.hostCSV, "host-csv", "build/perfbench-host.csv", "host and rbhost: CSV output (empty: none)")
	wrap := fs.String("quiet-wrap", "", "quiet and rbquiet: a command to run each consumer under, such as \"perf stat -e context-switches\" (its own cost is then measured too)")
	fs.Usage = func() {
		fmt.Fprintf(stderr, "Usage: perfbench [flags]\n\nMeasures every perfbuf mode beside the C reference (needs root).\n\n")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return c, err
	}
	if fs.NArg() > 0 {
		return c, fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	if c.rounds < 1 || c.samples < 1 || c.sustained < 1 || c.quietDuration <= 0 || c.hostDuration <= 0 {
		return c, errors.New("-rounds, -samples, -sustained, -quiet-duration and -host-duration must be positive")
	}
	switch *clock {
	case "wall":
	case "thread":
		c.threadClock = true
	default:
		return c, fmt.Errorf("-clock: %q is neither wall nor thread", *clock)
	}
	for _, m := range strings.Split(*only, ",") {
		m = strings.TrimSpace(m)
		if !slices.Contains(allMeasurements, m) {
			return c, fmt.Errorf("-only: unknown measurement %q (measurements: %s)", m, strings.Join(allMeasurements, ", "))
		}
		c.only = append(c.only, m)
	}
	var err error
	if c.batches, err = parseBatches(*batches); err != nil {
		return c, err
	}
	if c.quietRates, err = parseRates(*rates); err != nil {
		return c, err
	}
	if c.quietModes, err = parseQuietModes(*modes); err != nil {
		return c, err
	}
	if c.hostRates, err = parseHostRates(*hostRates); err != nil {
		return c, err
	}
	if c.hostModes, err = parseHostModes(*hostModes); err != nil {
		return c, err
	}
	c.quietWrap = strings.Fields(*wrap)
	if c.cquiet != "" {
		if abs, err := filepath.Abs(c.cquiet); err == nil {
			c.cquiet = abs // run as a path, never looked up in PATH
		}
	}
	return c, nil
}

// run is the whole command; it returns the exit status.
func run(args []string, stdout, stderr io.Writer) int {
	if isConsumer(args) {
		return runConsumer(args, stdout, stderr)
	}
	c, err := parseFlags(args, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintf(stderr, "perfbench: %v\n", err)
		return 2
	}
	if err := bpfrun.CheckPrivileges(); err != nil {
		fmt.Fprintf(stderr, "perfbench: %v\nperfbench loads BPF programs: run it as root (sudo make bench).\n", err)
		return 1
	}
	if runtime.NumCPU() < 2 {
		fmt.Fprintf(stderr, "perfbench: needs 2 CPUs or more (a producer and a reader), found %d\n", runtime.NumCPU())
		return 1
	}
	e, err := bpfrun.Open(c.obj)
	if err != nil {
		fmt.Fprintf(stderr, "perfbench: %v\n", err)
		return 1
	}
	defer e.Close()
	var rb *bpfrun.Emitter
	if c.runs(onlyRBDrain) || c.runs(onlyRBSustain) || c.runs(onlyRBQuiet) {
		if rb, err = bpfrun.Open(c.rbObj); err != nil {
			fmt.Fprintf(stderr, "perfbench: %v\n", err)
			return 1
		}
		defer rb.Close()
	}

	var h *benchrun.Host
	if c.runs(onlyHost) || c.runs(onlyRBHost) {
		if h, err = benchrun.OpenHost(c.hostObj); err != nil {
			fmt.Fprintf(stderr, "perfbench: %v\n", err)
			return 1
		}
		defer h.Close()
	}

	r := &results{env: environment(len(e.CPUs)), rounds: c.rounds, samples: c.samples, threadClock: c.threadClock, sustainedPerCPU: c.sustained,
		quietDuration: c.quietDuration, hostDuration: c.hostDuration}
	if c.runs(onlyQuiet) || c.runs(onlyRBQuiet) || c.runs(onlyHost) || c.runs(onlyRBHost) {
		if why := cquietMissing(c.cquiet); why != "" {
			r.quietNoC = why
			fmt.Fprintf(stderr, "perfbench: quiet: skipping the C consumer, and so the C rows and x C (%s; `make bench` builds it)\n", why)
		}
	}
	if err := measure(e, rb, h, c, r, stderr); err != nil {
		fmt.Fprintf(stderr, "perfbench: %v\n", err)
		return 1
	}
	writeTable(stdout, r)
	status := 0
	outputs := []struct {
		path  string
		write func(io.Writer, *results) error
		skip  string // why not to write it
	}{{c.csv, writeCSV, ""}, {c.svg, writeSVG, ""}, {c.hostCSV, writeHostCSV, ""}}
	if !c.runs(onlyDrain) || !c.runs(onlySustained) {
		outputs[1].skip = "the chart draws drain and sustained, and -only left one out"
	}
	if !c.runs(onlyHost) && !c.runs(onlyRBHost) {
		outputs[2].path = "" // no host measurement: nothing to write, nothing to say
	}
	for _, out := range outputs {
		if out.path == "" {
			continue
		}
		if out.skip != "" {
			fmt.Fprintf(stderr, "perfbench: not writing %s: %s\n", out.path, out.skip)
			continue
		}
		if err := writeFile(out.path, func(w io.Writer) error { return out.write(w, r) }); err != nil {
			fmt.Fprintf(stderr, "perfbench: %v\n", err)
			status = 1
		} else {
			fmt.Fprintf(stderr, "perfbench: wrote %s\n", out.path)
		}
	}
	if bad := r.accountingErrors(); len(bad) > 0 {
		for _, err := range bad {
			fmt.Fprintf(stderr, "perfbench: %v\n", err)
		}
		status = 1
	}
	return status
}

// measure runs every round of every measurement, reporting each on stderr:
// e is the perf emitter, rb the ring buffer one (nil unless a ring buffer
// measurement runs), h the host measurement's object (nil unless it runs). Within a round, the drain modes are measured side by
// side (benchrun.DrainCompare, RBDrainCompare), and the sustained and quiet
// ones one after another; each mode's ratio to C is taken within the
// round, against the C reference of that round.
func measure(e, rb *bpfrun.Emitter, h *benchrun.Host, c config, r *results, stderr io.Writer) error {
	var sink uint64
	for round := 0; round < c.rounds; round++ {
		if c.runs(onlyDrain) {
			if err := measureDrains(e, c, r, round, &sink, stderr); err != nil {
				return err
			}
		}
		if c.runs(onlySustained) {
			if err := measureSaturationRound(perfSaturation(e, r), c, round, stderr); err != nil {
				return err
			}
		}
		if c.runs(onlyQuiet) {
			if err := measureQuiet(e, false, c, r, round, stderr); err != nil {
				return err
			}
		}
		if c.runs(onlyRBDrain) {
			if err := measureRBDrains(rb, c, r, round, &sink, stderr); err != nil {
				return err
			}
		}
		if c.runs(onlyRBSustain) {
			if err := measureSaturationRound(rbSaturation(rb, r), c, round, stderr); err != nil {
				return err
			}
		}
		if c.runs(onlyRBQuiet) {
			if err := measureQuiet(rb, true, c, r, round, stderr); err != nil {
				return err
			}
		}
		if c.runs(onlyHost) {
			if err := measureHost(h, false, c, r, round, stderr); err != nil {
				return err
			}
		}
		if c.runs(onlyRBHost) {
			if err := measureHost(h, true, c, r, round, stderr); err != nil {
				return err
			}
		}
	}
	if sink == 1 {
		fmt.Fprintln(stderr) // keeps sink, and so the reads, alive
	}
	return nil
}

// measureDrains runs one round of drains at every size, summing what they
// read into sink.
func measureDrains(e *bpfrun.Emitter, c config, r *results, round int, sink *uint64, stderr io.Writer) error {
	for _, size := range benchrun.Sizes {
		modes := benchrun.DrainModes
		sws, timers := c.stopwatches(len(modes))
		res, err := benchrun.DrainCompare(e, benchrun.DrainConfig{Size: size, Samples: c.samples}, modes, timers)
		if err != nil {
			return err
		}
		ns, allocs := make([]float64, len(modes)), make([]float64, len(modes))
		for i, sw := range sws {
			*sink += res[i].Sum
			ns[i] = float64(sw.Elapsed.Nanoseconds()) / float64(res[i].Samples)
			allocs[i] = float64(sw.Mallocs) / float64(res[i].Samples)
		}
		r.addDrainRound(size, modes, ns, allocs)
		for i, mode := range modes {
			xc := r.drainOf(mode, size).xc
			fmt.Fprintf(stderr, "round %d/%d  drain %-12s %5d B  %8.1f ns/sample  %5.2f x C  %8.0f MB/s  %.3f allocs/sample\n",
				round+1, c.rounds, mode, size, ns[i], xc[len(xc)-1], mbps(size, ns[i]), allocs[i])
		}
	}
	return nil
}

// stopwatches returns n Stopwatches for a drain round, counting the clock
// -clock chose, and the same as Timers.
func (c config) stopwatches(n int) ([]*benchrun.Stopwatch, []benchrun.Timer) {
	sws, timers := make([]*benchrun.Stopwatch, n), make([]benchrun.Timer, n)
	for i := range sws {
		sws[i] = &benchrun.Stopwatch{Thread: c.threadClock}
		timers[i] = sws[i]
	}
	return sws, timers
}

// measureRBDrains runs one round of ring buffer drains at every size,
// summing what they read into sink.
func measureRBDrains(rb *bpfrun.Emitter, c config, r *results, round int, sink *uint64, stderr io.Writer) error {
	for _, size := range benchrun.Sizes {
		modes := benchrun.RBDrainModes
		if c.threadClock {
			// libbpfgo's records are received on a goroutine of their own.
			modes = slices.DeleteFunc(slices.Clone(modes), func(m string) bool { return m == benchrun.ModeLibbpfgo })
		}
		sws, timers := c.stopwatches(len(modes))
		res, err := benchrun.RBDrainCompare(rb, benchrun.DrainConfig{Size: size, Samples: c.samples}, modes, timers)
		if err != nil {
			return err
		}
		ns, allocs := make([]float64, len(modes)), make([]float64, len(modes))
		for i, sw := range sws {
			*sink += res[i].Sum
			ns[i] = float64(sw.Elapsed.Nanoseconds()) / float64(res[i].Samples)
			allocs[i] = float64(sw.Mallocs) / float64(res[i].Samples)
		}
		r.addRBDrainRound(size, modes, ns, allocs)
		for i, mode := range modes {
			xc := drainIn(r.rbDrain, mode, size).xc
			fmt.Fprintf(stderr, "round %d/%d  rbdrain %-14s %5d B  %8.1f ns/sample  %5.2f x C  %8.0f MB/s  %.3f allocs/sample\n",
				round+1, c.rounds, mode, size, ns[i], xc[len(xc)-1], mbps(size, ns[i]), allocs[i])
		}
	}
	return nil
}

// parseBatches parses -batches: test-run sizes from 1 to MaxBatch.
func parseBatches(s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 || n > benchrun.MaxBatch {
			return nil, fmt.Errorf("-batches: %q is not a count from 1 to %d", f, benchrun.MaxBatch)
		}
		out = append(out, n)
	}
	return out, nil
}

// ratesText is rates as -host-rates takes them.
func ratesText(rates []int) string { return batchesText(rates) }

// batchesText is batches as -batches takes them.
func batchesText(batches []int) string {
	f := make([]string, len(batches))
	for i, n := range batches {
		f[i] = strconv.Itoa(n)
	}
	return strings.Join(f, ",")
}

// saturation is one ring kind's saturation measurement: its modes, how to
// run one of them on ncpu producers, its name in the log, and the results
// a round goes to.
type saturation struct {
	name  string
	modes []string
	ncpu  int
	run   func(benchrun.SustainedConfig, benchrun.Timer) (benchrun.SustainedResult, error)
	add   func([]benchrun.SustainedResult)
}

// perfSaturation and rbSaturation are the sustained measurements over a
// perf event array (e) and over a BPF ring buffer (rb).
func perfSaturation(e *bpfrun.Emitter, r *results) saturation {
	return saturation{onlySustained, benchrun.SustainedModes, len(e.CPUs), func(cfg benchrun.SustainedConfig, t benchrun.Timer) (benchrun.SustainedResult, error) {
		return benchrun.Sustained(e, cfg, t)
	}, r.addSustainedRound}
}

func rbSaturation(rb *bpfrun.Emitter, r *results) saturation {
	return saturation{onlyRBSustain, benchrun.RBSustainedModes, len(rb.CPUs), func(cfg benchrun.SustainedConfig, t benchrun.Timer) (benchrun.SustainedResult, error) {
		return benchrun.RBSustained(rb, cfg, t)
	}, r.addRBSustainedRound}
}

// measureSaturationRound runs one round of m: at each batch, every mode in
// turn.
func measureSaturationRound(m saturation, c config, round int, stderr io.Writer) error {
	for _, batch := range c.batches {
		var runs []benchrun.SustainedResult
		for _, mode := range rotate(m.modes, round) {
			res, err := m.run(benchrun.SustainedConfig{Mode: mode, Samples: c.sustained * m.ncpu, Batch: batch}, &benchrun.Stopwatch{})
			if err != nil {
				return err
			}
			runs = append(runs, res)
			fill := ""
			if res.MaxFill > 0 {
				fill = fmt.Sprintf("  max ring fill %d KiB", res.MaxFill>>10)
			}
			fmt.Fprintf(stderr, "round %d/%d  %s %-13s batch %4d  %6.2f M samples/s  lost %d (%.2f%%)  late %d  wall %v  consumer ran %v, waited %v%s\n",
				round+1, c.rounds, m.name, mode, batch, res.Rate()/1e6, res.Lost, 100*lostFraction(res), res.Late, res.Wall.Round(time.Millisecond),
				res.ConsumerRan.Round(time.Millisecond), res.ConsumerWaited.Round(time.Millisecond), fill)
			if err := res.Check(); err != nil {
				fmt.Fprintf(stderr, "round %d/%d  %v\n", round+1, c.rounds, err)
			}
		}
		m.add(runs)
	}
	return nil
}

// rotate returns s rotated left by k: each round starts with another mode,
// so that no mode always runs first (or right after the same neighbour).
func rotate(s []string, k int) []string {
	k %= len(s)
	return append(append([]string(nil), s[k:]...), s[:k]...)
}

// mbps is the payload bandwidth of size-byte samples at ns per sample, in
// MB/s (10^6 bytes), as go test -bench reports it.
func mbps(size int, ns float64) float64 {
	if ns <= 0 {
		return 0
	}
	return float64(size) / ns * 1e3
}

// env describes the machine for the table and the chart.
type env struct {
	cpus   int
	cpu    string
	kernel string
	libbpf string
	goVer  string
}

func environment(cpus int) env {
	e := env{cpus: cpus, cpu: cpuModel(), libbpf: cref.LibbpfVersion(), goVer: runtime.Version()}
	if b, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		e.kernel = strings.TrimSpace(string(b))
	}
	return e
}

func (e env) String() string {
	return fmt.Sprintf("%d CPUs (%s), kernel %s, libbpf %s, %s", e.cpus, e.cpu, e.kernel, e.libbpf, e.goVer)
}

func cpuModel() string {
	b, err := os.ReadFile("/proc/cpuinfo")
	if err != nil {
		return "unknown cpu"
	}
	for _, line := range strings.Split(string(b), "\n") {
		if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
			return strings.TrimSpace(v)
		}
	}
	return "unknown cpu"
}

// writeFile writes path through fn, creating its directory, via a
// temporary file so that a failed run leaves the old file in place.
func writeFile(path string, fn func(io.Writer) error) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	tmp := path + ".tmp"
	f, err := os.Create(tmp)
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	err = fn(f)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		os.Remove(tmp)
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}
