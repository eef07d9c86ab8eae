// SPDX-License-Identifier: Apache-2.0

package perfbuf

import (
	"errors"
	"os"
	"reflect"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"unsafe"
)

// The header's struct perfbuf_failures and Go's Failures agree: the same
// causes in the same order, six 8-byte words with no padding, which is
// what decodeFailures reads and what New checks as the map's value size.
func TestFailuresLayout(t *testing.T) {
	src, err := os.ReadFile("bpf/perfbuf.bpf.h")
	if err != nil {
		t.Fatal(err)
	}
	body := regexp.MustCompile(`(?s)struct perfbuf_failures \{(.*?)\};`).FindSubmatch(src)
	if body == nil {
		t.Fatal("no struct perfbuf_failures in bpf/perfbuf.bpf.h")
	}
	var cFields []string
	for _, m := range regexp.MustCompile(`(\w+)\s+(\w+);`).FindAllSubmatch(body[1], -1) {
		if string(m[1]) != "__u64" {
			t.Errorf("field %s is a %s, want __u64", m[2], m[1])
		}
		cFields = append(cFields, string(m[2]))
	}
	// The C field behind each Go field, in Go's order.
	want := []struct{ c, goName string }{
		{"noent", "NoEntry"}, {"e2big", "TooBig"}, {"einval", "Invalid"}, {"opnotsupp", "NotOnCPU"}, {"other", "Other"},
		{"full", "Full"},
	}
	if len(cFields) != len(want) {
		t.Fatalf("struct perfbuf_failures has fields %v, want %d", cFields, len(want))
	}
	typ := reflect.TypeOf(Failures{})
	if typ.NumField() != len(want) || unsafe.Sizeof(Failures{}) != failuresSize || failuresSize != 48 {
		t.Fatalf("Failures has %d fields, %d bytes; struct perfbuf_failures %d, %d bytes",
			typ.NumField(), unsafe.Sizeof(Failures{}), len(want), failuresSize)
	}
	words := make([]uint64, failuresWords)
	for i := range words {
		words[i] = uint64(i + 1)
	}
	got := reflect.ValueOf(decodeFailures(words, 1)[0])
	for i, w := range want {
		f := typ.Field(i)
		if cFields[i] != w.c || f.Name != w.goName || f.Offset != uintptr(8*i) {
			t.Errorf("field %d: C %s, Go %s at offset %d; want C %s, Go %s at %d", i, cFields[i], f.Name, f.Offset, w.c, w.goName, 8*i)
		}
		if v := got.Field(i).Uint(); v != uint64(i+1) {
			t.Errorf("decodeFailures: %s = %d, want word %d", f.Name, v, i+1)
		}
	}
	if total := decodeFailures(words, 1)[0].Total(); total != 21 {
		t.Errorf("Total() = %d, want 21", total)
	}

	// The map the macro declares is what New checks for.
	macro := regexp.MustCompile(`(?s)#define PERFBUF_FAILURE_MAP\(name\)(.*?)name SEC\("\.maps"\)`).FindSubmatch(src)
	if macro == nil {
		t.Fatal("no PERFBUF_FAILURE_MAP(name) in bpf/perfbuf.bpf.h")
	}
	for _, s := range []string{"__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY)", "__uint(max_entries, 2)", "__type(key, __u32)", "__type(value, struct perfbuf_failures)"} {
		if !strings.Contains(string(macro[1]), s) {
			t.Errorf("PERFBUF_FAILURE_MAP lacks %s", s)
		}
	}
}

