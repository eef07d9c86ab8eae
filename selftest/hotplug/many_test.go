// SPDX-License-Identifier: Apache-2.0

package hotplug

// CPUs that come online while three readers read: a callback-mode
// PerfBuffer, a fullest-first Reader and an ordered Reader, each on a perf
// event array of its own. It is written for the hosts this library is for:
// many CPUs, and holes in the online list (possible CPUs beyond the online
// ones, offline ones between them: cilium/ebpf#2100). scripts/vmtest.sh
// boots a 64-vCPU guest with most of its CPUs offline (maxcpus=) for it;
// in the smaller guests it makes its own holes.

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/perfbuf/perfbuf"
	"github.com/perfbuf/perfbuf/internal/cpus"
	"github.com/perfbuf/perfbuf/internal/kernel"
	"github.com/perfbuf/perfbuf/selftest/internal/bpftest"
)

// Per CPU and reader: the background emitter writes bursts of burst
// samples on the CPUs that have rings while the others come online, at
// most maxBursts of them; then count more are emitted on every CPU.
const (
	burst     = 8
	maxBursts = 4
	batch     = 8 // CPUs brought online at once
)

// manyNotice bounds how long a CPU that came online may go without a ring
// in every reader, and how long the readers may take to deliver what was
// emitted: longer than notice, as 64 emulated CPUs share one host thread.
const manyNotice = 30 * time.Second

// manyReader is one of the three readers, with its own emitter.
type manyReader struct {
	name  string
	f     *bpftest.Fixture
	c     *bpftest.Collector
	stats func() perfbuf.Stats
	stop  func() // stops reading and delivers what is left
	first int    // rings at New

	mu   sync.Mutex
	lost map[int]uint64 // as c.Lost, readable while the reader runs
}

func newManyReader(t *testing.T, name string) *manyReader {
	return &manyReader{name: name, f: bpftest.Setup(t, obj), c: bpftest.NewCollector(), lost: map[int]uint64{}}
}

// lostFn records a lost count for cpu.
func (m *manyReader) lostFn(cpu int, n uint64) {
	m.c.LostFn(cpu, n)
	m.mu.Lock()
	m.lost[cpu] += n
	m.mu.Unlock()
}

// lostCount returns the samples of cpu reported lost so far.
func (m *manyReader) lostCount(cpu int) uint64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.lost[cpu]
}

// collect is a Reader's function: it records rec.
func (m *manyReader) collect(rec *perfbuf.Record) error {
	switch rec.Type {
	case perfbuf.RecordSample:
		m.c.Sample(rec.CPU, rec.AppendTo(nil))
	case perfbuf.RecordLost:
		m.lostFn(rec.CPU, rec.Lost)
	}
	return nil
}

// openCallback opens a callback-mode PerfBuffer polled by a goroutine.
func openCallback(t *testing.T, opts perfbuf.Options) *manyReader {
	m := newManyReader(t, "callback")
	pb, err := perfbuf.New(m.f.Events, m.c.Sample, m.lostFn, opts)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	var wg sync.WaitGroup
	halt := sync.OnceFunc(func() { close(done); wg.Wait() })
	t.Cleanup(func() { halt(); pb.Close() }) // also when the test fails
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-done:
				return
			default:
			}
			// A CPU that comes online wakes a blocked Poll, which opens
			// its ring; the timeout only lets the loop see done.
			if _, err := pb.Poll(100 * time.Millisecond); err != nil {
				t.Errorf("Poll: %v", err)
				return
			}
		}
	}()
	m.stats = pb.Stats
	m.stop = func() {
		halt()
		if _, err := pb.Consume(); err != nil {
			t.Error(err)
		}
	}
	return m
}

// openReader opens a Reader read by Each on a goroutine.
func openReader(t *testing.T, name string, opts perfbuf.ReaderOptions) *manyReader {
	m := newManyReader(t, name)
	r, err := perfbuf.NewReader(m.f.Events, opts)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	fn := m.collect
	var wg sync.WaitGroup
	halt := sync.OnceFunc(func() { cancel(); wg.Wait() })
	t.Cleanup(func() { halt(); r.Close() }) // also when the test fails
	wg.Add(1)
	go func() {
		defer wg.Done()
		if err := r.Each(ctx, fn); !errors.Is(err, context.Canceled) {
			t.Errorf("%s: Each: %v", name, err)
		}
	}()
	m.stats = r.Stats
	m.stop = func() {
		halt()
		r.Flush() // the ordered Reader's held records
		if _, err := r.Consume(fn); err != nil {
			t.Error(err)
		}
	}
	return m
}

