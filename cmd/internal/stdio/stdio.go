// SPDX-License-Identifier: Apache-2.0

// Package stdio buffers a tool's stdout as C's stdio buffers the C tools'
// printf: by line on a terminal, else in blocks. A write(2) per line costs
// a context switch per event on a busy machine (#16). cmd/execsnoop and
// cmd/mountsnoop write their lines through it.
package stdio

import (
	"bufio"
	"bytes"
	"io"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

const (
	// outputBufSize is the buffer of a stdout that is not a terminal:
	// about 300 lines of 200 bytes, so that a burst of events costs one
	// write. (glibc sizes it by st_blksize: 4 KiB for a pipe.)
	outputBufSize = 64 << 10
	// FlushDelay bounds how long a line waits in the buffer: unlike C's
	// stdio, which waits for a full buffer, `execsnoop | grep` shows each
	// event within about a second.
	FlushDelay = time.Second
)

// Writer buffers what goes to stdout. On a terminal it is line-buffered,
// as stdio is: a write that holds a newline is written out at once. Else
// it is block-buffered: written when outputBufSize bytes are waiting, or
// FlushDelay after the first of them, whichever comes first. Callers
// Flush at the end.
//
// A timer is armed only while bytes are waiting, so an idle tool does not
// wake. Its flush runs on the timer's goroutine, so every method takes mu,
// and a Writer may be written from several goroutines. A write error is
// kept: every later Write and Flush returns it.
type Writer struct {
	mu    sync.Mutex
	bw    *bufio.Writer
	lines bool // line-buffered
	delay time.Duration
	// newTimer starts a timer that calls f after d (time.AfterFunc; tests
	// pass a fake clock's).
	newTimer func(d time.Duration, f func()) flushTimer
	timer    flushTimer // nil until first armed
	armed    bool       // a flush is due within delay of the oldest waiting byte
}

// flushTimer is what Writer needs of a *time.Timer.
type flushTimer interface {
	Reset(d time.Duration) bool
	Stop() bool
}

// NewStdout returns the Writer for stdout w: line-buffered if w is a
// terminal, as stdio decides. Flush it when the tool is done.
func NewStdout(w io.Writer) *Writer {
	return newWriter(w, isTerminal(w))
}

func newWriter(w io.Writer, lineBuffered bool) *Writer {
	return &Writer{
		bw:    bufio.NewWriterSize(w, outputBufSize),
		lines: lineBuffered,
		delay: FlushDelay,
		newTimer: func(d time.Duration, f func()) flushTimer {
			return time.AfterFunc(d, f)
		},
	}
}

// Write buffers p, writing out what the buffering policy says is due.
func (o *Writer) Write(p []byte) (int, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	n, err := o.bw.Write(p)
	if err == nil && o.lines && bytes.IndexByte(p, '\n') >= 0 {
		err = o.bw.Flush()
	}
	switch {
	case o.bw.Buffered() == 0:
		o.disarm()
	case !o.armed:
		o.armed = true
		if o.timer == nil {
			o.timer = o.newTimer(o.delay, o.timedFlush)
		} else {
			o.timer.Reset(o.delay)
		}
	}
	return n, err
}

// Flush writes out everything buffered.
func (o *Writer) Flush() error {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.disarm()
	return o.bw.Flush()
}

// timedFlush is the timer's: it writes out what has waited. A call that
// comes late, after another flush, writes out what came since, early,
// which does no harm: armed stays a promise that a flush is due within
// delay.
func (o *Writer) timedFlush() {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.armed = false
	o.bw.Flush() // an error stays in bw for the next Write or Flush
}

// disarm stops the timer: nothing waits.
func (o *Writer) disarm() {
	if o.armed {
		o.timer.Stop()
		o.armed = false
	}
}

// isTerminal reports whether w is a terminal, as isatty(3) decides for
// stdio: a file on which tcgetattr (the TCGETS ioctl) succeeds.
func isTerminal(w io.Writer) bool {
	sc, ok := w.(syscall.Conn)
	if !ok {
		return false
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return false
	}
	var terr error
	if err := rc.Control(func(fd uintptr) {
		_, terr = unix.IoctlGetTermios(int(fd), unix.TCGETS)
	}); err != nil {
		return false
	}
	return terr == nil
}
