// SPDX-License-Identifier: Apache-2.0

package kernel

// Tests of the uevents that announce CPUs coming online: the parser, and the
// process's one uevent socket shared by every watch. The owners taking a
// new ring in are the root package's tests; the kernel's side (a CPU
// brought online in a VM) is selftest/hotplug's.

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

func TestParseCPUOnline(t *testing.T) {
	for msg, want := range map[string]int{
		"online@/devices/system/cpu/cpu3\x00ACTION=online\x00DEVPATH=/devices/system/cpu/cpu3\x00SUBSYSTEM=cpu\x00SEQNUM=4077": 3,
		"add@/devices/system/cpu/cpu12\x00ACTION=add\x00":                                                                      12,
		"online@/devices/system/cpu/cpu0":                                                                                      0,
		"offline@/devices/system/cpu/cpu3\x00ACTION=offline\x00":                                                               -1,
		"online@/devices/system/memory/memory3\x00":                                                                            -1,
		"change@/devices/system/cpu/cpu3\x00":                                                                                  -1,
		"online@/devices/system/cpu/cpufreq\x00":                                                                               -1,
		"online@/devices/system/cpu/cpu\x00":                                                                                   -1,
		"online@/devices/system/cpu/cpu+1\x00":                                                                                 -1,
		"online@/devices/system/cpu/cpu-1\x00":                                                                                 -1,
		"online@/devices/system/cpu/cpu99999999999\x00":                                                                        -1,
		"libudev\x00\xfe\xed\xca\xfe":                                                                                          -1,
		"":                                                                                                                     -1,
		"online":                                                                                                               -1,
	} {
		cpu, ok := ParseCPUOnline([]byte(msg))
		if got := map[bool]int{true: cpu, false: -1}[ok]; got != want {
			t.Errorf("%q: cpu %d, %v; want %d", msg, cpu, ok, want)
		}
	}
}

// ueventSockets counts this process's NETLINK_KOBJECT_UEVENT sockets: the
// descriptors in /proc/self/fd whose socket inode /proc/net/netlink lists
// with that protocol.
func ueventSockets(t *testing.T) int {
	t.Helper()
	b, err := os.ReadFile("/proc/net/netlink")
	if err != nil {
		t.Skipf("netlink sockets not listed: %v", err)
	}
	uevent := map[string]bool{}
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Scan() // the header: sk Eth Pid Groups ... Inode
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) >= 10 && f[1] == strconv.Itoa(unix.NETLINK_KOBJECT_UEVENT) {
			uevent[f[len(f)-1]] = true
		}
	}
	fds, err := filepath.Glob("/proc/self/fd/*")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, fd := range fds {
		l, err := os.Readlink(fd)
		if ino, ok := strings.CutPrefix(l, "socket:["); err == nil && ok && uevent[strings.TrimSuffix(ino, "]")] {
			n++
		}
	}
	return n
}

// ueventReaders counts the goroutines reading a uevent socket.
func ueventReaders() int {
	buf := make([]byte, 1<<20)
	return strings.Count(string(buf[:runtime.Stack(buf, true)]), "kernel.(*uevents).read(")
}

// waitUeventReaders waits until want goroutines read a uevent socket.
func waitUeventReaders(t *testing.T, want int) {
	t.Helper()
	for start := time.Now(); ueventReaders() != want; time.Sleep(time.Millisecond) {
		if time.Since(start) > 5*time.Second {
			t.Fatalf("%d goroutines read uevents, want %d", ueventReaders(), want)
		}
	}
}

// hubIdle fails unless no watch is subscribed (a test before leaked one),
// so that the socket counts start from none.
func hubIdle(t *testing.T) {
	t.Helper()
	hub.mu.Lock()
	n, open := len(hub.subs), hub.file != nil
	hub.mu.Unlock()
	if n != 0 || open {
		t.Fatalf("uevent socket open (%v) with %d watches subscribed before the test", open, n)
	}
	waitUeventReaders(t, 0)
}

