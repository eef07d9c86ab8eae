// SPDX-License-Identifier: Apache-2.0

// Package prom exports the counts of a perfbuf reader as Prometheus
// metrics: NewCollector returns a prometheus.Collector over anything with
// a Stats method: a *perfbuf.Reader, *perfbuf.PerfBuffer, *perfbuf.Raw or
// *perfbuf.Recorder (whose snapshots' counts it adds).
//
// It is a package of its own so that perfbuf itself does not depend on the
// Prometheus client.
//
// By default the series are few whatever the CPU count: a perf event
// array's rings are summed into the reader's totals (ring="", which
// Prometheus reads as no label), a ring buffer's counts are per ring
// (label ring, the ring's buffer index) for a reader of at most
// Options.MaxRingSeries ring buffers (16 by default) and summed as a perf
// event array's are for more (an array of ring buffers, a ring per CPU on
// a big host), and the output failures are the reader's totals by cause.
// Options.PerCPU labels
// a perf event array's counts and every reader's failures by CPU too. The
// collector's ConstLabels name the reader (map="events"). The counters
// count from the reader's opening; they never go down while it lives.
//
// Fill levels are ratios of a ring's size, never bytes summed over rings:
// perfbuf_ring_fill_ratio is the fullest ring's of a series' rings, with
// perfbuf_ring_size_bytes beside it. The ages (perfbuf_oldest_record_age_seconds,
// perfbuf_held_record_age_seconds) are a series' oldest ring's. Without
// labels: the reader's wakeups (perfbuf_wakeups_total), and two gauges that
// say whether CPUs that come online are read (perfbuf_cpu_hotplug_followed)
// and whether Close can count what is left exactly (perfbuf_close_exact).
package prom

import (
	"cmp"
	"maps"
	"slices"
	"strconv"

	"github.com/perfbuf/perfbuf"
	"github.com/prometheus/client_golang/prometheus"
)

// Source is what a Collector reads: *perfbuf.Reader, *perfbuf.PerfBuffer
// and *perfbuf.Raw satisfy it. Stats must be safe to call from any goroutine (a registry
// collects concurrently with the reader's work, and scrapes may overlap),
// also after the reader is closed, as theirs are.
//
// A Source may also have the methods FollowsCPUs() bool
// (perfbuf_cpu_hotplug_followed) and Wakeups() uint64
// (perfbuf_wakeups_total), as the readers do. A Source with a Snapshot
// method, as *perfbuf.Recorder's, has its snapshots' counts exported too
// (perfbuf_snapshot_skipped_records_total, perfbuf_overwritten_bytes_total). The fill ratios and ring
// sizes are exported for the entries whose Stats.Size is known.
type Source interface {
	Stats() []perfbuf.Stats
}

// cpuFollower and waker are the optional methods of a Source.
type (
	cpuFollower interface{ FollowsCPUs() bool }
	waker       interface{ Wakeups() uint64 }
	recorder    interface {
		Snapshot(buf []byte, dst []perfbuf.Record, onlyNew bool) ([]perfbuf.Record, error)
	}
)

// Options configures NewCollector. The zero value is fine for one reader
// per registry.
type Options struct {
	// Namespace, if set, prefixes every metric name: "agent" turns
	// perfbuf_samples_total into agent_perfbuf_samples_total.
	Namespace string

	// ConstLabels are added to every metric, to tell the readers of one
	// process apart (map="events"): two collectors in one registry need
	// different ones. Naming a variable label (ring, cause, and cpu with
	// PerCPU), or an invalid name, makes registering the collector fail.
	ConstLabels prometheus.Labels

	// PerCPU adds a cpu label: a perf event array's counts are then per
	// CPU (a CPU's rings summed, its fullest ring's fill), and every
	// reader's output failures too, about 22 series a CPU where the
	// default exports about 25 a reader (and 16 a ring of a ring buffer).
	// A ring buffer's counts stay per ring, with cpu="" (a ring is no
	// CPU's). Collectors in one registry must agree on PerCPU: the
	// registry refuses a metric name with two label sets.
	PerCPU bool

	// MaxRingSeries is the most ring buffers a reader may have for their
	// counts to be per ring (label ring); a reader with more has them
	// summed (ring=""), as a perf event array's rings are: an array of
	// 256 ring buffers, a ring per CPU, would otherwise export 16 series
	// a ring, 4,096 in all. 0 means 16; negative, no limit. The count of
	// a reader's rings is fixed at NewReader (a ring buffer is no CPU's),
	// so its series do not change while it lives.
	MaxRingSeries int
}

