// SPDX-License-Identifier: Apache-2.0

package prom

import (
	"reflect"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/perfbuf/perfbuf"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"
)

// Every owner is a Source.
var (
	_ Source = (*perfbuf.PerfBuffer)(nil)
	_ Source = (*perfbuf.Reader)(nil)
	_ Source = (*perfbuf.Raw)(nil)
	_ Source = (*perfbuf.Recorder)(nil)
)

// fakeSource returns stats, and counts the calls; fakeReader adds the
// rings' sizes to them.
type fakeSource struct {
	stats perfbuf.Stats
	calls atomic.Int32
}

func (f *fakeSource) Stats() perfbuf.Stats {
	f.calls.Add(1)
	return f.stats
}

// fakeReader is a fakeSource whose rings have sizes, as a reader's.
type fakeReader struct {
	fakeSource
	sizes []int
}

// Stats returns the stats with ring i's Size sizes[i], as a reader's.
func (f *fakeReader) Stats() perfbuf.Stats {
	st := f.fakeSource.Stats()
	st.Rings = slices.Clone(st.Rings)
	for i := range st.Rings {
		if i < len(f.sizes) {
			st.Rings[i].Size = f.sizes[i]
		}
	}
	return st
}

// sums returns the Stats of an owner with the rings' entries rings and
// the counts of no ring rest (failures of CPUs without a ring of their
// own, as Failed and, for ring buffers, Lost; NotRun; Wakeups): the sums
// of both, with Rings.
func sums(rest perfbuf.Stats, rings ...perfbuf.Stats) perfbuf.Stats {
	st := rest
	st.CPU = -1
	for i := range rings {
		add(&st, &rings[i])
	}
	st.Rings = rings
	return st
}

// fakeStats is what a Reader over a perf event array with a FailureMap
// and Options.Programs could report: CPU 2 has two rings (it went offline
// and came back, the failures on its latest ring's entry), CPU 3 has no
// ring but failures, in the sums only.
func fakeStats() perfbuf.Stats {
	return sums(perfbuf.Stats{Failed: perfbuf.Failures{NoEntry: 5, TooBig: 2}, NotRun: 3, Wakeups: 42},
		perfbuf.Stats{CPU: 2, Samples: 10, Bytes: 640, Lost: 3, Corrupt: 1,
			Late: 2, Left: 0, MaxFill: 4096, Fill: 0, Waiting: 3 * time.Second},
		perfbuf.Stats{CPU: 0, Samples: 7, Bytes: 448, Late: 1, MaxFill: 512, Fill: 128,
			Failed: perfbuf.Failures{Invalid: 2}},
		perfbuf.Stats{CPU: 2, Samples: 5, Bytes: 320, Lost: 4, Late: 1, Left: 2, MaxFill: 1024, Fill: 256,
			Failed: perfbuf.Failures{NotOnCPU: 6, Other: 1}, Waiting: 250 * time.Millisecond},
	)
}

// fakeSizes are the sizes of fakeStats' rings.
var fakeSizes = []int{8192, 8192, 8192}

