// SPDX-License-Identifier: Apache-2.0

// Command execsnoop traces execve() system-wide and prints one line per
// exec: a Go port of execsnoop from libbpf-tools (bcc), reading its perf
// event array with a perfbuf Reader ordered by timestamp, so that events
// from all CPUs come out in timestamp order.
//
// It needs root (CAP_BPF, CAP_PERFMON, CAP_SYS_ADMIN) and kernel BTF. Its
// BPF object is built into the executable (run `make bpf` before building);
// --bpf-obj loads another one.
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/perfbuf/perfbuf"
	"github.com/perfbuf/perfbuf/cmd/internal/stdio"
	"github.com/perfbuf/perfbuf/cmd/internal/tool"
)

const usageHead = `Trace exec syscalls.

USAGE: execsnoop [-h] [-T] [-t] [-x] [--failed-only] [-u UID] [-q] [-n NAME]
                 [-l LINE] [-U] [--max-args MAX_ARGS] [-d SECONDS] [-j] [--demo]
                 [--kernel-pids] [--bpf-obj PATH] [--metrics ADDR] [-v]

EXAMPLES:
   execsnoop           # trace all exec() syscalls
   execsnoop -x        # include failed exec()s
   execsnoop -T        # include time (HH:MM:SS)
   execsnoop -U        # include UID
   execsnoop -u 1000   # only trace UID 1000
   execsnoop -t        # include timestamps
   execsnoop -q        # add "quotemarks" around arguments
   execsnoop -n main   # only print command lines containing "main"
   execsnoop -l tpkg   # only print command where arguments contains "tpkg"
   execsnoop -j -d 10  # JSON lines for 10 seconds
   execsnoop --demo    # start a few known processes while tracing
   execsnoop --metrics :9435  # Prometheus metrics on http://HOST:9435/metrics
   execsnoop --kernel-pids    # in a container: every exec, with host PIDs

PID and PPID are numbered as in execsnoop's own PID namespace, as ps there
shows them (on the host: the kernel's numbers). Execs by processes outside
that namespace are not shown, only counted in the summary; a parent outside
it shows as PPID 0. --kernel-pids prints the kernel's numbers (the initial
namespace's) for every exec, as the C tool does.

OPTIONS (short flags may be grouped: -Tx):
`

// options is the parsed command line.
type options struct {
	tracer   tracerConfig
	printer  printer
	filter   filter
	duration time.Duration // 0: until SIGINT or SIGTERM
	demo     bool
	metrics  string // --metrics ADDR (metrics.go); "" for none
}

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// run is the whole command; it returns the exit status.
func run(args []string, stdout, stderr io.Writer) int {
	o, err := parseFlags(args, stdout)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintf(stderr, "execsnoop: %v\nTry 'execsnoop --help' for more information.\n", err)
		return 2
	}

	// The demo goroutine writes to stderr too.
	stderr = &syncWriter{w: stderr}
	// Buffered as stdio buffers C's stdout (cmd/internal/stdio); flushed before the
	// summary.
	out := stdio.NewStdout(stdout)

	ms, err := listenMetrics(o.metrics, stderr)
	if err != nil {
		fmt.Fprintf(stderr, "execsnoop: %v\n", err)
		return 1
	}
	defer ms.close()

	t, err := openTracer(o.tracer)
	if err != nil {
		fmt.Fprintf(stderr, "execsnoop: %v\n", err)
		return 1
	}
	defer t.close()
	ms.serve(t.rd, stderr)
	o.printer.clock = t.clock

	// SIGINT, SIGTERM or the end of -d flush the reader: it delivers what
	// the rings hold, then the loop ends. A second signal stops at once.
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
	defer signal.Stop(sigs)
	var demo sync.WaitGroup
	defer demo.Wait() // after close(done) below: deferred calls run last first
	done := make(chan struct{})
	defer close(done)
	// -d counts from here, or with --demo from the end of the demo's
	// commands: every one of them is traced however slow the machine is
	// (a guest under emulation ran the last one after 2 seconds). Each
	// command has exited when the demo ends, so its execs are in the
	// rings, and the flush delivers them.
	demoDone := make(chan struct{})
	expired := make(chan struct{}) // closed once -d has passed
	if o.duration > 0 {
		go func() {
			select {
			case <-demoDone:
			case <-done:
				return
			}
			timer := time.NewTimer(o.duration)
			defer timer.Stop()
			select {
			case <-timer.C:
				close(expired)
			case <-done:
			}
		}()
	}
	go func() {
		select {
		case <-sigs:
		case <-expired:
		case <-done:
			return
		}
		t.rd.Flush()
		select {
		case <-sigs:
			t.rd.Close()
		case <-done:
		}
	}()

	if _, err := io.WriteString(out, o.printer.header()); err != nil {
		fmt.Fprintf(stderr, "execsnoop: %v\n", err)
		return 1
	}
	if o.demo {
		demo.Add(1)
		go func() {
			defer demo.Done()
			runDemo(done, stderr)
			close(demoDone)
		}()
	} else {
		close(demoDone)
	}
	start := time.Now()
	c, err := readLoop(t.rd, o, out, stderr)
	if ferr := out.Flush(); err == nil {
		err = ferr
	}
	if err != nil {
		fmt.Fprintf(stderr, "execsnoop: %v\n", err)
		return 1
	}
	if c.kernel, err = t.kernelCounts(); err != nil {
		fmt.Fprintf(stderr, "execsnoop: %v\n", err)
	}
	// Close before the summary, so that its counts include what the rings
	// still hold (execs after the flush), as Left.
	t.rd.Close()
	writeSummary(stderr, c, t.rd.Stats(), time.Since(start))
	return 0
}

