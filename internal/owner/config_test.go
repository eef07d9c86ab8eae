// SPDX-License-Identifier: Apache-2.0

package owner

// Tests of the checks against a map: a ring buffer's room for an ordered
// reader's key, and the claim that makes one reader per map in this
// process. The options' own checks are the root's (TestRingOptions,
// TestOrderKeyFits).

import (
	"errors"
	"os"
	"strings"
	"testing"
)

// An ordered reader's key must fit in the largest sample a ring buffer
// holds: one of 4080 bytes in a one-page ring, with its 8-byte header, in
// a record of at most 4088.
func TestKeyEndRingBuf(t *testing.T) {
	const page = 4096
	ringBuf := mapDesc{typ: mapTypeRingBuf, maxEntries: page, name: "events"}
	for _, c := range []struct {
		off int
		ok  bool // accepted
	}{
		{0, true}, {4044, true}, {4045, true}, {4072, true}, {4073, false}, {65000, false},
	} {
		err := RingOptions{KeyEnd: c.off + 8}.checkRingBuf(ringBuf)
		if c.ok != (err == nil) || err != nil && (!errors.Is(err, os.ErrInvalid) || !strings.Contains(err.Error(), `past the largest sample the 4096-byte ring of ring buffer "events" holds (4080 bytes)`)) {
			t.Errorf("KeyOffset %d, ring buffer of a page: %v; accepted %v", c.off, err, c.ok)
		}
	}
}

// One reader per map in this process: a claimed map ID cannot be claimed
// again until it is released.
func TestClaimMap(t *testing.T) {
	const id = 1<<32 - 7 // no map of a test process has it
	if !claimMap(id) {
		t.Fatal("first claim refused")
	}
	if claimMap(id) {
		t.Fatal("second claim granted")
	}
	if !claimMap(id - 1) {
		t.Fatal("another map's claim refused")
	}
	unclaimMap(id)
	unclaimMap(id - 1)
	if !claimMap(id) {
		t.Fatal("claim after release refused")
	}
	unclaimMap(id)
}

// An error names what is read: the map, and how many more beside it.
func TestDescribeMaps(t *testing.T) {
	if got, want := describeMaps(mapDesc{typ: mapTypeRingBuf, name: "a"}, 2), `ring buffer "a" and 2 more maps`; got != want {
		t.Errorf("describeMaps = %q, want %q", got, want)
	}
	if got, want := describeMaps(mapDesc{typ: mapTypePerfEventArray, name: "events"}, 0), `perf event array "events"`; got != want {
		t.Errorf("describeMaps = %q, want %q", got, want)
	}
}
