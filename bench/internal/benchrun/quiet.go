// SPDX-License-Identifier: Apache-2.0

package benchrun

// The quiet measurement: what a consumer costs per wakeup when samples come
// one at a time, a few hundred or a few thousand a second, and what it
// costs when none come. That is the life of an always-on agent, where the
// cost is per wakeup, not per sample (issue #16).
//
// The consumer runs in a child process of its own, so that its CPU time and
// context switches are counted alone: the C reference is a standalone C
// program (bench/perfbench/cquiet), since a C loop inside a Go process would
// carry the Go runtime's wakeups; a Go mode is perfbench itself, run again
// as a consumer (QuietConsume). Both speak the same protocol on stdout:
//
//	ready
//	result received=N lost=N task_clock_ns=N utime_us=N stime_us=N nvcsw=N nivcsw=N wall_us=N [polls=N] [other=N...]
//
// "ready" comes once the rings are open, and the window measured starts
// there: the consumer reads its task clock (taskclock.go: every thread's,
// counted as perf stat counts it) and getrusage(RUSAGE_SELF) (every thread
// of the process: the switches, and the CPU time the scheduler charged)
// before it prints it, and again after its last sample (idle: when its
// timeout is up), and "result" reports the differences. The process's
// whole rusage, as wait4 returns it, is kept beside it (QuietResult.Process)
// but not used for the figures: it holds the start-up (the Go runtime's,
// libbpf's perf_event_open and mmap per CPU) and the exit, which over a few
// hundred samples would weigh as much as the wakeups, and would be most of
// what an idle consumer does in 3 s.
//
// The producer is the calling process: the emit program run on QuietCPU
// (BPF_PROG_TEST_RUN) once per sample, paced by the clock, from a thread
// pinned to QuietCPU. The consumer is not pinned: an agent is not, and a Go
// process confined to one CPU runs with GOMAXPROCS 1, whose scheduler (its
// sysmon among it) behaves otherwise than on the machine's CPUs. WakeupEvents
// is 1 in every mode, C's included: one wakeup per sample.
//
// Over a BPF ring buffer (rbbench.bpf.o's, the ring buffer measurements'
// emitter), the same: C is ring_buffer__poll, and the Go modes read the
// ring buffer with their defaults. Its program outputs with no flags, so
// the kernel wakes the reader at each commit that finds the reader caught
// up with it: one wakeup per sample at these rates too. A consumer that
// counts its polls (polls=N: those that delivered a record) shows it.

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/aquasecurity/libbpfgo"
	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/perf"
	"github.com/cilium/ebpf/ringbuf"
	"github.com/perfbuf/perfbuf"
	"github.com/perfbuf/perfbuf/bench/internal/cref"
	"github.com/perfbuf/perfbuf/internal/bpfrun"
	"github.com/perfbuf/perfbuf/internal/kernel"
	"golang.org/x/sys/unix"
)

// ModeReaderNoLatency is the Reader with ReaderOptions.MaxLatency -1, a
// budget of zero: it wakes for every sample, as the Reader did by default
// before the latency budget, and as C's and cilium/ebpf's readers do. It
// is the row of issue 48's zero-budget goal.
const ModeReaderNoLatency = "reader-nolatency"

// ModeReaderHoldOff is the Reader (ReadBatch) with its wakeups held off
// by hand: over a perf event array WakeupEvents above the run's samples,
// over a ring buffer WakeupBytes half the ring (the reader stops
// committing after a wakeup, so the kernel wakes it no more), and
// MaxLatency holdOffLatency: the reader drains on its timer. It shows what
// the producing program saves (QuietResult.Prog) when the reader does not
// ask to be woken for each sample.
const ModeReaderHoldOff = "reader-holdoff"

// holdOffLatency is ModeReaderHoldOff's MaxLatency.
const holdOffLatency = 10 * time.Millisecond

// QuietModes are the consumers the quiet measurement compares at each of
// QuietRates, the reference first.
var QuietModes = []string{ModeC, ModeCallback, ModeRawZeroCopy, ModeReader, ModeReaderNoLatency, ModeReaderBatch, ModeReaderEach, ModeCilium, ModeOrdered, ModeReaderHoldOff}

// QuietIdleModes are the consumers it compares while idle: the Reader also
// without MaxLatency. (reader-each waits as reader does.)
var QuietIdleModes = []string{ModeC, ModeCallback, ModeReader, ModeReaderNoLatency, ModeOrdered}

// RBQuietModes are the consumers the quiet measurement compares over a
// BPF ring buffer at each of QuietRates, the reference
// (ring_buffer__poll) first.
var RBQuietModes = []string{ModeC, ModeCallback, ModeRawZeroCopy, ModeReader, ModeReaderNoLatency, ModeReaderBatch, ModeReaderEach, ModeCilium, ModeOrdered, ModeReaderHoldOff}

