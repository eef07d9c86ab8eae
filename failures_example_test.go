// SPDX-License-Identifier: Apache-2.0

//go:build cgo

package perfbuf_test

import (
	"fmt"
	"log"

	"github.com/aquasecurity/libbpfgo"

	"github.com/perfbuf/perfbuf"
)

// A program that outputs through perfbuf_output (bpf/perfbuf.bpf.h) counts
// the outputs that failed before reaching a ring in its failure map
// (PERFBUF_FAILURE_MAP(failures)); the reader's Stats report them per CPU,
// by cause, beside what was delivered and lost.
func ExampleFailures() {
	m, err := libbpfgo.NewModuleFromFileArgs(libbpfgo.NewModuleArgs{BPFObjPath: "prog.bpf.o", SkipMemlockBump: true})
	if err != nil {
		log.Fatal(err)
	}
	defer m.Close()
	if err := m.BPFLoadObject(); err != nil {
		log.Fatal(err)
	}
	events, err := m.GetMap("events")
	if err != nil {
		log.Fatal(err)
	}
	failures, err := m.GetMap("failures")
	if err != nil {
		log.Fatal(err)
	}
	r, err := perfbuf.NewReader(events, perfbuf.ReaderOptions{Options: perfbuf.Options{FailureMap: failures}})
	if err != nil {
		log.Fatal(err) // os.ErrInvalid if failures is not a PERFBUF_FAILURE_MAP
	}
	// ... read, then stop the producers and Flush ...
	r.Close()

	// After Close, Failed holds the counts when the rings were freed, and
	// the whole identity of Stats adds up. A CPU may have several entries
	// (and one without a ring, for failures only): sum them by CPU.
	output := map[int]uint64{}
	for _, s := range r.Stats() {
		output[s.CPU] += s.Samples + s.Dropped + s.Lost + s.Discarded + s.Left + s.Failed.Total()
		if f := s.Failed; f.Total() > 0 {
			fmt.Printf("cpu %d: %d outputs failed: %d no ring, %d index past max_entries, %d bad flags, %d another CPU's ring, %d ring full, %d other\n",
				s.CPU, f.Total(), f.NoEntry, f.TooBig, f.Invalid, f.NotOnCPU, f.Full, f.Other)
		}
	}
	for cpu, n := range output {
		fmt.Printf("cpu %d: the program output %d samples\n", cpu, n)
	}
}
