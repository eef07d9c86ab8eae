// SPDX-License-Identifier: Apache-2.0

// Package prom exports the counts of a perfbuf reader as Prometheus
// metrics: NewCollector returns a prometheus.Collector over anything with
// a Stats method: a *perfbuf.Reader, *perfbuf.PerfBuffer, *perfbuf.Raw or
// *perfbuf.Recorder.
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
// What is counted but is no ring's (the samples lost by full ring buffers
// of CPUs without a ring of their own) has series labelled ring="none",
// once there is some. Options.PerCPU labels a perf event array's counts
// and every reader's failures by CPU too. The collector's ConstLabels name
// the reader (map="events"). The counters count from the reader's opening;
// they never go down while it lives.
//
// Fill levels are ratios of a ring's size, never bytes summed over rings:
// perfbuf_ring_fill_ratio is the fullest ring's of a series' rings, with
// perfbuf_ring_size_bytes beside it. The age (perfbuf_oldest_record_age_seconds)
// is a series' oldest ring's. Without labels: the reader's wakeups
// (perfbuf_wakeups_total).
package prom

import (
	"cmp"
	"maps"
	"slices"
	"strconv"

	"github.com/perfbuf/perfbuf"
	"github.com/prometheus/client_golang/prometheus"
)

// Source is what a Collector reads: *perfbuf.Reader, *perfbuf.PerfBuffer,
// *perfbuf.Raw and *perfbuf.Recorder satisfy it. Stats must be safe to
// call from any goroutine (a registry collects concurrently with the
// reader's work, and scrapes may overlap), also after the reader is
// closed, as theirs are. It returns the sums and, in Rings, each ring's
// counts (perfbuf.Stats); a Source with no rings exports nothing. The fill
// ratios and ring sizes are exported for the rings whose Size is known.
type Source interface {
	Stats() perfbuf.Stats
}

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
	// reader's output failures too, about 17 series a CPU where the
	// default exports about 19 a reader (and 12 a ring of a ring buffer).
	// A ring buffer's counts stay per ring, with cpu="" (a ring is no
	// CPU's), and so do the failures that are no ring's CPU's. Collectors
	// in one registry must agree on PerCPU: the registry refuses a metric
	// name with two label sets.
	PerCPU bool

	// MaxRingSeries is the most ring buffers a reader may have for their
	// counts to be per ring (label ring); a reader with more has them
	// summed (ring=""), as a perf event array's rings are: an array of
	// 256 ring buffers, a ring per CPU, would otherwise export 12 series
	// a ring, 3,072 in all. 0 means 16; negative, no limit. The count of
	// a reader's rings is fixed at NewReader (a ring buffer is no CPU's),
	// so its series do not change while it lives.
	MaxRingSeries int
}

// defaultMaxRingSeries is MaxRingSeries' 0.
const defaultMaxRingSeries = 16

// NewCollector returns a collector of src's Stats. Each collection calls
// src.Stats once, so the metrics of one scrape are one snapshot. An
// invalid Namespace or ConstLabels is reported by the registry's Register,
// as for the collectors of the Prometheus client.
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
			" Per ring of a ring buffer (of the rings past MaxRingSeries); of a perf event array's rings by CPU.",
			" Per CPU; cpu=\"\" for a ring buffer's, and for those of a CPU that no ring tells."
	}
	counter("samples_total",
		"Samples delivered."+rings,
		func(s *perfbuf.Stats) uint64 { return s.Samples })
	counter("sample_bytes_total",
		"Payload bytes of the samples counted in samples_total, as the kernel padded them (to 8-byte records)."+rings,
		func(s *perfbuf.Stats) uint64 { return s.Bytes })
	counter("lost_samples_total",
		"Samples a full ring had no room for: a perf ring's as reported by the lost records read so far (a count arrives once a later sample fits), its refused outputs while paused too; a ring buffer's as counted by the BPF program's failure map (0 without one). Ring \"none\": those of a CPU that no ring tells (several ring buffers that CPUs share)."+rings,
		func(s *perfbuf.Stats) uint64 { return s.Lost })
	counter("corruptions_total",
		"Records or ring heads the kernel never writes, found in the rings; reading went on past each."+rings,
		func(s *perfbuf.Stats) uint64 { return s.Corrupt })
	counter("late_samples_total",
		"Ordered Reader: samples delivered after a sample with a larger key."+rings,
		func(s *perfbuf.Stats) uint64 { return s.Late })
	counter("discarded_records_total",
		"Ring buffers: records that the BPF program discarded (bpf_ringbuf_discard), skipped."+rings,
		func(s *perfbuf.Stats) uint64 { return s.Discarded })
	counter("left_samples_total",
		"Samples left unread in the rings when the reader was closed; a Recorder's: records its snapshots left out (no room in its buffer, overwritten while it copied them, not yet committed)."+rings,
		func(s *perfbuf.Stats) uint64 { return s.Left })
	counter("found_records_total",
		"Ring buffers: records (samples and discarded) in the ring when the reader opened it; for a pinned ring buffer opened again, what the last reader left, which this one delivers."+rings,
		func(s *perfbuf.Stats) uint64 { return s.Found })
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
	c.wakeups = desc("wakeups_total",
		"Blocked reads, Polls and Waits of the reader that a ring's wakeup ended (not a timeout, Close, Flush or a deadline); 0 for a Recorder.",
		nil)
	c.failures = desc("output_failures_total",
		"Outputs that failed before reaching a ring, by cause, as counted by the BPF program's failure map; 0 without one. A full ring's are lost samples instead (lost_samples_total). Cause not_run: runs of the reader's Options.Programs that the kernel skipped (a BPF program already running on the CPU), whose outputs were never made."+failed,
		failLabels)
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
	wakeups  *prometheus.Desc
	failures *prometheus.Desc
}