// counts is what the read loop saw, and what the BPF program counted.
type counts struct {
	events, shown, lost, late, bad uint64
	corrupt                        uint64 // corruptions the reader reported
	// From the BPF program at the end: events that did not fit in a ring
	// (lost records report them too, but only once a later event fits),
	// execs not traced because its map of execs in flight was full, execs
	// outside the PID namespace.
	kernel kernelCounts
}

// readLoop prints the events of src until it is flushed or closed. Lost
// counts go to stderr as they arrive, as in the C tool, and so does a
// corrupt ring, which the reader got past before going on.
func readLoop(src eventSource, o *options, stdout, stderr io.Writer) (counts, error) {
	var (
		c    counts
		s    perfbuf.Sample
		ev   event
		line []byte
	)
	for {
		err := src.ReadInto(&s)
		if errors.Is(err, perfbuf.ErrFlushed) || errors.Is(err, os.ErrClosed) {
			return c, nil
		}
		if errors.Is(err, perfbuf.ErrCorrupt) {
			c.corrupt++
			fmt.Fprintf(stderr, "execsnoop: %v (reading goes on past it)\n", err)
			continue
		}
		if err != nil {
			return c, err
		}
		if s.Type == perfbuf.RecordLost {
			c.lost += s.Lost
			fmt.Fprintf(stderr, "Lost %d events on CPU #%d!\n", s.Lost, s.CPU)
			continue
		}
		if err := decodeEvent(s.Data, &ev); err != nil {
			c.bad++
			fmt.Fprintf(stderr, "execsnoop: cpu %d: %v\n", s.CPU, err)
			continue
		}
		c.events++
		if s.Late {
			c.late++
		}
		if !o.filter.match(&ev) {
			continue
		}
		c.shown++
		line = o.printer.appendEvent(line[:0], &ev, s.CPU)
		if _, err := stdout.Write(line); err != nil {
			return c, err
		}
	}
}

// writeSummary prints the totals (st's sums), the reader's counts per
// ring, each a CPU's, and what the sums hold beyond the rings' (the
// failures of CPUs without a ring).
func writeSummary(w io.Writer, c counts, st perfbuf.Stats, elapsed time.Duration) {
	// Every lost event failed its bpf_perf_event_output, so notOutput is
	// the whole count; lost (the rings' lost records) may lag behind it.
	fmt.Fprintf(w, "\n%d execs traced, %d shown, %d lost, %d out of order", c.events, c.shown, max(c.lost, c.kernel.notOutput), c.late)
	if c.kernel.untraced > 0 {
		fmt.Fprintf(w, ", %d not traced (too many execs in flight)", c.kernel.untraced)
	}
	if t := tool.SkippedText(st.NotRun, "execs"); t != "" {
		fmt.Fprintf(w, ", %s", t)
	}
	if c.kernel.otherPIDNS > 0 {
		fmt.Fprintf(w, ", %d outside this PID namespace (--kernel-pids shows them)", c.kernel.otherPIDNS)
	}
	if c.bad > 0 {
		fmt.Fprintf(w, ", %d malformed", c.bad)
	}
	if c.corrupt > 0 {
		fmt.Fprintf(w, ", %d corrupt rings found", c.corrupt)
	}
	if t := tool.FailuresText(st.Failed); t != "" {
		fmt.Fprintf(w, ", %s", t)
	}
	fmt.Fprintf(w, " in %.1fs\n", elapsed.Seconds())
	for _, s := range st.Rings {
		fmt.Fprintf(w, "  cpu %-3d %6d events %6d lost %6d out of order", s.CPU, s.Samples, s.Lost, s.Late)
		if s.MaxFill > 0 {
			fmt.Fprintf(w, "  ring peak %d bytes", s.MaxFill)
		}
		if s.Corrupt > 0 {
			fmt.Fprintf(w, "  %d corrupt", s.Corrupt)
		}
		if s.Left > 0 {
			fmt.Fprintf(w, "  %d unread at exit", s.Left)
		}
		if t := tool.FailuresText(s.Failed); t != "" {
			fmt.Fprintf(w, "  %s", t)
		}
		fmt.Fprintln(w)
	}
	if _, f := tool.NoRing(&st); f.Total() > 0 {
		fmt.Fprintf(w, "  no ring  %s\n", tool.FailuresText(f))
	}
}

