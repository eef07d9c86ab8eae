// SPDX-License-Identifier: Apache-2.0

package wait

import (
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// ExitExclusive's slow path (exitSlow): an exit wakes the exclusive call
// waiting for it, and after Close the last call out frees, once, whichever
// kind of call it is and in whichever order they leave.
func TestExitExclusiveSlowPath(t *testing.T) {
	t.Run("wakes a waiter", func(t *testing.T) {
		var l Lifetime
		l.Free = func() {}
		if !l.TryEnterExclusive() {
			t.Fatal("TryEnterExclusive failed")
		}
		entered := make(chan error)
		go func() {
			err := l.EnterExclusive("read")
			entered <- err
		}()
		for atomic.LoadInt32(&l.waiters) == 0 {
			runtime.Gosched() // until the second call waits for the first
		}
		l.ExitExclusive()
		select {
		case err := <-entered:
			if err != nil {
				t.Fatal(err)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("the waiting call still waits 10 s after the exit")
		}
		l.ExitExclusive()
		l.Close(func() {})
	})
	for _, exclusiveLast := range []bool{false, true} {
		name := "plain call last out"
		if exclusiveLast {
			name = "exclusive call last out"
		}
		t.Run(name, func(t *testing.T) {
			l, freed := closedWithTwoCalls(t)
			if exclusiveLast {
				l.Exit()
			} else {
				l.ExitExclusive()
			}
			if n := freed.Load(); n != 0 {
				t.Fatalf("freed %d times with a call in progress", n)
			}
			if exclusiveLast {
				l.ExitExclusive()
			} else {
				l.Exit()
			}
			if n := freed.Load(); n != 1 {
				t.Fatalf("freed %d times once the last call left, want 1", n)
			}
		})
	}
	t.Run("exits racing", func(t *testing.T) {
		for range 1000 {
			l, freed := closedWithTwoCalls(t)
			var wg sync.WaitGroup
			wg.Add(2)
			go func() { defer wg.Done(); l.ExitExclusive() }()
			go func() { defer wg.Done(); l.Exit() }()
			wg.Wait()
			if n := freed.Load(); n != 1 {
				t.Fatalf("freed %d times, want 1", n)
			}
		}
	})
}

// closedWithTwoCalls returns a Lifetime closed while an exclusive call and
// a plain one are in progress, and the count of its frees.
func closedWithTwoCalls(t *testing.T) (*Lifetime, *atomic.Int32) {
	t.Helper()
	l, freed := new(Lifetime), new(atomic.Int32)
	l.Free = func() { freed.Add(1) }
	if err := l.EnterExclusive("read"); err != nil {
		t.Fatal(err)
	}
	if err := l.Enter("flush"); err != nil {
		t.Fatal(err)
	}
	l.Close(func() {})
	return l, freed
}