// RBQuietIdleModes are those it compares over a ring buffer while idle.
var RBQuietIdleModes = []string{ModeC, ModeCallback, ModeReader}

// QuietRates are the rates measured, in samples per second; 0 is idle.
var QuietRates = []int{300, 3000, 0}

const (
	QuietSize     = 64 // bytes per sample
	QuietPages    = 64 // data pages per ring, every mode
	QuietCPU      = 0  // the producer's CPU
	QuietDuration = 3 * time.Second
	// QuietMapFD is the map's descriptor in the consumer (the perf event
	// array's or the ring buffer's): its first ExtraFiles.
	QuietMapFD = 3
	// quietKeyOffset is where the ordered consumer finds its key: the
	// emit program's ktime stamp.
	quietKeyOffset = 8
	// quietSlack is how long after the run a consumer may still wait for
	// its samples (its timeout is the run's duration plus this), and how
	// long the consumer may take to start.
	quietSlack = 5 * time.Second
)

// QuietCommand returns the consumer's command: it must read count samples
// from the map at descriptor QuietMapFD (the emitter's: a perf event array
// or a BPF ring buffer) and stop, or with count 0 wait until timeout is up;
// either way it gives up after timeout.
// Quiet sets its ExtraFiles and Stdout; the rest (Stderr) is the caller's.
type QuietCommand func(count int, timeout time.Duration) *exec.Cmd

// QuietConfig is one quiet run: one consumer, one rate.
type QuietConfig struct {
	Mode     string        // for the result and errors
	Rate     int           // samples per second; 0: idle
	Duration time.Duration // of the production (or of the idle wait); 0 means QuietDuration
	Command  QuietCommand
}

// Usage is what a process used over a window, over all its threads.
type Usage struct {
	// CPU is the task clock in a consumer's window (taskclock.go); in a
	// process's whole life (QuietResult.Process), user + system time.
	CPU time.Duration
	// Charged is the user + system time getrusage reports for the window:
	// the scheduler's sum_exec_runtime, which on this VM charges a thread
	// several times its task clock around its sleeps (taskclock.go).
	Charged     time.Duration
	Voluntary   int64 // context switches: the process blocked
	Involuntary int64 // context switches: it was preempted
	Wall        time.Duration
}

// Switches is the voluntary and involuntary context switches.
func (u Usage) Switches() int64 { return u.Voluntary + u.Involuntary }

// QuietResult is one quiet run.
type QuietResult struct {
	Mode     string
	Rate     int
	Emitted  uint64 // the emitter's successful outputs
	Failed   uint64 // outputs that found no room (or no reader): lost
	Received uint64 // samples the consumer read
	// Lost is the samples the kernel told the consumer were lost. A ring
	// buffer tells its reader of no loss: there it is Failed, as in
	// RBSustained.
	Lost uint64
	// Polls is the consumer's waits that delivered a record, if it counts
	// them (C and callback do; 0 if not): Received / Polls is the samples
	// per wakeup.
	Polls   uint64
	Window  Usage // the consumer's, from its "ready" to its last sample (idle: its timeout)
	Process Usage // the consumer process's whole life (wait4), start-up and exit included
	// The producer's pacing: its worst delay behind the schedule, and the
	// samples it emitted more than half a period late (which may share a
	// wakeup with the next one).
	MaxLag time.Duration
	Late   int
	// Prog is what the kernel counted of the emit program's runs while it
	// emitted (BPF_ENABLE_STATS): one run a sample, the wakeup it raised
	// included.
	Prog kernel.ProgStats
}

// ProgPerSample is the emit program's own time a run, in ns: what the
// producer pays a sample, the wakeup it raises for the consumer included.
func (r QuietResult) ProgPerSample() float64 {
	return perUnit(float64(r.Prog.RunTime.Nanoseconds()), float64(r.Prog.Runs))
}

// Check reports an accounting mismatch: the consumer must have received
// every sample emitted, and been told of every one that failed.
func (r QuietResult) Check() error {
	if r.Received != r.Emitted || r.Lost != r.Failed {
		return fmt.Errorf("quiet %s at %s: received %d and lost %d, emitter says emitted %d and failed %d",
			r.Mode, RateName(r.Rate), r.Received, r.Lost, r.Emitted, r.Failed)
	}
	return nil
}

// CPUPerWakeup is the consumer's CPU time per sample received, in µs (one
// sample per wakeup), or 0 if it received none.
func (r QuietResult) CPUPerWakeup() float64 {
	return perUnit(float64(r.Window.CPU.Nanoseconds())/1e3, float64(r.Received))
}

// ChargedPerWakeup is the CPU time getrusage charged it per sample
// received, in µs (Usage.Charged), or 0 if it received none.
func (r QuietResult) ChargedPerWakeup() float64 {
	return perUnit(float64(r.Window.Charged.Nanoseconds())/1e3, float64(r.Received))
}

