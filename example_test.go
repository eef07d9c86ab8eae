// SPDX-License-Identifier: Apache-2.0

package perfbuf_test

// Examples of each mode, and of the failure map's counts.

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/perfbuf/perfbuf"
)

// These examples need root and a BPF object, so they are compiled but not
// run.

// events stands for the perf event array "events" of a loaded BPF object:
// a *libbpfgo.BPFMap as it is (bpfbuffer loads one), ciliumbuffer.Map of
// an *ebpf.Map, or a bare descriptor, here one that the process that
// loaded the object passed as descriptor 3.
func events() perfbuf.Map { return perfbuf.MapFD(3) }

// Callback mode, as perf_buffer__new and perf_buffer__poll: a goroutine
// polls, and the lossless stop is Consume, then Close.
func ExampleNew() {
	sample := func(cpu int, data []byte) {
		// data is valid during the call only.
		fmt.Printf("cpu %d: %d bytes\n", cpu, len(data))
	}
	lost := func(cpu int, n uint64) {
		fmt.Printf("cpu %d: lost %d\n", cpu, n)
	}
	pb, err := perfbuf.New(events(), sample, lost, perfbuf.Options{
		RingBytes:     64 << 12,
		MaxSampleSize: 256, // fail now, not at run time, if it cannot fit
	})
	if err != nil {
		log.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			_, err := pb.Poll(-1)
			switch {
			case errors.Is(err, os.ErrClosed):
				return
			case errors.Is(err, perfbuf.ErrCorrupt):
				log.Print(err) // that ring was skipped and counted; the next Poll goes on
			case err != nil:
				log.Fatal(err)
			}
		}
	}()

	time.Sleep(10 * time.Second) // the BPF program runs

	// Stop without loss: once the BPF program writes no more (detach it),
	// Consume delivers what the rings hold; Close then wakes the Poll above
	// at once, with os.ErrClosed. Close alone would drop what the rings
	// hold (counted in Stats as Left).
	if _, err := pb.Consume(); err != nil && !errors.Is(err, perfbuf.ErrCorrupt) {
		log.Fatal(err)
	}
	pb.Close()
	<-done
	// Once closed, what the program output adds up in the sums over every
	// ring (see Stats; a perf ring has no Discarded).
	st := pb.Stats()
	output := st.Samples + st.Lost + st.Discarded + st.Left + st.Failed.Total() + st.NotRun
	fmt.Printf("%d output: %d samples, %d lost, %d left at Close\n", output, st.Samples, st.Lost, st.Left)
	// Each ring's own counts, by buffer index (a CPU that came back online
	// has two rings).
	for i, r := range st.Rings {
		fmt.Printf("ring %d, cpu %d: %d samples, %d lost\n", i, r.CPU, r.Samples, r.Lost)
	}
}

// Raw mode: read ring 0 in place and commit once.
func ExampleRaw_Buffer() {
	raw, err := perfbuf.NewRaw(events(), perfbuf.Options{})
	if err != nil {
		log.Fatal(err)
	}
	defer raw.Close()
	rb, err := raw.Buffer(0)
	if err != nil {
		log.Fatal(err)
	}
	defer rb.Release() // before Close: Close frees the rings once it is released
	var buf []byte
	n, err := rb.Drain(func(rec *perfbuf.Record) error {
		switch rec.Type {
		case perfbuf.RecordSample:
			buf = rec.AppendTo(buf[:0]) // one slice even if the sample wraps
			fmt.Println(len(buf))
		case perfbuf.RecordLost:
			fmt.Println("lost", rec.Lost)
		}
		return nil // an error stops the drain, committed up to this record
	})
	if errors.Is(err, perfbuf.ErrCorrupt) {
		skipped := rb.SkipCorrupt() // counted in rb.Stats() as Corrupt
		log.Printf("%v: %d bytes skipped", err, skipped)
	} else if err != nil {
		log.Fatal(err)
	}
	st := rb.Stats()
	fmt.Printf("%d records; %d of %d bytes in use\n", n, st.Fill, st.Size)
}

