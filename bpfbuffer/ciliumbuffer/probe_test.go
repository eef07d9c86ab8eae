// SPDX-License-Identifier: Apache-2.0

package ciliumbuffer

import (
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/perfbuf/perfbuf/buflayout"
	"github.com/perfbuf/perfbuf/internal/probetest"
)

// probeChild marks the test binary run again by TestProbeWithoutCapBPF.
const probeChild = "PERFBUF_TEST_PROBE_CHILD"

// Without CAP_BPF, features.HaveMapType cannot tell whether the kernel
// has ring buffers: Prepare with Any, or forcing a ring buffer, fails
// naming CAP_BPF, with the errno kept, and never chooses a perf event
// array. The probe runs in a child process, as cilium/ebpf keeps a
// successful probe's answer for the process's life.
func TestProbeWithoutCapBPF(t *testing.T) {
	probetest.NeedsRestrictedBPF(t)
	if os.Getenv(probeChild) == "" {
		cmd := exec.Command(os.Args[0], "-test.run=^TestProbeWithoutCapBPF$", "-test.v", "-test.count=1")
		cmd.Env = append(os.Environ(), probeChild+"=1")
		out, err := cmd.CombinedOutput()
		t.Logf("child:\n%s", out)
		if err != nil || !strings.Contains(string(out), "--- PASS: TestProbeWithoutCapBPF") {
			t.Fatalf("child: %v", err)
		}
		return
	}
	wants := []buflayout.Kind{buflayout.Any, buflayout.RingBuf, buflayout.RingBufPerCPU}
	probetest.ChooseWithoutCapBPF(t, wants, func(want buflayout.Kind) (buflayout.Kind, error) {
		return buflayout.Choose(want, hasRingBuf, hasRingArray)
	})
}
