// SPDX-License-Identifier: Apache-2.0

package benchrun

// The host measurement: what an event costs the whole host, not only its
// reader (issue #48). The producer is one the kernel runs: a tracepoint
// program on getppid(2) (bench/perfbench/bpf/hostbench.bpf.c) that writes
// a HostRecordSize-byte record, its sequence number and its
// bpf_ktime_get_ns(), for each call of the workload's thread and of no
// other. The workload is a thread of this process, locked and pinned to
// HostCPU, that calls getppid at a set rate on an absolute clock (a late
// wakeup makes the calls due meanwhile at once; it moves no later call).
// The consumer is a process of its own, as in the quiet measurement
// (quiet.go's protocol), which also reports the records' delivery latency.
//
// Per event it reports the program's own time (BPF_ENABLE_STATS), the
// workload thread's CPU (its task clock, the program's time and any wakeup
// it raises included; ModeDetached gives the same workload with no program
// attached), the consumer's task clock and context switches, and the
// delivery latency (p50, p99, max).

import (
	"errors"
	"fmt"
	"slices"
	"syscall"
	"time"
	"unsafe"

	"github.com/aquasecurity/libbpfgo"
	"github.com/perfbuf/perfbuf/internal/bpfrun"
	"github.com/perfbuf/perfbuf/internal/kernel"
	"golang.org/x/sys/unix"
)

// The host measurement's modes beyond the quiet ones. Over both kinds, C
// is libbpf on its defaults (perf_buffer__new: a wakeup a record;
// ring_buffer__poll), cilium is cilium/ebpf's readers on their defaults,
// reader-batch is perfbuf's Reader on its defaults (ReadBatch), and
// reader-nolatency the same with MaxLatency -1 (a wakeup a record).
const (
	// ModeCTuned is libbpf hand-tuned: it drains every HostBudget on a
	// timer (ring_buffer__consume, perf_buffer__consume); over a ring
	// buffer the program writes with BPF_RB_NO_WAKEUP (HostRBFlags), over
	// a perf event array the rings wake it at a watermark of half a ring.
	ModeCTuned = "C-tuned"
	// ModeReaderBudget is the Reader (ReadBatch) with MaxLatency
	// HostBudget and no other option: a latency budget.
	ModeReaderBudget = "reader-10ms"
	// ModeDetached is the workload alone: no program attached, no
	// consumer. The workload's CPU an event less this is what the program
	// and the wakeups it raises cost the producing thread.
	ModeDetached = "detached"
)

// HostModes are the modes of the host measurement, on either ring kind.
var HostModes = []string{ModeDetached, ModeC, ModeCTuned, ModeCilium, ModeReaderBatch, ModeReaderNoLatency, ModeReaderBudget}

// HostRates are the rates measured, in events a second.
var HostRates = []int{1000, 10000, 100000, 1000000}

const (
	HostRecordSize  = 16 // bytes a record: seq, ktime
	HostKtimeOffset = 8  // where a record holds its bpf_ktime_get_ns()
	// HostPerfPages is the data pages of each perf ring, and HostRBBytes
	// the ring buffer's size (hostbench.bpf.c's HOST_RB_BYTES): at 1M
	// events a second a HostBudget is 10,000 records, 320 KB in a perf
	// ring, 240 KB in a ring buffer.
	HostPerfPages = 256
	HostRBBytes   = 4 << 20
	HostCPU       = 0 // the workload's CPU
	HostDuration  = 2 * time.Second
	HostBudget    = 10 * time.Millisecond // ModeCTuned's timer, ModeReaderBudget's MaxLatency
	// hostTimeoutFactor: a consumer gives up after this many times the
	// run's duration (and quietSlack), since a workload that cannot keep
	// the rate takes longer to make its calls; RunHost stops it once they
	// are made, hostGrace after them if its records have not all come.
	hostTimeoutFactor = 60
	hostGrace         = 2 * time.Second
	rbNoWakeup        = 1 // BPF_RB_NO_WAKEUP
)

// IsHostGoMode reports whether mode is one of HostModes that QuietConsume
// runs (with QuietConsumerConfig.Host).
func IsHostGoMode(mode string) bool {
	return slices.Contains([]string{ModeCilium, ModeReaderBatch, ModeReaderNoLatency, ModeReaderBudget}, mode)
}

