package benchrun

import (
	"os"
	"testing"
	"time"

	"github.com/perfbuf/perfbuf"
)

func TestPerRound(t *testing.T) {
	page := os.Getpagesize()
	for _, size := range Sizes {
		n := PerRound(DrainPages, size)
		used := n * perfbuf.SampleRecordSize(size)
		if used > DrainPages*page-page || used+perfbuf.SampleRecordSize(size) <= DrainPages*page-page {
			t.Errorf("PerRound(%d, %d) = %d: %d bytes of %d", DrainPages, size, n, used, DrainPages*page)
		}
	}
}

func TestSustainedResult(t *testing.T) {
	r := SustainedResult{Mode: "x", Emitted: 90, Failed: 10, Received: 90, Lost: 10, Wall: time.Second / 2}
	if err := r.Check(); err != nil {
		t.Error(err)
	}
	if got := r.Rate(); got != 180 {
		t.Errorf("Rate = %v, want 180", got)
	}
	r.Lost = 9
	if err := r.Check(); err == nil {
		t.Error("lost 9 of 10 failed passed the check")
	}
	if (SustainedResult{}).Rate() != 0 {
		t.Error("rate of an empty result")
	}
}
