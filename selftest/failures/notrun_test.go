// SPDX-License-Identifier: Apache-2.0

package failures

import (
	"encoding/binary"
	"errors"
	"os"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"github.com/aquasecurity/libbpfgo"
	"github.com/perfbuf/perfbuf"
	"github.com/perfbuf/perfbuf/internal/kernel"
	"github.com/perfbuf/perfbuf/selftest/internal/bpftest"
)

// The runs of Options.Programs that the kernel skipped are in Stats, as
// NotRun: notrun.bpf.c makes one record, and one run of its inner
// program skipped, for each getppid of this process. The kernel counts
// those from 6.7 (trace_call_bpf's misses); an older one skips them all
// the same and counts none, and so does Stats. Stats' count is checked
// against the kernel's, read apart; it is in the sums, in no ring's entry.
func TestProgramsNotRun(t *testing.T) {
	m := bpftest.Load(t, "bpf/notrun.bpf.o")
	if _, err := os.Stat("/sys/bus/event_source/devices/kprobe"); err != nil {
		// Not a privilege: the kernel (or a sandbox) has no kprobes.
		// The VM guests of make vmtest have them.
		t.Skipf("outer is a kprobe: no kprobe PMU here: %v", err)
	}
	inner := bpftest.Prog(t, m, "inner")
	want := uint64(calls)
	if major, minor, err := kernel.Version(); err != nil {
		t.Fatal(err)
	} else if major < 6 || major == 6 && minor < 7 {
		want = 0
	}
	pid, key := uint32(os.Getpid()), uint32(0)
	if err := bpftest.Map(t, m, "traced_pid").Update(unsafe.Pointer(&key), unsafe.Pointer(&pid)); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"inner", "outer"} {
		p, err := m.GetProgram(name)
		if err != nil {
			t.Fatal(err)
		}
		var link *libbpfgo.BPFLink
		if name == "outer" {
			link, err = p.AttachKprobe(getppidEntry[runtime.GOARCH])
		} else {
			link, err = p.AttachGeneric()
		}
		if err != nil {
			t.Fatalf("attach %s: %v", name, err)
		}
		t.Cleanup(func() { _ = link.Destroy() })
	}
	r, err := perfbuf.NewReader(bpftest.Map(t, m, "events"), perfbuf.ReaderOptions{Options: perfbuf.Options{Programs: []int{inner}}})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()

	for range calls {
		syscall.Getppid()
	}
	r.SetDeadline(time.Now().Add(10 * time.Second))
	var s perfbuf.Sample
	for i := range calls {
		if err := r.ReadInto(&s); err != nil {
			t.Fatalf("record %d of %d: %v", i+1, calls, err)
		}
		if got := binary.NativeEndian.Uint32(s.Data); got != 0 {
			t.Fatalf("record %d of %d from the inner program: it ran", i+1, calls)
		}
	}
	// Samples are counted at a commit (the read's next look); the runs
	// not run as Stats reads them.
	check := func(when string, samples uint64) {
		t.Helper()
		st := r.Stats()
		if len(st.Rings) != 1 {
			t.Fatalf("%s: %d rings, want the ring buffer's one: %+v", when, len(st.Rings), st)
		}
		if st.Samples != samples || st.NotRun != want || st.Failed.Total() != 0 {
			t.Errorf("%s: %d samples, %d runs not run, %d failed outputs; want %d, %d and 0", when,
				st.Samples, st.NotRun, st.Failed.Total(), samples, want)
		}
		// NotRun is the programs', in the sums only.
		if ring := st.Rings[0]; ring.Samples != samples || ring.NotRun != 0 {
			t.Errorf("%s: the ring's %d samples, %d runs not run; want %d and 0 (in the sums only)", when, ring.Samples, ring.NotRun, samples)
		}
	}
	check("open", r.Stats().Samples)
	r.Close()
	syscall.Getppid() // one more miss, after Close: not counted
	check("closed", calls)
	// The kernel's own count, read apart, has the one after Close too.
	now, err := kernel.GetProgStats(inner)
	if err != nil {
		t.Fatal(err)
	}
	if want > 0 {
		want++
	}
	if now.RecursionMisses != want {
		t.Errorf("recursion_misses %d, want %d", now.RecursionMisses, want)
	}
}

// getppidEntry is getppid(2)'s entry point by GOARCH: the syscall
// wrapper's symbol (since 4.17 on x86, 5.0 on arm64).
var getppidEntry = map[string]string{"amd64": "__x64_sys_getppid", "arm64": "__arm64_sys_getppid"}

// calls is how many getppid calls TestProgramsNotRun makes while it reads.
const calls = 50

// A descriptor in Options.Programs that is not a BPF program's is refused
// before anything is opened, with an error that names the field.
func TestProgramsRefused(t *testing.T) {
	m := bpftest.Load(t, "bpf/notrun.bpf.o")
	events := bpftest.Map(t, m, "events")
	target := bpftest.Map(t, m, "traced_pid")
	// A number no descriptor has: a closed one's number could be taken
	// again by anything this process opens meanwhile.
	const closed = 1 << 20
	for _, tc := range []struct {
		name string
		fd   int
		want error
	}{
		{"a map", target.FileDescriptor(), os.ErrInvalid},
		{"closed", closed, syscall.EBADF},
		{"negative", -1, syscall.EBADF},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := bpftest.OpenFDs(t)
			opts := perfbuf.Options{Programs: []int{bpftest.Prog(t, m, "inner"), tc.fd}}
			r, err := perfbuf.NewReader(events, perfbuf.ReaderOptions{Options: opts})
			if err == nil {
				r.Close()
				t.Fatal("NewReader: no error")
			}
			if !errors.Is(err, tc.want) || !strings.Contains(err.Error(), "Programs[1]") {
				t.Errorf("NewReader: %v, want %v naming Programs[1]", err, tc.want)
			}
			if after := bpftest.OpenFDs(t); after != before {
				t.Errorf("%d descriptors open after the refusal, %d before", after, before)
			}
		})
	}
}

// A Recorder refused for its other options after it took its programs
// leaves none of their descriptors open: a perf event array with Maps
// (read alone).
func TestRecorderProgramsRefused(t *testing.T) {
	f := setup(t)
	before := bpftest.OpenFDs(t)
	opts := perfbuf.Options{Programs: []int{f.prog}, Maps: []perfbuf.Map{f.events1}}
	r, err := perfbuf.NewRecorder(f.events, opts)
	if err == nil {
		r.Close()
		t.Fatal("NewRecorder: no error")
	}
	if !errors.Is(err, os.ErrInvalid) || !strings.Contains(err.Error(), "read alone") {
		t.Errorf("NewRecorder: %v, want os.ErrInvalid saying the perf event array is read alone", err)
	}
	if after := bpftest.OpenFDs(t); after != before {
		t.Errorf("%d descriptors open after the refusal, %d before", after, before)
	}
}