// The errno values the header defines for BPF programs (vmlinux.h has none)
// are the kernel's on this host's architecture.
func TestFailuresErrnos(t *testing.T) {
	src, err := os.ReadFile("bpf/perfbuf.bpf.h")
	if err != nil {
		t.Fatal(err)
	}
	defs := map[string][]int{}
	for _, m := range regexp.MustCompile(`(?m)^#define (E\w+) (\d+)$`).FindAllStringSubmatch(string(src), -1) {
		n, _ := strconv.Atoi(m[2])
		defs[m[1]] = append(defs[m[1]], n)
	}
	want := map[string]syscall.Errno{
		"ENOENT": syscall.ENOENT, "E2BIG": syscall.E2BIG, "EINVAL": syscall.EINVAL,
		"ENOSPC": syscall.ENOSPC, "EOPNOTSUPP": syscall.EOPNOTSUPP, "EAGAIN": syscall.EAGAIN,
	}
	for name, errno := range want {
		vals := defs[name]
		if len(vals) == 0 {
			t.Errorf("%s is not defined", name)
			continue
		}
		// EOPNOTSUPP has a value per architecture; the last is the
		// default (not MIPS, not SPARC).
		v := vals[len(vals)-1]
		if name == "EOPNOTSUPP" && (strings.HasPrefix(runtime.GOARCH, "mips") || strings.HasPrefix(runtime.GOARCH, "sparc")) {
			continue
		}
		if v != int(errno) {
			t.Errorf("%s is defined as %d, the kernel's is %d", name, v, int(errno))
		}
	}
}

// mergeFailures puts a CPU's failures on its latest ring's entry and gives
// CPUs with no ring but failures entries of their own, after the rings', in
// CPU order.
func TestMergeFailures(t *testing.T) {
	f := func(n uint64) Failures {
		return Failures{NoEntry: n, TooBig: 2 * n, Invalid: 3 * n, NotOnCPU: 4 * n, Other: 5 * n, Full: 6 * n}
	}
	ring := func(cpu int, samples uint64) Stats { return Stats{CPU: cpu, Samples: samples, Lost: 1} }
	withFailed := func(s Stats, fl Failures) Stats { s.Failed = fl; return s }
	cases := []struct {
		name   string
		st     []Stats
		cpus   []int
		counts []Failures
		want   []Stats
	}{
		{"no counts", []Stats{ring(0, 5)}, nil, nil, []Stats{ring(0, 5)}},
		{
			"one ring a cpu", []Stats{ring(0, 5), ring(1, 6)}, []int{0, 1}, []Failures{f(1), f(2)},
			[]Stats{withFailed(ring(0, 5), f(1)), withFailed(ring(1, 6), f(2))},
		},
		{
			"zero counts add nothing", []Stats{ring(0, 5), ring(1, 6)}, []int{0, 1, 2, 3}, []Failures{{}, f(2), {}, {}},
			[]Stats{ring(0, 5), withFailed(ring(1, 6), f(2))},
		},
		{
			// A CPU that went offline and came back has two rings: the
			// later one is where its samples go now.
			"latest ring", []Stats{ring(0, 5), ring(1, 6), ring(2, 7), ring(1, 8)}, []int{0, 1, 2}, []Failures{f(1), f(2), f(3)},
			[]Stats{withFailed(ring(0, 5), f(1)), ring(1, 6), withFailed(ring(2, 7), f(3)), withFailed(ring(1, 8), f(2))},
		},
		{
			// CPU 3 offline at New (or past max_entries), CPU 5 too: their
			// entries come after the rings', in CPU order; CPU 4 failed
			// nothing and gets none.
			"cpus without a ring", []Stats{ring(0, 5), ring(2, 6), ring(1, 7)}, []int{0, 1, 2, 3, 4, 5},
			[]Failures{f(1), {}, f(3), {Other: 9}, {}, f(6)},
			[]Stats{withFailed(ring(0, 5), f(1)), withFailed(ring(2, 6), f(3)), ring(1, 7), {Ring: -1, CPU: 3, Failed: Failures{Other: 9}}, {Ring: -1, CPU: 5, Failed: f(6)}},
		},
		{
			// The lookup's k-th value is the k-th possible CPU.
			"sparse possible cpus", []Stats{ring(0, 5), ring(4, 6)}, []int{0, 4, 8}, []Failures{f(1), f(2), f(3)},
			[]Stats{withFailed(ring(0, 5), f(1)), withFailed(ring(4, 6), f(2)), {Ring: -1, CPU: 8, Failed: f(3)}},
		},
		{
			// A ring buffer's one ring is every CPU's (CPU -1): every
			// CPU's failures, a full ring's among them, are its own, so
			// that its entry adds up alone; read again, they are not
			// counted twice.
			"ring buffer", []Stats{{Ring: 0, CPU: -1, Samples: 9, Discarded: 2, Failed: Failures{Full: 99}}}, []int{0, 1, 2},
			[]Failures{{Full: 4}, {}, {Full: 1, NoEntry: 2}},
			[]Stats{{Ring: 0, CPU: -1, Samples: 9, Discarded: 2, Failed: Failures{Full: 5, NoEntry: 2}}},
		},
		{
			// Several ring buffers that share their CPUs: which one a
			// failed output was for cannot be told, so each CPU's come in
			// an entry of its own; a ring that is one CPU's takes that
			// CPU's.
			"ring buffers", []Stats{{Ring: 0, CPU: -1}, {Ring: 1, CPU: -1}, {Ring: 2, CPU: 1}}, []int{0, 1, 2},
			[]Failures{{Full: 4}, {Full: 7}, {NoEntry: 2}},
			[]Stats{{Ring: 0, CPU: -1}, {Ring: 1, CPU: -1}, {Ring: 2, CPU: 1, Failed: Failures{Full: 7}}, {Ring: -1, CPU: 0, Failed: Failures{Full: 4}}, {Ring: -1, CPU: 2, Failed: Failures{NoEntry: 2}}},
		},
	}
	for _, c := range cases {
		got := mergeFailures(c.st, c.cpus, c.counts)
		if !reflect.DeepEqual(got, c.want) {
			t.Errorf("%s:\n got %+v\nwant %+v", c.name, got, c.want)
		}
	}
}

