// SPDX-License-Identifier: Apache-2.0

// Package probetest is the test of a loader's ring buffer probe in a
// process without CAP_BPF, which bpfbuffer's and ciliumbuffer's tests
// share: each passes its own probe.
package probetest

import (
	"errors"
	"fmt"
	"os"
	"runtime"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// ChooseWithoutCapBPF checks that choose (a loader's buflayout.Choose
// over its own probes), called for each of wants (the kinds that need a
// ring buffer: Any, RingBuf, RingBufPerCPU) on a thread without CAP_BPF,
// CAP_PERFMON and CAP_SYS_ADMIN, fails with an error that matches
// os.ErrPermission, not errors.ErrUnsupported, and names CAP_BPF: the
// probe cannot tell a kernel without ring buffers from a process without
// the privilege, so it never chooses a perf event array. The
// capabilities are dropped from one locked thread, which the runtime ends
// with its goroutine. The kind is a type parameter so that this package,
// below buflayout, does not import it.
func ChooseWithoutCapBPF[K any](t *testing.T, wants []K, choose func(K) (K, error)) {
	t.Helper()
	type result struct {
		kind K
		err  error
	}
	for _, want := range wants {
		done := make(chan result)
		go func() {
			runtime.LockOSThread() // never unlocked: the thread ends with the goroutine
			if err := dropCapabilities(unix.CAP_BPF, unix.CAP_PERFMON, unix.CAP_SYS_ADMIN); err != nil {
				done <- result{err: err}
				return
			}
			kind, err := choose(want)
			done <- result{kind, err}
		}()
		res := <-done
		if res.err == nil || !errors.Is(res.err, os.ErrPermission) || errors.Is(res.err, errors.ErrUnsupported) || !strings.Contains(res.err.Error(), "CAP_BPF") {
			t.Errorf("Choose %v without CAP_BPF = %v, %v; want EPERM naming CAP_BPF", want, res.kind, res.err)
		}
		t.Logf("%v: %v", want, res.err)
	}
}

// NeedsRestrictedBPF skips the test where the kernel lets a process
// without CAP_BPF create ring buffers (kernel.unprivileged_bpf_disabled
// 0): its probe succeeds there, as it should.
func NeedsRestrictedBPF(t *testing.T) {
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