const wantText = `
# HELP perfbuf_corruptions_total Records or ring heads the kernel never writes, found in the rings; reading went on past each. Per ring of a ring buffer (summed past MaxRingSeries rings); a perf event array's rings summed.
# TYPE perfbuf_corruptions_total counter
perfbuf_corruptions_total{ring=""} 1
# HELP perfbuf_discarded_records_total Ring buffers: records that the BPF program discarded (bpf_ringbuf_discard), skipped. Per ring of a ring buffer (summed past MaxRingSeries rings); a perf event array's rings summed.
# TYPE perfbuf_discarded_records_total counter
perfbuf_discarded_records_total{ring=""} 0
# HELP perfbuf_late_samples_total Ordered Reader: samples delivered after a sample with a larger key. Per ring of a ring buffer (summed past MaxRingSeries rings); a perf event array's rings summed.
# TYPE perfbuf_late_samples_total counter
perfbuf_late_samples_total{ring=""} 4
# HELP perfbuf_left_samples_total Samples left unread in the rings when the reader was closed; a Recorder's: records its snapshots left out (no room in its buffer, overwritten while it copied them, not yet committed). Per ring of a ring buffer (summed past MaxRingSeries rings); a perf event array's rings summed.
# TYPE perfbuf_left_samples_total counter
perfbuf_left_samples_total{ring=""} 2
# HELP perfbuf_found_records_total Ring buffers: records (samples and discarded) in the ring when the reader opened it; for a pinned ring buffer opened again, what the last reader left, which this one delivers. Per ring of a ring buffer (summed past MaxRingSeries rings); a perf event array's rings summed.
# TYPE perfbuf_found_records_total counter
perfbuf_found_records_total{ring=""} 0
# HELP perfbuf_lost_samples_total Samples a full ring had no room for: a perf ring's as reported by the lost records read so far (a count arrives once a later sample fits), its refused outputs while paused too; a ring buffer's as counted by the BPF program's failure map (0 without one). Ring "none": those of a CPU that no ring tells (several ring buffers that CPUs share). Per ring of a ring buffer (summed past MaxRingSeries rings); a perf event array's rings summed.
# TYPE perfbuf_lost_samples_total counter
perfbuf_lost_samples_total{ring=""} 7
# HELP perfbuf_oldest_record_age_seconds At most how long the oldest record not yet delivered has waited in a ring, at the scrape: the time since the reader or a scrape last saw the ring without a record written before then still undelivered (records carry no time); 0 when none waits. Per ring of a ring buffer (of the rings past MaxRingSeries); of a perf event array's rings.
# TYPE perfbuf_oldest_record_age_seconds gauge
perfbuf_oldest_record_age_seconds{ring=""} 3
# HELP perfbuf_output_failures_total Outputs that failed before reaching a ring, by cause, as counted by the BPF program's failure map; 0 without one. A full ring's are lost samples instead (lost_samples_total). Cause not_run: runs of the reader's Options.Programs that the kernel skipped (a BPF program already running on the CPU), whose outputs were never made. The reader's total.
# TYPE perfbuf_output_failures_total counter
perfbuf_output_failures_total{cause="e2big"} 2
perfbuf_output_failures_total{cause="einval"} 2
perfbuf_output_failures_total{cause="enoent"} 5
perfbuf_output_failures_total{cause="eopnotsupp"} 6
perfbuf_output_failures_total{cause="not_run"} 3
perfbuf_output_failures_total{cause="other"} 1
# HELP perfbuf_ring_fill_max_ratio The most bytes the reader found waiting in a ring since it was opened, over its size: the fullest ring's. Per ring of a ring buffer (of the rings past MaxRingSeries); of a perf event array's rings.
# TYPE perfbuf_ring_fill_max_ratio gauge
perfbuf_ring_fill_max_ratio{ring=""} 0.5
# HELP perfbuf_ring_fill_ratio Bytes waiting in a ring at the scrape, over its size: the fullest ring's (0 once the reader is closed). Per ring of a ring buffer (of the rings past MaxRingSeries); of a perf event array's rings.
# TYPE perfbuf_ring_fill_ratio gauge
perfbuf_ring_fill_ratio{ring=""} 0.03125
# HELP perfbuf_ring_size_bytes Size of a ring's data area: the largest ring's (a perf event array's rings are all one size). Per ring of a ring buffer (of the rings past MaxRingSeries); of a perf event array's rings.
# TYPE perfbuf_ring_size_bytes gauge
perfbuf_ring_size_bytes{ring=""} 8192
# HELP perfbuf_sample_bytes_total Payload bytes of the samples counted in samples_total, as the kernel padded them (to 8-byte records). Per ring of a ring buffer (summed past MaxRingSeries rings); a perf event array's rings summed.
# TYPE perfbuf_sample_bytes_total counter
perfbuf_sample_bytes_total{ring=""} 1408
# HELP perfbuf_samples_total Samples delivered. Per ring of a ring buffer (summed past MaxRingSeries rings); a perf event array's rings summed.
# TYPE perfbuf_samples_total counter
perfbuf_samples_total{ring=""} 22
# HELP perfbuf_wakeups_total Blocked reads, Polls and Waits of the reader that a ring's wakeup ended (not a timeout, Close, Flush or a deadline); 0 for a Recorder.
# TYPE perfbuf_wakeups_total counter
perfbuf_wakeups_total 42
`

