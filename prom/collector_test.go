// SPDX-License-Identifier: Apache-2.0

package prom

import (
	"reflect"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/perfbuf/perfbuf"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"
)

// Both readers are Sources.
var (
	_ Source = (*perfbuf.PerfBuffer)(nil)
	_ Source = (*perfbuf.Reader)(nil)
)

// fakeSource returns stats, and counts the calls.
type fakeSource struct {
	stats []perfbuf.Stats
	calls atomic.Int32
}

func (f *fakeSource) Stats() []perfbuf.Stats {
	f.calls.Add(1)
	return f.stats
}

// fakeStats is what a Reader with a FailureMap could report: CPU 2 has two
// rings (it went offline and came back), CPU 3 has no ring but failures,
// and the entries are not in CPU order.
func fakeStats() []perfbuf.Stats {
	return []perfbuf.Stats{
		{CPU: 2, Samples: 10, Bytes: 640, Lost: 3, Other: 1, Corrupt: 1, CorruptBytes: 48,
			Late: 2, Dropped: 1, Left: 0, MaxFill: 4096, Fill: 0},
		{CPU: 0, Samples: 7, Bytes: 448, Late: 1, MaxFill: 512, Fill: 128,
			Failed: perfbuf.Failures{Invalid: 2}},
		{CPU: 2, Samples: 5, Bytes: 320, Lost: 4, Late: 1, Left: 2, MaxFill: 1024, Fill: 256,
			Failed: perfbuf.Failures{NotOnCPU: 6, Other: 1}},
		{CPU: 3, Failed: perfbuf.Failures{NoEntry: 5, TooBig: 2, Full: 4}},
	}
}

