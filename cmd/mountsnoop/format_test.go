// SPDX-License-Identifier: Apache-2.0

package main

// Output format, without BPF. The expected lines are what Debian's
// libbpf-tools 0.26 mountsnoop printed for the same calls (a mount in a
// private mount namespace: unshare -m; mount -t tmpfs; mount -o remount;
// umount), with its PIDs.

import (
	"bytes"
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/perfbuf/perfbuf"
	"github.com/perfbuf/perfbuf/bpfbuffer"
	"github.com/perfbuf/perfbuf/cmd/internal/tooltest"
	"golang.org/x/sys/unix"
)

var (
	evMount = event{TS: 5e9, Delta: 36_900, PID: 6079, TID: 6079, MntNS: 4026532177, Op: opMount, Comm: "mount",
		Src: "mytmp", Dest: "/tmp/mnttest", FS: "tmpfs", Data: "size=1m,mode=0755"}
	evRemount = event{TS: 6e9, PID: 6080, TID: 6080, MntNS: 4026532177, Op: opMount, Comm: "mount",
		Flags: unix.MS_RDONLY | unix.MS_NOSUID | unix.MS_REMOUNT | unix.MS_RELATIME,
		Src:   "mytmp", Dest: "/tmp/mnttest", FS: "tmpfs", Data: "size=1024k,mode=755"}
	evUmountFail = event{TS: 7e9, Delta: 1999, PID: 6082, TID: 6082, MntNS: 4026532177, Op: opUmount, Comm: "umount",
		Dest: "/nonexistent-x", Ret: -int32(unix.ENOENT)}
)

func TestColumns(t *testing.T) {
	var p printer
	if got, want := p.header(), "COMM             PID     TID     MNT_NS      CALL\n"; got != want {
		t.Errorf("header %q, want %q", got, want)
	}
	for _, c := range []struct {
		ev   event
		want string
	}{
		{evMount, `mount            6079    6079    4026532177  mount("mytmp", "/tmp/mnttest", "tmpfs", 0x0, "size=1m,mode=0755") = 0`},
		{evRemount, `mount            6080    6080    4026532177  mount("mytmp", "/tmp/mnttest", "tmpfs", MS_RDONLY | MS_NOSUID | MS_REMOUNT | MS_RELATIME, "size=1024k,mode=755") = 0`},
		{evUmountFail, `umount           6082    6082    4026532177  umount("/nonexistent-x", 0x0) = -ENOENT`},
	} {
		if got := string(p.appendEvent(nil, &c.ev)); got != c.want+"\n" {
			t.Errorf("\n got %q\nwant %q", got, c.want+"\n")
		}
	}
}

func TestTimestamp(t *testing.T) {
	wall := time.Date(2025, 11, 25, 16, 5, 35, 0, time.Local)
	p := printer{timestamp: true, clock: clock{monoStart: 4e9, wallStart: wall}}
	if got, want := p.header(), "TIME     COMM             PID     TID     MNT_NS      CALL\n"; got != want {
		t.Errorf("header %q, want %q", got, want)
	}
	// The event's time (1 s after the start), not the time it is printed.
	want := `16:05:36 mount            6079    6079    4026532177  mount("mytmp", "/tmp/mnttest", "tmpfs", 0x0, "size=1m,mode=0755") = 0` + "\n"
	if got := string(p.appendEvent(nil, &evMount)); got != want {
		t.Errorf("\n got %q\nwant %q", got, want)
	}
}

func TestDetailed(t *testing.T) {
	p := printer{detailed: true}
	if h := p.header(); h != "" {
		t.Errorf("detailed header %q", h)
	}
	want := `PID:    6079
TID:    6079
COMM:   mount
OP:     MOUNT
RET:    0
LAT:    36us
MNT_NS: 4026532177
FS:     tmpfs
SOURCE: mytmp
TARGET: /tmp/mnttest
DATA:   size=1m,mode=0755
FLAGS:  0x0

`
	if got := string(p.appendEvent(nil, &evMount)); got != want {
		t.Errorf("\n got %q\nwant %q", got, want)
	}
	p = printer{detailed: true, timestamp: true, clock: clock{monoStart: 7e9, wallStart: time.Date(2025, 11, 25, 16, 5, 35, 0, time.Local)}}
	want = `16:05:35 
    PID:    6082
    TID:    6082
    COMM:   umount
    OP:     UMOUNT
    RET:    -ENOENT
    LAT:    1us
    MNT_NS: 4026532177
    TARGET: /nonexistent-x
    FLAGS:  0x0

`
	if got := string(p.appendEvent(nil, &evUmountFail)); got != want {
		t.Errorf("\n got %q\nwant %q", got, want)
	}
}