// fakeCounters stands for the kernel's failure map behind a failureMap:
// words is what a lookup returns, err what it fails with.
type fakeCounters struct {
	mu      sync.Mutex
	words   []uint64
	err     error
	lookups int
}

// fakeFailureMap returns a failureMap over CPUs cpus whose lookups read c.
func fakeFailureMap(cpus []int) (*failureMap, *fakeCounters) {
	c := &fakeCounters{words: make([]uint64, failuresWords*len(cpus))}
	f := &failureMap{
		name: "fake",
		fd:   -1,
		cpus: cpus,
		buf:  make([]uint64, failuresWords*len(cpus)),
		lookup: func(fd int, out []uint64) error {
			c.mu.Lock()
			defer c.mu.Unlock()
			c.lookups++
			if c.err != nil {
				return c.err
			}
			copy(out, c.words)
			return nil
		},
	}
	return f, c
}

// set sets CPU k's (the k-th of the map's cpus) counts.
func (c *fakeCounters) set(k int, f Failures) {
	c.mu.Lock()
	defer c.mu.Unlock()
	copy(c.words[k*failuresWords:], []uint64{f.NoEntry, f.TooBig, f.Invalid, f.NotOnCPU, f.Other})
}

func (c *fakeCounters) fail(err error) {
	c.mu.Lock()
	c.err = err
	c.mu.Unlock()
}

