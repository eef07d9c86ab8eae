// SPDX-License-Identifier: Apache-2.0

package main

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/perfbuf/perfbuf"
	"github.com/perfbuf/perfbuf/bpfbuffer"
	"github.com/perfbuf/perfbuf/internal/cpus"
	"golang.org/x/sys/unix"
)

// fakeRecorder returns its records at every snapshot.
type fakeRecorder struct {
	recs []perfbuf.Record
	err  error
}

func (f *fakeRecorder) Snapshot(buf []byte, dst []perfbuf.Record, onlyNew bool) ([]perfbuf.Record, error) {
	return append(dst, f.recs...), f.err
}

// A snapshot prints the calls under the header, the CPUs' rings merged by
// time; lost records and malformed events go to stderr, and a short
// buffer's error too, with the calls that fit.
func TestSnapshotPrint(t *testing.T) {
	at := func(ev event, ts uint64) []byte {
		ev.TS = ts
		return encodeEvent(&ev, eventSize+4)
	}
	src := &fakeRecorder{recs: []perfbuf.Record{
		{CPU: 0, Type: perfbuf.RecordSample, Data: at(evMount, 10)},
		{CPU: 0, Type: perfbuf.RecordSample, Data: at(evUmountFail, 30)},
		{CPU: 1, Type: perfbuf.RecordLost, Lost: 4},
		{CPU: 1, Type: perfbuf.RecordSample, Data: at(evRemount, 20)},
		{CPU: 1, Type: perfbuf.RecordSample, Data: make([]byte, 10)},
	}}
	var out, errOut bytes.Buffer
	var p printer
	var s snapshot
	var c counts
	if err := s.print(src, &p, &out, &errOut, &c); err != nil {
		t.Fatal(err)
	}
	var want bytes.Buffer
	want.WriteString(p.header())
	for _, ev := range []event{evMount, evRemount, evUmountFail} {
		want.Write(p.appendEvent(nil, &ev))
	}
	// The printed TS are the ones given; the lines do not show them.
	if out.String() != want.String() {
		t.Errorf("stdout:\n%s\nwant:\n%s", out.String(), want.String())
	}
	if c != (counts{events: 3, lost: 4, bad: 1}) {
		t.Errorf("counts %+v", c)
	}
	for _, w := range []string{"lost 4 events on CPU #1\n", "cpu 1: decode event", "snapshot: the newest 3 calls"} {
		if !strings.Contains(errOut.String(), w) {
			t.Errorf("stderr without %q:\n%s", w, errOut.String())
		}
	}
	src.err = fmt.Errorf("snapshot: ring 0: %w", io.ErrShortBuffer)
	out.Reset()
	if err := s.print(src, &p, &out, &errOut, &c); err != nil || strings.Count(out.String(), "\n") != 4 || !strings.Contains(errOut.String(), "short buffer") {
		t.Errorf("short buffer: %v\n%s\n%s", err, out.String(), errOut.String())
	}
	src.err = errors.New("broken")
	if err := s.print(src, &p, &out, &errOut, &c); err == nil {
		t.Error("a snapshot's error not returned")
	}
}

// --recorder takes a size in MiB.
func TestParseRecorder(t *testing.T) {
	o, err := parseFlags([]string{"--recorder", "4", "-t"}, nil)
	if err != nil || o.tracer.recorder != 4 {
		t.Errorf("parsed %+v, %v", o, err)
	}
	for _, args := range [][]string{{"--recorder", "0"}, {"--recorder", "x"}, {"--recorder", "1025"}} {
		if _, err := parseFlags(args, nil); err == nil {
			t.Errorf("%q: no error", args)
		}
	}
}

// A flight recorder of 1 MiB over calls on one CPU, more than its ring
// holds: a snapshot prints the newest calls, all of them up to the last,
// in order, as many as the CPU's ring holds whole (a ring buffer's or a
// perf ring's records of 8776 bytes, with their headers). On kernels
// before 6.19 Any makes a perf event array; forcing a ring buffer fails
// there, naming 6.19.
func TestRecorderMode(t *testing.T) {
	requirePrivileges(t)
	tr := openTestTracer(t, tracerConfig{buffer: bpfbuffer.Any, recorder: 1, pid: os.Getpid()})
	forced, err := openTracer(tracerConfig{buffer: bpfbuffer.RingBuf, recorder: 1})
	if err == nil {
		forced.close()
	}
	if tr.kind == bpfbuffer.PerfEventArray && (!errors.Is(err, errors.ErrUnsupported) || !strings.Contains(err.Error(), "6.19")) {
		t.Errorf("a ring buffer recorder on a kernel without overwrite mode: %v; want errors.ErrUnsupported naming 6.19", err)
	}
	online, err := cpus.Online()
	if err != nil {
		t.Fatal(err)
	}
	cpu := online[len(online)-1]
	tok := newToken()
	dir := filepath.Join(t.TempDir(), tok)
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	const mounts = 300 // 2.5 MiB of calls
	calls := []func() error{func() error {
		var set unix.CPUSet
		set.Set(cpu)
		return unix.SchedSetaffinity(0, &set)
	}}
	for i := range mounts {
		calls = append(calls, func() error { return unix.Mount(fmt.Sprintf("%s-%d", tok, i), dir, "tmpfs", 0, "size=4k") })
	}
	th := inPrivateMountNS(t, calls...)
	for i, err := range th.errs {
		if err != nil {
			t.Fatalf("call %d: %v", i, err)
		}
	}
	// The ring of the CPU, and a record's bytes in it.
	recSize, size := (eventSize+8+7)&^7, 0
	for i, st := range tr.rec.Stats().Rings {
		switch {
		case tr.kind != bpfbuffer.PerfEventArray:
			size = st.Size
		case st.CPU == cpu:
			size, recSize = st.Size, (8+4+eventSize+7)&^7
		}
		t.Logf("ring %d: cpu %d, %d bytes", i, st.CPU, st.Size)
	}
	var out, errOut bytes.Buffer
	s := snapshot{buf: make([]byte, 2<<20)}
	var c counts
	p := printer{clock: tr.clock}
	if err := s.print(tr.rec, &p, &out, &errOut, &c); err != nil {
		t.Fatal(err)
	}
	var got []int
	for _, l := range strings.Split(out.String(), "\n") {
		var n int
		if i := strings.Index(l, tok+"-"); i >= 0 {
			if _, err := fmt.Sscanf(l[i+len(tok)+1:], "%d", &n); err != nil {
				t.Fatalf("line %q: %v", l, err)
			}
			got = append(got, n)
		}
	}
	keep := size / recSize
	if len(got) < keep-1 || len(got) > keep || got[len(got)-1] != mounts-1 {
		t.Fatalf("%d calls, the last %d; want the newest %d or %d up to %d\n%s", len(got), got[len(got)-1], keep-1, keep, mounts-1, errOut.String())
	}
	for i, n := range got {
		if n != mounts-len(got)+i {
			t.Fatalf("call %d is mount %d, want %d", i, n, mounts-len(got)+i)
		}
	}
	lines := strings.Split(strings.TrimSuffix(out.String(), "\n"), "\n")
	t.Logf("%v: the newest %d of %d mounts; stderr: %s%s\n...\n%s", tr.kind, len(got), mounts, errOut.String(),
		strings.Join(lines[:2], "\n"), strings.Join(lines[len(lines)-2:], "\n"))
}
