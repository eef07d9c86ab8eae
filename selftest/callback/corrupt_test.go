// SPDX-License-Identifier: Apache-2.0

package callback

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"strings"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/perfbuf/perfbuf"
	"github.com/perfbuf/perfbuf/selftest/internal/bpftest"
	"golang.org/x/sys/unix"
)

// corruptCases corrupt a real ring through a second, writable mapping of its
// header page, as any process with the ring's fd can: data_tail pointed into
// a sample's payload (the emitter's bytes past 32 are i*7, so the header read
// there has a size that is 6 mod 8), or data_head and data_tail moved where
// the kernel never puts them. libbpf's own parser hangs or crashes on such
// rings; callback mode must report ErrCorrupt, count it, and go on.
var corruptCases = []struct {
	name string
	// corrupt writes the header page; tail and head are the ring's
	// positions before it, with 4 samples of 64 bytes in between.
	corrupt func(page *unix.PerfEventMmapPage, tail, head uint64)
	// kept is how many of the 4 samples survive: a bad head is passed
	// over, a bad tail skips what was behind it.
	kept int
}{
	{"tail into a payload", func(p *unix.PerfEventMmapPage, tail, _ uint64) {
		atomic.StoreUint64(&p.Data_tail, tail+12+36) // header + u32 size + payload byte 36
	}, 0},
	{"tail unaligned", func(p *unix.PerfEventMmapPage, tail, _ uint64) {
		atomic.StoreUint64(&p.Data_tail, tail+4)
	}, 0},
	{"tail past the head", func(p *unix.PerfEventMmapPage, _, head uint64) {
		atomic.StoreUint64(&p.Data_tail, head+64)
	}, 0},
	{"head far ahead", func(p *unix.PerfEventMmapPage, tail, _ uint64) {
		atomic.StoreUint64(&p.Data_head, tail+1<<20)
	}, 4},
	{"head unaligned", func(p *unix.PerfEventMmapPage, _, head uint64) {
		atomic.StoreUint64(&p.Data_head, head+4)
	}, 4},
	{"head behind the tail", func(p *unix.PerfEventMmapPage, tail, _ uint64) {
		atomic.StoreUint64(&p.Data_head, tail-64)
	}, -1}, // the reader resyncs to that head and skips to the kernel's: not counted
}

// TestCorruptRingCallback runs each case in a child process (this test
// binary again), so that a regression that crashes or hangs the parser
// fails the case instead of the whole run.
func TestCorruptRingCallback(t *testing.T) {
	if name := os.Getenv("PERFBUF_CORRUPT_CASE"); name != "" {
		for _, c := range corruptCases {
			if c.name == name {
				corruptCase(t, c.corrupt, c.kept)
				return
			}
		}
		t.Fatalf("no case %q", name)
	}
	bpftest.RequirePrivileges(t)
	for _, c := range corruptCases {
		t.Run(c.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestCorruptRingCallback$", "-test.v", "-test.count=1")
			cmd.Env = append(os.Environ(), "PERFBUF_CORRUPT_CASE="+c.name)
			out, err := cmd.CombinedOutput()
			if ctx.Err() != nil {
				t.Fatalf("child hung for a minute:\n%s", out)
			}
			if err != nil || !strings.Contains(string(out), "--- PASS") {
				t.Fatalf("child: %v\n%s", err, out)
			}
			for _, line := range strings.Split(string(out), "\n") {
				if strings.Contains(line, "corrupt_test.go") {
					t.Log(strings.TrimSpace(line)) // what the child logged
				}
			}
		})
	}
}

// corruptCase emits 4 samples on one CPU, corrupts its ring's header page,
// and checks that Consume reports the corruption once and that the ring
// goes on: the samples that survive, then new ones, all arrive.
func corruptCase(t *testing.T, corrupt func(*unix.PerfEventMmapPage, uint64, uint64), kept int) {
	f := setup(t)
	cpu := f.CPUs[0]
	var got int
	pb := newPB(t, f, func(c int, data []byte) {
		if c != cpu {
			t.Errorf("sample from cpu %d", c)
		}
		got++
	}, nil, ringOpts(2))
	fd, err := pb.BufferFD(0)
	if err != nil {
		t.Fatal(err)
	}
	// A second mapping of the ring must have the first one's size.
	mem, err := unix.Mmap(fd, 0, 3*os.Getpagesize(), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		t.Fatalf("map the ring again: %v", err)
	}
	defer unix.Munmap(mem)
	page := (*unix.PerfEventMmapPage)(unsafe.Pointer(&mem[0]))

	f.Emit(t, cpu, 4, 64, 0)
	tail, head := atomic.LoadUint64(&page.Data_tail), atomic.LoadUint64(&page.Data_head)
	if head-tail != 4*uint64(bpftest.RecordSize(64)) {
		t.Fatalf("ring holds %d bytes, want 4 samples", head-tail)
	}
	corrupt(page, tail, head)

	consume := func() error {
		var err error
		if !finishes(10*time.Second, func() { _, err = pb.Consume() }) {
			t.Fatal("Consume hung on the corrupt ring") // the child's exit reports it
		}
		return err
	}
	var ce *perfbuf.CorruptError
	if err := consume(); !errors.Is(err, perfbuf.ErrCorrupt) || !errors.As(err, &ce) || ce.CPU != cpu {
		t.Fatalf("Consume = %v; want a *CorruptError for cpu %d", err, cpu)
	}
	t.Logf("reported: %v", ce)
	if err := consume(); err != nil {
		t.Fatalf("second Consume = %v: reported more than once", err)
	}

	// The kernel's next write: the samples kept and the new ones arrive.
	f.Emit(t, cpu, 10, 64, 0)
	for try := 0; try < 3; try++ {
		if err := consume(); err == nil {
			break
		} else if kept >= 0 || !errors.Is(err, perfbuf.ErrCorrupt) {
			t.Fatalf("Consume after the kernel's write = %v", err)
		} // a resync to a head behind the tail lands on what the kernel never wrote
	}
	if kept >= 0 && got != kept+10 {
		t.Fatalf("%d samples after the kernel's write, want %d kept and 10 new", got, kept)
	}
	// And from then on, exactly.
	before := got
	f.Emit(t, cpu, 10, 64, 0)
	if err := consume(); err != nil || got-before != 10 {
		t.Fatalf("then %d samples, %v; want 10", got-before, err)
	}
	// (That a bad head skipped no genuine bytes is the kept samples'
	// arrival, checked above.)
	st := pb.Stats().Rings[0]
	if st.Corrupt < 1 || (kept >= 0 && st.Corrupt != 1) || st.Samples != uint64(got) {
		t.Fatalf("stats %+v; want the corruption counted once, %d samples", st, got)
	}
}