// HostRBFlags are the ring buffer program's output flags in mode.
func HostRBFlags(mode string) uint64 {
	if mode == ModeCTuned {
		return rbNoWakeup
	}
	return 0
}

// Host is the loaded hostbench object: a program and a map for each kind.
type Host struct {
	mod    *libbpfgo.Module
	progs  [2]*libbpfgo.BPFProg // by kind: perf event array, ring buffer
	maps   [2]*libbpfgo.BPFMap
	config *libbpfgo.BPFMap
}

// kind indexes Host's programs and maps.
func kind(ringBuf bool) int {
	if ringBuf {
		return 1
	}
	return 0
}

// OpenHost loads the object at path (built by `make bpf`). Close it when
// done.
func OpenHost(path string) (*Host, error) {
	m, err := bpfrun.Load(path)
	if err != nil {
		return nil, err
	}
	h := &Host{mod: m}
	for i, name := range []string{"host_perf", "host_rb"} {
		if h.progs[i], err = m.GetProgram(name); err != nil {
			m.Close()
			return nil, fmt.Errorf("find program %s in %s: %w", name, path, err)
		}
	}
	for i, name := range []string{"host_perf_events", "host_rb_events"} {
		if h.maps[i], err = bpfrun.Map(m, name); err != nil {
			m.Close()
			return nil, err
		}
	}
	if h.config, err = bpfrun.Map(m, "host_config"); err != nil {
		m.Close()
		return nil, err
	}
	return h, nil
}

// Close unloads the object.
func (h *Host) Close() { h.mod.Close() }

// configure records the calls of thread tid only, and makes the ring
// buffer program output with rbFlags. tid is as this process's PID
// namespace numbers it (a container's has its own): the program compares
// it in that namespace, which /proc/self/ns/pid's device and inode name.
func (h *Host) configure(tid int, rbFlags uint64) error {
	var ns unix.Stat_t
	if err := unix.Stat("/proc/self/ns/pid", &ns); err != nil {
		return fmt.Errorf("set host_config: the PID namespace: %w", err)
	}
	var key uint32
	val := struct {
		tid, _       uint32
		rbFlags      uint64
		nsDev, nsIno uint64
	}{tid: uint32(tid), rbFlags: rbFlags, nsDev: ns.Dev, nsIno: ns.Ino}
	if err := h.config.Update(unsafe.Pointer(&key), unsafe.Pointer(&val)); err != nil {
		return fmt.Errorf("set host_config: %w", err)
	}
	return nil
}

// HostConfig is one host run: one mode, one kind, one rate.
type HostConfig struct {
	Mode     string
	RingBuf  bool          // the ring buffer program and map, not the perf ones
	Rate     int           // events a second
	Duration time.Duration // of the workload at Rate; 0 means HostDuration
	Command  QuietCommand  // the consumer; nil for ModeDetached
}

// HostResult is one host run.
type HostResult struct {
	Mode    string
	RingBuf bool
	Rate    int
	// The workload: its calls, the time from its first to its last, its
	// worst delay behind the schedule, and its thread's task clock and
	// CPU time (CLOCK_THREAD_CPUTIME_ID: what the scheduler charged it).
	Calls           int
	Elapsed, MaxLag time.Duration
	Workload        time.Duration
	WorkloadCharged time.Duration
	// The program's outputs, and what the consumer received and was told
	// was lost; over a ring buffer Lost is Failed, as in Quiet.
	Emitted, Failed, Received, Lost uint64
	Prog                            kernel.ProgStats // the program's runs while the workload ran
	Window, Process                 Usage            // the consumer's, as in QuietResult
	Latency                         Latency
}

// Reached is the rate the workload reached, in calls a second.
func (r HostResult) Reached() float64 { return perUnit(float64(r.Calls), r.Elapsed.Seconds()) }

// ProgPerEvent is the program's own time a run, in ns.
func (r HostResult) ProgPerEvent() float64 {
	return perUnit(float64(r.Prog.RunTime.Nanoseconds()), float64(r.Prog.Runs))
}

// WorkloadPerEvent is the workload thread's task clock a call, in ns.
func (r HostResult) WorkloadPerEvent() float64 {
	return perUnit(float64(r.Workload.Nanoseconds()), float64(r.Calls))
}

// ReaderPerEvent is the consumer's task clock a record received, in ns.
func (r HostResult) ReaderPerEvent() float64 {
	return perUnit(float64(r.Window.CPU.Nanoseconds()), float64(r.Received))
}

