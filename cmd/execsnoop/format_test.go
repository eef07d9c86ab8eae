// SPDX-License-Identifier: Apache-2.0

package main

// Unit tests of decoding, formatting, flags and the read loop: no BPF, no
// privileges.

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"syscall"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/perfbuf/perfbuf"
	"github.com/perfbuf/perfbuf/cmd/internal/tool"
	"github.com/perfbuf/perfbuf/cmd/internal/tooltest"
)

// encodeEvent lays ev out as struct event in execsnoop.bpf.c does, and pads
// it as the kernel pads samples (u32 size + data round up to 8 bytes).
func encodeEvent(ev event) []byte {
	var args []byte
	for _, a := range ev.Args {
		args = append(append(args, a...), 0)
	}
	n := offArgs + len(args)
	b := make([]byte, (n+4+7)&^7-4)
	le := binary.NativeEndian
	le.PutUint64(b[offTS:], ev.TS)
	le.PutUint32(b[offPID:], ev.PID)
	le.PutUint32(b[offPPID:], ev.PPID)
	le.PutUint32(b[offUID:], ev.UID)
	le.PutUint32(b[offRet:], uint32(ev.Ret))
	le.PutUint32(b[offArgsCount:], uint32(len(ev.Args)))
	le.PutUint32(b[offArgsSize:], uint32(len(args)))
	if ev.Truncated {
		le.PutUint32(b[offFlags:], flagArgsTruncated)
	}
	copy(b[offComm:offComm+commLen-1], ev.Comm)
	copy(b[offArgs:], args)
	for i := n; i < len(b); i++ {
		b[i] = 0xAA // the kernel does not clear the padding
	}
	return b
}

var sample = event{
	TS: 5_250_000_000, PID: 4242, PPID: 1, UID: 1000, Ret: 0, Comm: "ls",
	Args: []string{"/usr/bin/ls", "-l", "/tmp"},
}

func TestDecodeRoundTrip(t *testing.T) {
	for _, want := range []event{
		sample,
		{TS: 1, PID: 7, PPID: 6, Ret: -2, Comm: "bash", Args: []string{"/nope"}},
		{TS: 2, Comm: "fifteen-chars-x", Args: []string{"/bin/true", "a", ""}, Truncated: true},
		{TS: 3, Comm: "x", Args: nil}, // unreadable filename: no args
	} {
		var got event
		if err := decodeEvent(encodeEvent(want), &got); err != nil {
			t.Fatalf("decode %+v: %v", want, err)
		}
		if len(got.Args) == 0 {
			got.Args = nil
		}
		if !reflect.DeepEqual(got, want) {
			t.Errorf("decoded %+v\nwant %+v", got, want)
		}
	}
}

func TestDecodeRejectsBadSizes(t *testing.T) {
	b := encodeEvent(sample)
	if err := decodeEvent(b[:offArgs-1], new(event)); !errors.Is(err, errShortEvent) {
		t.Errorf("short header: %v, want errShortEvent", err)
	}
	binary.NativeEndian.PutUint32(b[offArgsSize:], uint32(len(b)))
	if err := decodeEvent(b, new(event)); !errors.Is(err, errShortEvent) {
		t.Errorf("args_size past the sample: %v, want errShortEvent", err)
	}
	binary.NativeEndian.PutUint32(b[offArgsSize:], argsBufSize+1)
	if err := decodeEvent(b, new(event)); !errors.Is(err, errShortEvent) {
		t.Errorf("args_size past the buffer: %v, want errShortEvent", err)
	}
}

// The offsets must match the C struct, whose fields are laid out in order
// with natural alignment.
func TestLayout(t *testing.T) {
	offs := []int{offTS, offPID, offPPID, offUID, offRet, offArgsCount, offArgsSize, offFlags, offComm, offArgs}
	sizes := []int{8, 4, 4, 4, 4, 4, 4, 4, commLen}
	for i, size := range sizes {
		if offs[i]+size != offs[i+1] {
			t.Errorf("field %d at %d, size %d, next at %d", i, offs[i], size, offs[i+1])
		}
	}
	// NewReader checks the options before the map: the largest event must
	// fit the rings beside a lost record (else ErrSampleTooLarge), so only
	// the descriptor is refused.
	if _, err := perfbuf.NewReader(perfbuf.MapFD(-1), readerOptions()); !errors.Is(err, syscall.EBADF) {
		t.Errorf("reader options over a bad descriptor: %v, want only EBADF", err)
	}
}