const wantText = `
# HELP perfbuf_corrupt_skipped_bytes_total Bytes of the CPU's rings skipped, unread, to get past corruptions.
# TYPE perfbuf_corrupt_skipped_bytes_total counter
perfbuf_corrupt_skipped_bytes_total{cpu="0"} 0
perfbuf_corrupt_skipped_bytes_total{cpu="2"} 48
perfbuf_corrupt_skipped_bytes_total{cpu="3"} 0
# HELP perfbuf_corruptions_total Records or ring heads the kernel never writes, found in the CPU's rings; reading went on past each.
# TYPE perfbuf_corruptions_total counter
perfbuf_corruptions_total{cpu="0"} 0
perfbuf_corruptions_total{cpu="2"} 1
perfbuf_corruptions_total{cpu="3"} 0
# HELP perfbuf_discarded_records_total Ring buffers: records of the CPU's rings that the BPF program discarded (bpf_ringbuf_discard), skipped.
# TYPE perfbuf_discarded_records_total counter
perfbuf_discarded_records_total{cpu="0"} 0
perfbuf_discarded_records_total{cpu="2"} 0
perfbuf_discarded_records_total{cpu="3"} 0
# HELP perfbuf_dropped_late_samples_total Ordered Reader with DropLate: late samples of the CPU dropped, not delivered (also in samples_total and late_samples_total).
# TYPE perfbuf_dropped_late_samples_total counter
perfbuf_dropped_late_samples_total{cpu="0"} 0
perfbuf_dropped_late_samples_total{cpu="2"} 1
perfbuf_dropped_late_samples_total{cpu="3"} 0
# HELP perfbuf_late_samples_total Ordered Reader: samples of the CPU delivered (or dropped, with DropLate) after a sample with a larger key.
# TYPE perfbuf_late_samples_total counter
perfbuf_late_samples_total{cpu="0"} 1
perfbuf_late_samples_total{cpu="2"} 3
perfbuf_late_samples_total{cpu="3"} 0
# HELP perfbuf_left_samples_total Samples left unread in the CPU's rings when the reader was closed.
# TYPE perfbuf_left_samples_total counter
perfbuf_left_samples_total{cpu="0"} 0
perfbuf_left_samples_total{cpu="2"} 2
perfbuf_left_samples_total{cpu="3"} 0
# HELP perfbuf_lost_samples_total Samples the kernel dropped because the CPU's ring was full, as reported by the lost records read so far (a count arrives once a later sample fits).
# TYPE perfbuf_lost_samples_total counter
perfbuf_lost_samples_total{cpu="0"} 0
perfbuf_lost_samples_total{cpu="2"} 7
perfbuf_lost_samples_total{cpu="3"} 0
# HELP perfbuf_other_records_total Records of the CPU's rings that were neither samples nor lost records, skipped.
# TYPE perfbuf_other_records_total counter
perfbuf_other_records_total{cpu="0"} 0
perfbuf_other_records_total{cpu="2"} 1
perfbuf_other_records_total{cpu="3"} 0
# HELP perfbuf_output_failures_total Outputs on the CPU that failed before reaching a ring, by cause, as counted by the BPF program's failure map; 0 without one. A perf event array's full ring is a lost sample instead; a ring buffer's is cause full.
# TYPE perfbuf_output_failures_total counter
perfbuf_output_failures_total{cause="e2big",cpu="0"} 0
perfbuf_output_failures_total{cause="e2big",cpu="2"} 0
perfbuf_output_failures_total{cause="e2big",cpu="3"} 2
perfbuf_output_failures_total{cause="einval",cpu="0"} 2
perfbuf_output_failures_total{cause="einval",cpu="2"} 0
perfbuf_output_failures_total{cause="einval",cpu="3"} 0
perfbuf_output_failures_total{cause="enoent",cpu="0"} 0
perfbuf_output_failures_total{cause="enoent",cpu="2"} 0
perfbuf_output_failures_total{cause="enoent",cpu="3"} 5
perfbuf_output_failures_total{cause="eopnotsupp",cpu="0"} 0
perfbuf_output_failures_total{cause="eopnotsupp",cpu="2"} 6
perfbuf_output_failures_total{cause="eopnotsupp",cpu="3"} 0
perfbuf_output_failures_total{cause="full",cpu="0"} 0
perfbuf_output_failures_total{cause="full",cpu="2"} 0
perfbuf_output_failures_total{cause="full",cpu="3"} 4
perfbuf_output_failures_total{cause="other",cpu="0"} 0
perfbuf_output_failures_total{cause="other",cpu="2"} 1
perfbuf_output_failures_total{cause="other",cpu="3"} 0
# HELP perfbuf_ring_fill_bytes Bytes waiting in the CPU's rings at the scrape (0 once the reader is closed).
# TYPE perfbuf_ring_fill_bytes gauge
perfbuf_ring_fill_bytes{cpu="0"} 128
perfbuf_ring_fill_bytes{cpu="2"} 256
perfbuf_ring_fill_bytes{cpu="3"} 0
# HELP perfbuf_ring_fill_max_bytes The most bytes the reader found waiting in one of the CPU's rings since it was opened.
# TYPE perfbuf_ring_fill_max_bytes gauge
perfbuf_ring_fill_max_bytes{cpu="0"} 512
perfbuf_ring_fill_max_bytes{cpu="2"} 4096
perfbuf_ring_fill_max_bytes{cpu="3"} 0
# HELP perfbuf_sample_bytes_total Payload bytes of the samples counted in samples_total, as the kernel padded them (to 8-byte records).
# TYPE perfbuf_sample_bytes_total counter
perfbuf_sample_bytes_total{cpu="0"} 448
perfbuf_sample_bytes_total{cpu="2"} 960
perfbuf_sample_bytes_total{cpu="3"} 0
# HELP perfbuf_samples_total Samples delivered from the CPU's perf rings (with DropLate, late samples dropped too).
# TYPE perfbuf_samples_total counter
perfbuf_samples_total{cpu="0"} 7
perfbuf_samples_total{cpu="2"} 15
perfbuf_samples_total{cpu="3"} 0
`

