// SPDX-License-Identifier: Apache-2.0

package main

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/perfbuf/perfbuf"
	"github.com/perfbuf/perfbuf/cmd/internal/stdio"
	"github.com/perfbuf/perfbuf/cmd/internal/tooltest"
	"github.com/prometheus/client_golang/prometheus/testutil/promlint"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// statsSource is a prom.Source with fixed Stats: these rings' entries,
// and their sums.
type statsSource []perfbuf.Stats

func (s statsSource) Stats() perfbuf.Stats { return tooltest.Sums(perfbuf.Stats{}, s...) }

// scrape is one GET of /metrics, parsed and linted.
type scrape struct {
	text     string
	families map[string]*dto.MetricFamily
}

// scrapeMetrics gets http://addr/metrics and fails the test unless it
// parses and passes the Prometheus linter.
func scrapeMetrics(t *testing.T, addr string) scrape {
	t.Helper()
	s, err := fetchMetrics(addr)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// fetchMetrics is scrapeMetrics for any goroutine: it returns the failure.
func fetchMetrics(addr string) (scrape, error) {
	client := http.Client{Timeout: 10 * time.Second}
	resp, err := client.Get("http://" + addr + "/metrics")
	if err != nil {
		return scrape{}, fmt.Errorf("scrape: %w", err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return scrape{}, fmt.Errorf("scrape: read: %w", err)
	}
	if resp.StatusCode != http.StatusOK {
		return scrape{}, fmt.Errorf("scrape: %s\n%s", resp.Status, body)
	}
	parser := expfmt.NewTextParser(model.LegacyValidation)
	families, err := parser.TextToMetricFamilies(bytes.NewReader(body))
	if err != nil {
		return scrape{}, fmt.Errorf("scrape: not the text format: %w\n%s", err, body)
	}
	problems, err := promlint.New(bytes.NewReader(body)).Lint()
	if err != nil {
		return scrape{}, fmt.Errorf("scrape: lint: %w", err)
	}
	var msgs []string
	for _, p := range problems {
		msgs = append(msgs, p.Metric+": "+p.Text)
	}
	if len(msgs) > 0 {
		return scrape{}, fmt.Errorf("scrape: lint:\n%s", strings.Join(msgs, "\n"))
	}
	return scrape{string(body), families}, nil
}

// byCPU returns the values of a metric with a cpu label, by CPU, and
// fails the test if the scrape lacks it or has a value of another type.
func (s scrape) byCPU(t *testing.T, name string) map[int]float64 {
	t.Helper()
	mf := s.families[name]
	if mf == nil {
		t.Fatalf("scrape has no %s:\n%s", name, s.text)
	}
	out := map[int]float64{}
	for _, m := range mf.GetMetric() {
		cpu := -1
		for _, l := range m.GetLabel() {
			if l.GetName() == "cpu" {
				cpu, _ = strconv.Atoi(l.GetValue())
			}
		}
		if cpu < 0 {
			t.Fatalf("%s without a cpu label: %v", name, m)
		}
		switch {
		case m.Counter != nil:
			out[cpu] += m.GetCounter().GetValue()
		case m.Gauge != nil:
			out[cpu] += m.GetGauge().GetValue()
		default:
			t.Fatalf("%s: neither counter nor gauge: %v", name, m)
		}
	}
	return out
}

// The server alone, over fake Stats: the address printed for port 0, the
// reader's metrics beside the runtime's and the process's, nothing but
// /metrics, and nothing served after close.
func TestMetricsServer(t *testing.T) {
	var stderr bytes.Buffer
	ms, err := listenMetrics("127.0.0.1:0", &stderr)
	if err != nil {
		t.Fatal(err)
	}
	defer ms.close()
	m := regexp.MustCompile(`^execsnoop: serving metrics on http://(127\.0\.0\.1:\d+)/metrics\n$`).FindStringSubmatch(stderr.String())
	if m == nil {
		t.Fatalf("stderr %q: want the address", stderr.String())
	}
	addr := m[1]
	if addr != ms.ln.Addr().String() || strings.HasSuffix(addr, ":0") {
		t.Fatalf("printed %s, listening on %s", addr, ms.ln.Addr())
	}
	ms.serve(statsSource{{CPU: 0, Samples: 3}, {CPU: 1, Samples: 5}, {CPU: 0, Samples: 4}}, &stderr)

	s := scrapeMetrics(t, addr)
	if got := s.byCPU(t, "perfbuf_samples_total"); len(got) != 2 || got[0] != 7 || got[1] != 5 {
		t.Errorf("perfbuf_samples_total by cpu: %v, want 0: 7, 1: 5", got)
	}
	for _, name := range []string{"go_goroutines", "process_cpu_seconds_total"} {
		if s.families[name] == nil {
			t.Errorf("no %s", name)
		}
	}
	resp, err := http.Get("http://" + addr + "/")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNotFound {
		t.Errorf("GET /: %s, want 404", resp.Status)
	}

	ms.close()
	if c, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
		c.Close()
		t.Errorf("%s accepts connections after close", addr)
	}
	if strings.Count(stderr.String(), "\n") != 1 {
		t.Errorf("stderr: %q, want the address line alone", stderr.String())
	}
}

// A fixed port is not printed; a busy one fails; no --metrics, no server.
func TestListenMetrics(t *testing.T) {
	var stderr bytes.Buffer
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	if ms, err := listenMetrics(ln.Addr().String(), &stderr); err == nil {
		ms.close()
		t.Errorf("listen on the busy %s succeeded", ln.Addr())
	}
	ln.Close()
	ms, err := listenMetrics(ln.Addr().String(), &stderr)
	if err != nil {
		t.Fatal(err)
	}
	ms.close() // never served
	if stderr.Len() != 0 {
		t.Errorf("fixed port: stderr %q, want nothing", stderr.String())
	}
	ms, err = listenMetrics("", &stderr)
	if ms != nil || err != nil {
		t.Errorf(`listenMetrics(""): %v, %v; want nil, nil`, ms, err)
	}
	ms.serve(statsSource{}, &stderr) // a nil server does nothing
	ms.close()
}

func TestParseMetricsFlag(t *testing.T) {
	for _, addr := range []string{":9435", "127.0.0.1:0", "[::1]:9435"} {
		o, err := parseFlags([]string{"--metrics", addr}, io.Discard)
		if err != nil || o.metrics != addr {
			t.Errorf("--metrics %s: %v, metrics %q", addr, err, o.metrics)
		}
	}
	if o, err := parseFlags(nil, io.Discard); err != nil || o.metrics != "" {
		t.Errorf("no --metrics: %v, metrics %q", err, o.metrics)
	}
	for _, bad := range []string{"9435", "localhost", "[::1"} {
		if _, err := parseFlags([]string{"--metrics", bad}, io.Discard); err == nil || errors.Is(err, flag.ErrHelp) {
			t.Errorf("--metrics %s: %v, want an error", bad, err)
		}
	}
}

// watchedStderr is the tool's stderr in TestMetricsScrape: it finds the
// metrics address, and when the summary starts (the reader is closed, so
// its Stats no longer change) it scrapes once more and takes stdout as it
// is then, before letting the tool go on.
type watchedStderr struct {
	stdout *lockedBuffer

	mu      sync.Mutex
	buf     bytes.Buffer
	addr    string
	addrSet chan struct{}

	final       scrape // at the summary
	finalErr    error  // of that scrape
	finalStdout string
}

var addrLine = regexp.MustCompile(`serving metrics on http://(\S+)/metrics\n`)

func (w *watchedStderr) Write(p []byte) (int, error) {
	w.mu.Lock()
	w.buf.Write(p)
	text := w.buf.String()
	if w.addr == "" {
		if m := addrLine.FindStringSubmatch(text); m != nil {
			w.addr = m[1]
			close(w.addrSet)
		}
	}
	summary := w.final.families == nil && w.finalErr == nil && w.addr != "" && strings.Contains(text, " execs traced, ")
	addr := w.addr
	w.mu.Unlock()
	if summary {
		final, err := fetchMetrics(addr) // the tool waits: it is writing
		stdout := w.stdout.String()
		w.mu.Lock()
		w.final, w.finalErr, w.finalStdout = final, err, stdout
		w.mu.Unlock()
	}
	return len(p), nil
}

func (w *watchedStderr) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.buf.String()
}

