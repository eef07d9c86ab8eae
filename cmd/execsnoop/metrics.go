// SPDX-License-Identifier: Apache-2.0

package main

// --metrics ADDR: the reader's counts (package prom), the Go runtime's and
// the process's, for Prometheus on http://ADDR/metrics.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"time"

	"github.com/perfbuf/perfbuf/prom"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// metricsServer serves /metrics. A nil *metricsServer (no --metrics) does
// nothing.
type metricsServer struct {
	ln     net.Listener
	srv    *http.Server
	served chan struct{} // closed when Serve returns; nil before serve
}

// listenMetrics listens on addr ("" for no metrics) before the tracer is
// opened, so that a bad or busy address fails the command before anything
// is attached; scrapes wait in the listen queue until serve. When addr asks
// for any port (port 0) it prints the address it got to stderr.
func listenMetrics(addr string, stderr io.Writer) (*metricsServer, error) {
	if addr == "" {
		return nil, nil
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("metrics: %w", err)
	}
	if _, port, _ := net.SplitHostPort(addr); port == "0" || port == "" {
		fmt.Fprintf(stderr, "execsnoop: serving metrics on http://%s/metrics\n", ln.Addr())
	}
	return &metricsServer{ln: ln}, nil
}

// serve serves src's metrics until close, from a registry of their own
// with the Go runtime's and the process's.
func (m *metricsServer) serve(src prom.Source, stderr io.Writer) {
	if m == nil {
		return
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister( // fixed collectors, without options that could clash
		prom.NewCollector(src, prom.Options{PerCPU: true}), // a host's few CPUs, as the summary prints them
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
	)
	logger := log.New(stderr, "execsnoop: metrics: ", 0)
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{ErrorLog: logger}))
	m.srv = &http.Server{Handler: mux, ErrorLog: logger, ReadHeaderTimeout: 10 * time.Second}
	m.served = make(chan struct{})
	go func() {
		defer close(m.served)
		if err := m.srv.Serve(m.ln); !errors.Is(err, http.ErrServerClosed) {
			logger.Printf("serve: %v", err)
		}
	}()
}

// shutdownTimeout bounds how long close waits for scrapes in progress.
const shutdownTimeout = time.Second

// close stops serving: it lets scrapes in progress end (for up to
// shutdownTimeout), then closes every connection.
func (m *metricsServer) close() {
	if m == nil {
		return
	}
	if m.srv == nil { // never served
		m.ln.Close()
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), shutdownTimeout)
	defer cancel()
	if m.srv.Shutdown(ctx) != nil {
		m.srv.Close()
	}
	<-m.served
}

// metricsAddrValue parses --metrics: host:port, either part possibly
// empty (":9435", "127.0.0.1:0").
type metricsAddrValue struct{ p *string }

func (v metricsAddrValue) String() string {
	if v.p == nil {
		return ""
	}
	return *v.p
}

func (v metricsAddrValue) Set(s string) error {
	if _, _, err := net.SplitHostPort(s); err != nil {
		return fmt.Errorf("invalid metrics address %q, should be HOST:PORT (:9435, 127.0.0.1:0)", s)
	}
	*v.p = s
	return nil
}
