// SPDX-License-Identifier: Apache-2.0

package kernel

// The bpf(2) commands perfbuf makes on maps, each on the part of union
// bpf_attr the kernel reads for it, through one call (bpf below).

import (
	"fmt"
	"os"
	"unsafe"

	"golang.org/x/sys/unix"
)

// The parts of union bpf_attr (include/uapi/linux/bpf.h) that perfbuf's
// commands fill; x/sys/unix has no bpf_attr. The kernel reads as many bytes
// as the call passes and treats the rest of its union as zero. Pointers
// are held as unsafe.Pointer, not as integers, so that the garbage
// collector keeps what they point at, and updates them if a goroutine's
// stack moves before the call. Their sizes are checked in bpf_test.go.
type (
	// mapElemAttr: BPF_MAP_*_ELEM (map_fd, key, value or next_key, flags;
	// the pointers are __aligned_u64).
	mapElemAttr struct {
		mapFD uint32
		_     uint32
		key   unsafe.Pointer
		value unsafe.Pointer
		flags uint64
	}
	// objInfoAttr: BPF_OBJ_GET_INFO_BY_FD (the info struct: bpf_fd,
	// info_len, info as an __aligned_u64).
	objInfoAttr struct {
		fd      uint32
		infoLen uint32
		info    unsafe.Pointer
	}
	// getIDAttr: BPF_*_GET_FD_BY_ID (map_id in the union's first __u32,
	// next_id, open_flags).
	getIDAttr struct {
		id        uint32
		_         uint32 // next_id
		openFlags uint32
	}
	// objGetAttr: BPF_OBJ_GET (pathname as an __aligned_u64, bpf_fd,
	// file_flags).
	objGetAttr struct {
		pathname  unsafe.Pointer
		bpfFD     uint32
		fileFlags uint32
	}
)

// An unsafe.Pointer fills an __aligned_u64 only on 64-bit hosts, the ones
// perfbuf builds for.
var _ [unsafe.Sizeof(unsafe.Pointer(nil)) - 8]struct{}

// attr is the union bpf_attr parts that bpf takes.
type attr interface {
	mapElemAttr | objInfoAttr | getIDAttr | objGetAttr | mapCreateAttr | enableStatsAttr
}

// bpf makes the bpf(2) command cmd on a and returns what the kernel
// returns (a descriptor for the commands that open one). The kernel reads
// a, and the memory its pointers name, and writes there, during the call
// only.
func bpf[A attr](cmd uintptr, a *A) (int, error) {
	r, _, errno := unix.Syscall(unix.SYS_BPF, cmd, uintptr(unsafe.Pointer(a)), unsafe.Sizeof(*a))
	if errno != 0 {
		return -1, errno
	}
	return int(r), nil
}

// UpdateSlot stores the descriptor value at key of the array map fd
// (BPF_MAP_UPDATE_ELEM, BPF_ANY): for a perf event array, the perf event
// the kernel's outputs at key go to; for an array of maps, the inner map. The error is the kernel's errno,
// wrapped.
func UpdateSlot(fd int, key uint32, value int) error {
	v := uint32(value)
	a := mapElemAttr{
		mapFD: uint32(fd),
		key:   unsafe.Pointer(&key),
		value: unsafe.Pointer(&v),
		flags: unix.BPF_ANY,
	}
	if _, err := bpf(unix.BPF_MAP_UPDATE_ELEM, &a); err != nil {
		return fmt.Errorf("update map slot %d: %w", key, err)
	}
	return nil
}

// DeleteSlot empties key of the array map fd (BPF_MAP_DELETE_ELEM). An
// empty slot is ENOENT, wrapped.
func DeleteSlot(fd int, key uint32) error {
	a := mapElemAttr{mapFD: uint32(fd), key: unsafe.Pointer(&key)}
	if _, err := bpf(unix.BPF_MAP_DELETE_ELEM, &a); err != nil {
		return fmt.Errorf("delete map slot %d: %w", key, err)
	}
	return nil
}

// LookupPerCPU reads key of the per-CPU array fd into out
// (BPF_MAP_LOOKUP_ELEM): every possible CPU's value, in CPU order, each
// rounded up to 8 bytes. out must hold them all: the kernel writes that
// many bytes at &out[0], whatever len(out) is. An empty out is
// os.ErrInvalid; the kernel's errno comes wrapped.
func LookupPerCPU(fd int, key uint32, out []uint64) error {
	if len(out) == 0 {
		return fmt.Errorf("look up per-cpu slot %d: no room: %w", key, os.ErrInvalid)
	}
	a := mapElemAttr{mapFD: uint32(fd), key: unsafe.Pointer(&key), value: unsafe.Pointer(&out[0])}
	if _, err := bpf(unix.BPF_MAP_LOOKUP_ELEM, &a); err != nil {
		return fmt.Errorf("look up per-cpu slot %d: %w", key, err)
	}
	return nil
}

// UpdatePerCPU writes vals, every possible CPU's value in CPU order as
// LookupPerCPU reads them, to key of the per-CPU array fd
// (BPF_MAP_UPDATE_ELEM, BPF_ANY). The kernel reads as many bytes as it
// holds values, whatever len(vals) is. An empty vals is os.ErrInvalid; the
// kernel's errno comes wrapped.
func UpdatePerCPU(fd int, key uint32, vals []uint64) error {
	if len(vals) == 0 {
		return fmt.Errorf("update per-cpu slot %d: no values: %w", key, os.ErrInvalid)
	}
	a := mapElemAttr{mapFD: uint32(fd), key: unsafe.Pointer(&key), value: unsafe.Pointer(&vals[0]), flags: unix.BPF_ANY}
	if _, err := bpf(unix.BPF_MAP_UPDATE_ELEM, &a); err != nil {
		return fmt.Errorf("update per-cpu slot %d: %w", key, err)
	}
	return nil
}