// lockedBuffer is a bytes.Buffer for one writer and other readers.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// The whole command with --metrics, in-process: scrapes while execs
// happen count them, well-formed, and the scrape taken as the summary is
// written, after the reader closed, matches the summary and the lines
// printed, which were on stdout by then. stdout is a pipe's stand-in, so
// block-buffered: the execs' lines must show up within the flush delay,
// while the tool still runs.
func TestMetricsScrape(t *testing.T) {
	requirePrivileges(t)
	stdout := &lockedBuffer{}
	stderr := &watchedStderr{stdout: stdout, addrSet: make(chan struct{})}
	exited := make(chan int, 1)
	ended := make(chan struct{}) // closed when run returns
	go func() {
		defer close(ended)
		exited <- run([]string{"--metrics", "127.0.0.1:0", "-d", "6"}, stdout, stderr)
	}()
	select {
	case <-stderr.addrSet:
	case <-ended:
		t.Fatalf("exit %d before printing the metrics address; stderr:\n%s", <-exited, stderr)
	case <-time.After(10 * time.Second):
		t.Fatalf("no metrics address on stderr after 10 s:\n%s", stderr)
	}
	stderr.mu.Lock()
	addr := stderr.addr
	stderr.mu.Unlock()

	// The first scrape waits until the tracer is attached and serving.
	first := scrapeMetrics(t, addr).byCPU(t, "perfbuf_samples_total")
	tok := newToken()
	stop := make(chan struct{})
	execs := execEvery(t, 10*time.Millisecond, tok, stop)
	var mid []map[int]float64
	deadline := time.Now().Add(2 * time.Second)
	for time.Now().Before(deadline) {
		time.Sleep(100 * time.Millisecond)
		mid = append(mid, scrapeMetrics(t, addr).byCPU(t, "perfbuf_samples_total"))
	}
	close(stop)
	ran := <-execs
	last := mid[len(mid)-1]
	if sum(last)-sum(first) < 1 || ran < 10 {
		t.Fatalf("%d execs in 2 s; scrapes counted %v samples, then %v", ran, first, last)
	}
	prev := first
	for _, m := range mid {
		for cpu, n := range prev {
			if m[cpu] < n {
				t.Errorf("perfbuf_samples_total{cpu=%q} went down: %v, then %v", strconv.Itoa(cpu), prev, m)
			}
		}
		prev = m
	}

	// The lines come out within the flush delay, though no buffer filled
	// (with room for a slow guest: TCG took over 3 s once).
	wait := stdio.FlushDelay + 10*time.Second
	for deadline := time.Now().Add(wait); strings.Count(stdout.String(), tok) < ran; {
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d execs on stdout %v after the last, while the tool runs", strings.Count(stdout.String(), tok), ran, wait)
		}
		select {
		case <-ended:
			t.Fatalf("exit %d before the lines came out", <-exited)
		case <-time.After(20 * time.Millisecond):
		}
	}

	// Execs until the end, so that lines wait in the buffer when reading
	// ends: they must be on stdout before the summary.
	more := execEvery(t, 10*time.Millisecond, tok, ended)
	var code int
	select {
	case code = <-exited:
	case <-time.After(20 * time.Second):
		t.Fatal("execsnoop -d 6 still runs after 20 s")
	}
	later := <-more
	if code != 0 {
		t.Fatalf("exit %d; stderr:\n%s", code, stderr)
	}
	stderr.mu.Lock()
	final, finalErr, finalStdout := stderr.final, stderr.finalErr, stderr.finalStdout
	stderr.mu.Unlock()
	if finalErr != nil {
		t.Fatalf("at the summary: %v", finalErr)
	}
	if final.families == nil {
		t.Fatalf("no summary seen; stderr:\n%s", stderr)
	}

	// The summary: the total, then per ring its CPU, events and lost.
	summary := stderr.String()
	total := regexp.MustCompile(`\n(\d+) execs traced, (\d+) shown, `).FindStringSubmatch(summary)
	if total == nil || strings.Contains(summary, "malformed") {
		t.Fatalf("summary: no totals, or malformed events:\n%s", summary)
	}
	events, _ := strconv.Atoi(total[1])
	printedSamples, printedLost := map[int]float64{}, map[int]float64{}
	for _, m := range regexp.MustCompile(`(?m)^\s+cpu (\d+)\s+(\d+) events\s+(\d+) lost`).FindAllStringSubmatch(summary, -1) {
		cpu, _ := strconv.Atoi(m[1])
		n, _ := strconv.ParseFloat(m[2], 64)
		lost, _ := strconv.ParseFloat(m[3], 64)
		printedSamples[cpu] += n
		printedLost[cpu] += lost
	}
	samples := final.byCPU(t, "perfbuf_samples_total")
	if !equalCounts(samples, printedSamples) || sum(samples) != float64(events) {
		t.Errorf("perfbuf_samples_total at the summary: %v (%v in all); the summary printed %v, %d execs traced:\n%s",
			samples, sum(samples), printedSamples, events, summary)
	}
	if lost := final.byCPU(t, "perfbuf_lost_samples_total"); !equalCounts(lost, printedLost) {
		t.Errorf("perfbuf_lost_samples_total at the summary: %v; the summary printed %v", lost, printedLost)
	}
	for cpu, n := range last {
		if samples[cpu] < n {
			t.Errorf("cpu %d: %v samples at the summary, %v before", cpu, samples[cpu], n)
		}
	}
	if fill := final.byCPU(t, "perfbuf_ring_fill_ratio"); sum(fill) != 0 {
		t.Errorf("perfbuf_ring_fill_ratio after Close: %v, want 0", fill)
	}
	// Every event was shown (no filter), on stdout before the summary.
	if lines := strings.Count(finalStdout, "\n") - 1; lines != events || !strings.HasPrefix(finalStdout, "PCOMM") {
		t.Errorf("%d lines after the header on stdout at the summary, %d execs traced", lines, events)
	}
	// The execs after the reader's flush are not traced.
	n := strings.Count(finalStdout, tok)
	if n < ran || n > ran+later || n == ran {
		t.Errorf("%d of the test's execs on stdout; want all %d of the first 2 s and some of the %d after", n, ran, later)
	}
	t.Logf("%d execs traced, %d of them the test's (%d + %d of %d while the tool ended); %d scrapes while they ran; samples by cpu %v",
		events, n, ran, n-ran, later, len(mid), samples)
}

// execEvery execs /bin/true tok every interval until stop is closed, and
// then sends the number of execs.
func execEvery(t *testing.T, interval time.Duration, tok string, stop <-chan struct{}) <-chan int {
	n := make(chan int, 1)
	go func() {
		ran := 0
		defer func() { n <- ran }()
		for {
			select {
			case <-stop:
				return
			case <-time.After(interval):
			}
			if err := exec.Command("/bin/true", tok).Run(); err != nil {
				t.Error(err)
				return
			}
			ran++
		}
	}()
	return n
}

func sum(m map[int]float64) float64 {
	var s float64
	for _, v := range m {
		s += v
	}
	return s
}

// equalCounts compares counts by CPU, a missing CPU counting 0.
func equalCounts(a, b map[int]float64) bool {
	for cpu := range a {
		if a[cpu] != b[cpu] {
			return false
		}
	}
	for cpu := range b {
		if a[cpu] != b[cpu] {
			return false
		}
	}
	return true
}
