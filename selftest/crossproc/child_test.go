// SPDX-License-Identifier: Apache-2.0

package crossproc

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/perfbuf/perfbuf"
	"github.com/perfbuf/perfbuf/selftest/internal/child"
)

// childEnv, set in a child's environment, says what TestChild reads:
// "dir,kind,ringBytes,log,mode" (kind "perf" or "ringbuf"; log the file
// it logs every delivered record to; mode "reader", a Reader, "ordered",
// a Reader in order of the samples' seq (orderedKeys), or "callback",
// perfbuf.New).
const childEnv = "PERFBUF_CROSSPROC_CHILD"

// logEntry is the size of a log entry: the u32 CPU and the u64 seq of a
// delivered sample, host byte order.
const logEntry = 12

// TestChild is a reader in a child process of the tests of this package:
// a reader of the maps pinned in the directory $PERFBUF_CROSSPROC_CHILD
// names. It answers "open" once its reader is open, then, a line each:
// "read" starts reading on a goroutine of its own (a Reader's Each, or
// Poll in callback mode) and answers "reading"; "drain" makes it deliver
// what the rings hold (a Reader: Flush, until Each returns ErrFlushed; in
// callback mode: the Poll loop stopped, then Consume) and answers
// "drained"; "held" answers "held" and how many of its rings hold bytes
// it has not committed (Stats.Fill: an ordered Reader's copies not
// delivered keep their space in the ring); "close" closes the reader and
// answers "closed " and its Stats in JSON, then exits. Every sample it delivers, it writes to
// its log (its CPU and seq, one write(2)) before the function returns, so
// that what it logged covers what it committed.
func TestChild(t *testing.T) {
	env := os.Getenv(childEnv)
	if env == "" {
		t.Skip("a child of the tests of this package")
	}
	srv := child.Serve(t, "crossproc")
	answer, fail := srv.Answer, srv.Fail
	args := strings.Split(env, ",")
	if len(args) != 5 {
		fail(fmt.Errorf("%s=%q: want dir,kind,ringBytes,log,mode", childEnv, env))
	}
	dir, kind, logPath, mode := args[0], args[1], args[3], args[4]
	ringBytes, err := strconv.Atoi(args[2])
	if err != nil {
		fail(err)
	}
	events, err := ebpf.LoadPinnedMap(filepath.Join(dir, "events"), nil)
	if err != nil {
		fail(err)
	}
	defer events.Close()
	failures, err := ebpf.LoadPinnedMap(filepath.Join(dir, "events_failures"), nil)
	if err != nil {
		fail(err)
	}
	defer failures.Close()
	log, err := os.OpenFile(logPath, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		fail(err)
	}
	defer log.Close()
	opts := perfbuf.Options{RingBytes: ringBytes, FailureMap: perfbuf.MapFD(failures.FD())}
	var entry [logEntry]byte
	// deliver logs a sample delivered for recCPU.
	deliver := func(recCPU int, data []byte) error {
		if len(data) < 16 {
			return fmt.Errorf("%d-byte sample", len(data))
		}
		seq, cpu := binary.NativeEndian.Uint64(data), binary.NativeEndian.Uint32(data[8:])
		want := -1
		if kind == "perf" {
			want = int(cpu)
		}
		if recCPU != want {
			return fmt.Errorf("sample %d of cpu %d delivered for cpu %d, want %d", seq, cpu, recCPU, want)
		}
		binary.NativeEndian.PutUint32(entry[:], cpu)
		binary.NativeEndian.PutUint64(entry[4:], seq)
		_, err := log.Write(entry[:])
		return err
	}
	var rd reader
	switch mode {
	case "reader":
		r, err := perfbuf.NewReader(perfbuf.MapFD(events.FD()), perfbuf.ReaderOptions{Options: opts})
		if err != nil {
			fail(err)
		}
		rd = &readerMode{r: r, deliver: deliver}
	case "ordered":
		r, err := perfbuf.NewReader(perfbuf.MapFD(events.FD()), perfbuf.ReaderOptions{Options: opts, Order: &orderedKeys})
		if err != nil {
			fail(err)
		}
		rd = &readerMode{r: r, deliver: deliver}
	case "callback":
		c := &callbackMode{}
		c.pb, err = perfbuf.New(perfbuf.MapFD(events.FD()), func(cpu int, data []byte) {
			if err := deliver(cpu, data); err != nil && c.err == nil {
				c.err = err
			}
		}, nil, opts)
		if err != nil {
			fail(err)
		}
		rd = c
	default:
		fail(fmt.Errorf("unknown mode %q", mode))
	}
	defer rd.close()
	answer("open")

	srv.Commands(func(cmd string) bool {
		switch cmd {
		case "read":
			rd.read()
			answer("reading")
		case "held":
			answer("held %d", rd.held())
		case "drain":
			if err := rd.drain(); err != nil {
				fail(err)
			}
			answer("drained")
		case "close":
			st, err := rd.close()
			if err != nil {
				fail(err)
			}
			js, err := json.Marshal(st)
			if err != nil {
				fail(err)
			}
			answer("closed %s", js)
			return true
		default:
			fail(fmt.Errorf("unknown command %q", cmd))
		}
		return false
	})
}