func TestMountFlags(t *testing.T) {
	for _, c := range []struct {
		flags uint64
		want  string
	}{
		{0, "0x0"},
		{unix.MS_RDONLY, "MS_RDONLY"},
		// The C tool prints MS_VERBOSE | MS_PRIVATE (its table is one off from bit 10 to 14).
		{unix.MS_REC | unix.MS_PRIVATE, "MS_REC | MS_PRIVATE"},
		{unix.MS_BIND | unix.MS_REC, "MS_BIND | MS_REC"},
		{1 << 31, "MS_NOUSER"},
		{1 << 9, "0x200"},
		{1<<40 | unix.MS_BIND, "MS_BIND | 0x10000000000"},
	} {
		if got := mountFlags(c.flags); got != c.want {
			t.Errorf("mountFlags(%#x) = %q, want %q", c.flags, got, c.want)
		}
	}
}

// The names by bit agree with x/sys/unix's constants.
func TestMountFlagNames(t *testing.T) {
	for name, v := range map[string]uint64{
		"MS_RDONLY": unix.MS_RDONLY, "MS_NOSUID": unix.MS_NOSUID, "MS_NODEV": unix.MS_NODEV,
		"MS_NOEXEC": unix.MS_NOEXEC, "MS_SYNCHRONOUS": unix.MS_SYNCHRONOUS, "MS_REMOUNT": unix.MS_REMOUNT,
		"MS_MANDLOCK": unix.MS_MANDLOCK, "MS_DIRSYNC": unix.MS_DIRSYNC, "MS_NOSYMFOLLOW": unix.MS_NOSYMFOLLOW,
		"MS_NOATIME": unix.MS_NOATIME, "MS_NODIRATIME": unix.MS_NODIRATIME, "MS_BIND": unix.MS_BIND,
		"MS_MOVE": unix.MS_MOVE, "MS_REC": unix.MS_REC, "MS_SILENT": unix.MS_SILENT,
		"MS_POSIXACL": unix.MS_POSIXACL, "MS_UNBINDABLE": unix.MS_UNBINDABLE, "MS_PRIVATE": unix.MS_PRIVATE,
		"MS_SLAVE": unix.MS_SLAVE, "MS_SHARED": unix.MS_SHARED, "MS_RELATIME": unix.MS_RELATIME,
		"MS_KERNMOUNT": unix.MS_KERNMOUNT, "MS_I_VERSION": unix.MS_I_VERSION, "MS_STRICTATIME": unix.MS_STRICTATIME,
		"MS_LAZYTIME": unix.MS_LAZYTIME, "MS_SUBMOUNT": unix.MS_SUBMOUNT, "MS_NOREMOTELOCK": unix.MS_NOREMOTELOCK,
		"MS_NOSEC": unix.MS_NOSEC, "MS_BORN": unix.MS_BORN, "MS_ACTIVE": unix.MS_ACTIVE, "MS_NOUSER": unix.MS_NOUSER,
	} {
		if got := mountFlags(v); got != name {
			t.Errorf("%s (%#x) printed as %q", name, v, got)
		}
	}
}

func TestErrnoText(t *testing.T) {
	for _, c := range []struct {
		ret  int32
		want string
	}{
		{0, "0"},
		{-int32(unix.ENOENT), "-ENOENT"},
		{-int32(unix.ENODEV), "-ENODEV"},
		{-int32(unix.EPERM), "-EPERM"},
		{-int32(unix.EBUSY), "-EBUSY"},
		{-4000, "-4000"}, // no name
		{3, "3"},
	} {
		if got := errnoText(c.ret); got != c.want {
			t.Errorf("errnoText(%d) = %q, want %q", c.ret, got, c.want)
		}
	}
}

func TestEscape(t *testing.T) {
	ev := evMount
	ev.Dest = "/mnt/a\nb\x1b[31m\xff\u202e"
	var p printer
	got := string(p.appendEvent(nil, &ev))
	if want := `"/mnt/a\nb\x1b[31m\xff\u202e"`; !strings.Contains(got, want) || strings.Count(got, "\n") != 1 {
		t.Errorf("got %q, want it to hold %q on one line", got, want)
	}
}