// InnerMapID reads slot key of the array of maps fd (BPF_MAP_LOOKUP_ELEM):
// from user space, the ID of the map in the slot. An empty slot is ENOENT,
// wrapped.
func InnerMapID(fd int, key uint32) (uint32, error) {
	var id uint32
	a := mapElemAttr{mapFD: uint32(fd), key: unsafe.Pointer(&key), value: unsafe.Pointer(&id)}
	if _, err := bpf(unix.BPF_MAP_LOOKUP_ELEM, &a); err != nil {
		return 0, fmt.Errorf("look up inner map of slot %d: %w", key, err)
	}
	return id, nil
}

// MapFDByID opens the map with ID id (BPF_MAP_GET_FD_BY_ID, which needs
// CAP_SYS_ADMIN: EPERM without it, wrapped): a descriptor, close-on-exec
// as every bpf(2) descriptor, that the caller closes.
func MapFDByID(id uint32) (int, error) {
	a := getIDAttr{id: id}
	fd, err := bpf(unix.BPF_MAP_GET_FD_BY_ID, &a)
	if err != nil {
		return -1, fmt.Errorf("open map id %d: %w", id, err)
	}
	return fd, nil
}

// ObjGet opens the BPF object pinned at path (BPF_OBJ_GET): a descriptor
// of a file of its own, close-on-exec, that the caller closes. It needs
// no capability, only the pin's file permissions: EACCES without them,
// ENOENT for no pin, wrapped.
func ObjGet(path string) (int, error) {
	p, err := unix.BytePtrFromString(path)
	if err != nil {
		return -1, fmt.Errorf("open pin %s: %w", path, err)
	}
	a := objGetAttr{pathname: unsafe.Pointer(p)}
	fd, err := bpf(unix.BPF_OBJ_GET, &a)
	if err != nil {
		return -1, fmt.Errorf("open pin %s: %w", path, err)
	}
	return fd, nil
}

// IsMap reports whether fd is a BPF map, by a command that only maps
// answer: BPF_MAP_LOOKUP_ELEM with no key and no value. The kernel refuses a
// descriptor that is not a map with EINVAL (__bpf_map_get), before it looks
// at the key: then IsMap returns false. A map answers otherwise, and nothing
// is read or changed (EFAULT for the missing key or value, ENOTSUPP for a
// ring buffer, ENOENT for an empty queue, EPERM for a map not readable
// through fd). BPF_OBJ_GET_INFO_BY_FD cannot tell: it answers for programs,
// links and BTF objects too. A closed fd is EBADF (EBADFD), wrapped.
func IsMap(fd int) (bool, error) {
	a := mapElemAttr{mapFD: uint32(fd)}
	_, err := bpf(unix.BPF_MAP_LOOKUP_ELEM, &a)
	switch err {
	case unix.EINVAL:
		return false, nil
	case unix.EBADF, unix.EBADFD:
		return false, fmt.Errorf("look up map element: %w", err)
	}
	return true, nil
}

// mapInfo is the head of struct bpf_map_info (include/uapi/linux/bpf.h),
// up to its name: the fields perfbuf reads. x/sys/unix has no
// bpf_map_info. BPF_OBJ_GET_INFO_BY_FD fills as many bytes as it is given
// (the fields after name came in later kernels), so a head is enough.
type mapInfo struct {
	typ        uint32
	id         uint32
	keySize    uint32
	valueSize  uint32
	maxEntries uint32
	mapFlags   uint32
	name       [unix.BPF_OBJ_NAME_LEN]byte
}

// MapInfo is what the kernel says of a BPF map.
type MapInfo struct {
	ID         uint32 // the kernel's map ID: one per map, whatever the descriptor
	Type       uint32 // a BPF_MAP_TYPE_* (MapTypeName names it)
	KeySize    uint32
	ValueSize  uint32
	MaxEntries uint32
	Flags      uint32
	Name       string
}

// GetMapInfo returns the info of the map behind fd (BPF_OBJ_GET_INFO_BY_FD).
// The kernel answers for programs, links and BTF objects too, in their own
// info struct, which this would read as a map's: the caller tells them
// apart (internal/owner's maps.go asks /proc, or IsMap). The kernel's errno comes wrapped:
// EBADF for a closed descriptor (EBADFD on some kernels), EINVAL for a
// descriptor that is not a BPF object.
func GetMapInfo(fd int) (MapInfo, error) {
	var info mapInfo
	a := objInfoAttr{fd: uint32(fd), infoLen: uint32(unsafe.Sizeof(info)), info: unsafe.Pointer(&info)}
	if _, err := bpf(unix.BPF_OBJ_GET_INFO_BY_FD, &a); err != nil {
		return MapInfo{}, fmt.Errorf("get map info: %w", err)
	}
	name := info.name[:]
	for i, c := range name {
		if c == 0 {
			name = name[:i]
			break
		}
	}
	return MapInfo{
		ID:         info.id,
		Type:       info.typ,
		KeySize:    info.keySize,
		ValueSize:  info.valueSize,
		MaxEntries: info.maxEntries,
		Flags:      info.mapFlags,
		Name:       string(name),
	}, nil
}
