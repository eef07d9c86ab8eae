// SPDX-License-Identifier: Apache-2.0

package ciliumbuffer_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"os/signal"
	"syscall"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/perfbuf/perfbuf"
	"github.com/perfbuf/perfbuf/bpfbuffer/ciliumbuffer"
)

// A program whose buffer is declared with PERFBUF_BUFFER(events, ...) of
// bpf/perfbuf.bpf.h, loaded by cilium/ebpf as a ring buffer per CPU where
// the kernel allows (256 KiB each), one ring buffer or a perf event array
// elsewhere, and read the same way whichever it became. It needs root (CAP_BPF, CAP_PERFMON): compiled, not run.
func ExamplePrepare() {
	spec, err := ebpf.LoadCollectionSpec("prog.bpf.o")
	if err != nil {
		log.Fatal(err)
	}
	opts := perfbuf.Options{RingBytes: 256 << 10}
	kind, err := ciliumbuffer.Prepare(spec, "events", ciliumbuffer.Any, &opts)
	if err != nil {
		log.Fatal(err)
	}
	coll, err := ebpf.NewCollection(spec)
	if err != nil {
		log.Fatal(err)
	}
	defer coll.Close()
	tp, err := link.Tracepoint("syscalls", "sys_enter_openat", coll.Programs["handle_openat"], nil)
	if err != nil {
		log.Fatal(err)
	}
	defer tp.Close()

	events, opts, err := ciliumbuffer.Maps(coll, "events", opts)
	if err != nil {
		log.Fatal(err)
	}
	r, err := perfbuf.NewReader(events, perfbuf.ReaderOptions{Options: opts, MaxLatency: 10 * time.Millisecond})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("reading a %v\n", kind)

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	err = r.Each(ctx, func(rec *perfbuf.Record) error {
		if rec.Type == perfbuf.RecordSample {
			fmt.Printf("%d bytes\n", rec.Len())
		}
		return nil
	})
	if !errors.Is(err, context.Canceled) {
		log.Print(err)
	}
	r.Close()
	// Once closed, every output is accounted for (docs/failures.md), in
	// the sums; a ring buffer's one entry adds up alone too, a perf event
	// array's entries of a CPU together.
	st := r.Stats()
	output := st.Samples + st.Lost + st.Discarded + st.Left + st.Failed.Total() + st.NotRun
	fmt.Printf("%d output: %d delivered, %d lost, %d discarded, %d left, %d failed\n",
		output, st.Samples, st.Lost, st.Discarded, st.Left, st.Failed.Total())
	for i, rs := range st.Rings {
		fmt.Printf("ring %d cpu %d: %d delivered, %d lost, %d left\n", i, rs.CPU, rs.Samples, rs.Lost, rs.Left)
	}
}

// The same buffer as a ring buffer per 2 CPUs: an array of ring buffers
// whose rings cilium/ebpf makes with the collection and puts in their
// slots before NewCollection returns. Maps hands the Reader the rings
// themselves, so it needs no CAP_SYS_ADMIN. It needs root (CAP_BPF):
// compiled, not run.
func ExamplePrepare_ringPerCPU() {
	spec, err := ebpf.LoadCollectionSpec("prog.bpf.o")
	if err != nil {
		log.Fatal(err)
	}
	// 64 KiB a ring, not in all.
	opts := perfbuf.Options{RingBytes: 64 << 10}
	if _, err := ciliumbuffer.Prepare(spec, "events", ciliumbuffer.RingBufPerCPU, &opts, ciliumbuffer.CPUsPerRing(2)); err != nil {
		log.Fatal(err)
	}
	coll, err := ebpf.NewCollection(spec)
	if err != nil {
		log.Fatal(err)
	}
	defer coll.Close()
	events, opts, err := ciliumbuffer.Maps(coll, "events", opts)
	if err != nil {
		log.Fatal(err)
	}
	r, err := perfbuf.NewReader(events, perfbuf.ReaderOptions{Options: opts})
	if err != nil {
		log.Fatal(err)
	}
	defer r.Close()
	fmt.Printf("reading %d rings\n", 1+len(opts.Maps))
	var s perfbuf.Sample
	for r.ReadInto(&s) == nil {
		fmt.Printf("ring %d: %d bytes\n", s.Ring, len(s.Data))
	}
}

// A buffer read in the order of its records' timestamps, whichever of the
// three layouts Any chooses: a ring buffer per CPU where ring buffers go
// into arrays of maps, which the Order's rule 1 needs to release a key
// without waiting, else one ring buffer, or a perf event array on a kernel
// before 5.8. The same Order reads all three: a perf event array's CPUs
// merged in place, ring buffers through the Reader's window of copies. It
// needs root: compiled, not run.
func ExamplePrepare_ordered() {
	spec, err := ebpf.LoadCollectionSpec("prog.bpf.o")
	if err != nil {
		log.Fatal(err)
	}
	opts := perfbuf.Options{RingBytes: 256 << 10}
	kind, err := ciliumbuffer.Prepare(spec, "events", ciliumbuffer.Any, &opts)
	if err != nil {
		log.Fatal(err)
	}
	coll, err := ebpf.NewCollection(spec)
	if err != nil {
		log.Fatal(err)
	}
	defer coll.Close()
	events, opts, err := ciliumbuffer.Maps(coll, "events", opts)
	if err != nil {
		log.Fatal(err)
	}
	r, err := perfbuf.NewReader(events, perfbuf.ReaderOptions{
		Options: opts,
		// The event's bpf_ktime_get_ns() stamp, its first field; a record
		// waits at most 10 ms for a smaller key from another CPU.
		Order: &perfbuf.Order{KeyOffset: 0, MaxDelay: 10 * time.Millisecond},
	})
	if err != nil {
		log.Fatal(err)
	}
	defer r.Close()
	fmt.Printf("reading %v in order\n", kind)
	var s perfbuf.Sample
	for {
		if err := r.ReadInto(&s); err != nil {
			log.Fatal(err)
		}
		fmt.Printf("%d: %d bytes (late %v)\n", s.Key, len(s.Data), s.Late)
	}
}

// Any *ebpf.Map that perfbuf reads (a perf event array, a ring buffer, an
// array of ring buffers; a failure map) is passed through Map, without
// PERFBUF_BUFFER too. It needs root: compiled, not run.
func ExampleMap() {
	coll, err := ebpf.LoadCollection("prog.bpf.o")
	if err != nil {
		log.Fatal(err)
	}
	defer coll.Close()
	r, err := perfbuf.NewReader(ciliumbuffer.Map(coll.Maps["events"]), perfbuf.ReaderOptions{})
	if err != nil {
		log.Fatal(err)
	}
	defer r.Close()
	// The Reader holds a duplicate of the map's descriptor from here on:
	// coll may be closed, or the *ebpf.Map dropped, while it reads.
	var s perfbuf.Sample
	for {
		if err := r.ReadInto(&s); err != nil {
			log.Print(err)
			return
		}
		fmt.Printf("cpu %d: %d bytes\n", s.CPU, len(s.Data))
	}
}
