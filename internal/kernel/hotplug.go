// SPDX-License-Identifier: Apache-2.0

package kernel

// CPUs that come online after a reader opened its rings. libbpf opens rings
// on the CPUs online then; a CPU brought online later has no ring in the map, and
// bpf_perf_event_output fails there with ENOENT. A CPU taken offline and
// brought back has its old ring, but the kernel detached that ring's event
// when the CPU went down (perf_event_exit_cpu_context), and it stays
// detached: bpf_perf_event_output fails there with EOPNOTSUPP. Either way
// the CPU needs a new ring.
//
// The kernel announces both with a uevent ("online@/devices/system/cpu/cpuN")
// on NETLINK_KOBJECT_UEVENT. One such socket serves the whole process
// (uevents): it is opened when the first owner subscribes (NewCPUWatch) and
// closed when the last one's watch closes, so a process with no owner holds
// none, and 200 owners hold one, not 200. One goroutine, parked in the
// netpoller while nothing happens, reads it, notes each CPU in every
// subscriber's CPUWatch and wakes each owner (Notify). The owner then opens
// the rings, on its reading goroutine, under the lock its drains hold
// (PerfBuffer: Poll, Consume; Reader: its reads), so that no drain sees the
// ring set change under it. The old ring of a CPU that came back stays: it
// is drained like the others (what it held before the CPU went down) until
// Close.
//
// Untagged uevents reach sockets in every network namespace owned by the
// initial user namespace, so a privileged container gets them too. Where the
// socket cannot be opened (a user namespace), CPUs are not tracked and
// samples on a CPU that comes online are counted only BPF-side (FailureMap).
//
// Locks: uevents.mu and CPUWatch.mu are never held together, and neither
// while a Notify runs: a Notify may end in its owner's free, which closes
// the watch (wait.Lifetime.Exit after Close), and so takes both.

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"

	"golang.org/x/sys/unix"
)

// uevents is the process's uevent socket and the watches subscribed to it.
// The socket is open exactly while subs is not empty.
type uevents struct {
	mu   sync.Mutex
	file *os.File // the socket, in the netpoller; nil with no subscriber
	subs map[*CPUWatch]struct{}
}

// hub is the process's one uevents.
var hub uevents

// openUevents opens the uevent socket; tests replace it to feed their own
// uevents.
var openUevents = openUeventSocket

// openUeventSocket opens a NETLINK_KOBJECT_UEVENT socket bound to the
// kernel's uevents, non-blocking, for the netpoller.
func openUeventSocket() (*os.File, error) {
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC|unix.SOCK_NONBLOCK, unix.NETLINK_KOBJECT_UEVENT)
	if err != nil {
		return nil, fmt.Errorf("open uevent socket: %w", err)
	}
	// Group 1 carries the kernel's uevents.
	if err := unix.Bind(fd, &unix.SockaddrNetlink{Family: unix.AF_NETLINK, Groups: 1}); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("bind uevent socket: %w", err)
	}
	return os.NewFile(uintptr(fd), "perfbuf uevents"), nil
}

// subscribe adds w to the subscribers, opening the socket and starting its
// reader if w is the first. From its return, every uevent the kernel sends
// reaches w.
func (h *uevents) subscribe(w *CPUWatch) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.file == nil {
		f, err := openUevents()
		if err != nil {
			return err
		}
		h.file, h.subs = f, make(map[*CPUWatch]struct{})
		go h.read(f)
	}
	h.subs[w] = struct{}{}
	return nil
}

// unsubscribe removes w, and closes the socket if w was the last. Its
// reader, blocked in Read or about to deliver, then stops.
func (h *uevents) unsubscribe(w *CPUWatch) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if _, ok := h.subs[w]; !ok {
		return // closed before, or a test's watch
	}
	delete(h.subs, w)
	if len(h.subs) == 0 {
		h.file.Close()
		h.file, h.subs = nil, nil
	}
}

