// SPDX-License-Identifier: Apache-2.0

package owner

// The BPF map a reader reads: the checks on it, the map file the reader
// fills a perf event array's slots through, and the claim that makes one
// reader per map in this process.

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"sync"
	"syscall"

	"github.com/perfbuf/perfbuf/internal/kernel"
	"golang.org/x/sys/unix"
)

// Map is a BPF map to read: the root's Map (perfbuf.Map).
type Map interface {
	FileDescriptor() int
}

// checkMap checks that fd is a perf event array, a BPF ring buffer or an
// array of maps (of ring buffers, which openRingBufs checks) and returns its
// info.
func checkMap(fd int) (mapDesc, error) {
	if fd < 0 {
		// What a nil *ebpf.Map (coll.Maps of a name it does not hold) or a
		// libbpf map not yet created returns.
		return mapDesc{}, fmt.Errorf("map fd %d: no map (a name the collection or module does not hold, or an object not loaded yet): %w", fd, syscall.EBADF)
	}
	// The kernel answers a closed fd with EBADFD in BPF_OBJ_GET_INFO_BY_FD
	// (since 6.x); ask fcntl first so that it is EBADF on every kernel.
	if _, err := unix.FcntlInt(uintptr(fd), unix.F_GETFD, 0); err != nil {
		return mapDesc{}, fmt.Errorf("map fd %d: %w", fd, err)
	}
	info, err := bpfMapInfo(fd, fd, ErrMapType)
	if err != nil {
		return mapDesc{}, err
	}
	if info.typ != mapTypePerfEventArray && info.typ != mapTypeRingBuf && info.typ != mapTypeArrayOfMaps {
		return mapDesc{}, fmt.Errorf("map %q has type %s (%d): %w",
			info.name, kernel.MapTypeName(info.typ), info.typ, ErrMapType)
	}
	return info, nil
}

// ownFD returns a descriptor of the reader's own for the caller's map
// descriptor fd (F_DUPFD_CLOEXEC): the same map, whatever becomes of fd. A
// map a reader uses after New returns is always one of these, closed at
// Close: the caller may close its descriptor (closing a libbpfgo module
// does; a garbage collector closes a dropped *ebpf.Map's), and another
// object may then get its number, which the reader must never touch.
// A closed fd fails with EBADF.
func ownFD(fd int) (int, error) {
	own, err := unix.FcntlInt(uintptr(fd), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return -1, fmt.Errorf("map fd %d: duplicate: %w", fd, err)
	}
	return own, nil
}

// ownMap is ownFD for the map that checkMap found behind fd (info): a
// duplicate of fd that is still that map. The caller's descriptor may be
// closed, and its number taken, during New (a garbage collector closes a
// dropped *ebpf.Map's at any time); a descriptor of another object then
// fails with EBADF rather than be read as the map checked.
func ownMap(fd int, info mapDesc) (int, error) {
	own, err := ownFD(fd)
	if err != nil {
		return -1, err
	}
	if now, err := mapInfo(own); err != nil || now.id != info.id || now.typ != info.typ {
		unix.Close(own)
		return -1, fmt.Errorf("map fd %d: no longer map %q (id %d), closed during the call: %w", fd, info.name, info.id, syscall.EBADF)
	}
	return own, nil
}

// slotFile returns the descriptor through which a reader fills the slots
// of the perf event array behind fd (info), and whether it is a map file
// of the reader's own. The kernel ties each slot to the map file that
// filled it, and when that file is released empties the slots it filled
// that still hold what it put there (perf_event_fd_array_release): a
// reader that fills its slots through a file of its own, and releases it
// at Close, empties its own slots and no other's. A duplicate of fd shares
// the caller's file, so the file comes from the map's pin (pin, as the
// Map's PinPath gives it: BPF_OBJ_GET needs only the pin's permissions),
// or from its ID (BPF_MAP_GET_FD_BY_ID needs CAP_SYS_ADMIN). Where
// neither opens the map, or the map has BPF_F_PRESERVE_ELEMS (the kernel
// then empties nothing at release), it is ownMap's duplicate, and the
// reader deletes its slots by key at Close.
func slotFile(fd int, info mapDesc, pin string) (_ int, own bool, _ error) {
	if info.flags&unix.BPF_F_PRESERVE_ELEMS == 0 {
		if pin != "" {
			if f, err := kernel.ObjGet(pin); err == nil {
				if sameMap(f, info) {
					return f, true, nil
				}
				unix.Close(f) // pinned anew since: another map
			}
		}
		if f, err := kernel.MapFDByID(info.id); err == nil {
			if sameMap(f, info) {
				return f, true, nil
			}
			unix.Close(f)
		}
	}
	f, err := ownMap(fd, info)
	return f, false, err
}

// sameMap reports whether fd is the map info describes.
func sameMap(fd int, info mapDesc) bool {
	now, err := mapInfo(fd)
	return err == nil && now.id == info.id && now.typ == info.typ
}

// pinPath returns where m is pinned, if m says (libbpfgo's *BPFMap has
// PinPath), or "".
func pinPath(m Map) string {
	if p, ok := m.(interface{ PinPath() string }); ok {
		return p.PinPath()
	}
	return ""
}

