// SPDX-License-Identifier: Apache-2.0

package main

// Flight-recorder mode (--recorder MiB): the kernel keeps the newest calls
// in rings that overwrite their oldest records, nothing is read while the
// programs run, and the calls the rings hold are printed on SIGUSR1 and at
// exit (perfbuf.Recorder).

import (
	"cmp"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"slices"
	"syscall"
	"time"

	"github.com/perfbuf/perfbuf"
	"github.com/perfbuf/perfbuf/cmd/internal/stdio"
	"github.com/perfbuf/perfbuf/cmd/internal/tool"
	"github.com/perfbuf/perfbuf/internal/cpus"
)

// snapshotter is what printSnapshot reads: a *perfbuf.Recorder, or a fake
// in tests.
type snapshotter interface {
	Snapshot(buf []byte, dst []perfbuf.Record, onlyNew bool) ([]perfbuf.Record, error)
}

// perCPUShare returns each CPU's ring size of a perf event array that
// keeps mib MiB in all: an equal share for each online CPU (perfbuf rounds
// it up to a power of two pages).
func perCPUShare(mib int) (int, error) {
	online, err := cpus.Online()
	if err != nil {
		return 0, err
	}
	return max(mib<<20/len(online), os.Getpagesize()), nil
}

// record runs the flight recorder until SIGINT, SIGTERM or the end of
// --duration, printing a snapshot on each SIGUSR1 and one at the end, then
// a summary; it returns the exit status.
func record(o *options, t *tracer, out *stdio.Writer, stderr io.Writer) int {
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGUSR1)
	defer signal.Stop(sigs)
	var expired <-chan time.Time
	if o.duration > 0 {
		timer := time.NewTimer(o.duration)
		defer timer.Stop()
		expired = timer.C
	}
	size := t.rec.Stats().Size // what the rings hold: room for every record of a snapshot
	fmt.Fprintf(stderr, "mountsnoop: keeping the newest calls in %s of %d bytes in overwrite mode; SIGUSR1 (kill -USR1 %d) prints them, and so does the end\n",
		kindText(t.kind), size, os.Getpid())
	s := snapshot{buf: make([]byte, size)}
	var c counts
	snapshots := 0
	start := time.Now()
	for done := false; ; {
		select {
		case sig := <-sigs:
			done = sig != syscall.SIGUSR1
		case <-expired:
			done = true
		}
		err := s.print(t.rec, &o.printer, out, stderr, &c)
		if ferr := out.Flush(); err == nil {
			err = ferr
		}
		if err != nil {
			fmt.Fprintf(stderr, "mountsnoop: %v\n", err)
			return 1
		}
		snapshots++
		if done {
			break
		}
	}
	st := t.rec.Stats()
	fmt.Fprintf(stderr, "\n%d snapshots, %d calls printed, %d lost, %d left out of snapshots (Stats.Left)", snapshots, c.events, c.lost, st.Left)
	for _, t := range []string{tool.FailuresText(st.Failed), tool.SkippedText(st.NotRun, "calls")} {
		if t != "" {
			fmt.Fprintf(stderr, ", %s", t)
		}
	}
	fmt.Fprintf(stderr, " in %.1fs, from %s\n", time.Since(start).Seconds(), kindText(t.kind))
	return 0
}

// snapshot is one printSnapshot's buffers, kept for the next.
type snapshot struct {
	buf  []byte
	recs []perfbuf.Record
	evs  []event
	line []byte
}

// printSnapshot prints the calls that src's rings hold, the oldest first
// (the CPUs' rings merged by the time of each call), under the column
// header, and a line on stderr that says how many. A perf ring's lost
// records go to stderr, as the read loop's do. It adds what it printed to
// c.
func (s *snapshot) print(src snapshotter, p *printer, stdout, stderr io.Writer, c *counts) error {
	var err error
	s.recs, err = src.Snapshot(s.buf, s.recs[:0], false)
	if errors.Is(err, io.ErrShortBuffer) {
		fmt.Fprintf(stderr, "mountsnoop: %v\n", err) // the records that fit are printed
	} else if err != nil {
		return err
	}
	s.evs = s.evs[:0]
	var lost uint64
	for _, r := range s.recs {
		if r.Type == perfbuf.RecordLost {
			lost += r.Lost
			fmt.Fprintf(stderr, "lost %d events on CPU #%d\n", r.Lost, r.CPU)
			continue
		}
		var ev event
		if err := decodeEvent(r.Data, &ev); err != nil {
			c.bad++
			fmt.Fprintf(stderr, "mountsnoop: cpu %d: %v\n", r.CPU, err)
			continue
		}
		s.evs = append(s.evs, ev)
	}
	slices.SortStableFunc(s.evs, func(a, b event) int { return cmp.Compare(a.TS, b.TS) })
	if _, err := io.WriteString(stdout, p.header()); err != nil {
		return err
	}
	for i := range s.evs {
		s.line = p.appendEvent(s.line[:0], &s.evs[i])
		if _, err := stdout.Write(s.line); err != nil {
			return err
		}
	}
	c.events += uint64(len(s.evs))
	c.lost += lost
	fmt.Fprintf(stderr, "mountsnoop: snapshot: the newest %d calls the rings held\n", len(s.evs))
	return nil
}
