// SPDX-License-Identifier: Apache-2.0

package kernel

import (
	"errors"
	"os"
	"syscall"
	"testing"
	"unsafe"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"golang.org/x/sys/unix"
)

// The attributes and the info head have the layout of
// include/uapi/linux/bpf.h: each field at its offset there, the pointers
// as __aligned_u64.
func TestAttrLayout(t *testing.T) {
	for _, tc := range []struct {
		name      string
		got, want uintptr
	}{
		{"map_elem size", unsafe.Sizeof(mapElemAttr{}), 32},
		{"map_elem key", unsafe.Offsetof(mapElemAttr{}.key), 8},
		{"map_elem value", unsafe.Offsetof(mapElemAttr{}.value), 16},
		{"map_elem flags", unsafe.Offsetof(mapElemAttr{}.flags), 24},
		{"info size", unsafe.Sizeof(objInfoAttr{}), 16},
		{"info info_len", unsafe.Offsetof(objInfoAttr{}.infoLen), 4},
		{"info info", unsafe.Offsetof(objInfoAttr{}.info), 8},
		{"get_id size", unsafe.Sizeof(getIDAttr{}), 12},
		{"get_id open_flags", unsafe.Offsetof(getIDAttr{}.openFlags), 8},
		{"obj_get size", unsafe.Sizeof(objGetAttr{}), 16},
		{"obj_get bpf_fd", unsafe.Offsetof(objGetAttr{}.bpfFD), 8},
		{"obj_get file_flags", unsafe.Offsetof(objGetAttr{}.fileFlags), 12},
		{"map_create size", unsafe.Sizeof(mapCreateAttr{}), 44},
		{"map_create map_flags", unsafe.Offsetof(mapCreateAttr{}.mapFlags), 16},
		{"map_create inner_map_fd", unsafe.Offsetof(mapCreateAttr{}.innerMapFD), 20},
		{"map_create map_name", unsafe.Offsetof(mapCreateAttr{}.mapName), 28},
		{"bpf_map_info head size", unsafe.Sizeof(mapInfo{}), 40},
		{"bpf_map_info id", unsafe.Offsetof(mapInfo{}.id), 4},
		{"bpf_map_info max_entries", unsafe.Offsetof(mapInfo{}.maxEntries), 16},
		{"bpf_map_info map_flags", unsafe.Offsetof(mapInfo{}.mapFlags), 20},
		{"bpf_map_info name", unsafe.Offsetof(mapInfo{}.name), 24},
	} {
		if tc.got != tc.want {
			t.Errorf("%s: %d, want %d", tc.name, tc.got, tc.want)
		}
	}
}

// The names are libbpf's, at the uapi enum's values: every type x/sys/unix
// knows has one, and a type past the table is "unknown".
func TestMapTypeName(t *testing.T) {
	for typ, want := range map[uint32]string{
		0:                                     "unspec",
		unix.BPF_MAP_TYPE_PERF_EVENT_ARRAY:    "perf_event_array",
		unix.BPF_MAP_TYPE_PERCPU_ARRAY:        "percpu_array",
		unix.BPF_MAP_TYPE_ARRAY_OF_MAPS:       "array_of_maps",
		unix.BPF_MAP_TYPE_RINGBUF:             "ringbuf",
		unix.BPF_MAP_TYPE_CGROUP_STORAGE:      "cgroup_storage",
		unix.BPF_MAP_TYPE_DEVMAP_HASH:         "devmap_hash",
		unix.BPF_MAP_TYPE_USER_RINGBUF:        "user_ringbuf",
		unix.BPF_MAP_TYPE_CGRP_STORAGE:        "cgrp_storage",
		33:                                    "arena",
		34:                                    "unknown",
		1 << 20:                               "unknown",
		unix.BPF_MAP_TYPE_HASH:                "hash",
		unix.BPF_MAP_TYPE_REUSEPORT_SOCKARRAY: "reuseport_sockarray",
	} {
		if got := MapTypeName(typ); got != want {
			t.Errorf("MapTypeName(%d) = %q, want %q", typ, got, want)
		}
	}
	for typ := range uint32(unix.BPF_MAP_TYPE_CGRP_STORAGE + 1) {
		if MapTypeName(typ) == "unknown" {
			t.Errorf("map type %d has no name", typ)
		}
	}
}

