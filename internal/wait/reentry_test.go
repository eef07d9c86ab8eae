// SPDX-License-Identifier: Apache-2.0

package wait

import (
	"errors"
	"testing"
	"time"
)

// aPolicyOfAnyName stands for a policy's loop, under a name nothing in this
// package knows: it calls fn as a policy calls a user's function.
func aPolicyOfAnyName(fn func()) { fn() }

// An exclusive call made from inside a callback fails with ErrReentrant
// whatever the functions between the scope's Run and the callback are
// called, inlined or not (the old way named the policies' functions and
// missed any other); the same call from another goroutine waits for the
// holder; and a call inside the other scope waits too.
func TestReentryFoundByFrame(t *testing.T) {
	var l Lifetime
	l.Free = func() {}
	l.Scope = Reads
	if err := l.EnterExclusive("hold"); err != nil {
		t.Fatal(err)
	}
	var inside error
	Reads.Run(func() {
		aPolicyOfAnyName(func() { inside = l.EnterExclusive("read") })
	})
	if !errors.Is(inside, ErrReentrant) {
		t.Fatalf("from inside a callback: %v, want ErrReentrant", inside)
	}
	if Reads.Inside() || Drains.Inside() {
		t.Fatal("outside any Run, Inside reports true")
	}
	for _, tc := range []struct {
		name string
		run  func(func())
	}{
		{"another goroutine", func(f func()) { f() }},
		{"inside the other scope", Drains.Run},
	} {
		done := make(chan error, 1)
		go tc.run(func() { done <- l.EnterExclusive("read") })
		select {
		case err := <-done:
			t.Fatalf("%s: returned %v while the call was held; want it to wait", tc.name, err)
		case <-time.After(20 * time.Millisecond):
		}
		l.ExitExclusive()
		if err := <-done; err != nil {
			t.Fatalf("%s: %v after the holder left", tc.name, err)
		}
	}
	l.ExitExclusive()
}
