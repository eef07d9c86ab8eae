// SPDX-License-Identifier: Apache-2.0

package wait

import (
	"testing"
	"time"
)

// A wait that accepts a late end keeps the deadline set last while it is
// ahead and no later than its window's end, also when it is earlier than
// the window (the wait ends early); it sets a new one when the deadline
// would be late, has expired, or a wake moved it, and always without a
// slack.
func TestWaiterDeadlineKept(t *testing.T) {
	w, err := New()
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	const slack = 400 * time.Millisecond
	now := time.Now()
	at := now.Add(time.Hour) // far from expiry
	steps := []struct {
		name  string
		now   time.Time
		from  time.Time
		slack time.Duration
		wake  bool
		set   bool
	}{
		{"first", now, at, slack, false, true},
		{"a later window", now, at.Add(slack / 2), slack, false, false},
		{"a window past the deadline", now, at.Add(2 * slack), slack, false, false},
		{"an earlier window", now, at.Add(-slack / 2), slack, false, true},
		{"the same", now, at.Add(-slack / 2), slack, false, false},
		{"after a wake", now, at.Add(-slack / 2), slack, true, true},
		{"the same without a slack", now, at.Add(-slack / 2), 0, false, true},
		{"the deadline expired", at.Add(slack), at.Add(slack), slack, false, true},
		{"none", now, time.Time{}, slack, false, true},
		{"none again", now, time.Time{}, slack, false, false},
		{"a deadline after none", now, at, slack, false, true},
	}
	for _, st := range steps {
		if st.wake {
			w.Wake(false)
			w.ClearWake()
		}
		before := w.sets
		w.setDeadline(st.now, st.from, st.slack)
		if got := w.sets > before; got != st.set {
			t.Errorf("%s: deadline set %v, want %v", st.name, got, st.set)
		}
		want := st.from
		if !st.from.IsZero() {
			want = st.from.Add(st.slack)
		}
		if st.set && !w.armed.Equal(want) {
			t.Errorf("%s: armed %v, want %v", st.name, w.armed, want)
		}
		if !st.from.IsZero() && (w.armed.After(st.from.Add(st.slack)) || !w.armed.After(st.now)) {
			t.Errorf("%s: armed %v, not in (%v, %v]", st.name, w.armed, st.now, st.from.Add(st.slack))
		}
	}

	// A wait that times out has its deadline expire: not kept.
	start := time.Now()
	if _, err := w.Wait(10*time.Millisecond, 20*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took < 10*time.Millisecond {
		t.Errorf("wait ended after %v, before its timeout", took)
	}
	before := w.sets
	w.setDeadline(w.armed.Add(-time.Second), w.armed.Add(-time.Millisecond), time.Second)
	if w.sets == before {
		t.Error("a deadline that ended a wait was kept")
	}
}

// A wait allocates nothing: an idle reader wakes often.
func TestWaiterWaitAllocs(t *testing.T) {
	w, err := New()
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	if n := testing.AllocsPerRun(20, func() { w.Wait(20*time.Microsecond, 0) }); n != 0 {
		t.Errorf("%v allocations a wait", n)
	}
}

// Without a slack, a deadline within sameDeadline of the one armed is the
// same deadline recomputed from a timeout (a Reader's SetDeadline): kept,
// on either side; one further away is set.
func TestWaiterSameDeadlineKept(t *testing.T) {
	w, err := New()
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	now := time.Now()
	at := now.Add(time.Hour)
	w.setDeadline(now, at, 0)
	for _, st := range []struct {
		name string
		from time.Time
		set  bool
	}{
		{"a little later", at.Add(3 * time.Microsecond), false},
		{"a little earlier", at.Add(-3 * time.Microsecond), false},
		{"at the limit", at.Add(sameDeadline), false},
		{"later", at.Add(sameDeadline + time.Microsecond), true},
		{"earlier", at.Add(-time.Millisecond), true},
	} {
		w.armed, w.armedOK = at, true
		before := w.sets
		w.setDeadline(now, st.from, 0)
		if got := w.sets > before; got != st.set {
			t.Errorf("%s: deadline set %v, want %v", st.name, got, st.set)
		}
	}
}