// SwitchesPerEvent is the consumer's context switches a record received.
func (r HostResult) SwitchesPerEvent() float64 {
	return perUnit(float64(r.Window.Switches()), float64(r.Received))
}

// Check reports an accounting mismatch: every call made a record, and the
// consumer received every record emitted and was told of every one lost.
func (r HostResult) Check() error {
	if r.Mode == ModeDetached {
		return nil
	}
	if r.Emitted+r.Failed != uint64(r.Calls) || r.Received != r.Emitted || r.Lost != r.Failed {
		return fmt.Errorf("host %s %s at %s: %d calls; received %d and lost %d, the program says emitted %d and failed %d",
			r.Mode, kindText(r.RingBuf), RateName(r.Rate), r.Calls, r.Received, r.Lost, r.Emitted, r.Failed)
	}
	return nil
}

func kindText(ringBuf bool) string {
	if ringBuf {
		return "ringbuf"
	}
	return "perf"
}

// RunHost runs one host run: the workload makes cfg.Rate calls a second
// for cfg.Duration on HostCPU while the program of cfg's kind records them
// and cfg.Command consumes them (ModeDetached: neither), and returns what
// each used.
func RunHost(h *Host, cfg HostConfig) (HostResult, error) {
	if cfg.Duration == 0 {
		cfg.Duration = HostDuration
	}
	res := HostResult{Mode: cfg.Mode, RingBuf: cfg.RingBuf, Rate: cfg.Rate}
	detached := cfg.Mode == ModeDetached
	if cfg.Rate <= 0 || cfg.Duration < 0 || (cfg.Command == nil) != detached {
		return res, fmt.Errorf("host %s: bad config %+v", cfg.Mode, cfg)
	}
	fail := func(err error) (HostResult, error) {
		return res, fmt.Errorf("host %s %s at %s: %w", cfg.Mode, kindText(cfg.RingBuf), RateName(cfg.Rate), err)
	}
	count := int(int64(cfg.Rate) * int64(cfg.Duration) / int64(time.Second))
	timeout := hostTimeoutFactor*cfg.Duration + quietSlack

	w := startWorkload(count, cfg.Rate)
	tid, err := w.ready()
	if err != nil {
		return fail(err)
	}
	var p *consumerProc
	// stop ends the run early: the workload and the consumer are ended.
	stop := func(err error) (HostResult, error) {
		w.cancel()
		if p != nil {
			err = p.kill(err)
		}
		return fail(err)
	}
	var link *libbpfgo.BPFLink
	k := kind(cfg.RingBuf)
	if !detached {
		if err := h.configure(tid, HostRBFlags(cfg.Mode)); err != nil {
			return stop(err)
		}
		if link, err = h.progs[k].AttachTracepoint("syscalls", "sys_enter_getppid"); err != nil {
			return stop(fmt.Errorf("attach %s: %w", h.progs[k].Name(), err))
		}
		defer link.Destroy()
		if p, err = startConsumer(h.maps[k].FileDescriptor(), cfg.Command(count, timeout)); err != nil {
			return stop(err)
		}
	}
	before, err := bpfrun.Stats(h.mod)
	if err != nil {
		return stop(err)
	}
	// The program's own time, counted only while statsFD is open.
	statsFD, err := kernel.EnableRunStats()
	if err != nil {
		return stop(err)
	}
	progFD := h.progs[k].FileDescriptor()
	prog0, err := kernel.GetProgStats(progFD)
	var wr workloadResult
	if err == nil {
		wr = w.run()
		err = wr.err
	}
	var prog1 kernel.ProgStats
	if err == nil {
		prog1, err = kernel.GetProgStats(progFD)
	}
	unix.Close(statsFD)
	if err != nil {
		return stop(err)
	}
	if link != nil {
		link.Destroy() // nothing more to record; Destroy again is a no-op
	}
	res.Calls, res.Elapsed, res.MaxLag = wr.calls, wr.elapsed, wr.maxLag
	res.Workload, res.WorkloadCharged = wr.taskClock, wr.charged
	if detached {
		return res, nil
	}
	res.Prog = prog1.Sub(prog0)
	after, err := bpfrun.Stats(h.mod)
	if err != nil {
		return stop(err)
	}
	for i := range after {
		d := after[i].Sub(before[i])
		res.Emitted += d.Emitted
		res.Failed += d.Failed
	}
	line, err := p.finish(hostGrace)
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
	res.Received, res.Lost, res.Window, res.Latency = rep.Received, rep.Lost, rep.Usage, rep.Latency
	if cfg.RingBuf {
		res.Lost = res.Failed
	}
	return res, nil
}

