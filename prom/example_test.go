// SPDX-License-Identifier: Apache-2.0

package prom_test

import (
	"os"

	"github.com/perfbuf/perfbuf"
	"github.com/perfbuf/perfbuf/prom"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/common/expfmt"
)

// fixed stands in for a *perfbuf.Reader or *perfbuf.PerfBuffer.
type fixed []perfbuf.Stats

func (f fixed) Stats() []perfbuf.Stats { return f }

// A reader's metrics in a registry, labelled with its map. An HTTP server
// would serve reg with promhttp.HandlerFor(reg, promhttp.HandlerOpts{}).
// CPU 1 has two rings here (it went offline and came back): its entries
// are added up.
func ExampleNewCollector() {
	var r prom.Source = fixed{{CPU: 0, Samples: 5}, {CPU: 1, Samples: 2}, {CPU: 1, Samples: 1}}

	reg := prometheus.NewRegistry()
	reg.MustRegister(prom.NewCollector(r, prom.Options{ConstLabels: prometheus.Labels{"map": "events"}}))

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
	// # HELP perfbuf_samples_total Samples delivered from the CPU's perf rings (with DropLate, late samples dropped too).
	// # TYPE perfbuf_samples_total counter
	// perfbuf_samples_total{cpu="0",map="events"} 5
	// perfbuf_samples_total{cpu="1",map="events"} 3
}
