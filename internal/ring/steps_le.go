// SPDX-License-Identifier: Apache-2.0

//go:build !(s390x || ppc64 || mips || mips64)

package ring

// Where a record's header fields lie in the u64 that a step loads at its
// start, on a little-endian host (steps.go): a ring buffer's len is the
// low half; a perf_event_header's type the low half, its size the top 16
// bits.
const (
	// HeaderSizeShift places a perf record's size where its header holds it.
	HeaderSizeShift = 48

	stepsRingBufHMask = bpfRingBusyBit | bpfRingDiscardBit
	stepsPerfHMask    = 0xffff_0000_ffff_ffff // type and size
	stepsPerfType     = 9                     // PERF_RECORD_SAMPLE
)
