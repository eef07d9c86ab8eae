// SPDX-License-Identifier: Apache-2.0

package ciliumbuffer_test

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log"
	"os"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/perf"
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
// the same *ebpf.Map, read zero-copy by Each until ctx is done; once it is
// closed, its Stats account for every sample (and, with a FailureMap,
// every output that failed in the program).
func tracePerfbuf(ctx context.Context, events *ebpf.Map) error {
	r, err := perfbuf.NewReader(ciliumbuffer.Map(events), perfbuf.ReaderOptions{Options: perfbuf.Options{RingBytes: 64 * os.Getpagesize()}})
	if err != nil {
		return fmt.Errorf("open reader: %w", err)
	}
	defer r.Close()
	var buf []byte
	var e event
	err = r.Each(ctx, func(rec *perfbuf.Record) error {
		if rec.Type == perfbuf.RecordLost {
			log.Printf("cpu %d: %d samples lost", rec.CPU, rec.Lost)
			return nil
		}
		// Data aliases the ring until fn returns; a record that
		// straddles the ring's end comes in two parts (Data, Wrapped).
		buf = rec.AppendTo(buf[:0])
		if _, err := binary.Decode(buf, binary.NativeEndian, &e); err != nil {
			return fmt.Errorf("decode: %w", err)
		}
		fmt.Printf("cpu %d pid %d %s\n", rec.CPU, e.PID, cstring(e.Comm[:]))
		return nil
	})
	r.Close()
	var got, lost, left uint64
	for _, st := range r.Stats() {
		got, lost, left = got+st.Samples, lost+st.Lost, left+st.Left
	}
	log.Printf("%d samples delivered, %d lost, %d left in the rings at Close", got, lost, left)
	if errors.Is(err, context.Canceled) {
		return nil
	}
	return err
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

// A reader of a perf event array ported from cilium/ebpf's perf.Reader to
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
	if len(os.Args) > 1 && os.Args[1] == "cilium" {
		err = traceCilium(ctx, coll.Maps["events"])
	} else {
		err = tracePerfbuf(ctx, coll.Maps["events"])
	}
	if err != nil {
		log.Fatal(err)
	}
}
