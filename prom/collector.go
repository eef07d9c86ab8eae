// SPDX-License-Identifier: Apache-2.0

// Package prom exports the per-CPU counts of a perfbuf reader as Prometheus
// metrics: NewCollector returns a prometheus.Collector over anything with
// a Stats method, a *perfbuf.PerfBuffer or a *perfbuf.Reader.
//
// It is a package of its own so that perfbuf itself does not depend on the
// Prometheus client.
//
// Every metric has a cpu label. Stats may hold several entries for one CPU
// (a ring opened when the CPU came back online, an entry for the BPF-side
// failures of a CPU without a ring); the collector adds them up by CPU,
// except perfbuf_ring_fill_max_bytes, the largest of them. The counters
// count from the reader's opening; they never go down while it lives.
package prom

import (
	"cmp"
	"slices"
	"strconv"

	"github.com/perfbuf/perfbuf"
	"github.com/prometheus/client_golang/prometheus"
)

// Source is what a Collector reads: *perfbuf.PerfBuffer and *perfbuf.Reader
// satisfy it. Stats must be safe to call from any goroutine (a registry
// collects concurrently with the reader's work, and scrapes may overlap),
// also after the reader is closed, as theirs are.
type Source interface {
	Stats() []perfbuf.Stats
}

// Options configures NewCollector. The zero value is fine for one reader
// per registry.
type Options struct {
	// Namespace, if set, prefixes every metric name: "agent" turns
	// perfbuf_samples_total into agent_perfbuf_samples_total.
	Namespace string

	// ConstLabels are added to every metric, to tell the readers of one
	// process apart (map="events"): two collectors in one registry need
	// different ones. Naming one cpu or cause, or an invalid name, makes
	// registering the collector fail.
	ConstLabels prometheus.Labels
}

// NewCollector returns a collector of src's Stats. Each collection calls
// src.Stats once, so the metrics of one scrape are one snapshot. An invalid
// Namespace or ConstLabels is reported by the registry's Register, as for
// the collectors of the Prometheus client.
func NewCollector(src Source, opts Options) prometheus.Collector {
	c := &collector{src: src}
	desc := func(name, help string, labels ...string) *prometheus.Desc {
		return prometheus.NewDesc(prometheus.BuildFQName(opts.Namespace, "perfbuf", name), help,
			append([]string{"cpu"}, labels...), opts.ConstLabels)
	}
	counter := func(name, help string, v func(*perfbuf.Stats) uint64) {
		c.metrics = append(c.metrics, metric{desc(name, help), prometheus.CounterValue,
			func(s *perfbuf.Stats) float64 { return float64(v(s)) }})
	}
	gauge := func(name, help string, v func(*perfbuf.Stats) int) {
		c.metrics = append(c.metrics, metric{desc(name, help), prometheus.GaugeValue,
			func(s *perfbuf.Stats) float64 { return float64(v(s)) }})
	}
	// The help texts say what each field of perfbuf.Stats counts.
	counter("samples_total",
		"Samples delivered from the CPU's perf rings (with DropLate, late samples dropped too).",
		func(s *perfbuf.Stats) uint64 { return s.Samples })
	counter("sample_bytes_total",
		"Payload bytes of the samples counted in samples_total, as the kernel padded them (to 8-byte records).",
		func(s *perfbuf.Stats) uint64 { return s.Bytes })
	counter("lost_samples_total",
		"Samples the kernel dropped because the CPU's ring was full, as reported by the lost records read so far (a count arrives once a later sample fits).",
		func(s *perfbuf.Stats) uint64 { return s.Lost })
	counter("other_records_total",
		"Records of the CPU's rings that were neither samples nor lost records, skipped.",
		func(s *perfbuf.Stats) uint64 { return s.Other })
	counter("corruptions_total",
		"Records or ring heads the kernel never writes, found in the CPU's rings; reading went on past each.",
		func(s *perfbuf.Stats) uint64 { return s.Corrupt })
	counter("corrupt_skipped_bytes_total",
		"Bytes of the CPU's rings skipped, unread, to get past corruptions.",
		func(s *perfbuf.Stats) uint64 { return s.CorruptBytes })
	counter("late_samples_total",
		"Ordered Reader: samples of the CPU delivered (or dropped, with DropLate) after a sample with a larger key.",
		func(s *perfbuf.Stats) uint64 { return s.Late })
	counter("dropped_late_samples_total",
		"Ordered Reader with DropLate: late samples of the CPU dropped, not delivered (also in samples_total and late_samples_total).",
		func(s *perfbuf.Stats) uint64 { return s.Dropped })
	counter("discarded_records_total",
		"Ring buffers: records of the CPU's rings that the BPF program discarded (bpf_ringbuf_discard), skipped.",
		func(s *perfbuf.Stats) uint64 { return s.Discarded })
	counter("left_samples_total",
		"Samples left unread in the CPU's rings when the reader was closed.",
		func(s *perfbuf.Stats) uint64 { return s.Left })
	gauge("ring_fill_bytes",
		"Bytes waiting in the CPU's rings at the scrape (0 once the reader is closed).",
		func(s *perfbuf.Stats) int { return s.Fill })
	gauge("ring_fill_max_bytes",
		"The most bytes the reader found waiting in one of the CPU's rings since it was opened.",
		func(s *perfbuf.Stats) int { return s.MaxFill })
	c.failures = desc("output_failures_total",
		"Outputs on the CPU that failed before reaching a ring, by cause, as counted by the BPF program's failure map; 0 without one. A perf event array's full ring is a lost sample instead; a ring buffer's is cause full.",
		"cause")
	return c
}