// callAt is when call i is due, from the start, at rate calls a second.
func callAt(i, rate int) time.Duration {
	return time.Duration(int64(i) * int64(time.Second) / int64(rate))
}

// callsDue is how many calls are due elapsed after the start at rate
// calls a second: the calls i with callAt(i, rate) <= elapsed.
func callsDue(elapsed time.Duration, rate int) int {
	if elapsed < 0 {
		return 0
	}
	// callAt(i) <= elapsed  <=>  i*1e9 < (elapsed+1)*rate
	return int(((int64(elapsed)+1)*int64(rate) + int64(time.Second) - 1) / int64(time.Second))
}

// workload is the thread that makes the calls.
type workload struct {
	tid  chan int            // its thread ID, once locked and pinned
	goCh chan bool           // true: start; false: give up
	done chan workloadResult // its result, once
}

type workloadResult struct {
	calls              int
	elapsed, maxLag    time.Duration
	taskClock, charged time.Duration
	err                error
}

// startWorkload starts the thread that will make n getppid(2) calls at
// rate calls a second, pinned to HostCPU; it waits for run.
func startWorkload(n, rate int) *workload {
	w := &workload{tid: make(chan int, 1), goCh: make(chan bool, 1), done: make(chan workloadResult, 1)}
	go func() {
		// A goroutine of its own, so that the caller's thread is never
		// pinned (a consumer started from it would inherit the affinity);
		// locked to its thread until it is done, so that the task clock
		// it opens counts it alone.
		unpin, err := bpfrun.Pin(HostCPU)
		if err != nil {
			w.tid <- -1
			w.done <- workloadResult{err: err}
			return
		}
		defer unpin()
		tc, err := OpenThreadTaskClock()
		if err != nil {
			w.tid <- -1
			w.done <- workloadResult{err: err}
			return
		}
		defer tc.Close()
		w.tid <- unix.Gettid()
		if !<-w.goCh {
			w.done <- workloadResult{err: errors.New("cancelled")}
			return
		}
		w.done <- makeCalls(n, rate, tc)
	}()
	return w
}

// ready returns the workload thread's ID, once it waits for run.
func (w *workload) ready() (int, error) {
	if tid := <-w.tid; tid >= 0 {
		return tid, nil
	}
	return -1, (<-w.done).err
}

// run makes the calls and returns what they took.
func (w *workload) run() workloadResult {
	w.goCh <- true
	return <-w.done
}

// cancel ends a workload that has not run.
func (w *workload) cancel() {
	select {
	case w.goCh <- false:
	default:
	}
}

// makeCalls makes n getppid(2) calls, call i at callAt(i, rate) from the
// start: it sleeps to the next call's time (clock_nanosleep to an absolute
// time), then makes every call due. tc is the calling thread's task clock.
func makeCalls(n, rate int, tc *TaskClock) workloadResult {
	var r workloadResult
	clock := newMonoClock()
	tc0, err := tc.Read()
	if err != nil {
		return workloadResult{err: err}
	}
	cpu0 := threadCPU()
	start := clock.now()
	for r.calls < n {
		elapsed := time.Duration(clock.now() - start)
		due := min(callsDue(elapsed, rate), n)
		if due > r.calls {
			r.maxLag = max(r.maxLag, elapsed-callAt(r.calls, rate))
		}
		for ; r.calls < due; r.calls++ {
			syscall.Getppid() // a raw system call: no call into the Go scheduler
		}
		if r.calls == n {
			break
		}
		ts := unix.NsecToTimespec(start + int64(callAt(r.calls, rate)))
		for {
			if err := unix.ClockNanosleep(unix.CLOCK_MONOTONIC, unix.TIMER_ABSTIME, &ts, nil); err != unix.EINTR {
				break
			}
		}
	}
	r.elapsed = time.Duration(clock.now() - start)
	r.charged = time.Duration(threadCPU() - cpu0)
	tc1, err := tc.Read()
	if err != nil {
		return workloadResult{err: err}
	}
	r.taskClock = time.Duration(tc1 - tc0)
	return r
}