// The exposition of fakeStats by default, exactly: the rings summed into
// one series (ring=""), the fullest ring's fill over its size (CPU 2's
// first ring: 4096 of 8192 at most, its second 256 now), the failures and
// runs not run the sums', by cause, one call of Stats per collection.
func TestCollect(t *testing.T) {
	src := &fakeReader{fakeSource: fakeSource{stats: fakeStats()}, sizes: fakeSizes}
	c := NewCollector(src, Options{})
	if err := testutil.CollectAndCompare(c, strings.NewReader(wantText)); err != nil {
		t.Error(err)
	}
	if n := src.calls.Load(); n != 1 {
		t.Errorf("one collection called Stats %d times, want 1", n)
	}
}

// With PerCPU, fakeStats by CPU: CPU 2's two rings summed (the fill of
// its fullest ring); CPU 3, with no ring, has its failures in the sums
// only, which no ring tells: cpu="".
func TestCollectPerCPU(t *testing.T) {
	src := &fakeReader{fakeSource: fakeSource{stats: fakeStats()}, sizes: fakeSizes}
	const want = `
# HELP perfbuf_samples_total Samples delivered. Per ring of a ring buffer (summed past MaxRingSeries rings); a perf event array's rings summed by CPU.
# TYPE perfbuf_samples_total counter
perfbuf_samples_total{cpu="0",ring=""} 7
perfbuf_samples_total{cpu="2",ring=""} 15
# HELP perfbuf_lost_samples_total Samples a full ring had no room for: a perf ring's as reported by the lost records read so far (a count arrives once a later sample fits), its refused outputs while paused too; a ring buffer's as counted by the BPF program's failure map (0 without one). Ring "none": those of a CPU that no ring tells (several ring buffers that CPUs share). Per ring of a ring buffer (summed past MaxRingSeries rings); a perf event array's rings summed by CPU.
# TYPE perfbuf_lost_samples_total counter
perfbuf_lost_samples_total{cpu="0",ring=""} 0
perfbuf_lost_samples_total{cpu="2",ring=""} 7
# HELP perfbuf_oldest_record_age_seconds At most how long the oldest record not yet delivered has waited in a ring, at the scrape: the time since the reader or a scrape last saw the ring without a record written before then still undelivered (records carry no time); 0 when none waits. Per ring of a ring buffer (of the rings past MaxRingSeries); of a perf event array's rings by CPU.
# TYPE perfbuf_oldest_record_age_seconds gauge
perfbuf_oldest_record_age_seconds{cpu="0",ring=""} 0
perfbuf_oldest_record_age_seconds{cpu="2",ring=""} 3
# HELP perfbuf_ring_fill_max_ratio The most bytes the reader found waiting in a ring since it was opened, over its size: the fullest ring's. Per ring of a ring buffer (of the rings past MaxRingSeries); of a perf event array's rings by CPU.
# TYPE perfbuf_ring_fill_max_ratio gauge
perfbuf_ring_fill_max_ratio{cpu="0",ring=""} 0.0625
perfbuf_ring_fill_max_ratio{cpu="2",ring=""} 0.5
# HELP perfbuf_ring_fill_ratio Bytes waiting in a ring at the scrape, over its size: the fullest ring's (0 once the reader is closed). Per ring of a ring buffer (of the rings past MaxRingSeries); of a perf event array's rings by CPU.
# TYPE perfbuf_ring_fill_ratio gauge
perfbuf_ring_fill_ratio{cpu="0",ring=""} 0.015625
perfbuf_ring_fill_ratio{cpu="2",ring=""} 0.03125
# HELP perfbuf_output_failures_total Outputs that failed before reaching a ring, by cause, as counted by the BPF program's failure map; 0 without one. A full ring's are lost samples instead (lost_samples_total). Cause not_run: runs of the reader's Options.Programs that the kernel skipped (a BPF program already running on the CPU), whose outputs were never made. Per CPU; cpu="" for a ring buffer's, and for those of a CPU that no ring tells.
# TYPE perfbuf_output_failures_total counter
perfbuf_output_failures_total{cause="e2big",cpu=""} 2
perfbuf_output_failures_total{cause="e2big",cpu="0"} 0
perfbuf_output_failures_total{cause="e2big",cpu="2"} 0
perfbuf_output_failures_total{cause="einval",cpu=""} 0
perfbuf_output_failures_total{cause="einval",cpu="0"} 2
perfbuf_output_failures_total{cause="einval",cpu="2"} 0
perfbuf_output_failures_total{cause="enoent",cpu=""} 5
perfbuf_output_failures_total{cause="enoent",cpu="0"} 0
perfbuf_output_failures_total{cause="enoent",cpu="2"} 0
perfbuf_output_failures_total{cause="eopnotsupp",cpu=""} 0
perfbuf_output_failures_total{cause="eopnotsupp",cpu="0"} 0
perfbuf_output_failures_total{cause="eopnotsupp",cpu="2"} 6
perfbuf_output_failures_total{cause="not_run",cpu=""} 3
perfbuf_output_failures_total{cause="other",cpu=""} 0
perfbuf_output_failures_total{cause="other",cpu="0"} 0
perfbuf_output_failures_total{cause="other",cpu="2"} 1
`
	c := NewCollector(src, Options{PerCPU: true})
	if err := testutil.CollectAndCompare(c, strings.NewReader(want), "perfbuf_samples_total", "perfbuf_lost_samples_total",
		"perfbuf_ring_fill_max_ratio", "perfbuf_ring_fill_ratio", "perfbuf_output_failures_total",
		"perfbuf_oldest_record_age_seconds"); err != nil {
		t.Error(err)
	}
	// 12 series for each of the 2 CPUs with rings, 5 for each of them and
	// for the failures no ring tells, 1 for the programs' runs not run, 1
	// for wakeups.
	if n, want := testutil.CollectAndCount(c), 2*12+3*len(causes)+2; n != want {
		t.Errorf("%d metrics collected, want %d", n, want)
	}
}

