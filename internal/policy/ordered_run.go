// SPDX-License-Identifier: Apache-2.0

package policy

// The in-place merge's runs (ordered.go): a ring's records below every
// other ring's front go by rule 1 through the ring's own loop, without
// the merge's look and sift a record.

import (
	"sync/atomic"

	"github.com/perfbuf/perfbuf/internal/ring"
)

// Each delivers up to 256 records in key order, or runs (see deliverRun), before
// it returns for the read to look at its context.
func (o *ordered) Each(fn func(*ring.Record) error) (bool, error) {
	for n := 0; n < 256; n++ {
		rec, i := o.Next()
		if i < 0 {
			return false, nil
		}
		err := fn(rec)
		o.Delivered(i)
		// A run: its first record loaded here as the ring's front, as next
		// would load it; most runs end there when the rings' keys
		// interleave record by record, and the ring's loop would only
		// parse it to hand it back.
		if err == nil && o.run.ring == i && !o.s.Stop.Load() && o.load(i) && o.inRun(&o.rs[i]) {
			return true, o.deliverRun(i, fn) // at most a run apart (see readPolicy.each)
		}
		if err != nil || o.s.Stop.Load() {
			return true, err
		}
	}
	return true, nil
}

// CopyInto is Each for a ReadBatch (BatchCopier): fn copies a record into
// s, and a run's records go through the ring's loop into s, copied in line.
func (o *ordered) CopyInto(s *ring.Sink, fn func(*ring.Record) error) bool {
	o.run.into = s
	more, _ := o.Each(fn) // (fn's only error ends a full batch)
	o.run.into = nil
	return more
}

// EachSteps is Each for Batches (Stepper): a run's records go through the
// ring's loop a run of steps at a time (s.Steps, s.Yield), and every other
// record to fn.
func (o *ordered) EachSteps(fn func(*ring.Record) error, s *ring.Sink) (bool, error) {
	o.run.into = s
	defer func() { o.run.into = nil }()
	return o.Each(fn)
}

// inRun reports whether r's front, loaded, is a sample that a run on its
// ring delivers: its key within [o.last, o.run.bound].
func (o *ordered) inRun(r *orderedRing) bool {
	return r.front.Type == ring.Sample && r.key >= o.last && r.key <= o.run.bound
}

// deliverRun delivers ring i's front, which the run may deliver (inRun), and the
// ring's next records at once while their keys stay within [o.last,
// o.run.bound], without another look at the other rings: rule 1 holds for
// them. They go through the ring's loop, up to the ring's next commit,
// which checks each key in line (ring.Sink's KeyEnd) and calls fn itself;
// the loop stops before the first record the run may not deliver, and the
// merge loads it as the ring's front.
func (o *ordered) deliverRun(i int, fn func(*ring.Record) error) error {
	r, rb := &o.rs[i], o.s.Rings[i]
	o.last = r.key
	r.front.Key, r.front.Late = r.key, false
	err := fn(&r.front)
	o.Delivered(i)
	if err != nil || o.s.Stop.Load() {
		return err
	}
	s := &o.run.sink
	s.Lo, s.Hi = o.last, o.run.bound
	k, used, err := runLoop(rb, &r.front, uint64(max(o.commitAt-r.freed, 1)), &o.s.Stop, fn, s, o.run.into)
	o.last = s.Lo
	r.freed += int(used)
	if k > 0 {
		r.saw(o.last) // o.newest: fixRoot
	}
	if rb.Cur().IsCorrupt(err) {
		err = nil // next's load reports and skips it
	}
	if r.freed >= o.commitAt {
		o.CommitPublish(i)
	}
	return err
}

// runLoop runs ring rb's loop as a run bounded by s (KeyEnd, Lo and Hi
// set): the ordered merge's (deliverRun) and the window's hot ring's
// (eachHot). With into, the owner's sink, the loop copies into its
// Samples (a ReadBatch's batch: BatchCopier), and into's count and room
// are handed back after; or it hands the run's samples out through its
// Steps (Stepper).
func runLoop(rb ring.Ring, rec *ring.Record, limit uint64, stop *atomic.Bool, fn func(*ring.Record) error, s, into *ring.Sink) (int, uint64, error) {
	if into != nil {
		s.Into, s.N, s.Room, s.Steps, s.Yield = into.Into, into.N, into.Room, into.Steps, into.Yield
	}
	k, used, err := rb.Each(rec, limit, stop, fn, s)
	if into != nil {
		into.N, into.Room, s.Into, s.Steps, s.Yield = s.N, s.Room, nil, nil, nil
	}
	return k, used, err
}
