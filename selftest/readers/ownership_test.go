// SPDX-License-Identifier: Apache-2.0

package readers

import (
	"errors"
	"fmt"
	"runtime"
	"sync/atomic"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/rlimit"
	"github.com/perfbuf/perfbuf"
	"github.com/perfbuf/perfbuf/internal/bpfrun"
	"github.com/perfbuf/perfbuf/internal/cpus"
	"github.com/perfbuf/perfbuf/selftest/internal/bpftest"
	"golang.org/x/sys/unix"
)

// A map kind of the ownership test: a map of readers.bpf.o (loaded by
// cilium/ebpf, as its users do) and a raw_tp program that writes n samples
// into it on a CPU.
type ownedKind struct {
	name, m, prog string
	produce       func(progFD, cpu int, n uint64) error
}

var ownedKinds = []ownedKind{
	{"perf event array", "events", "emit", func(prog, cpu int, n uint64) error {
		return bpfrun.Emit(prog, cpu, n, 64, 0)
	}},
	{"ring buffer", "rb_events", "produce_rb", func(prog, cpu int, n uint64) error {
		ret, err := bpfrun.Run(prog, cpu, n)
		if err == nil && ret != 0 {
			err = fmt.Errorf("produce_rb on cpu %d returned %d", cpu, ret)
		}
		return err
	}},
}

// An owner opened by the ownership test: how many samples it delivered,
// a drain of every ring, and its Close.
type ownedReader struct {
	pb      *perfbuf.PerfBuffer // New's; nil for a Reader
	drain   func() error
	samples func() int
	close   func() error
}

func openOwned(t *testing.T, ctor string, m perfbuf.Map) *ownedReader {
	t.Helper()
	var n atomic.Int64
	o := &ownedReader{samples: func() int { return int(n.Load()) }}
	switch ctor {
	case "New":
		pb, err := perfbuf.New(m, func(int, []byte) { n.Add(1) }, nil, perfbuf.Options{})
		if err != nil {
			t.Fatal(err)
		}
		o.pb, o.close = pb, pb.Close
		o.drain = func() error { _, err := pb.Consume(); return err }
	case "NewReader":
		r, err := perfbuf.NewReader(m, perfbuf.ReaderOptions{})
		if err != nil {
			t.Fatal(err)
		}
		o.close = r.Close
		o.drain = func() error {
			_, err := r.Consume(func(rec *perfbuf.Record) error {
				if rec.Type == perfbuf.RecordSample {
					n.Add(1)
				}
				return nil
			})
			return err
		}
	}
	return o
}

// Every map a reader uses after New or NewReader returns is a descriptor
// of its own. The caller's descriptor is lost under an open reader (closed
// by the caller, as closing a libbpfgo module does, or by the garbage
// collector, as for a dropped *ebpf.Map passed as MapFD(m.FD())), and a
// hash map takes its number: the reader keeps reading, its ring buffer's
// BufferFD and EpollFD are still its ring's, and its Close takes the
// rings out of the real map and leaves the hash map's entries alone.
// (Close deleted the hash map's keys 0..N-1, and EpollFD failed.)
func TestCallerDescriptorLost(t *testing.T) {
	bpftest.RequirePrivileges(t)
	// Before 5.11 the kernel charges maps to RLIMIT_MEMLOCK; cilium/ebpf
	// loads the object here, and raises the limit only where it must.
	if err := rlimit.RemoveMemlock(); err != nil {
		t.Fatal(err)
	}
	online, err := cpus.Online()
	if err != nil {
		t.Fatal(err)
	}
	possible, err := cpus.Possible()
	if err != nil {
		t.Fatal(err)
	}
	for _, kind := range ownedKinds {
		for _, ctor := range []string{"New", "NewReader"} {
			for _, how := range []string{"closed", "collected"} {
				t.Run(fmt.Sprintf("%s/%s/%s", kind.name, ctor, how), func(t *testing.T) {
					callerLost(t, kind, ctor, how, online, len(possible))
				})
			}
		}
	}
}

