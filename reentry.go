// SPDX-License-Identifier: Apache-2.0

package perfbuf

// Calls from inside callbacks. A SampleFunc or LostFunc runs while its drain
// holds drainMu, and an Each or Consume function (or All loop body) while its
// read holds the reader: a call that waits for either from inside the
// callback would wait for itself. Telling that call from one on another goroutine, which
// must wait, costs a look at the caller's stack, so it is made only when the
// call would wait.

import (
	"reflect"
	"runtime"
	"slices"
)

// The functions that run callbacks: a frame of one of them on the stack
// means the caller is inside a callback.
var (
	drainCallbackFrames = funcNames((*callback).deliverRecord)
	readCallbackFrames  = funcNames((*fullest).each, (*ordered).each)
)

func funcNames(fns ...any) []string {
	names := make([]string, len(fns))
	for i, fn := range fns {
		names[i] = runtime.FuncForPC(reflect.ValueOf(fn).Pointer()).Name()
	}
	return names
}

// inCallback reports whether one of the functions named by frames is on
// the calling goroutine's stack.
func inCallback(frames []string) bool {
	var pcs [64]uintptr
	for skip := 2; ; {
		n := runtime.Callers(skip, pcs[:])
		it := runtime.CallersFrames(pcs[:n])
		for {
			f, more := it.Next()
			if slices.Contains(frames, f.Function) {
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
