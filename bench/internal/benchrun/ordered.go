// SPDX-License-Identifier: Apache-2.0

package benchrun

import (
	"context"
	"fmt"
	"time"

	"github.com/perfbuf/perfbuf"
	"github.com/perfbuf/perfbuf/internal/bpfrun"
)

// orderedDrain measures the ordered Reader's merge (ReaderOptions.Order),
// not its waits.
//
// Filled on one CPU only, the rings would never release a record by rule 1
// (every ring has shown a key at least as large): an empty ring shows no
// key, and every record would wait for MaxDelay. So each round fills both
// rings, alternating orderedBatch samples on FillCPU and on DrainCPU(): the
// keys (the samples' ktime, at offset 8) grow from batch to batch, and the
// reader merges two rings that take turns every orderedBatch records.
// Every record but those of the last batch has a larger key on the other
// ring, so rule 1 releases them at once: the round reads them with the
// release rule in force. The last batch would wait for MaxDelay: the round
// then calls Flush (timed, once per round), which releases the rest in key
// order, and reads until ErrFlushed. Each record's key is checked to be
// nondecreasing and not late.
//
// The fill from DrainCPU runs on the draining CPU itself; WakeupEvents is
// set beyond a round's samples (orderedWakeup) so that no wakeup interrupts
// it (a pre-filled drain does not wait for wakeups).
//
// The ordered modes are measured against ModeC2CPU, the C reference over
// the same fill: reading two rings filled in alternating batches, half of
// them on the reading CPU, costs C itself a little more (3-10% here) than
// one ring filled from another CPU does.
type orderedDrain struct {
	e    *bpfrun.Emitter
	size int
	// fillRound writes a round's k samples and returns how many of the
	// last ones no rule releases before Flush: fillBoth's, or over one
	// ring buffer openRBOrdered's.
	fillRound func(k int) (tail int, err error)
	r         *perfbuf.Reader
	s         []perfbuf.Sample // ReadInto the one, or ReadBatch into them all (samplesFor)
	total     uint64
	last      uint64 // the largest key read
	tail      int    // samples of the round's last batch
	checkFn   func(*perfbuf.Sample) error
	each      bool // Reader.Each instead
	batches   bool // Reader.Batches instead
}

func openOrdered(e *bpfrun.Emitter, cfg DrainConfig) (drainer, error) {
	r, err := perfbuf.NewReader(e.Events, perfbuf.ReaderOptions{
		Options: perfbuf.Options{
			RingBytes:    RingBytes(cfg.Pages),
			WakeupEvents: orderedWakeup,
		},
		Order: &perfbuf.Order{
			KeyOffset: 8,
			MaxDelay:  time.Millisecond,
		},
	})
	if err != nil {
		return nil, err
	}
	d := &orderedDrain{e: e, size: cfg.Size, r: r, each: cfg.Mode == ModeOrderedEach, batches: cfg.Mode == ModeOrderedBatches, s: samplesFor(cfg.Mode)}
	d.fillRound = func(k int) (int, error) { return fillBoth(e, k, cfg.Size) }
	d.checkFn = d.check
	return d, nil
}

// fill writes a round's k samples (fillRound) and sets the deadline of
// the reads that drain them.
func (d *orderedDrain) fill(k int) error {
	tail, err := d.fillRound(k)
	d.tail = tail
	d.r.SetDeadline(time.Now().Add(10 * time.Second))
	return err
}

// fillBoth writes k samples of size bytes in batches of orderedBatch that
// alternate between FillCPU and DrainCPU(), and returns the size of the
// last batch.
func fillBoth(e *bpfrun.Emitter, k, size int) (last int, err error) {
	cpus := [2]int{FillCPU, DrainCPU()}
	for i, left := 0, k; left > 0; i++ {
		last = min(orderedBatch, left)
		if err := e.Emit(cpus[i%2], uint64(last), uint64(size), 0); err != nil {
			return 0, err
		}
		left -= last
	}
	return last, nil
}

func (d *orderedDrain) check(s *perfbuf.Sample) error {
	return d.checkKey(s.CPU, s.Key, s.Late)
}

// checkKey checks that a record's key is nondecreasing and not late.
func (d *orderedDrain) checkKey(cpu int, key uint64, late bool) error {
	if late || key < d.last {
		return fmt.Errorf("cpu %d: key %d after %d (late %v)", cpu, key, d.last, late)
	}
	d.last = key
	return nil
}

func (d *orderedDrain) drain(k int) error {
	if d.each || d.batches {
		return d.drainEach(k)
	}
	n, err := readSamples(d.r, d.s, k-d.tail, &d.total, d.checkFn)
	if err != nil {
		return fmt.Errorf("after %d of %d samples: %w", n, k, err)
	}
	d.r.Flush()
	m, err := readUntilFlushed(d.r, d.s, &d.total, d.checkFn)
	return roundEnd(err, n+m, k)
}

// orderedWakeup is the WakeupEvents of the rings that fillBoth fills.
const orderedWakeup = 1 << 30

// drainEach is drain with Each (or Batches): Flush once the records that
// rule 1 releases are read. The type and key checks have their calls only
// on failure, and each loop writes them out: a call a record is what the
// forms differ by.
func (d *orderedDrain) drainEach(k int) error {
	n := 0
	if k == d.tail {
		d.r.Flush()
	}
	if !d.batches {
		err := d.r.Each(context.Background(), func(rec *perfbuf.Record) error {
			if rec.Type != perfbuf.RecordSample {
				return notSample(rec.CPU, rec.Type, rec.Lost)
			}
			if rec.Late || rec.Key < d.last {
				return d.checkKey(rec.CPU, rec.Key, rec.Late)
			}
			d.last = rec.Key
			d.total += readRecord(rec)
			if n++; n == k-d.tail {
				d.r.Flush()
			}
			return nil
		})
		return roundEnd(err, n, k)
	}
	var err error
	for b, e := range d.r.Batches(context.Background()) {
		if err = e; e != nil {
			break
		}
		for b.Next() {
			rec := b.Record()
			if rec.Type != perfbuf.RecordSample {
				return notSample(rec.CPU, rec.Type, rec.Lost)
			}
			if rec.Late || rec.Key < d.last {
				return d.checkKey(rec.CPU, rec.Key, rec.Late)
			}
			d.last = rec.Key
			d.total += readRecord(rec)
			if n++; n == k-d.tail {
				d.r.Flush()
			}
		}
	}
	return roundEnd(err, n, k)
}

func (d *orderedDrain) sum() uint64 { return d.total }
func (d *orderedDrain) close()      { d.r.Close() }
