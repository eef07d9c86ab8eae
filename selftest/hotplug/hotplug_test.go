// SPDX-License-Identifier: Apache-2.0

// Privileged selftests of CPUs that come online after New, in every mode:
// a CPU is taken offline, the rings are opened, the CPU is brought online,
// and samples emitted on it must all arrive, none twice. Hotplug changes the
// machine, so these run only inside a VM (scripts/vmtest.sh sets
// PERFBUF_VMTEST=1), never on the host.
package hotplug

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/perfbuf/perfbuf"
	"github.com/perfbuf/perfbuf/internal/cpus"
	"github.com/perfbuf/perfbuf/selftest/internal/bpftest"
)

const obj = "bpf/hotplug.bpf.o"

// Each test emits this many samples on every CPU, of this size.
const (
	count = 40
	size  = 64
)

// notice bounds how long a CPU that came online may go without a ring.
const notice = 10 * time.Second

// setup loads the emitter and picks the CPU to unplug: the highest online
// one (CPU 0 cannot always go offline). It skips outside a VM.
func setup(t *testing.T) (*bpftest.Fixture, int) {
	t.Helper()
	if os.Getenv("PERFBUF_VMTEST") != "1" {
		t.Skip("takes a CPU offline: only inside a VM (make vmtest), never on the host")
	}
	f := bpftest.Setup(t, obj)
	if len(f.CPUs) < 2 {
		t.Fatalf("online cpus %v: need two", f.CPUs)
	}
	cpu := f.CPUs[len(f.CPUs)-1]
	t.Cleanup(func() { setOnline(t, cpu, true) })
	return f, cpu
}

// setOnline brings cpu online or takes it offline, and checks that it did.
func setOnline(t *testing.T, cpu int, on bool) {
	t.Helper()
	val := map[bool]string{true: "1", false: "0"}[on]
	path := "/sys/devices/system/cpu/cpu" + strconv.Itoa(cpu) + "/online"
	if cur, err := os.ReadFile(path); err == nil && string(cur[:1]) == val {
		return
	}
	if err := os.WriteFile(path, []byte(val), 0); err != nil {
		t.Fatalf("cpu %d online=%s: %v", cpu, val, err)
	}
	online, err := cpus.Online()
	if err != nil {
		t.Fatal(err)
	}
	if slices.Contains(online, cpu) != on {
		t.Fatalf("cpu %d online=%s, but online cpus are %v", cpu, val, online)
	}
}

// emitAll emits n samples on every CPU of f.
func emitAll(t *testing.T, f *bpftest.Fixture, n uint64) {
	t.Helper()
	for _, cpu := range f.CPUs {
		f.Emit(t, cpu, n, size, 0)
	}
}

// hasRing reports whether one of stats' rings is cpu's, and how many
// rings are.
func hasRing(stats perfbuf.Stats, cpu int) (bool, int) {
	n := 0
	for _, st := range stats.Rings {
		if st.CPU == cpu {
			n++
		}
	}
	return n > 0, n
}

// waitRings waits until stats (a reader's, read by another goroutine) hold
// want rings for cpu.
func waitRings(t *testing.T, stats func() perfbuf.Stats, cpu, want int) {
	t.Helper()
	for start := time.Now(); ; time.Sleep(5 * time.Millisecond) {
		if _, n := hasRing(stats(), cpu); n == want {
			t.Logf("cpu %d: %d ring(s) %v after it came online", cpu, n, time.Since(start).Round(time.Millisecond))
			return
		}
		if time.Since(start) > notice {
			t.Fatalf("cpu %d has no new ring %v after it came online", cpu, notice)
		}
	}
}