var testClock = clock{monoStart: 4_000_000_000, wallStart: time.Date(2025, 1, 2, 13, 4, 5, 0, time.Local)}

func TestColumns(t *testing.T) {
	for _, tc := range []struct {
		name       string
		p          printer
		head, line string
	}{
		{
			name: "default",
			head: "PCOMM            PID    PPID   RET ARGS\n",
			line: "ls               4242   1        0 /usr/bin/ls -l /tmp\n",
		},
		{
			name: "time timestamp uid",
			p:    printer{time: true, timestamp: true, printUID: true},
			head: "TIME     TIME(s)  UID    PCOMM            PID    PPID   RET ARGS\n",
			line: "13:04:06 1.250    1000   ls               4242   1        0 /usr/bin/ls -l /tmp\n",
		},
		{
			name: "quoted",
			p:    printer{quote: true},
			head: "PCOMM            PID    PPID   RET ARGS\n",
			line: `ls               4242   1        0 "/usr/bin/ls" "-l" "/tmp"` + "\n",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.p.clock = testClock
			if got := tc.p.header(); got != tc.head {
				t.Errorf("header\n got %q\nwant %q", got, tc.head)
			}
			if got := string(tc.p.appendEvent(nil, &sample, 0)); got != tc.line {
				t.Errorf("line\n got %q\nwant %q", got, tc.line)
			}
		})
	}
}

func TestFailedAndTruncated(t *testing.T) {
	p := printer{}
	ev := event{PID: 10, PPID: 9, Ret: -2, Comm: "sh", Args: []string{"/nope", "x"}, Truncated: true}
	want := "sh               10     9       -2 /nope x ...\n"
	if got := string(p.appendEvent(nil, &ev, 0)); got != want {
		t.Errorf("got %q, want %q", got, want)
	}
}

func TestQuoting(t *testing.T) {
	ev := event{Comm: "a\nb", Args: []string{`say "hi"`, "tab\there", `back\slash`, "esc\x1b[31m", ""}}
	plain := printer{}
	got := string(plain.appendEvent(nil, &ev, 0))
	if want := `a\nb             0      0        0 say "hi" tab\there back\slash esc\x1b[31m ` + "\n"; got != want {
		t.Errorf("plain\n got %q\nwant %q", got, want)
	}
	quoted := printer{quote: true}
	got = string(quoted.appendEvent(nil, &ev, 0))
	if want := `a\nb             0      0        0 "say \"hi\"" "tab\there" "back\\slash" "esc\x1b[31m" ""` + "\n"; got != want {
		t.Errorf("quoted\n got %q\nwant %q", got, want)
	}
	if strings.Count(got, "\n") != 1 {
		t.Errorf("an exec must be one line: %q", got)
	}
}

// Nothing an argument holds reaches the terminal as a control: C1 controls
// (U+009B is a CSI, like ESC [), raw bytes that are not UTF-8 (0x9b is a
// CSI too on some terminals) and bidi controls are escaped like C0 ones.
// (Only C0 and DEL were, once.)
func TestEscapeControls(t *testing.T) {
	for arg, want := range map[string]string{
		"\u009b31mRED":           `\u009b31mRED`,
		"\x9b31mRED":             `\x9b31mRED`,
		"\u009d0;t\u009c":        `\u009d0;t\u009c`,
		"a\u202eb":               `a\u202eb`,
		"caf\u00e9 \u65e5\u672c": "caf\u00e9 \u65e5\u672c", // printable: left alone
		"\xff\xfe":               `\xff\xfe`,
	} {
		for _, quoted := range []bool{false, true} { // (no " or \ in these)
			if got := escape(arg, quoted); got != want {
				t.Errorf("escape(%q, quoted %v) = %q, want %q", arg, quoted, got, want)
			}
		}
	}
}

