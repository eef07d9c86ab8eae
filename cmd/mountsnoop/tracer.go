package main

import (
	"embed"
	"encoding/binary"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"time"
	"unsafe"

	"github.com/aquasecurity/libbpfgo"
	"github.com/perfbuf/perfbuf"
	"github.com/perfbuf/perfbuf/bpfbuffer"
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
	buffer     bpfbuffer.Kind // what `events` becomes: Any (a ring buffer if the kernel has them), or forced
	verbose    bool           // libbpf debug messages
}

// tracer is the BPF program, attached, and the reader of its events.
type tracer struct {
	mod   *libbpfgo.Module
	rd    *perfbuf.Reader
	kind  bpfbuffer.Kind // what `events` became
	clock clock          // set just before the programs were attached
}

// ringBytes is the ring buffer's size, as the C tool's (256 KiB: 29 events
// of 8776 bytes), and each CPU's ring on the perf path.
const ringBytes = 256 << 10

// readerOptions are the reader's options: rings the size of the C tool's,
// read by the default Reader, which drains the fullest ring first. A ring
// buffer's records come in the order they were reserved; a perf event
// array's CPUs are not merged by time, as the C tool does not merge them
// (an ordered Reader, Options.Order, would hold each event back for
// another CPU's: on this workload it cost 2.9 context switches an event
// against 1, for mounts, which one thread seldom makes on two CPUs at
// once).
func readerOptions() perfbuf.Options {
	return perfbuf.Options{RingBytes: ringBytes, MaxSampleSize: eventSize}
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
	setLibbpfLogger(cfg.verbose)
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
		if pidns, err = pidNamespace(); err != nil {
			return nil, err
		}
	}
	if err := mod.InitGlobalVariable("pidns_ino", pidns); err != nil {
		return nil, fmt.Errorf("set pidns_ino in %s: %w", path, err)
	}
	// Prepare chooses the kind and sizes the map; it leaves in opts what
	// NewReader takes for that kind (for a ring buffer it moves RingBytes
	// into the map's size, and clears it).
	opts := perfbuf.Options{RingBytes: ringBytes}
	if t.kind, err = bpfbuffer.Prepare(mod, "events", cfg.buffer, &opts); err != nil {
		return nil, err
	}
	if err := mod.BPFLoadObject(); err != nil {
		return nil, fmt.Errorf("load %s: %w", path, err)
	}
	events, err := mod.GetMap("events")
	if err != nil {
		return nil, fmt.Errorf("map events in %s: %w", path, err)
	}
	failures, err := mod.GetMap("events_failures")
	if err != nil {
		return nil, fmt.Errorf("map events_failures in %s: %w", path, err)
	}
	ropts := readerOptions()
	ropts.RingBytes = opts.RingBytes
	ropts.FailureMap = failures
	// Open the reader before attaching, so that no event is written to a
	// CPU without a ring.
	if t.rd, err = perfbuf.NewReader(events, ropts); err != nil {
		return nil, fmt.Errorf("open %v reader: %w", t.kind, err)
	}

	if err := ensureTracefs(); err != nil {
		return nil, err
	}
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		return nil, fmt.Errorf("read monotonic clock: %w", err)
	}
	t.clock = clock{monoStart: uint64(ts.Nano()), wallStart: time.Now()}
	for _, a := range tracepoints {
		prog, err := mod.GetProgram(a.prog)
		if err != nil {
			return nil, fmt.Errorf("program %s in %s: %w", a.prog, path, err)
		}
		if _, err := prog.AttachTracepoint("syscalls", a.tp); err != nil {
			return nil, fmt.Errorf("attach tracepoint syscalls:%s: %w", a.tp, err)
		}
	}
	ok = true
	return t, nil
}

