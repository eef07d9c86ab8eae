// SPDX-License-Identifier: Apache-2.0

// Package policy holds the delivery policies: which record of which ring
// goes next. Callback mode drains each ring in turn (callback.go); a
// Reader drains the fullest ring first (fullest.go) or merges the rings in
// the order of a key: in place (ordered.go, ordered_run.go, release.go,
// heap.go), or over ring buffers through a window of copies (window.go,
// intake.go, copyruns.go, arena.go, hot.go). A policy sees the rings only
// through internal/ring's contract, and its owner only through a Set,
// which the owner fills.
package policy

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/perfbuf/perfbuf/internal/ring"
)

// Policy is what an owner asks of every policy.
type Policy interface {
	// AddRing takes in ring i, added last to the Set's rings.
	AddRing(i int)
	// CommitPublish commits what ring i delivered and publishes its
	// counts; Close calls it for every ring, so that what is left in the
	// rings is counted from Oldest.
	CommitPublish(i int)
	// Oldest is where ring i's records not yet delivered start.
	Oldest(i int) uint64
}

// Holder is a policy that keeps copies of records it took from the rings
// (the window over ring buffers): Held(i) counts ring i's samples it holds
// and has not delivered. At Close a read in progress delivers them
// (HandOver); else they count as left undelivered, as those in the ring.
type Holder interface {
	Held(i int) uint64
}

// Lagger is a policy that may commit a ring short of what it parsed (the
// window over ring buffers, up to its oldest copy not delivered): Lags(i)
// reports that ring i's kernel will not wake the reader for its next
// records, and that the policy's Idle timeout bounds how long that lasts.
// The read sleeps on the other rings' wake rules and that timeout.
type Lagger interface {
	Lags(i int) bool
}

// Reading is a Reader's policy: fullest first or ordered.
type Reading interface {
	Policy
	// Next returns the next record to deliver and its ring's index, or
	// -1 when there is none to deliver now. The record stays valid until
	// Delivered(i).
	Next() (*ring.Record, int)
	// Delivered is called after the record's consumer returned.
	Delivered(i int)
	// Each delivers records to fn, zero-copy, until there is none to
	// deliver now (false, nil), fn fails (its error), or it stops for the
	// read to look at its context and the owner's state (true, nil): at
	// most a turn or a run apart, and when the owner is closed.
	Each(fn func(*ring.Record) error) (more bool, err error)
	// Idle commits what was delivered and returns how long to wait at
	// most (negative: no limit), and how much later than that the wait
	// may end (a timer moved less often: wait.Waiter.Wait).
	Idle() (timeout, slack time.Duration)
}

// Copier is a Reading that can copy its next record straight into a
// Sample when nothing else is due first (the ordered window's hot ring),
// delivered as it returns: one call a record where Next and Delivered are
// two, with no Record between. False: Next's way.
type Copier interface {
	NextCopy(c *ring.Copy) bool
}

// BatchCopier is a Reading whose loop copies a ReadBatch's records into
// the owner's sink in line where it reads a ring's records in a row (the
// ordered merge's runs, the window's hot ring): CopyInto is Each with fn
// the owner's function that copies one record into s and ends the loop
// once s is full.
type BatchCopier interface {
	CopyInto(s *ring.Sink, fn func(*ring.Record) error) (more bool)
}

// Stepper is a Reading whose rings' loops can hand their plain samples
// out a run at a time through s (s.Steps and s.Yield: see ring.Sink), and
// every other record to fn: EachSteps is Each so. The fullest-first
// policy's runs are a turn's; the ordered ones', the records that rule 1
// releases from one ring in a row.
type Stepper interface {
	EachSteps(fn func(*ring.Record) error, s *ring.Sink) (more bool, err error)
}

// Waits is a Reading that cares whether the read waited after Idle: NoWait
// says it did not, the rings having moved (the ordered window: a reader
// that never waits is behind the producers).
type Waits interface {
	NoWait()
}

// Tally is what is published of one ring: what it parsed, with the
// samples, bytes and lost counts as delivered, and the owner's counts.
type Tally struct {
	ring.Counts
	Late uint64 // ordered: samples delivered behind a larger key
	Left uint64 // samples left in the ring at Close
	// CPU and Size are the ring's, kept from when it was added: Stats
	// reads them after Close, which points the ring at memory of its own.
	CPU, Size int
	Found     uint64 // records in the ring at its opening (the owner's, once)

	// Clear is a time (Now's) when no record the ring holds undelivered
	// had been written yet: the oldest one's age is at most Now() - Clear
	// (see Observe).
	Clear int64
	// mark, if markOn: the ring's records from markPos on were written
	// after markAt. The first mark not yet reached is kept.
	markPos uint64
	markAt  int64
	markOn  bool
}

// Now is the clock of Clear: monotonic nanoseconds.
func Now() int64 { return int64(time.Since(epoch)) }

var epoch = time.Now()

// Observe notes what the reader or a look at the ring's memory saw: at
// time at, read before head was loaded, the producer position was head
// and the ring's oldest record not delivered started at or after oldest.
// Records from head on were written after at: once oldest reaches head,
// Clear becomes at. So Clear moves at most one observation behind a reader
// that keeps up, also when the ring never empties. Under StatsMu.
func (t *Tally) Observe(oldest, head uint64, at int64) {
	switch {
	case oldest == head:
		t.Clear, t.markOn = max(t.Clear, at), false
	case t.markOn && int64(oldest-t.markPos) >= 0:
		t.Clear = max(t.Clear, t.markAt)
		t.markPos, t.markAt = head, at
	case !t.markOn:
		t.markPos, t.markAt, t.markOn = head, at, true
	}
}

