//go:build cgo

package perfbuf_test

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log"
	"os"
	"time"

	"github.com/aquasecurity/libbpfgo"
	"github.com/perfbuf/perfbuf"
)

// These examples need root and a BPF object, so they are compiled but not
// run.

// events loads prog.bpf.o and returns its perf event array "events".
func events() *libbpfgo.BPFMap {
	m, err := libbpfgo.NewModuleFromFileArgs(libbpfgo.NewModuleArgs{
		BPFObjPath:      "prog.bpf.o",
		SkipMemlockBump: true, // kernels >= 5.11 charge BPF memory to the cgroup
	})
	if err != nil {
		log.Fatal(err)
	}
	if err := m.BPFLoadObject(); err != nil {
		log.Fatal(err)
	}
	ev, err := m.GetMap("events")
	if err != nil {
		log.Fatal(err)
	}
	return ev
}

// Callback mode, as perf_buffer__new and perf_buffer__poll.
func ExampleNew() {
	pb, err := perfbuf.New(events(), perfbuf.Options{
		PageCount:     64,
		MaxSampleSize: 256, // fail now, not at run time, if it cannot fit
		SampleFunc: func(cpu int, data []byte) {
			// data is valid during the call only.
			fmt.Printf("cpu %d: %d bytes\n", cpu, len(data))
		},
		LostFunc: func(cpu int, n uint64) {
			fmt.Printf("cpu %d: lost %d\n", cpu, n)
		},
	})
	if err != nil {
		log.Fatal(err)
	}
	go func() {
		time.Sleep(10 * time.Second)
		pb.Close() // wakes the Poll below at once
	}()
	for {
		if _, err := pb.Poll(-1); errors.Is(err, os.ErrClosed) {
			return
		} else if err != nil {
			log.Fatal(err)
		}
	}
}

// Raw mode: read ring 0 in place and commit once.
func ExamplePerfBuffer_Buffer() {
	pb, err := perfbuf.New(events(), perfbuf.Options{})
	if err != nil {
		log.Fatal(err)
	}
	defer pb.Close()
	rb, err := pb.Buffer(0)
	if err != nil {
		log.Fatal(err)
	}
	defer rb.Release()
	var buf []byte
	_, err = rb.Drain(func(rec *perfbuf.Record) bool {
		if rec.Type == perfbuf.RecordSample {
			buf = rec.AppendTo(buf[:0]) // one slice even if the sample wraps
			fmt.Println(len(buf))
		}
		return true
	})
	if errors.Is(err, perfbuf.ErrCorrupt) {
		rb.SkipCorrupt() // counted in rb.Stats().CorruptBytes
	}
}

// All CPUs merged by a bpf_ktime_get_ns() stamp at the start of each sample.
func ExampleNewOrderedReader() {
	pb, err := perfbuf.New(events(), perfbuf.Options{PageCount: 256})
	if err != nil {
		log.Fatal(err)
	}
	defer pb.Close()
	r, err := perfbuf.NewOrderedReader(pb, perfbuf.OrderedOptions{KeyOffset: 0, MaxDelay: 50 * time.Millisecond})
	if err != nil {
		log.Fatal(err)
	}
	defer r.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for s, err := range r.All(ctx) {
		if err != nil {
			continue // the iterator ends on ctx or Close
		}
		switch s.Type {
		case perfbuf.RecordLost:
			fmt.Printf("cpu %d lost %d\n", s.CPU, s.Lost)
		case perfbuf.RecordSample:
			fmt.Printf("%d cpu %d late=%v ts=%d\n", s.Key, s.CPU, s.Late, binary.NativeEndian.Uint64(s.Data))
		}
	}
}