// A failureMap reads the map at each call until closed; a lookup that
// fails leaves the last counts; close reads a last time, and after it the
// map is not looked up again.
func TestFailureMapCounts(t *testing.T) {
	fm, c := fakeFailureMap([]int{0, 1})
	c.set(1, Failures{NoEntry: 3})
	if got := fm.counts(); len(got) != 2 || got[1].NoEntry != 3 || got[0] != (Failures{}) {
		t.Fatalf("counts = %+v, want cpu 1 NoEntry 3", got)
	}
	c.set(1, Failures{NoEntry: 4, Invalid: 1})
	c.fail(syscall.ENOMEM)
	if got := fm.counts(); got[1] != (Failures{NoEntry: 3}) {
		t.Errorf("counts after a failed lookup = %+v, want the last read's", got)
	}
	c.fail(nil)
	if got := fm.counts(); got[1] != (Failures{NoEntry: 4, Invalid: 1}) {
		t.Errorf("counts = %+v, want NoEntry 4 Invalid 1", got)
	}
	c.set(0, Failures{TooBig: 7})
	fm.close()
	c.set(0, Failures{TooBig: 8})
	before := c.lookups
	if got := fm.counts(); got[0] != (Failures{TooBig: 7}) {
		t.Errorf("counts after close = %+v, want those at close (TooBig 7)", got)
	}
	fm.close()
	if c.lookups != before {
		t.Errorf("%d lookups after close", c.lookups-before)
	}
	var none *failureMap
	none.close()
	if st := none.addTo([]Stats{{CPU: 0}}); len(st) != 1 || st[0].Failed != (Failures{}) {
		t.Errorf("a nil failure map added %+v", st)
	}
}

// Both readers' Stats carry the failure map's counts, also after Close
// (the counts when the rings were freed), and Stats may run while Close
// frees the rings.
func TestStatsFailures(t *testing.T) {
	open := map[string]func(t *testing.T, f *fakeRings, fm *failureMap) (stats func() []Stats, close func()){
		"PerfBuffer": func(t *testing.T, f *fakeRings, fm *failureMap) (func() []Stats, func()) {
			pb := f.perfBuffer(t, func(int, []byte) {}, nil)
			pb.c.src = &rings{failures: fm} // frees nothing but fm
			return pb.Stats, func() { pb.Close() }
		},
		"Reader": func(t *testing.T, f *fakeRings, fm *failureMap) (func() []Stats, func()) {
			r := f.reader(t, ReaderOptions{})
			r.c.src = &rings{failures: fm} // frees nothing but fm
			return r.Stats, func() { r.Close() }
		},
	}
	for name, open := range open {
		t.Run(name, func(t *testing.T) {
			f := newFakeRings(t, 2, 4096)
			f.cpus = []int{0, 2} // CPU 1 has no ring
			fm, c := fakeFailureMap([]int{0, 1, 2})
			stats, closeFn := open(t, f, fm)
			c.set(0, Failures{Invalid: 2})
			c.set(1, Failures{NoEntry: 5})
			want := []Stats{{Ring: 0, CPU: 0, Size: 4096, Failed: Failures{Invalid: 2}}, {Ring: 1, CPU: 2, Size: 4096}, {Ring: -1, CPU: 1, Failed: Failures{NoEntry: 5}}}
			if got := stats(); !reflect.DeepEqual(got, want) {
				t.Errorf("Stats:\n got %+v\nwant %+v", got, want)
			}

			var wg sync.WaitGroup
			stop := make(chan struct{})
			for range 2 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for {
						select {
						case <-stop:
							return
						default:
							stats()
						}
					}
				}()
			}
			c.set(2, Failures{NotOnCPU: 1})
			closeFn()
			// Close frees the rings when the last call out leaves: a Stats
			// in progress may hold the free past Close's return, so the
			// later count is set once every Stats has returned.
			close(stop)
			wg.Wait()
			c.set(2, Failures{NotOnCPU: 9}) // after the rings were freed: not seen
			want[1].Failed = Failures{NotOnCPU: 1}
			if got := stats(); !reflect.DeepEqual(got, want) {
				t.Errorf("Stats after Close:\n got %+v\nwant %+v", got, want)
			}
		})
	}
}

