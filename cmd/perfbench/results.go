package main

import (
	"runtime"
	"slices"
	"time"

	"github.com/perfbuf/perfbuf/internal/benchrun"
)

// stopwatch is perfbench's benchrun.Timer: it adds up the time and the heap
// allocations between StartTimer and StopTimer, as testing.B does.
type stopwatch struct {
	running bool
	start   time.Time
	mallocs uint64 // allocations in the timed parts
	base    uint64 // the count at StartTimer
	elapsed time.Duration
}

func (s *stopwatch) StartTimer() {
	if s.running {
		return
	}
	s.base = mallocs()
	s.running = true
	s.start = time.Now()
}

func (s *stopwatch) StopTimer() {
	if !s.running {
		return
	}
	s.elapsed += time.Since(s.start)
	s.running = false
	s.mallocs += mallocs() - s.base
}

// mallocs is the number of heap allocations so far. ReadMemStats stops the
// world but counts exactly (runtime/metrics counts small objects only when
// their span is refilled); it runs outside the timed parts.
func mallocs() uint64 {
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.Mallocs
}

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
}

// sustainedStat is one sustained measurement over the rounds.
type sustainedStat struct {
	mode  string
	rate  series // samples per second
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

func (r *results) addDrain(mode string, size int, ns, allocs float64) {
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
}

func (r *results) drainOf(mode string, size int) *drainStat {
	for _, d := range r.drain {
		if d.mode == mode && d.size == size {
			return d
		}
	}
	return nil
}

func (r *results) addSustained(res benchrun.SustainedResult) {
	s := r.sustainedOf(res.Mode)
	if s == nil {
		s = &sustainedStat{mode: res.Mode}
		r.sustained = append(r.sustained, s)
		slices.SortStableFunc(r.sustained, func(a, b *sustainedStat) int {
			return slices.Index(benchrun.SustainedModes, a.mode) - slices.Index(benchrun.SustainedModes, b.mode)
		})
	}
	s.rate = append(s.rate, res.Rate())
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

// ratio is a drain's median ns per sample over the C reference's at the
// same size (1.5 means 50% more time per sample), or 0 without a reference.
func (r *results) ratio(d *drainStat) float64 {
	c := r.drainOf(benchrun.ModeC, d.size)
	if c == nil || c.ns.median() == 0 {
		return 0
	}
	return d.ns.median() / c.ns.median()
}

// rateRatio is a sustained mode's median rate over the C reference's
// (0.95 means 5% fewer samples per second).
func (r *results) rateRatio(s *sustainedStat) float64 {
	c := r.sustainedOf(benchrun.ModeC)
	if c == nil || c.rate.median() == 0 {
		return 0
	}
	return s.rate.median() / c.rate.median()
}

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
