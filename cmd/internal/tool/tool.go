// SPDX-License-Identifier: Apache-2.0

// Package tool holds what the ports of libbpf-tools (cmd/execsnoop,
// cmd/mountsnoop) share beside their buffered stdout (cmd/internal/stdio):
// their flags' parsing as argp's, loading their BPF object (built in, or
// from a file), libbpf's log, per-CPU counters, tracefs, and the PID
// namespace their PIDs are numbered in.
package tool

import (
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"io/fs"
	"os"
	pathpkg "path"
	"path/filepath"
	"strconv"
	"strings"
	"time"
	"unsafe"

	"github.com/aquasecurity/libbpfgo"
	"golang.org/x/sys/unix"
)

// SplitShortFlags turns "-Tx" into "-T" "-x" when every letter is one of
// the bool flags in shorts, so that grouped flags work as with argp. A flag
// of fs that takes a value ("-n NAME", "--line LINE") is passed on with the
// argument after it, which is its value whatever it looks like ("-l -tx").
// It stops at "--" and at the first argument that is not a flag, as flag
// does.
func SplitShortFlags(fs *flag.FlagSet, args []string, shorts string) []string {
	out := make([]string, 0, len(args))
	for i := 0; i < len(args); i++ {
		a := args[i]
		if a == "--" || !strings.HasPrefix(a, "-") || a == "-" {
			return append(out, args[i:]...)
		}
		if takesValue(fs, strings.TrimLeft(a, "-")) && i+1 < len(args) {
			out = append(out, a, args[i+1])
			i++
			continue
		}
		letters := a[1:]
		if len(letters) < 2 || strings.HasPrefix(letters, "-") || strings.Trim(letters, shorts) != "" {
			out = append(out, a)
			continue
		}
		for _, l := range letters {
			out = append(out, "-"+string(l))
		}
	}
	return out
}

// takesValue reports whether name (without "=value") is a flag of fs that
// is not a bool: its value is the next argument.
func takesValue(fs *flag.FlagSet, name string) bool {
	f := fs.Lookup(name)
	if f == nil || strings.Contains(name, "=") {
		return false
	}
	b, ok := f.Value.(interface{ IsBoolFlag() bool })
	return !ok || !b.IsBoolFlag()
}

// StringValue is a string flag.
type StringValue struct{ P *string }

func (v StringValue) String() string {
	if v.P == nil {
		return ""
	}
	return *v.P
}

func (v StringValue) Set(s string) error { *v.P = s; return nil }

// SecondsValue parses a duration flag: seconds ("3", "0.5") or a Go duration ("1m").
type SecondsValue struct{ P *time.Duration }

func (v SecondsValue) String() string {
	if v.P == nil || *v.P == 0 {
		return ""
	}
	return v.P.String()
}

func (v SecondsValue) Set(s string) error {
	d, err := time.ParseDuration(s)
	if err != nil {
		f, ferr := strconv.ParseFloat(s, 64)
		if ferr != nil {
			return fmt.Errorf("invalid duration %q", s)
		}
		d = time.Duration(f * float64(time.Second))
	}
	if d <= 0 {
		return fmt.Errorf("duration %q is not positive", s)
	}
	*v.P = d
	return nil
}

