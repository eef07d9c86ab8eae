package perfbuf

import (
	"encoding/binary"
	"errors"
	"math"
	"reflect"
	"strings"
	"testing"
)

func TestValidateOptions(t *testing.T) {
	const page = 4096
	good := []Options{
		{},
		{PageCount: 1},
		{PageCount: 1024, WakeupEvents: 64},
		{PageCount: 2, WakeupBytes: 4096},
		{PageCount: 1, MaxSampleSize: 4052},
		{PageCount: 64, MaxSampleSize: 65512},
		{PageCount: 4, WakeupEvents: math.MaxInt32},
	}
	for _, o := range good {
		if _, err := o.validate(page); err != nil {
			t.Errorf("%+v: %v", o, err)
		}
	}
	bad := []struct {
		o    Options
		want error
	}{
		{Options{PageCount: -1}, ErrInvalidOptions},
		{Options{PageCount: 3}, ErrInvalidOptions},
		{Options{PageCount: 96}, ErrInvalidOptions},
		{Options{WakeupEvents: -1}, ErrInvalidOptions},
		{Options{WakeupBytes: -1}, ErrInvalidOptions},
		{Options{PageCount: 1, WakeupBytes: 4096}, ErrInvalidOptions},
		{Options{WakeupBytes: 100, WakeupEvents: 2}, ErrInvalidOptions},
		{Options{MaxSampleSize: -5}, ErrInvalidOptions},
		// 4053 bytes need a 4072-byte record; a one-page ring holds 4088,
		// less 24 for the lost record written in front of it after a loss.
		{Options{PageCount: 1, MaxSampleSize: 4053}, ErrSampleTooLarge},
		// 4076 bytes fit an empty ring but not beside a lost record.
		{Options{PageCount: 1, MaxSampleSize: 4076}, ErrSampleTooLarge},
		// Over 64 KiB the u16 record size overflows, whatever the ring.
		{Options{PageCount: 64, MaxSampleSize: 65520}, ErrSampleTooLarge},
		// So high that computing the record size overflowed, once.
		{Options{PageCount: 1, MaxSampleSize: math.MaxInt}, ErrSampleTooLarge},
		{Options{PageCount: 1, MaxSampleSize: math.MaxInt - 5}, ErrSampleTooLarge},
		// wakeup_events is a u32 the kernel reads as an int: past
		// MaxInt32 it woke on every sample (1<<32+1 became 1).
		{Options{WakeupEvents: math.MaxInt32 + 1}, ErrInvalidOptions},
		{Options{WakeupEvents: 1<<32 + 1}, ErrInvalidOptions},
	}
	for _, c := range bad {
		if _, err := c.o.validate(page); !errors.Is(err, c.want) {
			t.Errorf("%+v: %v, want %v", c.o, err, c.want)
		}
	}
	// A page count whose ring size overflows is refused as such. (1<<62
	// pages made the ring 0 bytes: "wakeup bytes 0 outside [0, 0)".)
	for _, pages := range []int{1 << 62, 1 << 52, 1 << 51, 1 << 40} {
		_, err := (&Options{PageCount: pages}).validate(page)
		if !errors.Is(err, ErrInvalidOptions) || !strings.Contains(err.Error(), "page count") {
			t.Errorf("PageCount %d: %v, want ErrInvalidOptions about the page count", pages, err)
		}
	}
	if p, _ := (&Options{}).validate(page); p != DefaultPageCount {
		t.Errorf("default page count %d", p)
	}
}

func TestSampleRecordSize(t *testing.T) {
	for n, want := range map[int]int{1: 16, 4: 16, 5: 24, 12: 24, 13: 32, 64: 80, 4076: 4088, 4077: 4096} {
		if got := SampleRecordSize(n); got != want {
			t.Errorf("SampleRecordSize(%d) = %d, want %d", n, got, want)
		}
	}
}

// arena builds arena entries as perfbuf_on_event writes them.
type arena []byte

func (a arena) sample(idx uint32, data []byte) arena {
	var h [arenaEntryHdr]byte
	binary.NativeEndian.PutUint32(h[:], uint32(len(data)))
	binary.NativeEndian.PutUint32(h[4:], idx)
	a = append(a, h[:]...)
	a = append(a, data...)
	for len(a)%8 != 0 {
		a = append(a, 0xee) // padding must never be delivered
	}
	return a
}

func (a arena) lost(idx uint32, n uint64) arena { return a.marker(arenaEntryLost, idx, n) }

func (a arena) marker(m, idx uint32, v uint64) arena {
	var e [arenaEntryHdr + 8]byte
	binary.NativeEndian.PutUint32(e[:], m)
	binary.NativeEndian.PutUint32(e[4:], idx)
	binary.NativeEndian.PutUint64(e[8:], v)
	return append(a, e[:]...)
}

