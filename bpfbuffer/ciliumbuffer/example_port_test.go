// SPDX-License-Identifier: Apache-2.0

package ciliumbuffer_test

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log"
	"os"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/perf"
	"github.com/cilium/ebpf/ringbuf"
	"github.com/perfbuf/perfbuf"
	"github.com/perfbuf/perfbuf/bpfbuffer/ciliumbuffer"
)

// event is what the BPF program outputs: struct event { __u32 pid; char
// comm[16]; }, in the host's byte order.
type event struct {
	PID  uint32
	Comm [16]byte
}

// traceCilium is the reader before the port: cilium/ebpf's perf.Reader,
// closed from another goroutine when ctx is done.
func traceCilium(ctx context.Context, events *ebpf.Map) error {
	rd, err := perf.NewReader(events, 64*os.Getpagesize())
	if err != nil {
		return fmt.Errorf("open reader: %w", err)
	}
	defer rd.Close()
	go func() {
		<-ctx.Done()
		rd.Close()
	}()
	var rec perf.Record
	var e event
	for {
		if err := rd.ReadInto(&rec); err != nil {
			if errors.Is(err, os.ErrClosed) {
				return nil
			}
			return fmt.Errorf("read: %w", err)
		}
		if rec.LostSamples != 0 {
			log.Printf("cpu %d: %d samples lost", rec.CPU, rec.LostSamples)
			continue
		}
		if _, err := binary.Decode(rec.RawSample, binary.NativeEndian, &e); err != nil {
			return fmt.Errorf("decode: %w", err)
		}
		fmt.Printf("cpu %d pid %d %s\n", rec.CPU, e.PID, cstring(e.Comm[:]))
	}
}

// tracePerfbuf is the same reader after the port: perfbuf's Reader over
// the same *ebpf.Map, on its defaults, closed from another goroutine when
// ctx is done. Lost samples come as records of their own, with Lost set.
// (tracePerfbufFlushed reads what the rings hold before it returns.)
func tracePerfbuf(ctx context.Context, events *ebpf.Map) error {
	r, err := ciliumbuffer.NewReader(events)
	if err != nil {
		return fmt.Errorf("open reader: %w", err)
	}
	defer r.Close()
	go func() {
		<-ctx.Done()
		r.Close()
	}()
	var s perfbuf.Sample
	var e event
	for {
		if err := r.ReadInto(&s); err != nil {
			if errors.Is(err, os.ErrClosed) {
				return nil
			}
			return fmt.Errorf("read: %w", err)
		}
		if s.Lost != 0 {
			log.Printf("cpu %d: %d samples lost", s.CPU, s.Lost)
			continue
		}
		if _, err := binary.Decode(s.Data, binary.NativeEndian, &e); err != nil {
			return fmt.Errorf("decode: %w", err)
		}
		fmt.Printf("cpu %d pid %d %s\n", s.CPU, e.PID, cstring(e.Comm[:]))
	}
}

// tracePerfbufFlushed is tracePerfbuf that loses nothing when ctx is done:
// Flush makes the Reader deliver what the rings hold, then ReadInto returns
// ErrFlushed. Options such as RingBytes take perfbuf.NewReader.
func tracePerfbufFlushed(ctx context.Context, events *ebpf.Map) error {
	opts := perfbuf.ReaderOptions{Options: perfbuf.Options{RingBytes: 64 * os.Getpagesize()}}
	r, err := perfbuf.NewReader(ciliumbuffer.Map(events), opts)
	if err != nil {
		return fmt.Errorf("open reader: %w", err)
	}
	defer r.Close()
	defer context.AfterFunc(ctx, r.Flush)()
	var s perfbuf.Sample
	var e event
	for {
		err := r.ReadInto(&s)
		switch {
		case errors.Is(err, perfbuf.ErrFlushed):
			return nil
		case err != nil:
			return fmt.Errorf("read: %w", err)
		case s.Lost != 0:
			log.Printf("cpu %d: %d samples lost", s.CPU, s.Lost)
			continue
		}
		if _, err := binary.Decode(s.Data, binary.NativeEndian, &e); err != nil {
			return fmt.Errorf("decode: %w", err)
		}
		fmt.Printf("cpu %d pid %d %s\n", s.CPU, e.PID, cstring(e.Comm[:]))
	}
}