// JSON strings are UTF-8, so an argument that is not comes out with U+FFFD
// in "args"; "args_raw" then carries every argument's exact bytes. (They
// were lost: "\xff\xfe" and "\ufffd\ufffd" gave the same JSON.)
func TestJSONNotUTF8(t *testing.T) {
	p := printer{json: true, clock: testClock}
	for _, args := range [][]string{{"/bin/cat", "\xff\xfe"}, {"/bin/cat", "\ufffd\ufffd"}} {
		ev := event{Comm: "x", Args: args}
		var j jsonEvent
		if err := json.Unmarshal(p.appendEvent(nil, &ev, 0), &j); err != nil {
			t.Fatal(err)
		}
		valid := utf8.ValidString(args[1])
		if valid && j.ArgsRaw != nil {
			t.Errorf("%q: args_raw %q for valid UTF-8", args, j.ArgsRaw)
		}
		if !valid && (len(j.ArgsRaw) != 2 || string(j.ArgsRaw[1]) != args[1] || string(j.ArgsRaw[0]) != args[0]) {
			t.Errorf("%q: args_raw %q, want the exact bytes", args, j.ArgsRaw)
		}
	}
}

func TestJSON(t *testing.T) {
	p := printer{json: true, clock: testClock}
	if h := p.header(); h != "" {
		t.Errorf("JSON has no header, got %q", h)
	}
	line := p.appendEvent(nil, &sample, 1)
	if bytes.Count(line, []byte("\n")) != 1 || line[len(line)-1] != '\n' {
		t.Fatalf("not one line: %q", line)
	}
	var got map[string]any
	if err := json.Unmarshal(line, &got); err != nil {
		t.Fatalf("unmarshal %q: %v", line, err)
	}
	want := map[string]any{
		"time": testClock.wall(sample.TS).Format(time.RFC3339Nano), "ts": 1.25,
		"comm": "ls", "pid": 4242.0, "ppid": 1.0, "uid": 1000.0, "ret": 0.0,
		"args": []any{"/usr/bin/ls", "-l", "/tmp"}, "cpu": 1.0,
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("got %v\nwant %v", got, want)
	}
	empty := event{Ret: -13, Truncated: true}
	line = p.appendEvent(nil, &empty, 0)
	if !bytes.Contains(line, []byte(`"args":[]`)) || !bytes.Contains(line, []byte(`"args_truncated":true`)) {
		t.Errorf("no args: %s", line)
	}
}

func TestFilter(t *testing.T) {
	failed := event{Comm: "bash", Ret: -2, Args: []string{"/opt/tpkg/run"}}
	for _, tc := range []struct {
		f    filter
		ev   *event
		want bool
	}{
		{filter{}, &sample, true},
		{filter{name: "l"}, &sample, true},
		{filter{name: "bash"}, &sample, false},
		{filter{line: "tmp"}, &sample, true},
		{filter{line: "tpkg"}, &sample, false},
		{filter{line: "tpkg"}, &failed, true},
		{filter{failedOnly: true}, &sample, false},
		{filter{failedOnly: true, name: "ba"}, &failed, true},
	} {
		if got := tc.f.match(tc.ev); got != tc.want {
			t.Errorf("%+v on %s: %v, want %v", tc.f, tc.ev.Comm, got, tc.want)
		}
	}
}

