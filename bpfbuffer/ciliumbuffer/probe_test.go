// SPDX-License-Identifier: Apache-2.0

package ciliumbuffer

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"testing"

	"github.com/perfbuf/perfbuf/buflayout"
	"golang.org/x/sys/unix"
)

// probeChild marks the test binary run again by TestProbeWithoutCapBPF.
const probeChild = "PERFBUF_TEST_PROBE_CHILD"

// Without CAP_BPF, features.HaveMapType cannot tell whether the kernel
// has ring buffers: Prepare with Any, or forcing a ring buffer, fails
// naming CAP_BPF, with the errno kept, and never chooses a perf event
// array. The probe runs in a child process, as cilium/ebpf keeps a
// successful probe's answer for the process's life; there, the
// capabilities are dropped from one locked thread, which the runtime ends
// with the goroutine.
func TestProbeWithoutCapBPF(t *testing.T) {
	needsRestrictedBPF(t)
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
	type result struct {
		kind Kind
		err  error
	}
	for _, want := range []Kind{Any, RingBuf, RingBufPerCPU} {
		done := make(chan result)
		go func() {
			runtime.LockOSThread() // never unlocked: the thread ends with the goroutine
			if err := dropCapabilities(unix.CAP_BPF, unix.CAP_PERFMON, unix.CAP_SYS_ADMIN); err != nil {
				done <- result{err: err}
				return
			}
			kind, err := buflayout.Choose(want, hasRingBuf)
			done <- result{kind, err}
		}()
		res := <-done
		if res.err == nil || !errors.Is(res.err, os.ErrPermission) || errors.Is(res.err, errors.ErrUnsupported) || !strings.Contains(res.err.Error(), "CAP_BPF") {
			t.Errorf("Choose %v without CAP_BPF = %v, %v; want EPERM naming CAP_BPF", want, res.kind, res.err)
		}
		t.Logf("%v: %v", want, res.err)
	}
}

// needsRestrictedBPF skips the test where the kernel lets a process
// without CAP_BPF create ring buffers (kernel.unprivileged_bpf_disabled
// 0): its probe succeeds there, as it should.
func needsRestrictedBPF(t *testing.T) {
	t.Helper()
	b, err := os.ReadFile("/proc/sys/kernel/unprivileged_bpf_disabled")
	if err != nil {
		t.Skipf("unprivileged_bpf_disabled: %v", err)
	}
	if v := strings.TrimSpace(string(b)); v == "0" {
		t.Skip("kernel.unprivileged_bpf_disabled is 0: a process without CAP_BPF creates ring buffers")
	}
}

// dropCapabilities clears caps from the calling thread's effective and
// permitted sets (capset(2) acts on one thread): the caller locks the
// thread and never unlocks it.
func dropCapabilities(caps ...int) error {
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if err := unix.Capget(&hdr, &data[0]); err != nil {
		return fmt.Errorf("capget: %w", err)
	}
	for _, c := range caps {
		data[c/32].Effective &^= 1 << (c % 32)
		data[c/32].Permitted &^= 1 << (c % 32)
	}
	if err := unix.Capset(&hdr, &data[0]); err != nil {
		return fmt.Errorf("capset: %w", err)
	}
	return nil
}