// SwitchesPerWakeup is its context switches per sample received.
func (r QuietResult) SwitchesPerWakeup() float64 {
	return perUnit(float64(r.Window.Switches()), float64(r.Received))
}

// VoluntaryPerWakeup is its voluntary context switches per sample received.
func (r QuietResult) VoluntaryPerWakeup() float64 {
	return perUnit(float64(r.Window.Voluntary), float64(r.Received))
}

// SamplesPerPoll is the samples received per poll that delivered any, or
// 0 if the consumer did not count its polls.
func (r QuietResult) SamplesPerPoll() float64 {
	return perUnit(float64(r.Received), float64(r.Polls))
}

// WakeupsPerSecond is its voluntary context switches per second of the
// window: each is a sleep that a wakeup ended.
func (r QuietResult) WakeupsPerSecond() float64 {
	return perUnit(float64(r.Window.Voluntary), r.Window.Wall.Seconds())
}

// SwitchesPerSecond is its context switches per second of the window.
func (r QuietResult) SwitchesPerSecond() float64 {
	return perUnit(float64(r.Window.Switches()), r.Window.Wall.Seconds())
}

// CPUPerSecond is its CPU time per second of the window, in ms.
func (r QuietResult) CPUPerSecond() float64 {
	return perUnit(float64(r.Window.CPU.Nanoseconds())/1e6, r.Window.Wall.Seconds())
}

func perUnit(x, n float64) float64 {
	if n <= 0 {
		return 0
	}
	return x / n
}

// RateName is "300/s", or "idle" for 0.
func RateName(rate int) string {
	if rate == 0 {
		return "idle"
	}
	return strconv.Itoa(rate) + "/s"
}

// Quiet runs one consumer (cfg.Command) over e's map, a perf event array
// or a BPF ring buffer, while this process emits cfg.Rate QuietSize-byte
// samples a second on QuietCPU for cfg.Duration (none if the rate is 0),
// and returns what the consumer received and used. The consumer gets the
// map's descriptor as QuietMapFD; production starts once it has said
// "ready" and stops after Duration; the run ends when the consumer has
// reported and exited. Over a ring buffer, the result's Lost is its Failed.
func Quiet(e *bpfrun.Emitter, cfg QuietConfig) (QuietResult, error) {
	if cfg.Duration == 0 {
		cfg.Duration = QuietDuration
	}
	res := QuietResult{Mode: cfg.Mode, Rate: cfg.Rate}
	if cfg.Rate < 0 || cfg.Duration < 0 || cfg.Command == nil {
		return res, fmt.Errorf("quiet %s: bad config %+v", cfg.Mode, cfg)
	}
	fail := func(err error) (QuietResult, error) {
		return res, fmt.Errorf("quiet %s at %s: %w", cfg.Mode, RateName(cfg.Rate), err)
	}
	count := int(int64(cfg.Rate) * int64(cfg.Duration) / int64(time.Second))
	timeout := cfg.Duration
	if cfg.Rate > 0 {
		timeout += quietSlack
	}

	p, err := startConsumer(e.Events.FileDescriptor(), cfg.Command(count, timeout))
	if err != nil {
		return fail(err)
	}
	stop := func(err error) (QuietResult, error) { return fail(p.kill(err)) }

	before, err := e.Stats()
	if err != nil {
		return stop(err)
	}
	// The program's own time, counted only while statsFD is open.
	statsFD, err := kernel.EnableRunStats()
	if err != nil {
		return stop(err)
	}
	prog0, err := kernel.GetProgStats(e.Prog)
	if err == nil && count > 0 {
		res.MaxLag, res.Late, err = pace(e, count, cfg.Rate)
	}
	var prog1 kernel.ProgStats
	if err == nil {
		prog1, err = kernel.GetProgStats(e.Prog)
	}
	unix.Close(statsFD)
	if err != nil {
		return stop(err)
	}
	res.Prog = prog1.Sub(prog0)
	after, err := e.Stats()
	if err != nil {
		return stop(err)
	}
	for _, cpu := range e.CPUs {
		d := after[cpu].Sub(before[cpu])
		res.Emitted += d.Emitted
		res.Failed += d.Failed
	}

	line, err := p.result(timeout + quietSlack)
	if err != nil {
		return stop(err)
	}
	if res.Process, err = p.wait(); err != nil {
		return fail(err)
	}
	rep, err := ParseQuietResult(line)
	if err != nil {
		return fail(err)
	}
	res.Received, res.Lost, res.Polls, res.Window = rep.Received, rep.Lost, rep.Polls, rep.Usage
	if e.Events.Type() == libbpfgo.MapTypeRingbuf {
		res.Lost = res.Failed
	}
	return res, nil
}

// consumerProc is a consumer running in a process of its own, which
// speaks the protocol above on its stdout.
type consumerProc struct {
	cmd   *exec.Cmd
	lines chan string
	start time.Time
}