// Two ring buffers (an array of them, or Options.Maps): a series per ring,
// each ring's fill over its own size (the rings differ), and the CPUs'
// failures, which are no ring's, exactly: the full rings' as lost samples
// of ring "none", the others by cause, with PerCPU as cpu="".
func TestCollectRingBuffer(t *testing.T) {
	src := &fakeReader{fakeSource: fakeSource{stats: sums(perfbuf.Stats{Lost: 3 + 1, Failed: perfbuf.Failures{NoEntry: 2}},
		perfbuf.Stats{CPU: -1, Samples: 9, Discarded: 2, Fill: 1024, MaxFill: 2048, Waiting: 2 * time.Second},
		perfbuf.Stats{CPU: -1, Samples: 4, Fill: 1024, MaxFill: 1024},
	)}, sizes: []int{4096, 65536}}
	const want = `
# HELP perfbuf_oldest_record_age_seconds At most how long the oldest record not yet delivered has waited in a ring, at the scrape: the time since the reader or a scrape last saw the ring without a record written before then still undelivered (records carry no time); 0 when none waits. Per ring of a ring buffer (of the rings past MaxRingSeries); of a perf event array's rings.
# TYPE perfbuf_oldest_record_age_seconds gauge
perfbuf_oldest_record_age_seconds{ring="0"} 2
perfbuf_oldest_record_age_seconds{ring="1"} 0
# HELP perfbuf_output_failures_total Outputs that failed before reaching a ring, by cause, as counted by the BPF program's failure map; 0 without one. A full ring's are lost samples instead (lost_samples_total). Cause not_run: runs of the reader's Options.Programs that the kernel skipped (a BPF program already running on the CPU), whose outputs were never made. The reader's total.
# TYPE perfbuf_output_failures_total counter
perfbuf_output_failures_total{cause="e2big"} 0
perfbuf_output_failures_total{cause="einval"} 0
perfbuf_output_failures_total{cause="enoent"} 2
perfbuf_output_failures_total{cause="eopnotsupp"} 0
perfbuf_output_failures_total{cause="not_run"} 0
perfbuf_output_failures_total{cause="other"} 0
# HELP perfbuf_discarded_records_total Ring buffers: records that the BPF program discarded (bpf_ringbuf_discard), skipped. Per ring of a ring buffer (summed past MaxRingSeries rings); a perf event array's rings summed.
# TYPE perfbuf_discarded_records_total counter
perfbuf_discarded_records_total{ring="0"} 2
perfbuf_discarded_records_total{ring="1"} 0
# HELP perfbuf_lost_samples_total Samples a full ring had no room for: a perf ring's as reported by the lost records read so far (a count arrives once a later sample fits), its refused outputs while paused too; a ring buffer's as counted by the BPF program's failure map (0 without one). Ring "none": those of a CPU that no ring tells (several ring buffers that CPUs share). Per ring of a ring buffer (summed past MaxRingSeries rings); a perf event array's rings summed.
# TYPE perfbuf_lost_samples_total counter
perfbuf_lost_samples_total{ring="0"} 0
perfbuf_lost_samples_total{ring="1"} 0
perfbuf_lost_samples_total{ring="none"} 4
# HELP perfbuf_samples_total Samples delivered. Per ring of a ring buffer (summed past MaxRingSeries rings); a perf event array's rings summed.
# TYPE perfbuf_samples_total counter
perfbuf_samples_total{ring="0"} 9
perfbuf_samples_total{ring="1"} 4
# HELP perfbuf_ring_fill_ratio Bytes waiting in a ring at the scrape, over its size: the fullest ring's (0 once the reader is closed). Per ring of a ring buffer (of the rings past MaxRingSeries); of a perf event array's rings.
# TYPE perfbuf_ring_fill_ratio gauge
perfbuf_ring_fill_ratio{ring="0"} 0.25
perfbuf_ring_fill_ratio{ring="1"} 0.015625
# HELP perfbuf_ring_size_bytes Size of a ring's data area: the largest ring's (a perf event array's rings are all one size). Per ring of a ring buffer (of the rings past MaxRingSeries); of a perf event array's rings.
# TYPE perfbuf_ring_size_bytes gauge
perfbuf_ring_size_bytes{ring="0"} 4096
perfbuf_ring_size_bytes{ring="1"} 65536
`
	if err := testutil.CollectAndCompare(NewCollector(src, Options{}), strings.NewReader(want),
		"perfbuf_output_failures_total", "perfbuf_discarded_records_total", "perfbuf_lost_samples_total", "perfbuf_samples_total",
		"perfbuf_ring_fill_ratio", "perfbuf_ring_size_bytes", "perfbuf_oldest_record_age_seconds"); err != nil {
		t.Error(err)
	}
	const wantPerCPU = `
# HELP perfbuf_output_failures_total Outputs that failed before reaching a ring, by cause, as counted by the BPF program's failure map; 0 without one. A full ring's are lost samples instead (lost_samples_total). Cause not_run: runs of the reader's Options.Programs that the kernel skipped (a BPF program already running on the CPU), whose outputs were never made. Per CPU; cpu="" for a ring buffer's, and for those of a CPU that no ring tells.
# TYPE perfbuf_output_failures_total counter
perfbuf_output_failures_total{cause="e2big",cpu=""} 0
perfbuf_output_failures_total{cause="einval",cpu=""} 0
perfbuf_output_failures_total{cause="enoent",cpu=""} 2
perfbuf_output_failures_total{cause="eopnotsupp",cpu=""} 0
perfbuf_output_failures_total{cause="not_run",cpu=""} 0
perfbuf_output_failures_total{cause="other",cpu=""} 0
# HELP perfbuf_lost_samples_total Samples a full ring had no room for: a perf ring's as reported by the lost records read so far (a count arrives once a later sample fits), its refused outputs while paused too; a ring buffer's as counted by the BPF program's failure map (0 without one). Ring "none": those of a CPU that no ring tells (several ring buffers that CPUs share). Per ring of a ring buffer (summed past MaxRingSeries rings); a perf event array's rings summed by CPU.
# TYPE perfbuf_lost_samples_total counter
perfbuf_lost_samples_total{cpu="",ring="0"} 0
perfbuf_lost_samples_total{cpu="",ring="1"} 0
perfbuf_lost_samples_total{cpu="",ring="none"} 4
# HELP perfbuf_samples_total Samples delivered. Per ring of a ring buffer (summed past MaxRingSeries rings); a perf event array's rings summed by CPU.
# TYPE perfbuf_samples_total counter
perfbuf_samples_total{cpu="",ring="0"} 9
perfbuf_samples_total{cpu="",ring="1"} 4
`
	if err := testutil.CollectAndCompare(NewCollector(src, Options{PerCPU: true}), strings.NewReader(wantPerCPU),
		"perfbuf_output_failures_total", "perfbuf_lost_samples_total", "perfbuf_samples_total"); err != nil {
		t.Error(err)
	}
}

