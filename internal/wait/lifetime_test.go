// SPDX-License-Identifier: Apache-2.0

package wait

import (
	"bytes"
	"errors"
	"os"
	"runtime"
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

// An exclusive call parked in a wait when Close comes is woken, and goes
// without freeing: Close frees once it is gone. A call in progress that is
// not parked (one running a user's function) frees as the last one out,
// and Close returns without waiting for it.
func TestLifetimeCloseParked(t *testing.T) {
	for _, parked := range []bool{true, false} {
		var l Lifetime
		freed := make(chan bool, 1) // whether the call's exit freed
		l.Free = func() {
			buf := make([]byte, 1<<14)
			freed <- bytes.Contains(buf[:runtime.Stack(buf, false)], []byte("ExitExclusive"))
		}
		if err := l.EnterExclusive("read"); err != nil {
			t.Fatal(err)
		}
		if parked {
			l.Park()
		}
		woken, closed := make(chan struct{}), make(chan struct{})
		go func() {
			l.Close(func() { close(woken) })
			close(closed)
		}()
		select {
		case <-woken:
		case <-time.After(5 * time.Second):
			t.Fatal("Close did not wake the call")
		}
		if !parked {
			select {
			case <-closed:
			case <-time.After(5 * time.Second):
				t.Fatal("Close waited for a call that is not parked")
			}
		} else {
			l.Unpark()
		}
		l.ExitExclusive()
		select {
		case <-closed:
		case <-time.After(5 * time.Second):
			t.Fatal("Close still blocked after the call went")
		}
		if byCall := <-freed; byCall == parked {
			t.Errorf("parked %v: freed by the call %v", parked, byCall)
		}
	}
}