type delivery struct {
	cpu  int
	data string
	lost uint64
}

// fakePB is a PerfBuffer with no rings, enough to deliver batches.
func fakePB(cpus []int32, got *[]delivery) *PerfBuffer {
	return &PerfBuffer{
		cpus:   cpus,
		pend:   make([]pending, len(cpus)),
		stats:  make([]cpuCounters, len(cpus)),
		sample: func(cpu int, data []byte) { *got = append(*got, delivery{cpu: cpu, data: string(data)}) },
		lost:   func(cpu int, n uint64) { *got = append(*got, delivery{cpu: cpu, lost: n}) },
	}
}

func TestBatchDeliver(t *testing.T) {
	var got []delivery
	pb := fakePB([]int32{0, 2, 5}, &got) // index 1 is CPU 2, index 2 is CPU 5
	a := arena(nil).
		sample(0, []byte("a")).
		sample(1, []byte("hello, world")).
		lost(2, 7).
		sample(2, []byte("12345678")).
		sample(1, nil).
		marker(arenaEntryOther, 1, 5). // PERF_RECORD_THROTTLE: counted, not delivered
		marker(arenaEntryBad, 2, 16).  // a sample too short for its size field
		lost(0, 1)
	pb.batch = batch{buf: a}
	if n := pb.batch.deliver(pb); n != 4 {
		t.Errorf("delivered %d samples, want 4", n)
	}
	want := []delivery{{0, "a", 0}, {2, "hello, world", 0}, {5, "", 7}, {5, "12345678", 0}, {2, "", 0}, {0, "", 1}}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("got %v\nwant %v", got, want)
	}
	pb.publish()
	wantStats := []CPUStats{{CPU: 0, Samples: 1, Bytes: 1, Lost: 1}, {CPU: 2, Samples: 2, Bytes: 12, Other: 1}, {CPU: 5, Samples: 1, Bytes: 8, Lost: 7, Corrupt: 1}}
	if s := pb.Stats(); !reflect.DeepEqual(s, wantStats) {
		t.Errorf("stats %+v, want %+v", s, wantStats)
	}
	if n := pb.batch.deliver(pb); n != 0 {
		t.Errorf("a delivered batch delivered %d again", n)
	}
}

// A panicking SampleFunc: the panic reaches the caller, the sample it
// panicked on counts as delivered, the rest come with the next call.
func TestBatchDeliverPanic(t *testing.T) {
	var got []delivery
	pb := fakePB([]int32{0}, &got)
	calls := 0
	pb.sample = func(cpu int, data []byte) {
		calls++
		got = append(got, delivery{cpu: cpu, data: string(data)})
		if calls == 2 {
			panic("boom")
		}
	}
	a := arena(nil)
	for _, s := range []string{"s1", "s2", "s3", "s4"} {
		a = a.sample(0, []byte(s))
	}
	pb.batch = batch{buf: a}
	func() {
		defer func() {
			if recover() == nil {
				t.Error("panic did not reach the caller")
			}
		}()
		pb.batch.deliver(pb)
	}()
	if n := pb.batch.deliver(pb); n != 2 {
		t.Errorf("second deliver: %d samples, want 2", n)
	}
	pb.publish()
	var data []string
	for _, d := range got {
		data = append(data, d.data)
	}
	if !reflect.DeepEqual(data, []string{"s1", "s2", "s3", "s4"}) {
		t.Errorf("delivered %v", data)
	}
	if s := pb.Stats()[0]; s.Samples != 4 {
		t.Errorf("stats count %d samples, want 4", s.Samples)
	}
}

// BenchmarkDeliver measures the Go half of callback mode: walking the
// arena and calling SampleFunc, per sample.
func BenchmarkDeliver(b *testing.B) {
	for _, size := range []int{16, 64, 256, 1024} {
		b.Run(itoa(size), func(b *testing.B) {
			var got []delivery
			pb := fakePB([]int32{0}, &got)
			var sum uint64
			pb.sample = func(_ int, data []byte) { sum += uint64(len(data)) + uint64(data[0]) }
			a := arena(nil)
			payload := make([]byte, size)
			for len(a) < 64<<10 {
				a = a.sample(0, payload)
			}
			per := len(a) / (arenaEntryHdr + (size+7)&^7)
			b.ReportAllocs()
			b.ResetTimer()
			for done := 0; done < b.N; done += per {
				pb.batch = batch{buf: a}
				pb.batch.deliver(pb)
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N), "ns/sample")
			_ = sum
		})
	}
}

func itoa(n int) string {
	b := []byte{}
	for ; n > 0; n /= 10 {
		b = append([]byte{byte('0' + n%10)}, b...)
	}
	return string(b)
}