// traceCiliumRing is a ring buffer's reader before the port: cilium/ebpf's
// ringbuf.Reader, closed from another goroutine when ctx is done.
func traceCiliumRing(ctx context.Context, events *ebpf.Map) error {
	rd, err := ringbuf.NewReader(events)
	if err != nil {
		return fmt.Errorf("open reader: %w", err)
	}
	defer rd.Close()
	go func() {
		<-ctx.Done()
		rd.Close()
	}()
	var rec ringbuf.Record
	var e event
	for {
		if err := rd.ReadInto(&rec); err != nil {
			if errors.Is(err, os.ErrClosed) {
				return nil
			}
			return fmt.Errorf("read: %w", err)
		}
		if _, err := binary.Decode(rec.RawSample, binary.NativeEndian, &e); err != nil {
			return fmt.Errorf("decode: %w", err)
		}
		fmt.Printf("pid %d %s\n", e.PID, cstring(e.Comm[:]))
	}
}

// tracePerfbufRing is the same reader after the port. A ring buffer
// has no lost records: its full ring's refused outputs are counted with
// a FailureMap (see logLedger).
func tracePerfbufRing(ctx context.Context, events *ebpf.Map) error {
	r, err := ciliumbuffer.NewReader(events)
	if err != nil {
		return fmt.Errorf("open reader: %w", err)
	}
	defer r.Close()
	go func() {
		<-ctx.Done()
		r.Close()
	}()
	var s perfbuf.Sample
	var e event
	for {
		if err := r.ReadInto(&s); err != nil {
			if errors.Is(err, os.ErrClosed) {
				return nil
			}
			return fmt.Errorf("read: %w", err)
		}
		if _, err := binary.Decode(s.Data, binary.NativeEndian, &e); err != nil {
			return fmt.Errorf("decode: %w", err)
		}
		fmt.Printf("pid %d %s\n", e.PID, cstring(e.Comm[:]))
	}
}

// logLedger is what perfbuf adds: once r is closed, what the programs
// output, and where it went (the identity of perfbuf.Stats, on its sums;
// a ring buffer's Lost and Failed need a FailureMap).
func logLedger(r *perfbuf.Reader) {
	st := r.Stats()
	output := st.Samples + st.Lost + st.Discarded + st.Left + st.Failed.Total() + st.NotRun
	log.Printf("%d output: %d delivered, %d lost, %d discarded, %d left at Close, %d failed", output,
		st.Samples, st.Lost, st.Discarded, st.Left, st.Failed.Total())
}

// cstring returns b up to its first NUL.
func cstring(b []byte) string {
	for i, c := range b {
		if c == 0 {
			return string(b[:i])
		}
	}
	return string(b)
}

// A reader ported from cilium/ebpf's perf.Reader and ringbuf.Reader to
// perfbuf's Reader (docs/migration.md, "From cilium/ebpf"): the loader
// stays cilium/ebpf, and the map is passed as it is. It needs root:
// compiled, not run.
func Example_fromCilium() {
	coll, err := ebpf.LoadCollection("prog.bpf.o")
	if err != nil {
		log.Fatal(err)
	}
	defer coll.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	trace := map[string]func(context.Context, *ebpf.Map) error{
		"cilium":      traceCilium,
		"perfbuf":     tracePerfbuf,
		"flushed":     tracePerfbufFlushed,
		"cilium-ring": traceCiliumRing,
		"ring":        tracePerfbufRing,
	}[os.Args[len(os.Args)-1]]
	if trace == nil {
		trace = tracePerfbuf
	}
	if err := trace(ctx, coll.Maps["events"]); err != nil {
		log.Fatal(err)
	}
}

// The ledger after a read: every output of the programs, delivered or
// not. It needs root: compiled, not run.
func Example_ledger() {
	coll, err := ebpf.LoadCollection("prog.bpf.o")
	if err != nil {
		log.Fatal(err)
	}
	defer coll.Close()
	r, err := perfbuf.NewReader(ciliumbuffer.Map(coll.Maps["events"]), perfbuf.ReaderOptions{
		Options: perfbuf.Options{FailureMap: ciliumbuffer.Map(coll.Maps["failures"])},
	})
	if err != nil {
		log.Fatal(err)
	}
	// Read for 10 s, then what the rings still hold, until ErrFlushed.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	context.AfterFunc(ctx, r.Flush)
	var s perfbuf.Sample
	for r.ReadInto(&s) == nil {
		fmt.Printf("cpu %d: %d bytes\n", s.CPU, len(s.Data))
	}
	r.Close()
	logLedger(r)
}
