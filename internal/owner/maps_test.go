// SPDX-License-Identifier: Apache-2.0

package owner

// Tests of the map checks (maps.go) that ask the kernel, in every build.

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"unsafe"

	"github.com/perfbuf/perfbuf/internal/kernel"
	"golang.org/x/sys/unix"
)

// Every descriptor that is not a BPF map is ErrMapType (os.ErrInvalid for
// a failure map), with an error that says what it is, whether /proc can
// tell or not: the kernel answers EINVAL for a descriptor that is no BPF
// object, which used to come out bare. A BPF ring buffer passes the same
// check, and a closed descriptor is EBADF, not ErrMapType.
func TestNotAMapDescriptors(t *testing.T) {
	// Under qemu-user (make test-bigendian, test-arm64) bpf(2) is not
	// implemented: no kernel answers for any descriptor.
	if _, _, errno := unix.Syscall(unix.SYS_BPF, unix.BPF_MAP_LOOKUP_ELEM, 0, 0); errno == unix.ENOSYS {
		t.Skip("bpf(2) is not implemented here (an emulator): no kernel to tell maps from other descriptors")
	}
	type desc struct {
		name       string
		open       func(t *testing.T) int // closed at cleanup
		proc, bare string                 // what the error names, with /proc and without
	}
	keep := func(t *testing.T, fd int, err error) int {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { unix.Close(fd) })
		return fd
	}
	file := func(t *testing.T, f *os.File, err error) int {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { f.Close() })
		return int(f.Fd())
	}
	for _, d := range []desc{
		{"/dev/null", func(t *testing.T) int { f, err := os.Open(os.DevNull); return file(t, f, err) }, "(/dev/null)", "(a character device)"},
		{"regular file", func(t *testing.T) int { f, err := os.CreateTemp(t.TempDir(), "notamap"); return file(t, f, err) }, "/notamap", "(a regular file)"},
		{"directory", func(t *testing.T) int { f, err := os.Open(t.TempDir()); return file(t, f, err) }, "(/", "(a directory)"},
		{"pipe", func(t *testing.T) int {
			r, w, err := os.Pipe()
			t.Cleanup(func() { w.Close() })
			return file(t, r, err)
		}, "(pipe:[", "(a pipe)"},
		{"socket", func(t *testing.T) int {
			fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
			return keep(t, fd, err)
		}, "(socket:[", "(a socket)"},
		{"epoll set", func(t *testing.T) int { fd, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC); return keep(t, fd, err) }, "(anon_inode:[eventpoll])", "(an anonymous inode"},
		{"eventfd", func(t *testing.T) int { fd, err := unix.Eventfd(0, unix.EFD_CLOEXEC); return keep(t, fd, err) }, "(anon_inode:[eventfd])", "(an anonymous inode"},
		{"timerfd", func(t *testing.T) int {
			fd, err := unix.TimerfdCreate(unix.CLOCK_MONOTONIC, unix.TFD_CLOEXEC)
			return keep(t, fd, err)
		}, "(anon_inode:[timerfd])", "(an anonymous inode"},
		{"stdin", func(t *testing.T) int {
			fd, err := unix.FcntlInt(0, unix.F_DUPFD_CLOEXEC, 0) // whatever it is, it is no BPF map
			if err != nil {
				t.Skipf("no stdin: %v", err)
			}
			return keep(t, fd, err)
		}, "is not a BPF map (", "is not a BPF map ("},
		{"perf event", func(t *testing.T) int {
			attr := unix.PerfEventAttr{Type: unix.PERF_TYPE_SOFTWARE, Config: unix.PERF_COUNT_SW_DUMMY, Size: uint32(unsafe.Sizeof(unix.PerfEventAttr{}))}
			fd, err := unix.PerfEventOpen(&attr, 0, -1, -1, unix.PERF_FLAG_FD_CLOEXEC)
			privileged(t, "perf_event_open", err)
			return keep(t, fd, err)
		}, "(anon_inode:[perf_event])", "(an anonymous inode"},
		{"BPF program", func(t *testing.T) int { return loadSocketFilter(t) }, "(anon_inode:bpf-prog)", "(an anonymous inode"},
	} {
		for _, proc := range []bool{true, false} {
			name := d.name + "/proc"
			want := d.proc
			if !proc {
				name, want = d.name+"/no proc", d.bare
			}
			t.Run(name, func(t *testing.T) {
				fd := d.open(t)
				withoutProc(t, !proc)
				_, err := checkMap(fd)
				if !errors.Is(err, ErrMapType) || !strings.Contains(err.Error(), "is not a BPF map") || !strings.Contains(err.Error(), want) {
					t.Errorf("checkMap: %v; want ErrMapType, naming %q", err, want)
				}
				if _, err := Open(mapFD(fd), RingOptions{}, nil, nil, nil); !errors.Is(err, ErrMapType) {
					t.Errorf("Open: %v; want ErrMapType", err)
				}
				if _, err := newFailureMap(fd, fd); !errors.Is(err, os.ErrInvalid) || errors.Is(err, ErrMapType) || !strings.Contains(err.Error(), want) {
					t.Errorf("failure map: %v; want os.ErrInvalid, naming %q", err, want)
				}
			})
		}
	}
	for _, proc := range []bool{true, false} {
		t.Run(fmt.Sprintf("ring buffer, proc %v", proc), func(t *testing.T) {
			rb, err := kernel.CreateRingBuf("pb_edges_rb", uint32(os.Getpagesize()), 0)
			privileged(t, "create a ring buffer", err)
			defer unix.Close(rb)
			withoutProc(t, !proc)
			if info, err := checkMap(rb); err != nil || info.typ != mapTypeRingBuf {
				t.Errorf("checkMap of a ring buffer: %+v, %v", info, err)
			}
		})
		t.Run(fmt.Sprintf("closed, proc %v", proc), func(t *testing.T) {
			fd, err := unix.Eventfd(0, unix.EFD_CLOEXEC)
			if err != nil {
				t.Fatal(err)
			}
			unix.Close(fd)
			withoutProc(t, !proc)
			if _, err := checkMap(fd); !errors.Is(err, syscall.EBADF) || errors.Is(err, ErrMapType) {
				t.Errorf("checkMap of a closed fd: %v; want EBADF", err)
			}
		})
	}
}

