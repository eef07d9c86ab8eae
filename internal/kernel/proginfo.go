// SPDX-License-Identifier: Apache-2.0

package kernel

import (
	"fmt"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// progInfo is struct bpf_prog_info (include/uapi/linux/bpf.h) up to
// recursion_misses: run_time_ns and run_cnt at offsets 192 and 200 (since
// 5.1), recursion_misses at 208 (since 5.12). The fields before them are
// not read here. An older kernel fills fewer bytes and leaves the rest
// zero.
type progInfo struct {
	_               [192]byte
	runTimeNs       uint64
	runCnt          uint64
	recursionMisses uint64
}

// ProgStats is what the kernel counts of a BPF program's runs.
type ProgStats struct {
	// RunTime and Runs are the time the program ran and its runs, counted
	// only while BPF_ENABLE_STATS (or the sysctl
	// kernel.bpf_stats_enabled) is on: EnableRunStats.
	RunTime time.Duration
	Runs    uint64
	// RecursionMisses is how many times the kernel skipped the program
	// because a BPF program was already running on that CPU: runs that
	// the program never saw. Always counted, from 5.12.
	RecursionMisses uint64
	// CountsMisses says that the kernel has RecursionMisses (5.12): its
	// bpf_prog_info reaches the field. An older one leaves it 0.
	CountsMisses bool
}

// Sub returns s less an earlier reading o.
func (s ProgStats) Sub(o ProgStats) ProgStats {
	return ProgStats{RunTime: s.RunTime - o.RunTime, Runs: s.Runs - o.Runs, RecursionMisses: s.RecursionMisses - o.RecursionMisses, CountsMisses: s.CountsMisses}
}

// GetProgStats returns the stats of the BPF program behind fd
// (BPF_OBJ_GET_INFO_BY_FD).
func GetProgStats(fd int) (ProgStats, error) {
	var info progInfo
	a := objInfoAttr{fd: uint32(fd), infoLen: uint32(unsafe.Sizeof(info)), info: unsafe.Pointer(&info)}
	if _, err := bpf(unix.BPF_OBJ_GET_INFO_BY_FD, &a); err != nil {
		return ProgStats{}, fmt.Errorf("get prog info: %w", err)
	}
	// The kernel writes back in infoLen how much of info it filled.
	counts := a.infoLen >= uint32(unsafe.Sizeof(info))
	return ProgStats{RunTime: time.Duration(info.runTimeNs), Runs: info.runCnt, RecursionMisses: info.recursionMisses, CountsMisses: counts}, nil
}

// ProgRecursionMisses returns GetProgStats' RecursionMisses.
func ProgRecursionMisses(fd int) (uint64, error) {
	s, err := GetProgStats(fd)
	return s.RecursionMisses, err
}

// enableStatsAttr is union bpf_attr's enable_stats.
type enableStatsAttr struct {
	typ uint32 // BPF_STATS_RUN_TIME
}

// bpfEnableStats and bpfStatsRunTime are BPF_ENABLE_STATS (since 5.8) and
// BPF_STATS_RUN_TIME (include/uapi/linux/bpf.h).
const (
	bpfEnableStats  = 32
	bpfStatsRunTime = 0
)

// EnableRunStats makes the kernel count every BPF program's run time and
// runs (ProgStats) until the descriptor it returns is closed. It needs
// CAP_SYS_ADMIN. Counting costs every program two clock reads a run.
func EnableRunStats() (fd int, err error) {
	a := enableStatsAttr{typ: bpfStatsRunTime}
	r, err := bpf(bpfEnableStats, &a)
	if err != nil {
		return -1, fmt.Errorf("enable BPF run stats: %w", err)
	}
	return int(r), nil
}
