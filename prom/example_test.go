// SPDX-License-Identifier: Apache-2.0

package prom_test

import (
	"os"

	"github.com/perfbuf/perfbuf"
	"github.com/perfbuf/perfbuf/prom"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/common/expfmt"
)

// fixed stands in for a *perfbuf.Reader or *perfbuf.PerfBuffer: its
// rings' counts, and their sums.
type fixed []perfbuf.Stats

func (f fixed) Stats() perfbuf.Stats {
	st := perfbuf.Stats{CPU: -1, Rings: f}
	for _, r := range f {
		st.Samples += r.Samples
	}
	return st
}

// Two readers' metrics in a registry, each labelled with its map. An HTTP
// server would serve reg with promhttp.HandlerFor(reg, promhttp.HandlerOpts{}).
// The perf event array's rings (one per CPU; CPU 1 has two, it went offline
// and came back) are summed into one series; the two ring buffers have a
// series each, labelled with the ring's buffer index. Options.PerCPU would
// label the perf event array's counts by CPU instead.
func ExampleNewCollector() {
	var events prom.Source = fixed{{CPU: 0, Samples: 5}, {CPU: 1, Samples: 2}, {CPU: 1, Samples: 1}}
	var logs prom.Source = fixed{{CPU: -1, Samples: 7}, {CPU: -1, Samples: 4}}

	reg := prometheus.NewRegistry()
	reg.MustRegister(prom.NewCollector(events, prom.Options{ConstLabels: prometheus.Labels{"map": "events"}}))
	reg.MustRegister(prom.NewCollector(logs, prom.Options{ConstLabels: prometheus.Labels{"map": "logs"}}))

	families, err := reg.Gather()
	if err != nil {
		panic(err)
	}
	for _, f := range families {
		if f.GetName() == "perfbuf_samples_total" {
			expfmt.MetricFamilyToText(os.Stdout, f)
		}
	}
	// Output:
	// # HELP perfbuf_samples_total Samples delivered. Per ring of a ring buffer (summed past MaxRingSeries rings); a perf event array's rings summed.
	// # TYPE perfbuf_samples_total counter
	// perfbuf_samples_total{map="events",ring=""} 8
	// perfbuf_samples_total{map="logs",ring="0"} 7
	// perfbuf_samples_total{map="logs",ring="1"} 4
}