// TestHotplugCallback: Poll, blocked when the CPU comes online, returns and
// opens its ring; Consume delivers what is then emitted on it.
func TestHotplugCallback(t *testing.T) {
	f, cpu := setup(t)
	setOnline(t, cpu, false)
	c := bpftest.NewCollector()
	pb, err := perfbuf.New(f.Events, c.Sample, c.LostFn, perfbuf.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer pb.Close()
	if ok, _ := hasRing(pb.Stats(), cpu); ok {
		t.Fatalf("cpu %d offline at New has a ring", cpu)
	}
	before := pb.BufferCount()

	polled := make(chan error, 1)
	go func() {
		_, err := pb.Poll(-1)
		polled <- err
	}()
	time.Sleep(50 * time.Millisecond) // let it block
	setOnline(t, cpu, true)
	select {
	case err := <-polled:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(notice):
		t.Fatalf("a Poll blocked when cpu %d came online did not return in %v", cpu, notice)
	}
	if n := pb.BufferCount(); n != before+1 {
		t.Fatalf("%d rings after cpu %d came online, want %d", n, cpu, before+1)
	}
	if got := pb.Stats().Rings[before].CPU; got != cpu {
		t.Errorf("ring %d is cpu %d's, want cpu %d's", before, got, cpu)
	}
	emitAll(t, f, count)
	if _, err := pb.Consume(); err != nil {
		t.Fatal(err)
	}
	c.CheckAccounting(t, f)
	c.CheckStats(t, pb.Stats().Rings)
	if c.Samples[cpu] != count {
		t.Errorf("cpu %d: %d samples, want %d", cpu, c.Samples[cpu], count)
	}
}

// TestHotplugRaw: in raw mode Wait opens the new CPU's ring (Wait(0, nil),
// as a caller that waits on EpollFD does); BufferCount opens nothing.
func TestHotplugRaw(t *testing.T) {
	f, cpu := setup(t)
	setOnline(t, cpu, false)
	pb, err := perfbuf.NewRaw(f.Events, perfbuf.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer pb.Close()
	before := pb.BufferCount()
	setOnline(t, cpu, true)
	for start := time.Now(); pb.BufferCount() == before; time.Sleep(5 * time.Millisecond) {
		if time.Since(start) > notice {
			t.Fatalf("no ring for cpu %d %v after it came online", cpu, notice)
		}
		if _, err := pb.Wait(0, nil); err != nil {
			t.Fatal(err)
		}
	}
	emitAll(t, f, count)
	c := bpftest.NewCollector()
	for i := 0; i < pb.BufferCount(); i++ {
		rb, err := pb.Buffer(i)
		if err != nil {
			t.Fatal(err)
		}
		_, err = rb.Drain(func(rec *perfbuf.Record) error {
			switch rec.Type {
			case perfbuf.RecordSample:
				c.Sample(rec.CPU, rec.AppendTo(nil))
			case perfbuf.RecordLost:
				c.LostFn(rec.CPU, rec.Lost)
			}
			return nil
		})
		rb.Release()
		if err != nil {
			t.Fatal(err)
		}
	}
	c.CheckAccounting(t, f)
}

// readAll runs r.Each into c on a goroutine until the returned stop is
// called.
func readAll(t *testing.T, r *perfbuf.Reader, c *bpftest.Collector) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		err := r.Each(ctx, func(rec *perfbuf.Record) error {
			switch rec.Type {
			case perfbuf.RecordSample:
				c.Sample(rec.CPU, rec.AppendTo(nil))
			case perfbuf.RecordLost:
				c.LostFn(rec.CPU, rec.Lost)
			}
			return nil
		})
		if !errors.Is(err, context.Canceled) {
			t.Errorf("Each: %v", err)
		}
	}()
	return func() { cancel(); wg.Wait() }
}

// waitSamples waits until c holds want samples of cpu.
func waitSamples(t *testing.T, c *bpftest.Collector, cpu, want int) {
	t.Helper()
	for start := time.Now(); ; time.Sleep(5 * time.Millisecond) {
		c.Check(t)
		if c.Count(cpu) >= want {
			return
		}
		if time.Since(start) > notice {
			t.Fatalf("cpu %d: %d samples of %d after %v", cpu, c.Count(cpu), want, notice)
		}
	}
}

// TestHotplugReaders: a Reader, fullest-first and ordered, reading while the
// CPU comes online, takes its ring in and delivers its samples.
func TestHotplugReaders(t *testing.T) {
	for _, ord := range []*perfbuf.Order{nil, {KeyOffset: 8}} { // emit_hdr.ts
		t.Run(fmt.Sprintf("ordered=%v", ord != nil), func(t *testing.T) {
			f, cpu := setup(t)
			setOnline(t, cpu, false)
			r, err := perfbuf.NewReader(f.Events, perfbuf.ReaderOptions{Order: ord})
			if err != nil {
				t.Fatal(err)
			}
			defer r.Close()
			c := bpftest.NewCollector()
			stop := readAll(t, r, c)
			setOnline(t, cpu, true)
			waitRings(t, r.Stats, cpu, 1)
			emitAll(t, f, count)
			for _, k := range f.CPUs {
				waitSamples(t, c, k, count)
			}
			stop()
			c.CheckAccounting(t, f)
		})
	}
}

// TestHotplugBack: a CPU that goes offline with samples in its ring and
// comes back gets a second ring; the first is still drained, and every
// sample arrives once, in order (callback mode drains the older ring first;
// the ordered Reader merges by time).
func TestHotplugBack(t *testing.T) {
	for _, mode := range []string{"callback", "ordered"} {
		t.Run(mode, func(t *testing.T) {
			f, cpu := setup(t)
			c := bpftest.NewCollector()
			var stats func() perfbuf.Stats
			var consume func()
			switch mode {
			case "callback":
				pb, err := perfbuf.New(f.Events, c.Sample, c.LostFn, perfbuf.Options{})
				if err != nil {
					t.Fatal(err)
				}
				defer pb.Close()
				consume = func() {
					if _, err := pb.Consume(); err != nil {
						t.Fatal(err)
					}
				}
				stats = func() perfbuf.Stats { consume(); return pb.Stats() }
			case "ordered":
				r, err := perfbuf.NewReader(f.Events, perfbuf.ReaderOptions{Order: &perfbuf.Order{KeyOffset: 8}})
				if err != nil {
					t.Fatal(err)
				}
				defer r.Close()
				defer readAll(t, r, c)()
				stats, consume = r.Stats, func() {}
			}
			emitAll(t, f, count/2) // left in the ring while the CPU goes down
			setOnline(t, cpu, false)
			setOnline(t, cpu, true)
			waitRings(t, stats, cpu, 2)
			emitAll(t, f, count/2)
			consume()
			for _, k := range f.CPUs {
				waitSamples(t, c, k, count)
			}
			c.CheckAccounting(t, f)
		})
	}
}
