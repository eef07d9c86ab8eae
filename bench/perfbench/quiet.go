// SPDX-License-Identifier: Apache-2.0

package main

// The quiet measurement's side in perfbench: the consumers' commands (the C
// program, and perfbench itself run again as a Go consumer), the hidden
// consumer mode, and the rounds.

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/perfbuf/perfbuf/bench/internal/benchrun"
	"github.com/perfbuf/perfbuf/internal/bpfrun"
)

// consumerFlag, as perfbench's first argument, makes it a Go consumer of
// the quiet measurement (benchrun.QuietConsume) instead:
//
//	perfbench -quiet-consumer MODE -map-fd 3 [-ringbuf] [-host] -count N -timeout D
//
// -ringbuf says that the map is a BPF ring buffer; -host makes it a
// consumer of the host measurement (a mode of benchrun.HostModes, noting
// delivery latencies). It is not in -help: perfbench passes it to itself.
const consumerFlag = "-quiet-consumer"

// isConsumer reports whether args make perfbench a consumer.
func isConsumer(args []string) bool { return len(args) > 0 && args[0] == consumerFlag }

// parseConsumer parses a consumer's arguments.
func parseConsumer(args []string, stderr io.Writer) (benchrun.QuietConsumerConfig, error) {
	var c benchrun.QuietConsumerConfig
	fs := flag.NewFlagSet("perfbench "+consumerFlag, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&c.Mode, consumerFlag[1:], "", "the Go mode to consume with")
	fs.IntVar(&c.MapFD, "map-fd", benchrun.QuietMapFD, "the map's inherited descriptor")
	fs.BoolVar(&c.RingBuf, "ringbuf", false, "the map is a BPF ring buffer, not a perf event array")
	fs.BoolVar(&c.Host, "host", false, "a consumer of the host measurement")
	fs.IntVar(&c.Count, "count", 0, "samples to read (0: none, wait for the timeout)")
	fs.DurationVar(&c.Timeout, "timeout", 0, "the longest wait")
	if err := fs.Parse(args); err != nil {
		return c, err
	}
	switch {
	case fs.NArg() > 0:
		return c, fmt.Errorf("unexpected argument %q", fs.Arg(0))
	case c.Host && !benchrun.IsHostGoMode(c.Mode):
		return c, fmt.Errorf("%s %q: not a Go consumer mode of the host measurement", consumerFlag, c.Mode)
	case !c.Host && !benchrun.IsQuietGoMode(c.Mode, c.RingBuf):
		return c, fmt.Errorf("%s %q: not a Go consumer mode of %s", consumerFlag, c.Mode, kindName(c.RingBuf))
	case c.MapFD < 0 || c.Count < 0 || c.Timeout <= 0:
		return c, errors.New("-map-fd and -count must not be negative, -timeout must be positive")
	}
	return c, nil
}

// kindName names the ring kind in messages.
func kindName(ringBuf bool) string {
	if ringBuf {
		return "a BPF ring buffer"
	}
	return "a perf event array"
}

// consumerArgs are the arguments that make perfbench the consumer of mode,
// over a ring buffer with ringBuf.
func consumerArgs(mode string, ringBuf bool, count int, timeout time.Duration) []string {
	args := []string{consumerFlag, mode, "-map-fd", strconv.Itoa(benchrun.QuietMapFD)}
	if ringBuf {
		args = append(args, "-ringbuf")
	}
	return append(args, "-count", strconv.Itoa(count), "-timeout", timeout.String())
}

// runConsumer is perfbench as a consumer; it returns the exit status.
func runConsumer(args []string, stdout, stderr io.Writer) int {
	c, err := parseConsumer(args, stderr)
	if err != nil {
		fmt.Fprintf(stderr, "perfbench: %v\n", err)
		return 2
	}
	if err := benchrun.QuietConsume(c, stdout); err != nil {
		fmt.Fprintf(stderr, "perfbench: %v\n", err)
		return 1
	}
	return 0
}

// quietCommand returns the command of mode's consumer over a perf event
// array, or a BPF ring buffer with ringBuf: the C program at cquiet for C,
// else this executable (self) as a Go consumer; wrap, if set, goes in
// front (perf stat, strace).
func quietCommand(mode string, ringBuf bool, self, cquiet string, wrap []string, stderr io.Writer) benchrun.QuietCommand {
	return func(count int, timeout time.Duration) *exec.Cmd {
		var argv []string
		if mode == benchrun.ModeC {
			ms := (timeout + time.Millisecond - 1) / time.Millisecond
			argv = []string{cquiet}
			if ringBuf {
				argv = append(argv, "-ringbuf")
			}
			argv = append(argv, strconv.Itoa(benchrun.QuietMapFD), strconv.Itoa(count), strconv.FormatInt(int64(ms), 10))
		} else {
			argv = append([]string{self}, consumerArgs(mode, ringBuf, count, timeout)...)
		}
		argv = append(slices.Clone(wrap), argv...)
		cmd := exec.Command(argv[0], argv[1:]...)
		cmd.Stderr = stderr
		return cmd
	}
}

