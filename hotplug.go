package perfbuf

// CPUs that come online after New. libbpf opens rings on the CPUs online at
// New; a CPU brought online later has no ring in the map, and
// bpf_perf_event_output fails there with ENOENT. A CPU taken offline and
// brought back has its old ring, but the kernel detached that ring's event
// when the CPU went down (perf_event_exit_cpu_context), and it stays
// detached: bpf_perf_event_output fails there with EOPNOTSUPP. Either way
// the CPU needs a new ring.
//
// The kernel announces both with a uevent ("online@/devices/system/cpu/cpuN")
// on NETLINK_KOBJECT_UEVENT. A cpuWatch listens on that socket from a
// goroutine parked in the netpoller (no cost while nothing happens), notes
// the CPUs, and wakes the owner's wait; the owner then opens the rings, on
// its reading goroutine, under the lock its drains hold (PerfBuffer:
// Poll, Consume; Reader: its reads), so that no drain sees the ring set
// change under it. The old ring of a CPU that came back stays: it is drained
// like the others (what it held before the CPU went down) until Close.
//
// Untagged uevents reach sockets in every network namespace owned by the
// initial user namespace, so a privileged container gets them too. Where the
// socket cannot be opened (a user namespace), CPUs are not tracked and
// samples on a CPU that comes online are counted only BPF-side (FailureMap).

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/perfbuf/perfbuf/internal/cpus"
)

// cpuWatch collects the CPUs the kernel brought online.
type cpuWatch struct {
	file    *os.File    // the uevent socket, in the netpoller
	pending atomic.Bool // CPUs to take (a cheap check for the readers)
	notify  func()      // wakes the owner's wait; set before start

	mu     sync.Mutex
	online []int // CPUs announced online since the last take
	rescan bool  // uevents were lost: compare the online list instead
}

// newCPUWatch opens the uevent socket; it reports nil if it cannot (see
// above). Open it before reading the online list, so that a CPU that comes
// online in between is announced.
func newCPUWatch() *cpuWatch {
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC|unix.SOCK_NONBLOCK, unix.NETLINK_KOBJECT_UEVENT)
	if err != nil {
		return nil
	}
	// Group 1 carries the kernel's uevents.
	if err := unix.Bind(fd, &unix.SockaddrNetlink{Family: unix.AF_NETLINK, Groups: 1}); err != nil {
		unix.Close(fd)
		return nil
	}
	return &cpuWatch{file: os.NewFile(uintptr(fd), "perfbuf uevents")}
}

// start reads uevents until close.
func (w *cpuWatch) start() {
	if w.file == nil {
		return // a test's: it calls note
	}
	go func() {
		buf := make([]byte, 8192) // a uevent is at most UEVENT_BUFFER_SIZE (2 KiB)
		for {
			n, err := w.file.Read(buf)
			switch {
			case errors.Is(err, syscall.ENOBUFS):
				// The socket overflowed: some uevents are gone.
				w.note(-1)
			case err != nil:
				return // closed
			default:
				if cpu, ok := parseCPUOnline(buf[:n]); ok {
					w.note(cpu)
				}
			}
		}
	}()
}

// note records that cpu came online (-1: uevents were lost) and wakes the
// owner.
func (w *cpuWatch) note(cpu int) {
	w.mu.Lock()
	if cpu < 0 {
		w.rescan = true
	} else {
		w.online = append(w.online, cpu)
	}
	w.pending.Store(true)
	w.mu.Unlock()
	w.notify()
}

// take returns the CPUs announced online since the last take, and whether
// the online list must be compared too.
func (w *cpuWatch) take() (online []int, rescan bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.pending.Store(false)
	online, rescan = w.online, w.rescan
	w.online, w.rescan = nil, false
	return online, rescan
}

func (w *cpuWatch) close() {
	if w.file != nil { // nil: a test's
		w.file.Close()
	}
}

// parseCPUOnline reads a kernel uevent, "ACTION@DEVPATH\0KEY=VALUE\0...",
// and reports the CPU of an "online" or "add" (hot-added) CPU device.
func parseCPUOnline(msg []byte) (int, bool) {
	head, _, _ := bytes.Cut(msg, []byte{0})
	action, path, ok := bytes.Cut(head, []byte("@"))
	if !ok || (string(action) != "online" && string(action) != "add") {
		return 0, false
	}
	num, ok := bytes.CutPrefix(path, []byte("/devices/system/cpu/cpu"))
	if !ok || len(num) == 0 || len(num) > 6 {
		return 0, false
	}
	cpu, err := strconv.Atoi(string(num)) // digits only: "cpufreq" fails here
	if err != nil || cpu < 0 || num[0] == '+' {
		return 0, false
	}
	return cpu, true
}

// cpusPending reports whether CPUs came online since the last
// addNewCPUs: one atomic load, also on a nil r (a Reader over a test's own
// rings) and without a watch.
func (r *rings) cpusPending() bool {
	return r != nil && r.watch != nil && r.watch.pending.Load()
}

// takeNewCPUs returns the CPUs that need a new ring: those announced online
// (again or for the first time), and with rescan, the online CPUs without a
// ring. Each comes once, in increasing order; CPUs past the map's entries
// are left out.
func (r *rings) takeNewCPUs() ([]int, error) {
	online, rescan := r.watch.take()
	if rescan {
		now, err := cpus.Online()
		if err != nil {
			return nil, err
		}
		r.mu.RLock()
		for _, cpu := range now {
			if !slices.Contains(r.cpus, int32(cpu)) {
				online = append(online, cpu)
			}
		}
		r.mu.RUnlock()
	}
	slices.Sort(online)
	online = slices.Compact(online)
	return slices.DeleteFunc(online, func(cpu int) bool { return cpu >= r.limit }), nil
}

// addNewCPUs opens a ring for each CPU that takeNewCPUs returns and calls
// added with its buffer index. A CPU that went offline again before its
// ring opened (ENODEV) is skipped: its uevent will come again. The caller
// holds its owner's drain lock.
func (r *rings) addNewCPUs(added func(i int) error) error {
	news, err := r.takeNewCPUs()
	if err != nil {
		return fmt.Errorf("cpus online: %w", err)
	}
	for _, cpu := range news {
		i, err := r.add(cpu)
		if errors.Is(err, syscall.ENODEV) {
			continue
		}
		if err != nil {
			return fmt.Errorf("open ring on cpu %d, online since: %w", cpu, err)
		}
		if err := added(i); err != nil {
			return fmt.Errorf("ring on cpu %d, online since: %w", cpu, err)
		}
	}
	return nil
}