// ringCPUs returns the CPU of each of stats' rings, by CPU: how many.
func ringCPUs(stats perfbuf.Stats) map[int]int {
	n := map[int]int{}
	for _, st := range stats.Rings {
		n[st.CPU]++
	}
	return n
}

// TestHotplugManyCPUs: CPUs offline when the readers open their rings come
// online in batches while the readers read and the CPUs that have rings
// emit; each reader opens one ring per CPU that came online, and at the end
// every possible CPU is online, has emitted, and accounts exactly in every
// reader: received + lost == attempts, received == emitted, lost == failed.
func TestHotplugManyCPUs(t *testing.T) {
	if os.Getenv("PERFBUF_VMTEST") != "1" {
		t.Skip("takes CPUs offline: only inside a VM (make vmtest), never on the host")
	}
	bpftest.RequirePrivileges(t)
	possible, err := cpus.Possible()
	if err != nil {
		t.Fatal(err)
	}
	online, err := cpus.Online()
	if err != nil {
		t.Fatal(err)
	}
	if len(possible) < 2 {
		t.Skipf("possible cpus %v: need two", possible)
	}
	// Holes: every third CPU from 1 goes offline, whether or not the
	// guest booted with CPUs beyond these offline. Every CPU offline at
	// the end is brought back, also when the test fails.
	for _, cpu := range online {
		if cpu%3 == 1 {
			setOnline(t, cpu, false)
		}
	}
	t.Cleanup(func() {
		now, err := cpus.Online()
		if err != nil {
			t.Fatal(err)
		}
		for _, cpu := range possible {
			if !slices.Contains(now, cpu) {
				setOnline(t, cpu, true)
			}
		}
	})
	if online, err = cpus.Online(); err != nil {
		t.Fatal(err)
	}
	var late []int
	for _, cpu := range possible {
		if !slices.Contains(online, cpu) {
			late = append(late, cpu)
		}
	}
	// Not in increasing order: a CPU beyond every ring, then one in a
	// hole, as they come.
	rand.New(rand.NewPCG(1, 2)).Shuffle(len(late), func(i, j int) { late[i], late[j] = late[j], late[i] })
	t.Logf("%d possible cpus, online at start %s (%d bytes), %d come online while reading",
		len(possible), cpuList(online), len(cpuList(online))+1, len(late))
	byOpener := kernel.OpenedPerfRings()
	defer func() {
		// Where the online list passed 128 bytes, libbpf refused and
		// perfbuf opened the rings itself (see TestLongOnlineList).
		t.Logf("perfbuf's own opener opened %d of the readers' rings", kernel.OpenedPerfRings()-byOpener)
	}()

	opts := perfbuf.Options{RingBytes: 64 << 10}
	readers := []*manyReader{
		openCallback(t, opts),
		openReader(t, "fullest", perfbuf.ReaderOptions{Options: opts}),
		openReader(t, "ordered", perfbuf.ReaderOptions{Options: opts, Order: &perfbuf.Order{KeyOffset: 8}}), // emit_hdr.ts
	}
	for _, m := range readers {
		m.first = len(m.stats().Rings)
		if m.first != len(online) {
			t.Fatalf("%s: %d rings at New, want one per online cpu (%d)", m.name, m.first, len(online))
		}
	}

	// The emitter: bursts on every CPU that has a ring in every reader,
	// while the others come online.
	var (
		mu     sync.Mutex
		ready  = slices.Clone(online)
		quit   = make(chan struct{})
		ewg    sync.WaitGroup
		bursts = map[int]int{} // the emitter's until stopEmit returns
	)
	stopEmit := sync.OnceFunc(func() { close(quit); ewg.Wait() })
	defer stopEmit() // also when the test fails
	ewg.Add(1)
	go func() {
		defer ewg.Done()
		for {
			mu.Lock()
			targets := slices.Clone(ready)
			mu.Unlock()
			idle := true
			for _, cpu := range targets {
				select {
				case <-quit:
					return
				default:
				}
				if bursts[cpu] == maxBursts {
					continue
				}
				bursts[cpu]++
				idle = false
				for _, m := range readers {
					if err := m.f.TryEmit(cpu, burst, size, 0); err != nil {
						t.Errorf("%s: %v", m.name, err)
						return
					}
				}
			}
			if idle {
				select {
				case <-quit:
					return
				case <-time.After(10 * time.Millisecond):
				}
			}
		}
	}()

	start := time.Now()
	for len(late) > 0 {
		n := min(batch, len(late))
		now := late[:n]
		late = late[n:]
		for _, cpu := range now {
			setOnline(t, cpu, true)
		}
		waitManyRings(t, readers, now)
		mu.Lock()
		ready = append(ready, now...)
		mu.Unlock()
	}
	elapsed := time.Since(start)
	stopEmit()
	n := 0
	for _, b := range bursts {
		n += b
	}
	t.Logf("all %d cpus online with rings in %v, while %d bursts of %d samples were emitted per reader",
		len(possible), elapsed.Round(time.Millisecond), n, burst)

	for _, m := range readers {
		for _, cpu := range possible {
			m.f.Emit(t, cpu, count, size, 0)
		}
	}
	waitDelivered(t, readers, possible)
	for _, m := range readers {
		m.stop()
	}
	checkMany(t, readers, possible, online)
}

