// SPDX-License-Identifier: Apache-2.0

package main

import (
	"embed"
	"errors"
	"fmt"
	"time"

	"github.com/aquasecurity/libbpfgo"
	"github.com/perfbuf/perfbuf"
	"github.com/perfbuf/perfbuf/bpfbuffer"
	"github.com/perfbuf/perfbuf/cmd/internal/tool"
	"golang.org/x/sys/unix"
)

const objName = "mountsnoop.bpf.o"

// bpfDir holds the BPF object, built into the executable so that it runs
// from anywhere, as the C tool does: `make bpf` compiles
// bpf/mountsnoop.bpf.o, then `go build` embeds it. The pattern names the
// directory, because a pattern that matches no file stops the build (before
// `make bpf` the directory holds the .bpf.c only); an executable built
// without the object says so when it starts.
//
//go:embed bpf
var bpfDir embed.FS

const embeddedObj = "bpf/" + objName

var errNoObject = errors.New("built without its BPF object (" + embeddedObj +
	"): run `make bpf` and build again, or pass --bpf-obj PATH")

// tracerConfig selects what the BPF program reports and how.
type tracerConfig struct {
	objPath string // the BPF object to load; "" for the built-in one
	pid     int    // only this process (tgid, numbered as PIDs are printed); 0 for all
	// kernelPIDs: PIDs as the kernel numbers them (the initial PID
	// namespace's), as the C tool prints them; otherwise as mountsnoop's
	// own PID namespace numbers them (the same on the host), and tasks
	// outside it show PID 0.
	kernelPIDs bool
	buffer     bpfbuffer.Kind // what `events` becomes: Any (a ring buffer per CPU if the kernel has them), or forced
	recorder   int            // MiB: a flight recorder (a Recorder over rings in overwrite mode) of that size; 0: a Reader
	verbose    bool           // libbpf debug messages
}

// tracer is the BPF program, attached, and the reader of its events.
type tracer struct {
	mod   *libbpfgo.Module
	rd    *perfbuf.Reader   // or, in flight-recorder mode,
	rec   *perfbuf.Recorder // nil otherwise
	kind  bpfbuffer.Kind    // what `events` became
	clock clock             // set just before the programs were attached
}

// ringBytes is the size of each ring: the C tool's one ring buffer's
// (256 KiB: 29 events of 8776 bytes), and each CPU's ring on the perf path
// and with a ring buffer per CPU.
const ringBytes = 256 << 10

// maxDelay is how long an event may wait for an older one from another
// ring (Order.MaxDelay, and in ns rule 2's key window): short, so that the
// output stays live. An event that comes later than that after a newer one
// is printed anyway, at once, and counted as late in the summary.
const maxDelay = 10 * time.Millisecond

// readerOptions are the reader's options: rings the size of the C tool's,
// and the events delivered in the order of their ts (bpf_ktime_get_ns() at
// the call's exit, the first field of struct event), whichever ring they
// came from. Over a ring buffer per CPU, or a perf event array's CPUs, an
// event goes once every CPU's ring has shown a later one, or maxDelay after
// it was read; over one shared ring buffer (--buffer ringbuf), whose
// records come in the order they were reserved, maxDelay after it was read
// or once one maxDelay newer has come. The C tool prints its one ring's
// reservation order, the same for calls that one thread makes. Over ring
// buffers the reader copies the events out of the rings (16 KiB a copy
// here) into a window of at most the rings' total size, and hands the
// rings' space back as it delivers them (perfbuf.Order). The program reads
// ts right after the reservation (StampedKeys): a ring found empty then
// shows that nothing older is to come, and an event goes at the reader's
// next look rather than maxDelay after it was read (0.11 context switches
// an event fewer at 400 a second, docs/performance.md).
func readerOptions() perfbuf.ReaderOptions {
	return perfbuf.ReaderOptions{
		Options: perfbuf.Options{RingBytes: ringBytes, MaxSampleSize: eventSize},
		Order:   &perfbuf.Order{KeyOffset: offTS, MaxDelay: maxDelay, StampedKeys: true},
	}
}

// tracepoints are the programs of mountsnoop.bpf.c and the syscalls:
// tracepoints they attach to.
var tracepoints = []struct{ prog, tp string }{
	{"mount_entry", "sys_enter_mount"},
	{"mount_exit", "sys_exit_mount"},
	{"umount_entry", "sys_enter_umount"},
	{"umount_exit", "sys_exit_umount"},
}