// TestCPUWatchSharedSocket: however many watches, the process holds one
// uevent socket and one goroutine reading it, from the first watch until the
// last one closes; a new watch then opens it again. The kernel's socket.
func TestCPUWatchSharedSocket(t *testing.T) {
	hubIdle(t)
	if n := ueventSockets(t); n != 0 {
		t.Fatalf("%d uevent sockets before any watch", n)
	}
	first := NewCPUWatch()
	if first == nil {
		t.Skip("no uevent socket here: CPUs are not tracked")
	}
	ws := []*CPUWatch{first}
	for range 199 {
		w := NewCPUWatch()
		if w == nil {
			t.Fatal("a second watch found no socket")
		}
		ws = append(ws, w)
	}
	defer func() {
		for _, w := range ws {
			w.Close()
		}
	}()
	if n := ueventSockets(t); n != 1 {
		t.Fatalf("%d uevent sockets for 200 watches, want 1", n)
	}
	waitUeventReaders(t, 1)
	for _, w := range ws[1:] {
		w.Close()
		w.Close() // idempotent: the others stay subscribed
	}
	if n := ueventSockets(t); n != 1 {
		t.Fatalf("%d uevent sockets with one watch left, want 1", n)
	}
	ws[0].Close()
	if n := ueventSockets(t); n != 0 {
		t.Fatalf("%d uevent sockets after the last watch closed, want 0", n)
	}
	waitUeventReaders(t, 0)

	again := NewCPUWatch()
	if again == nil {
		t.Fatal("no uevent socket the second time")
	}
	ws = append(ws, again)
	if n := ueventSockets(t); n != 1 {
		t.Fatalf("%d uevent sockets after a new watch, want 1", n)
	}
	waitUeventReaders(t, 1)
	again.Close()
	if n := ueventSockets(t); n != 0 {
		t.Fatalf("%d uevent sockets after it closed, want 0", n)
	}
	waitUeventReaders(t, 0)
}

// fakeUevents makes the process's uevent socket one end of a datagram
// socket pair for the test; it returns the number of sockets opened so far
// and a function that sends a uevent to the one open now, as the kernel
// would.
func fakeUevents(t *testing.T) (opened func() int, send, trySend func(msg string)) {
	t.Helper()
	hubIdle(t)
	var mu sync.Mutex
	var peers []int
	openUevents = func() (*os.File, error) {
		fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			return nil, err
		}
		if err := unix.SetNonblock(fds[0], true); err != nil {
			return nil, err
		}
		mu.Lock()
		peers = append(peers, fds[1])
		mu.Unlock()
		return os.NewFile(uintptr(fds[0]), "fake uevents"), nil
	}
	t.Cleanup(func() {
		openUevents = openUeventSocket
		for _, fd := range peers {
			unix.Close(fd)
		}
	})
	opened = func() int {
		mu.Lock()
		defer mu.Unlock()
		return len(peers)
	}
	trySend = func(msg string) {
		mu.Lock()
		defer mu.Unlock() // the peer stays open: only Cleanup closes it
		if len(peers) > 0 {
			_, _ = unix.Write(peers[len(peers)-1], []byte(msg))
		}
	}
	send = func(msg string) {
		mu.Lock()
		peer := peers[len(peers)-1]
		mu.Unlock()
		if _, err := unix.Write(peer, []byte(msg)); err != nil {
			t.Errorf("send uevent: %v", err)
		}
	}
	return opened, send, trySend
}

// feedLost plays the socket's overflow: its reader's Read failing with
// ENOBUFS. It may run on any goroutine.
func feedLost(t *testing.T) {
	t.Helper()
	hub.mu.Lock()
	f := hub.file
	hub.mu.Unlock()
	if !hub.feed(f, nil, &os.PathError{Op: "read", Path: f.Name(), Err: syscall.ENOBUFS}) {
		t.Error("the reader stopped at ENOBUFS")
	}
}

// watcher is a started watch whose notify, like an owner's poke, sets a
// wake that stays set until taken and never blocks.
type watcher struct {
	*CPUWatch
	woken chan struct{}
}

