// SPDX-License-Identifier: Apache-2.0

package main

import (
	"math"
	"slices"
	"time"

	"github.com/perfbuf/perfbuf/bench/internal/benchrun"
)

// series is one measurement's values over the rounds.
type series []float64

// median of the values (the mean of the middle two for an even count).
func (s series) median() float64 {
	if len(s) == 0 {
		return 0
	}
	v := slices.Clone(s)
	slices.Sort(v)
	n := len(v)
	if n%2 == 1 {
		return v[n/2]
	}
	return (v[n/2-1] + v[n/2]) / 2
}

func (s series) min() float64 { return slices.Min(s) }
func (s series) max() float64 { return slices.Max(s) }

// spread is (max-min)/median: how much the rounds disagreed.
func (s series) spread() float64 {
	m := s.median()
	if len(s) == 0 || m == 0 {
		return 0
	}
	return (s.max() - s.min()) / m
}

// drainStat is one drain measurement (a mode at a size) over the rounds.
type drainStat struct {
	mode   string
	size   int
	ns     series // ns per sample
	allocs series // allocations per sample
	xc     series // ns per sample over C's in the same round
}

// sustainedStat is one sustained measurement over the rounds.
type sustainedStat struct {
	mode  string
	batch int    // samples per test run
	rate  series // samples per second
	xc    series // rate over C's in the same round
	wall  series // milliseconds
	lost  []uint64
	late  []uint64
	lostF series  // lost over what the producers tried to output
	check []error // accounting mismatches
}

// quietStat is one quiet measurement (a mode at a rate, 0 for idle) over
// the rounds.
type quietStat struct {
	mode string
	rate int
	// Per wakeup (per sample received), at a rate.
	cpu  series // µs of CPU
	csw  series // context switches, voluntary and involuntary
	vcsw series // voluntary ones
	xc   series // cpu over C's in the same round; empty without C
	prog series // ns of the producing program's own time a sample
	// Samples per poll that delivered any, for a consumer that counts its
	// polls (C, callback); empty for the others.
	perPoll series
	// Per second of the window, at a rate and idle.
	wakeups series // voluntary context switches
	cswSec  series // context switches
	cpuSec  series // ms of CPU
	wall    series // the window, ms
	lost    []uint64
	check   []error // accounting mismatches
}

// results is everything perfbench measured.
type results struct {
	env             env
	rounds          int
	samples         int
	threadClock     bool // the drains' ns are the draining thread's CPU time (-clock thread)
	sustainedPerCPU int
	quietDuration   time.Duration
	quietNoC        string           // why the quiet measurement ran without C, or ""
	drain           []*drainStat     // in the order of benchrun.Sizes, then DrainModes
	sustained       []*sustainedStat // by batch, then SustainedModes
	rbDrain         []*drainStat     // ring buffers: by size, then RBDrainModes
	rbSustained     []*sustainedStat // ring buffers: by batch, then RBSustainedModes
	quiet           []*quietStat     // by rate (idle last), then in allQuietModes' order
	rbQuiet         []*quietStat     // ring buffers: as quiet
	hostDuration    time.Duration
	host            []*hostStat // perf first, then by rate, then in benchrun.HostModes' order
}

// addDrainRound adds one round of drains at size: ns and allocs per sample
// of each of modes, measured side by side, the C references among them.
// Each mode's ratio is to its reference (benchrun.Reference), and the
// reference of the ordered modes' is to C.
func (r *results) addDrainRound(size int, modes []string, ns, allocs []float64) {
	addDrainRound(&r.drain, benchrun.DrainModes, benchrun.Reference, size, modes, ns, allocs)
}

// addRBDrainRound is addDrainRound for the ring buffer drains, each mode
// over C's (ring_buffer__consume).
func (r *results) addRBDrainRound(size int, modes []string, ns, allocs []float64) {
	addDrainRound(&r.rbDrain, benchrun.RBDrainModes, func(string) string { return benchrun.ModeC }, size, modes, ns, allocs)
}

// addDrainRound adds a round to the drains in *list, kept sorted by size,
// then in order's order of modes; ref names each mode's reference.
func addDrainRound(list *[]*drainStat, order []string, ref func(string) string, size int, modes []string, ns, allocs []float64) {
	for i, mode := range modes {
		rf := ref(mode)
		if mode == rf {
			rf = benchrun.ModeC
		}
		addDrain(list, order, mode, size, ns[i], allocs[i], ns[i]/ns[slices.Index(modes, rf)])
	}
}