// startConsumer starts cmd with a duplicate of mapFD as its QuietMapFD and
// its stdout piped, and waits for its "ready". On error the consumer has
// been killed and reaped.
func startConsumer(mapFD int, cmd *exec.Cmd) (*consumerProc, error) {
	// The child's fd 3 is a duplicate, in an *os.File of its own: closing
	// that (after Start) must not close the map's descriptor.
	dup, err := unix.FcntlInt(uintptr(mapFD), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("duplicate map fd: %w", err)
	}
	mapFile := os.NewFile(uintptr(dup), "events")
	defer mapFile.Close()
	cmd.ExtraFiles = []*os.File{mapFile}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	// The child inherits the CPU affinity of the thread that starts it:
	// not pinned, since the producers pin goroutines (and threads) of
	// their own.
	p := &consumerProc{cmd: cmd, lines: make(chan string, 4), start: time.Now()}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start consumer: %w", err)
	}
	mapFile.Close()
	go func() {
		defer close(p.lines)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			p.lines <- sc.Text()
		}
	}()
	if err := expect(p.lines, "ready", quietSlack); err != nil {
		return nil, p.kill(err)
	}
	return p, nil
}

// kill ends the consumer early, killed and reaped, and returns err, with
// the consumer's exit status if it had exited by itself.
func (p *consumerProc) kill(err error) error {
	_ = p.cmd.Process.Kill()
	for range p.lines { // until the pipe closes: Wait closes it only after
	}
	// The exit status says why a consumer stopped early; a consumer
	// killed here was killed.
	if werr := p.cmd.Wait(); werr != nil && errors.Is(err, errExited) {
		err = fmt.Errorf("%w (consumer: %v)", err, werr)
	}
	return err
}

// result waits up to timeout for the consumer's "result" line.
func (p *consumerProc) result(timeout time.Duration) (string, error) {
	return expectResult(p.lines, timeout)
}

// stopEvery is how often finish repeats its stopSignal.
const stopEvery = 100 * time.Millisecond

// finish waits up to grace for the consumer's "result" line; then it asks
// the consumer to stop (stopSignal, again every stopEvery) and waits up to
// quietSlack more.
func (p *consumerProc) finish(grace time.Duration) (string, error) {
	isResult := func(l string) bool { return strings.HasPrefix(l, "result ") }
	wait := time.NewTimer(grace)
	defer wait.Stop()
	var tick <-chan time.Time
	for {
		select {
		case l, ok := <-p.lines:
			if !ok {
				return "", fmt.Errorf("waiting for its result: %w", errExited)
			}
			if isResult(l) {
				return l, nil
			}
		case <-wait.C:
			if tick != nil {
				return "", fmt.Errorf("asked the consumer to stop, and waited %v more for its result", quietSlack)
			}
			t := time.NewTicker(stopEvery)
			defer t.Stop()
			tick = t.C
			wait.Reset(quietSlack)
			_ = p.cmd.Process.Signal(stopSignal)
		case <-tick:
			_ = p.cmd.Process.Signal(stopSignal)
		}
	}
}

// wait waits for the consumer's exit, after its result, and returns what
// the process used in its whole life.
func (p *consumerProc) wait() (Usage, error) {
	for range p.lines {
	}
	if err := p.cmd.Wait(); err != nil {
		return Usage{}, fmt.Errorf("consumer: %w", err)
	}
	u := Usage{Wall: time.Since(p.start)}
	if ru, ok := p.cmd.ProcessState.SysUsage().(*syscall.Rusage); ok {
		u.CPU = time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
		u.Voluntary, u.Involuntary = ru.Nvcsw, ru.Nivcsw
	}
	return u, nil
}

// errExited is the error of a consumer whose output ended early.
var errExited = errors.New("consumer exited before it said so")

// expect waits up to timeout for the line want.
func expect(lines <-chan string, want string, timeout time.Duration) error {
	_, err := expectLine(lines, fmt.Sprintf("%q", want), timeout, func(l string) bool { return l == want })
	return err
}

// expectResult waits up to timeout for the "result" line.
func expectResult(lines <-chan string, timeout time.Duration) (string, error) {
	return expectLine(lines, "its result", timeout, func(l string) bool { return strings.HasPrefix(l, "result ") })
}

// expectLine waits up to timeout for a line that match accepts, and
// returns it; what names it in errors.
func expectLine(lines <-chan string, what string, timeout time.Duration, match func(string) bool) (string, error) {
	tm := time.NewTimer(timeout)
	defer tm.Stop()
	for {
		select {
		case l, ok := <-lines:
			if !ok {
				return "", fmt.Errorf("waiting for %s: %w", what, errExited)
			}
			if match(l) {
				return l, nil
			}
		case <-tm.C:
			return "", fmt.Errorf("waited %v for %s from the consumer", timeout, what)
		}
	}
}

