// SPDX-License-Identifier: Apache-2.0

package owner

// Rings opened elsewhere and handed to the owner whole (Over): a source
// without an opening of its own.

import (
	"errors"
	"fmt"

	"github.com/perfbuf/perfbuf/internal/ring"
)

// given are the rings Over hands the owner.
type given struct {
	rings []ring.Kind
	fds   []int
	one   []bool // one[i]: one CPU alone writes ring i
}

func (g *given) opened() ([]ring.Kind, []int)                  { return g.rings, g.fds }
func (g *given) addNew(func(rb ring.Kind, fd int) error) error { return nil }
func (g *given) unlink()                                       {}
func (g *given) close()                                        {}
func (g *given) failureCounters() *failureMap                  { return nil }
func (g *given) oneWriter(i int) bool                          { return i < len(g.one) && g.one[i] }

func (g *given) epollFD() (int, error) {
	return -1, fmt.Errorf("no epoll set over rings opened elsewhere: %w", errors.ErrUnsupported)
}