func addDrain(list *[]*drainStat, order []string, mode string, size int, ns, allocs, xc float64) {
	d := drainIn(*list, mode, size)
	if d == nil {
		d = &drainStat{mode: mode, size: size}
		*list = append(*list, d)
		slices.SortStableFunc(*list, func(a, b *drainStat) int {
			if a.size != b.size {
				return a.size - b.size
			}
			return slices.Index(order, a.mode) - slices.Index(order, b.mode)
		})
	}
	d.ns = append(d.ns, ns)
	d.allocs = append(d.allocs, allocs)
	d.xc = append(d.xc, xc)
}

func (r *results) drainOf(mode string, size int) *drainStat { return drainIn(r.drain, mode, size) }

func drainIn(list []*drainStat, mode string, size int) *drainStat {
	for _, d := range list {
		if d.mode == mode && d.size == size {
			return d
		}
	}
	return nil
}

// addSustainedRound and addRBSustainedRound add one round of saturation
// runs at one batch, C among them.
func (r *results) addSustainedRound(round []benchrun.SustainedResult) {
	addSustainedRound(&r.sustained, benchrun.SustainedModes, round)
}

func (r *results) addRBSustainedRound(round []benchrun.SustainedResult) {
	addSustainedRound(&r.rbSustained, benchrun.RBSustainedModes, round)
}

// addSustainedRound adds round's runs to *list, each with its rate over C's.
func addSustainedRound(list *[]*sustainedStat, order []string, round []benchrun.SustainedResult) {
	var c float64
	for _, res := range round {
		if res.Mode == benchrun.ModeC {
			c = res.Rate()
		}
	}
	for _, res := range round {
		addSustained(list, order, res, res.Rate()/c)
	}
}

// addSustained adds a run to *list, kept sorted by batch, then in order's
// order of modes.
func addSustained(list *[]*sustainedStat, order []string, res benchrun.SustainedResult, xc float64) {
	s := sustainedIn(*list, res.Mode, res.Batch)
	if s == nil {
		s = &sustainedStat{mode: res.Mode, batch: res.Batch}
		*list = append(*list, s)
		slices.SortStableFunc(*list, func(a, b *sustainedStat) int {
			if a.batch != b.batch {
				return a.batch - b.batch
			}
			return slices.Index(order, a.mode) - slices.Index(order, b.mode)
		})
	}
	s.rate = append(s.rate, res.Rate())
	s.xc = append(s.xc, xc)
	s.wall = append(s.wall, float64(res.Wall.Microseconds())/1e3)
	s.lost = append(s.lost, res.Lost)
	s.late = append(s.late, res.Late)
	s.lostF = append(s.lostF, lostFraction(res))
	if err := res.Check(); err != nil {
		s.check = append(s.check, err)
	}
}

// lostFraction is the part of the samples the producers tried to output
// that were lost.
func lostFraction(res benchrun.SustainedResult) float64 {
	if n := res.Emitted + res.Failed; n > 0 {
		return float64(res.Failed) / float64(n)
	}
	return 0
}

func (r *results) sustainedOf(mode string, batch int) *sustainedStat {
	return sustainedIn(r.sustained, mode, batch)
}

func sustainedIn(list []*sustainedStat, mode string, batch int) *sustainedStat {
	for _, s := range list {
		if s.mode == mode && s.batch == batch {
			return s
		}
	}
	return nil
}

// ratio is a drain's time per sample over the C reference's at the same
// size (1.5 means 50% more time per sample): the median over the rounds of
// the ratio within each round.
func (d *drainStat) ratio() float64 { return d.xc.median() }

// rateRatio is a sustained mode's rate over the C reference's (0.95 means
// 5% fewer samples per second): the median over the rounds of the ratio
// within each round.
func (s *sustainedStat) ratio() float64 { return s.xc.median() }

// addQuietRound adds one round of quiet runs at rate, C among them unless
// its program was missing.
func (r *results) addQuietRound(rate int, round []benchrun.QuietResult) {
	addQuietRound(&r.quiet, rate, round)
}

