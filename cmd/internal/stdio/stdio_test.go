// SPDX-License-Identifier: Apache-2.0

package stdio

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// fakeTimer is a timer of a fake clock: the test fires it.
type fakeTimer struct {
	f       func()
	d       time.Duration
	running bool
	starts  int // arms: newTimer, or Reset
}

func (ft *fakeTimer) Reset(d time.Duration) bool {
	was := ft.running
	ft.d, ft.running = d, true
	ft.starts++
	return was
}

func (ft *fakeTimer) Stop() bool {
	was := ft.running
	ft.running = false
	return was
}

// fire runs the timer's function, as the clock would at its time.
func (ft *fakeTimer) fire(t *testing.T) {
	t.Helper()
	if !ft.running {
		t.Fatal("fire: the timer is not running")
	}
	ft.running = false
	ft.f()
}

// recordingWriter counts the writes it gets.
type recordingWriter struct {
	bytes.Buffer
	writes int
}

func (w *recordingWriter) Write(p []byte) (int, error) {
	w.writes++
	return w.Buffer.Write(p)
}

// newFakeOutput is an output over a recordingWriter, on a fake clock.
func newFakeOutput(lineBuffered bool) (*Writer, *recordingWriter, *fakeTimer) {
	w := &recordingWriter{}
	o := newWriter(w, lineBuffered)
	ft := &fakeTimer{}
	o.newTimer = func(d time.Duration, f func()) flushTimer {
		ft.f = f
		ft.Reset(d)
		return ft
	}
	return o, w, ft
}

func writeLine(t *testing.T, w io.Writer, s string) {
	t.Helper()
	if _, err := io.WriteString(w, s+"\n"); err != nil {
		t.Fatal(err)
	}
}

// Not a terminal: lines wait until FlushDelay after the first, then go in
// one write; no timer runs while nothing waits.
func TestOutputBlockBuffered(t *testing.T) {
	o, w, ft := newFakeOutput(false)
	writeLine(t, o, "one")
	writeLine(t, o, "two")
	if w.writes != 0 || !ft.running || ft.d != FlushDelay || ft.starts != 1 {
		t.Fatalf("after two lines: %d writes, timer running %v for %v, armed %d times; want 0, one timer for %v",
			w.writes, ft.running, ft.d, ft.starts, FlushDelay)
	}
	ft.fire(t)
	if w.String() != "one\ntwo\n" || w.writes != 1 {
		t.Fatalf("after the timer: %d writes of %q, want 1 of both lines", w.writes, w.String())
	}
	if ft.running || ft.starts != 1 {
		t.Errorf("idle after the flush, yet the timer was re-armed (running %v, armed %d times)", ft.running, ft.starts)
	}

	writeLine(t, o, "three")
	if !ft.running || ft.starts != 2 {
		t.Fatalf("a line after the flush: timer running %v, armed %d times; want running, 2", ft.running, ft.starts)
	}
	if err := o.Flush(); err != nil {
		t.Fatal(err)
	}
	if w.String() != "one\ntwo\nthree\n" || w.writes != 2 || ft.running {
		t.Errorf("Flush: %d writes of %q, timer running %v; want 2, all three lines, stopped", w.writes, w.String(), ft.running)
	}
	if err := o.Flush(); err != nil || w.writes != 2 {
		t.Errorf("Flush with nothing buffered: %v, %d writes", err, w.writes)
	}
}

// A full buffer is written at once, without waiting for the timer: a burst
// costs a write per outputBufSize bytes.
func TestOutputFullBuffer(t *testing.T) {
	o, w, ft := newFakeOutput(false)
	line := strings.Repeat("x", 99)
	const n = 2000 // 200000 bytes: 3 full buffers
	for range n {
		writeLine(t, o, line)
	}
	if w.writes != n*100/outputBufSize || w.Len() != w.writes*outputBufSize {
		t.Errorf("%d lines of 100 bytes: %d writes of %d bytes, want %d full buffers", n, w.writes, w.Len(), n*100/outputBufSize)
	}
	if !ft.running {
		t.Error("bytes wait, but no timer runs")
	}
	if err := o.Flush(); err != nil {
		t.Fatal(err)
	}
	if w.Len() != n*100 {
		t.Errorf("after Flush: %d bytes, want %d", w.Len(), n*100)
	}
}

// A terminal: each line is written as it comes; a partial line waits for
// its newline, or the timer.
func TestOutputLineBuffered(t *testing.T) {
	o, w, ft := newFakeOutput(true)
	writeLine(t, o, "one")
	writeLine(t, o, "two")
	if w.String() != "one\ntwo\n" || w.writes != 2 || ft.starts != 0 {
		t.Fatalf("line-buffered: %d writes of %q, timer armed %d times; want 2, both lines, never", w.writes, w.String(), ft.starts)
	}
	io.WriteString(o, "par")
	if w.writes != 2 || !ft.running {
		t.Fatalf("a partial line: %d writes, timer running %v; want 2, running", w.writes, ft.running)
	}
	writeLine(t, o, "tial")
	if w.String() != "one\ntwo\npartial\n" || ft.running {
		t.Errorf("its newline: %q, timer running %v; want the line written, timer stopped", w.String(), ft.running)
	}
}

