// SPDX-License-Identifier: Apache-2.0

package owner

import (
	"errors"
	"os"
	"reflect"
	"regexp"
	"runtime"
	"slices"
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
	src, err := os.ReadFile("../../bpf/perfbuf.bpf.h")
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
	for _, s := range []string{"__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY)", "__uint(max_entries, PERFBUF_BPF_VERSION + 1)", "__type(key, __u32)", "__type(value, struct perfbuf_failures)"} {
		if !strings.Contains(string(macro[1]), s) {
			t.Errorf("PERFBUF_FAILURE_MAP lacks %s", s)
		}
	}
}

// The errno values the header defines for BPF programs (vmlinux.h has none)
// are the kernel's on this host's architecture.
func TestFailuresErrnos(t *testing.T) {
	src, err := os.ReadFile("../../bpf/perfbuf.bpf.h")
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
	ring := func(cpu int, samples uint64) Stats { return Stats{CPU: cpu, Tally: Tally{Samples: samples, Lost: 1}} }
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
			"ring buffer", []Stats{{Ring: 0, CPU: -1, Tally: Tally{Samples: 9, Discarded: 2}, Failed: Failures{Full: 99}}}, []int{0, 1, 2},
			[]Failures{{Full: 4}, {}, {Full: 1, NoEntry: 2}},
			[]Stats{{Ring: 0, CPU: -1, Tally: Tally{Samples: 9, Discarded: 2}, Failed: Failures{Full: 5, NoEntry: 2}}},
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
			pb := f.perfBuffer(t, nil, func(int, []byte) {}, nil)
			pb.C.src = &rings{failures: fm} // frees nothing but fm
			return pb.Stats, func() { pb.Close() }
		},
		"Reader": func(t *testing.T, f *fakeRings, fm *failureMap) (func() []Stats, func()) {
			r := f.reader(t, nil, defaultPlan)
			r.C.src = &rings{failures: fm} // frees nothing but fm
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
		fm, err := openFailureMap(mapFD(fd))
		if fm != nil || !errors.Is(err, syscall.EBADF) || !strings.HasPrefix(err.Error(), "failure map fd ") {
			t.Errorf("fd %d: %v; want EBADF", fd, err)
		}
	}
	if fm, err := openFailureMap(nil); fm != nil || err != nil {
		t.Errorf("nil map: %v, %v; want none", fm, err)
	}
}

// fakeReaderKey stands for key 1 of the kernel's failure map: every CPU's
// copy of the words the reader key uses; and the folder of its lock file.
type fakeReaderKey struct {
	mu    sync.Mutex
	words []uint64
	dir   string
}

func newFakeReaderKey(t *testing.T, cpus int) *fakeReaderKey {
	return &fakeReaderKey{words: make([]uint64, failuresWords*cpus), dir: t.TempDir()}
}