// A Reader over every CPU's ring, the fullest first: a ReadInto loop, and a
// Flush to deliver what the rings hold before Close.
func ExampleNewReader() {
	r, err := perfbuf.NewReader(events(), perfbuf.ReaderOptions{
		Options:    perfbuf.Options{WakeupEvents: 32}, // fewer wakeups for the producer
		MaxLatency: 20 * time.Millisecond,             // what raises none is read this often
	})
	if err != nil {
		log.Fatal(err)
	}
	defer r.Close() // frees the rings
	go func() {
		time.Sleep(10 * time.Second)
		r.Flush() // deliver what the rings hold now, then ErrFlushed
	}()
	var s perfbuf.Sample
	for {
		err := r.ReadInto(&s) // reuses s.Data: no allocation per record
		switch {
		case errors.Is(err, perfbuf.ErrFlushed):
			return
		case errors.Is(err, perfbuf.ErrCorrupt):
			log.Print(err) // that ring was skipped and counted; reading goes on
			continue
		case err != nil:
			log.Fatal(err)
		}
		if s.Type == perfbuf.RecordLost {
			fmt.Printf("cpu %d: lost %d\n", s.CPU, s.Lost)
			continue
		}
		fmt.Printf("cpu %d: %d bytes\n", s.CPU, len(s.Data))
	}
}

// Each is the zero-copy read, meant to keep up with the kernel: a record
// costs a parse and a call.
func ExampleReader_Each() {
	r, err := perfbuf.NewReader(events(), perfbuf.ReaderOptions{})
	if err != nil {
		log.Fatal(err)
	}
	defer r.Close()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	var samples, bytes uint64
	for {
		err := r.Each(ctx, func(rec *perfbuf.Record) error {
			// rec.Data and rec.Wrapped alias the ring until fn returns.
			if rec.Type == perfbuf.RecordSample {
				samples++
				bytes += uint64(rec.Len())
			}
			return nil
		})
		if errors.Is(err, perfbuf.ErrCorrupt) {
			log.Print(err) // skipped and counted; Each goes on when called again
			continue
		}
		if !errors.Is(err, context.Canceled) {
			log.Fatal(err)
		}
		break
	}
	fmt.Printf("%d samples, %d bytes\n", samples, bytes)
}

// Every CPU merged in the order of a bpf_ktime_get_ns() stamp at the start
// of each sample, for 10 seconds.
func ExampleOrder() {
	r, err := perfbuf.NewReader(events(), perfbuf.ReaderOptions{
		Options: perfbuf.Options{
			RingBytes: 256 << 12,
		},
		Order: &perfbuf.Order{KeyOffset: 0, MaxDelay: 50 * time.Millisecond},
	})
	if err != nil {
		log.Fatal(err)
	}
	defer r.Close()
	r.SetDeadline(time.Now().Add(10 * time.Second))
	var s perfbuf.Sample
	for {
		err := r.ReadInto(&s)
		switch {
		case errors.Is(err, os.ErrDeadlineExceeded):
			// The sums over every ring, and each ring's own.
			st := r.Stats()
			fmt.Printf("%d samples, %d late\n", st.Samples, st.Late)
			for _, rs := range st.Rings {
				fmt.Printf("cpu %d: %d samples, %d late\n", rs.CPU, rs.Samples, rs.Late)
			}
			return
		case errors.Is(err, perfbuf.ErrCorrupt):
			log.Print(err) // that ring was skipped and counted; reading goes on
			continue
		case err != nil:
			log.Fatal(err)
		}
		switch {
		case s.Type == perfbuf.RecordLost:
			fmt.Printf("cpu %d lost %d\n", s.CPU, s.Lost)
		case s.Late:
			// Released before a smaller key that came later (Order's rules
			// 2 to 4): keep it, or drop it here.
			fmt.Printf("%d cpu %d late\n", s.Key, s.CPU)
		default:
			fmt.Printf("%d cpu %d ts=%d\n", s.Key, s.CPU, binary.NativeEndian.Uint64(s.Data))
		}
	}
}

