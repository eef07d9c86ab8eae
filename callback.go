// SPDX-License-Identifier: Apache-2.0

package perfbuf

// The callback policy (PerfBuffer's Poll and Consume): each ring drained to
// its head snapshot in turn, every record handed to SampleFunc or LostFunc,
// the ring committed once at the end of its drain.

import "math"

// callback delivers records to libbpf-style callbacks.
type callback struct {
	s       *ringSet
	sample  func(cpu int, data []byte)
	lost    func(cpu int, count uint64)
	rec     Record // the record being delivered
	wrapped []byte // a sample that straddles the ring's end, made contiguous
	deliver func(*Record) error
}

func newCallback(s *ringSet, sample func(int, []byte), lost func(int, uint64)) *callback {
	c := &callback{s: s, sample: sample, lost: lost}
	c.deliver = c.deliverRecord
	return c
}

// drain delivers ring i's records up to its head and commits them, also
// when a callback panics. A corrupt ring is got past (skipCorrupt) and its
// *CorruptError returned. It returns the number of records delivered.
func (c *callback) drain(i int) (int, error) {
	rb := c.s.rings[i]
	defer c.commitPublish(i) // commits, and counts what was delivered
	rb.Begin()
	n, _, err := rb.Each(&c.rec, math.MaxUint64, &c.s.stop, c.deliver)
	if err != nil {
		rb.SkipCorrupt() // counted; the ring goes on past it
	}
	return n, err
}

// deliverRecord hands a record to SampleFunc or LostFunc: the ring loop's
// function for callback mode.
func (c *callback) deliverRecord(rec *Record) error {
	if rec.Type == RecordLost {
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

// commitPublish commits ring i up to its cursor (every record before it
// was delivered) and publishes its counts.
func (c *callback) commitPublish(i int) {
	rb := c.s.rings[i]
	rb.Cur().CommitCursor()
	c.rec = Record{} // drop the references to ring memory
	st := rb.Cur().Counts()
	c.s.publish(i, st.Samples, st.Bytes, st.Lost)
}

// oldest: callback mode delivers each record as it parses it.
func (c *callback) oldest(i int) uint64 { return c.s.rings[i].Cur().Pos() }

// addRing: each drain looks at every ring.
func (c *callback) addRing(int) {}