// pace emits n samples on QuietCPU, sample i at i/rate seconds from the
// start, from a thread pinned there that sleeps to each sample's time
// (clock_nanosleep to an absolute time: a late wakeup delays that sample,
// not the ones after it). It returns the worst delay behind the schedule,
// and how many samples were more than half a period late.
func pace(e *bpfrun.Emitter, n, rate int) (maxLag time.Duration, late int, err error) {
	type result struct {
		lag  time.Duration
		late int
		err  error
	}
	done := make(chan result, 1)
	// A goroutine of its own, so that the caller's thread is never pinned
	// (a consumer started from it would inherit the affinity).
	go func() {
		unpin, err := bpfrun.Pin(QuietCPU)
		if err != nil {
			done <- result{err: err}
			return
		}
		defer unpin()
		var now unix.Timespec
		if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &now); err != nil {
			done <- result{err: fmt.Errorf("clock_gettime: %w", err)}
			return
		}
		start, period := now.Nano(), int64(time.Second)/int64(rate)
		var lag int64
		late := 0
		for i := 0; i < n; i++ {
			at := start + int64(i)*period
			ts := unix.NsecToTimespec(at)
			for {
				err := unix.ClockNanosleep(unix.CLOCK_MONOTONIC, unix.TIMER_ABSTIME, &ts, nil)
				if err != unix.EINTR {
					break
				}
			}
			_ = unix.ClockGettime(unix.CLOCK_MONOTONIC, &now)
			lag = max(lag, now.Nano()-at)
			if now.Nano()-at > period/2 {
				late++
			}
			if err := e.Emit(QuietCPU, 1, QuietSize, 0); err != nil {
				done <- result{err: err}
				return
			}
		}
		done <- result{lag: time.Duration(lag), late: late}
	}()
	r := <-done
	return r.lag, r.late, r.err
}

// QuietReport is a consumer's "result" line.
type QuietReport struct {
	Received, Lost uint64
	Polls          uint64 // 0 if the consumer does not count them
	Usage          Usage
	// Latency is the records' delivery latency, if the consumer measured
	// it (the host measurement's do: lat_n=N lat_p50_ns=N lat_p99_ns=N
	// lat_max_ns=N); its N is 0 if not.
	Latency Latency
}

// Latency is a summary of the delivery latencies of N records: from the
// ktime the program wrote in a record to the consumer's CLOCK_MONOTONIC
// when it was handed the record.
type Latency struct {
	N             uint64
	P50, P99, Max time.Duration
}

// ParseQuietResult parses a consumer's "result" line.
func ParseQuietResult(line string) (QuietReport, error) {
	var rep QuietReport
	fields := strings.Fields(line)
	if len(fields) == 0 || fields[0] != "result" {
		return rep, fmt.Errorf("parse consumer result %q: not a result line", line)
	}
	vals := map[string]uint64{}
	for _, f := range fields[1:] {
		k, v, ok := strings.Cut(f, "=")
		if !ok {
			return rep, fmt.Errorf("parse consumer result %q: field %q is not key=value", line, f)
		}
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			return rep, fmt.Errorf("parse consumer result %q: %w", line, err)
		}
		vals[k] = n
	}
	for _, k := range []string{"received", "lost", "task_clock_ns", "utime_us", "stime_us", "nvcsw", "nivcsw", "wall_us"} {
		if _, ok := vals[k]; !ok {
			return rep, fmt.Errorf("parse consumer result %q: no %s", line, k)
		}
	}
	if _, ok := vals["lat_n"]; ok {
		for _, k := range []string{"lat_p50_ns", "lat_p99_ns", "lat_max_ns"} {
			if _, ok := vals[k]; !ok {
				return rep, fmt.Errorf("parse consumer result %q: lat_n and no %s", line, k)
			}
		}
	}
	return QuietReport{
		Latency: Latency{N: vals["lat_n"], P50: time.Duration(vals["lat_p50_ns"]),
			P99: time.Duration(vals["lat_p99_ns"]), Max: time.Duration(vals["lat_max_ns"])},
		Received: vals["received"],
		Lost:     vals["lost"],
		Polls:    vals["polls"],
		Usage: Usage{
			CPU:         time.Duration(vals["task_clock_ns"]),
			Charged:     time.Duration(vals["utime_us"]+vals["stime_us"]) * time.Microsecond,
			Voluntary:   int64(vals["nvcsw"]),
			Involuntary: int64(vals["nivcsw"]),
			Wall:        time.Duration(vals["wall_us"]) * time.Microsecond,
		},
	}, nil
}

