// SPDX-License-Identifier: Apache-2.0

package bpfbuffer

// A ring buffer per CPU against one shared ring buffer of the same total
// size, with a producer flat out on every online CPU (issue 30, item 3):
// one round per run of the benchmark, so -count=7 gives 7 rounds, the two
// layouts taking turns.
//
//	go test -run '^$' -bench BenchmarkFlood -benchtime 1x -count 7 ./selftest/bpfbuffer/

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/perfbuf/perfbuf"
	"github.com/perfbuf/perfbuf/bpfbuffer"
	"github.com/perfbuf/perfbuf/internal/bpfrun"
	"github.com/perfbuf/perfbuf/internal/cpus"
	"github.com/perfbuf/perfbuf/selftest/internal/bpftest"
	"github.com/perfbuf/perfbuf/selftest/internal/ledger"
)

// floodFor is how long the producers run in a round.
const floodFor = time.Second

// BenchmarkFlood reports, per round: records delivered a second
// (records/s), the share of attempts refused as full (loss%), and the
// attempts a second (attempts/s). Each ring per CPU has 256 KiB; the
// shared ring has as much as all of them. "all" floods from every online
// CPU; "one" from the last online CPU only, which leaves the reader the
// others (and a shared ring no contention).
func BenchmarkFlood(b *testing.B) {
	for _, producers := range []string{"all", "one"} {
		for _, layout := range []struct {
			name string
			kind bpfbuffer.Kind
		}{
			{"shared", bpfbuffer.RingBuf},
			{"percpu", bpfbuffer.RingBufPerCPU},
		} {
			b.Run(producers+"/"+layout.name, func(b *testing.B) {
				for range b.N {
					flood(b, layout.kind, producers == "all")
				}
			})
		}
	}
}

func flood(b *testing.B, kind bpfbuffer.Kind, all bool) {
	const perRing = 256 << 10
	b.StopTimer()
	online, err := cpus.Online()
	if err != nil {
		b.Fatal(err)
	}
	ring := perRing
	if kind == bpfbuffer.RingBuf {
		ring = perRing * len(online) // rounded up to a power of two
	}
	f := setup(b, kind, &perfbuf.Options{RingBytes: ring})
	m, opts, err := bpfbuffer.Maps(f.mod, "events", perfbuf.Options{})
	if err != nil {
		b.Fatal(err)
	}
	r, err := perfbuf.NewReader(m, perfbuf.ReaderOptions{Options: opts})
	if err != nil {
		b.Fatal(err)
	}
	defer r.Close()
	var delivered atomic.Uint64
	readDone := make(chan error, 1)
	go func() {
		readDone <- r.Each(context.Background(), func(rec *perfbuf.Record) error {
			if rec.Type == perfbuf.RecordSample {
				delivered.Add(1)
			}
			return nil
		})
	}()
	producers := online
	if !all {
		producers = online[len(online)-1:]
	}
	var stop atomic.Bool
	var wg sync.WaitGroup
	errs := make(chan error, len(online))
	b.StartTimer()
	start := time.Now()
	for _, cpu := range producers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for !stop.Load() {
				if _, err := bpfrun.Run(f.prog, cpu, batch, 48, viaOutput, 1); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	time.Sleep(floodFor)
	stop.Store(true)
	wg.Wait()
	elapsed := time.Since(start)
	b.StopTimer()
	close(errs)
	for err := range errs {
		b.Fatal(err)
	}
	r.Flush()
	if err := <-readDone; !errors.Is(err, perfbuf.ErrFlushed) {
		b.Fatal(err)
	}
	if err := r.Close(); err != nil {
		b.Fatal(err)
	}
	var attempts, full, ok uint64
	for _, o := range bpftest.PerCPU[ledger.Outcome](b, f.mod, "outcomes") {
		attempts += o.Attempts
		full += o.Full
		ok += o.OK
	}
	st := r.Stats()
	samples, left := st.Samples, st.Left
	if samples != delivered.Load() || samples+left != ok || ok+full != attempts {
		b.Errorf("delivered %d, Stats %d samples + %d left; the program: %d attempts, %d ok, %d full", delivered.Load(), samples, left, attempts, ok, full)
	}
	secs := elapsed.Seconds()
	b.ReportMetric(float64(samples)/secs, "records/s")
	b.ReportMetric(float64(attempts)/secs, "attempts/s")
	b.ReportMetric(100*float64(full)/float64(attempts), "loss%")
	b.ReportMetric(0, "ns/op")
}
