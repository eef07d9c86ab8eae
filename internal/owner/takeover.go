// SPDX-License-Identifier: Apache-2.0

package owner

// The takeover of ring buffers whose consumer lock another reader holds
// (presence.go): a poll that tries the locks until it wins them, and hands
// the rings won to the reading goroutine (ringBufSource.addNew).

import (
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/perfbuf/perfbuf/internal/ring"
)

// takeoverPoll is how often a reader tries the consumer locks of the rings
// that another reader holds.
const takeoverPoll = 10 * time.Millisecond

// takeover holds the rings of a source whose consumer lock another reader
// held when it looked, and tries their locks, on a goroutine of its own,
// every takeoverPoll until it holds every one or closes. A ring it wins
// is the owner's to add: Pending is set and notify wakes the owner, whose
// next read calls addNew (a check of Pending, one load, as for CPUs that
// come online).
//
// Locks: mu is never held while notify runs (the owner's poke, which
// enters no call of the owner: wait.Waiter.WakeOpen).
type takeover struct {
	Pending atomic.Bool // rings won, or a lock's error, for take
	notify  func()      // wakes the owner's wait; set before start
	stop    chan struct{}

	mu     sync.Mutex
	rings  []waitingRing // not yet taken, in the order they were opened
	err    error         // a lock's failure since the last take
	closed bool
}

// waitingRing is a ring mapped whose consumer lock another reader held.
type waitingRing struct {
	rb        *ring.RingBuf
	fd        int
	name      string
	oneWriter bool
	lock      *consumerLock
	won       bool // this reader holds the lock
}

// waiting reports whether any ring waits for its lock (before start).
func (t *takeover) waiting() bool { return len(t.rings) > 0 }

// start starts trying the locks; notify must be set.
func (t *takeover) start() {
	t.stop = make(chan struct{})
	go t.run(t.stop)
}

func (t *takeover) run(stop chan struct{}) {
	tick := time.NewTicker(takeoverPoll)
	defer tick.Stop()
	for {
		select {
		case <-stop:
			return
		case <-tick.C:
		}
		news, left := t.try()
		if news {
			t.notify()
		}
		if !left {
			return
		}
	}
}

// try tries the lock of every ring not won yet, once. news: a lock was won
// or failed (Pending is set); left: a ring still waits. A closed takeover
// tries nothing.
func (t *takeover) try() (news, left bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return false, false
	}
	for i := range t.rings {
		w := &t.rings[i]
		if w.won {
			continue
		}
		won, err := w.lock.try()
		if err != nil && t.err == nil {
			t.err = fmt.Errorf("take over ring buffer %q: %w", w.name, err)
			news = true
		}
		if won {
			w.won, news = true, true
		} else {
			left = true
		}
	}
	if news {
		t.Pending.Store(true)
	}
	return news, left
}

// take returns the rings won since the last take, which leave the
// takeover, and a lock's error.
func (t *takeover) take() (won []waitingRing, err error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.Pending.Store(false)
	keep := t.rings[:0]
	for _, w := range t.rings {
		if w.won {
			won = append(won, w)
		} else {
			keep = append(keep, w)
		}
	}
	clear(t.rings[len(keep):])
	t.rings = keep
	err, t.err = t.err, nil
	return won, err
}

// close stops the tries, and unmaps the rings still waiting and drops
// their locks. A try under way ends first (mu); run returns at its next
// look.
func (t *takeover) close() {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return
	}
	t.closed = true
	if t.stop != nil {
		close(t.stop)
	}
	for _, w := range t.rings {
		_ = w.rb.Close()
		w.lock.release()
	}
	t.rings = nil
}

// putBack returns rings that take gave and the owner could not add: the
// next take gives them again.
func (t *takeover) putBack(rings []waitingRing) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		for _, w := range rings {
			_ = w.rb.Close()
			w.lock.release()
		}
		return
	}
	t.rings = append(rings, t.rings...)
	t.Pending.Store(true)
}
