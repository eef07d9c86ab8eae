// SPDX-License-Identifier: Apache-2.0

package owner

// Tests of the ring settings checked against a map (a perf event array's
// ring sizes, wakeups and room for a key, a ring buffer's room for a
// key), the names of what is read, and the claim that makes one reader
// per map in this process. The options' fields alone are the root's
// (TestOptionsCheck, TestOrderKeyFits).

import (
	"errors"
	"math"
	"os"
	"strings"
	"testing"
)

// testMemory is the host memory the config tests assume: 16 GiB.
const testMemory = 16 << 30

// A perf event array's rings: the sizes a ring holds, checked against the
// samples it must hold and the host's memory; the defaults; the wakeup a
// reader's latency budget sets. (The fields alone are the root's
// TestOptionsCheck.)
func TestRingConfig(t *testing.T) {
	const page = 4096
	for _, o := range []RingOptions{
		{},
		{RingBytes: 1 * page},
		{RingBytes: 1024 * page, WakeupEvents: 64},
		{RingBytes: 2 * page, WakeupBytes: 4096},
		{RingBytes: 1 * page, MaxSampleSize: 4052},
		{RingBytes: 64 * page, MaxSampleSize: 65512},
		{RingBytes: 4 * page, WakeupEvents: math.MaxInt32},
	} {
		if _, err := o.Config(page, testMemory); err != nil {
			t.Errorf("%+v: %v", o, err)
		}
	}
	for _, c := range []struct {
		o    RingOptions
		want error
	}{
		{RingOptions{RingBytes: 1 * page, WakeupBytes: 4096}, os.ErrInvalid},
		// 4053 bytes need a 4072-byte record; a one-page ring holds 4088,
		// less 24 for the lost record written in front of it after a loss.
		{RingOptions{RingBytes: 1 * page, MaxSampleSize: 4053}, ErrSampleTooLarge},
		// 4076 bytes fit an empty ring but not beside a lost record.
		{RingOptions{RingBytes: 1 * page, MaxSampleSize: 4076}, ErrSampleTooLarge},
		// Over 64 KiB the u16 record size overflows, whatever the ring.
		{RingOptions{RingBytes: 64 * page, MaxSampleSize: 65520}, ErrSampleTooLarge},
		// So high that computing the record size overflowed, once.
		{RingOptions{RingBytes: 1 * page, MaxSampleSize: math.MaxInt}, ErrSampleTooLarge},
		{RingOptions{RingBytes: 1 * page, MaxSampleSize: math.MaxInt - 5}, ErrSampleTooLarge},
	} {
		if _, err := c.o.Config(page, testMemory); !errors.Is(err, c.want) {
			t.Errorf("%+v: %v, want %v", c.o, err, c.want)
		}
	}
	for _, c := range []struct {
		name string
		o    RingOptions
		want RingConfig
	}{
		{"defaults", RingOptions{}, RingConfig{Pages: DefaultRingBytes / page, PageSize: page, WakeupEvents: 1}},
		{"wakeup bytes", RingOptions{RingBytes: 2 * page, WakeupBytes: 4096}, RingConfig{Pages: 2, PageSize: page, WakeupEvents: 1, WakeupBytes: 4096}},
		{"wakeup events", RingOptions{WakeupEvents: 8}, RingConfig{Pages: DefaultRingBytes / page, PageSize: page, WakeupEvents: 8}},
		// A reader's latency budget: the rings wake it half full (the
		// event's watermark), its timer takes what is below.
		{"a budget", RingOptions{Budget: true}, RingConfig{Pages: DefaultRingBytes / page, PageSize: page, WakeupEvents: 1, WakeupBytes: DefaultRingBytes / 2}},
		{"a budget, 4 pages", RingOptions{RingBytes: 4 * page, Budget: true}, RingConfig{Pages: 4, PageSize: page, WakeupEvents: 1, WakeupBytes: 2 * page}},
	} {
		if got, err := c.o.Config(page, testMemory); got != c.want || err != nil {
			t.Errorf("%s: %+v, %v; want %+v", c.name, got, err, c.want)
		}
	}
}