// encodeEvent is decodeEvent's inverse, for the tests: an event as the BPF
// program writes it.
func encodeEvent(ev *event, size int) []byte {
	b := make([]byte, size)
	ne := binary.NativeEndian
	ne.PutUint64(b[offTS:], ev.TS)
	ne.PutUint64(b[offDelta:], ev.Delta)
	ne.PutUint64(b[offFlags:], ev.Flags)
	ne.PutUint32(b[offPID:], ev.PID)
	ne.PutUint32(b[offTID:], ev.TID)
	ne.PutUint32(b[offMntNS:], ev.MntNS)
	ne.PutUint32(b[offRet:], uint32(ev.Ret))
	ne.PutUint32(b[offOp:], ev.Op)
	copy(b[offComm:offComm+commLen-1], ev.Comm)
	copy(b[offFS:offFS+fsLen-1], ev.FS)
	copy(b[offSrc:offSrc+pathLen-1], ev.Src)
	copy(b[offDest:offDest+pathLen-1], ev.Dest)
	copy(b[offData:offData+dataLen-1], ev.Data)
	return b
}

func TestDecode(t *testing.T) {
	for _, size := range []int{eventSize, eventSize + 4} { // a ring buffer's, a perf sample's padding
		var got event
		if err := decodeEvent(encodeEvent(&evRemount, size), &got); err != nil || got != evRemount {
			t.Errorf("%d bytes: %v\n got %+v\nwant %+v", size, err, got, evRemount)
		}
	}
	// Strings that fill their field: the BPF program NUL-terminates them.
	long := evMount
	long.Dest = strings.Repeat("d", pathLen-1)
	var got event
	if err := decodeEvent(encodeEvent(&long, eventSize), &got); err != nil || got.Dest != long.Dest {
		t.Errorf("a %d-byte path: %v, %d bytes", pathLen-1, err, len(got.Dest))
	}
	if err := decodeEvent(make([]byte, eventSize-1), &got); !errors.Is(err, errShortEvent) {
		t.Errorf("short event: %v", err)
	}
	bad := evMount
	bad.Op = 7
	if err := decodeEvent(encodeEvent(&bad, eventSize), &got); !errors.Is(err, errBadOp) {
		t.Errorf("op 7: %v", err)
	}
}

