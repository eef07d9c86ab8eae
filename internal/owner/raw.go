// SPDX-License-Identifier: Apache-2.0

package owner

// Raw mode's mechanism (perfbuf.Raw documents each method): the rings held
// for raw views, one view a ring at a time, and the wait for rings with
// records.

import (
	"fmt"
	"os"
	"sync"
	"time"

	"github.com/perfbuf/perfbuf/internal/policy"
	"github.com/perfbuf/perfbuf/internal/ring"
	"github.com/perfbuf/perfbuf/internal/wait"
)

// Raw holds every ring of a core for raw views, for perfbuf.Raw. Its
// methods may be called from any goroutine.
type Raw struct {
	C      *Core      // the owner of the rings
	mu     sync.Mutex // serialises Buffer, release and ring additions
	held   []bool     // held[i]: a view reads ring i
	opWait string
}

// NewRaw builds a Raw over c, and starts c.
func NewRaw(c *Core) *Raw {
	r := &Raw{C: c, opWait: "wait " + c.Name()}
	c.start(policy.Raw{S: &c.Set}, wait.Scope{})
	return r
}

// Buffer returns a view of ring i, to read until release is called with
// what the view counted lost. Errors: os.ErrInvalid for an index out of
// range, ErrBusy if a view of ring i is held already, os.ErrClosed.
func (r *Raw) Buffer(i int) (view ring.Ring, release func(lost uint64), err error) {
	op := fmt.Sprintf("raw view of ring %d of %s", i, r.C.Name())
	if err := r.C.checkIndex(i); err != nil {
		return nil, nil, wrap(op, err)
	}
	// The reference taken here keeps the mapping alive: release drops it.
	if err := r.C.Life.Enter(op); err != nil {
		return nil, nil, err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if i < len(r.held) && r.held[i] {
		r.C.Life.Exit()
		return nil, nil, wrap(op, ErrBusy)
	}
	rb, err := r.C.Kinds[i].View()
	if err != nil {
		r.C.Life.Exit()
		return nil, nil, wrap(op, err)
	}
	if i >= len(r.held) {
		r.held = append(r.held, make([]bool, i+1-len(r.held))...)
	}
	r.held[i] = true
	return rb, func(lost uint64) {
		r.C.addViewLost(i, lost)
		r.release(i)
	}, nil
}

// release ends view i's hold.
func (r *Raw) release(i int) {
	r.mu.Lock()
	r.held[i] = false
	r.mu.Unlock()
	r.C.Life.Exit()
}

// Wait blocks until a ring holds records, timeout passes (negative: no
// limit; zero: do not block) or Close is called, and returns dst with the
// index of every ring that holds records appended. It opens the rings of
// CPUs that came online since its last call.
func (r *Raw) Wait(timeout time.Duration, dst []int) ([]int, error) {
	op := r.opWait
	if err := r.C.Life.Enter(op); err != nil {
		return dst, err
	}
	defer r.C.Life.Exit()
	var deadline time.Time
	if timeout > 0 {
		deadline = time.Now().Add(timeout)
	}
	for {
		r.mu.Lock()
		err := r.C.addNewCPUs()
		rings := r.C.Rings
		r.mu.Unlock()
		if err != nil {
			return dst, wrap(op, err)
		}
		n := len(dst)
		for i, rb := range rings {
			if rb.Cur().Used() > 0 {
				dst = append(dst, i)
			}
		}
		if len(dst) > n || timeout == 0 {
			return dst, nil
		}
		left := timeout
		if timeout > 0 {
			if left = time.Until(deadline); left <= 0 {
				return dst, nil
			}
		}
		if _, err := r.C.W.Wait(left, 0); err != nil {
			return dst, wrap(op, err)
		}
		if r.C.Life.Closed() {
			return dst, wrap(op, os.ErrClosed)
		}
		if r.C.W.Woken() {
			r.C.W.ClearWake() // a CPU came online: look again
		}
	}
}
