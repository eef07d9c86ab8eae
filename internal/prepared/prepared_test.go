// SPDX-License-Identifier: Apache-2.0

package prepared

import (
	"errors"
	"os"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// What each plan accepts: its own map, and for a ring per CPU the array or
// one of its rings; anything else (the buffer as compiled, loaded before
// Prepare) is refused naming the fix.
func TestCheck(t *testing.T) {
	const (
		perf  = unix.BPF_MAP_TYPE_PERF_EVENT_ARRAY
		rbuf  = unix.BPF_MAP_TYPE_RINGBUF
		array = unix.BPF_MAP_TYPE_ARRAY_OF_MAPS
		over  = mapFlagRBOverwrite
	)
	perfPlan := &Buffer{Name: "events", Plan: "perf_event_array", Type: perf, Fix: "call Prepare first"}
	ringPlan := &Buffer{Name: "events", Plan: "ringbuf of 8192 bytes", Type: rbuf, Size: 8192, Fix: "call Prepare first"}
	overPlan := &Buffer{Name: "events", Plan: "ringbuf of 8192 bytes in overwrite mode", Type: rbuf, Size: 8192, Overwrite: true, Fix: "call Prepare first"}
	perCPU := &Buffer{Name: "events", Plan: "ringbuf_per_cpu of 4096 bytes a ring, 1 CPUs a ring", Type: array, Size: 4096,
		Rings: []string{"events_0", "events_1"}, Fix: "call Prepare first"}
	for _, c := range []struct {
		b                *Buffer
		typ, size, flags uint32
		name             string
		ok               bool
	}{
		{nil, rbuf, 4096, 0, "events", true},
		{perfPlan, perf, 4, 0, "events", true},
		{perfPlan, rbuf, 65536, 0, "events", false},
		{ringPlan, rbuf, 8192, 0, "events", true},
		{ringPlan, rbuf, 65536, 0, "events", false},
		{ringPlan, perf, 4, 0, "events", false},
		{ringPlan, rbuf, 8192, over, "events", false},
		{overPlan, rbuf, 8192, over, "events", true},
		{overPlan, rbuf, 8192, 0, "events", false},
		{perCPU, rbuf, 4096, 0, "events_1", true},
		{perCPU, rbuf, 4096, 0, "", true},
		{perCPU, array, 2, 0, "events", true},
		{&Buffer{Name: "a_buffer_of_21_chars", Type: array, Rings: []string{"a_buffer_of__0"}}, array, 2, 0, "a_buffer_of_21_", true},
		// The buffer as compiled, one ring buffer of the same size.
		{perCPU, rbuf, 4096, 0, "events", false},
		{perCPU, rbuf, 8192, 0, "events_0", false},
		{perCPU, perf, 4, 0, "events", false},
	} {
		err := c.b.Check(c.typ, c.size, c.flags, c.name)
		if c.ok != (err == nil) || err != nil && (!errors.Is(err, os.ErrInvalid) || !strings.Contains(err.Error(), "call Prepare first") || !strings.Contains(err.Error(), c.b.Plan)) {
			t.Errorf("%+v: type %d, %d entries, flags %#x, %q: %v; want accepted %v", c.b, c.typ, c.size, c.flags, c.name, err, c.ok)
		}
	}
}
