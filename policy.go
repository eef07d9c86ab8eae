// SPDX-License-Identifier: Apache-2.0

package perfbuf

// The delivery policies and what they share with their owner. A policy
// chooses which record goes next: callback mode's (callback.go), the
// Reader's fullest-first (fullest.go) and ordered merge (ordered.go). They
// see the rings only through the ring kind's methods (perfring.go), and
// their owner only through a ringSet, which the owner core (core.go) fills.

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/perfbuf/perfbuf/internal/ring"
)

// policy is what the owner core asks of every policy.
type policy interface {
	// addRing takes in ring i, added last to the ringSet's rings.
	addRing(i int)
	// commitPublish commits what ring i delivered and publishes its
	// counts; Close's free calls it for every ring, so that what is left
	// in the rings is counted from oldest.
	commitPublish(i int)
	// oldest is where ring i's records not yet delivered start.
	oldest(i int) uint64
}

// readPolicy is a Reader's policy: fullest or ordered.
type readPolicy interface {
	policy
	// next returns the next record to deliver and its ring's index, or
	// -1 when there is none to deliver now. The record stays valid until
	// delivered(i).
	next() (*Record, int)
	// delivered is called after the record's consumer returned.
	delivered(i int)
	// each delivers records to fn, zero-copy, until there is none to
	// deliver now (false, nil), fn fails (its error), or it stops for the
	// read to look at its context and the owner's state (true, nil): at
	// most a turn or a run apart, and when the owner is closed.
	each(fn func(*Record) error) (more bool, err error)
	// idle commits what was delivered and returns how long to wait at
	// most (negative: no limit), and how much later than that the wait
	// may end (a timer moved less often: waiter.setDeadline).
	idle() (timeout, slack time.Duration)
}

// ringSet is what a policy shares with its owner: the rings, the stop flag
// of Close, the counts published for Stats, a corruption to report, and a
// Flush's progress.
//
// The rings grow when a CPU comes online (hotplug.go): on the read side,
// under statsMu and flushMu, which other goroutines take to read them.
type ringSet struct {
	rings []ring.Kind
	// stop is set by Close: the rings' loops stop after the record in
	// progress, and the ordered merge releases what it holds (rule 5).
	stop atomic.Bool
	// latency is how long a record may wait for a wakeup (Options.MaxLatency
	// resolved; negative: no limit).
	latency time.Duration
	// corrupt is a ring's corruption that a policy skipped and the read
	// has still to report (read side only).
	corrupt error

	statsMu sync.Mutex
	stats   []Stats // by buffer index

	// Flush stores every ring's data_head in flushHeads and sets flushReq;
	// the read that takes it up copies them to flushTo, and the flush is
	// reached once every ring's undelivered records start at or past them.
	flushReq   atomic.Bool
	flushMu    sync.Mutex // guards flushHeads
	flushHeads []uint64
	flushTo    []uint64 // the running flush's heads (read side only)
	flushOn    bool     // a flush runs
	flushFrom  int      // the rings before it have reached flushTo
}

// push adds ring rb as the last one, with buffer index len(s.rings).
func (s *ringSet) push(rb ring.Kind) {
	i := len(s.rings)
	rb.Cur().SetIndex(i)
	s.flushMu.Lock()
	s.statsMu.Lock()
	s.rings = append(s.rings, rb)
	s.flushHeads = append(s.flushHeads, 0)
	s.flushTo = append(s.flushTo, 0) // the running flush has nothing to wait for here
	s.stats = append(s.stats, Stats{Ring: i, CPU: rb.Cur().CPU()})
	s.statsMu.Unlock()
	s.flushMu.Unlock()
}

// publish copies ring i's counts into the shared stats; samples, bytes and
// lost are the policy's, delivered rather than parsed.
func (s *ringSet) publish(i int, samples, bytes, lost uint64) {
	c := *s.rings[i].Cur().Counts()
	c.Samples, c.Bytes, c.Lost = samples, bytes, lost
	s.statsMu.Lock()
	s.stats[i].setCounts(&c)
	s.statsMu.Unlock()
}

// countLate counts a late sample of ring i, dropped or not.
func (s *ringSet) countLate(i int, dropped bool) {
	s.statsMu.Lock()
	s.stats[i].Late++
	if dropped {
		s.stats[i].Dropped++
	}
	s.statsMu.Unlock()
}

// skipCorrupt skips ring i to its head after a corruption, counted, and
// keeps err for the read to report.
func (s *ringSet) skipCorrupt(i int, err error) {
	s.rings[i].SkipCorrupt()
	if s.corrupt == nil {
		s.corrupt = err
	}
}

// requestFlush notes every ring's data_head for a flush (Reader.Flush).
func (s *ringSet) requestFlush() {
	s.flushMu.Lock()
	for i, rb := range s.rings {
		s.flushHeads[i] = rb.Cur().LoadHead()
	}
	s.flushReq.Store(true)
	s.flushMu.Unlock()
}

// flushing reports whether a flush is under way (records must not wait).
func (s *ringSet) flushing() bool { return s.flushOn || s.flushReq.Load() }

// flushReached takes up a Flush that was requested and reports whether the
// running flush has delivered everything up to its heads, by pol's oldest
// records. The policies check it between passes (fullest) or records
// (ordered), so that a flush ends while a producer keeps writing, and the
// read checks it when all is read.
func (s *ringSet) flushReached(pol policy) bool {
	if s.flushReq.Load() {
		s.flushMu.Lock()
		s.flushReq.Store(false)
		copy(s.flushTo, s.flushHeads)
		s.flushMu.Unlock()
		s.flushOn, s.flushFrom = true, 0
	}
	if !s.flushOn {
		return false
	}
	// A ring that reached its head stays there (its oldest record only
	// moves on): the rings before flushFrom are not looked at again, so
	// that a check per record costs O(1) amortised.
	for ; s.flushFrom < len(s.rings); s.flushFrom++ {
		i := s.flushFrom
		if !s.rings[i].Reached(pol.oldest(i), s.flushTo[i]) {
			return false
		}
	}
	return true
}
