// SPDX-License-Identifier: Apache-2.0

package perfbuf

import (
	"errors"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// lifetime frees exactly once, never while a call is in progress, and
// refuses calls after close, whoever closes and whoever leaves last.
func TestLifetime(t *testing.T) {
	for round := 0; round < 200; round++ {
		var l lifetime
		var inside, frees atomic.Int32
		l.free = func() {
			if inside.Load() != 0 {
				t.Error("freed while a call was in progress")
			}
			frees.Add(1)
		}
		var wg sync.WaitGroup
		for g := 0; g < 4; g++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for {
					if err := l.enter("op"); err != nil {
						if !errors.Is(err, os.ErrClosed) {
							t.Error(err)
						}
						return
					}
					inside.Add(1)
					inside.Add(-1)
					l.exit()
				}
			}()
		}
		woken := false
		if !l.close(func() { woken = true }) || !woken {
			t.Fatal("first close did not close or wake")
		}
		if l.close(func() {}) {
			t.Fatal("second close closed again")
		}
		wg.Wait()
		if frees.Load() != 1 {
			t.Fatalf("freed %d times", frees.Load())
		}
	}
}

// Exclusive calls exclude each other; one waiting for another returns
// os.ErrClosed as soon as close is called, while the one in progress still
// runs, and free runs once that one exits. (A waiting call used to wake only
// when the call in progress exited.)
func TestLifetimeExclusive(t *testing.T) {
	var l lifetime
	frees := 0
	l.free = func() { frees++ }
	if err := l.enterExclusive("first"); err != nil {
		t.Fatal(err)
	}
	second := make(chan error, 1)
	go func() {
		err := l.enterExclusive("second")
		if err == nil {
			l.exitExclusive()
		}
		second <- err
	}()
	select {
	case err := <-second:
		t.Fatalf("second exclusive call entered (%v) while the first ran", err)
	case <-time.After(20 * time.Millisecond):
	}
	if err := l.enter("shared"); err != nil { // plain calls do not wait
		t.Fatal(err)
	}
	l.exit()
	l.close(func() {})
	select {
	case err := <-second:
		if !errors.Is(err, os.ErrClosed) {
			t.Errorf("waiting exclusive call after close: %v, want os.ErrClosed", err)
		}
	case <-time.After(2 * time.Second):
		t.Fatal("waiting exclusive call still blocked 2s after close")
	}
	if frees != 0 {
		t.Fatal("freed while an exclusive call was in progress")
	}
	l.exitExclusive()
	if frees != 1 {
		t.Fatalf("freed %d times after the last call", frees)
	}
	if err := l.enterExclusive("after"); !errors.Is(err, os.ErrClosed) {
		t.Errorf("exclusive call after close: %v", err)
	}
}
