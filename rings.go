package perfbuf

// Opening the rings of a perf event array: the checks on the map, the claim
// that makes one reader per map in this process, libbpf's perf_buffer, and
// the pure-Go view of each ring. PerfBuffer and Reader each own a rings.

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"
)

// rings are the per-CPU rings of one perf event array, opened through
// libbpf's perf_buffer__new_raw on the CPUs perf_buffer__new would choose.
type rings struct {
	c     *cBuffer
	mapID uint32       // claimed in claims until close
	cpus  []int32      // cpus[i] is the CPU behind buffer index i
	raw   []*RawBuffer // the owner's view of ring i
	fds   []int        // ring i's perf event descriptor

	failures *failureMap // Options.FailureMap, or nil; closed with the rings
}

// openRings checks m and failures (nil for none) and opens m's rings with
// cfg. Errors: os.ErrInvalid, ErrMapInUse, ErrNotPerfEventArray, and errnos
// from the kernel (EBADF for a closed descriptor, EINVAL for one that is not
// a BPF object, EPERM without the privileges perf_event_open and the map
// update need).
func openRings(m Map, cfg ringConfig, failures Map) (_ *rings, err error) {
	if m == nil {
		return nil, fmt.Errorf("nil map: %w", os.ErrInvalid)
	}
	fd := m.FileDescriptor()
	info, err := checkMap(fd)
	if err != nil {
		return nil, err
	}
	// Checked before any ring is opened; from here, r.close closes it.
	fails, err := openFailureMap(failures)
	if err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			fails.close()
		}
	}()
	cpus, err := ringCPUs(info.maxEntries)
	if err != nil {
		return nil, err
	}
	if !claimMap(info.id) {
		return nil, fmt.Errorf("map %q (id %d): %w", info.name, info.id, ErrMapInUse)
	}
	r := &rings{mapID: info.id, cpus: cpus, failures: fails}
	if r.c, err = openC(fd, cfg, cpus); err != nil {
		unclaimMap(info.id)
		if errors.Is(err, os.ErrPermission) {
			// EPERM or EACCES: perf_event_open or the map update refused.
			return nil, fmt.Errorf("open perf events on map %q: %w (perf_event_open needs CAP_PERFMON or CAP_SYS_ADMIN, or a perf_event_paranoid that allows it; the map update needs CAP_BPF)", info.name, err)
		}
		return nil, fmt.Errorf("open perf events on map %q: %w", info.name, err)
	}
	if n := r.c.bufferCount(); n != len(cpus) {
		r.close()
		return nil, fmt.Errorf("libbpf opened %d rings for %d cpus", n, len(cpus))
	}
	r.raw = make([]*RawBuffer, len(cpus))
	r.fds = make([]int, len(cpus))
	for i := range cpus {
		if r.raw[i], err = r.view(i); err != nil {
			r.close()
			return nil, fmt.Errorf("ring %d: %w", i, err)
		}
		r.fds[i] = r.c.bufferFD(i)
	}
	return r, nil
}

// view returns a new RawBuffer over ring i's mapping.
func (r *rings) view(i int) (*RawBuffer, error) {
	base, size, err := r.c.ring(i)
	if err != nil {
		return nil, err
	}
	return newRawBuffer(int(r.cpus[i]), base, size)
}

// close frees the rings: perf_buffer__free clears the map's slots, unmaps
// and closes. Every RawBuffer over them is invalid afterwards.
func (r *rings) close() {
	r.c.close()
	unclaimMap(r.mapID) // after the slots are cleared: a new reader's stay
	r.failures.close()
}

// checkMap checks that fd is a perf event array and returns its info.
func checkMap(fd int) (mapDesc, error) {
	if fd < 0 {
		return mapDesc{}, fmt.Errorf("map fd %d: %w", fd, syscall.EBADF)
	}
	// The kernel answers a closed fd with EBADFD in BPF_OBJ_GET_INFO_BY_FD
	// (since 6.x); ask fcntl first so that it is EBADF on every kernel.
	if _, err := unix.FcntlInt(uintptr(fd), unix.F_GETFD, 0); err != nil {
		return mapDesc{}, fmt.Errorf("map fd %d: %w", fd, err)
	}
	info, err := mapInfo(fd)
	// BPF_OBJ_GET_INFO_BY_FD answers for programs, links and BTF too, in
	// their own info struct, which would be read as a map's.
	if kind := fdKind(fd); kind != "" && kind != "anon_inode:bpf-map" {
		if err == nil {
			err = ErrNotPerfEventArray
		}
		return mapDesc{}, fmt.Errorf("fd %d is not a BPF map (%s): %w", fd, kind, err)
	}
	if err != nil {
		return mapDesc{}, fmt.Errorf("map fd %d: get map info: %w", fd, err)
	}
	if info.typ != mapTypePerfEventArray {
		return mapDesc{}, fmt.Errorf("map %q has type %s (%d): %w",
			info.name, mapTypeName(info.typ), info.typ, ErrNotPerfEventArray)
	}
	return info, nil
}

// fdKind returns what fd refers to as /proc/self/fd shows it
// ("anon_inode:bpf-map", "anon_inode:bpf-prog", "/dev/null"), or "" when
// /proc cannot tell.
func fdKind(fd int) string {
	kind, err := os.Readlink("/proc/self/fd/" + strconv.Itoa(fd))
	if err != nil {
		return ""
	}
	return kind
}

// BPF map types New reports by name (from include/uapi/linux/bpf.h).
const mapTypePerfEventArray = 4

type mapDesc struct {
	id         uint32 // the kernel's map ID: one per map, whatever the fd
	typ        uint32
	keySize    uint32
	valueSize  uint32
	maxEntries uint32
	name       string
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