// waitManyRings waits until every reader has one ring for each of cpus.
func waitManyRings(t *testing.T, readers []*manyReader, cpus []int) {
	t.Helper()
	for start := time.Now(); ; time.Sleep(5 * time.Millisecond) {
		missing := ""
		for _, m := range readers {
			have := ringCPUs(m.stats())
			for _, cpu := range cpus {
				if have[cpu] != 1 {
					missing = fmt.Sprintf("%s has %d rings for cpu %d", m.name, have[cpu], cpu)
				}
			}
		}
		if missing == "" {
			return
		}
		if time.Since(start) > manyNotice {
			t.Fatalf("%v after cpus %v came online: %s", manyNotice, cpus, missing)
		}
	}
}

// waitDelivered waits until each reader received or was told lost every
// sample its emitter attempted on cpus.
func waitDelivered(t *testing.T, readers []*manyReader, cpus []int) {
	t.Helper()
	for start := time.Now(); ; time.Sleep(10 * time.Millisecond) {
		behind := ""
		for _, m := range readers {
			st := m.f.Stats(t)
			for _, cpu := range cpus {
				if got := uint64(m.c.Count(cpu)) + m.lostCount(cpu); got < st[cpu].Seq {
					behind = fmt.Sprintf("%s: cpu %d: %d of %d", m.name, cpu, got, st[cpu].Seq)
				}
			}
		}
		if behind == "" {
			return
		}
		if time.Since(start) > manyNotice {
			t.Fatalf("not delivered %v after the last emit: %s (and maybe more)", manyNotice, behind)
		}
	}
}

// checkMany checks every reader's accounting on every CPU, logs a line per
// CPU, and checks that the CPUs that came online got rings after the
// first ones.
func checkMany(t *testing.T, readers []*manyReader, possible, online []int) {
	t.Helper()
	emitted := make([][]bpftest.EmitStats, len(readers))
	var total, lostTotal uint64
	for i, m := range readers {
		m.c.Check(t)
		emitted[i] = m.f.Stats(t)
		stats := m.stats()
		if len(stats.Rings) != len(possible) {
			t.Errorf("%s: %d rings, want %d (one per cpu)", m.name, len(stats.Rings), len(possible))
		}
		// The sums have the failures of CPUs without a ring too.
		if stats.Left != 0 || stats.Failed.Total() != 0 {
			t.Errorf("%s: Stats' sums say %d left, %d failed", m.name, stats.Left, stats.Failed.Total())
		}
		for j, st := range stats.Rings {
			if was := slices.Contains(online, st.CPU); was != (j < m.first) {
				t.Errorf("%s: ring %d is cpu %d's (online at New: %v), but New opened %d rings", m.name, j, st.CPU, was, m.first)
			}
			if st.Left != 0 || st.Failed.Total() != 0 {
				t.Errorf("%s: cpu %d: Stats say %d left, %d failed", m.name, st.CPU, st.Left, st.Failed.Total())
			}
		}
		m.c.CheckStats(t, stats.Rings)
	}
	for _, cpu := range possible {
		var line strings.Builder
		when := "late"
		if slices.Contains(online, cpu) {
			when = "at New"
		}
		fmt.Fprintf(&line, "cpu %2d (%s) emitted/received/lost:", cpu, when)
		for i, m := range readers {
			st := emitted[i][cpu]
			got, lost := uint64(m.c.Count(cpu)), m.lostCount(cpu)
			total += got
			lostTotal += lost
			fmt.Fprintf(&line, " %s %d/%d/%d", m.name, st.Emitted, got, lost)
			if got+lost != st.Seq || got != st.Emitted || lost != st.Failed {
				t.Errorf("%s: cpu %d: received %d lost %d, kernel says attempts %d emitted %d failed %d",
					m.name, cpu, got, lost, st.Seq, st.Emitted, st.Failed)
			}
			if st.Emitted == 0 {
				t.Errorf("%s: cpu %d emitted nothing", m.name, cpu)
			}
		}
		t.Log(line.String())
	}
	t.Logf("%d cpus (%d came online while reading), 3 readers: received %d, lost %d, accounting exact on every cpu: %v",
		len(possible), len(possible)-len(online), total, lostTotal, !t.Failed())
}