// RingBytes rounds up to a power of two pages of the host's page size,
// 4 KiB and 64 KiB alike; a ring must be smaller than the host's memory.
func TestRingBytes(t *testing.T) {
	for _, c := range []struct {
		bytes, pageSize, pages int
	}{
		{1, 4096, 1},
		{4096, 4096, 1},
		{4097, 4096, 2},
		{3 * 4096, 4096, 4},
		{256 << 10, 4096, 64},
		{(256 << 10) + 1, 4096, 128},
		{1, 65536, 1},
		{65536, 65536, 1},
		{256 << 10, 65536, 4},
		{300 << 10, 65536, 8},
		{8 << 20, 65536, 128},
	} {
		cfg, err := RingOptions{RingBytes: c.bytes}.Config(c.pageSize, testMemory)
		if err != nil || cfg.Pages != c.pages || cfg.PageSize != c.pageSize {
			t.Errorf("RingBytes %d, %d-byte pages: %+v, %v; want %d pages", c.bytes, c.pageSize, cfg, err, c.pages)
		}
	}
	// The host's own page size, as Open sees it.
	page := os.Getpagesize()
	cfg, err := RingOptions{RingBytes: 5 * page}.HostConfig()
	if err != nil || cfg.Pages != 8 || cfg.PageSize != page || cfg.RingBytes() != 8*page {
		t.Errorf("RingBytes 5 pages on this host (%d-byte pages): %+v, %v; want 8 pages", page, cfg, err)
	}
	for _, c := range []struct {
		bytes int
		mem   uint64
	}{
		{16 << 30, testMemory}, // 16 GiB asked of a 16 GiB host
		{1 << 20, 1 << 20},
	} {
		_, err := RingOptions{RingBytes: c.bytes}.Config(4096, c.mem)
		if !errors.Is(err, os.ErrInvalid) || !strings.Contains(err.Error(), "memory") {
			t.Errorf("RingBytes %d on %d bytes: %v, want os.ErrInvalid naming the memory", c.bytes, c.mem, err)
		}
	}
}

// An ordered reader's key must fit in the largest sample a ring holds: a
// one-page perf ring holds one of 4052 bytes beside a lost record; a
// one-page ring buffer one of 4080 bytes with its 8-byte header, in a
// record of at most 4088.
func TestKeyEnd(t *testing.T) {
	const page = 4096
	ringBuf := mapDesc{typ: mapTypeRingBuf, maxEntries: page, name: "events"}
	for _, c := range []struct {
		off        int
		perf, rbuf bool // accepted
	}{
		{0, true, true}, {4044, true, true}, {4045, false, true}, {4072, false, true}, {4073, false, false}, {65000, false, false},
	} {
		_, err := RingOptions{RingBytes: page, KeyEnd: c.off + 8}.Config(page, testMemory)
		if c.perf != (err == nil) || err != nil && (!errors.Is(err, os.ErrInvalid) || !strings.Contains(err.Error(), "past the largest sample a ring of 4096 bytes holds (4052 bytes)")) {
			t.Errorf("KeyOffset %d, perf ring of a page: %v; accepted %v", c.off, err, c.perf)
		}
		err = RingOptions{KeyEnd: c.off + 8}.checkRingBuf(ringBuf)
		if c.rbuf != (err == nil) || err != nil && (!errors.Is(err, os.ErrInvalid) || !strings.Contains(err.Error(), `past the largest sample the 4096-byte ring of ring buffer "events" holds (4080 bytes)`)) {
			t.Errorf("KeyOffset %d, ring buffer of a page: %v; accepted %v", c.off, err, c.rbuf)
		}
	}
}

// One reader per map in this process: a claimed map ID cannot be claimed
// again until it is released.
func TestClaimMap(t *testing.T) {
	const id = 1<<32 - 7 // no map of a test process has it
	if !claimMap(id) {
		t.Fatal("first claim refused")
	}
	if claimMap(id) {
		t.Fatal("second claim granted")
	}
	if !claimMap(id - 1) {
		t.Fatal("another map's claim refused")
	}
	unclaimMap(id)
	unclaimMap(id - 1)
	if !claimMap(id) {
		t.Fatal("claim after release refused")
	}
	unclaimMap(id)
}

// An error names what is read: the map, and how many more beside it.
func TestDescribeMaps(t *testing.T) {
	if got, want := describeMaps(mapDesc{typ: mapTypeRingBuf, name: "a"}, 2), `ring buffer "a" and 2 more maps`; got != want {
		t.Errorf("describeMaps = %q, want %q", got, want)
	}
	if got, want := describeMaps(mapDesc{typ: mapTypePerfEventArray, name: "events"}, 0), `perf event array "events"`; got != want {
		t.Errorf("describeMaps = %q, want %q", got, want)
	}
}