// errWriter fails every write.
type errWriter struct{}

var errBroken = errors.New("broken")

func (errWriter) Write([]byte) (int, error) { return 0, errBroken }

// A write error, also one of the timer's flush, is returned by every later
// Write and Flush.
func TestOutputWriteError(t *testing.T) {
	o := newWriter(errWriter{}, false)
	ft := &fakeTimer{}
	o.newTimer = func(d time.Duration, f func()) flushTimer { ft.f = f; ft.Reset(d); return ft }
	writeLine(t, o, "one")
	ft.fire(t)
	if _, err := io.WriteString(o, "two\n"); !errors.Is(err, errBroken) {
		t.Errorf("Write after a failed timed flush: %v, want %v", err, errBroken)
	}
	if err := o.Flush(); !errors.Is(err, errBroken) {
		t.Errorf("Flush: %v, want %v", err, errBroken)
	}
}

// With the real clock and a short delay, writers on several goroutines:
// lines show up without a Flush, whole, and none is lost.
func TestOutputTimerConcurrent(t *testing.T) {
	var (
		mu  sync.Mutex
		buf bytes.Buffer
	)
	w := writerFunc(func(p []byte) (int, error) {
		mu.Lock()
		defer mu.Unlock()
		return buf.Write(p)
	})
	o := newWriter(w, false)
	o.delay = 20 * time.Millisecond
	const writers, lines = 4, 500
	var wg sync.WaitGroup
	for g := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range lines {
				fmt.Fprintf(o, "writer %d line %d\n", g, i)
			}
		}()
	}
	wg.Wait()
	deadline := time.Now().Add(5 * time.Second)
	for {
		mu.Lock()
		n := strings.Count(buf.String(), "\n")
		mu.Unlock()
		if n == writers*lines {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d lines written 5 s after the last, with a %v flush delay", n, writers*lines, o.delay)
		}
		time.Sleep(5 * time.Millisecond)
	}
	o.mu.Lock()
	armed := o.armed
	o.mu.Unlock()
	if armed {
		t.Error("everything written, yet a timer is armed")
	}
	seen := map[string]bool{}
	for _, l := range strings.Split(strings.TrimSuffix(buf.String(), "\n"), "\n") {
		var g, i int
		if _, err := fmt.Sscanf(l, "writer %d line %d", &g, &i); err != nil || seen[l] {
			t.Fatalf("line %q: torn or repeated (%v)", l, err)
		}
		seen[l] = true
	}
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }

// The choice of buffering: a terminal is line-buffered; a pipe, a file,
// /dev/null or a writer that is no file are block-buffered.
func TestStdoutBuffering(t *testing.T) {
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	defer w.Close()
	devNull, err := os.OpenFile(os.DevNull, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer devNull.Close()
	file, err := os.Create(t.TempDir() + "/out")
	if err != nil {
		t.Fatal(err)
	}
	defer file.Close()
	for name, w := range map[string]io.Writer{"pipe": w, "/dev/null": devNull, "file": file, "bytes.Buffer": &bytes.Buffer{}} {
		if NewStdout(w).lines {
			t.Errorf("%s: line-buffered, want block-buffered", name)
		}
	}
	pty := openPTY(t)
	if !NewStdout(pty).lines {
		t.Errorf("pseudo-terminal %s: block-buffered, want line-buffered", pty.Name())
	}
}

// openPTY returns the terminal side of a new pseudo-terminal.
func openPTY(t *testing.T) *os.File {
	t.Helper()
	ptmx, err := os.OpenFile("/dev/ptmx", os.O_RDWR|unix.O_NOCTTY, 0)
	if err != nil {
		t.Fatalf("open a pseudo-terminal: %v", err)
	}
	t.Cleanup(func() { ptmx.Close() })
	fd := int(ptmx.Fd())
	if err := unix.IoctlSetPointerInt(fd, unix.TIOCSPTLCK, 0); err != nil {
		t.Fatalf("unlockpt: %v", err)
	}
	n, err := unix.IoctlGetInt(fd, unix.TIOCGPTN)
	if err != nil {
		t.Fatalf("ptsname: %v", err)
	}
	pts, err := os.OpenFile(fmt.Sprintf("/dev/pts/%d", n), os.O_RDWR|unix.O_NOCTTY, 0)
	if err != nil {
		t.Fatalf("open the terminal side: %v", err)
	}
	t.Cleanup(func() { pts.Close() })
	return pts
}