// formatQuietResult is the "result" line ParseQuietResult reads, as the C
// consumer prints it; polls 0 (not counted) is left out; sum is the sum of
// the bytes read (so that the reads cannot be elided), reported and not
// checked.
func formatQuietResult(received, lost uint64, taskClock, user, sys time.Duration, nvcsw, nivcsw int64, wall time.Duration, polls, sum uint64) string {
	p := ""
	if polls > 0 {
		p = fmt.Sprintf(" polls=%d", polls)
	}
	return fmt.Sprintf("result received=%d lost=%d task_clock_ns=%d utime_us=%d stime_us=%d nvcsw=%d nivcsw=%d wall_us=%d%s sum=%d",
		received, lost, taskClock.Nanoseconds(), user.Microseconds(), sys.Microseconds(), nvcsw, nivcsw, wall.Microseconds(), p, sum)
}

// QuietConsumerConfig is what a Go consumer is told.
type QuietConsumerConfig struct {
	Mode    string // a Go mode of the quiet modes of the map's kind
	MapFD   int
	RingBuf bool // the map is a BPF ring buffer, not a perf event array
	Count   int  // samples to read; 0: none, wait for the timeout
	Timeout time.Duration
	// Host makes it a consumer of the host measurement (host.go): a mode
	// of HostModes, over that measurement's rings, on the options its
	// mode names, noting each record's delivery latency.
	Host bool
}

// IsQuietGoMode reports whether mode is one QuietConsume runs over a perf
// event array (QuietModes, QuietIdleModes), or over a BPF ring buffer with
// ringBuf (RBQuietModes, RBQuietIdleModes).
func IsQuietGoMode(mode string, ringBuf bool) bool {
	modes, idle := QuietModes, QuietIdleModes
	if ringBuf {
		modes, idle = RBQuietModes, RBQuietIdleModes
	}
	return mode != ModeC && (slices.Contains(modes, mode) || slices.Contains(idle, mode))
}

// QuietConsume is the Go consumer of the quiet measurement, run in a
// process of its own: it opens cfg.Mode over cfg.MapFD, writes "ready" to
// w, reads until cfg.Count samples are accounted for (read or lost) or
// cfg.Timeout is up, and writes the "result" line. A count not reached is
// no error here: the parent's accounting reports it.
func QuietConsume(cfg QuietConsumerConfig, w io.Writer) error {
	known := IsQuietGoMode(cfg.Mode, cfg.RingBuf)
	if cfg.Host {
		known = IsHostGoMode(cfg.Mode)
	}
	if !known || cfg.Count < 0 || cfg.Timeout <= 0 {
		return fmt.Errorf("quiet consumer: bad config %+v", cfg)
	}
	c := &quietCounter{count: uint64(cfg.Count)}
	if cfg.Host {
		c.lat = newLatencies(cfg.Count)
	}
	var (
		setDeadline func(time.Time) // the readers'
		run         func(deadline time.Time) error
		interrupt   func() // ends run early, from another goroutine
	)
	m := perfbuf.MapFD(cfg.MapFD)
	// A ring buffer's size and wakeups are its object's and its program's:
	// the ring settings are refused for it.
	var opts perfbuf.Options
	switch {
	case cfg.RingBuf:
	case cfg.Host:
		opts = perfbuf.Options{RingBytes: RingBytes(HostPerfPages)}
	default:
		opts = perfbuf.Options{RingBytes: RingBytes(QuietPages), WakeupEvents: 1}
	}
	switch cfg.Mode {
	case ModeRawZeroCopy:
		raw, err := perfbuf.NewRaw(m, opts)
		if err != nil {
			return fmt.Errorf("quiet consumer: %w", err)
		}
		defer raw.Close()
		var bufs []*perfbuf.RawBuffer
		defer func() {
			for _, b := range bufs {
				if b != nil {
					b.Release()
				}
			}
		}()
		run = func(deadline time.Time) error { return c.raw(raw, &bufs, deadline) }
	case ModeCallback:
		pb, err := perfbuf.New(m, func(_ int, data []byte) { c.sample(data) },
			func(_ int, n uint64) { c.lost += n }, opts)
		if err != nil {
			return fmt.Errorf("quiet consumer: %w", err)
		}
		defer pb.Close()
		run = func(deadline time.Time) error {
			for !c.done() {
				left := time.Until(deadline)
				if left <= 0 {
					return nil
				}
				n, err := pb.Poll(left)
				if err != nil {
					return err
				}
				if n > 0 {
					c.polls++
				}
			}
			return nil
		}
	case ModeCilium:
		// The peer: cilium/ebpf's reader, whose wait blocks its thread in
		// epoll_wait (with an eventfd for its deadline and Close).
		cr, err := openCiliumQuiet(cfg.MapFD, cfg.RingBuf, cfg.Host)
		if err != nil {
			return fmt.Errorf("quiet consumer: %w", err)
		}
		defer cr.close()
		setDeadline, run, interrupt = cr.setDeadline, func(time.Time) error { return cr.read(c) }, cr.interrupt
	default:
		ropts := perfbuf.ReaderOptions{Options: opts}
		switch cfg.Mode {
		case ModeReaderNoLatency:
			ropts.MaxLatency = -1
		case ModeReaderHoldOff:
			if cfg.RingBuf {
				ropts.WakeupBytes = RBBytes / 2
			} else {
				ropts.WakeupEvents = max(cfg.Count+1, 2)
			}
			ropts.MaxLatency = holdOffLatency
		case ModeReaderBudget:
			ropts.MaxLatency = HostBudget
		case ModeOrdered:
			ropts.Order = &perfbuf.Order{KeyOffset: quietKeyOffset}
		}
		r, err := perfbuf.NewReader(m, ropts)
		if err != nil {
			return fmt.Errorf("quiet consumer: %w", err)
		}
		defer r.Close()
		setDeadline = r.SetDeadline
		interrupt = func() { r.SetDeadline(time.Now()) } // a read blocked at the call sees it
		switch {
		case cfg.Mode == ModeReaderEach:
			run = func(time.Time) error { return c.each(r) }
		case cfg.Mode == ModeReaderBatch || cfg.Mode == ModeReaderHoldOff || cfg.Host:
			run = func(time.Time) error { return c.readBatch(r) }
		default:
			run = func(time.Time) error { return c.readInto(r) }
		}
	}
	// The readers' deadline is set before the window; it wakes their
	// first wait, which costs the window one epoll_wait that does not
	// block and the eventfd's read.
	deadline := time.Now().Add(cfg.Timeout)
	if setDeadline != nil {
		setDeadline(deadline)
	}
	if cfg.Host && interrupt != nil {
		stopOnSignal(interrupt)
	}
	tc, err := OpenTaskClock()
	if err != nil {
		return fmt.Errorf("quiet consumer: %w", err)
	}
	defer tc.Close()
	var r0 unix.Rusage
	if err := unix.Getrusage(unix.RUSAGE_SELF, &r0); err != nil {
		return fmt.Errorf("quiet consumer: getrusage: %w", err)
	}
	c0, err := tc.Read()
	if err != nil {
		return fmt.Errorf("quiet consumer: %w", err)
	}
	t0 := time.Now()
	if _, err := io.WriteString(w, "ready\n"); err != nil {
		return err
	}
	err = run(deadline)
	c1, cerr := tc.Read()
	var r1 unix.Rusage
	if gerr := unix.Getrusage(unix.RUSAGE_SELF, &r1); gerr != nil && err == nil {
		err = fmt.Errorf("getrusage: %w", gerr)
	}
	wall := time.Since(t0)
	if err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("quiet consumer %s: %w", cfg.Mode, err)
	}
	_, err = fmt.Fprintln(w, formatQuietResult(c.received, c.lost, time.Duration(c1-c0),
		time.Duration(r1.Utime.Nano()-r0.Utime.Nano()), time.Duration(r1.Stime.Nano()-r0.Stime.Nano()),
		r1.Nvcsw-r0.Nvcsw, r1.Nivcsw-r0.Nivcsw, wall, c.polls, c.sum)+c.lat.format())
	return err
}

