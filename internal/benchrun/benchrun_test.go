package benchrun

import (
	"os"
	"testing"
	"time"
)

// RecordSize agrees with the kernel's layout: a 13-byte output arrives as 20
// bytes in a 32-byte record, and the largest sample a one-page ring takes
// (4052 bytes) needs 4064.
func TestRecordSize(t *testing.T) {
	for n, want := range map[int]int{1: 16, 4: 16, 5: 24, 12: 24, 13: 32, 20: 32, 64: 80, 4052: 4064} {
		if got := RecordSize(n); got != want {
			t.Errorf("RecordSize(%d) = %d, want %d", n, got, want)
		}
	}
}

func TestPerRound(t *testing.T) {
	page := os.Getpagesize()
	for _, size := range Sizes {
		n := PerRound(DrainPages, size)
		used := n * RecordSize(size)
		if used > DrainPages*page-page || used+RecordSize(size) <= DrainPages*page-page {
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