// orderedKeys is the "ordered" mode's Order: the key is a sample's seq, its
// CPU's attempt number, so that the CPUs' keys grow at about the same
// pace; MaxDelay is long (rules 2 and 3: 10 s, and a seq 10^10 larger),
// so that the window holds the copies of a burst until a Flush or Close,
// and under a flood releases by rule 4.
var orderedKeys = perfbuf.Order{KeyOffset: 0, MaxDelay: 10 * time.Second}

// reader is a child's reader, in one mode.
type reader interface {
	read()                         // start reading on a goroutine of its own
	drain() error                  // deliver what the rings hold, and stop reading
	held() int                     // how many rings hold bytes not committed (Stats.Fill)
	close() (perfbuf.Stats, error) // close, stop reading, return the Stats
}

// readerMode reads with a Reader's Each.
type readerMode struct {
	r       *perfbuf.Reader
	deliver func(int, []byte) error
	buf     []byte
	done    chan error // the read's end, once read started it
}

func (m *readerMode) read() {
	m.done = make(chan error, 1)
	go func() {
		m.done <- m.r.Each(context.Background(), func(rec *perfbuf.Record) error {
			if rec.Type != perfbuf.RecordSample {
				return nil // a perf ring's lost records: counted in Stats.Lost
			}
			m.buf = rec.AppendTo(m.buf[:0])
			return m.deliver(rec.CPU, m.buf)
		})
	}()
}

func (m *readerMode) held() int {
	n := 0
	for _, st := range m.r.Stats().Rings {
		if st.Fill > 0 {
			n++
		}
	}
	return n
}

func (m *readerMode) drain() error {
	if m.done == nil {
		return errors.New("drain before read")
	}
	m.r.Flush()
	err := <-m.done
	m.done = nil
	if !errors.Is(err, perfbuf.ErrFlushed) {
		return fmt.Errorf("drain: the read ended with %w, want ErrFlushed", err)
	}
	return nil
}

func (m *readerMode) close() (perfbuf.Stats, error) {
	m.r.Close()
	if m.done != nil {
		if err := <-m.done; !errors.Is(err, os.ErrClosed) {
			return perfbuf.Stats{}, fmt.Errorf("close: the read ended with %w, want os.ErrClosed", err)
		}
		m.done = nil
	}
	return m.r.Stats(), nil
}

// callbackMode reads with perfbuf.New's Poll, then Consume.
type callbackMode struct {
	pb   *perfbuf.PerfBuffer
	err  error // the first delivery's error (the poll's goroutine, then the caller's)
	stop atomic.Bool
	done chan error // the poll loop's end, once read started it
}

func (m *callbackMode) read() {
	m.done = make(chan error, 1)
	go func() {
		for !m.stop.Load() {
			if _, err := m.pb.Poll(10 * time.Millisecond); err != nil {
				m.done <- err
				return
			}
		}
		m.done <- nil
	}()
}

func (m *callbackMode) held() int { return 0 } // (it holds nothing)

func (m *callbackMode) drain() error {
	if m.done == nil {
		return errors.New("drain before read")
	}
	m.stop.Store(true)
	if err := <-m.done; err != nil {
		return fmt.Errorf("drain: the poll ended with %w", err)
	}
	m.done = nil
	if _, err := m.pb.Consume(); err != nil {
		return fmt.Errorf("drain: %w", err)
	}
	return m.err
}

func (m *callbackMode) close() (perfbuf.Stats, error) {
	m.pb.Close()
	if m.done != nil {
		if err := <-m.done; err != nil && !errors.Is(err, os.ErrClosed) {
			return perfbuf.Stats{}, fmt.Errorf("close: the poll ended with %w, want os.ErrClosed", err)
		}
		m.done = nil
	}
	return m.pb.Stats(), m.err
}
