// SPDX-License-Identifier: Apache-2.0

package wait

import (
	"errors"
	"os"
	"sync"
	"testing"
)

// TryEnterExclusive enters an open Lifetime with no call in progress, and
// nothing else: with an exclusive call, another call (Flush's) in progress,
// or once closed, it changes nothing, and EnterExclusive decides as before.
func TestTryEnterExclusive(t *testing.T) {
	var l Lifetime
	freed := 0
	l.Free = func() { freed++ }
	if !l.TryEnterExclusive() {
		t.Fatal("TryEnterExclusive failed on an open Lifetime with no call in progress")
	}
	if l.TryEnterExclusive() {
		t.Fatal("TryEnterExclusive entered beside an exclusive call")
	}
	l.ExitExclusive()
	if err := l.Enter("flush"); err != nil {
		t.Fatal(err)
	}
	if l.TryEnterExclusive() {
		t.Fatal("TryEnterExclusive entered while a call was in progress")
	}
	if err := l.EnterExclusive("read"); err != nil { // the way a read takes then
		t.Fatalf("EnterExclusive beside a call in progress: %v", err)
	}
	l.ExitExclusive()
	l.Exit()
	if !l.TryEnterExclusive() {
		t.Fatal("TryEnterExclusive failed once the calls left")
	}
	l.ExitExclusive()
	l.Close(func() {})
	if l.TryEnterExclusive() {
		t.Fatal("TryEnterExclusive entered a closed Lifetime")
	}
	if err := l.EnterExclusive("read"); !errors.Is(err, os.ErrClosed) {
		t.Fatalf("EnterExclusive after Close: %v, want os.ErrClosed", err)
	}
	if freed != 1 {
		t.Fatalf("freed %d times, want 1", freed)
	}
}

// BenchmarkExclusive is what the Reader's contract (reads from any
// goroutine, Close at any time) costs a read alone: entering and leaving a
// Lifetime, as ReadInto does (TryEnterExclusive, ExitExclusive) and as
// ReadBatch does (EnterExclusive), beside a sync.Mutex's Lock and Unlock,
// which cilium/ebpf's ReadInto takes each call. One goroutine: the
// uncontended cost.
func BenchmarkExclusive(b *testing.B) {
	b.Run("TryEnterExclusive", func(b *testing.B) {
		var l Lifetime
		for b.Loop() {
			if !l.TryEnterExclusive() {
				b.Fatal("TryEnterExclusive failed on an open Lifetime with no call in progress")
			}
			l.ExitExclusive()
		}
	})
	b.Run("EnterExclusive", func(b *testing.B) {
		var l Lifetime
		for b.Loop() {
			if err := l.EnterExclusive("read"); err != nil {
				b.Fatal(err)
			}
			l.ExitExclusive()
		}
	})
	b.Run("Mutex", func(b *testing.B) {
		var mu sync.Mutex
		n := 0
		for b.Loop() {
			mu.Lock()
			n++ // (a critical section as short as the Reader's state check)
			mu.Unlock()
		}
		_ = n
	})
}
