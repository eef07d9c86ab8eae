// SPDX-License-Identifier: Apache-2.0

package wait

import (
	"errors"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// Lifetime frees exactly once, never while a call is in progress, and
// refuses calls after close, whoever closes and whoever leaves last.
func TestLifetime(t *testing.T) {
	for round := 0; round < 200; round++ {
		var l Lifetime
		var inside, frees atomic.Int32
		l.Free = func() {
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
					if err := l.Enter("op"); err != nil {
						if !errors.Is(err, os.ErrClosed) {
							t.Error(err)
						}
						return
					}
					inside.Add(1)
					inside.Add(-1)
					l.Exit()
				}
			}()
		}
		woken := false
		if !l.Close(func() { woken = true }) || !woken {
			t.Fatal("first close did not close or wake")
		}
		if l.Close(func() {}) {
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
	var l Lifetime
	frees := 0
	l.Free = func() { frees++ }
	if err := l.EnterExclusive("first"); err != nil {
		t.Fatal(err)
	}
	second := make(chan error, 1)
	go func() {
		err := l.EnterExclusive("second")
		if err == nil {
			l.ExitExclusive()
		}
		second <- err
	}()
	select {
	case err := <-second:
		t.Fatalf("second exclusive call entered (%v) while the first ran", err)
	case <-time.After(20 * time.Millisecond):
	}
	if err := l.Enter("shared"); err != nil { // plain calls do not wait
		t.Fatal(err)
	}
	l.Exit()
	l.Close(func() {})
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
	l.ExitExclusive()
	if frees != 1 {
		t.Fatalf("freed %d times after the last call", frees)
	}
	if err := l.EnterExclusive("after"); !errors.Is(err, os.ErrClosed) {
		t.Errorf("exclusive call after close: %v", err)
	}
}
