// SPDX-License-Identifier: Apache-2.0

package policy

// The callback policy (PerfBuffer's Poll and Consume): each ring drained to
// its head snapshot in turn, every record handed to the sample or lost function,
// the ring committed once at the end of its drain.

import (
	"math"

	"github.com/perfbuf/perfbuf/internal/ring"
)

// Callback delivers records to libbpf-style callbacks.
type Callback struct {
	s       *Set
	sample  func(cpu int, data []byte)
	lost    func(cpu int, count uint64)
	rec     ring.Record // the record being delivered
	wrapped []byte      // a sample that straddles the ring's end, made contiguous
	// The ring's loop hands a sample in one piece to sample itself (sink),
	// in line: deliver, the rest.
	sink    ring.Sink
	deliver func(*ring.Record) error
}

func NewCallback(s *Set, sample func(int, []byte), lost func(int, uint64)) *Callback {
	c := &Callback{s: s, sample: sample, lost: lost, sink: ring.Sink{Sample: sample}}
	c.deliver = c.deliverRecord
	return c
}

// Drain delivers ring i's records up to its head and commits them, also
// when a callback panics. A corrupt ring is got past (skipCorrupt) and its
// *ring.CorruptError returned. It returns the number of records delivered.
func (c *Callback) Drain(i int) (int, error) {
	rb := c.s.Rings[i]
	defer c.CommitPublish(i) // commits, and counts what was delivered
	rb.Begin()
	n, _, err := rb.Each(&c.rec, math.MaxUint64, &c.s.Stop, c.deliver, &c.sink)
	if err != nil {
		rb.SkipCorrupt() // counted; the ring goes on past it
	}
	return n, err
}

// deliverRecord hands a record to the sample or lost function: the ring loop's
// function for callback mode, for the records its sink does not take (lost
// records, a sample that straddles the ring's end).
func (c *Callback) deliverRecord(rec *ring.Record) error {
	if rec.Type == ring.Lost {
		if c.lost != nil {
			c.lost(rec.CPU, rec.Lost)
		}
		return nil
	}
	data := rec.Data
	if len(rec.Wrapped) > 0 {
		c.wrapped = rec.AppendTo(c.wrapped[:0])
		data = c.wrapped
	}
	c.sample(rec.CPU, data)
	return nil
}

// CommitPublish commits ring i up to its cursor (every record before it
// was delivered) and publishes its counts.
func (c *Callback) CommitPublish(i int) {
	rb := c.s.Rings[i]
	rb.Cur().CommitCursor()
	c.rec = ring.Record{} // drop the references to ring memory
	st := rb.Cur().Counts()
	c.s.Publish(i, rb.Cur().Pos(), st.Samples, st.Bytes, st.Lost)
}

// Oldest is ring i's cursor: callback mode delivers each record as it
// parses it.
func (c *Callback) Oldest(i int) uint64 { return c.s.Rings[i].Cur().Pos() }

// AddRing does nothing: each drain looks at every ring.
func (c *Callback) AddRing(int) {}

// Raw is the policy of an owner whose rings only raw views read: it
// delivers nothing, and leaves the rings as they are.
type Raw struct{ S *Set }

func (Raw) AddRing(int)           {}
func (Raw) CommitPublish(int)     {}
func (p Raw) Oldest(i int) uint64 { return p.S.Rings[i].Cur().Tail() }
