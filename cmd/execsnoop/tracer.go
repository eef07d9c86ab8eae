package main

import (
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"
	"unsafe"

	"github.com/aquasecurity/libbpfgo"
	"github.com/perfbuf/perfbuf"
	"golang.org/x/sys/unix"
)

const objName = "execsnoop.bpf.o"

// tracerConfig selects what the BPF program reports. These filters run in
// the kernel, as in the C tool.
type tracerConfig struct {
	objPath       string // the BPF object; "" looks in the usual places (findObject)
	uid           int    // only this uid; -1 for all
	includeFailed bool   // also execs that failed
	maxArgs       int    // arguments kept, the filename included: 1..totalMaxArgs
	verbose       bool   // libbpf debug messages
}

// eventSource is what readLoop reads: perfbuf's OrderedReader, or a fake in
// tests.
type eventSource interface {
	// ReadInto blocks for the next record. Errors: os.ErrClosed after
	// Close, perfbuf.ErrFlushed once a Flush has delivered everything.
	ReadInto(s *perfbuf.Sample) error
}

// tracer is the BPF program, attached, and the reader of its events.
type tracer struct {
	mod   *libbpfgo.Module
	pb    *perfbuf.PerfBuffer
	rd    *perfbuf.OrderedReader
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
	path, err := findObject(cfg.objPath)
	if err != nil {
		return nil, err
	}
	if err := ensureTracefs(); err != nil {
		return nil, err
	}
	setLibbpfLogger(cfg.verbose)

	t := &tracer{}
	ok := false
	defer func() {
		if !ok {
			t.close()
		}
	}()
	// SkipMemlockBump: raising RLIMIT_MEMLOCK needs CAP_SYS_RESOURCE, and
	// kernels >= 5.11 charge BPF memory to the cgroup instead.
	t.mod, err = libbpfgo.NewModuleFromFileArgs(libbpfgo.NewModuleArgs{BPFObjPath: path, SkipMemlockBump: true})
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", path, err)
	}
	uid := uint32(0xffffffff) // INVALID_UID: every uid
	if cfg.uid >= 0 {
		uid = uint32(cfg.uid)
	}
	for name, v := range map[string]any{
		"targ_uid":      uid,
		"ignore_failed": !cfg.includeFailed,
		"max_args":      uint32(cfg.maxArgs),
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

func (t *tracer) openSource(events *libbpfgo.BPFMap) error {
	var err error
	t.pb, err = perfbuf.New(events, perfbuf.Options{PageCount: 64, MaxSampleSize: eventMaxSize})
	if err != nil {
		return fmt.Errorf("open perf buffer: %w", err)
	}
	t.rd, err = perfbuf.NewOrderedReader(t.pb, perfbuf.OrderedOptions{KeyOffset: offTS, MaxDelay: maxDelay})
	if err != nil {
		return fmt.Errorf("open perf buffer: %w", err)
	}
	return nil
}

// kernelDrops returns what the BPF program counted in its map `drops`,
// summed over the CPUs: events that did not fit in a ring (a full ring
// reports its losses only once a later sample fits, so a loss at the end
// would go unreported), and execs not traced because the map of execs in
// flight was full.
func (t *tracer) kernelDrops() (notOutput, untraced uint64, err error) {
	m, err := t.mod.GetMap("drops")
	if err != nil {
		return 0, 0, fmt.Errorf("map drops: %w", err)
	}
	for kind, sum := range []*uint64{&notOutput, &untraced} {
		k := uint32(kind)                        // DROP_OUTPUT, DROP_MAP_FULL in execsnoop.bpf.c
		v, err := m.GetValue(unsafe.Pointer(&k)) // a u64 per possible CPU
		if err != nil {
			return 0, 0, fmt.Errorf("map drops[%d]: %w", k, err)
		}
		for ; len(v) >= 8; v = v[8:] {
			*sum += binary.NativeEndian.Uint64(v)
		}
	}
	return notOutput, untraced, nil
}

// close stops the reader, detaches the programs and frees everything.
func (t *tracer) close() {
	if t.rd != nil {
		t.rd.Close()
	}
	if t.pb != nil {
		t.pb.Close()
	}
	if t.mod != nil {
		t.mod.Close()
	}
}

// findObject returns the BPF object to load: path if set, else the first of
// execsnoop.bpf.o next to the executable, cmd/execsnoop/bpf/ under the
// working directory, and bpf/ under it (for `go test`).
func findObject(path string) (string, error) {
	if path != "" {
		if _, err := os.Stat(path); err != nil {
			return "", fmt.Errorf("bpf object: %w", err)
		}
		return path, nil
	}
	var tried []string
	if exe, err := os.Executable(); err == nil {
		tried = append(tried, filepath.Join(filepath.Dir(exe), objName))
	}
	tried = append(tried, filepath.Join("cmd", "execsnoop", "bpf", objName), filepath.Join("bpf", objName))
	for _, p := range tried {
		if _, err := os.Stat(p); err == nil {
			return p, nil
		}
	}
	return "", fmt.Errorf("bpf object %s not found in %s: run `make bpf` in the repository, or pass -bpf-obj",
		objName, strings.Join(tried, ", "))
}

// tracefs mount points, where libbpf looks for tracepoint ids: the debugfs
// one first when it exists, as libbpf does.
var tracefsDirs = []string{"/sys/kernel/debug/tracing", "/sys/kernel/tracing"}

// ensureTracefs mounts tracefs at /sys/kernel/tracing when no tracefs is
// mounted: attaching a tracepoint reads its id there.
func ensureTracefs() error {
	for _, d := range tracefsDirs {
		if _, err := os.Stat(filepath.Join(d, "events")); err == nil {
			return nil
		}
	}
	dir := tracefsDirs[len(tracefsDirs)-1]
	if err := unix.Mount("tracefs", dir, "tracefs", 0, ""); err != nil {
		return fmt.Errorf("mount tracefs at %s (tracepoints need it): %w", dir, err)
	}
	fmt.Fprintf(os.Stderr, "execsnoop: mounted tracefs at %s\n", dir)
	return nil
}

// setLibbpfLogger sends libbpf's warnings to stderr, and its debug messages
// too when verbose.
func setLibbpfLogger(verbose bool) {
	libbpfgo.SetLoggerCbs(libbpfgo.Callbacks{
		Log: func(_ int, msg string) { fmt.Fprint(os.Stderr, msg) },
		LogFilters: []func(int, string) bool{
			func(level int, _ string) bool { return !verbose && level == libbpfgo.LibbpfDebugLevel },
		},
	})
}
