package perfbuf

import (
	"testing"
	"time"
)

// A wait that accepts a late end keeps the deadline set last while it lies
// in its window, past the window's first quarter; it sets a new one when
// the deadline is outside, expired, or moved by a wake.
func TestWaiterDeadlineKept(t *testing.T) {
	w, err := newWaiter()
	if err != nil {
		t.Fatal(err)
	}
	defer w.close()
	const slack = 400 * time.Millisecond
	now := time.Now().Add(time.Hour) // far from expiry
	steps := []struct {
		name string
		from time.Time
		wake bool
		set  bool
	}{
		{"first", now, false, true},
		{"within the window", now.Add(slack / 2), false, false},
		{"at the window's first quarter", now.Add(slack * 3 / 4), false, false},
		{"in the window's first quarter", now.Add(slack*3/4 + time.Millisecond), false, true},
		{"the same", now.Add(slack*3/4 + time.Millisecond), false, false},
		{"after a wake", now.Add(slack*3/4 + time.Millisecond), true, true},
		{"earlier than the slack", now, false, true},
		{"none", time.Time{}, false, true},
		{"none again", time.Time{}, false, false},
		{"a deadline after none", now, false, true},
	}
	for _, st := range steps {
		if st.wake {
			w.wake(false)
			w.clearWake()
		}
		before := w.sets
		w.setDeadline(st.from, slack)
		if got := w.sets > before; got != st.set {
			t.Errorf("%s: deadline set %v, want %v", st.name, got, st.set)
		}
		want := st.from
		if !st.from.IsZero() {
			want = st.from.Add(slack)
		}
		if st.set && !w.armed.Equal(want) {
			t.Errorf("%s: armed %v, want %v", st.name, w.armed, want)
		}
		if !st.from.IsZero() && (w.armed.Before(st.from) || w.armed.After(st.from.Add(slack))) {
			t.Errorf("%s: armed %v outside [%v, +%v]", st.name, w.armed, st.from, slack)
		}
	}

	// A deadline that expired is not kept, whatever the window.
	start := time.Now()
	if _, err := w.wait(10*time.Millisecond, 20*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took < 10*time.Millisecond {
		t.Errorf("wait ended after %v, before its timeout", took)
	}
	before := w.sets
	w.setDeadline(w.armed.Add(-time.Millisecond), time.Second)
	if w.sets == before {
		t.Error("an expired deadline was kept")
	}
}
