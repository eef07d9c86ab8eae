// SPDX-License-Identifier: Apache-2.0

package wait

// The lifetime protocol: how Close runs while calls are in progress.

import (
	"fmt"
	"os"
	"sync"
	"sync/atomic"
)

// Lifetime lets Close run while calls are in progress on other goroutines
// (or on the same one, from a callback): calls enter and exit, Close marks
// the object closed, and whoever leaves last runs free. So nothing is
// unmapped or closed under a call that still uses it. It is lock-free: a
// call costs two atomic operations.
//
// Exclusive calls (a reader's reads) also exclude each other: the first
// takes busyBit in the same atomic operation, later ones wait for it.
type Lifetime struct {
	state    atomic.Int64 // calls in progress, plus closedBit and busyBit
	freeOnce sync.Once
	// Free is the owner's: called once, by the last call out after Close.
	Free func()

	// Scope is where its owner runs callbacks during exclusive calls (see
	// reentry.go): called from inside it, an exclusive call fails with
	// ErrReentrant rather than wait.
	Scope Scope

	// waiters counts the exclusive calls waiting for busyBit (atomic: a
	// plain int32 with atomic.AddInt32 and LoadInt32, which leave
	// ExitExclusive small enough to inline, where atomic.Int32's methods
	// do not).
	waiters int32
	mu      sync.Mutex // with cond: where they wait
	cond    *sync.Cond

	// parked counts the exclusive calls blocked in a wait (Park to
	// Unpark; atomic, as waiters): woken by Close, such a call returns
	// without running a user's function, and Close waits for it.
	parked int32
}

const (
	closedBit = 1 << 62
	busyBit   = 1 << 61
)

// Enter registers a call in progress; it fails once closed.
func (l *Lifetime) Enter(op string) error {
	for {
		s := l.state.Load()
		if s&closedBit != 0 {
			return fmt.Errorf("%s: %w", op, os.ErrClosed)
		}
		if l.state.CompareAndSwap(s, s+1) {
			return nil
		}
	}
}

// Exit ends a call; the last one out after close frees.
func (l *Lifetime) Exit() {
	if l.state.Add(-1) == closedBit || atomic.LoadInt32(&l.waiters) != 0 {
		l.exitSlow()
	}
}

// Park says that the exclusive call in progress blocks in a wait that
// Close's wake ends, after which it returns (os.ErrClosed) without
// running a user's function; Unpark, that it no longer waits.
func (l *Lifetime) Park()   { atomic.AddInt32(&l.parked, 1) }
func (l *Lifetime) Unpark() { atomic.AddInt32(&l.parked, -1) }

// EnterExclusive is enter for a call that excludes other exclusive calls:
// it waits while one is in progress, unless it is called from inside a
// callback (see Scope).
func (l *Lifetime) EnterExclusive(op string) error {
	for checked := false; ; {
		s := l.state.Load()
		switch {
		case s&closedBit != 0:
			return fmt.Errorf("%s: %w", op, os.ErrClosed)
		case s&busyBit == 0:
			if l.state.CompareAndSwap(s, (s+1)|busyBit) {
				return nil
			}
		case !checked && l.Scope.Inside():
			return fmt.Errorf("%s: %w", op, ErrReentrant)
		default:
			checked = true
			l.waitNotBusy()
		}
	}
}

// TryEnterExclusive is EnterExclusive's common case, small enough to inline
// into a read: it reports whether it entered, l open and no call in
// progress. Otherwise the caller calls EnterExclusive.
func (l *Lifetime) TryEnterExclusive() bool {
	// No call in progress, the common case: one CAS, as sync.Mutex's Lock.
	// (Any other state: EnterExclusive's look first.)
	return l.state.CompareAndSwap(0, 1|busyBit)
}

// waitNotBusy blocks until busyBit is clear or l is closed.
func (l *Lifetime) waitNotBusy() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.cond == nil {
		l.cond = sync.NewCond(&l.mu)
	}
	atomic.AddInt32(&l.waiters, 1)
	defer atomic.AddInt32(&l.waiters, -1)
	// ExitExclusive clears busyBit before it looks at waiters, and
	// broadcasts under mu: either it sees this waiter, or this loop sees
	// the bit clear.
	for s := l.state.Load(); s&busyBit != 0 && s&closedBit == 0; s = l.state.Load() {
		l.cond.Wait()
	}
}

// ExitExclusive ends an exclusive call. Its common case (l open, no call
// waiting) is an atomic add and a load, inlined into the read.
func (l *Lifetime) ExitExclusive() {
	// busyBit is cleared before waiters is loaded (see waitNotBusy).
	if l.state.Add(-(1+busyBit)) == closedBit || atomic.LoadInt32(&l.waiters) != 0 {
		l.exitSlow()
	}
}

// exitSlow is Exit's and ExitExclusive's rest: it wakes the calls waiting
// (exclusive calls for busyBit, Close for the parked call to go), and
// frees if no call is left after Close. (It loads the state again
// rather than take the one the exit left, which would not leave
// ExitExclusive inlinable: once closed with no call in progress, the state
// never changes, so the last call out sees it; another that sees it too
// frees through the same freeOnce.)
func (l *Lifetime) exitSlow() {
	if atomic.LoadInt32(&l.waiters) > 0 {
		l.mu.Lock()
		l.cond.Broadcast()
		l.mu.Unlock()
	}
	if l.state.Load() == closedBit {
		l.freeOnce.Do(l.Free)
	}
}

// Closed reports whether close was called.
func (l *Lifetime) Closed() bool { return l.state.Load()&closedBit != 0 }

// Close marks l closed, runs wake (to interrupt blocked calls) and frees at
// once if no call is in progress. An exclusive call parked in a wait
// (Park) returns at once when woken: Close waits for it to go and then
// frees, so that the call returns without freeing (free may wait, for a
// grace period and for locks). Any other call in progress (one running a
// user's function, a Stats, a view held) frees as the last one out. Called
// from inside a call (Scope), Close waits for none. It reports false if l
// was closed already.
func (l *Lifetime) Close(wake func()) bool {
	for {
		s := l.state.Load()
		if s&closedBit != 0 {
			return false
		}
		// Close counts as a call until it has woken the others, so that
		// nothing is freed under wake.
		if l.state.CompareAndSwap(s, (s+1)|closedBit) {
			break
		}
	}
	// Exclusive calls waiting for busyBit return once closed: wake them
	// (waitNotBusy; as in ExitExclusive, either this sees a waiter or the
	// waiter sees closedBit).
	if atomic.LoadInt32(&l.waiters) > 0 {
		l.mu.Lock()
		l.cond.Broadcast()
		l.mu.Unlock()
	}
	wake()
	if atomic.LoadInt32(&l.parked) != 0 && !l.Scope.Inside() {
		l.waitExclusive()
	}
	l.Exit()
	return true
}

// waitExclusive blocks until no exclusive call is in progress: Close's
// wait for a parked call, woken, to go. As waitNotBusy, it counts in
// waiters, which sends the exits through exitSlow's broadcast.
func (l *Lifetime) waitExclusive() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.cond == nil {
		l.cond = sync.NewCond(&l.mu)
	}
	atomic.AddInt32(&l.waiters, 1)
	defer atomic.AddInt32(&l.waiters, -1)
	for l.state.Load()&busyBit != 0 {
		l.cond.Wait()
	}
}