// read reads f until it is closed. One runs per opening of the socket.
func (h *uevents) read(f *os.File) {
	buf := make([]byte, 8192) // a uevent is at most UEVENT_BUFFER_SIZE (2 KiB)
	for {
		n, err := f.Read(buf)
		if !h.feed(f, buf[:n], err) {
			return
		}
	}
}

// feed hands one read of f, msg or err, to every subscriber: a CPU online
// is noted in each, and so is a loss (ENOBUFS: the socket overflowed, some
// uevents are gone), which makes each compare the online list. It reports
// whether to read on: not once f is closed (err), or no longer the
// process's socket.
func (h *uevents) feed(f *os.File, msg []byte, err error) bool {
	cpu := -1 // uevents lost
	switch {
	case errors.Is(err, syscall.ENOBUFS):
	case err != nil:
		return false // closed
	default:
		var ok bool
		if cpu, ok = ParseCPUOnline(msg); !ok {
			return true
		}
	}
	h.mu.Lock()
	if h.file != f {
		h.mu.Unlock()
		return false
	}
	subs := make([]*CPUWatch, 0, len(h.subs))
	for w := range h.subs {
		subs = append(subs, w)
	}
	h.mu.Unlock()
	// Without h.mu: see the lock rule above. A watch closed since is
	// skipped by note.
	for _, w := range subs {
		w.Note(cpu)
	}
	return true
}

// CPUWatch collects, for one owner, the CPUs the kernel brought online.
type CPUWatch struct {
	Pending atomic.Bool // CPUs to take (a cheap check for the readers)
	Notify  func()      // wakes the owner's wait; set before Start

	mu      sync.Mutex
	online  []int // CPUs announced online since the last take
	rescan  bool  // uevents were lost: compare the online list instead
	started bool  // notify is set: note calls it
	closed  bool  // note does nothing
}

// NewCPUWatch subscribes a watch to the process's uevent socket; it reports
// nil if the socket cannot be opened (see above). Call it before reading the
// online list, so that a CPU that comes online in between is announced:
// from its return, every CPU that comes online is noted (before start
// too; start then wakes the owner).
func NewCPUWatch() *CPUWatch {
	w := new(CPUWatch)
	if hub.subscribe(w) != nil {
		return nil
	}
	return w
}

// Start lets Note wake the owner through Notify, which must be set, and
// wakes it at once if CPUs were noted before.
func (w *CPUWatch) Start() {
	w.mu.Lock()
	w.started = true
	wake := w.Pending.Load() && !w.closed
	w.mu.Unlock()
	if wake {
		w.Notify()
	}
}

// Note records that cpu came online (-1: uevents were lost) and wakes the
// owner once started. It does nothing once closed; a note under way when
// Close is called may still call notify after close returns, so notify
// must be safe then (the owners' poke is: it wakes only an open one).
func (w *CPUWatch) Note(cpu int) {
	w.mu.Lock()
	if w.closed {
		w.mu.Unlock()
		return
	}
	if cpu < 0 {
		w.rescan = true
	} else {
		w.online = append(w.online, cpu)
	}
	w.Pending.Store(true)
	started := w.started
	w.mu.Unlock()
	if started {
		w.Notify()
	}
}

// Take returns the CPUs announced online since the last take, and whether
// the online list must be compared too.
func (w *CPUWatch) Take() (online []int, rescan bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.Pending.Store(false)
	online, rescan = w.online, w.rescan
	w.online, w.rescan = nil, false
	return online, rescan
}

// Close unsubscribes w; the last watch to close closes the socket. It is
// idempotent, may run from any goroutine, notify included, and leaves the
// other watches as they are.
func (w *CPUWatch) Close() {
	w.mu.Lock()
	w.closed = true
	w.mu.Unlock()
	hub.unsubscribe(w)
}

// ParseCPUOnline reads a kernel uevent, "ACTION@DEVPATH\0KEY=VALUE\0...",
// and reports the CPU of an "online" or "add" (hot-added) CPU device.
func ParseCPUOnline(msg []byte) (int, bool) {
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