// PIDNamespace returns the inode number of the PID namespace file path
// ("" for /proc/self/ns/pid): the BPF program finds the namespace among a
// task's by it (pidns_ino in the tools' BPF programs).
func PIDNamespace(path string) (uint32, error) {
	if path == "" {
		path = "/proc/self/ns/pid"
	}
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

// OpenModule opens the BPF object at path, or when path is "" the one
// built into the executable, at builtinPath in builtin (an embed.FS); one
// missing there is errNoObject, the tool's error saying how to build it. It
// returns the module and what errors should call the object.
func OpenModule(path string, builtin fs.FS, builtinPath string, errNoObject error) (*libbpfgo.Module, string, error) {
	if path == "" {
		objName := pathpkg.Base(builtinPath)
		name := "built-in " + objName
		obj, err := fs.ReadFile(builtin, builtinPath)
		if errors.Is(err, fs.ErrNotExist) {
			return nil, name, errNoObject
		}
		if err != nil {
			return nil, name, fmt.Errorf("read %s: %w", name, err)
		}
		mod, err := openObject(objName, obj)
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

// openObject opens the BPF object obj, held in memory, named objName. It does not use
// libbpfgo.NewModuleFromBufferArgs, which in this libbpfgo (v0.7.0, and
// releases up to v0.9.2) ignores SkipMemlockBump and always sets
// RLIMIT_MEMLOCK to 512 MiB: without CAP_SYS_RESOURCE that fails (fixed by
// libbpfgo#513, after v0.9.2). Instead obj
// goes into a memfd, which libbpfgo opens as a file through /proc/self/fd:
// no disk, nothing to clean up. libbpf names the object after the path's
// last element, the descriptor's number (its .rodata map shows in bpftool
// as "7.rodata", where execsnoop's C tool's is "execsnoo.rodata").
func openObject(objName string, obj []byte) (*libbpfgo.Module, error) {
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
		SkipMemlockBump: true, // as in openModule
	})
}

// SetLibbpfLogger sends libbpf's warnings to stderr, and its debug messages
// too when verbose.
func SetLibbpfLogger(verbose bool) {
	libbpfgo.SetLoggerCbs(libbpfgo.Callbacks{
		Log: func(_ int, msg string) { fmt.Fprint(os.Stderr, msg) },
		LogFilters: []func(int, string) bool{
			func(level int, _ string) bool { return !verbose && level == libbpfgo.LibbpfDebugLevel },
		},
	})
}

// PerCPUSum returns the value at key of the BPF_MAP_TYPE_PERCPU_ARRAY m, a
// u64 per possible CPU, summed over the CPUs.
func PerCPUSum(m *libbpfgo.BPFMap, key uint32) (uint64, error) {
	v, err := m.GetValue(unsafe.Pointer(&key)) // libbpf sizes v for every possible CPU
	if err != nil {
		return 0, fmt.Errorf("map %s[%d]: %w", m.Name(), key, err)
	}
	var sum uint64
	for ; len(v) >= 8; v = v[8:] {
		sum += binary.NativeEndian.Uint64(v)
	}
	return sum, nil
}

// tracefs mount points, where libbpf looks for tracepoint ids: the debugfs
// one first when it exists, as libbpf does.
var tracefsDirs = []string{"/sys/kernel/debug/tracing", "/sys/kernel/tracing"}

// Programs returns the descriptors of m's loaded programs, for
// perfbuf.Options.Programs: the reader's Stats then count the runs the
// kernel skipped (an exec traced from inside another tracing program's
// run, say), whose events were never written.
func Programs(m *libbpfgo.Module) []int {
	var fds []int
	it := m.Iterator()
	for p := it.NextProgram(); p != nil; p = it.NextProgram() {
		if p.FileDescriptor() >= 0 { // (not loaded: autoload off)
			fds = append(fds, p.FileDescriptor())
		}
	}
	return fds
}

// EnsureTracefs mounts tracefs at /sys/kernel/tracing when no tracefs is
// mounted: attaching a tracepoint reads its id there. It says so on stderr,
// as tool.
func EnsureTracefs(tool string) error {
	for _, d := range tracefsDirs {
		if _, err := os.Stat(filepath.Join(d, "events")); err == nil {
			return nil
		}
	}
	dir := tracefsDirs[len(tracefsDirs)-1]
	if err := unix.Mount("tracefs", dir, "tracefs", 0, ""); err != nil {
		return fmt.Errorf("mount tracefs at %s (tracepoints need it): %w", dir, err)
	}
	fmt.Fprintf(os.Stderr, "%s: mounted tracefs at %s\n", tool, dir)
	return nil
}