// defaultMaxRingSeries is MaxRingSeries' 0.
const defaultMaxRingSeries = 16

// NewCollector returns a collector of src's Stats. Each collection calls
// src.Stats once (and FollowsCPUs and Wakeups once, if src has them), so
// the metrics of one scrape are one snapshot. An invalid Namespace or
// ConstLabels is reported by the registry's Register, as for the
// collectors of the Prometheus client.
func NewCollector(src Source, opts Options) prometheus.Collector {
	c := &collector{src: src, perCPU: opts.PerCPU, maxRings: opts.MaxRingSeries}
	if c.maxRings == 0 {
		c.maxRings = defaultMaxRingSeries
	}
	ringLabels, failLabels := []string{"ring"}, []string{"cause"}
	if opts.PerCPU {
		ringLabels, failLabels = []string{"cpu", "ring"}, []string{"cause", "cpu"}
	}
	desc := func(name, help string, labels []string) *prometheus.Desc {
		return prometheus.NewDesc(prometheus.BuildFQName(opts.Namespace, "perfbuf", name), help,
			labels, opts.ConstLabels)
	}
	counter := func(name, help string, v func(*perfbuf.Stats) uint64) {
		c.counters = append(c.counters, counter{desc(name, help, ringLabels), v})
	}
	// The help texts say what each field of perfbuf.Stats counts, and
	// what the labels tell apart.
	rings, fullest, failed := " Per ring of a ring buffer (summed past MaxRingSeries rings); a perf event array's rings summed.",
		" Per ring of a ring buffer (of the rings past MaxRingSeries); of a perf event array's rings.", " The reader's total."
	if opts.PerCPU {
		rings, fullest, failed = " Per ring of a ring buffer (summed past MaxRingSeries rings); a perf event array's rings summed by CPU.",
			" Per ring of a ring buffer (of the rings past MaxRingSeries); of a perf event array's rings by CPU.", " Per CPU."
	}
	counter("samples_total",
		"Samples delivered (not those dropped_late_samples_total counts)."+rings,
		func(s *perfbuf.Stats) uint64 { return s.Samples })
	counter("sample_bytes_total",
		"Payload bytes of the samples counted in samples_total and dropped_late_samples_total, as the kernel padded them (to 8-byte records)."+rings,
		func(s *perfbuf.Stats) uint64 { return s.Bytes })
	counter("lost_samples_total",
		"Perf event arrays: samples the kernel dropped because a ring was full, as reported by the lost records read so far (a count arrives once a later sample fits)."+rings,
		func(s *perfbuf.Stats) uint64 { return s.Lost })
	counter("other_records_total",
		"Records that were neither samples nor lost records, skipped."+rings,
		func(s *perfbuf.Stats) uint64 { return s.Other })
	counter("corruptions_total",
		"Records or ring heads the kernel never writes, found in the rings; reading went on past each."+rings,
		func(s *perfbuf.Stats) uint64 { return s.Corrupt })
	counter("corrupt_skipped_bytes_total",
		"Bytes of the rings skipped, unread, to get past corruptions."+rings,
		func(s *perfbuf.Stats) uint64 { return s.CorruptBytes })
	counter("late_samples_total",
		"Ordered Reader: samples delivered (or dropped, with DropLate) after a sample with a larger key."+rings,
		func(s *perfbuf.Stats) uint64 { return s.Late })
	counter("dropped_late_samples_total",
		"Ordered Reader with DropLate: late samples dropped, not delivered (also in late_samples_total)."+rings,
		func(s *perfbuf.Stats) uint64 { return s.Dropped })
	counter("discarded_records_total",
		"Ring buffers: records that the BPF program discarded (bpf_ringbuf_discard), skipped."+rings,
		func(s *perfbuf.Stats) uint64 { return s.Discarded })
	counter("left_samples_total",
		"Samples left unread in the rings when the reader was closed."+rings,
		func(s *perfbuf.Stats) uint64 { return s.Left })
	counter("found_records_total",
		"Ring buffers: records (samples and discarded) in the ring when the reader opened it; for a pinned ring buffer opened again, what the last reader left, which this one delivers."+rings,
		func(s *perfbuf.Stats) uint64 { return s.Found })
	if _, ok := src.(recorder); ok {
		counter("snapshot_skipped_records_total",
			"Recorder: records a snapshot left out (no room in its buffer, overwritten while it copied them, not yet committed)."+rings,
			func(s *perfbuf.Stats) uint64 { return s.Skipped })
		counter("overwritten_bytes_total",
			"Recorder: bytes of a ring buffer in overwrite mode that the kernel overwrote unread, headers included; 0 for perf rings, which do not tell."+rings,
			func(s *perfbuf.Stats) uint64 { return s.Overwritten })
	}
	c.fill = desc("ring_fill_ratio",
		"Bytes waiting in a ring at the scrape, over its size: the fullest ring's (0 once the reader is closed)."+fullest,
		ringLabels)
	c.maxFill = desc("ring_fill_max_ratio",
		"The most bytes the reader found waiting in a ring since it was opened, over its size: the fullest ring's."+fullest,
		ringLabels)
	c.size = desc("ring_size_bytes",
		"Size of a ring's data area: the largest ring's (a perf event array's rings are all one size)."+fullest,
		ringLabels)
	c.waiting = desc("oldest_record_age_seconds",
		"At most how long the oldest record not yet delivered has waited in a ring, at the scrape: the time since the reader or a scrape last saw the ring without a record written before then still undelivered (records carry no time); 0 when none waits."+fullest,
		ringLabels)
	c.held = desc("held_record_age_seconds",
		"Ordered Reader: how long the reader has held back the record it holds from a ring, since it first saw it, as of its last commit; 0 when it holds none."+fullest,
		ringLabels)
	c.wakeups = desc("wakeups_total",
		"Blocked waits of the reader that a ring's wakeup ended (not a timeout, Close, Flush or a deadline).",
		nil)
	c.failures = desc("output_failures_total",
		"Outputs that failed before reaching a ring, by cause, as counted by the BPF program's failure map; 0 without one. A perf event array's full ring is a lost sample instead; a ring buffer's is cause full. Cause not_run: runs of the reader's Options.Programs that the kernel skipped (a BPF program already running on the CPU), whose outputs were never made."+failed,
		failLabels)
	c.followed = desc("cpu_hotplug_followed",
		"1 if samples of CPUs that come online after the reader opened are read (always for ring buffers; for a perf event array, if the CPU uevent socket opened), else 0.",
		nil)
	c.exact = desc("close_exact",
		"1 if the counts add up exactly at Close on this kernel: it grants the RCU grace period Close waits for before it counts what is left, and counts a perf ring's refused outputs (6.0); a ring buffer's also need a failure map and outputs through bpf/perfbuf.bpf.h. 0 before 6.0, or with nohz_full and no CAP_BPF.",
		nil)
	return c
}

