package main

import (
	"slices"

	"github.com/perfbuf/perfbuf/internal/benchrun"
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
	rate  series // samples per second
	xc    series // rate over C's in the same round
	wall  series // milliseconds
	lost  []uint64
	late  []uint64
	check []error // accounting mismatches
}

// results is everything perfbench measured.
type results struct {
	env             env
	rounds          int
	samples         int
	sustainedPerCPU int
	drain           []*drainStat // in the order of benchrun.Sizes, then DrainModes
	sustained       []*sustainedStat
}

// addDrainRound adds one round of drains at size: ns and allocs per sample
// of each of modes, measured side by side, the C references among them.
// Each mode's ratio is to its reference (benchrun.Reference), and the
// reference of the ordered modes' is to C.
func (r *results) addDrainRound(size int, modes []string, ns, allocs []float64) {
	for i, mode := range modes {
		ref := benchrun.Reference(mode)
		if mode == ref {
			ref = benchrun.ModeC
		}
		r.addDrain(mode, size, ns[i], allocs[i], ns[i]/ns[slices.Index(modes, ref)])
	}
}

func (r *results) addDrain(mode string, size int, ns, allocs, xc float64) {
	d := r.drainOf(mode, size)
	if d == nil {
		d = &drainStat{mode: mode, size: size}
		r.drain = append(r.drain, d)
		slices.SortStableFunc(r.drain, func(a, b *drainStat) int {
			if a.size != b.size {
				return a.size - b.size
			}
			return slices.Index(benchrun.DrainModes, a.mode) - slices.Index(benchrun.DrainModes, b.mode)
		})
	}
	d.ns = append(d.ns, ns)
	d.allocs = append(d.allocs, allocs)
	d.xc = append(d.xc, xc)
}

func (r *results) drainOf(mode string, size int) *drainStat {
	for _, d := range r.drain {
		if d.mode == mode && d.size == size {
			return d
		}
	}
	return nil
}

// addSustainedRound adds one round of sustained runs, C among them.
func (r *results) addSustainedRound(round []benchrun.SustainedResult) {
	var c float64
	for _, res := range round {
		if res.Mode == benchrun.ModeC {
			c = res.Rate()
		}
	}
	for _, res := range round {
		r.addSustained(res, res.Rate()/c)
	}
}

func (r *results) addSustained(res benchrun.SustainedResult, xc float64) {
	s := r.sustainedOf(res.Mode)
	if s == nil {
		s = &sustainedStat{mode: res.Mode}
		r.sustained = append(r.sustained, s)
		slices.SortStableFunc(r.sustained, func(a, b *sustainedStat) int {
			return slices.Index(benchrun.SustainedModes, a.mode) - slices.Index(benchrun.SustainedModes, b.mode)
		})
	}
	s.rate = append(s.rate, res.Rate())
	s.xc = append(s.xc, xc)
	s.wall = append(s.wall, float64(res.Wall.Microseconds())/1e3)
	s.lost = append(s.lost, res.Lost)
	s.late = append(s.late, res.Late)
	if err := res.Check(); err != nil {
		s.check = append(s.check, err)
	}
}

func (r *results) sustainedOf(mode string) *sustainedStat {
	for _, s := range r.sustained {
		if s.mode == mode {
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

func (r *results) accountingErrors() []error {
	var out []error
	for _, s := range r.sustained {
		out = append(out, s.check...)
	}
	return out
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