// Set is what a policy shares with its owner: the rings, the stop flag of
// Close, the counts published, a corruption to report, and a Flush's
// progress.
//
// The rings grow when a CPU comes online: on the read side, under StatsMu
// and the flush's lock, which other goroutines take to read them.
type Set struct {
	Rings []ring.Ring
	// Stop is set by Close: the rings' loops stop after the record in
	// progress, and the ordered window takes nothing more in.
	Stop atomic.Bool
	// HandOver is set with Stop by a Close from outside the reads'
	// functions: a read in progress then delivers the copies a Holder
	// holds (no longer in the ring, so not the next reader's) before it
	// returns; the rest stays in the ring for the next reader.
	HandOver atomic.Bool
	// Latency is how often a read looks at rings that may hold records
	// no wakeup announced: within the latency budget (negative: no
	// budget, no looks).
	Latency time.Duration
	// Corrupt is a ring's corruption that a policy skipped and the read
	// has still to report (read side only).
	Corrupt error

	StatsMu sync.Mutex
	Tallies []Tally // by buffer index
	// observed is where each ring's oldest record not delivered started
	// at its last observation by Publish (read side only).
	observed []uint64

	// Flush stores every ring's producer position in flushHeads and sets
	// flushReq; the read that takes it up copies them to flushTo, and the
	// flush is reached once every ring's undelivered records start at or
	// past them.
	flushReq   atomic.Bool
	flushMu    sync.Mutex // guards flushHeads
	flushHeads []uint64
	flushTo    []uint64 // the running flush's heads (read side only)
	flushOn    bool     // a flush runs
	flushFrom  int      // the rings before it have reached flushTo
}

// Push adds ring rb as the last one, with buffer index len(s.Rings).
func (s *Set) Push(rb ring.Ring) {
	i := len(s.Rings)
	rb.Cur().SetIndex(i)
	s.flushMu.Lock()
	s.StatsMu.Lock()
	s.Rings = append(s.Rings, rb)
	s.flushHeads = append(s.flushHeads, 0)
	s.flushTo = append(s.flushTo, 0) // the running flush has nothing to wait for here
	s.Tallies = append(s.Tallies, Tally{Clear: Now(), CPU: rb.Cur().CPU(), Size: rb.Cur().Size()})
	s.observed = append(s.observed, rb.Cur().Tail())
	s.StatsMu.Unlock()
	s.flushMu.Unlock()
}

// Publish copies ring i's counts into the shared stats; samples, bytes and
// lost are the policy's, delivered rather than parsed. oldest is where the
// ring's oldest record not delivered starts (Policy.Oldest): when it moved
// since the last Publish, the ring is observed (Tally.Observe): a clock
// read and a load of the producer position a commit that delivered.
func (s *Set) Publish(i int, oldest, samples, bytes, lost uint64) {
	c := *s.Rings[i].Cur().Counts()
	c.Samples, c.Bytes, c.Lost = samples, bytes, lost
	var at int64
	var head uint64
	observe := oldest != s.observed[i]
	if observe {
		s.observed[i] = oldest
		at = Now()
		head = s.Rings[i].Cur().LoadHead() // after the clock: see Observe
	}
	s.StatsMu.Lock()
	t := &s.Tallies[i]
	t.Counts = c
	if observe {
		t.Observe(oldest, head, at)
	}
	s.StatsMu.Unlock()
}

// CountLate counts a late sample of ring i.
func (s *Set) CountLate(i int) {
	s.StatsMu.Lock()
	s.Tallies[i].Late++
	s.StatsMu.Unlock()
}

// SkipCorrupt skips ring i to its head after a corruption, counted, and
// keeps err for the read to report.
func (s *Set) SkipCorrupt(i int, err error) {
	s.Rings[i].SkipCorrupt()
	if s.Corrupt == nil {
		s.Corrupt = err
	}
}

// RequestFlush notes every ring's data_head for a flush (Reader.Flush).
func (s *Set) RequestFlush() {
	s.flushMu.Lock()
	for i, rb := range s.Rings {
		s.flushHeads[i] = rb.Cur().LoadHead()
	}
	s.flushReq.Store(true)
	s.flushMu.Unlock()
}

// Flushing reports whether a flush is under way (records must not wait).
func (s *Set) Flushing() bool { return s.flushOn || s.flushReq.Load() }

// FlushNeeds reports whether a flush runs, taken up (FlushReached), and the
// record at position pos of ring i lies before the ring's head at the
// Flush: one the flush must deliver, so that it is not reached yet.
// (Positions are the ring's own, free-running, as Reached compares them.)
func (s *Set) FlushNeeds(i int, pos uint64) bool {
	return s.flushOn && !s.flushReq.Load() && int64(pos-s.flushTo[i]) < 0
}

// EndFlush ends the running flush, once its owner has reported it.
func (s *Set) EndFlush() { s.flushOn = false }

// FlushReached takes up a Flush that was requested and reports whether the
// running flush has delivered everything up to its heads, by pol's oldest
// records, and, for a Holder, every copy it holds: copies taken from a ring
// before the flush are no longer in the ring, so that the ring's position
// alone cannot say they were delivered. The policies check it between
// passes (fullest) or records (ordered), so that a flush ends while a
// producer keeps writing, and the read checks it when all is read.
func (s *Set) FlushReached(pol Policy) bool {
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
	// moves on, and what a Holder copies from it later comes from past the
	// head): the rings before flushFrom are not looked at again, so that a
	// check per record costs O(1) amortised.
	h, _ := pol.(Holder)
	for ; s.flushFrom < len(s.Rings); s.flushFrom++ {
		i := s.flushFrom
		if h != nil && h.Held(i) > 0 || !s.Rings[i].Reached(pol.Oldest(i), s.flushTo[i]) {
			return false
		}
	}
	return true
}