// Each command on a closed descriptor is the kernel's EBADF, and on a
// descriptor that is not a map its EINVAL, both wrapped; an empty per-CPU
// buffer is refused before the call.
func TestBPFErrors(t *testing.T) {
	f, err := os.Open(os.DevNull)
	if err != nil {
		t.Fatal(err)
	}
	notMap := int(f.Fd())
	defer f.Close()
	closed, err := unix.Dup(notMap)
	if err != nil {
		t.Fatal(err)
	}
	unix.Close(closed)
	words := make([]uint64, 1)
	calls := map[string]func(fd int) error{
		"GetMapInfo":   func(fd int) error { _, err := GetMapInfo(fd); return err },
		"LookupPerCPU": func(fd int) error { return LookupPerCPU(fd, 0, words) },
		"UpdatePerCPU": func(fd int) error { return UpdatePerCPU(fd, 0, words) },
		"InnerMapID":   func(fd int) error { _, err := InnerMapID(fd, 0); return err },
		"UpdateSlot":   func(fd int) error { return UpdateSlot(fd, 0, 0) },
		"DeleteSlot":   func(fd int) error { return DeleteSlot(fd, 0) },
	}
	for name, call := range calls {
		err := call(closed)
		if errors.Is(err, syscall.EPERM) {
			t.Skipf("%s: %v: bpf(2) refused before it looked at the descriptor (unprivileged bpf disabled)", name, err)
		}
		// BPF_OBJ_GET_INFO_BY_FD answers EBADFD on some kernels.
		if !errors.Is(err, syscall.EBADF) && !(name == "GetMapInfo" && errors.Is(err, syscall.EBADFD)) {
			t.Errorf("%s on a closed descriptor: %v, want EBADF", name, err)
		}
		if err := call(notMap); !errors.Is(err, syscall.EINVAL) {
			t.Errorf("%s on %s: %v, want EINVAL", name, os.DevNull, err)
		}
	}
	if err := LookupPerCPU(notMap, 0, nil); !errors.Is(err, os.ErrInvalid) {
		t.Errorf("LookupPerCPU into nothing: %v, want os.ErrInvalid", err)
	}
	if err := UpdatePerCPU(notMap, 0, nil); !errors.Is(err, os.ErrInvalid) {
		t.Errorf("UpdatePerCPU of nothing: %v, want os.ErrInvalid", err)
	}
}

// GetMapInfo says what the map is, as it was made. Needs CAP_BPF.
func TestGetMapInfo(t *testing.T) {
	m := newMap(t, &ebpf.MapSpec{Name: "pb_info_test", Type: ebpf.RingBuf, MaxEntries: 4096 * 4})
	info, err := GetMapInfo(m.FD())
	if err != nil {
		t.Fatal(err)
	}
	ci, err := m.Info()
	if err != nil {
		t.Fatal(err)
	}
	id, _ := ci.ID()
	want := MapInfo{ID: uint32(id), Type: unix.BPF_MAP_TYPE_RINGBUF, MaxEntries: 4096 * 4, Name: "pb_info_test"}
	if info != want {
		t.Errorf("GetMapInfo: %+v, want %+v", info, want)
	}
	if got := MapTypeName(info.Type); got != "ringbuf" {
		t.Errorf("type %d named %q", info.Type, got)
	}
}

// LookupPerCPU and UpdatePerCPU read and write every possible CPU's value
// of a slot, in CPU order, as cilium/ebpf does. Needs CAP_BPF.
func TestPerCPU(t *testing.T) {
	m := newMap(t, &ebpf.MapSpec{Type: ebpf.PerCPUArray, KeySize: 4, ValueSize: 16, MaxEntries: 2})
	n := ebpf.MustPossibleCPU()
	// Ours written, cilium's read.
	words := make([]uint64, 2*n)
	for i := range words {
		words[i] = uint64(i + 1)
	}
	if err := UpdatePerCPU(m.FD(), 1, words); err != nil {
		t.Fatal(err)
	}
	var vals [][2]uint64
	if err := m.Lookup(uint32(1), &vals); err != nil {
		t.Fatal(err)
	}
	for cpu, v := range vals {
		if v != [2]uint64{uint64(2*cpu + 1), uint64(2*cpu + 2)} {
			t.Errorf("cpu %d: %v after UpdatePerCPU of %v", cpu, v, words[2*cpu:2*cpu+2])
		}
	}
	// Cilium's written, ours read.
	for cpu := range vals {
		vals[cpu] = [2]uint64{uint64(100 + cpu), uint64(200 + cpu)}
	}
	if err := m.Put(uint32(0), vals); err != nil {
		t.Fatal(err)
	}
	if err := LookupPerCPU(m.FD(), 0, words); err != nil {
		t.Fatal(err)
	}
	for cpu := range n {
		if words[2*cpu] != uint64(100+cpu) || words[2*cpu+1] != uint64(200+cpu) {
			t.Errorf("cpu %d: %v, want [%d %d]", cpu, words[2*cpu:2*cpu+2], 100+cpu, 200+cpu)
		}
	}
	if err := LookupPerCPU(m.FD(), 2, words); !errors.Is(err, syscall.ENOENT) {
		t.Errorf("LookupPerCPU past max_entries: %v, want ENOENT", err)
	}
}