// The exposition of fakeStats, exactly: entries summed by CPU (MaxFill the
// largest), the failures by cause, one Stats call per collection.
func TestCollect(t *testing.T) {
	src := &fakeSource{stats: fakeStats()}
	c := NewCollector(src, Options{})
	if err := testutil.CollectAndCompare(c, strings.NewReader(wantText)); err != nil {
		t.Error(err)
	}
	if n := src.calls.Load(); n != 1 {
		t.Errorf("one collection called Stats %d times, want 1", n)
	}
	if n, want := testutil.CollectAndCount(c), 3*(12+len(causes)); n != want {
		t.Errorf("%d metrics collected, want %d (3 CPUs)", n, want)
	}
}

// A ring buffer's Stats: its one ring (CPU -1), then each CPU's failures
// in entries of their own (Ring -1), full ones among them.
func TestCollectRingBuffer(t *testing.T) {
	src := &fakeSource{stats: []perfbuf.Stats{
		{Ring: 0, CPU: -1, Samples: 9, Discarded: 2},
		{Ring: -1, CPU: 0, Failed: perfbuf.Failures{Full: 3}},
		{Ring: -1, CPU: 1, Failed: perfbuf.Failures{Full: 1, NoEntry: 2}},
	}}
	const want = `
# HELP perfbuf_output_failures_total Outputs on the CPU that failed before reaching a ring, by cause, as counted by the BPF program's failure map; 0 without one. A perf event array's full ring is a lost sample instead; a ring buffer's is cause full.
# TYPE perfbuf_output_failures_total counter
perfbuf_output_failures_total{cause="e2big",cpu="-1"} 0
perfbuf_output_failures_total{cause="e2big",cpu="0"} 0
perfbuf_output_failures_total{cause="e2big",cpu="1"} 0
perfbuf_output_failures_total{cause="einval",cpu="-1"} 0
perfbuf_output_failures_total{cause="einval",cpu="0"} 0
perfbuf_output_failures_total{cause="einval",cpu="1"} 0
perfbuf_output_failures_total{cause="enoent",cpu="-1"} 0
perfbuf_output_failures_total{cause="enoent",cpu="0"} 0
perfbuf_output_failures_total{cause="enoent",cpu="1"} 2
perfbuf_output_failures_total{cause="eopnotsupp",cpu="-1"} 0
perfbuf_output_failures_total{cause="eopnotsupp",cpu="0"} 0
perfbuf_output_failures_total{cause="eopnotsupp",cpu="1"} 0
perfbuf_output_failures_total{cause="full",cpu="-1"} 0
perfbuf_output_failures_total{cause="full",cpu="0"} 3
perfbuf_output_failures_total{cause="full",cpu="1"} 1
perfbuf_output_failures_total{cause="other",cpu="-1"} 0
perfbuf_output_failures_total{cause="other",cpu="0"} 0
perfbuf_output_failures_total{cause="other",cpu="1"} 0
# HELP perfbuf_discarded_records_total Ring buffers: records of the CPU's rings that the BPF program discarded (bpf_ringbuf_discard), skipped.
# TYPE perfbuf_discarded_records_total counter
perfbuf_discarded_records_total{cpu="-1"} 2
perfbuf_discarded_records_total{cpu="0"} 0
perfbuf_discarded_records_total{cpu="1"} 0
`
	if err := testutil.CollectAndCompare(NewCollector(src, Options{}), strings.NewReader(want),
		"perfbuf_output_failures_total", "perfbuf_discarded_records_total"); err != nil {
		t.Error(err)
	}
}

// The names, types, units and help texts pass the Prometheus linter.
func TestLint(t *testing.T) {
	problems, err := testutil.CollectAndLint(NewCollector(&fakeSource{stats: fakeStats()}, Options{}))
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("%s: %s", p.Metric, p.Text)
	}
}