func (w watcher) wake() {
	select {
	case w.woken <- struct{}{}:
	default:
	}
}

func newWatcher(t *testing.T) watcher {
	t.Helper()
	w := watcher{NewCPUWatch(), make(chan struct{}, 1)}
	if w.CPUWatch == nil {
		t.Fatal("NewCPUWatch: nil")
	}
	w.Notify = w.wake
	w.Start()
	t.Cleanup(w.Close)
	return w
}

// expect waits for w's wake and checks what it takes.
func (w watcher) expect(t *testing.T, name string, online []int, rescan bool) {
	t.Helper()
	select {
	case <-w.woken:
	case <-time.After(5 * time.Second):
		t.Fatalf("%s: not woken", name)
	}
	if !w.Pending.Load() {
		t.Errorf("%s: woken with nothing pending", name)
	}
	got, gotRescan := w.Take()
	if !slices.Equal(got, online) || gotRescan != rescan {
		t.Errorf("%s: took %v, rescan %v; want %v, %v", name, got, gotRescan, online, rescan)
	}
}

// quiet checks that w was not woken and has nothing pending.
func (w watcher) quiet(t *testing.T, name string) {
	t.Helper()
	select {
	case <-w.woken:
		t.Errorf("%s: woken", name)
	case <-time.After(20 * time.Millisecond):
	}
	if got, rescan := w.Take(); got != nil || rescan {
		t.Errorf("%s: took %v, rescan %v; want nothing", name, got, rescan)
	}
}

// TestCPUWatchFeed: a uevent sent to the socket reaches every watch through
// the one reader, a CPU's as a CPU, a loss (ENOBUFS) as a rescan; other
// uevents reach none; a closed watch gets nothing while the others go on; a
// watch not yet started keeps what came and is woken at start.
func TestCPUWatchFeed(t *testing.T) {
	opened, send, _ := fakeUevents(t)
	ws := make([]watcher, 5)
	for i := range ws {
		ws[i] = newWatcher(t)
	}
	if n := opened(); n != 1 {
		t.Fatalf("%d sockets opened for %d watches, want 1", n, len(ws))
	}
	send("online@/devices/system/cpu/cpu5\x00ACTION=online\x00DEVPATH=/devices/system/cpu/cpu5\x00SUBSYSTEM=cpu\x00")
	for i, w := range ws {
		w.expect(t, fmt.Sprintf("watch %d, cpu 5", i), []int{5}, false)
	}
	send("offline@/devices/system/cpu/cpu5\x00ACTION=offline\x00")
	send("add@/devices/pci0000:00/0000:00:1f.0\x00ACTION=add\x00")
	for i, w := range ws {
		w.quiet(t, fmt.Sprintf("watch %d, other uevents", i))
	}

	feedLost(t)
	for i, w := range ws {
		w.expect(t, fmt.Sprintf("watch %d, lost", i), nil, true)
	}

	ws[1].Close()
	ws[3].Close()
	send("online@/devices/system/cpu/cpu1\x00")
	for i, w := range ws {
		if i == 1 || i == 3 {
			w.quiet(t, fmt.Sprintf("watch %d, closed", i))
		} else {
			w.expect(t, fmt.Sprintf("watch %d, cpu 1 after two closed", i), []int{1}, false)
		}
	}

	// Subscribed before the online list is read, started after: a CPU
	// that comes online in between is kept, and start wakes the owner.
	late := watcher{NewCPUWatch(), make(chan struct{}, 1)}
	defer late.Close()
	send("online@/devices/system/cpu/cpu7\x00")
	ws[0].expect(t, "watch 0, cpu 7", []int{7}, false)
	late.Notify = late.wake
	late.Start()
	late.expect(t, "late watch, cpu 7 before start", []int{7}, false)
	if n := opened(); n != 1 {
		t.Fatalf("%d sockets opened, want 1", n)
	}
}