// counter is one of the collector's counters of a ring's Stats.
type counter struct {
	desc *prometheus.Desc
	v    func(*perfbuf.Stats) uint64
}

// causes are output_failures_total's cause label values, with the count of
// each: the errnos of perfbuf.Failures. One more, not_run, counts Stats'
// NotRun (a run of Options.Programs that the kernel skipped).
var causes = []struct {
	name  string
	count func(*perfbuf.Failures) uint64
}{
	{"enoent", func(f *perfbuf.Failures) uint64 { return f.NoEntry }},
	{"e2big", func(f *perfbuf.Failures) uint64 { return f.TooBig }},
	{"einval", func(f *perfbuf.Failures) uint64 { return f.Invalid }},
	{"eopnotsupp", func(f *perfbuf.Failures) uint64 { return f.NotOnCPU }},
	{"other", func(f *perfbuf.Failures) uint64 { return f.Other }},
}

// notRun is the cause of the programs' runs not run (Stats' NotRun): one
// series, with PerCPU cpu="", as they are no CPU's.
const notRun = "not_run"

// noRing is the ring label of the counts that are no ring's: the sums'
// beyond the rings' (Stats' doc).
const noRing = "none"

func (c *collector) Describe(ch chan<- *prometheus.Desc) {
	for _, m := range c.counters {
		ch <- m.desc
	}
	ch <- c.fill
	ch <- c.maxFill
	ch <- c.size
	ch <- c.waiting
	ch <- c.wakeups
	ch <- c.failures
}

func (c *collector) Collect(ch chan<- prometheus.Metric) {
	st := c.src.Stats()
	if len(st.Rings) == 0 {
		return
	}
	var rings perfbuf.Stats // the rings' counts summed
	for _, g := range c.groups(st.Rings) {
		add(&rings, &g.sum)
		labels := c.ringLabels(g.cpu, g.ring)
		for _, m := range c.counters {
			send(ch, m.desc, prometheus.CounterValue, float64(m.v(&g.sum)), labels...)
		}
		if g.size > 0 {
			send(ch, c.fill, prometheus.GaugeValue, g.fill, labels...)
			send(ch, c.maxFill, prometheus.GaugeValue, g.maxFill, labels...)
			send(ch, c.size, prometheus.GaugeValue, float64(g.size), labels...)
		}
		send(ch, c.waiting, prometheus.GaugeValue, g.sum.Waiting.Seconds(), labels...)
	}
	// The sums' counts beyond the rings', each once it has some.
	for _, m := range c.counters {
		if sum, ofRings := m.v(&st), m.v(&rings); sum > ofRings {
			send(ch, m.desc, prometheus.CounterValue, float64(sum-ofRings), c.ringLabels("", noRing)...)
		}
	}
	for _, f := range c.failed(&st) {
		for _, cause := range causes {
			v := float64(cause.count(&f.failed))
			if c.perCPU {
				send(ch, c.failures, prometheus.CounterValue, v, cause.name, f.cpu)
			} else {
				send(ch, c.failures, prometheus.CounterValue, v, cause.name)
			}
		}
	}
	if c.perCPU {
		send(ch, c.failures, prometheus.CounterValue, float64(st.NotRun), notRun, "")
	} else {
		send(ch, c.failures, prometheus.CounterValue, float64(st.NotRun), notRun)
	}
	send(ch, c.wakeups, prometheus.CounterValue, float64(st.Wakeups))
}

