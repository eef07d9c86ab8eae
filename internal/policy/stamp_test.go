// SPDX-License-Identifier: Apache-2.0

package policy

import (
	"encoding/binary"
	"fmt"
	"testing"
	"time"

	"github.com/perfbuf/perfbuf/internal/ringtest"
)

// stampedOver is a window over n shared ring buffers (no ring written by
// one CPU), keys stamped or not, rules 2 and 3 out of reach, and its monotonic
// clock stopped at mono.
func stampedOver(t *testing.T, n int, stamped bool, mono time.Duration) (*window, []*ringtest.RingBuf) {
	t.Helper()
	s, fakes := ringBufSet(t, n, 4096)
	w := NewWindow(s, WindowConfig{OrderConfig: OrderConfig{MaxDelay: time.Hour, Window: 1 << 62, Stamped: stamped}, Bytes: n * 4096})
	w.rules.mono = func() int64 { return int64(mono) }
	return w, fakes
}

// Rule 1 with stamped keys: a shared ring buffer found empty at the intake
// shows the key the clock read before it, less stampSlack. A copy whose key
// lies below it goes; one above it waits for the next look: with no
// budget, Idle's timer ends when the clock passes the key. Without stamped
// keys, a shared ring holds rule 1 back, and the copy waits for MaxDelay.
func TestWindowStampedEmptyRings(t *testing.T) {
	const mono = 100 * time.Second
	for _, tc := range []struct {
		rings   int
		stamped bool
		key     time.Duration
		goes    bool
	}{
		{1, true, mono - 10*time.Second, true},
		{3, true, mono - 10*time.Second, true},
		{1, true, mono - stampSlack/2, false}, // within the slack
		{2, true, mono + 10*time.Second, false},
		{1, false, mono - 10*time.Second, false},
		{3, false, mono - 10*time.Second, false},
	} {
		t.Run(fmt.Sprintf("%d rings stamped %v key %v", tc.rings, tc.stamped, tc.key-mono), func(t *testing.T) {
			w, rings := stampedOver(t, tc.rings, tc.stamped, mono)
			emitKey(t, rings[0], uint64(tc.key))
			rec, i := w.Next()
			if got := i >= 0; got != tc.goes {
				t.Fatalf("released %v (ring %d); want %v (minSeen %d, allSeen %v)", got, i, tc.goes, w.rules.minSeen, w.rules.allSeen)
			}
			if !tc.goes {
				// Within a budget, the read looks at the rings as the budget
				// has it, and the copy waits at most for rule 3; with none,
				// Idle's timer ends when the clock passes the key (or the
				// look every hotHold, sooner).
				for _, latency := range []time.Duration{2 * time.Hour, -1} {
					w.s.Latency = latency
					timeout, _ := w.Idle()
					want := time.Hour // rule 3
					if latency < 0 {
						want = hotHold
						if d := tc.key + stampSlack - mono; tc.stamped && d > 0 {
							want = min(want, d)
						}
					}
					exact := want != time.Hour // (rule 3 counts from the copy, on the host's clock)
					if exact && timeout != want || !exact && (timeout < want-time.Second || timeout > want+time.Second) {
						t.Fatalf("Latency %v: Idle's timeout %v; want %v", latency, timeout, want)
					}
				}
				return
			}
			if rec.Key != uint64(tc.key) {
				t.Fatalf("released key %d; want %d", rec.Key, uint64(tc.key))
			}
		})
	}
}

// A ring that is not empty at the intake shows no stamped key: a record
// reserved and not committed (busy), or one behind it, may have any key
// the clock read after its reservation, which came before the look. The
// copies of the other rings wait for it; once it is committed and taken
// in, and its ring empty, they go in key order.
func TestWindowStampedBusyRing(t *testing.T) {
	const mono = 100 * time.Second
	w, rings := stampedOver(t, 2, true, mono)
	emitKey(t, rings[0], uint64(mono-20*time.Second))
	busy, ok := rings[1].Reserve(16)
	if !ok {
		t.Fatal("no room")
	}
	if _, i := w.Next(); i >= 0 {
		t.Fatalf("ring %d released while ring 1 holds a busy record", i)
	}
	key := uint64(mono - 30*time.Second) // read after the reservation, yet smaller: the program's clock lags the reader's
	rings[1].Write(busy, binary.NativeEndian.AppendUint64(make([]byte, 0, 16), key)[:16])
	rings[1].Commit(busy, false)
	w.take.look = true // (a wakeup: the read looks again)
	var keys []uint64
	for {
		rec, i := w.Next()
		if i < 0 {
			break
		}
		keys = append(keys, rec.Key)
		w.Delivered(i)
	}
	if len(keys) != 2 || keys[0] != key {
		t.Fatalf("released %v; want %d first, then %d", keys, key, uint64(mono-20*time.Second))
	}
}