// parseFlags parses the command line the way the C tool's argp does, as far
// as Go's flag package allows: each flag has its short and long name, and
// grouped short bool flags (-Tx) are split. -h prints the help to stdout and
// returns flag.ErrHelp.
func parseFlags(args []string, stdout io.Writer) (*options, error) {
	o := &options{tracer: tracerConfig{uid: -1, maxArgs: 20}}
	fs := flag.NewFlagSet("execsnoop", flag.ContinueOnError)
	fs.SetOutput(io.Discard) // errors are returned, and run prints them once
	fs.Usage = func() {}
	var help strings.Builder
	var wantHelp bool
	// def registers a flag under each of its names and adds its help line.
	def := func(names []string, arg, usage string, register func(name string)) {
		var spelled []string
		for _, n := range names {
			register(n)
			if len(n) == 1 {
				spelled = append(spelled, "-"+n)
			} else {
				spelled = append(spelled, "--"+n)
			}
		}
		left := strings.Join(spelled, ", ")
		if arg != "" {
			left += " " + arg
		}
		if !strings.HasPrefix(left, "--") {
			left = "  " + left
		} else {
			left = "      " + left
		}
		fmt.Fprintf(&help, "%-28s %s\n", left, usage)
	}
	boolean := func(v *bool, usage string, names ...string) {
		def(names, "", usage, func(n string) { fs.BoolVar(v, n, false, usage) })
	}
	value := func(v flag.Value, arg, usage string, names ...string) {
		def(names, arg, usage, func(n string) { fs.Var(v, n, usage) })
	}
	boolean(&o.printer.time, "include time column on output (HH:MM:SS)", "T", "time")
	boolean(&o.printer.timestamp, "include timestamp on output (seconds since the start)", "t", "timestamp")
	boolean(&o.tracer.includeFailed, "include failed exec()s", "x", "fails")
	boolean(&o.filter.failedOnly, "show failed exec()s only (implies -x)", "failed-only")
	value(uidValue{&o.tracer.uid}, "UID", "trace this UID only", "u", "uid")
	boolean(&o.printer.quote, `add quotemarks (") around arguments`, "q", "quote")
	value(tool.StringValue{P: &o.filter.name}, "NAME", "only print commands whose name contains NAME", "n", "name")
	value(tool.StringValue{P: &o.filter.line}, "LINE", "only print commands where an argument contains LINE", "l", "line")
	boolean(&o.printer.printUID, "print UID column", "U", "print-uid")
	value(maxArgsValue{&o.tracer.maxArgs}, "MAX_ARGS",
		fmt.Sprintf("maximum number of arguments parsed and displayed, in [1, %d] (default 20)", totalMaxArgs), "max-args")
	value(tool.SecondsValue{P: &o.duration}, "SECONDS", "stop after SECONDS (or a Go duration: 1m30s); with --demo, SECONDS after its commands", "d", "duration")
	boolean(&o.printer.json, "print JSON lines instead of columns", "j", "json")
	boolean(&o.demo, "start a few known processes while tracing", "demo")
	boolean(&o.tracer.kernelPIDs, "print the kernel's PIDs (initial namespace), every exec", "kernel-pids")
	value(tool.StringValue{P: &o.tracer.objPath}, "PATH", "load the BPF object from PATH, not the built-in one", "bpf-obj")
	value(metricsAddrValue{&o.metrics}, "ADDR", "serve Prometheus metrics on http://ADDR/metrics (port 0: any, printed on stderr)", "metrics")
	boolean(&o.tracer.verbose, "verbose libbpf debug output", "v", "verbose")
	boolean(&wantHelp, "show this help", "h", "help")

	if err := fs.Parse(tool.SplitShortFlags(fs, args, "TtxqUjvh")); err != nil {
		return nil, err
	}
	if wantHelp {
		fmt.Fprint(stdout, usageHead, help.String())
		return nil, flag.ErrHelp
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	if o.filter.failedOnly {
		o.tracer.includeFailed = true
	}
	return o, nil
}

// maxArgsValue parses --max-args: an integer in [1, totalMaxArgs].
type maxArgsValue struct{ p *int }

func (v maxArgsValue) String() string {
	if v.p == nil {
		return ""
	}
	return strconv.Itoa(*v.p)
}

func (v maxArgsValue) Set(s string) error {
	n, err := strconv.Atoi(s)
	if err != nil || n < 1 || n > totalMaxArgs {
		return fmt.Errorf("invalid MAX_ARGS %q, should be in [1, %d]", s, totalMaxArgs)
	}
	*v.p = n
	return nil
}

// uidValue parses -u: a uid in [0, 2^32-1).
type uidValue struct{ p *int }

func (v uidValue) String() string {
	if v.p == nil || *v.p < 0 {
		return ""
	}
	return strconv.Itoa(*v.p)
}

func (v uidValue) Set(s string) error {
	n, err := strconv.ParseUint(s, 10, 32)
	if err != nil || n == 0xffffffff {
		return fmt.Errorf("invalid UID %q", s)
	}
	*v.p = int(n)
	return nil
}

// syncWriter serialises writes from several goroutines.
type syncWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (s *syncWriter) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.w.Write(p)
}
