// SPDX-License-Identifier: Apache-2.0

package main

import (
	"embed"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/aquasecurity/libbpfgo"
	"github.com/perfbuf/perfbuf"
	"github.com/perfbuf/perfbuf/cmd/internal/tool"
	"golang.org/x/sys/unix"
)

const objName = "execsnoop.bpf.o"

// bpfDir holds the BPF object, built into the executable so that it runs
// from anywhere, as the C tool does: `make bpf` compiles
// bpf/execsnoop.bpf.o, then `go build` embeds it. The pattern names the
// directory, not the object, because a pattern that matches no file stops
// the build: before `make bpf` (a fresh clone, `go vet` in CI) the
// directory still holds execsnoop.bpf.c, which is embedded too (6 KiB). An
// executable built without the object says so when it starts.
//
//go:embed bpf
var bpfDir embed.FS

// embeddedObj is the object's path in bpfDir.
const embeddedObj = "bpf/" + objName

// errNoObject: the executable was built before `make bpf`.
var errNoObject = errors.New("built without its BPF object (" + embeddedObj +
	"): run `make bpf` and build again, or pass --bpf-obj PATH")

// tracerConfig selects what the BPF program reports. These filters run in
// the kernel, as in the C tool.
type tracerConfig struct {
	objPath       string // the BPF object to load; "" for the built-in one
	uid           int    // only this uid; -1 for all
	includeFailed bool   // also execs that failed
	maxArgs       int    // arguments kept, the filename included: 1..totalMaxArgs
	verbose       bool   // libbpf debug messages
	// kernelPIDs: PIDs as the kernel numbers them (the initial PID
	// namespace), for every task, as the C tool prints them. Otherwise as
	// the PID namespace at pidns numbers them, and execs of tasks outside
	// it are only counted (kernelCounts.otherPIDNS).
	kernelPIDs bool
	pidns      string // a PID namespace file; "" for execsnoop's own, /proc/self/ns/pid
}

// eventSource is what readLoop reads: a *perfbuf.Reader, or a fake in
// tests.
type eventSource interface {
	// ReadInto blocks for the next record. Errors: os.ErrClosed after
	// Close, perfbuf.ErrFlushed once a Flush has delivered everything, a
	// *perfbuf.CorruptError once per corrupt ring (reading goes on).
	ReadInto(s *perfbuf.Sample) error
}

// tracer is the BPF program, attached, and the reader of its events.
type tracer struct {
	mod   *libbpfgo.Module
	rd    *perfbuf.Reader
	clock clock // set just before the programs were attached
}

// maxDelay is how long the reader holds an event back for an earlier one
// from another CPU: exec events are rare, so a short wait costs nothing.
const maxDelay = 50 * time.Millisecond

// openTracer loads and attaches the BPF program and opens the reader.
func openTracer(cfg tracerConfig) (*tracer, error) {
	if cfg.maxArgs < 1 || cfg.maxArgs > totalMaxArgs {
		return nil, fmt.Errorf("max args %d outside [1, %d]", cfg.maxArgs, totalMaxArgs)
	}
	tool.SetLibbpfLogger(cfg.verbose)
	mod, path, err := openModule(cfg.objPath) // path: what errors call it
	if err != nil {
		return nil, err
	}
	t := &tracer{mod: mod}
	ok := false
	defer func() {
		if !ok {
			t.close()
		}
	}()
	uid := uint32(0xffffffff) // INVALID_UID: every uid
	if cfg.uid >= 0 {
		uid = uint32(cfg.uid)
	}
	var pidns uint32 // 0: the kernel's PIDs
	if !cfg.kernelPIDs {
		if pidns, err = tool.PIDNamespace(cfg.pidns); err != nil {
			return nil, err
		}
	}
	for name, v := range map[string]any{
		"targ_uid":      uid,
		"ignore_failed": !cfg.includeFailed,
		"max_args":      uint32(cfg.maxArgs),
		"pidns_ino":     pidns,
	} {
		if err := t.mod.InitGlobalVariable(name, v); err != nil {
			return nil, fmt.Errorf("set %s in %s: %w", name, path, err)
		}
	}
	if err := t.mod.BPFLoadObject(); err != nil {
		return nil, fmt.Errorf("load %s: %w", path, err)
	}
	events, err := t.mod.GetMap("events")
	if err != nil {
		return nil, fmt.Errorf("map events in %s: %w", path, err)
	}
	// Open the reader before attaching, so that no event is written to a
	// CPU without a ring.
	if err := t.openSource(events); err != nil {
		return nil, err
	}

	// Attaching reads the tracepoints' ids in tracefs.
	if err := tool.EnsureTracefs("execsnoop"); err != nil {
		return nil, err
	}
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		return nil, fmt.Errorf("read monotonic clock: %w", err)
	}
	t.clock = clock{monoStart: uint64(ts.Nano()), wallStart: time.Now()}
	for _, tp := range []string{"sys_enter_execve", "sys_exit_execve"} {
		prog, err := t.mod.GetProgram("tracepoint__syscalls__" + tp)
		if err != nil {
			return nil, fmt.Errorf("program for %s in %s: %w", tp, path, err)
		}
		if _, err := prog.AttachTracepoint("syscalls", tp); err != nil {
			return nil, fmt.Errorf("attach tracepoint syscalls:%s: %w", tp, err)
		}
	}
	ok = true
	return t, nil
}

