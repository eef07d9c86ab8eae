// SPDX-License-Identifier: Apache-2.0

package kernel

import (
	"fmt"
	"unsafe"

	"golang.org/x/sys/unix"
)

// progInfo is struct bpf_prog_info (include/uapi/linux/bpf.h) up to
// recursion_misses, at offset 208 since 5.12: the fields before it are
// not read here. An older kernel fills fewer bytes and leaves it zero.
type progInfo struct {
	_               [208]byte
	recursionMisses uint64
}

// ProgRecursionMisses returns how many times the kernel skipped the BPF
// program behind fd because a BPF program was already running on that CPU
// (bpf_prog_info.recursion_misses): runs that the program never saw.
func ProgRecursionMisses(fd int) (uint64, error) {
	var info progInfo
	a := objInfoAttr{fd: uint32(fd), infoLen: uint32(unsafe.Sizeof(info)), info: unsafe.Pointer(&info)}
	if _, err := bpf(unix.BPF_OBJ_GET_INFO_BY_FD, &a); err != nil {
		return 0, fmt.Errorf("get prog info: %w", err)
	}
	return info.recursionMisses, nil
}
