package perfbuf

import (
	"errors"
	"fmt"
	"strings"
	"testing"
)

// Every exported error exists in every build: this file has no build
// constraint, so it compiles only if ErrNoCgo is declared with cgo too
// (it was declared only in the !cgo file).
func TestErrorsInEveryBuild(t *testing.T) {
	sentinels := []error{ErrMapType, ErrSampleTooLarge, ErrMapInUse, ErrBusy,
		ErrReentrant, ErrFlushed, ErrCorrupt, ErrNoCgo}
	for i, e := range sentinels {
		if !errors.Is(fmt.Errorf("context: %w", e), e) {
			t.Errorf("%v: errors.Is through a wrap fails", e)
		}
		for j, o := range sentinels {
			if i != j && errors.Is(e, o) {
				t.Errorf("%v matches %v", e, o)
			}
		}
	}
	if msg := ErrNoCgo.Error(); !strings.Contains(msg, "CGO_ENABLED=1") || !strings.Contains(msg, "libbpf") {
		t.Errorf("ErrNoCgo = %q: want it to name CGO_ENABLED=1 and libbpf", msg)
	}
}