// InnerMapID gives the ID of the map in a slot of an array of maps, ENOENT
// for an empty slot, and MapFDByID opens that map. Needs CAP_BPF and
// CAP_SYS_ADMIN (BPF_MAP_GET_FD_BY_ID).
func TestInnerMapID(t *testing.T) {
	inner := &ebpf.MapSpec{Type: ebpf.RingBuf, MaxEntries: 4096}
	outer := newMap(t, &ebpf.MapSpec{Type: ebpf.ArrayOfMaps, KeySize: 4, ValueSize: 4, MaxEntries: 2, InnerMap: inner})
	rb := newMap(t, &ebpf.MapSpec{Name: "pb_inner", Type: ebpf.RingBuf, MaxEntries: 4096})
	if err := outer.Put(uint32(1), rb); err != nil {
		t.Fatal(err)
	}
	if _, err := InnerMapID(outer.FD(), 0); !errors.Is(err, syscall.ENOENT) {
		t.Errorf("InnerMapID of an empty slot: %v, want ENOENT", err)
	}
	id, err := InnerMapID(outer.FD(), 1)
	if err != nil {
		t.Fatal(err)
	}
	want, err := GetMapInfo(rb.FD())
	if err != nil {
		t.Fatal(err)
	}
	if id != want.ID {
		t.Fatalf("InnerMapID: %d, want the inner map's %d", id, want.ID)
	}
	fd, err := MapFDByID(id)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	if got, err := GetMapInfo(fd); err != nil || got != want {
		t.Errorf("map by id %d: %+v, %v; want %+v", id, got, err, want)
	}
	if flags, err := unix.FcntlInt(uintptr(fd), unix.F_GETFD, 0); err != nil || flags&unix.FD_CLOEXEC == 0 {
		t.Errorf("map by id: descriptor flags %#x, %v; want close-on-exec", flags, err)
	}
	if _, err := MapFDByID(0); !errors.Is(err, syscall.ENOENT) {
		t.Errorf("MapFDByID(0): %v, want ENOENT", err)
	}
}

// CreateRingBuf and CreateArrayOfMaps make what they say, as the kernel
// reports it; a ring buffer fills a slot of the array (UpdateSlot), whose
// lookup gives its ID; a size that is no power of two pages is the
// kernel's EINVAL. Needs CAP_BPF.
func TestCreateRingBufArray(t *testing.T) {
	page := uint32(os.Getpagesize())
	rb, err := CreateRingBuf("pb_ring_with_a_long_name", 2*page, 0)
	if err != nil {
		if os.Getenv("CI") != "true" && errors.Is(err, syscall.EPERM) {
			t.Skipf("needs CAP_BPF: %v", err)
		}
		t.Fatal(err)
	}
	defer unix.Close(rb)
	info, err := GetMapInfo(rb)
	if err != nil {
		t.Fatal(err)
	}
	if info.Type != unix.BPF_MAP_TYPE_RINGBUF || info.MaxEntries != 2*page || info.Name != "pb_ring_with_a_" {
		t.Errorf("ring buffer: %+v, want a ringbuf of %d bytes named %q", info, 2*page, "pb_ring_with_a_")
	}
	outer, err := CreateArrayOfMaps("pb_rings", 3, rb)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(outer)
	oi, err := GetMapInfo(outer)
	if err != nil {
		t.Fatal(err)
	}
	if oi.Type != unix.BPF_MAP_TYPE_ARRAY_OF_MAPS || oi.MaxEntries != 3 || oi.KeySize != 4 || oi.ValueSize != 4 || oi.Name != "pb_rings" {
		t.Errorf("array of maps: %+v", oi)
	}
	if _, err := InnerMapID(outer, 2); !errors.Is(err, syscall.ENOENT) {
		t.Errorf("a new array's slot: %v, want ENOENT (empty)", err)
	}
	if err := UpdateSlot(outer, 2, rb); err != nil {
		t.Fatal(err)
	}
	if id, err := InnerMapID(outer, 2); err != nil || id != info.ID {
		t.Errorf("slot 2 holds map %d, %v; want the ring's %d", id, err, info.ID)
	}
	if fd, err := CreateRingBuf("pb_bad", 3*page, 0); !errors.Is(err, syscall.EINVAL) {
		unix.Close(fd)
		t.Errorf("a ring of 3 pages: %v, want EINVAL", err)
	}
}

