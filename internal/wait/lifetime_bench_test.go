// SPDX-License-Identifier: Apache-2.0

package wait

import (
	"sync"
	"testing"
)

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
		for b.Loop() {
			//lint:ignore SA2001 the empty critical section is what is measured
			mu.Lock()
			mu.Unlock()
		}
	})
}
