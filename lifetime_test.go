package perfbuf

import (
	"errors"
	"os"
	"sync"
	"sync/atomic"
	"testing"
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