func TestParseFlags(t *testing.T) {
	o, err := parseFlags(strings.Fields("-Tx -t -u 1000 -q -n bash --line tpkg -U --max-args 5 -d 2.5 --json --demo"), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	p := o.printer
	if !p.time || !p.timestamp || !p.quote || !p.printUID || !p.json || !o.demo ||
		!o.tracer.includeFailed || o.tracer.uid != 1000 || o.tracer.maxArgs != 5 ||
		o.filter.name != "bash" || o.filter.line != "tpkg" || o.duration != 2500*time.Millisecond {
		t.Errorf("parsed %+v", o)
	}
	o, err = parseFlags([]string{"--failed-only", "--duration", "1m"}, io.Discard)
	if err != nil || !o.filter.failedOnly || !o.tracer.includeFailed || o.duration != time.Minute || o.tracer.uid != -1 {
		t.Errorf("--failed-only --duration 1m: %+v, %v", o, err)
	}
	for _, bad := range []string{"--max-args 0", "--max-args 61", "-u -1", "-u 4294967295", "-d 0", "-d soon", "extra", "-Tn"} {
		if _, err := parseFlags(strings.Fields(bad), io.Discard); err == nil || errors.Is(err, flag.ErrHelp) {
			t.Errorf("%q: %v, want an error", bad, err)
		}
	}
	var help bytes.Buffer
	if _, err := parseFlags([]string{"-h"}, &help); !errors.Is(err, flag.ErrHelp) || !strings.Contains(help.String(), "  -T, --time ") {
		t.Errorf("-h: %v, help:\n%s", err, help.String())
	}
}

// The help says which PIDs are printed, --kernel-pids chooses the kernel's,
// and the summary counts the execs outside the namespace when there are
// some. (Only the kernel's were printed, and the help did not say so.)
func TestPIDNumbering(t *testing.T) {
	var help bytes.Buffer
	if _, err := parseFlags([]string{"-h"}, &help); !errors.Is(err, flag.ErrHelp) ||
		!strings.Contains(help.String(), "PID and PPID are numbered as in execsnoop's own PID namespace") ||
		!strings.Contains(help.String(), "      --kernel-pids ") {
		t.Errorf("-h: %v, help:\n%s", err, help.String())
	}
	for args, want := range map[string]bool{"": false, "--kernel-pids": true, "-x --kernel-pids": true} {
		o, err := parseFlags(strings.Fields(args), io.Discard)
		if err != nil || o.tracer.kernelPIDs != want {
			t.Errorf("%q: kernelPIDs %v (%v), want %v", args, o != nil && o.tracer.kernelPIDs, err, want)
		}
	}
	const other = ", 3 outside this PID namespace (--kernel-pids shows them) in "
	var sum bytes.Buffer
	writeSummary(&sum, counts{events: 2, shown: 2, kernel: kernelCounts{otherPIDNS: 3}}, perfbuf.Stats{}, time.Second)
	if !strings.Contains(sum.String(), other) {
		t.Errorf("summary:\n%s\nwant it to contain %q", sum.String(), other)
	}
	sum.Reset()
	writeSummary(&sum, counts{events: 2, shown: 2}, perfbuf.Stats{}, time.Second)
	if strings.Contains(sum.String(), "namespace") || strings.Contains(sum.String(), "skipped") {
		t.Errorf("summary with none outside the namespace and no run skipped mentions them:\n%s", sum.String())
	}
	// Runs the kernel skipped (recursion_misses) are execs never traced.
	const skipped = ", 5 program runs skipped by the kernel (execs not traced) in "
	sum.Reset()
	stats := tooltest.Sums(perfbuf.Stats{NotRun: 5}, perfbuf.Stats{CPU: 0, Samples: 2})
	writeSummary(&sum, counts{events: 2, shown: 2}, stats, time.Second)
	if !strings.Contains(sum.String(), skipped) || strings.Contains(sum.String(), "cpu -1") || strings.Contains(sum.String(), "failed output") ||
		strings.Contains(sum.String(), "no ring") {
		t.Errorf("summary:\n%s\nwant it to contain %q, and no line or failed output of the programs' runs", sum.String(), skipped)
	}
}

// Grouped short flags are split wherever they are, and a flag's value is
// passed on as it is, whatever it looks like. (The split used to stop at
// the first value, so "-n bash -Tx" failed, and it split values: "-n -qU"
// named no command but set -q and -U.)
func TestSplitShortFlags(t *testing.T) {
	fs := flag.NewFlagSet("test", flag.ContinueOnError)
	for _, b := range []string{"T", "t", "x", "q", "U", "time"} {
		fs.Bool(b, false, "")
	}
	fs.String("n", "", "")
	fs.Int("max-args", 0, "")
	got := tool.SplitShortFlags(fs, []string{"-Tx", "-n", "-qU", "--time", "-max-args=3", "--max-args", "-3", "-Tt", "--", "-Tt"}, "TtxqU")
	want := []string{"-T", "-x", "-n", "-qU", "--time", "-max-args=3", "--max-args", "-3", "-T", "-t", "--", "-Tt"}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("got %q, want %q", got, want)
	}
	o, err := parseFlags([]string{"-n", "bash", "-Tx"}, io.Discard)
	if err != nil || !o.printer.time || !o.tracer.includeFailed || o.filter.name != "bash" {
		t.Errorf("-n bash -Tx: %+v, %v", o, err)
	}
	o, err = parseFlags([]string{"-l", "-tx"}, io.Discard)
	if err != nil || o.filter.line != "-tx" || o.tracer.includeFailed || o.printer.timestamp {
		t.Errorf("-l -tx: %+v, %v; want line filter \"-tx\" and no -t or -x", o, err)
	}
}

