// SPDX-License-Identifier: Apache-2.0

package wait

// Calls from inside callbacks. A user's function (New's sample function, an
// Each or Consume function) runs while its owner holds a drain or a read: a
// call from inside it that waits for either would wait for itself. Telling
// that call from one on another goroutine, which must wait, takes a look at
// the caller's stack, so it is made only when the call would wait.
//
// What is looked for is a frame of this file's own: the owners run every
// call that may reach a user's function through a Scope's Run, whose frame
// stays on the stack while the function runs. The frame is found by its
// function's entry address, not by a name, and no owner or policy needs to
// be listed: renaming them, or the compiler inlining them, changes nothing.

import (
	"errors"
	"reflect"
	"runtime"
)

// ErrReentrant is the error of a call made from inside a callback that
// would wait for a call in progress, perhaps the one running the callback.
var ErrReentrant = errors.New("call from inside a callback would wait for a call in progress")

// Scope is where callbacks run: the reads of Readers, or the drains of
// callback mode. A call inside one fails rather than wait for its kind of
// call.
type Scope struct{ entry uintptr }

// The scopes, each with a function of its own for its frame.
var (
	Reads  = Scope{entry: reflect.ValueOf(runRead).Pointer()}
	Drains = Scope{entry: reflect.ValueOf(runDrain).Pointer()}
)

// Run calls f, which may run users' functions, inside s.
func (s Scope) Run(f func()) {
	if s == Reads {
		runRead(f)
	} else {
		runDrain(f)
	}
}

// runRead and runDrain are the frames Inside looks for. They must stay
// calls of their own: not inlined, and doing nothing but call f.
//
//go:noinline
func runRead(f func()) { f() }

//go:noinline
func runDrain(f func()) { f() }

// Inside reports whether the calling goroutine runs inside s: a frame of its
// Run is on the stack.
func (s Scope) Inside() bool {
	var pcs [64]uintptr
	for skip := 2; ; {
		n := runtime.Callers(skip, pcs[:])
		frames := runtime.CallersFrames(pcs[:n])
		for {
			f, more := frames.Next()
			if f.Entry == s.entry {
				return true
			}
			if !more {
				break
			}
		}
		if n < len(pcs) {
			return false
		}
		skip += n
	}
}
