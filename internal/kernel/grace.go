// SPDX-License-Identifier: Apache-2.0

package kernel

// An RCU grace period waited for from user space: what Pause, Close and a
// Snapshot of a running ring wait for, so that no BPF program and no perf
// output that was running when they looked is running any more. Two system
// calls wait for one:
//
//   - An update of an array or hash of maps from the syscall side: since
//     4.20 map_update_elem and map_delete_elem call maybe_wait_bpf_programs
//     (kernel/bpf/syscall.c), synchronize_rcu() for those two map types
//     (since 6.8 only once the update or delete succeeded). It waits on
//     every supported kernel (5.10 on), nohz_full or not, with any number
//     of CPUs online; it needs bpf(2)'s privilege (CAP_BPF), as a reader
//     does. WaitWriters takes it first.
//   - membarrier(MEMBARRIER_CMD_GLOBAL) is synchronize_rcu() too
//     (kernel/sched/membarrier.c) and needs no privilege, but a kernel with
//     nohz_full CPUs refuses it (EINVAL), and with one CPU online it
//     returns at once, without waiting for a program preempted inside its
//     read-side section (preemptible kernels). WaitWriters takes it when
//     the array of maps cannot be made or updated.
//
// Both cost one grace period, and block only the caller (BenchmarkGrace
// compares them).
//
// Neither waits for sleepable BPF programs: they run under
// rcu_read_lock_trace(), which only an RCU Tasks Trace grace period
// outlasts, and maybe_wait_bpf_programs waits for the non-sleepable
// programs only (its comment says so since 6.8, through 6.18: the wait for
// sleepable ones could be very long). An output from a sleepable program may still be
// writing when WaitWriters returns.

import (
	"fmt"
	"sync"

	"golang.org/x/sys/unix"
)

// MEMBARRIER_CMD_QUERY and MEMBARRIER_CMD_GLOBAL
// (include/uapi/linux/membarrier.h), which x/sys/unix lacks.
const (
	membarrierCmdQuery  = 0
	membarrierCmdGlobal = 1 << 0
)

// membarrier makes membarrier(2) command cmd and returns what the kernel
// returns (the mask of commands, for MEMBARRIER_CMD_QUERY). A variable:
// grace_test.go refuses the command as a nohz_full kernel does.
var membarrier = func(cmd int) (int, error) {
	r, _, errno := unix.Syscall(unix.SYS_MEMBARRIER, uintptr(cmd), 0, 0)
	if errno != 0 {
		return 0, errno
	}
	return int(r), nil
}

// WaitWriters returns once every BPF program and perf output running on any
// CPU when it was called has finished, and their stores are visible to the
// caller: it waits for an RCU grace period (synchronize_rcu) through an
// update of perfbuf's array of maps, or through membarrier where that
// cannot be made (see the top of this file). Every perf output runs with
// preemption off (perf_output_get_handle .. perf_output_put_handle) and
// every BPF program but the sleepable ones inside an RCU read-side section,
// which a grace period outlasts. It takes a grace period's time and no
// CPU. The error, when neither call can wait (no CAP_BPF on a nohz_full
// kernel), wraps both errnos.
func WaitWriters() error {
	mapErr := mapGrace()
	if mapErr == nil {
		return nil
	}
	if _, err := membarrier(membarrierCmdGlobal); err != nil {
		return fmt.Errorf("wait for ring writers: %w; membarrier global: %w", mapErr, err)
	}
	return nil
}

// CanWaitWriters reports whether WaitWriters waits for a grace period on
// this kernel: the array of maps can be made, or membarrier's query lists
// MEMBARRIER_CMD_GLOBAL (it leaves it out exactly when the command would
// fail).
func CanWaitWriters() bool {
	if _, _, err := graceMaps.fds(); err == nil {
		return true
	}
	mask, err := membarrier(membarrierCmdQuery)
	return err == nil && mask&membarrierCmdGlobal != 0
}

// graceArray is an array of maps of one slot and the array that fills
// it, made on first use and kept open for the process's life: an update of
// that slot is a grace period (mapGrace).
type graceArray struct {
	mu           sync.Mutex
	outer, inner int // 0: not made yet
}

// graceMaps is the process's graceArray.
var graceMaps graceArray

// fds returns the array of maps and its inner array, making them on first
// use. A failure is not kept: the next call tries again.
func (g *graceArray) fds() (outer, inner int, err error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.outer > 0 {
		return g.outer, g.inner, nil
	}
	inner, err = createMap(mapCreateAttr{mapType: unix.BPF_MAP_TYPE_ARRAY, keySize: 4, valueSize: 4, maxEntries: 1}, "perfbuf_grace_i")
	if err != nil {
		return -1, -1, fmt.Errorf("create array for the grace period's array of maps: %w", err)
	}
	outer, err = CreateArrayOfMaps("perfbuf_grace", 1, inner)
	if err != nil {
		unix.Close(inner)
		return -1, -1, err
	}
	g.outer, g.inner = outer, inner
	return outer, inner, nil
}

// mapGrace waits for an RCU grace period by storing the inner array in
// the slot of graceMaps' array of maps from the syscall side: the update
// succeeds every time (the same map again), and the kernel then waits
// (maybe_wait_bpf_programs, see the top of this file). The error wraps
// the kernel's errno (EPERM without CAP_BPF).
func mapGrace() error {
	outer, inner, err := graceMaps.fds()
	if err != nil {
		return err
	}
	if err := UpdateSlot(outer, 0, inner); err != nil {
		return fmt.Errorf("update array of maps for a grace period: %w", err)
	}
	return nil
}