// More ring buffers than MaxRingSeries (a ring per CPU on a big host):
// their counts summed into one series (ring=""), as a perf event array's
// rings are, the fill the fullest ring's over its own size, the size the
// largest, the age the oldest ring's, Found summed; what the sums hold
// beyond the rings (lost samples of no ring) still apart, in ring "none".
func TestCollectRingBufferSummed(t *testing.T) {
	src := &fakeReader{fakeSource: fakeSource{stats: sums(perfbuf.Stats{Lost: 3},
		perfbuf.Stats{CPU: -1, Samples: 9, Discarded: 2, Found: 3, Fill: 1024, MaxFill: 2048, Waiting: 2 * time.Second},
		perfbuf.Stats{CPU: -1, Samples: 4, Found: 5, Fill: 1024, MaxFill: 1024},
		perfbuf.Stats{CPU: -1, Samples: 1, Left: 6, Fill: 0, MaxFill: 4096},
	)}, sizes: []int{4096, 65536, 8192}}
	const help = " Per ring of a ring buffer (summed past MaxRingSeries rings); a perf event array's rings summed."
	const fullest = " Per ring of a ring buffer (of the rings past MaxRingSeries); of a perf event array's rings."
	want := `
# HELP perfbuf_samples_total Samples delivered.` + help + `
# TYPE perfbuf_samples_total counter
perfbuf_samples_total{ring=""} 14
# HELP perfbuf_found_records_total Ring buffers: records (samples and discarded) in the ring when the reader opened it; for a pinned ring buffer opened again, what the last reader left, which this one delivers.` + help + `
# TYPE perfbuf_found_records_total counter
perfbuf_found_records_total{ring=""} 8
# HELP perfbuf_left_samples_total Samples left unread in the rings when the reader was closed; a Recorder's: records its snapshots left out (no room in its buffer, overwritten while it copied them, not yet committed).` + help + `
# TYPE perfbuf_left_samples_total counter
perfbuf_left_samples_total{ring=""} 6
# HELP perfbuf_lost_samples_total Samples a full ring had no room for: a perf ring's as reported by the lost records read so far (a count arrives once a later sample fits), its refused outputs while paused too; a ring buffer's as counted by the BPF program's failure map (0 without one). Ring "none": those of a CPU that no ring tells (several ring buffers that CPUs share).` + help + `
# TYPE perfbuf_lost_samples_total counter
perfbuf_lost_samples_total{ring=""} 0
perfbuf_lost_samples_total{ring="none"} 3
# HELP perfbuf_ring_fill_ratio Bytes waiting in a ring at the scrape, over its size: the fullest ring's (0 once the reader is closed).` + fullest + `
# TYPE perfbuf_ring_fill_ratio gauge
perfbuf_ring_fill_ratio{ring=""} 0.25
# HELP perfbuf_ring_fill_max_ratio The most bytes the reader found waiting in a ring since it was opened, over its size: the fullest ring's.` + fullest + `
# TYPE perfbuf_ring_fill_max_ratio gauge
perfbuf_ring_fill_max_ratio{ring=""} 0.5
# HELP perfbuf_ring_size_bytes Size of a ring's data area: the largest ring's (a perf event array's rings are all one size).` + fullest + `
# TYPE perfbuf_ring_size_bytes gauge
perfbuf_ring_size_bytes{ring=""} 65536
`
	names := []string{"perfbuf_samples_total", "perfbuf_found_records_total", "perfbuf_left_samples_total",
		"perfbuf_lost_samples_total", "perfbuf_ring_fill_ratio", "perfbuf_ring_fill_max_ratio", "perfbuf_ring_size_bytes"}
	if err := testutil.CollectAndCompare(NewCollector(src, Options{MaxRingSeries: 2}), strings.NewReader(want), names...); err != nil {
		t.Error(err)
	}
	// At the limit, a series per ring.
	if n, want := testutil.CollectAndCount(NewCollector(src, Options{MaxRingSeries: 3}), "perfbuf_samples_total"), 3; n != want {
		t.Errorf("MaxRingSeries 3 over 3 rings: %d series of samples, want %d", n, want)
	}
}