// A flight recorder: the kernel keeps each CPU's newest records, and a
// signal prints them. Nothing is read in between.
func ExampleRecorder() {
	rec, err := perfbuf.NewRecorder(events(), perfbuf.Options{RingBytes: 1 << 20})
	if err != nil {
		log.Fatal(err)
	}
	defer rec.Close()
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGUSR1)
	buf := make([]byte, 4<<20)
	var recs []perfbuf.Record
	for range sig {
		recs, err = rec.Snapshot(buf, recs[:0], false)
		if err != nil && !errors.Is(err, io.ErrShortBuffer) {
			log.Fatal(err)
		}
		for _, r := range recs { // each CPU's oldest first
			fmt.Printf("cpu %d: %d bytes\n", r.CPU, len(r.Data))
		}
		// What the snapshots returned and left out, summed over the rings.
		st := rec.Stats()
		fmt.Printf("%d records returned, %d left out\n", st.Samples, st.Left)
	}
}

// Batches hands the records out in batches for the caller's own loop: a
// run of one ring's samples in place, whose step (Next) is inlined, so the
// loop makes no call a record. A batch is committed when the loop moves
// on; a break leaves the rest of it for the next read.
func ExampleReader_Batches() {
	r, err := perfbuf.NewReader(events(), perfbuf.ReaderOptions{})
	if err != nil {
		log.Fatal(err)
	}
	defer r.Close()
	var total int
	for b, err := range r.Batches(context.Background()) {
		if err != nil {
			log.Fatal(err)
		}
		for b.Next() {
			rec := b.Record()
			if rec.Type == perfbuf.RecordSample {
				total += rec.Len()
			}
		}
	}
}

// A Recorder over ring buffers, one a CPU, returns them ring after ring:
// Order.Sort merges a snapshot by the time that perfbuf_stamp wrote at the
// start of each record.
func ExampleOrder_Sort() {
	rec, err := perfbuf.NewRecorder(events(), perfbuf.Options{})
	if err != nil {
		log.Fatal(err)
	}
	defer rec.Close()
	recs, err := rec.Snapshot(make([]byte, 4<<20), nil, false)
	if err != nil && !errors.Is(err, io.ErrShortBuffer) {
		log.Fatal(err)
	}
	if err := (perfbuf.Order{KeyOffset: 0}).Sort(recs); err != nil {
		log.Fatal(err)
	}
	for _, r := range recs { // oldest first, across the rings
		fmt.Printf("%d: ring %d, %d bytes\n", r.Key, r.Ring, len(r.Data))
	}
}

// A program that outputs through perfbuf_output (bpf/perfbuf.bpf.h) counts
// the outputs that failed before reaching a ring in its failure map
// (PERFBUF_FAILURE_MAP(failures)); the reader's Stats report them by
// cause, beside what was delivered and lost.
func ExampleFailures() {
	// The object's maps, as its loader gives them (events in
	// example_test.go): "failures" is its PERFBUF_FAILURE_MAP.
	failures := perfbuf.MapFD(4)
	r, err := perfbuf.NewReader(events(), perfbuf.ReaderOptions{Options: perfbuf.Options{FailureMap: failures}})
	if err != nil {
		log.Fatal(err) // os.ErrInvalid if failures is not a PERFBUF_FAILURE_MAP
	}
	// ... read, then stop the producers and Flush ...
	r.Close()

	// After Close, Failed holds the counts when the rings were freed, and
	// the whole identity of Stats adds up in the sums. (With
	// Options.Programs, NotRun counts the runs the kernel skipped.)
	st := r.Stats()
	output := st.Samples + st.Lost + st.Discarded + st.Left + st.Failed.Total() + st.NotRun
	f := st.Failed
	fmt.Printf("the program output %d samples: %d delivered, %d lost, %d left at Close, %d failed\n",
		output, st.Samples, st.Lost, st.Left, f.Total())
	fmt.Printf("failed: %d no ring, %d index past max_entries, %d bad flags, %d another CPU's ring, %d other\n",
		f.NoEntry, f.TooBig, f.Invalid, f.NotOnCPU, f.Other)
	// A perf ring's entry has its CPU's failures; those of a CPU without a
	// ring are in the sums only.
	for _, rs := range st.Rings {
		if rs.Failed.Total() > 0 {
			fmt.Printf("cpu %d: %d outputs failed\n", rs.CPU, rs.Failed.Total())
		}
	}
}
