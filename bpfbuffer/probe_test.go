// SPDX-License-Identifier: Apache-2.0

package bpfbuffer

import (
	"testing"

	"github.com/perfbuf/perfbuf/buflayout"
	"github.com/perfbuf/perfbuf/internal/probetest"
)

// Without CAP_BPF the probe cannot tell a kernel without ring buffers from
// a process without the privilege: libbpf answers "no" for both. Prepare
// with Any then fails naming CAP_BPF, with the errno kept, and never
// chooses a perf event array; a forced ring buffer says the same, not
// "the kernel has no ring buffers".
func TestProbeWithoutCapBPF(t *testing.T) {
	probetest.NeedsRestrictedBPF(t)
	wants := []buflayout.Kind{buflayout.Any, buflayout.RingBuf, buflayout.RingBufPerCPU}
	probetest.ChooseWithoutCapBPF(t, wants, func(want buflayout.Kind) (buflayout.Kind, error) {
		return buflayout.Choose(want, hasRingBuf, hasRingArray)
	})
}
