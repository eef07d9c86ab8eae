package perfbuf

// Tests of the rings added for CPUs that come online after New, over fake
// rings: the uevents' parser, and PerfBuffer and both Reader policies
// taking a new ring in. The kernel's side (uevents, a CPU brought online in
// a VM) is selftest/hotplug's.

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"slices"
	"testing"
	"time"
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
		cpu, ok := parseCPUOnline([]byte(msg))
		if got := map[bool]int{true: cpu, false: -1}[ok]; got != want {
			t.Errorf("%q: cpu %d, %v; want %d", msg, cpu, ok, want)
		}
	}
}

// TestHotplugPerfBuffer: a Poll blocked when a CPU comes online returns,
// the next drain reads the CPU's new ring, and a CPU that comes back gets a
// second ring while its first is still drained; nothing is delivered twice.
func TestHotplugPerfBuffer(t *testing.T) {
	f := newFakeRings(t, 2, 4096)
	spare := newFakeRings(t, 2, 4096)
	spare.cpus = []int{2, 1} // CPU 2 comes online, then CPU 1 comes back
	var got []string
	pb := f.newPerfBuffer(t, f.hotRings(t, 4, spare), Options{SampleFunc: func(cpu int, data []byte) {
		got = append(got, fmt.Sprintf("cpu%d:%d", cpu, binary.NativeEndian.Uint64(data[8:])))
	}})

	done := make(chan error)
	go func() {
		_, err := pb.Poll(-1)
		done <- err
	}()
	time.Sleep(10 * time.Millisecond) // let it block
	pb.c.src.watch.note(2)
	pb.c.src.watch.note(7) // past the limit: no ring
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Poll blocked when a CPU came online")
	}
	if n := pb.BufferCount(); n != 3 {
		t.Fatalf("%d rings after CPU 2 came online, want 3", n)
	}
	if cpu := pb.Stats()[2].CPU; cpu != 2 {
		t.Errorf("ring 2 on cpu %d", cpu)
	}
	spare.emit(t, 0, 0, 20, 16)
	spare.wake(0)
	if n, err := pb.Poll(time.Second); n != 1 || err != nil {
		t.Fatalf("Poll: %d, %v; want CPU 2's sample", n, err)
	}

	// CPU 1 goes offline with a sample in its ring and comes back: its
	// first ring is drained at the next Consume, its second from then on.
	f.emit(t, 1, 0, 11, 16)
	pb.c.src.watch.note(1)
	spare.emit(t, 1, 0, 12, 16)
	if n, err := pb.Consume(); n != 2 || err != nil {
		t.Fatalf("Consume: %d, %v; want the old and the new ring's samples", n, err)
	}
	if want := []string{"cpu2:20", "cpu1:11", "cpu1:12"}; !slices.Equal(got, want) {
		t.Errorf("delivered %v, want %v", got, want)
	}
	var cpus []int
	var samples []uint64
	for _, st := range pb.Stats() {
		cpus, samples = append(cpus, st.CPU), append(samples, st.Samples)
	}
	if !slices.Equal(cpus, []int{0, 1, 2, 1}) || !slices.Equal(samples, []uint64{0, 1, 1, 1}) {
		t.Errorf("stats: cpus %v samples %v; want cpus [0 1 2 1] samples [0 1 1 1]", cpus, samples)
	}
}

// TestHotplugReader: both policies take a CPU's new ring in while a read
// blocks, and deliver its samples.
func TestHotplugReader(t *testing.T) {
	for _, ord := range []*Order{nil, {KeyOffset: 0, MaxDelay: time.Millisecond}} {
		t.Run(fmt.Sprintf("ordered=%v", ord != nil), func(t *testing.T) {
			f := newFakeRings(t, 2, 4096)
			spare := newFakeRings(t, 1, 4096)
			spare.cpus = []int{3}
			owner := f.hotRings(t, 4, spare)
			r, err := f.newReader(t, owner, Options{Order: ord, MaxLatency: -1})
			if err != nil {
				t.Fatal(err)
			}
			defer r.Close()

			done := make(chan error, 1)
			var s Sample
			go func() { done <- r.ReadInto(&s) }()
			time.Sleep(10 * time.Millisecond) // let it block
			owner.watch.note(3)
			// The read takes the ring in, finds it empty and waits on.
			time.Sleep(10 * time.Millisecond)
			spare.emit(t, 0, 5, 33, 16)
			spare.wake(0)
			select {
			case err := <-done:
				if err != nil || s.CPU != 3 || binary.NativeEndian.Uint64(s.Data[8:]) != 33 {
					t.Fatalf("read %v: %+v; want CPU 3's sample 33", err, s)
				}
			case <-time.After(5 * time.Second):
				t.Fatal("the sample of the CPU that came online never came")
			}
			// A read that waits commits and publishes what was delivered.
			r.SetDeadline(time.Now().Add(10 * time.Millisecond))
			if err := r.ReadInto(&s); !errors.Is(err, os.ErrDeadlineExceeded) {
				t.Fatalf("read: %v, want the deadline", err)
			}
			st := r.Stats()
			if len(st) != 3 || st[2].CPU != 3 || st[2].Samples != 1 {
				t.Errorf("stats %+v; want a third entry, CPU 3, 1 sample", st)
			}
		})
	}
}
