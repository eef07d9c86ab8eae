// SPDX-License-Identifier: Apache-2.0

package bpfbuffer

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/perfbuf/perfbuf"
	"github.com/perfbuf/perfbuf/internal/bpfrun"
)

// stampedOffset is where the program's stamped key sits (viaStamped).
const stampedOffset = 16

// Order.StampedKeys over a ring per CPU and over one ring for 2 CPUs (on a
// 2-CPU host, one ring in all), the keys read by perfbuf_stamp after the
// reservation, MaxDelay an hour (rule 2's window as long), so that
// nothing but rule 1 releases a record at a trickle:
//
//   - with StampedKeys, each record of a trickle is delivered while the
//     rings are otherwise empty (the read's deadline bounds only a stall);
//   - without, the first one is not: a ring buffer shared by CPUs, or a
//     CPU's ring that shows no key, holds rule 1 back;
//   - every CPU at once, a record each a round, many rounds: the keys
//     never fall and none is late, so a ring found empty showed no time
//     past a key still to come (stampSlack).
func TestStampedKeys(t *testing.T) {
	for _, n := range []int{1, 2} {
		t.Run(fmt.Sprintf("%d CPUs a ring", n), func(t *testing.T) {
			p := setupPerCPU(t, n)
			f := p.fixture
			open := func(stamped bool) *perfbuf.Reader {
				ord := perfbuf.Order{KeyOffset: stampedOffset, StampedKeys: stamped, MaxDelay: time.Hour}
				r, err := perfbuf.NewReader(p.m, perfbuf.ReaderOptions{Options: p.opts, Order: &ord})
				if err != nil {
					t.Fatal(err)
				}
				return r
			}

			// Without StampedKeys, MaxDelay holds the first record.
			r := open(false)
			f.produce(t, f.cpus[0], 1, 32, viaStamped, 1)
			r.SetDeadline(time.Now().Add(100 * time.Millisecond))
			var s perfbuf.Sample
			if err := r.ReadInto(&s); !errors.Is(err, os.ErrDeadlineExceeded) {
				t.Fatalf("without StampedKeys: %v, key %d; want the record held (MaxDelay)", err, s.Key)
			}
			r.Flush()
			r.SetDeadline(time.Now().Add(30 * time.Second))
			if err := r.ReadInto(&s); err != nil {
				t.Fatalf("after a Flush: %v", err)
			}
			r.Close()

			r = open(true)
			defer r.Close()
			last := uint64(0)
			read := func(what string, n int) {
				t.Helper()
				r.SetDeadline(time.Now().Add(30 * time.Second))
				for i := range n {
					if err := r.ReadInto(&s); err != nil {
						t.Fatalf("%s, record %d of %d: %v", what, i, n, err)
					}
					key := binary.NativeEndian.Uint64(s.Data[stampedOffset:])
					if s.Key != key || key < last || s.Late {
						t.Fatalf("%s, record %d of %d: key %d (stamped %d) after %d, late %v", what, i, n, s.Key, key, last, s.Late)
					}
					last = key
				}
			}
			for i := range 20 {
				f.produce(t, f.cpus[i%len(f.cpus)], 1, 32, viaStamped, 1)
				read("a trickle", 1)
			}

			// Every CPU at once, from a goroutine each: the program runs on
			// the CPU (BPF_F_TEST_RUN_ON_CPU) while the reader looks.
			const rounds = 200
			for range rounds {
				var wg sync.WaitGroup
				errs := make(chan error, len(f.cpus))
				for _, cpu := range f.cpus {
					wg.Add(1)
					go func() {
						defer wg.Done()
						if ret, err := bpfrun.Run(f.prog, cpu, 1, 32, viaStamped, 1); err != nil || ret != 0 {
							errs <- fmt.Errorf("run on cpu %d: %d, %v", cpu, ret, err)
						}
					}()
				}
				read("every CPU at once", len(f.cpus))
				wg.Wait()
				close(errs)
				for err := range errs {
					t.Fatal(err)
				}
			}
			r.Close() // (Stats then count every record delivered)
			st := r.Stats()
			late, samples := st.Late, st.Samples
			if late != 0 || samples != 20+rounds*uint64(len(f.cpus)) {
				t.Errorf("Stats: %d samples, %d late", samples, late)
			}
		})
	}
}