func callerLost(t *testing.T, kind ownedKind, ctor, how string, online []int, possible int) {
	coll, err := ebpf.LoadCollection(obj)
	if err != nil {
		t.Fatalf("load %s: %v (run `make bpf`)", obj, err)
	}
	defer coll.Close()
	prog := coll.Programs[kind.prog].FD()
	events := coll.DetachMap(kind.m)
	fd := events.FD()
	info, err := events.Info()
	if err != nil {
		t.Fatal(err)
	}
	id, _ := info.ID()

	o := openOwned(t, ctor, perfbuf.MapFD(fd))
	defer o.close()
	produce := func(n uint64) {
		t.Helper()
		for _, cpu := range online {
			if err := kind.produce(prog, cpu, n); err != nil {
				t.Fatal(err)
			}
		}
	}
	produce(5)
	if err := o.drain(); err != nil {
		t.Fatal(err)
	}
	if got, want := o.samples(), 5*len(online); got != want {
		t.Fatalf("%d samples before the caller's descriptor was lost, want %d", got, want)
	}

	// The caller's descriptor goes. The program keeps the map itself.
	switch how {
	case "closed":
		if err := events.Close(); err != nil {
			t.Fatal(err)
		}
	case "collected":
		events = nil
		for i := 0; ; i++ {
			runtime.GC()
			if _, err := unix.FcntlInt(uintptr(fd), unix.F_GETFD, 0); errors.Is(err, unix.EBADF) {
				break
			}
			if i == 100 {
				t.Fatalf("fd %d still open after %d garbage collections", fd, i)
			}
		}
	}
	// A hash map takes the number, with an entry at every CPU's key.
	hash, err := ebpf.NewMap(&ebpf.MapSpec{Type: ebpf.Hash, KeySize: 4, ValueSize: 4, MaxEntries: uint32(possible)})
	if err != nil {
		t.Fatal(err)
	}
	defer hash.Close()
	if hash.FD() != fd {
		// Another file of the process may take the number first (an open
		// on another thread): dup3 would close that file, or fail with
		// EBUSY while its open is under way (vmtest, 6.12, a CPU
		// offline). F_DUPFD takes the lowest free number from fd on and
		// closes nothing; if another file holds fd, that file is the new
		// object at the caller's number, as good for the test.
		got, err := unix.FcntlInt(uintptr(hash.FD()), unix.F_DUPFD_CLOEXEC, fd)
		if err != nil {
			t.Fatal(err)
		}
		if got == fd {
			defer unix.Close(fd)
		} else {
			unix.Close(got)
			t.Logf("fd %d: another file of the process took the number first", fd)
		}
	}
	for k := range uint32(possible) {
		if err := hash.Put(k, k+100); err != nil {
			t.Fatal(err)
		}
	}

	produce(7)
	if err := o.drain(); err != nil {
		t.Fatal(err)
	}
	if got, want := o.samples(), 12*len(online); got != want {
		t.Errorf("%d samples after the caller's descriptor was lost, want %d", got, want)
	}
	if o.pb != nil && kind.name == "ring buffer" {
		checkRingBufFDs(t, o.pb, id)
	}
	if err := o.close(); err != nil {
		t.Fatal(err)
	}

	for k := range uint32(possible) {
		var v uint32
		if err := hash.Lookup(k, &v); err != nil || v != k+100 {
			t.Errorf("the hash map at the caller's old fd %d: key %d = %d, %v after Close; want %d", fd, k, v, err, k+100)
		}
	}
	if kind.name == "perf event array" {
		// Close emptied the real map's slots: outputs now fail (ENOENT).
		var before, after []bpfrun.EmitStats
		stats := coll.Maps["emit_stats"]
		if err := stats.Lookup(uint32(0), &before); err != nil {
			t.Fatal(err)
		}
		produce(1)
		if err := stats.Lookup(uint32(0), &after); err != nil {
			t.Fatal(err)
		}
		for _, cpu := range online {
			if d := after[cpu].Sub(before[cpu]); d.Failed != 1 {
				t.Errorf("cpu %d: an output after Close: %+v, want it failed (no ring in the slot)", cpu, d)
			}
		}
	}
	runtime.KeepAlive(hash)
}

// checkRingBufFDs checks that a PerfBuffer's ring buffer descriptor is
// still the ring buffer with map ID id, and that EpollFD can be made over
// it.
func checkRingBufFDs(t *testing.T, pb *perfbuf.PerfBuffer, id ebpf.MapID) {
	t.Helper()
	bfd, err := pb.BufferFD(0)
	if err != nil {
		t.Fatal(err)
	}
	dup, err := unix.FcntlInt(uintptr(bfd), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		t.Fatalf("BufferFD(0) = %d: %v", bfd, err)
	}
	m, err := ebpf.NewMapFromFD(dup)
	if err != nil {
		unix.Close(dup)
		t.Fatalf("BufferFD(0) = %d: %v", bfd, err)
	}
	defer m.Close()
	info, err := m.Info()
	if err != nil {
		t.Fatal(err)
	}
	if got, _ := info.ID(); got != id || info.Type != ebpf.RingBuf {
		t.Errorf("BufferFD(0) = %d is map %d of type %v, want the ring buffer %d", bfd, got, info.Type, id)
	}
	if _, err := pb.EpollFD(); err != nil {
		t.Errorf("EpollFD: %v", err)
	}
}