type collector struct {
	src      Source
	metrics  []metric // one value per CPU each
	failures *prometheus.Desc
}

// metric is one of the collector's metrics but output_failures_total, whose
// value per CPU is v's of the CPU's merged Stats.
type metric struct {
	desc *prometheus.Desc
	typ  prometheus.ValueType
	v    func(*perfbuf.Stats) float64
}

// causes are output_failures_total's cause label values, with the count of
// each: the errnos of perfbuf.Failures, and full (a ring buffer without
// room).
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

func (c *collector) Describe(ch chan<- *prometheus.Desc) {
	for _, m := range c.metrics {
		ch <- m.desc
	}
	ch <- c.failures
}

func (c *collector) Collect(ch chan<- prometheus.Metric) {
	for _, s := range byCPU(c.src.Stats()) {
		cpu := strconv.Itoa(s.CPU)
		for _, m := range c.metrics {
			send(ch, m.desc, m.typ, m.v(&s), cpu)
		}
		for _, cause := range causes {
			send(ch, c.failures, prometheus.CounterValue, float64(cause.count(&s.Failed)), cpu, cause.name)
		}
	}
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

// byCPU merges the entries of stats that have the same CPU, in CPU order:
// counts and Fill added up (the CPU's rings hold that much between them),
// MaxFill the largest (the rings' peaks need not have been at one time).
func byCPU(stats []perfbuf.Stats) []perfbuf.Stats {
	out := slices.Clone(stats)
	slices.SortStableFunc(out, func(a, b perfbuf.Stats) int { return cmp.Compare(a.CPU, b.CPU) })
	n := 0
	for _, s := range out {
		if n > 0 && out[n-1].CPU == s.CPU {
			add(&out[n-1], &s)
			continue
		}
		out[n] = s
		n++
	}
	return out[:n]
}

// add adds b's counts to a's.
func add(a, b *perfbuf.Stats) {
	a.Samples += b.Samples
	a.Bytes += b.Bytes
	a.Lost += b.Lost
	a.Other += b.Other
	a.Corrupt += b.Corrupt
	a.CorruptBytes += b.CorruptBytes
	a.Late += b.Late
	a.Dropped += b.Dropped
	a.Left += b.Left
	a.Discarded += b.Discarded
	a.MaxFill = max(a.MaxFill, b.MaxFill)
	a.Fill += b.Fill
	a.Failed.NoEntry += b.Failed.NoEntry
	a.Failed.TooBig += b.Failed.TooBig
	a.Failed.Invalid += b.Failed.Invalid
	a.Failed.NotOnCPU += b.Failed.NotOnCPU
	a.Failed.Other += b.Failed.Other
	a.Failed.Full += b.Failed.Full
}
