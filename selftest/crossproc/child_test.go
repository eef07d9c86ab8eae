// SPDX-License-Identifier: Apache-2.0

package crossproc

import (
	"bufio"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/perfbuf/perfbuf"
)

// childEnv, set in a child's environment, says what TestChild reads:
// "dir,kind,ringBytes,log" (kind "perf" or "ringbuf"; log the file it
// logs every delivered record to).
const childEnv = "PERFBUF_CROSSPROC_CHILD"

// logEntry is the size of a log entry: the u32 CPU and the u64 seq of a
// delivered sample, host byte order.
const logEntry = 12

// TestChild is a reader in a child process of the tests of this package:
// a Reader of the maps pinned in the directory $PERFBUF_CROSSPROC_CHILD
// names. It answers "open" once its Reader is open, then, a line each:
// "read" starts reading (Each, on a goroutine of its own) and answers
// "reading"; "drain" Flushes, waits until that read returned ErrFlushed and
// answers "drained"; "close" closes the Reader and answers "closed " and
// its Stats in JSON, then exits. Every sample it delivers, it writes to
// its log (its CPU and seq, one write(2)) before the function returns, so
// that what it logged covers what it committed.
func TestChild(t *testing.T) {
	env := os.Getenv(childEnv)
	if env == "" {
		t.Skip("a child of the tests of this package")
	}
	answer := func(format string, args ...any) { fmt.Printf("crossproc: "+format+"\n", args...) }
	fail := func(err error) {
		answer("error: %v", err)
		t.Fatal(err)
	}
	args := strings.Split(env, ",")
	if len(args) != 4 {
		fail(fmt.Errorf("%s=%q: want dir,kind,ringBytes,log", childEnv, env))
	}
	dir, kind, logPath := args[0], args[1], args[3]
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
	r, err := perfbuf.NewReader(perfbuf.MapFD(events.FD()), perfbuf.ReaderOptions{Options: opts})
	if err != nil {
		fail(err)
	}
	defer r.Close()
	answer("open")

	var (
		buf   []byte
		entry [logEntry]byte
	)
	deliver := func(rec *perfbuf.Record) error {
		if rec.Type != perfbuf.RecordSample {
			return nil // a perf ring's lost records: counted in Stats.Lost
		}
		buf = rec.AppendTo(buf[:0])
		if len(buf) < 16 {
			return fmt.Errorf("%d-byte sample", len(buf))
		}
		seq, cpu := binary.NativeEndian.Uint64(buf), binary.NativeEndian.Uint32(buf[8:])
		want := -1
		if kind == "perf" {
			want = int(cpu)
		}
		if rec.CPU != want {
			return fmt.Errorf("sample %d of cpu %d delivered for cpu %d, want %d", seq, cpu, rec.CPU, want)
		}
		binary.NativeEndian.PutUint32(entry[:], cpu)
		binary.NativeEndian.PutUint64(entry[4:], seq)
		_, err := log.Write(entry[:])
		return err
	}
	var done chan error // the read's end, once "read" started it
	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
		switch in.Text() {
		case "read":
			done = make(chan error, 1)
			go func() { done <- r.Each(context.Background(), deliver) }()
			answer("reading")
		case "drain":
			if done == nil {
				fail(errors.New("drain before read"))
			}
			r.Flush()
			if err := <-done; !errors.Is(err, perfbuf.ErrFlushed) {
				fail(fmt.Errorf("drain: the read ended with %v, want ErrFlushed", err))
			}
			done = nil
			answer("drained")
		case "close":
			if err := r.Close(); err != nil {
				fail(err)
			}
			if done != nil {
				if err := <-done; !errors.Is(err, os.ErrClosed) {
					fail(fmt.Errorf("close: the read ended with %v, want os.ErrClosed", err))
				}
			}
			st, err := json.Marshal(r.Stats())
			if err != nil {
				fail(err)
			}
			answer("closed %s", st)
			return
		default:
			fail(fmt.Errorf("unknown command %q", in.Text()))
		}
	}
	fail(errors.New("stdin closed"))
}