// Two readers in one registry, told apart by a const label, under a
// namespace; the same labels twice are refused.
func TestOptions(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	opts := func(m string) Options {
		return Options{Namespace: "agent", ConstLabels: prometheus.Labels{"map": m}}
	}
	events := &fakeSource{stats: []perfbuf.Stats{{CPU: 0, Samples: 4}}}
	other := &fakeSource{stats: []perfbuf.Stats{{CPU: 0, Samples: 9}, {CPU: 1, Samples: 1}}}
	if err := reg.Register(NewCollector(events, opts("events"))); err != nil {
		t.Fatal(err)
	}
	if err := reg.Register(NewCollector(other, opts("other"))); err != nil {
		t.Fatal(err)
	}
	if err := reg.Register(NewCollector(other, opts("other"))); err == nil {
		t.Error("a second collector with the same name and labels registered")
	}
	const want = `
# HELP agent_perfbuf_samples_total Samples delivered from the CPU's perf rings (with DropLate, late samples dropped too).
# TYPE agent_perfbuf_samples_total counter
agent_perfbuf_samples_total{cpu="0",map="events"} 4
agent_perfbuf_samples_total{cpu="0",map="other"} 9
agent_perfbuf_samples_total{cpu="1",map="other"} 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "agent_perfbuf_samples_total"); err != nil {
		t.Error(err)
	}
}

// A const label that clashes with a variable one is refused at Register;
// a collection through no registry reports the metrics it makes invalid,
// without a panic.
func TestBadConstLabel(t *testing.T) {
	for name, wantInvalid := range map[string]int{"cpu": 3 * (12 + len(causes)), "cause": 3 * len(causes)} {
		c := NewCollector(&fakeSource{stats: fakeStats()}, Options{ConstLabels: prometheus.Labels{name: "x"}})
		if err := prometheus.NewRegistry().Register(c); err == nil {
			t.Errorf("const label %q: Register succeeded", name)
		}
		ch := make(chan prometheus.Metric, 1000)
		c.Collect(ch)
		close(ch)
		invalid := 0
		for m := range ch {
			if m.Write(new(dto.Metric)) != nil {
				invalid++
			}
		}
		if invalid != wantInvalid {
			t.Errorf("const label %q: %d invalid metrics collected, want %d", name, invalid, wantInvalid)
		}
	}
}

// No rings (a Source with no entries): no metrics, no error.
func TestCollectEmpty(t *testing.T) {
	if n := testutil.CollectAndCount(NewCollector(&fakeSource{}, Options{})); n != 0 {
		t.Errorf("%d metrics from no Stats", n)
	}
}

// add covers every field of perfbuf.Stats: a field added to Stats and not
// to add fails here rather than vanishing from the metrics.
func TestAddCoversEveryField(t *testing.T) {
	var a, b perfbuf.Stats
	fill(reflect.ValueOf(&a).Elem(), 3)
	fill(reflect.ValueOf(&b).Elem(), 5)
	add(&a, &b)
	check(t, "", reflect.ValueOf(a))
}

// fill sets every integer field of v, nested structs included, to n.
func fill(v reflect.Value, n int64) {
	for i := range v.NumField() {
		switch f := v.Field(i); f.Kind() {
		case reflect.Struct:
			fill(f, n)
		case reflect.Int:
			f.SetInt(n)
		case reflect.Uint64:
			f.SetUint(uint64(n))
		default:
			panic("perfbuf.Stats has a field of kind " + f.Kind().String() + ": teach add and this test")
		}
	}
}

// check wants every field of v, the sum of 3 and 5, but CPU and Ring (a's)
// and MaxFill (the larger).
func check(t *testing.T, prefix string, v reflect.Value) {
	for i := range v.NumField() {
		name := prefix + v.Type().Field(i).Name
		want := int64(8)
		switch name {
		case "CPU", "Ring":
			want = 3
		case "MaxFill":
			want = 5
		}
		switch f := v.Field(i); f.Kind() {
		case reflect.Struct:
			check(t, name+".", f)
		case reflect.Int:
			if f.Int() != want {
				t.Errorf("%s: %d, want %d", name, f.Int(), want)
			}
		default:
			if f.Uint() != uint64(want) {
				t.Errorf("%s: %d, want %d", name, f.Uint(), want)
			}
		}
	}
}
