// SPDX-License-Identifier: Apache-2.0

package policy

// A ring's space handed back by the window: each ring is committed up to
// its oldest copy not delivered (heldRing), so that a reader that dies
// leaves its copies in the ring for the next one; rule 4 releases once the
// copies keep half a ring (tighten), since the producers find no room in
// the space they hold.

// heldRing is where a ring's copies lie in the ring, in ring order (the
// order they are copied in), each marked once delivered: the first not
// delivered is as far as the ring may be committed, so that a reader that
// dies leaves every copy it had not delivered in the ring for the next
// reader. Entry n (a copy's copySlot.held) is q[n-base].
type heldRing struct {
	q    []heldPos
	head int    // q[head:] starts with a copy not delivered
	base uint64 // the index of q[0]
}

type heldPos struct {
	pos  uint64
	done bool
}

// add notes a copy of the record at pos and returns its index.
func (h *heldRing) add(pos uint64) uint64 {
	if h.head == len(h.q) {
		h.base += uint64(len(h.q))
		h.q, h.head = h.q[:0], 0
	} else if h.head >= runCompact && h.head*2 >= len(h.q) {
		n := copy(h.q, h.q[h.head:])
		h.base += uint64(h.head)
		h.q, h.head = h.q[:n], 0
	}
	h.q = append(h.q, heldPos{pos: pos})
	return h.base + uint64(len(h.q)-1)
}

// done marks copy n delivered.
func (h *heldRing) done(n uint64) {
	h.q[n-h.base].done = true
	for h.head < len(h.q) && h.q[h.head].done {
		h.head++
	}
}

// oldest returns where the oldest copy not delivered lies, if any.
func (h *heldRing) oldest() (uint64, bool) {
	if h.head == len(h.q) {
		return 0, false
	}
	return h.q[h.head].pos, true
}

// Lags reports whether ring i's consumer position is held back by a copy
// not delivered: the kernel then wakes no reader for the ring's records
// (only a record committed at consumer_pos does), so the read may sleep on
// the other rings' wake rules and Idle's timeout, which the copies bound
// (rule 3), not on the ring's.
func (w *window) Lags(i int) bool {
	_, ok := w.rs[i].held.oldest()
	return ok && !w.s.Stop.Load()
}

// tighten notes whether ring i's copies not delivered keep more than half
// of it (from the oldest to the cursor), with a low-water mark of three
// eighths: rule 4 then releases, since the ring's space stays taken while
// its copies are held, and its producers would find no room.
// at is where ring i's cursor is, or goes past the record being copied.
func (w *window) tighten(i int, at uint64) {
	r := &w.rs[i]
	span := uint64(0)
	if pos, ok := r.held.oldest(); ok {
		span = at - pos
	}
	switch {
	case !r.tight && span > r.half:
		r.tight = true
		w.tight++
	case r.tight && span <= r.half/4*3:
		r.tight = false
		w.tight--
	}
}

// committable is how far ring i may be committed: to its oldest copy not
// delivered, else to Oldest. At Close (Stop) it is Oldest: the copies held
// were delivered by the read in progress (HandOver) or are counted as
// Left, and the next reader starts after them, so that no record is
// delivered twice after a Close. A corruption skipped the ring's
// tail past copies made before it: they are no longer the ring's.
func (w *window) committable(i int) uint64 {
	to := w.Oldest(i)
	if w.s.Stop.Load() {
		return to
	}
	if pos, ok := w.rs[i].held.oldest(); ok && int64(to-pos) > 0 {
		to = pos
		if t := w.s.Rings[i].Cur().Tail(); int64(t-to) > 0 {
			to = t
		}
	}
	return to
}

// CommitPublish hands ring i's space back up to its oldest record not
// delivered, copied or not (committable), and publishes its counts: what it
// parsed but the copies held and a hot ring's next record.
func (w *window) CommitPublish(i int) {
	if err := w.s.Rings[i].Cur().Commit(w.committable(i)); err != nil {
		panic(err) // the cursor, or a record parsed: a record boundary past the tail
	}
	w.publish(i)
}

func (w *window) publish(i int) {
	st, r := w.s.Rings[i].Cur().Counts(), &w.rs[i]
	samples, bytes := st.Samples-r.staged, st.Bytes-r.bytes
	if i == w.hot.ring && w.hot.have {
		samples, bytes = samples-1, bytes-uint64(len(w.hot.rec.Data))
	}
	w.s.Publish(i, w.Oldest(i), samples, bytes, st.Lost)
}
