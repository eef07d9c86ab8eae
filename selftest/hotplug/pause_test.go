// SPDX-License-Identifier: Apache-2.0

package hotplug

import (
	"testing"

	"github.com/perfbuf/perfbuf"
	"github.com/perfbuf/perfbuf/selftest/internal/bpftest"
)

// TestHotplugPaused: a CPU that comes online while the Reader is paused
// gets its ring opened paused (before its slot is stored): its outputs are
// refused as the other CPUs' are, and after Resume each CPU's come back as
// one lost record of their count before its next samples. Every attempt
// is accounted for: received + lost = attempted, lost = refused.
func TestHotplugPaused(t *testing.T) {
	f, cpu := setup(t)
	setOnline(t, cpu, false)
	r, err := perfbuf.NewReader(f.Events, perfbuf.ReaderOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if err := r.Pause(); err != nil {
		t.Fatal(err)
	}
	c := bpftest.NewCollector()
	stop := readAll(t, r, c)
	setOnline(t, cpu, true)
	waitRings(t, r.Stats, cpu, 1)
	const refused = 7
	start := f.Stats(t)
	emitAll(t, f, refused)
	paused := f.Stats(t)
	for _, k := range f.CPUs {
		if failed := paused[k].Failed - start[k].Failed; failed != refused {
			t.Errorf("cpu %d: %d of %d outputs refused while paused, want all", k, failed, refused)
		}
	}
	if err := r.Resume(); err != nil {
		t.Fatal(err)
	}
	emitAll(t, f, count)
	for _, k := range f.CPUs {
		waitSamples(t, c, k, count)
	}
	stop()
	c.CheckAccounting(t, f)
	c.CheckStats(t, r.Stats().Rings)
}
