// SPDX-License-Identifier: Apache-2.0

// Command mountsnoop traces mount() and umount() system-wide and prints one
// line per call: a Go port of mountsnoop from libbpf-tools (bcc). Like the
// C tool, which is built on libbpf-tools' bpf_buffer, its BPF program
// writes to BPF ring buffers when the kernel has them, one per CPU (the C
// tool's is one ring shared by every CPU: --buffer ringbuf), and to a perf
// event array elsewhere: perfbuf's PERFBUF_BUFFER on the BPF side,
// bpfbuffer.Prepare at load, and one perfbuf.Reader for each layout. The
// reader delivers the calls in the order of their time (perfbuf.Order by
// the event's ts), the CPUs' rings merged: a call waits at most 10 ms for
// an earlier one from another ring; one that comes later still is printed
// anyway, when it comes, and counted as late in the summary.
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
	"syscall"
	"time"

	"github.com/perfbuf/perfbuf"
	"github.com/perfbuf/perfbuf/bpfbuffer"
	"github.com/perfbuf/perfbuf/cmd/internal/stdio"
	"github.com/perfbuf/perfbuf/cmd/internal/tool"
)

const usageHead = `Trace mount and umount syscalls.

USAGE: mountsnoop [-h] [-t] [-d] [-p PID] [-v] [--duration SECONDS]
                  [--buffer KIND] [--recorder MIB] [--bpf-obj PATH]

EXAMPLES:
    mountsnoop         # trace mount and umount syscalls
    mountsnoop -d      # detailed output (one line per column value)
    mountsnoop -p 1216 # only trace PID 1216
    mountsnoop --buffer perf_event_array  # a perf event array, even where
                       # the kernel has BPF ring buffers
    mountsnoop --buffer ringbuf  # one ring buffer for every CPU, as the C tool
    mountsnoop --recorder 4  # keep the newest 4 MiB of calls, print them
                       # on SIGUSR1 and at exit

Calls are printed in the order of their time, every CPU's merged: a call
waits at most 10 ms for an earlier one from another CPU. A call that comes
later still is printed anyway, when it comes, and counted as late in the
summary on stderr.

OPTIONS (short flags may be grouped: -td):
`

// options is the parsed command line.
type options struct {
	tracer   tracerConfig
	printer  printer
	duration time.Duration // 0: until SIGINT or SIGTERM
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
		fmt.Fprintf(stderr, "mountsnoop: %v\nTry 'mountsnoop --help' for more information.\n", err)
		return 2
	}
	// Buffered as stdio buffers C's stdout (cmd/internal/stdio); flushed before the
	// summary.
	out := stdio.NewStdout(stdout)

	t, err := openTracer(o.tracer)
	if err != nil {
		fmt.Fprintf(stderr, "mountsnoop: %v\n", err)
		return 1
	}
	defer t.close()
	o.printer.clock = t.clock
	if o.tracer.verbose {
		fmt.Fprintf(stderr, "mountsnoop: events is a %v\n", t.kind)
	}
	if t.rec != nil {
		return record(o, t, out, stderr)
	}

	// SIGINT, SIGTERM or the end of --duration flush the reader: it
	// delivers what the rings hold, then the loop ends. A second signal
	// stops at once.
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
	defer signal.Stop(sigs)
	var expired <-chan time.Time
	if o.duration > 0 {
		timer := time.NewTimer(o.duration)
		defer timer.Stop()
		expired = timer.C
	}
	done := make(chan struct{})
	defer close(done)
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
		fmt.Fprintf(stderr, "mountsnoop: %v\n", err)
		return 1
	}
	start := time.Now()
	c, err := readLoop(t.rd, &o.printer, out, stderr)
	if ferr := out.Flush(); err == nil {
		err = ferr
	}
	if err != nil {
		fmt.Fprintf(stderr, "mountsnoop: %v\n", err)
		return 1
	}
	if c.perfFull, err = t.perfFull(); err != nil {
		fmt.Fprintf(stderr, "mountsnoop: %v\n", err)
	}
	// Close before the summary, so that its counts include what the ring
	// still holds (calls after the flush), as Left.
	t.rd.Close()
	writeSummary(stderr, t.kind, c, t.rd.Stats(), time.Since(start))
	return 0
}

// eventSource is what readLoop reads: a *perfbuf.Reader, or a fake in
// tests.
type eventSource interface {
	// ReadInto blocks for the next record. Errors: os.ErrClosed after
	// Close, perfbuf.ErrFlushed once a Flush has delivered everything, a
	// *perfbuf.CorruptError once per corrupt ring (reading goes on).
	ReadInto(s *perfbuf.Sample) error
}