// fakeSource replays reads, then reports ErrFlushed.
type fakeSource struct {
	reads []fakeRead
}

// fakeRead is a record, or the error a read returns instead.
type fakeRead struct {
	s   perfbuf.Sample
	err error
}

func (f *fakeSource) ReadInto(s *perfbuf.Sample) error {
	if len(f.reads) == 0 {
		return fmt.Errorf("read perf event array \"events\": %w", perfbuf.ErrFlushed)
	}
	r := f.reads[0]
	f.reads = f.reads[1:]
	if r.err != nil {
		return r.err
	}
	*s = r.s
	return nil
}

func TestReadLoop(t *testing.T) {
	failed := event{TS: sample.TS + 1, PID: 7, Ret: -2, Comm: "sh", Args: []string{"/nope"}}
	src := &fakeSource{reads: []fakeRead{
		{s: perfbuf.Sample{CPU: 0, Type: perfbuf.RecordSample, Data: encodeEvent(sample)}},
		{s: perfbuf.Sample{CPU: 1, Type: perfbuf.RecordLost, Lost: 3}},
		{s: perfbuf.Sample{CPU: 1, Type: perfbuf.RecordSample, Data: []byte{1, 2, 3}}},
		{s: perfbuf.Sample{CPU: 1, Type: perfbuf.RecordSample, Data: encodeEvent(failed), Late: true}},
	}}
	o := &options{filter: filter{failedOnly: true}}
	var out, errs bytes.Buffer
	c, err := readLoop(src, o, &out, &errs)
	if err != nil {
		t.Fatal(err)
	}
	if want := (counts{events: 2, shown: 1, lost: 3, late: 1, bad: 1}); c != want {
		t.Errorf("counts %+v, want %+v", c, want)
	}
	if want := "sh               7      0       -2 /nope\n"; out.String() != want {
		t.Errorf("stdout %q, want %q", out.String(), want)
	}
	if !strings.Contains(errs.String(), "Lost 3 events on CPU #1!\n") || !strings.Contains(errs.String(), "short event") {
		t.Errorf("stderr %q: want the lost line and the malformed sample", errs.String())
	}
}

// A corrupt ring is reported on stderr and reading goes on: the reader
// skipped that ring, and the other rings' events still come.
func TestReadLoopCorruptRing(t *testing.T) {
	corrupt := &perfbuf.CorruptError{CPU: 1, Pos: 4096, Size: 0, Reason: "record size 0"}
	second := event{TS: sample.TS + 1, PID: 7, Comm: "sh", Args: []string{"/bin/sh"}}
	src := &fakeSource{reads: []fakeRead{
		{s: perfbuf.Sample{CPU: 0, Type: perfbuf.RecordSample, Data: encodeEvent(sample)}},
		{err: fmt.Errorf("read perf event array \"events\": %w", corrupt)}, // as Reader wraps it
		{s: perfbuf.Sample{CPU: 0, Type: perfbuf.RecordSample, Data: encodeEvent(second)}},
	}}
	var out, errs bytes.Buffer
	c, err := readLoop(src, &options{}, &out, &errs)
	if err != nil {
		t.Fatalf("readLoop: %v, want it to go on past the corrupt ring", err)
	}
	if want := (counts{events: 2, shown: 2, corrupt: 1}); c != want {
		t.Errorf("counts %+v, want %+v", c, want)
	}
	if n := strings.Count(out.String(), "\n"); n != 2 {
		t.Errorf("%d lines on stdout, want both events:\n%s", n, out.String())
	}
	if want := `execsnoop: read perf event array "events": ` + corrupt.Error(); !strings.Contains(errs.String(), want) {
		t.Errorf("stderr %q, want it to contain %q", errs.String(), want)
	}

	var sum bytes.Buffer
	stats := tooltest.Sums(perfbuf.Stats{}, perfbuf.Stats{CPU: 0, Samples: 2}, perfbuf.Stats{CPU: 1, Corrupt: 1, Left: 2})
	writeSummary(&sum, c, stats, time.Second)
	for _, want := range []string{", 1 corrupt rings found", "  1 corrupt  2 unread at exit\n"} {
		if !strings.Contains(sum.String(), want) {
			t.Errorf("summary %q, want it to contain %q", sum.String(), want)
		}
	}
}