// perfFull returns the events that a full perf ring dropped, summed over
// the CPUs (the BPF program's perf_full): the lost records say the same,
// but the kernel writes one only once a later event fits in its ring.
func (t *tracer) perfFull() (uint64, error) {
	m, err := t.mod.GetMap("perf_full")
	if err != nil {
		return 0, fmt.Errorf("map perf_full: %w", err)
	}
	var k uint32
	v, err := m.GetValue(unsafe.Pointer(&k)) // a u64 per possible CPU
	if err != nil {
		return 0, fmt.Errorf("map perf_full: %w", err)
	}
	var sum uint64
	for ; len(v) >= 8; v = v[8:] {
		sum += binary.NativeEndian.Uint64(v)
	}
	return sum, nil
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

// openModule opens the BPF object at path, or the one built into the
// executable when path is "". It returns the module and what errors should
// call the object.
func openModule(path string) (*libbpfgo.Module, string, error) {
	if path == "" {
		const name = "built-in " + objName
		obj, err := bpfDir.ReadFile(embeddedObj)
		if errors.Is(err, fs.ErrNotExist) {
			return nil, name, errNoObject
		}
		if err != nil {
			return nil, name, fmt.Errorf("read %s: %w", name, err)
		}
		mod, err := openObject(obj)
		if err != nil {
			return nil, name, fmt.Errorf("open %s: %w", name, err)
		}
		return mod, name, nil
	}
	if _, err := os.Stat(path); err != nil {
		return nil, path, fmt.Errorf("bpf object: %w", err)
	}
	// SkipMemlockBump: raising RLIMIT_MEMLOCK needs CAP_SYS_RESOURCE, and
	// kernels >= 5.11 charge BPF memory to the cgroup instead.
	mod, err := libbpfgo.NewModuleFromFileArgs(libbpfgo.NewModuleArgs{BPFObjPath: path, SkipMemlockBump: true})
	if err != nil {
		return nil, path, fmt.Errorf("open %s: %w", path, err)
	}
	return mod, path, nil
}

// openObject opens the BPF object obj, held in memory, through a memfd
// that libbpfgo opens as a file: libbpfgo's NewModuleFromBufferArgs (up to
// v0.9.2) ignores SkipMemlockBump (cmd/execsnoop/tracer.go says more).
func openObject(obj []byte) (*libbpfgo.Module, error) {
	fd, err := unix.MemfdCreate(objName, unix.MFD_CLOEXEC|unix.MFD_NOEXEC_SEAL)
	if errors.Is(err, unix.EINVAL) {
		// Before Linux 6.3, which added MFD_NOEXEC_SEAL.
		fd, err = unix.MemfdCreate(objName, unix.MFD_CLOEXEC)
	}
	if err != nil {
		return nil, fmt.Errorf("memfd_create: %w", err)
	}
	f := os.NewFile(uintptr(fd), objName)
	defer f.Close() // libbpfgo and libbpf open the path themselves
	if _, err := f.Write(obj); err != nil {
		return nil, fmt.Errorf("write memfd: %w", err)
	}
	return libbpfgo.NewModuleFromFileArgs(libbpfgo.NewModuleArgs{
		BPFObjPath:      "/proc/self/fd/" + strconv.Itoa(fd),
		SkipMemlockBump: true,
	})
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
	fmt.Fprintf(os.Stderr, "mountsnoop: mounted tracefs at %s\n", dir)
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

// pidNamespace returns the inode number of mountsnoop's PID namespace, by
// which the BPF program finds a task's PID in it (pidns_ino in
// mountsnoop.bpf.c), as execsnoop's does.
func pidNamespace() (uint32, error) {
	const path = "/proc/self/ns/pid"
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return 0, fmt.Errorf("find the PID namespace to number PIDs in (--kernel-pids needs none): stat %s: %w", path, err)
	}
	// The kernel's namespace inode numbers are 32-bit (ns_common.inum).
	if st.Ino == 0 || st.Ino > 0xffffffff {
		return 0, fmt.Errorf("PID namespace %s: inode %d is not a namespace's", path, st.Ino)
	}
	return uint32(st.Ino), nil
}
