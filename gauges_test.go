// SPDX-License-Identifier: Apache-2.0

package perfbuf

import (
	"errors"
	"io/fs"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/perfbuf/perfbuf/internal/kernel"
)

// Stats' Size is each ring's size, also after Close; FollowsCPUs is false
// over rings with neither a CPU watch nor ring buffers.
func TestStatsSizeFollowsCPUs(t *testing.T) {
	sizes := func(st []Stats) []int {
		var out []int
		for _, s := range st {
			out = append(out, s.Size)
		}
		return out
	}
	f := newFakeRings(t, 2, 4096)
	r := f.reader(t, ReaderOptions{})
	if got := sizes(r.Stats()); !slices.Equal(got, []int{4096, 4096}) {
		t.Errorf("Stats' sizes = %v, want [4096 4096]", got)
	}
	if r.FollowsCPUs() {
		t.Error("FollowsCPUs over rings without a CPU watch")
	}
	r.Close()
	if got := sizes(r.Stats()); !slices.Equal(got, []int{4096, 4096}) {
		t.Errorf("Stats' sizes after Close = %v", got)
	}

	// With a CPU watch, and over ring buffers: internal/owner's
	// TestFollowsCPUs.
}

// CloseExact is false before 6.0 (no PERF_FORMAT_LOST), and from 6.0 true
// on a kernel without nohz_full CPUs, whose
// /sys/devices/system/cpu/nohz_full lists none ("(null)" or no file):
// membarrier waits there, and so does the array of maps. On a nohz_full
// kernel only the array of maps waits (internal/kernel's
// TestWaitWritersMembarrierRefused; selftest/failures' TestNohzFull in a
// nohz_full guest of make vmtest).
func TestCloseExact(t *testing.T) {
	b, err := os.ReadFile("/sys/devices/system/cpu/nohz_full")
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		t.Fatal(err)
	}
	list := strings.TrimSpace(string(b))
	nohzFull := list != "" && list != "(null)"
	major, minor, err := kernel.Version()
	if err != nil {
		t.Fatal(err)
	}
	switch got := CloseExact(); {
	case major < 6 && got:
		t.Errorf("CloseExact() = %v on kernel %d.%d, before PERF_FORMAT_LOST", got, major, minor)
	case major >= 6 && !got && !nohzFull:
		t.Errorf("CloseExact() = %v on kernel %d.%d without nohz_full CPUs (%q)", got, major, minor, list)
	}
}