// A Recorder's snapshots' counts are exported as a reader's: what they
// left out in left_samples_total, a perf event array's rings summed, a
// ring buffer's per ring; no series of their own (the old
// snapshot_skipped_records_total and overwritten_bytes_total are gone).
func TestCollectRecorder(t *testing.T) {
	rec := &fakeSource{stats: sums(perfbuf.Stats{},
		perfbuf.Stats{CPU: 0, Samples: 5, Left: 2},
		perfbuf.Stats{CPU: 1, Samples: 7, Left: 1},
	)}
	const help = "Samples left unread in the rings when the reader was closed; a Recorder's: records its snapshots left out (no room in its buffer, overwritten while it copied them, not yet committed). Per ring of a ring buffer (summed past MaxRingSeries rings); a perf event array's rings summed."
	const want = `
# HELP perfbuf_left_samples_total ` + help + `
# TYPE perfbuf_left_samples_total counter
perfbuf_left_samples_total{ring=""} 3
# HELP perfbuf_wakeups_total Blocked reads, Polls and Waits of the reader that a ring's wakeup ended (not a timeout, Close, Flush or a deadline); 0 for a Recorder.
# TYPE perfbuf_wakeups_total counter
perfbuf_wakeups_total 0
`
	names := []string{"perfbuf_left_samples_total", "perfbuf_wakeups_total",
		"perfbuf_overwritten_bytes_total", "perfbuf_snapshot_skipped_records_total"}
	if err := testutil.CollectAndCompare(NewCollector(rec, Options{}), strings.NewReader(want), names...); err != nil {
		t.Error(err)
	}
	rec.stats = sums(perfbuf.Stats{}, perfbuf.Stats{CPU: -1, Samples: 5, Left: 4})
	const wantRingBuf = `
# HELP perfbuf_left_samples_total ` + help + `
# TYPE perfbuf_left_samples_total counter
perfbuf_left_samples_total{ring="0"} 4
`
	if err := testutil.CollectAndCompare(NewCollector(rec, Options{}), strings.NewReader(wantRingBuf), names[0]); err != nil {
		t.Error(err)
	}
}