// readerOptions are the options of the events' reader: rings of 64 pages
// (the C tool's PERF_BUFFER_PAGES, in pages of the host's size: 64 << 12
// was 16 pages on 16 KiB pages) that fit the largest event, merged in
// timestamp order.
func readerOptions() perfbuf.ReaderOptions {
	return perfbuf.ReaderOptions{
		Options: perfbuf.Options{
			RingBytes:     64 * os.Getpagesize(),
			MaxSampleSize: eventMaxSize,
		},
		Order: &perfbuf.Order{KeyOffset: offTS, MaxDelay: maxDelay},
	}
}

// openSource opens the reader of events, with the program's failure map
// (PERFBUF_FAILURE_MAP in execsnoop.bpf.c) and the programs: the reader's
// Stats report the outputs that failed before a ring, and the runs of the
// programs the kernel skipped.
func (t *tracer) openSource(events *libbpfgo.BPFMap) error {
	opts := readerOptions()
	failures, err := t.mod.GetMap("failures")
	if err != nil {
		return fmt.Errorf("map failures: %w", err)
	}
	opts.FailureMap, opts.Programs = failures, tool.Programs(t.mod)
	if t.rd, err = perfbuf.NewReader(events, opts); err != nil {
		return fmt.Errorf("open perf buffer: %w", err)
	}
	return nil
}

// kernelCounts is what the BPF program counted in its map `drops`, summed
// over the CPUs.
type kernelCounts struct {
	// Events that did not fit in a ring: a full ring reports its losses
	// only once a later sample fits, so a loss at the end would go
	// unreported. Outputs that failed for other causes are in the
	// reader's Stats (Failed).
	notOutput uint64
	untraced  uint64 // execs not traced: the map of execs in flight was full
	// Execs by tasks outside the PID namespace whose numbers are printed:
	// not output, as they have no PID there.
	otherPIDNS uint64
}

// kernelCounts reads the BPF program's counts.
func (t *tracer) kernelCounts() (kernelCounts, error) {
	var c kernelCounts
	m, err := t.mod.GetMap("drops")
	if err != nil {
		return c, fmt.Errorf("map drops: %w", err)
	}
	// DROP_OUTPUT, DROP_MAP_FULL, DROP_OTHER_PIDNS in execsnoop.bpf.c.
	for kind, sum := range []*uint64{&c.notOutput, &c.untraced, &c.otherPIDNS} {
		n, err := tool.PerCPUSum(m, uint32(kind))
		if err != nil {
			return kernelCounts{}, err
		}
		*sum = n
	}
	return c, nil
}

// close stops the reader, detaches the programs and frees everything.
func (t *tracer) close() {
	if t.rd != nil {
		t.rd.Close()
	}
	if t.mod != nil {
		t.mod.Close()
	}
}

// openModule opens the BPF object at path, or the built-in one when path is
// "" (tool.OpenModule).
func openModule(path string) (*libbpfgo.Module, string, error) {
	return tool.OpenModule(path, bpfDir, embeddedObj, errNoObject)
}
