// SPDX-License-Identifier: Apache-2.0

//go:build s390x || ppc64 || mips || mips64

package ring

// Where a record's header fields lie in the u64 that a step loads at its
// start, on a big-endian host (steps.go): a ring buffer's len is the high
// half; a perf_event_header's type the high half, its size the low 16
// bits.
const (
	// HeaderSizeShift places a perf record's size where its header holds it.
	HeaderSizeShift = 0

	stepsRingBufHMask = (bpfRingBusyBit | bpfRingDiscardBit) << 32
	stepsPerfHMask    = 0xffff_ffff_0000_ffff // type and size
	stepsPerfType     = 9 << 32               // PERF_RECORD_SAMPLE
)