// stopSignal asks a consumer of the host measurement to stop reading and
// report, as its records are all delivered or lost (over a ring buffer a
// failed output is never delivered, nor reported to the reader). The
// parent sends it again until the result comes, in case one lands just
// before the consumer's wait.
const stopSignal = unix.SIGUSR1

// stopOnSignal calls interrupt at each stopSignal, for the rest of the
// process's life (its default action, to end the process, would lose the
// result line).
func stopOnSignal(interrupt func()) {
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, stopSignal)
	go func() {
		for range sig {
			interrupt()
		}
	}()
}

// quietCounter counts what a Go consumer read, as the C consumer's
// callbacks do.
type quietCounter struct {
	count, received, lost, sum uint64
	polls                      uint64     // callback: Polls that delivered a record
	lat                        *latencies // nil: not noted
}

func (c *quietCounter) sample(data []byte) {
	c.sum += cref.ReadAll(data)
	c.received++
	c.lat.note(data)
}

// done reports whether count samples are accounted for; never with count 0.
func (c *quietCounter) done() bool { return c.count > 0 && c.received+c.lost >= c.count }

// errQuietDone ends Each once the count is reached.
var errQuietDone = errors.New("count reached")

// readInto reads with ReadInto until done or the deadline.
func (c *quietCounter) readInto(r *perfbuf.Reader) error {
	var s perfbuf.Sample
	for !c.done() {
		if err := r.ReadInto(&s); err != nil {
			if errors.Is(err, os.ErrDeadlineExceeded) {
				return nil
			}
			return err
		}
		c.record(s.Type, s.Lost, s.Data)
	}
	return nil
}

