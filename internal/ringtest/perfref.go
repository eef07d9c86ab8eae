// SPDX-License-Identifier: Apache-2.0

package ringtest

// A reference reading of the perf ring's format, and perf rings that no
// kernel writes: what the parser's tests and the readers' above it check
// against.

import (
	"encoding/binary"

	"golang.org/x/sys/unix"
)

// PerfRef is a record as the reference parser reads it.
type PerfRef struct {
	Type      uint32 // perf_event_header.type
	Pos, Next uint64
	Payload   []byte // a sample's, copied
	Lost      uint64 // a lost record's count
}

// ParsePerf is a slow, independent reading of a perf ring's data area mem:
// byte by byte with explicit wrapping. It returns the records from tail up
// to head, of every type, and, if something is corrupt (a position or a
// record), the position where reading stops.
func ParsePerf(mem []byte, tail, head uint64) (recs []PerfRef, corruptAt uint64, corrupt bool) {
	size := uint64(len(mem))
	at := func(pos uint64) byte { return mem[pos%size] }
	// word reads n bytes at pos as an unsigned integer in the host's byte
	// order, which the kernel writes records in.
	word := func(pos uint64, n int) uint64 {
		var v uint64
		for i := range n {
			b := uint64(at(pos + uint64(i)))
			if HostBigEndian {
				v = v<<8 | b
			} else {
				v |= b << (8 * i)
			}
		}
		return v
	}
	u16 := func(pos uint64) uint64 { return word(pos, 2) }
	u32 := func(pos uint64) uint64 { return word(pos, 4) }
	u64 := func(pos uint64) uint64 { return word(pos, 8) }

	if int64(head-tail) < 0 || head-tail > size || head%8 != 0 {
		return nil, tail, true
	}
	for pos := tail; pos != head; {
		if pos%8 != 0 {
			return recs, pos, true
		}
		typ, n := u32(pos), u16(pos+6)
		if n == 0 || n%8 != 0 || n > head-pos {
			return recs, pos, true
		}
		r := PerfRef{Type: uint32(typ), Pos: pos, Next: pos + n}
		switch typ {
		case unix.PERF_RECORD_SAMPLE:
			if n < 16 || u32(pos+8)+12 > n {
				return recs, pos, true
			}
			r.Payload = make([]byte, u32(pos+8))
			for i := range r.Payload {
				r.Payload[i] = at(pos + 12 + uint64(i))
			}
		case unix.PERF_RECORD_LOST:
			if n < 24 {
				return recs, pos, true
			}
			r.Lost = u64(pos + 16)
		}
		recs = append(recs, r)
		pos += n
	}
	return recs, 0, false
}

// PerfCorrupt is a 1024-byte perf ring holding records no kernel writes.
type PerfCorrupt struct {
	Name   string
	At     uint64   // ring offset where the records start
	Recs   [][]byte // good records, then the bad one
	Reason string   // what the reader's CorruptError says
}

// PerfCorrupts are the corrupt records the perf ring's parser knows.
func PerfCorrupts() []PerfCorrupt {
	sample := func(n uint32, size uint16) []byte {
		body := make([]byte, int(size)-8)
		binary.NativeEndian.PutUint32(body, n)
		return PerfRecord(unix.PERF_RECORD_SAMPLE, size, body)
	}
	return []PerfCorrupt{
		{"size 0", 0, [][]byte{PerfRecord(9, 0, make([]byte, 8))}, "record size 0"},
		{"size not multiple of 8", 0, [][]byte{PerfRecord(9, 12, make([]byte, 8))}, "not a multiple of 8"},
		{"size larger than ring", 0, [][]byte{PerfRecord(99, 2048, make([]byte, 8))}, "larger than the 1024-byte ring"},
		{"size past head", 0, [][]byte{PerfRecord(99, 32, make([]byte, 8))}, "past the head"},
		{"sample size does not fit", 0, [][]byte{sample(21, 32)}, "sample size 21 does not fit record size 32"},
		{"sample over 64 KiB", 0, [][]byte{sample(70000, 32)}, "overflowed the u16"},
		{"sample without size", 0, [][]byte{PerfRecord(9, 8, nil)}, "too short for its size field"},
		{"lost record short", 0, [][]byte{PerfRecord(2, 16, make([]byte, 8))}, "lost record size 16 shorter than 24"},
		{"after good records", 48, [][]byte{PerfSample(nil), PerfSample(make([]byte, 20)), PerfRecord(9, 0, make([]byte, 8))}, "record size 0"},
		{"wrapped sample size", 1024 - 8, [][]byte{sample(9, 16)}, "sample size 9 does not fit"},
	}
}