// newMap makes a map, or skips (fails under CI) without the privileges.
func newMap(t *testing.T, spec *ebpf.MapSpec) *ebpf.Map {
	t.Helper()
	m, err := ebpf.NewMap(spec)
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("privileged test under CI: create %v: %v", spec.Type, err)
		}
		t.Skipf("create %v (needs CAP_BPF): %v", spec.Type, err)
	}
	t.Cleanup(func() { m.Close() })
	return m
}

// EnableRunStats makes the kernel count a program's runs and run time,
// while its descriptor is open, and GetProgStats reads them at the
// layout's offsets.
func TestEnableRunStats(t *testing.T) {
	if got := unsafe.Offsetof(progInfo{}.runTimeNs); got != 192 {
		t.Errorf("bpf_prog_info run_time_ns at %d, want 192", got)
	}
	if got := unsafe.Offsetof(progInfo{}.recursionMisses); got != 208 {
		t.Errorf("bpf_prog_info recursion_misses at %d, want 208", got)
	}
	prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{
		Type:         ebpf.SocketFilter,
		Instructions: asm.Instructions{asm.Mov.Imm(asm.R0, 0), asm.Return()},
		License:      "GPL",
	})
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("privileged test under CI: load a program: %v", err)
		}
		t.Skipf("load a program (needs CAP_BPF): %v", err)
	}
	defer prog.Close()
	run := func() {
		t.Helper()
		if _, err := prog.Run(&ebpf.RunOptions{Data: make([]byte, 64)}); err != nil {
			t.Fatal(err)
		}
	}
	read := func() ProgStats {
		t.Helper()
		s, err := GetProgStats(prog.FD())
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	// Stats are on while any holder keeps them on: this process, another
	// (a benchmark beside the tests), or the sysctl. A run counted before
	// the test turns them on says another holder does.
	pre := read()
	run()
	s0 := read()
	others := s0.Runs != pre.Runs
	fd, err := EnableRunStats()
	if err != nil {
		t.Fatal(err)
	}
	for range 5 {
		run()
	}
	s1 := read()
	unix.Close(fd)
	run()
	s2 := read()
	if d := s1.Sub(s0); d.Runs != 5 || d.RunTime <= 0 {
		t.Errorf("with stats on: %d runs in %v, want 5 runs in some time", d.Runs, d.RunTime)
	}
	// Off again, unless another holder keeps the count on.
	if d := s2.Sub(s1); d.Runs != 0 && !others {
		t.Errorf("with stats off again: %d runs counted, want none", d.Runs)
	} else if others {
		t.Logf("another holder keeps BPF run stats on: the count with them off is not checked")
	}
}

// IsMap tells a map from every other descriptor by the kernel's answer
// alone: a ring buffer (whose lookup is ENOTSUPP) and an array of maps
// (EFAULT for the missing key) are maps; an eventfd is not; a closed
// descriptor is EBADF.
func TestIsMap(t *testing.T) {
	page := uint32(os.Getpagesize())
	rb, err := CreateRingBuf("pb_is_map", page, 0)
	if err != nil {
		if os.Getenv("CI") != "true" && errors.Is(err, syscall.EPERM) {
			t.Skipf("needs CAP_BPF: %v", err)
		}
		t.Fatal(err)
	}
	defer unix.Close(rb)
	outer, err := CreateArrayOfMaps("pb_is_map_aom", 1, rb)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(outer)
	for _, fd := range []int{rb, outer} {
		if ok, err := IsMap(fd); !ok || err != nil {
			t.Errorf("IsMap of a map: %v, %v", ok, err)
		}
	}
	ev, err := unix.Eventfd(0, unix.EFD_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	if ok, err := IsMap(ev); ok || err != nil {
		t.Errorf("IsMap of an eventfd: %v, %v; want false", ok, err)
	}
	unix.Close(ev)
	if ok, err := IsMap(ev); ok || !errors.Is(err, syscall.EBADF) {
		t.Errorf("IsMap of a closed descriptor: %v, %v; want EBADF", ok, err)
	}
}