// openTracer loads the BPF program with `events` made the kind cfg asks
// for, opens the reader, and attaches the programs.
func openTracer(cfg tracerConfig) (*tracer, error) {
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
	if err := mod.InitGlobalVariable("target_pid", uint32(cfg.pid)); err != nil {
		return nil, fmt.Errorf("set target_pid in %s: %w", path, err)
	}
	var pidns uint32 // 0: the kernel's PIDs
	if !cfg.kernelPIDs {
		if pidns, err = tool.PIDNamespace(""); err != nil {
			return nil, err
		}
	}
	if err := mod.InitGlobalVariable("pidns_ino", pidns); err != nil {
		return nil, fmt.Errorf("set pidns_ino in %s: %w", path, err)
	}
	// Prepare chooses the kind and sizes the map; it leaves in opts what
	// NewReader takes for that kind (for ring buffers it moves RingBytes
	// into the maps' sizes).
	opts := perfbuf.Options{RingBytes: ringBytes}
	var more []bpfbuffer.Option
	if cfg.recorder > 0 {
		// In overwrite mode: ring buffers only where the kernel has
		// the mode (6.19), else a perf event array.
		opts.RingBytes = cfg.recorder << 20
		more = append(more, bpfbuffer.Overwrite())
	}
	if t.kind, err = prepareEvents(mod, cfg.buffer, &opts, more...); err != nil {
		return nil, err
	}
	if cfg.recorder > 0 && t.kind == bpfbuffer.PerfEventArray {
		if opts.RingBytes, err = perCPUShare(cfg.recorder); err != nil {
			return nil, err
		}
	}
	if err := mod.BPFLoadObject(); err != nil {
		return nil, fmt.Errorf("load %s: %w", path, err)
	}
	if cfg.recorder > 0 {
		events, ropts, err := bpfbuffer.Maps(mod, "events", opts)
		if err != nil {
			return nil, fmt.Errorf("maps of events in %s: %w", path, err)
		}
		ropts.MaxSampleSize, ropts.Programs = eventSize, tool.Programs(mod)
		if t.rec, err = perfbuf.NewRecorder(events, ropts); err != nil {
			return nil, fmt.Errorf("open %v recorder: %w", t.kind, err)
		}
		if err := t.attach(mod, path); err != nil {
			return nil, err
		}
		ok = true
		return t, nil
	}
	// The map to read and the rest of the options: the buffer's own map,
	// or the first of the rings Prepare made and the others in Maps, and
	// events_failures.
	events, mopts, err := bpfbuffer.Maps(mod, "events", opts)
	if err != nil {
		return nil, fmt.Errorf("maps of events in %s: %w", path, err)
	}
	ropts := readerOptions()
	ropts.RingBytes, ropts.FailureMap, ropts.Maps = mopts.RingBytes, mopts.FailureMap, mopts.Maps
	ropts.Programs = tool.Programs(mod) // their runs the kernel skipped, in Stats
	// Open the reader before attaching, so that no event is written to a
	// CPU without a ring.
	if t.rd, err = perfbuf.NewReader(events, ropts); err != nil {
		return nil, fmt.Errorf("open %v reader: %w", t.kind, err)
	}

	if err := t.attach(mod, path); err != nil {
		return nil, err
	}
	ok = true
	return t, nil
}

// attach reads the clocks and attaches the programs of mod (at path, for
// errors).
func (t *tracer) attach(mod *libbpfgo.Module, path string) error {
	if err := tool.EnsureTracefs("mountsnoop"); err != nil {
		return err
	}
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		return fmt.Errorf("read monotonic clock: %w", err)
	}
	t.clock = clock{monoStart: uint64(ts.Nano()), wallStart: time.Now()}
	for _, a := range tracepoints {
		prog, err := mod.GetProgram(a.prog)
		if err != nil {
			return fmt.Errorf("program %s in %s: %w", a.prog, path, err)
		}
		if _, err := prog.AttachTracepoint("syscalls", a.tp); err != nil {
			return fmt.Errorf("attach tracepoint syscalls:%s: %w", a.tp, err)
		}
	}
	return nil
}

// prepareEvents makes `events` the kind want asks for. Any is what
// bpfbuffer.Prepare chooses: a ring buffer per CPU where the kernel takes
// ring buffers in an array of maps (Linux 5.10), ringBytes each, as each
// CPU's perf ring is: every CPU reserves in its own ring, taking no lock
// that another CPU takes, and a burst of calls on one CPU fills its ring
// only. Elsewhere one ring buffer, or a perf event array. (The C tool's
// bpf_buffer makes one ring buffer shared by every CPU: --buffer ringbuf.)
func prepareEvents(mod *libbpfgo.Module, want bpfbuffer.Kind, opts *perfbuf.Options, more ...bpfbuffer.Option) (bpfbuffer.Kind, error) {
	return bpfbuffer.Prepare(mod, "events", want, opts, more...)
}

// perfFull returns the events that a full perf ring dropped, summed over
// the CPUs (the BPF program's perf_full): the lost records say the same,
// but the kernel writes one only once a later event fits in its ring.
func (t *tracer) perfFull() (uint64, error) {
	m, err := t.mod.GetMap("perf_full")
	if err != nil {
		return 0, fmt.Errorf("map perf_full: %w", err)
	}
	return tool.PerCPUSum(m, 0)
}

// close stops the reader, detaches the programs and frees everything.
func (t *tracer) close() {
	if t.rd != nil {
		t.rd.Close()
	}
	if t.rec != nil {
		t.rec.Close()
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
