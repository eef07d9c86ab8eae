// SPDX-License-Identifier: Apache-2.0

package owner

// An owner over rings opened elsewhere (Over): the owner core without an
// opening of its own.

import (
	"errors"
	"fmt"

	"github.com/perfbuf/perfbuf/internal/ring"
)

// Over returns an owner of rings opened elsewhere and handed over whole:
// ring i is woken when fds[i] is readable; what names them in errors
// ("" : "rings"); oneWriter[i] says that one CPU alone writes ring i (an
// ordered reader's rule 1: policy.WindowConfig). No ring is added later,
// none is unlinked or freed at Close (their opener frees them), and there
// is no failure map.
func Over(rings []ring.Kind, fds []int, what string, oneWriter []bool) (*Core, error) {
	g := &given{rings: rings, fds: fds, oneWriter: oneWriter}
	c, err := newCore(g.opened())
	if err != nil {
		return nil, err
	}
	c.src, c.what = g, what
	return c, nil
}

// given are the rings Over hands the owner.
type given struct {
	rings     []ring.Kind
	fds       []int
	oneWriter []bool
}

func (g *given) opened() ([]ring.Kind, []int)                  { return g.rings, g.fds }
func (g *given) addNew(func(rb ring.Kind, fd int) error) error { return nil }
func (g *given) unlink()                                       {}
func (g *given) close()                                        {}
func (g *given) failureCounters() *failureMap                  { return nil }

func (g *given) epollFD() (int, error) {
	return -1, fmt.Errorf("no epoll set over rings opened elsewhere: %w", errors.ErrUnsupported)
}