type collector struct {
	src      Source
	perCPU   bool
	maxRings int // MaxRingSeries, negative for no limit
	counters []counter
	fill     *prometheus.Desc
	maxFill  *prometheus.Desc
	size     *prometheus.Desc
	waiting  *prometheus.Desc
	held     *prometheus.Desc
	wakeups  *prometheus.Desc
	failures *prometheus.Desc
	followed *prometheus.Desc
	exact    *prometheus.Desc // the host's, perfbuf.CloseExact
}

// counter is one of the collector's counters of a ring's Stats.
type counter struct {
	desc *prometheus.Desc
	v    func(*perfbuf.Stats) uint64
}

// causes are output_failures_total's cause label values, with the count of
// each: the errnos of perfbuf.Failures, and full (a ring buffer without
// room). One more, not_run, counts Stats' NotRun (a run of
// Options.Programs that the kernel skipped).
var causes = []struct {
	name  string
	count func(*perfbuf.Failures) uint64
}{
	{"enoent", func(f *perfbuf.Failures) uint64 { return f.NoEntry }},
	{"e2big", func(f *perfbuf.Failures) uint64 { return f.TooBig }},
	{"einval", func(f *perfbuf.Failures) uint64 { return f.Invalid }},
	{"eopnotsupp", func(f *perfbuf.Failures) uint64 { return f.NotOnCPU }},
	{"other", func(f *perfbuf.Failures) uint64 { return f.Other }},
	{"full", func(f *perfbuf.Failures) uint64 { return f.Full }},
}