// Any other error ends the loop and is returned.
func TestReadLoopOtherError(t *testing.T) {
	src := &fakeSource{reads: []fakeRead{{err: fmt.Errorf("read perf event array \"events\": %w", syscall.EIO)}}}
	if _, err := readLoop(src, &options{}, io.Discard, io.Discard); !errors.Is(err, syscall.EIO) {
		t.Errorf("readLoop: %v, want EIO", err)
	}
}

func TestReadLoopStopsOnClose(t *testing.T) {
	src := &closedSource{}
	if _, err := readLoop(src, &options{}, io.Discard, io.Discard); err != nil {
		t.Errorf("closed source: %v, want a clean end", err)
	}
}

type closedSource struct{}

func (closedSource) ReadInto(*perfbuf.Sample) error {
	return fmt.Errorf("read perf event array \"events\": %w", os.ErrClosed)
}

// The BPF object is built in: the object `make bpf` wrote is embedded, byte
// for byte, or an executable built before `make bpf` says what to do.
func TestBuiltInObject(t *testing.T) {
	onDisk, err := os.ReadFile(filepath.Join("bpf", objName))
	if errors.Is(err, fs.ErrNotExist) {
		_, _, err := openModule("")
		if !errors.Is(err, errNoObject) || !strings.Contains(err.Error(), "make bpf") || !strings.Contains(err.Error(), "--bpf-obj") {
			t.Errorf("no object built in: %v, want the hint to run make bpf or pass --bpf-obj", err)
		}
		if os.Getenv("CI") == "true" {
			t.Fatalf("%s missing under CI: run make bpf", embeddedObj)
		}
		t.Skipf("%s not built: run make bpf", embeddedObj)
	}
	if err != nil {
		t.Fatal(err)
	}
	built, err := bpfDir.ReadFile(embeddedObj)
	if err != nil {
		t.Fatalf("object not embedded: %v", err)
	}
	if !bytes.Equal(built, onDisk) {
		t.Errorf("embedded object (%d bytes) differs from %s (%d bytes)", len(built), embeddedObj, len(onDisk))
	}
}

// --bpf-obj replaces the built-in object: a file that is not one fails to
// open, with its path in the error, before anything needs privileges.
func TestBPFObjOverrides(t *testing.T) {
	bad := filepath.Join(t.TempDir(), "not-an-object.bpf.o")
	if err := os.WriteFile(bad, []byte("not an ELF file"), 0o644); err != nil {
		t.Fatal(err)
	}
	o, err := parseFlags([]string{"--bpf-obj", bad}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if tr, err := openTracer(o.tracer); err == nil || !strings.Contains(err.Error(), "open "+bad+": ") {
		if err == nil {
			tr.close()
		}
		t.Errorf("--bpf-obj %s (not ELF): %v, want it opened, and refused", bad, err)
	}
	missing := filepath.Join(t.TempDir(), objName)
	if _, err := openTracer(tracerConfig{objPath: missing, uid: -1, maxArgs: 20}); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("--bpf-obj %s (missing): %v, want ErrNotExist", missing, err)
	}
}