// attach makes f a failure map with the reader key k: each failureMap
// attached stands for a reader's own open of the map, as in a process of
// its own.
func (k *fakeReaderKey) attach(f *failureMap) {
	f.reader, f.readerKey, f.lockDir, f.id = true, k.access, k.dir, 1
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

// closed returns the closed word, checking that every CPU's copy holds it
// and nothing else.
func (k *fakeReaderKey) closed(t *testing.T) bool {
	t.Helper()
	k.mu.Lock()
	defer k.mu.Unlock()
	closed := k.words[0]
	for c := 0; c < len(k.words)/failuresWords; c++ {
		w := k.words[c*failuresWords : (c+1)*failuresWords]
		if w[0] != closed || slices.ContainsFunc(w[1:], func(x uint64) bool { return x != 0 }) {
			t.Errorf("cpu %d's copy holds %v; cpu 0's closed word %d and zeros", c, w, closed)
		}
	}
	return closed != 0
}

// A Close marks the reader key closed only when no other reader is alive:
// readers that overlap, in either order, leave it open to the one that
// stays (an agent's upgrade: the new one opens, then the old one closes;
// or the new one gives up first). Each fake stands for a reader of its own
// open of the lock file, as in another process.
func TestReaderKeyReaders(t *testing.T) {
	cpus := []int{0, 1, 3}
	key := newFakeReaderKey(t, len(cpus))
	reader := func() *failureMap {
		f, _ := fakeFailureMap(cpus)
		key.attach(f)
		return f
	}
	want := func(step string, closed bool) {
		t.Helper()
		if c := key.closed(t); c != closed {
			t.Errorf("%s: key closed %v, want %v", step, c, closed)
		}
	}
	closeReader := func(f *failureMap, wantLast bool) {
		t.Helper()
		last, err := f.closeReader()
		if err != nil || last != wantLast {
			t.Errorf("closeReader = %v, %v; want %v", last, err, wantLast)
		}
	}
	key.access(-1, []uint64{1, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0}, true)
	old, upgraded := reader(), reader()
	if err := old.openReader(); err != nil {
		t.Fatal(err)
	}
	want("old open", false)
	if err := upgraded.openReader(); err != nil {
		t.Fatal(err)
	}
	closeReader(old, false)
	want("old closed", false)
	closeReader(old, false) // once only
	tried := reader()
	if err := tried.openReader(); err != nil {
		t.Fatal(err)
	}
	closeReader(tried, false)
	want("another opened and closed", false)

	// Pause: only the last reader alive may, and stays a reader.
	other := reader()
	if err := other.openReader(); err != nil {
		t.Fatal(err)
	}
	if err := upgraded.pauseReader(); !errors.Is(err, ErrMapInUse) {
		t.Errorf("pause beside another reader: %v, want ErrMapInUse", err)
	}
	want("pause refused", false)
	other.close() // an owner that fails to open leaves as it closes
	if err := upgraded.pauseReader(); err != nil {
		t.Fatal(err)
	}
	want("paused", true)
	joined := reader() // a reader that opens while paused marks it open
	if err := joined.openReader(); err != nil {
		t.Fatal(err)
	}
	want("opened while paused", false)
	closeReader(joined, false)
	if err := upgraded.resumeReader(); err != nil {
		t.Fatal(err)
	}
	want("resumed", false)
	closeReader(upgraded, true)
	want("the last closed", true)
}

// A reader that ends without Close (its process killed) is not alive: the
// kernel dropped its lock with its file. The next reader's Pause works,
// and its Close is the last. (The old count in the key stayed up for ever:
// Pause failed with ErrMapInUse, and the key never closed.)
func TestReaderKeyDeadReader(t *testing.T) {
	cpus := []int{0, 1}
	key := newFakeReaderKey(t, len(cpus))
	reader := func() *failureMap {
		f, _ := fakeFailureMap(cpus)
		key.attach(f)
		return f
	}
	dead := reader()
	if err := dead.openReader(); err != nil {
		t.Fatal(err)
	}
	dead.presence.file.Close() // what the kernel does at a process's end
	next := reader()
	if err := next.openReader(); err != nil {
		t.Fatal(err)
	}
	if err := next.pauseReader(); err != nil {
		t.Fatalf("pause after a reader died: %v", err)
	}
	if err := next.resumeReader(); err != nil {
		t.Fatal(err)
	}
	if last, err := next.closeReader(); !last || err != nil {
		t.Errorf("close after a reader died: last %v, %v; want the last", last, err)
	}
	if !key.closed(t) {
		t.Error("the key stayed open after the last live reader closed")
	}
}

// A reader opening while the last one marks the key closed waits for the
// mark (its write lock) and marks the key open after it: never the other
// way round, which would leave the key closed under an open reader.
func TestReaderKeyOpenDuringClose(t *testing.T) {
	cpus := []int{0}
	key := newFakeReaderKey(t, 1)
	reader := func() *failureMap {
		f, _ := fakeFailureMap(cpus)
		key.attach(f)
		return f
	}
	for range 200 {
		last, opening := reader(), reader()
		if err := last.openReader(); err != nil {
			t.Fatal(err)
		}
		done := make(chan error)
		go func() { done <- opening.openReader() }()
		if _, err := last.closeReader(); err != nil {
			t.Fatal(err)
		}
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		if key.closed(t) {
			t.Fatal("a reader is open and the key is closed")
		}
		opening.close()
	}
}
