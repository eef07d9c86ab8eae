// SPDX-License-Identifier: Apache-2.0

package owner

import (
	"slices"
	"time"

	"github.com/perfbuf/perfbuf/internal/policy"
	"github.com/perfbuf/perfbuf/internal/ring"
)

// The owner's Stats: the counts published, with what is read at the call.

// Stats returns the published counts with what is read at the time of
// the call, while the rings are mapped: each ring's fill, and its positions,
// which it observes (policy.Tally.Observe) for Waiting; and the failure
// map's counts, which may append entries. Any goroutine may call it.
func (c *Core) Stats() []Stats {
	now := policy.Now() // before the positions are loaded: see Observe
	mapped := c.Life.Enter("") == nil
	c.StatsMu.Lock()
	rings := c.Rings
	waiting := make([]bool, len(rings))
	if mapped {
		for i, rb := range rings {
			tail, head := rb.Cur().Positions()
			c.Tallies[i].Observe(tail, head, now)
			waiting[i] = tail != head
		}
	}
	tallies := slices.Clone(c.Tallies)
	var kinds []ring.Kind
	var fds []int
	if _, raw := c.pol.(policy.Raw); mapped && c.countsLost && !raw {
		// (A Raw's losses are its RawBuffers' until Close.)
		kinds, fds = slices.Clone(c.Kinds), slices.Clone(c.fds)
	}
	c.StatsMu.Unlock()
	st := make([]Stats, len(tallies))
	for i, t := range tallies {
		st[i] = Stats{Ring: i, CPU: t.CPU, Size: t.Size, Tally: Tally{Late: t.Late, Left: t.Left, Found: t.Found}}
		st[i].setCounts(&t.Counts)
		if waiting[i] {
			st[i].Waiting = time.Duration(max(now-t.Clear, 0))
		}
	}
	if mapped {
		for i := range st {
			st[i].Fill = rings[i].Cur().Used()
			if i >= len(kinds) {
				continue // (no count, or a ring added meanwhile)
			}
			if n, ok := c.refused(kinds[i], fds[i]); ok {
				st[i].Lost = max(st[i].Lost, n)
			}
		}
		c.Life.Exit()
	}
	return c.progs.addTo(c.src.failureCounters().addTo(st))
}

// addViewLost adds to viewLost what a RawBuffer of ring i counted lost.
func (c *Core) addViewLost(i int, lost uint64) {
	c.StatsMu.Lock()
	defer c.StatsMu.Unlock()
	if i >= len(c.viewLost) {
		c.viewLost = append(c.viewLost, make([]uint64, i+1-len(c.viewLost))...)
	}
	c.viewLost[i] += lost
}