func TestParseFlags(t *testing.T) {
	o, err := parseFlags([]string{"-td", "-p", "42", "--buffer", "perf_event_array", "--duration", "1.5"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if !o.printer.timestamp || !o.printer.detailed || o.tracer.pid != 42 || o.tracer.buffer != bpfbuffer.PerfEventArray ||
		o.duration != 1500*time.Millisecond {
		t.Errorf("parsed %+v", o)
	}
	o, err = parseFlags([]string{"--pid=7", "--buffer=ringbuf", "-v"}, nil)
	if err != nil || o.tracer.pid != 7 || o.tracer.buffer != bpfbuffer.RingBuf || !o.tracer.verbose || o.tracer.objPath != "" {
		t.Errorf("parsed %+v, %v", o, err)
	}
	if o, err = parseFlags([]string{"--buffer", "ringbuf_per_cpu"}, nil); err != nil || o.tracer.buffer != bpfbuffer.RingBufPerCPU {
		t.Errorf("parsed %+v, %v", o, err)
	}
	if o, err = parseFlags(nil, nil); err != nil || o.tracer.buffer != bpfbuffer.Any || o.tracer.pid != 0 {
		t.Errorf("defaults %+v, %v", o, err)
	}
	for _, args := range [][]string{{"-p", "0"}, {"-p", "x"}, {"--buffer", "ring"}, {"--duration", "0"}, {"extra"}, {"-x"}} {
		if _, err := parseFlags(args, nil); err == nil {
			t.Errorf("%q: no error", args)
		}
	}
	var help bytes.Buffer
	if _, err := parseFlags([]string{"-h"}, &help); !errors.Is(err, flag.ErrHelp) ||
		!strings.Contains(help.String(), "--buffer KIND") || !strings.Contains(help.String(), "-d, --detailed") {
		t.Errorf("-h: %v\n%s", err, help.String())
	}
}

// fakeSource delivers samples, then ErrFlushed.
type fakeSource struct {
	recs []any // perfbuf.Sample, or an error
}

func (f *fakeSource) ReadInto(s *perfbuf.Sample) error {
	if len(f.recs) == 0 {
		return perfbuf.ErrFlushed
	}
	r := f.recs[0]
	f.recs = f.recs[1:]
	if err, ok := r.(error); ok {
		return err
	}
	*s = r.(perfbuf.Sample)
	return nil
}

func TestReadLoop(t *testing.T) {
	src := &fakeSource{recs: []any{
		perfbuf.Sample{CPU: -1, Type: perfbuf.RecordSample, Data: encodeEvent(&evMount, eventSize)},
		perfbuf.Sample{CPU: 1, Type: perfbuf.RecordLost, Lost: 3},
		&perfbuf.CorruptError{},
		perfbuf.Sample{CPU: 0, Type: perfbuf.RecordSample, Data: make([]byte, 10)},
		perfbuf.Sample{CPU: 0, Type: perfbuf.RecordSample, Data: encodeEvent(&evUmountFail, eventSize+4)},
	}}
	var out, errOut bytes.Buffer
	var p printer
	c, err := readLoop(src, &p, &out, &errOut)
	if err != nil {
		t.Fatal(err)
	}
	if c != (counts{events: 2, lost: 3, bad: 1, corrupt: 1}) {
		t.Errorf("counts %+v", c)
	}
	if n := strings.Count(out.String(), "\n"); n != 2 || !strings.Contains(out.String(), "-ENOENT") {
		t.Errorf("stdout:\n%s", out.String())
	}
	if !strings.Contains(errOut.String(), "lost 3 events on CPU #1\n") {
		t.Errorf("stderr:\n%s", errOut.String())
	}
	// Closed: the loop ends without an error.
	if _, err := readLoop(&fakeSource{recs: []any{fmt.Errorf("read: %w", os.ErrClosed)}}, &p, &out, &errOut); err != nil {
		t.Errorf("closed: %v", err)
	}
}

func TestSummary(t *testing.T) {
	var b bytes.Buffer
	// A ring buffer read alone: every CPU's full outputs and failures are
	// in its one entry.
	stats := tooltest.Sums(perfbuf.Stats{},
		perfbuf.Stats{CPU: -1, Samples: 29, MaxFill: 254736, Discarded: 1, Left: 2, Lost: 11, Failed: perfbuf.Failures{Invalid: 1}})
	writeSummary(&b, bpfbuffer.RingBuf, counts{events: 29}, stats, 1500*time.Millisecond)
	want := `
29 calls traced, 11 lost, 1 failed output (EINVAL 1) in 1.5s, from a BPF ring buffer
  ring        29 events  11 lost  ring peak 254736 bytes  1 discarded  2 unread at exit  1 failed output (EINVAL 1)
`
	if b.String() != want {
		t.Errorf("ring buffer:\n got %q\nwant %q", b.String(), want)
	}
	b.Reset()
	stats = tooltest.Sums(perfbuf.Stats{NotRun: 3}, // the programs': no line of its own
		perfbuf.Stats{CPU: 0, Samples: 5, Lost: 1},
		perfbuf.Stats{CPU: 1, Samples: 7, Failed: perfbuf.Failures{NoEntry: 1}},
	)
	writeSummary(&b, bpfbuffer.PerfEventArray, counts{events: 12, lost: 1, perfFull: 4}, stats, time.Second)
	want = `
12 calls traced, 4 lost, 1 failed output (ENOENT 1), 3 program runs skipped by the kernel (calls not traced) in 1.0s, from a perf event array
  cpu 0        5 events      1 lost
  cpu 1        7 events      0 lost  1 failed output (ENOENT 1)
`
	if b.String() != want {
		t.Errorf("perf event array:\n got %q\nwant %q", b.String(), want)
	}
	b.Reset()
	// Several ring buffers: CPU 0's full outputs and failure are no
	// ring's, in the sums only.
	stats = tooltest.Sums(perfbuf.Stats{Lost: 12, Failed: perfbuf.Failures{TooBig: 1}},
		perfbuf.Stats{CPU: -1, Samples: 29, MaxFill: 254736},
		perfbuf.Stats{CPU: -1, Samples: 3, Late: 2, Left: 1},
	)
	writeSummary(&b, bpfbuffer.RingBufPerCPU, counts{events: 32}, stats, time.Second)
	want = `
32 calls traced, 12 lost, 1 failed output (E2BIG 1), 2 late (printed after a later call) in 1.0s, from a BPF ring buffer per CPU
  ring 0      29 events  ring peak 254736 bytes
  ring 1       3 events  2 late  1 unread at exit
  no ring  12 lost  1 failed output (E2BIG 1)
`
	if b.String() != want {
		t.Errorf("ring buffer per CPU:\n got %q\nwant %q", b.String(), want)
	}
}
