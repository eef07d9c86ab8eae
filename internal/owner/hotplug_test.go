// SPDX-License-Identifier: Apache-2.0

package owner

// Tests of the rings added for CPUs that come online after New, over fake
// rings: PerfBuffer and both Reader policies taking a new ring in. The
// uevents are internal/kernel's tests; the kernel's side (a CPU brought
// online in a VM) is selftest/hotplug's.

import (
	"encoding/binary"
	"errors"
	"fmt"
	"github.com/perfbuf/perfbuf/internal/policy"
	"os"
	"slices"
	"testing"
	"time"
)

// TestHotplugPerfBuffer: a Poll blocked when a CPU comes online returns,
// the next drain reads the CPU's new ring, and a CPU that comes back gets a
// second ring while its first is still drained; nothing is delivered twice.
func TestHotplugPerfBuffer(t *testing.T) {
	f := newFakeRings(t, 2, 4096)
	spare := newFakeRings(t, 2, 4096)
	spare.cpus = []int{2, 1} // CPU 2 comes online, then CPU 1 comes back
	var got []string
	pb := f.perfBuffer(t, f.hotRings(t, 4, spare), func(cpu int, data []byte) {
		got = append(got, fmt.Sprintf("cpu%d:%d", cpu, binary.NativeEndian.Uint64(data[8:])))
	}, nil)

	done := make(chan error)
	go func() {
		_, err := pb.Poll(-1)
		done <- err
	}()
	time.Sleep(10 * time.Millisecond) // let it block
	pb.C.src.(*rings).watch.Note(2)
	pb.C.src.(*rings).watch.Note(7) // past the limit: no ring
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
	pb.C.src.(*rings).watch.Note(1)
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
	for _, ord := range []*policy.OrderConfig{nil, order(time.Millisecond)} {
		t.Run(fmt.Sprintf("ordered=%v", ord != nil), func(t *testing.T) {
			f := newFakeRings(t, 2, 4096)
			spare := newFakeRings(t, 1, 4096)
			spare.cpus = []int{3}
			owner := f.hotRings(t, 4, spare)
			r := f.reader(t, owner, Plan{Order: ord, Latency: -1})

			done := make(chan error, 1)
			var s Sample
			go func() { done <- r.ReadInto(&s) }()
			time.Sleep(10 * time.Millisecond) // let it block
			owner.watch.Note(3)
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

// A CPU that comes online during an ordered Reader's run ends the run: the
// run's records went by rule 1, which now waits for the new ring too, and
// its earlier key goes first. (ReadInto continues a run record by record,
// and went on past the new ring before the run was ended there.)
func TestHotplugOrderedRun(t *testing.T) {
	f := newFakeRings(t, 2, 4096)
	spare := newFakeRings(t, 1, 4096)
	spare.cpus = []int{3}
	owner := f.hotRings(t, 4, spare)
	r := f.reader(t, owner, Plan{Order: order(time.Hour), Latency: -1})
	for seq, key := range []uint64{10, 20, 30} {
		f.emit(t, 0, key, uint64(seq), 16)
	}
	f.emit(t, 1, 100, 3, 16)
	r.SetDeadline(time.Now().Add(5 * time.Second))
	var s Sample
	if err := r.ReadInto(&s); err != nil || s.Key != 10 {
		t.Fatalf("first read: %v, key %d; want 10", err, s.Key)
	}
	spare.emit(t, 0, 5, 4, 16)
	owner.watch.Note(3)
	r.SetDeadline(time.Now().Add(300 * time.Millisecond))
	// (Late: behind the 10 delivered before the CPU came.)
	if err := r.ReadInto(&s); err != nil || s.Key != 5 || s.CPU != 3 {
		t.Fatalf("read after CPU 3 came online: %v, key %d of CPU %d; want CPU 3's 5, before ring 0's 20", err, s.Key, s.CPU)
	}
}