// bpfMapInfo returns the info of the BPF map behind fd, which errors call
// userFD (the caller's descriptor, of which fd may be a duplicate). A
// descriptor of another kind fails with notMap, naming what it is, and
// with the kernel's errno if it gave one; a closed one with EBADF.
func bpfMapInfo(fd, userFD int, notMap error) (mapDesc, error) {
	info, err := mapInfo(fd)
	// BPF_OBJ_GET_INFO_BY_FD answers for programs, links and BTF too, in
	// their own info struct, which would be read as a map's; for any other
	// descriptor it is EINVAL. /proc names the kind; without /proc, the
	// kernel tells a map from the rest (kernel.IsMap).
	kind := fdKind(fd)
	if kind == "" {
		if errors.Is(err, unix.EINVAL) {
			kind = fileKind(fd)
		} else if err == nil {
			if isMap, e := kernel.IsMap(fd); e == nil && !isMap {
				kind = fileKind(fd)
			}
		}
	}
	if kind != "" && kind != "anon_inode:bpf-map" {
		if err != nil {
			return mapDesc{}, fmt.Errorf("fd %d is not a BPF map (%s): %w: %w", userFD, kind, notMap, err)
		}
		return mapDesc{}, fmt.Errorf("fd %d is not a BPF map (%s): %w", userFD, kind, notMap)
	}
	if err != nil {
		return mapDesc{}, fmt.Errorf("map fd %d: %w", userFD, err)
	}
	return info, nil
}

// mapInfo returns what the kernel says of the map behind fd
// (kernel.GetMapInfo), as the readers keep it.
func mapInfo(fd int) (mapDesc, error) {
	i, err := kernel.GetMapInfo(fd)
	if err != nil {
		return mapDesc{}, err
	}
	return mapDesc{id: i.ID, typ: i.Type, keySize: i.KeySize, valueSize: i.ValueSize, maxEntries: i.MaxEntries, flags: i.Flags, name: i.Name}, nil
}

// procFD is where fdKind reads what a descriptor refers to.
var procFD = "/proc/self/fd/"

// fdKind returns what fd refers to as /proc/self/fd shows it
// ("anon_inode:bpf-map", "anon_inode:bpf-prog", "/dev/null"), or "" when
// /proc cannot tell.
func fdKind(fd int) string {
	kind, err := os.Readlink(procFD + strconv.Itoa(fd))
	if err != nil {
		return ""
	}
	return kind
}

// fileKind says what fd is, for an error, from its file system and type:
// what can be said without /proc.
func fileKind(fd int) string {
	var fs unix.Statfs_t
	if unix.Fstatfs(fd, &fs) == nil && fs.Type == unix.ANON_INODE_FS_MAGIC {
		return "an anonymous inode: an eventfd, epoll set, timerfd, perf event, BPF object or the like"
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return "of unknown kind"
	}
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFREG:
		return "a regular file"
	case unix.S_IFDIR:
		return "a directory"
	case unix.S_IFCHR:
		return "a character device"
	case unix.S_IFBLK:
		return "a block device"
	case unix.S_IFIFO:
		return "a pipe"
	case unix.S_IFSOCK:
		return "a socket"
	}
	return "of unknown kind"
}

// The BPF map types a reader checks for.
const (
	mapTypePerfEventArray = unix.BPF_MAP_TYPE_PERF_EVENT_ARRAY
	mapTypePerCPUArray    = unix.BPF_MAP_TYPE_PERCPU_ARRAY // a failure map's (failuremap.go)
	mapTypeArrayOfMaps    = unix.BPF_MAP_TYPE_ARRAY_OF_MAPS
	mapTypeRingBuf        = unix.BPF_MAP_TYPE_RINGBUF
)

type mapDesc struct {
	id         uint32 // the kernel's map ID: one per map, whatever the fd
	typ        uint32
	keySize    uint32
	valueSize  uint32
	maxEntries uint32
	flags      uint32 // map_flags: kernel.MapFlagRBOverwrite for a ring buffer in overwrite mode
	name       string
}

// String names the map by its kind and name, for errors: `perf event
// array "events"`, `ring buffer "events"`, `array of maps "rings"`.
func (d mapDesc) String() string {
	switch d.typ {
	case mapTypePerfEventArray:
		return fmt.Sprintf("perf event array %q", d.name)
	case mapTypeRingBuf:
		return fmt.Sprintf("ring buffer %q", d.name)
	case mapTypeArrayOfMaps:
		return fmt.Sprintf("array of maps %q", d.name)
	}
	return fmt.Sprintf("map %q", d.name)
}

// claims holds the IDs of the maps that this process reads, from openRings
// until close: a perf event array has one ring slot per CPU, so one reader.
var claims struct {
	sync.Mutex
	ids map[uint32]bool
}

// claimMap claims map id; it reports false if another reader holds it.
func claimMap(id uint32) bool {
	claims.Lock()
	defer claims.Unlock()
	if claims.ids[id] {
		return false
	}
	if claims.ids == nil {
		claims.ids = make(map[uint32]bool)
	}
	claims.ids[id] = true
	return true
}

func unclaimMap(id uint32) {
	claims.Lock()
	delete(claims.ids, id)
	claims.Unlock()
}
