// SPDX-License-Identifier: Apache-2.0

package policy

// Rule 1 over ring buffers whose keys are stamped after the reservation
// (Order.StampedKeys, perfbuf_stamp in bpf/perfbuf.bpf.h): a program
// reserves its record, which moves the ring's producer_pos at once (the
// kernel's __bpf_ringbuf_reserve stores it, busy, under the ring's lock),
// then reads bpf_ktime_get_ns() into the key. A reader that reads the
// clock at R, then loads producer_pos and finds the ring empty (nothing
// pending, so no busy record either), has seen every record reserved
// before that load: any later record's key was read after its
// reservation, so after the load, so at R or later, up to stampSlack for
// the reservation's store to reach the reader. The empty ring then shows
// the key R - stampSlack for rule 1, whoever writes it: the window holds a
// record only while a ring might still produce a smaller key, not until
// MaxDelay.
//
// A key read before the reservation (bpf_ktime_get_ns, then
// bpf_ringbuf_output) has no such bound: a program can be preempted or
// sleep, or an interrupt's program reserve first, between the two. So
// has a perf ring, whose record the kernel publishes (data_head) only
// when the output ends: MaxDelay stays their bound.

import (
	"time"

	"golang.org/x/sys/unix"
)

// stampSlack is how long a reservation's store to producer_pos may take to
// reach the reader after the program read its key: the store waits in
// its CPU's store buffer at most (the clock read does not wait for it).
// TestStampedKeysSlack (selftest/readers) measures it on real programs.
const stampSlack = 100 * time.Microsecond

// monotonicOffset returns CLOCK_MONOTONIC, the clock of bpf_ktime_get_ns,
// minus the time since start, which Go reads from the same clock. It reads
// the clock first, so that it errs low: the bound it gives (stampBound)
// is then early, which holds a record longer, never releases it early.
func monotonicOffset(start time.Time) int64 {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		return -1 << 62 // no clock: no bound (stampBound returns 0)
	}
	return ts.Nano() - int64(time.Since(start))
}

// stampBound is the key that a ring found empty after this call shows for
// rule 1: the monotonic time now less stampSlack; 0 (none) unless the keys
// are stamped. An intake calls it before it loads any ring's producer_pos.
func (w *window) stampBound() uint64 {
	if !w.rules.stamped {
		return 0
	}
	return uint64(max(w.rules.mono()-int64(stampSlack), 0))
}

// ringBound returns the smallest key that ring i can still show, for rule
// 1, and whether there is one: the largest key taken from a ring written by
// one CPU (its keys only grow), and with stamped keys, at least empty (a
// stampBound) for a ring the intake left empty.
func (w *window) ringBound(i int, empty uint64) (uint64, bool) {
	r := &w.rs[i]
	bound, ok := r.newest, r.seen && r.oneWriter
	if empty > 0 {
		if cur := w.s.Rings[i].Cur(); cur.Pending() == 0 && !cur.Failed() {
			if !ok || bound < empty {
				bound = empty
			}
			ok = true
		}
	}
	return bound, ok
}

// stampDue is how long until the smallest copy, of key, may go by rule 1
// at the next intake if every ring is then empty: when the monotonic clock
// passes key + stampSlack. It reports false unless the keys are stamped
// and that time is still to come (once it passed, the rings that hold
// rule 1 back are not empty, and the other rules' timers bound the wait).
func (w *window) stampDue(key uint64) (time.Duration, bool) {
	if !w.rules.stamped {
		return 0, false
	}
	d := time.Duration(int64(key) + int64(stampSlack) - w.rules.mono())
	return d, d > 0
}