// addRBQuietRound is addQuietRound for the quiet runs over a BPF ring
// buffer (rbquiet).
func (r *results) addRBQuietRound(rate int, round []benchrun.QuietResult) {
	addQuietRound(&r.rbQuiet, rate, round)
}

// addQuietRound adds a round to the quiet runs in *list, kept sorted by
// rate (idle last), then in allQuietModes' order.
func addQuietRound(list *[]*quietStat, rate int, round []benchrun.QuietResult) {
	c := 0.0
	for _, res := range round {
		if res.Mode == benchrun.ModeC {
			c = res.CPUPerWakeup()
		}
	}
	for _, res := range round {
		q := quietIn(*list, res.Mode, rate)
		if q == nil {
			q = &quietStat{mode: res.Mode, rate: rate}
			*list = append(*list, q)
			slices.SortStableFunc(*list, func(a, b *quietStat) int {
				if a.rate != b.rate {
					return rateOrder(a.rate) - rateOrder(b.rate)
				}
				modes := allQuietModes()
				return slices.Index(modes, a.mode) - slices.Index(modes, b.mode)
			})
		}
		if rate > 0 {
			q.cpu = append(q.cpu, res.CPUPerWakeup())
			q.csw = append(q.csw, res.SwitchesPerWakeup())
			q.vcsw = append(q.vcsw, res.VoluntaryPerWakeup())
			q.prog = append(q.prog, res.ProgPerSample())
			if c > 0 {
				q.xc = append(q.xc, res.CPUPerWakeup()/c)
			}
			if res.Polls > 0 {
				q.perPoll = append(q.perPoll, res.SamplesPerPoll())
			}
		}
		q.wakeups = append(q.wakeups, res.WakeupsPerSecond())
		q.cswSec = append(q.cswSec, res.SwitchesPerSecond())
		q.cpuSec = append(q.cpuSec, res.CPUPerSecond())
		q.wall = append(q.wall, float64(res.Window.Wall.Microseconds())/1e3)
		q.lost = append(q.lost, res.Lost)
		if err := res.Check(); err != nil {
			q.check = append(q.check, err)
		}
	}
}

// rateOrder sorts rates up, idle (0) last.
func rateOrder(rate int) int {
	if rate == 0 {
		return math.MaxInt32
	}
	return rate
}

func (r *results) quietOf(mode string, rate int) *quietStat { return quietIn(r.quiet, mode, rate) }

func quietIn(list []*quietStat, mode string, rate int) *quietStat {
	for _, q := range list {
		if q.mode == mode && q.rate == rate {
			return q
		}
	}
	return nil
}

// ratio is a quiet mode's CPU per wakeup over C's (1.2 means 20% more):
// the median over the rounds of the ratio within each round, or NaN
// without C.
func (q *quietStat) ratio() float64 {
	if len(q.xc) == 0 {
		return math.NaN()
	}
	return q.xc.median()
}

func (r *results) accountingErrors() []error {
	var out []error
	for _, s := range r.sustained {
		out = append(out, s.check...)
	}
	for _, s := range r.rbSustained {
		out = append(out, s.check...)
	}
	for _, q := range r.quiet {
		out = append(out, q.check...)
	}
	for _, q := range r.rbQuiet {
		out = append(out, q.check...)
	}
	for _, h := range r.host {
		out = append(out, h.check...)
	}
	return out
}

// lossyRounds counts the rounds in which s lost samples, and among them
// those in which c (the C reference, nil if not measured) lost none: the
// rounds of a measurement are paired by index.
func (s *sustainedStat) lossyRounds(c *sustainedStat) (lossy, besideC int) {
	for i, n := range s.lost {
		if n == 0 {
			continue
		}
		lossy++
		if c != nil && i < len(c.lost) && c.lost[i] == 0 {
			besideC++
		}
	}
	return lossy, besideC
}

// cleanRounds counts the rounds in which c lost nothing.
func cleanRounds(c *sustainedStat) int {
	if c == nil {
		return 0
	}
	n := 0
	for _, l := range c.lost {
		if l == 0 {
			n++
		}
	}
	return n
}

func maxU(v []uint64) uint64 {
	if len(v) == 0 {
		return 0
	}
	return slices.Max(v)
}

func sumU(v []uint64) uint64 {
	var t uint64
	for _, x := range v {
		t += x
	}
	return t
}