// quietModes are the modes measured at rate (0: idle) over a perf event
// array, or a BPF ring buffer with ringBuf: those of benchrun that the
// -quiet-modes flag keeps, without C if its program is missing.
func quietModes(c config, ringBuf bool, rate int, haveC bool) []string {
	all := benchrun.QuietModes
	switch {
	case ringBuf && rate == 0:
		all = benchrun.RBQuietIdleModes
	case ringBuf:
		all = benchrun.RBQuietModes
	case rate == 0:
		all = benchrun.QuietIdleModes
	}
	var out []string
	for _, m := range all {
		if (m != benchrun.ModeC || haveC) && (len(c.quietModes) == 0 || slices.Contains(c.quietModes, m)) {
			out = append(out, m)
		}
	}
	return out
}

// cquietMissing says why the C consumer at path cannot run, or "".
func cquietMissing(path string) string {
	st, err := os.Stat(path)
	switch {
	case err != nil:
		return err.Error()
	case st.IsDir() || st.Mode().Perm()&0o111 == 0:
		return path + ": not an executable file"
	}
	return ""
}

// measureQuiet runs one round of the quiet measurement over e's map, a
// perf event array, or a BPF ring buffer with ringBuf (rbquiet): at each
// rate, every mode in turn (starting with another one each round).
func measureQuiet(e *bpfrun.Emitter, ringBuf bool, c config, r *results, round int, stderr io.Writer) error {
	self, err := os.Executable()
	if err != nil {
		return fmt.Errorf("quiet: find perfbench's executable: %w", err)
	}
	haveC := cquietMissing(c.cquiet) == ""
	name, add := onlyQuiet, r.addQuietRound
	if ringBuf {
		name, add = onlyRBQuiet, r.addRBQuietRound
	}
	for _, rate := range c.quietRates {
		var res []benchrun.QuietResult
		modes := quietModes(c, ringBuf, rate, haveC)
		if len(modes) == 0 {
			continue // -quiet-modes kept none of this kind's
		}
		for _, mode := range rotate(modes, round) {
			q, err := benchrun.Quiet(e, benchrun.QuietConfig{Mode: mode, Rate: rate, Duration: c.quietDuration,
				Command: quietCommand(mode, ringBuf, self, c.cquiet, c.quietWrap, stderr)})
			if err != nil {
				return err
			}
			res = append(res, q)
			prefix := fmt.Sprintf("round %d/%d  %s %-16s %6s", round+1, c.rounds, name, mode, benchrun.RateName(rate))
			process := fmt.Sprintf("process: %.1f ms CPU, %d csw in %v", float64(q.Process.CPU.Microseconds())/1e3, q.Process.Switches(),
				q.Process.Wall.Round(time.Millisecond))
			if rate == 0 {
				fmt.Fprintf(stderr, "%s  %7.1f wakeups/s  %7.1f csw/s  %6.3f CPU ms/s  received %d  (%s)\n",
					prefix, q.WakeupsPerSecond(), q.SwitchesPerSecond(), q.CPUPerSecond(), q.Received, process)
			} else {
				polls := ""
				if q.Polls > 0 {
					polls = fmt.Sprintf(" in %d polls", q.Polls)
				}
				fmt.Fprintf(stderr, "%s  %6.1f us CPU/wakeup (%.1f charged)  %5.2f csw/wakeup (%.2f voluntary)  prog %.0f ns/sample  received %d of %d%s, lost %d  late %d, by %v at most  (%s)\n",
					prefix, q.CPUPerWakeup(), q.ChargedPerWakeup(), q.SwitchesPerWakeup(), q.VoluntaryPerWakeup(), q.ProgPerSample(), q.Received, q.Emitted, polls, q.Lost,
					q.Late, q.MaxLag.Round(time.Microsecond), process)
			}
			if err := q.Check(); err != nil {
				fmt.Fprintf(stderr, "round %d/%d  %v\n", round+1, c.rounds, err)
			}
		}
		add(rate, res)
	}
	return nil
}

// parseRates parses -quiet-rates: samples per second, or "idle".
func parseRates(s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(f)
		if f == "idle" {
			out = append(out, 0)
			continue
		}
		n, err := strconv.Atoi(f)
		if err != nil || n <= 0 || n > 100000 {
			return nil, fmt.Errorf("-quiet-rates: %q is neither a rate in samples per second (1-100000) nor idle", f)
		}
		out = append(out, n)
	}
	return out, nil
}

// parseQuietModes parses -quiet-modes: a subset of the quiet modes, or
// empty for all.
func parseQuietModes(s string) ([]string, error) {
	if s == "" {
		return nil, nil
	}
	var out []string
	for _, m := range strings.Split(s, ",") {
		m = strings.TrimSpace(m)
		if !slices.Contains(benchrun.QuietModes, m) && !slices.Contains(benchrun.QuietIdleModes, m) {
			return nil, fmt.Errorf("-quiet-modes: unknown mode %q (modes: %s)", m, strings.Join(allQuietModes(), ", "))
		}
		out = append(out, m)
	}
	return out, nil
}

// allQuietModes is every mode of the quiet measurement, in table order: a
// mode measured only while idle comes after the one before it there.
func allQuietModes() []string {
	out := slices.Clone(benchrun.QuietModes)
	for i, m := range benchrun.QuietIdleModes {
		if !slices.Contains(out, m) {
			at := len(out)
			if i > 0 {
				at = slices.Index(out, benchrun.QuietIdleModes[i-1]) + 1
			}
			out = slices.Insert(out, at, m)
		}
	}
	return out
}