// ringLabels are the values of the ring counts' labels: ring, and with
// PerCPU cpu first.
func (c *collector) ringLabels(cpu, ring string) []string {
	if c.perCPU {
		return []string{cpu, ring}
	}
	return []string{ring}
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

// groups sums the rings' entries (Stats.Rings, ring i at index i) into
// the series' groups, in label order.
func (c *collector) groups(rings []perfbuf.Stats) []group {
	byKey := map[[2]string]*group{}
	ringBufs := 0
	for i := range rings {
		if rings[i].CPU < 0 {
			ringBufs++
		}
	}
	perRing := c.maxRings < 0 || ringBufs <= c.maxRings
	for i := range rings {
		s := &rings[i]
		var key [2]string // ring, cpu
		switch {
		case s.CPU < 0: // a ring buffer's ring
			if perRing {
				key[0] = strconv.Itoa(i)
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

// failed returns st's failures: the sums' total, or with PerCPU by CPU, in
// CPU order: each CPU with a ring (its rings' entries summed), then, with
// cpu="", the rest (the sums' beyond those): a ring buffer's, whose entry
// is no CPU's, and those of a CPU without a ring of its own, which only the
// sums hold. The rest has series once it has failures, and always when no
// ring is a CPU's (ring buffers).
func (c *collector) failed(st *perfbuf.Stats) []cpuFailures {
	if !c.perCPU {
		return []cpuFailures{{failed: st.Failed}}
	}
	byCPU := map[int]*perfbuf.Failures{}
	var ofCPUs perfbuf.Failures
	for i := range st.Rings {
		s := &st.Rings[i]
		if s.CPU < 0 {
			continue
		}
		f := byCPU[s.CPU]
		if f == nil {
			f = new(perfbuf.Failures)
			byCPU[s.CPU] = f
		}
		addFailures(f, &s.Failed)
		addFailures(&ofCPUs, &s.Failed)
	}
	var out []cpuFailures
	for _, cpu := range slices.Sorted(maps.Keys(byCPU)) {
		out = append(out, cpuFailures{strconv.Itoa(cpu), *byCPU[cpu]})
	}
	if rest := subFailures(st.Failed, ofCPUs); rest.Total() > 0 || len(byCPU) == 0 {
		out = append(out, cpuFailures{"", rest})
	}
	return out
}

// add adds b's counts to a's, but MaxFill, Fill and Size, which are of one
// ring (see group), the age, of which a keeps the oldest, and Rings, which
// a group has none of.
func add(a, b *perfbuf.Stats) {
	a.Waiting = max(a.Waiting, b.Waiting)
	a.Samples += b.Samples
	a.Bytes += b.Bytes
	a.Lost += b.Lost
	a.Corrupt += b.Corrupt
	a.Late += b.Late
	a.Left += b.Left
	a.Found += b.Found
	a.Discarded += b.Discarded
	a.NotRun += b.NotRun
	a.Wakeups += b.Wakeups
	addFailures(&a.Failed, &b.Failed)
}

// addFailures adds b's counts to a's.
func addFailures(a, b *perfbuf.Failures) {
	a.NoEntry += b.NoEntry
	a.TooBig += b.TooBig
	a.Invalid += b.Invalid
	a.NotOnCPU += b.NotOnCPU
	a.Other += b.Other
}

// subFailures returns a's counts less b's, cause by cause, 0 where b's is
// larger (b is a part of a).
func subFailures(a, b perfbuf.Failures) perfbuf.Failures {
	sub := func(x, y uint64) uint64 { return x - min(x, y) }
	return perfbuf.Failures{NoEntry: sub(a.NoEntry, b.NoEntry), TooBig: sub(a.TooBig, b.TooBig),
		Invalid: sub(a.Invalid, b.Invalid), NotOnCPU: sub(a.NotOnCPU, b.NotOnCPU), Other: sub(a.Other, b.Other)}
}