// The names, types, units and help texts pass the Prometheus linter.
func TestLint(t *testing.T) {
	for _, perCPU := range []bool{false, true} {
		src := &fakeReader{fakeSource: fakeSource{stats: fakeStats()}, sizes: fakeSizes}
		problems, err := testutil.CollectAndLint(NewCollector(src, Options{PerCPU: perCPU}))
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range problems {
			t.Errorf("PerCPU %v: %s: %s", perCPU, p.Metric, p.Text)
		}
	}
}

// Two readers in one registry, a perf event array's and two ring
// buffers', told apart by a const label, under a namespace; the same
// labels twice are refused, and so is a collector with PerCPU beside
// collectors without.
func TestOptions(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	opts := func(m string) Options {
		return Options{Namespace: "agent", ConstLabels: prometheus.Labels{"map": m}}
	}
	events := &fakeSource{stats: sums(perfbuf.Stats{}, perfbuf.Stats{CPU: 0, Samples: 4}, perfbuf.Stats{CPU: 1, Samples: 3})}
	other := &fakeSource{stats: sums(perfbuf.Stats{}, perfbuf.Stats{CPU: -1, Samples: 9}, perfbuf.Stats{CPU: -1, Samples: 1})}
	if err := reg.Register(NewCollector(events, opts("events"))); err != nil {
		t.Fatal(err)
	}
	if err := reg.Register(NewCollector(other, opts("other"))); err != nil {
		t.Fatal(err)
	}
	if err := reg.Register(NewCollector(other, opts("other"))); err == nil {
		t.Error("a second collector with the same name and labels registered")
	}
	perCPU := opts("third")
	perCPU.PerCPU = true
	if err := reg.Register(NewCollector(other, perCPU)); err == nil {
		t.Error("a collector with PerCPU registered beside collectors without")
	}
	const want = `
# HELP agent_perfbuf_samples_total Samples delivered. Per ring of a ring buffer (summed past MaxRingSeries rings); a perf event array's rings summed.
# TYPE agent_perfbuf_samples_total counter
agent_perfbuf_samples_total{map="events",ring=""} 7
agent_perfbuf_samples_total{map="other",ring="0"} 9
agent_perfbuf_samples_total{map="other",ring="1"} 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "agent_perfbuf_samples_total"); err != nil {
		t.Error(err)
	}
}

// A const label that clashes with a variable one is refused at Register;
// a collection through no registry reports the metrics it makes invalid,
// without a panic. (fakeSources Stats have no Size: 9 ring metrics a
// series, 8 counters and the age.)
func TestBadConstLabel(t *testing.T) {
	for _, tc := range []struct {
		label       string
		perCPU      bool
		wantInvalid int
	}{
		{"ring", false, 9},                // one series of the rings
		{"cause", false, len(causes) + 1}, // the reader's failures, and not_run
		// CPUs 0 and 2 with rings, 0, 2 and the failures no ring tells
		// (CPU 3's) with failures, and the programs' runs not run, of no
		// CPU.
		{"cpu", true, 2*9 + 3*len(causes) + 1},
	} {
		c := NewCollector(&fakeSource{stats: fakeStats()}, Options{ConstLabels: prometheus.Labels{tc.label: "x"}, PerCPU: tc.perCPU})
		if err := prometheus.NewRegistry().Register(c); err == nil {
			t.Errorf("const label %q: Register succeeded", tc.label)
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
		if invalid != tc.wantInvalid {
			t.Errorf("const label %q: %d invalid metrics collected, want %d", tc.label, invalid, tc.wantInvalid)
		}
	}
}

// No rings (a Source with no entries in Rings): no metrics, no error.
func TestCollectEmpty(t *testing.T) {
	if n := testutil.CollectAndCount(NewCollector(&fakeSource{}, Options{})); n != 0 {
		t.Errorf("%d metrics from no Stats, want 0", n)
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

// fill sets every integer field of v, nested structs included, to n, and
// every slice (Rings) to n zero entries.
func fill(v reflect.Value, n int64) {
	for i := range v.NumField() {
		switch f := v.Field(i); f.Kind() {
		case reflect.Struct:
			fill(f, n)
		case reflect.Slice:
			f.Set(reflect.MakeSlice(f.Type(), int(n), int(n)))
		case reflect.Int, reflect.Int64:
			f.SetInt(n)
		case reflect.Uint64:
			f.SetUint(uint64(n))
		default:
			panic("perfbuf.Stats has a field of kind " + f.Kind().String() + ": teach add and this test")
		}
	}
}

// check wants every field of v, the sum of 3 and 5, but CPU, MaxFill, Fill
// and Size (a's: a group's fill is its fullest ring's over that ring's
// size, not a sum), Waiting (the larger: a group's oldest), and Rings
// (a's: a group has no entries of its own).
func check(t *testing.T, prefix string, v reflect.Value) {
	for i := range v.NumField() {
		name := prefix + v.Type().Field(i).Name
		want := int64(8)
		switch name {
		case "CPU", "MaxFill", "Fill", "Size", "Rings":
			want = 3
		case "Waiting":
			want = 5
		}
		switch f := v.Field(i); f.Kind() {
		case reflect.Struct:
			check(t, name+".", f)
		case reflect.Int, reflect.Int64:
			if f.Int() != want {
				t.Errorf("%s: %d, want %d", name, f.Int(), want)
			}
		case reflect.Slice:
			if int64(f.Len()) != want {
				t.Errorf("%s: %d entries, want %d", name, f.Len(), want)
			}
		default:
			if f.Uint() != uint64(want) {
				t.Errorf("%s: %d, want %d", name, f.Uint(), want)
			}
		}
	}
}
