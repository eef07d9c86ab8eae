package kernel

// The bpf(2) map commands, on the attribute the kernel reads for them.

import (
	"fmt"
	"unsafe"

	"golang.org/x/sys/unix"
)

// mapElemAttr is the part of union bpf_attr that BPF_MAP_*_ELEM read
// (include/uapi/linux/bpf.h: map_fd, key, value, flags; the pointers are
// __aligned_u64). x/sys/unix has no bpf_attr. The pointers are held as
// unsafe.Pointer, not as integers, so that the garbage collector keeps
// what they point at, and updates them if a goroutine's stack moves
// before the call.
type mapElemAttr struct {
	mapFD uint32
	_     uint32
	key   unsafe.Pointer
	value unsafe.Pointer
	flags uint64
}

// An unsafe.Pointer fills an __aligned_u64 only on 64-bit hosts, the ones
// perfbuf builds for.
var _ [unsafe.Sizeof(unsafe.Pointer(nil)) - 8]struct{}

// bpf makes the bpf(2) command cmd on attr. The kernel reads attr, and the
// memory its pointers name, during the call only.
func bpf(cmd uintptr, attr *mapElemAttr) error {
	_, _, errno := unix.Syscall(unix.SYS_BPF, cmd, uintptr(unsafe.Pointer(attr)), unsafe.Sizeof(*attr))
	if errno != 0 {
		return errno
	}
	return nil
}

// UpdateSlot stores the descriptor value at key of the array map fd
// (BPF_MAP_UPDATE_ELEM, BPF_ANY): for a perf event array, the perf event
// the kernel's outputs at key go to. The error is the kernel's errno,
// wrapped.
func UpdateSlot(fd int, key uint32, value int) error {
	v := uint32(value)
	attr := mapElemAttr{
		mapFD: uint32(fd),
		key:   unsafe.Pointer(&key),
		value: unsafe.Pointer(&v),
		flags: unix.BPF_ANY,
	}
	if err := bpf(unix.BPF_MAP_UPDATE_ELEM, &attr); err != nil {
		return fmt.Errorf("update map slot %d: %w", key, err)
	}
	return nil
}

// DeleteSlot empties key of the array map fd (BPF_MAP_DELETE_ELEM). An
// empty slot is ENOENT, wrapped.
func DeleteSlot(fd int, key uint32) error {
	attr := mapElemAttr{mapFD: uint32(fd), key: unsafe.Pointer(&key)}
	if err := bpf(unix.BPF_MAP_DELETE_ELEM, &attr); err != nil {
		return fmt.Errorf("delete map slot %d: %w", key, err)
	}
	return nil
}