// cpuList formats cpus as the kernel does: "0-3,5".
func cpuList(cpus []int) string {
	var parts []string
	for i := 0; i < len(cpus); {
		j := i
		for j+1 < len(cpus) && cpus[j+1] == cpus[j]+1 {
			j++
		}
		if i == j {
			parts = append(parts, fmt.Sprint(cpus[i]))
		} else {
			parts = append(parts, fmt.Sprintf("%d-%d", cpus[i], cpus[j]))
		}
		i = j + 1
	}
	return strings.Join(parts, ",")
}

// TestLongOnlineList: every perf_buffer__new* of libbpf reads
// /sys/devices/system/cpu/online into a 128-byte buffer
// (parse_cpu_mask_file) and fails with E2BIG when the list is longer. Such
// lists are those of hosts with many CPUs and every other one offline (SMT
// off where siblings are numbered next to each other: "0,2,4,...", 201
// bytes with 128 CPUs). libbpf alone must fail there, and perfbuf's own
// opener then opens every ring: each reader must have a ring on every
// online CPU and account for every sample. With 64 possible CPUs no list
// reaches 128 bytes, and the test skips; BIG_CPUS=128 make vmtest64 runs
// it.
func TestLongOnlineList(t *testing.T) {
	if os.Getenv("PERFBUF_VMTEST") != "1" {
		t.Skip("takes CPUs offline: only inside a VM (make vmtest), never on the host")
	}
	bpftest.RequirePrivileges(t)
	possible, err := cpus.Possible()
	if err != nil {
		t.Fatal(err)
	}
	var odd []int
	for _, cpu := range possible {
		if cpu%2 == 1 {
			odd = append(odd, cpu)
		}
	}
	if n := len(cpuList(slices.DeleteFunc(slices.Clone(possible), func(c int) bool { return c%2 == 1 }))) + 1; n < 128 {
		t.Skipf("with every other one of %d cpus offline the online list is %d bytes, under libbpf's 128: needs more cpus (BIG_CPUS=128)", len(possible), n)
	}
	t.Cleanup(func() {
		for _, cpu := range odd {
			setOnline(t, cpu, true)
		}
	})
	for _, cpu := range odd {
		setOnline(t, cpu, false)
	}
	list, err := os.ReadFile("/sys/devices/system/cpu/online")
	if err != nil {
		t.Fatal(err)
	}
	online, err := cpus.Online()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("online list of %d bytes: %s", len(list), strings.TrimSpace(string(list)))
	checkLibbpfRefuses(t, len(list))

	before := kernel.OpenedPerfRings()
	opts := perfbuf.Options{RingBytes: 64 << 10}
	readers := []*manyReader{
		openCallback(t, opts),
		openReader(t, "fullest", perfbuf.ReaderOptions{Options: opts}),
		openReader(t, "ordered", perfbuf.ReaderOptions{Options: opts, Order: &perfbuf.Order{KeyOffset: 8}}),
	}
	if n := kernel.OpenedPerfRings() - before; n != uint64(len(readers)*len(online)) {
		t.Errorf("perfbuf's opener opened %d rings, want every ring of the %d readers on %d cpus", n, len(readers), len(online))
	}
	for _, m := range readers {
		m.first = len(m.stats().Rings)
		m.f.CPUs = online
		for _, cpu := range online {
			m.f.Emit(t, cpu, count, size, 0)
		}
	}
	waitDelivered(t, readers, online)
	for _, m := range readers {
		m.stop()
		m.c.CheckAccounting(t, m.f)
		m.c.CheckStats(t, m.stats().Rings)
		if m.first != len(online) {
			t.Errorf("%s: %d rings, want one per online cpu (%d)", m.name, m.first, len(online))
		}
	}
}

// checkLibbpfRefuses checks that libbpf's own perf_buffer__new (through
// libbpfgo, as its users call it) fails with E2BIG on this host, whose
// online list is n bytes long: where perfbuf opens its rings itself.
func checkLibbpfRefuses(t *testing.T, n int) {
	t.Helper()
	f := bpftest.Setup(t, obj)
	pb, err := f.Mod.InitPerfBuf("events", make(chan []byte, 1), make(chan uint64, 1), 8)
	if err == nil {
		pb.Close()
		t.Fatalf("libbpf opened a perf buffer with a %d-byte online list: has its 128-byte limit gone?", n)
	}
	if !errors.Is(err, syscall.E2BIG) {
		t.Fatalf("libbpf alone, %d-byte online list: %v, want E2BIG", n, err)
	}
	t.Logf("libbpf alone, %d-byte online list: %v", n, err)
}