// TestCPUWatchReopen: the last close closes the socket and stops its
// reader; the next watch opens a new one, which alone feeds it.
func TestCPUWatchReopen(t *testing.T) {
	opened, send, _ := fakeUevents(t)
	a, b := newWatcher(t), newWatcher(t)
	waitUeventReaders(t, 1)
	a.Close()
	b.Close()
	waitUeventReaders(t, 0)
	hub.mu.Lock()
	open := hub.file != nil
	hub.mu.Unlock()
	if open {
		t.Fatal("socket open after the last watch closed")
	}
	c := newWatcher(t)
	if n := opened(); n != 2 {
		t.Fatalf("%d sockets opened, want 2", n)
	}
	waitUeventReaders(t, 1)
	send("online@/devices/system/cpu/cpu2\x00")
	c.expect(t, "new watch", []int{2}, false)
	a.quiet(t, "closed watch")
}

// TestCPUWatchCloseRace: watches subscribe, close (some from inside their
// notify, as an owner's free does) and are fed at once, the socket closing
// and opening again as the count goes through zero; every watch open for
// the whole of a uevent's delivery gets it. Run with -race.
func TestCPUWatchCloseRace(t *testing.T) {
	opened, send, trySend := fakeUevents(t)
	// keep holds one socket open: its uevents must all arrive. Closed by
	// hand, not in a Cleanup, which would hang a test that failed on a
	// stuck delivery.
	keep := watcher{NewCPUWatch(), make(chan struct{}, 1)}
	keep.Notify = keep.wake
	keep.Start()
	const rounds, churners = 300, 4
	var wg sync.WaitGroup
	stop := make(chan struct{})
	var notified atomic.Int64
	for g := range churners {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				w := NewCPUWatch()
				if w == nil {
					t.Error("NewCPUWatch: nil")
					return
				}
				if (g+i)%2 == 0 {
					w.Notify = func() { notified.Add(1); w.Close() } // closes during delivery
				} else {
					w.Notify = func() { notified.Add(1) }
				}
				w.Start()
				runtime.Gosched()
				w.Close()
				w.Take()
			}
		}()
	}
	// Sent from a goroutine of its own: a reader stuck in delivery would
	// block the sends once the socket is full, and the test times out below.
	go func() {
		for i := range rounds {
			send("online@/devices/system/cpu/cpu" + strconv.Itoa(i%4) + "\x00")
			if i%50 == 0 {
				feedLost(t)
			}
			if i%10 == 0 {
				time.Sleep(time.Millisecond)
			}
		}
		// The last uevent reaches keep after all before it: drain up to it.
		send("online@/devices/system/cpu/cpu99\x00")
	}()
	deadline := time.After(10 * time.Second)
	var got []int
	lost := false
	for !slices.Contains(got, 99) {
		select {
		case <-keep.woken:
			cpus, rescan := keep.Take()
			got, lost = append(got, cpus...), lost || rescan
		case <-deadline:
			t.Fatalf("the kept watch took %d CPUs, not the last", len(got))
		}
	}
	close(stop)
	wg.Wait()
	if len(got) != rounds+1 || !lost {
		t.Errorf("kept watch: %d CPUs (want %d), a loss seen %v", len(got), rounds+1, lost)
	}
	t.Logf("%d notifies to the churning watches", notified.Load())

	// Without it, the count goes through zero: sockets close and open
	// under the churn and the sends (to whichever is open, or a closed one).
	keep.Close()
	stop, before := make(chan struct{}), opened()
	for range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				w := NewCPUWatch()
				w.Notify = func() { w.Close() }
				w.Start()
				runtime.Gosched()
				w.Close()
			}
		}()
	}
	const reopens = 20
	for i, start := 0, time.Now(); opened()-before < reopens; i++ {
		if time.Since(start) > 10*time.Second {
			t.Errorf("%d sockets opened under the churn in %v, want %d", opened()-before, time.Since(start), reopens)
			break
		}
		trySend("online@/devices/system/cpu/cpu" + strconv.Itoa(i%4) + "\x00")
		runtime.Gosched()
	}
	close(stop)
	wg.Wait()
	hubIdle(t)
	t.Logf("%d sockets opened under the churn", opened()-before)
}