// readBatch reads with ReadBatch, 64 Samples a call, until done or the
// deadline.
func (c *quietCounter) readBatch(r *perfbuf.Reader) error {
	s := make([]perfbuf.Sample, 64)
	for !c.done() {
		n, err := r.ReadBatch(s)
		for i := range s[:n] {
			c.record(s[i].Type, s[i].Lost, s[i].Data)
		}
		if errors.Is(err, os.ErrDeadlineExceeded) {
			return nil
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// raw waits with Raw.Wait and drains, in place, each ring it names (a
// RawBuffer a ring, taken when first named, in *bufs) until done or the
// deadline.
func (c *quietCounter) raw(raw *perfbuf.Raw, bufs *[]*perfbuf.RawBuffer, deadline time.Time) error {
	var ready []int
	fn := func(rec *perfbuf.Record) error {
		if rec.Type == perfbuf.RecordSample {
			c.sum += readRecord(rec)
			c.received++
		} else {
			c.record(rec.Type, rec.Lost, nil)
		}
		return nil
	}
	for !c.done() {
		left := time.Until(deadline)
		if left <= 0 {
			return nil
		}
		var err error
		if ready, err = raw.Wait(left, ready[:0]); err != nil {
			return err
		}
		for _, i := range ready {
			for len(*bufs) <= i {
				*bufs = append(*bufs, nil)
			}
			if (*bufs)[i] == nil {
				if (*bufs)[i], err = raw.Buffer(i); err != nil {
					return err
				}
			}
			if _, err := (*bufs)[i].Drain(fn); err != nil {
				return err
			}
		}
	}
	return nil
}

// each reads with Each until done or the deadline.
func (c *quietCounter) each(r *perfbuf.Reader) error {
	if c.done() {
		return nil
	}
	err := r.Each(context.Background(), func(rec *perfbuf.Record) error {
		if rec.Type == perfbuf.RecordSample {
			c.sum += readRecord(rec)
			c.received++
		} else {
			c.record(rec.Type, rec.Lost, nil)
		}
		if c.done() {
			return errQuietDone
		}
		return nil
	})
	if errors.Is(err, errQuietDone) || errors.Is(err, os.ErrDeadlineExceeded) {
		return nil
	}
	return err
}

func (c *quietCounter) record(typ perfbuf.RecordType, lost uint64, data []byte) {
	switch typ {
	case perfbuf.RecordSample:
		c.sample(data)
	case perfbuf.RecordLost:
		c.lost += lost
	}
}

// ciliumQuiet is cilium/ebpf's reader over the quiet map: its ring buffer
// reader, or its perf reader with the quiet rings' size and a wakeup a
// sample, as the other modes have; for the host measurement, its perf
// reader with that measurement's rings and its default options (which
// wake it for every record too).
type ciliumQuiet struct {
	m    *ebpf.Map
	rb   *ringbuf.Reader
	perf *perf.Reader
}

func openCiliumQuiet(mapFD int, ringBuf, host bool) (*ciliumQuiet, error) {
	m, err := ciliumMap(mapFD)
	if err != nil {
		return nil, err
	}
	c := &ciliumQuiet{m: m}
	switch {
	case ringBuf:
		c.rb, err = ringbuf.NewReader(m)
	case host:
		c.perf, err = perf.NewReader(m, RingBytes(HostPerfPages))
	default:
		c.perf, err = perf.NewReaderWithOptions(m, RingBytes(QuietPages), perf.ReaderOptions{WakeupEvents: 1})
	}
	if err != nil {
		m.Close()
		return nil, fmt.Errorf("cilium/ebpf reader: %w", err)
	}
	return c, nil
}

func (c *ciliumQuiet) setDeadline(t time.Time) {
	if c.rb != nil {
		c.rb.SetDeadline(t)
	} else {
		c.perf.SetDeadline(t)
	}
}

// read reads with ReadInto into one reused record until q is done or the
// deadline.
func (c *ciliumQuiet) read(q *quietCounter) error {
	var (
		rrec ringbuf.Record
		prec perf.Record
		err  error
	)
	for !q.done() {
		if c.rb != nil {
			if err = c.rb.ReadInto(&rrec); err == nil {
				q.sample(rrec.RawSample)
			}
		} else if err = c.perf.ReadInto(&prec); err == nil {
			if prec.LostSamples > 0 {
				q.lost += prec.LostSamples
			} else {
				q.sample(prec.RawSample)
			}
		}
		if errors.Is(err, os.ErrDeadlineExceeded) || errors.Is(err, os.ErrClosed) { // ErrClosed: interrupt
			return nil
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// interrupt ends a read: cilium/ebpf's SetDeadline waits for a blocked
// read's lock, but its Close interrupts the read.
func (c *ciliumQuiet) interrupt() {
	if c.rb != nil {
		c.rb.Close()
	} else {
		c.perf.Close()
	}
}

func (c *ciliumQuiet) close() {
	if c.rb != nil {
		c.rb.Close()
	} else {
		c.perf.Close()
	}
	c.m.Close()
}