// counts is what the read loop saw, and what the BPF program counted.
type counts struct {
	events, lost, bad, corrupt uint64
	// perfFull: events a full perf ring dropped, as the BPF program
	// counted them (lost records report them too, but only once a later
	// event fits in the ring).
	perfFull uint64
}

// readLoop prints the events of src until it is flushed or closed. A perf
// event array's lost records go to stderr as they arrive, as in the C tool
// (a ring buffer has none: its full ring is counted in the failure map),
// and so does a corrupt ring, which the reader got past before going on.
func readLoop(src eventSource, p *printer, stdout, stderr io.Writer) (counts, error) {
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
			fmt.Fprintf(stderr, "mountsnoop: %v (reading goes on past it)\n", err)
			continue
		}
		if err != nil {
			return c, err
		}
		if s.Type == perfbuf.RecordLost {
			c.lost += s.Lost
			fmt.Fprintf(stderr, "lost %d events on CPU #%d\n", s.Lost, s.CPU)
			continue
		}
		if err := decodeEvent(s.Data, &ev); err != nil {
			c.bad++
			fmt.Fprintf(stderr, "mountsnoop: cpu %d: %v\n", s.CPU, err)
			continue
		}
		c.events++
		line = p.appendEvent(line[:0], &ev)
		if _, err := stdout.Write(line); err != nil {
			return c, err
		}
	}
}

// kindText names a buffer kind for people.
func kindText(k bpfbuffer.Kind) string {
	switch k {
	case bpfbuffer.RingBuf:
		return "a BPF ring buffer"
	case bpfbuffer.RingBufPerCPU:
		return "a BPF ring buffer per CPU"
	case bpfbuffer.PerfEventArray:
		return "a perf event array"
	}
	return k.String()
}