// A FailureMap that is not a descriptor fails New and NewReader as the
// event map would, before anything is opened. (Maps of the wrong kind need
// a kernel: selftest/failures.)
func TestFailureMapBadFD(t *testing.T) {
	for _, fd := range []int{-1, 1 << 20} {
		fm, err := openFailureMap(MapFD(fd))
		if fm != nil || !errors.Is(err, syscall.EBADF) || !strings.HasPrefix(err.Error(), "failure map fd ") {
			t.Errorf("fd %d: %v; want EBADF", fd, err)
		}
	}
	if fm, err := openFailureMap(nil); fm != nil || err != nil {
		t.Errorf("nil map: %v, %v; want none", fm, err)
	}
}

// fakeReaderKey stands for key 1 of the kernel's failure map: every CPU's
// copy of the two words the reader key uses.
type fakeReaderKey struct {
	mu    sync.Mutex
	words []uint64
}

func (k *fakeReaderKey) access(fd int, words []uint64, update bool) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	if update {
		copy(k.words, words)
	} else {
		copy(words, k.words)
	}
	return nil
}

// state returns the closed word and the count, checking that every CPU's
// copy holds them alike.
func (k *fakeReaderKey) state(t *testing.T) (closed, readers uint64) {
	t.Helper()
	k.mu.Lock()
	defer k.mu.Unlock()
	closed, readers = k.words[0], k.words[1]
	for c := 1; c < len(k.words)/failuresWords; c++ {
		if w := k.words[c*failuresWords:]; w[0] != closed || w[1] != readers {
			t.Errorf("cpu %d's copy holds %d, %d; cpu 0's %d, %d", c, w[0], w[1], closed, readers)
		}
	}
	return closed, readers
}

// A Close marks the reader key closed only when no other reader holds it
// open: readers that overlap, in either order, leave it open to the one
// that stays (an agent's upgrade: the new one opens, then the old one
// closes; or the new one gives up first).
func TestReaderKeyCount(t *testing.T) {
	cpus := []int{0, 1, 3}
	key := &fakeReaderKey{words: make([]uint64, failuresWords*len(cpus))}
	reader := func() *failureMap {
		f, _ := fakeFailureMap(cpus)
		f.reader, f.readerKey = true, key.access
		return f
	}
	want := func(step string, closed, readers uint64) {
		t.Helper()
		if c, n := key.state(t); c != closed || n != readers {
			t.Errorf("%s: key closed %d with %d readers, want closed %d with %d", step, c, n, closed, readers)
		}
	}
	closeReader := func(f *failureMap, wantLast bool) {
		t.Helper()
		last, err := f.closeReader()
		if err != nil || last != wantLast {
			t.Errorf("closeReader = %v, %v; want %v", last, err, wantLast)
		}
	}
	old, upgraded := reader(), reader()
	if err := old.openReader(); err != nil {
		t.Fatal(err)
	}
	want("old open", 0, 1)
	if err := upgraded.openReader(); err != nil {
		t.Fatal(err)
	}
	want("new open", 0, 2)
	closeReader(old, false)
	want("old closed", 0, 1)
	closeReader(old, false) // once only
	want("old closed again", 0, 1)
	tried := reader()
	if err := tried.openReader(); err != nil {
		t.Fatal(err)
	}
	closeReader(tried, false)
	want("another opened and closed", 0, 1)
	closeReader(upgraded, true)
	want("the last closed", 1, 0)

	// A key marked closed counts no reader, whatever word 1 says.
	key.access(-1, []uint64{1, 7, 0, 0, 0, 0, 1, 7, 0, 0, 0, 0, 1, 7, 0, 0, 0, 0}, true)
	again := reader()
	if err := again.openReader(); err != nil {
		t.Fatal(err)
	}
	want("open after a closed mark", 0, 1)
	// An owner that fails to open gives its count back as it closes.
	failed := reader()
	if err := failed.openReader(); err != nil {
		t.Fatal(err)
	}
	failed.close()
	want("an owner that failed to open closed", 0, 1)
	// A process with an older perfbuf wrote the key open and no count:
	// the last Close here still marks it closed.
	key.access(-1, make([]uint64, failuresWords*len(cpus)), true)
	closeReader(again, true)
	want("closed after an older writer", 1, 0)
}
