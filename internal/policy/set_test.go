// SPDX-License-Identifier: Apache-2.0

package policy

import "testing"

// Observe moves Clear to the time of the first observation whose producer
// position the oldest record not delivered has reached since: at once when
// the ring is empty, one observation later when it never empties; never
// back.
func TestObserve(t *testing.T) {
	steps := []struct {
		name         string
		oldest, head uint64
		at, clear    int64
	}{
		{"records waiting", 0, 100, 10, 0},
		{"behind the mark", 50, 200, 20, 0},         // the mark stays (100, 10)
		{"the mark reached", 100, 300, 30, 10},      // records from 100 on came after 10
		{"the next mark reached", 300, 400, 40, 30}, // a ring that never empties
		{"empty", 400, 400, 50, 50},
		{"an older look", 400, 400, 45, 50}, // (a Stats call's clock read before the reader's)
		{"new records", 400, 480, 60, 50},
		{"delivered", 480, 480, 70, 70},
	}
	tl := Tally{}
	for _, st := range steps {
		tl.Observe(st.oldest, st.head, st.at)
		if tl.Clear != st.clear {
			t.Errorf("%s: Clear %d, want %d", st.name, tl.Clear, st.clear)
		}
	}
}