// writeSummary prints the totals (st's sums), then the reader's counts per
// ring and, on a line of its own, what the sums hold beyond the rings'
// (the full outputs and failures of the CPUs, on several ring buffers,
// whose ring cannot be told).
func writeSummary(w io.Writer, kind bpfbuffer.Kind, c counts, st perfbuf.Stats, elapsed time.Duration) {
	// A ring buffer's full outputs are its Lost; a perf ring's lost
	// records, and so its Lost, may lag behind perfFull.
	fmt.Fprintf(w, "\n%d calls traced, %d lost", c.events, max(c.lost, c.perfFull, st.Lost))
	if t := tool.FailuresText(st.Failed); t != "" {
		fmt.Fprintf(w, ", %s", t)
	}
	if st.Late > 0 {
		fmt.Fprintf(w, ", %d late (printed after a later call)", st.Late)
	}
	if c.bad > 0 {
		fmt.Fprintf(w, ", %d malformed", c.bad)
	}
	if c.corrupt > 0 {
		fmt.Fprintf(w, ", %d corrupt rings found", c.corrupt)
	}
	if t := tool.SkippedText(st.NotRun, "calls"); t != "" {
		fmt.Fprintf(w, ", %s", t)
	}
	fmt.Fprintf(w, " in %.1fs, from %s\n", elapsed.Seconds(), kindText(kind))
	for i, s := range st.Rings {
		switch {
		case s.CPU < 0 && kind == bpfbuffer.RingBufPerCPU: // the ring of CPU i
			fmt.Fprintf(w, "  ring %-3d%6d events", i, s.Samples)
		case s.CPU < 0: // the ring buffer: every CPU's
			fmt.Fprintf(w, "  ring    %6d events", s.Samples)
		default:
			fmt.Fprintf(w, "  cpu %-3d %6d events %6d lost", s.CPU, s.Samples, s.Lost)
		}
		if s.CPU < 0 && s.Lost > 0 {
			fmt.Fprintf(w, "  %d lost", s.Lost)
		}
		if s.MaxFill > 0 {
			fmt.Fprintf(w, "  ring peak %d bytes", s.MaxFill)
		}
		if s.Discarded > 0 {
			fmt.Fprintf(w, "  %d discarded", s.Discarded)
		}
		if s.Late > 0 {
			fmt.Fprintf(w, "  %d late", s.Late)
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
	if lost, f := tool.NoRing(&st); lost > 0 || f.Total() > 0 {
		fmt.Fprint(w, "  no ring")
		if lost > 0 {
			fmt.Fprintf(w, "  %d lost", lost)
		}
		if t := tool.FailuresText(f); t != "" {
			fmt.Fprintf(w, "  %s", t)
		}
		fmt.Fprintln(w)
	}
}

// parseFlags parses the command line the way the C tool's argp does, as
// far as Go's flag package allows: each flag has its short and long name,
// and grouped short bool flags (-td) are split. -h prints the help to
// stdout and returns flag.ErrHelp.
func parseFlags(args []string, stdout io.Writer) (*options, error) {
	o := &options{}
	fs := flag.NewFlagSet("mountsnoop", flag.ContinueOnError)
	fs.SetOutput(io.Discard) // errors are returned, and run prints them once
	fs.Usage = func() {}
	var help strings.Builder
	var wantHelp bool
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
		if strings.HasPrefix(left, "--") {
			left = "      " + left
		} else {
			left = "  " + left
		}
		fmt.Fprintf(&help, "%-28s %s\n", left, usage)
	}
	boolean := func(v *bool, usage string, names ...string) {
		def(names, "", usage, func(n string) { fs.BoolVar(v, n, false, usage) })
	}
	value := func(v flag.Value, arg, usage string, names ...string) {
		def(names, arg, usage, func(n string) { fs.Var(v, n, usage) })
	}
	boolean(&o.printer.detailed, "output result in detail mode", "d", "detailed")
	value(pidValue{&o.tracer.pid}, "PID", "process ID to trace", "p", "pid")
	boolean(&o.tracer.kernelPIDs, "print PIDs as the kernel numbers them (the C tool's), not as this PID namespace does", "kernel-pids")
	boolean(&o.printer.timestamp, "include timestamp on output", "t", "timestamp")
	boolean(&o.tracer.verbose, "verbose debug output (and the buffer's kind)", "v", "verbose")
	value(tool.SecondsValue{P: &o.duration}, "SECONDS", "stop after SECONDS (or a Go duration: 1m30s)", "duration")
	value(kindValue{&o.tracer.buffer}, "KIND",
		"any (a ring buffer per CPU where the kernel allows, the default), ringbuf_per_cpu, ringbuf (one shared, as the C tool's) or perf_event_array", "buffer")
	value(mibValue{&o.tracer.recorder}, "MIB",
		"flight recorder: keep the newest MIB MiB of calls (rings in overwrite mode), print them on SIGUSR1 and at exit", "recorder")
	value(tool.StringValue{P: &o.tracer.objPath}, "PATH", "load the BPF object from PATH, not the built-in one", "bpf-obj")
	boolean(&wantHelp, "show this help", "h", "help")

	if err := fs.Parse(tool.SplitShortFlags(fs, args, "dtvh")); err != nil {
		return nil, err
	}
	if wantHelp {
		fmt.Fprint(stdout, usageHead, help.String())
		return nil, flag.ErrHelp
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	return o, nil
}

// pidValue parses -p: a process ID above 0, as the C tool requires.
type pidValue struct{ p *int }

func (v pidValue) String() string {
	if v.p == nil || *v.p == 0 {
		return ""
	}
	return strconv.Itoa(*v.p)
}

func (v pidValue) Set(s string) error {
	n, err := strconv.ParseInt(s, 10, 32)
	if err != nil || n <= 0 {
		return fmt.Errorf("invalid PID: %s", s)
	}
	*v.p = int(n)
	return nil
}

// mibValue parses --recorder: a size in MiB, 1 to 1024.
type mibValue struct{ p *int }

func (v mibValue) String() string {
	if v.p == nil || *v.p == 0 {
		return ""
	}
	return strconv.Itoa(*v.p)
}

func (v mibValue) Set(s string) error {
	n, err := strconv.Atoi(s)
	if err != nil || n < 1 || n > 1024 {
		return fmt.Errorf("invalid recorder size: %s (MiB, 1 to 1024)", s)
	}
	*v.p = n
	return nil
}

// kindValue parses --buffer: any, ringbuf_per_cpu, ringbuf or
// perf_event_array (perf for short).
type kindValue struct{ p *bpfbuffer.Kind }

func (v kindValue) String() string {
	if v.p == nil {
		return ""
	}
	return v.p.String()
}

func (v kindValue) Set(s string) error {
	for _, k := range []bpfbuffer.Kind{bpfbuffer.Any, bpfbuffer.RingBufPerCPU, bpfbuffer.RingBuf, bpfbuffer.PerfEventArray} {
		if s == k.String() {
			*v.p = k
			return nil
		}
	}
	if s == "perf" {
		*v.p = bpfbuffer.PerfEventArray
		return nil
	}
	return fmt.Errorf("invalid buffer kind %q, should be any, ringbuf_per_cpu, ringbuf or perf_event_array", s)
}