// withoutProc makes fdKind find no /proc until the test ends, if without.
func withoutProc(t *testing.T, without bool) {
	if !without {
		return
	}
	old := procFD
	procFD = "/nonexistent/proc/self/fd/"
	t.Cleanup(func() { procFD = old })
}

// privileged fails the test on err, or skips it for want of privileges
// outside CI, or of a kernel (an emulator: make test-arm64, test-bigendian).
func privileged(t *testing.T, what string, err error) {
	t.Helper()
	if err == nil {
		return
	}
	if errors.Is(err, syscall.ENOSYS) {
		t.Skipf("%s: %v (bpf(2) is not implemented here, an emulator: no kernel)", what, err)
	}
	if (errors.Is(err, os.ErrPermission) || errors.Is(err, syscall.EACCES)) && os.Getenv("CI") != "true" {
		t.Skipf("%s: %v (needs privileges)", what, err)
	}
	t.Fatalf("%s: %v", what, err)
}

// loadSocketFilter loads a socket filter that returns 0, closed at cleanup.
func loadSocketFilter(t *testing.T) int {
	t.Helper()
	insns := [16]byte{0: 0xb7, 8: 0x95} // r0 = 0 (BPF_ALU64 | BPF_MOV | BPF_K); exit (BPF_JMP | BPF_EXIT)
	license := []byte("GPL\x00")
	var attr [48]byte // union bpf_attr, BPF_PROG_LOAD: prog_type, insn_cnt, insns, license
	binary.NativeEndian.PutUint32(attr[0:], unix.BPF_PROG_TYPE_SOCKET_FILTER)
	binary.NativeEndian.PutUint32(attr[4:], 2)
	binary.NativeEndian.PutUint64(attr[8:], uint64(uintptr(unsafe.Pointer(&insns[0]))))
	binary.NativeEndian.PutUint64(attr[16:], uint64(uintptr(unsafe.Pointer(&license[0]))))
	var fd uintptr
	var errno syscall.Errno
	for try := 0; try < 5; try++ { // EAGAIN: a signal was pending (libbpf tries again too)
		if fd, _, errno = syscall.Syscall(unix.SYS_BPF, unix.BPF_PROG_LOAD, uintptr(unsafe.Pointer(&attr[0])), uintptr(len(attr))); errno != syscall.EAGAIN {
			break
		}
	}
	runtime.KeepAlive(&insns)
	runtime.KeepAlive(license)
	if errno != 0 {
		privileged(t, "load a socket filter", errno)
	}
	t.Cleanup(func() { unix.Close(int(fd)) })
	return int(fd)
}
