//go:build cgo

package perfbuf

import (
	"reflect"
	"testing"

	"golang.org/x/sys/unix"
)

// The C event callback and the Go walk of its arena, end to end: samples
// and lost counts are delivered; records of other types and records too
// short for what they say they hold are counted in Stats, never delivered
// and never dropped silently.
func TestEventCallbackArena(t *testing.T) {
	recs := [][]byte{
		fakeSample([]byte("first")),
		fakeRecord(unix.PERF_RECORD_THROTTLE, 24, make([]byte, 16)),
		fakeRecord(unix.PERF_RECORD_SAMPLE, 16, []byte{100, 0, 0, 0, 0, 0, 0, 0}), // u32 size 100 in 16 bytes
		fakeRecord(unix.PERF_RECORD_SAMPLE, 8, nil),                               // no room for the u32 size
		fakeRecord(unix.PERF_RECORD_LOST, 16, make([]byte, 8)),                    // no room for the count
		fakeLost(1, 42),
		fakeSample([]byte("second")),
	}
	entries, stopped := eventForTest(recs, 1, 4096, 64)
	if stopped {
		t.Fatal("callback stopped the pass with room in the arena")
	}
	var got []delivery
	pb := fakePB([]int32{0, 3}, &got)
	pb.batch = batch{buf: entries}
	if n := pb.batch.deliver(pb); n != 2 {
		t.Errorf("delivered %d samples, want 2", n)
	}
	// The kernel pads an n-byte sample to round_up(n+4, 8)-4 bytes.
	want := []delivery{{3, "first\x00\x00\x00\x00\x00\x00\x00", 0}, {3, "", 42}, {3, "second\x00\x00\x00\x00\x00\x00", 0}}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("got %q\nwant %q", got, want)
	}
	pb.publish()
	if st := pb.Stats()[1]; st != (CPUStats{CPU: 3, Samples: 2, Bytes: 24, Lost: 42, Other: 1, Corrupt: 3}) {
		t.Errorf("stats %+v", st)
	}
}

// The callback stops the pass once the arena has less than the reserve
// left, after taking the record it was given (libbpf consumes it).
func TestEventCallbackArenaFull(t *testing.T) {
	rec := fakeSample(make([]byte, 100)) // a 104-byte payload: a 112-byte entry
	entries, stopped := eventForTest([][]byte{rec, rec, rec, rec}, 0, 400, 120)
	if !stopped || len(entries) != 3*112 {
		t.Errorf("stopped %v with %d bytes of entries; want a stop after 3 entries (336 bytes)", stopped, len(entries))
	}
}