// notRun is the cause of the programs' runs not run (Stats' NotRun): one
// series, with PerCPU cpu="", as they are no CPU's.
const notRun = "not_run"

func (c *collector) Describe(ch chan<- *prometheus.Desc) {
	for _, m := range c.counters {
		ch <- m.desc
	}
	ch <- c.fill
	ch <- c.maxFill
	ch <- c.size
	ch <- c.waiting
	ch <- c.held
	ch <- c.wakeups
	ch <- c.failures
	ch <- c.followed
	ch <- c.exact
}

func (c *collector) Collect(ch chan<- prometheus.Metric) {
	stats := c.src.Stats()
	for _, g := range c.groups(stats) {
		labels := []string{g.ring}
		if c.perCPU {
			labels = []string{g.cpu, g.ring}
		}
		for _, m := range c.counters {
			send(ch, m.desc, prometheus.CounterValue, float64(m.v(&g.sum)), labels...)
		}
		if g.size > 0 {
			send(ch, c.fill, prometheus.GaugeValue, g.fill, labels...)
			send(ch, c.maxFill, prometheus.GaugeValue, g.maxFill, labels...)
			send(ch, c.size, prometheus.GaugeValue, float64(g.size), labels...)
		}
		send(ch, c.waiting, prometheus.GaugeValue, g.sum.Waiting.Seconds(), labels...)
		send(ch, c.held, prometheus.GaugeValue, g.sum.Held.Seconds(), labels...)
	}
	for _, f := range c.failed(stats) {
		for _, cause := range causes {
			v := float64(cause.count(&f.failed))
			if c.perCPU {
				send(ch, c.failures, prometheus.CounterValue, v, cause.name, f.cpu)
			} else {
				send(ch, c.failures, prometheus.CounterValue, v, cause.name)
			}
		}
	}
	if len(stats) > 0 {
		var n uint64
		for i := range stats {
			n += stats[i].NotRun
		}
		if c.perCPU {
			send(ch, c.failures, prometheus.CounterValue, float64(n), notRun, "")
		} else {
			send(ch, c.failures, prometheus.CounterValue, float64(n), notRun)
		}
	}
	if w, ok := c.src.(waker); ok {
		send(ch, c.wakeups, prometheus.CounterValue, float64(w.Wakeups()))
	}
	if cf, ok := c.src.(cpuFollower); ok {
		send(ch, c.followed, prometheus.GaugeValue, gauge(cf.FollowsCPUs()))
	}
	send(ch, c.exact, prometheus.GaugeValue, gauge(perfbuf.CloseExact()))
}

