// SPDX-License-Identifier: Apache-2.0

package ringtest

// Payloads the fake rings' tests write and check, the eventfds that stand
// in for their descriptors, the count of the process's descriptors, and
// facts of the test binary.

import (
	"encoding/binary"
	"os"
	"runtime/debug"
	"testing"

	"golang.org/x/sys/unix"
)

// Pattern returns n bytes that differ with seed and position.
func Pattern(n int, seed byte) []byte {
	p := make([]byte, n)
	for i := range p {
		p[i] = seed + byte(i*7)
	}
	return p
}

// RacePattern is the byte pattern the race tests' samples carry; sample seq
// carries the slice that starts at RacePatternOff(seq), at most RaceMaxBody
// bytes.
var RacePattern = func() []byte {
	p := make([]byte, 4096)
	x := uint64(0x9e3779b97f4a7c15)
	for i := range p {
		x ^= x << 13
		x ^= x >> 7
		x ^= x << 17
		p[i] = byte(x)
	}
	return p
}()

// RacePatternOff is where sample seq's slice of RacePattern starts.
func RacePatternOff(seq uint64) uint64 { return (seq * 2654435761) % 2048 }

// RaceMaxBody bounds the race tests' pattern bytes in a sample.
const RaceMaxBody = 1000

// HostBigEndian reports a big-endian host: the kernel writes records in the
// host's byte order.
var HostBigEndian = binary.NativeEndian.Uint16([]byte{0, 1}) == 1

// RaceEnabled reports whether the test binary was built with -race.
func RaceEnabled() bool {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return false
	}
	for _, s := range bi.Settings {
		if s.Key == "-race" {
			return s.Value == "true"
		}
	}
	return false
}

// Sink keeps the payload sums alive so that the compiler cannot drop the reads.
var Sink uint64

// Sum reads every byte of p: 8 bytes at a time (four words per step while it can),
// then the tail bytes. It stands for a consumer that looks at the whole payload.
func Sum(p []byte) uint64 {
	var s0, s1 uint64
	for len(p) >= 32 {
		s0 += binary.NativeEndian.Uint64(p[0:8]) + binary.NativeEndian.Uint64(p[8:16])
		s1 += binary.NativeEndian.Uint64(p[16:24]) + binary.NativeEndian.Uint64(p[24:32])
		p = p[32:]
	}
	for len(p) >= 8 {
		s0 += binary.NativeEndian.Uint64(p)
		p = p[8:]
	}
	if len(p) >= 4 {
		s1 += uint64(binary.NativeEndian.Uint32(p))
		p = p[4:]
	}
	for _, c := range p {
		s0 += uint64(c)
	}
	return s0 + s1
}

// U32 is n as the kernel stores a record header's length: in the host's
// byte order.
func U32(n uint32) []byte { return binary.NativeEndian.AppendUint32(nil, n) }

// Keyed returns a sample of size bytes (16 at least) that carries key in
// its first 8 bytes and seq in the next 8, then bytes that differ with seq
// and position: the payload of the readers' tests over fake rings.
func Keyed(key, seq uint64, size int) []byte {
	p := make([]byte, max(size, 16))
	binary.NativeEndian.PutUint64(p, key)
	binary.NativeEndian.PutUint64(p[8:], seq)
	for i := 16; i < len(p); i++ {
		p[i] = byte(seq) + byte(i)
	}
	return p
}

// EventFD returns a non-blocking eventfd, closed when the test ends: it
// stands in for a ring's descriptor, readable once a producer wakes it.
func EventFD(tb testing.TB) int {
	tb.Helper()
	fd, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { unix.Close(fd) })
	return fd
}

// OpenFDs returns how many descriptors the process holds: a test compares
// the counts before and after to find a descriptor left open.
func OpenFDs(tb testing.TB) int {
	tb.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		tb.Fatal(err)
	}
	return len(ents)
}

// Signal makes the eventfd fd readable, as the kernel's wakeup makes a
// ring's descriptor readable.
func Signal(fd int) {
	var one [8]byte
	binary.NativeEndian.PutUint64(one[:], 1)
	unix.Write(fd, one[:])
}
