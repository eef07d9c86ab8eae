// SPDX-License-Identifier: Apache-2.0

package benchrun

import (
	"slices"
	"testing"
	"time"
)

// The workload's pacing: call i is due at callAt(i), and callsDue counts
// exactly the calls due by then, at rates that divide a second and rates
// that do not.
func TestPacing(t *testing.T) {
	for _, rate := range []int{1, 3, 7, 1000, 3000, 10000, 100000, 999983, 1000000} {
		prev := time.Duration(-1)
		for _, i := range []int{0, 1, 2, 3, 5, 999, 1000, 1001, 123457, 2000000} {
			at := callAt(i, rate)
			if at <= prev {
				t.Fatalf("rate %d: call %d at %v, not after the one before (%v)", rate, i, at, prev)
			}
			prev = at
			if got := callsDue(at, rate); got != i+1 {
				t.Errorf("rate %d: callsDue(callAt(%d) = %v) = %d, want %d", rate, i, at, got, i+1)
			}
			if got := callsDue(at-1, rate); got != i {
				t.Errorf("rate %d: callsDue(callAt(%d) - 1ns) = %d, want %d", rate, i, got, i)
			}
		}
		// No drift: the schedule's n-th call is n/rate seconds from the
		// start, to the ns, however many calls came before it.
		if got, want := callAt(rate*2, rate), 2*time.Second; got != want {
			t.Errorf("rate %d: call %d at %v, want %v", rate, rate*2, got, want)
		}
	}
	if got := callsDue(-time.Nanosecond, 1000); got != 0 {
		t.Errorf("callsDue before the start = %d, want 0", got)
	}
}

func TestHostResult(t *testing.T) {
	r := HostResult{Mode: ModeReaderBatch, Rate: 1000, Calls: 1000, Elapsed: 2 * time.Second, Workload: 3 * time.Millisecond,
		Emitted: 990, Failed: 10, Received: 990, Lost: 10,
		Window: Usage{CPU: 99 * time.Millisecond, Voluntary: 900, Involuntary: 90}}
	r.Prog.RunTime, r.Prog.Runs = 500*time.Microsecond, 1000
	if err := r.Check(); err != nil {
		t.Error(err)
	}
	for name, got := range map[string]float64{"Reached": r.Reached(), "ProgPerEvent": r.ProgPerEvent(), "WorkloadPerEvent": r.WorkloadPerEvent(),
		"ReaderPerEvent": r.ReaderPerEvent(), "SwitchesPerEvent": r.SwitchesPerEvent()} {
		want := map[string]float64{"Reached": 500, "ProgPerEvent": 500, "WorkloadPerEvent": 3000, "ReaderPerEvent": 100000, "SwitchesPerEvent": 1}[name]
		if got != want {
			t.Errorf("%s = %v, want %v", name, got, want)
		}
	}
	for _, bad := range []func(*HostResult){
		func(r *HostResult) { r.Calls++ },    // a call the program did not see
		func(r *HostResult) { r.Received-- }, // a record not delivered
		func(r *HostResult) { r.Lost-- },     // a loss not reported
	} {
		b := r
		bad(&b)
		if b.Check() == nil {
			t.Errorf("%+v passed the check", b)
		}
	}
	if err := (HostResult{Mode: ModeDetached, Calls: 5}).Check(); err != nil {
		t.Errorf("detached: %v", err)
	}
}

func TestHostModes(t *testing.T) {
	for _, m := range HostModes {
		goMode := m != ModeC && m != ModeCTuned && m != ModeDetached
		if IsHostGoMode(m) != goMode {
			t.Errorf("IsHostGoMode(%q) = %v, want %v", m, !goMode, goMode)
		}
		if want := uint64(0); m == ModeCTuned {
			if HostRBFlags(m) != rbNoWakeup {
				t.Errorf("%s writes with flags %#x, want BPF_RB_NO_WAKEUP", m, HostRBFlags(m))
			}
		} else if HostRBFlags(m) != want {
			t.Errorf("%s writes with flags %#x, want none", m, HostRBFlags(m))
		}
	}
	if IsHostGoMode(ModeOrdered) || !slices.IsSorted(HostRates) {
		t.Error("ordered is not a host mode; rates ascend")
	}
}