// gauge is 1 for true, 0 for false.
func gauge(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// send sends one value, or the error that makes it invalid (a bad Desc,
// which Register would have refused).
func send(ch chan<- prometheus.Metric, desc *prometheus.Desc, typ prometheus.ValueType, v float64, labels ...string) {
	m, err := prometheus.NewConstMetric(desc, typ, v, labels...)
	if err != nil {
		m = prometheus.NewInvalidMetric(desc, err)
	}
	ch <- m
}

// group is the rings of one series: a ring buffer's ring, or a perf event
// array's rings (all of them, or one CPU's with PerCPU).
type group struct {
	ring, cpu string // label values: "" where the group has none
	sum       perfbuf.Stats
	// fill and maxFill are the fullest ring's Fill and MaxFill over its
	// size, of the rings with a known size; size is the largest of those
	// sizes, 0 if none is known.
	fill, maxFill float64
	size          int
}

// groups sums the rings' entries of stats (Ring >= 0) into the series'
// groups, in label order.
func (c *collector) groups(stats []perfbuf.Stats) []group {
	byKey := map[[2]string]*group{}
	ringBufs := 0
	for i := range stats {
		if stats[i].Ring >= 0 && stats[i].CPU < 0 {
			ringBufs++
		}
	}
	perRing := c.maxRings < 0 || ringBufs <= c.maxRings
	for i := range stats {
		s := &stats[i]
		if s.Ring < 0 {
			continue // a CPU's failures without a ring: see failed
		}
		var key [2]string // ring, cpu
		switch {
		case s.CPU < 0: // a ring buffer's ring
			if perRing {
				key[0] = strconv.Itoa(s.Ring)
			}
		case c.perCPU:
			key[1] = strconv.Itoa(s.CPU)
		}
		g := byKey[key]
		if g == nil {
			g = &group{ring: key[0], cpu: key[1]}
			byKey[key] = g
		}
		add(&g.sum, s)
		if size := s.Size; size > 0 {
			g.fill = max(g.fill, float64(s.Fill)/float64(size))
			g.maxFill = max(g.maxFill, float64(s.MaxFill)/float64(size))
			g.size = max(g.size, size)
		}
	}
	keys := slices.SortedFunc(maps.Keys(byKey), func(a, b [2]string) int {
		return cmp.Or(cmpLabel(a[0], b[0]), cmpLabel(a[1], b[1]))
	})
	out := make([]group, len(keys))
	for i, k := range keys {
		out[i] = *byKey[k]
	}
	return out
}

// cmpLabel orders label values that are numbers or "" numerically, ""
// first.
func cmpLabel(a, b string) int {
	return cmp.Or(cmp.Compare(len(a), len(b)), cmp.Compare(a, b))
}

// cpuFailures is the output failures of a series: one CPU's, or the
// reader's (cpu "").
type cpuFailures struct {
	cpu    string
	failed perfbuf.Failures
}

// failed sums the Failed of every entry of stats: into one total, or with
// PerCPU by CPU, in CPU order. An entry of no CPU (CPU -1) has a series,
// cpu="", only once it holds failures: a ring buffer read alone holds
// every CPU's (Stats' doc); several ring buffers' and the programs' entry
// (NotRun, sent apart) hold none.
func (c *collector) failed(stats []perfbuf.Stats) []cpuFailures {
	if len(stats) == 0 {
		return nil
	}
	if !c.perCPU {
		var f perfbuf.Failures
		for i := range stats {
			addFailures(&f, &stats[i].Failed)
		}
		return []cpuFailures{{failed: f}}
	}
	byCPU := map[int]*perfbuf.Failures{}
	for i := range stats {
		s := &stats[i]
		if s.CPU < 0 && s.Failed.Total() == 0 {
			continue
		}
		f := byCPU[s.CPU]
		if f == nil {
			f = new(perfbuf.Failures)
			byCPU[s.CPU] = f
		}
		addFailures(f, &s.Failed)
	}
	var out []cpuFailures
	for _, cpu := range slices.Sorted(maps.Keys(byCPU)) {
		label := "" // no CPU's
		if cpu >= 0 {
			label = strconv.Itoa(cpu)
		}
		out = append(out, cpuFailures{label, *byCPU[cpu]})
	}
	return out
}

// add adds b's counts to a's, but MaxFill and Fill, which are of one ring
// (see group), the ages, of which a keeps the oldest, and DeletesSlot,
// which holds for the group if it holds for a ring.
func add(a, b *perfbuf.Stats) {
	a.DeletesSlot = a.DeletesSlot || b.DeletesSlot
	a.Waiting = max(a.Waiting, b.Waiting)
	a.Held = max(a.Held, b.Held)
	a.Samples += b.Samples
	a.Bytes += b.Bytes
	a.Lost += b.Lost
	a.Other += b.Other
	a.Corrupt += b.Corrupt
	a.CorruptBytes += b.CorruptBytes
	a.Late += b.Late
	a.Dropped += b.Dropped
	a.Left += b.Left
	a.Found += b.Found
	a.Discarded += b.Discarded
	a.Skipped += b.Skipped
	a.Overwritten += b.Overwritten
	a.NotRun += b.NotRun
	addFailures(&a.Failed, &b.Failed)
}

// addFailures adds b's counts to a's.
func addFailures(a, b *perfbuf.Failures) { *a = a.Add(*b) }
