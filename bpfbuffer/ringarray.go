// SPDX-License-Identifier: Apache-2.0

package bpfbuffer

// RingBufPerCPU: the array of ring buffers that Prepare makes before the
// object loads, and what Maps hands the Reader.

import (
	"errors"
	"fmt"
	"os"
	"slices"
	"syscall"
	"weak"

	"github.com/aquasecurity/libbpfgo"
	"github.com/perfbuf/perfbuf"
	"github.com/perfbuf/perfbuf/buflayout"
	"golang.org/x/sys/unix"
)

// ringFD is a ring of an array of ring buffers: its slot, and a
// descriptor of bpfbuffer's own.
type ringFD struct {
	key uint32
	fd  int
}

// asRingBufArray makes the map an array of ring buffers of p: it creates
// a ring for every slot that holds a possible CPU and the array with them
// in their slots, and has libbpf reuse that array at load, so that the
// program's first run finds its rings. It returns the rings' descriptors,
// which the caller keeps; on an error it closes what it made.
func asRingBufArray(m *libbpfgo.Module, events, scratch *libbpfgo.BPFMap, name string, p buflayout.Plan) (_ []ringFD, err error) {
	keys, err := p.Slots()
	if err != nil {
		return nil, err
	}
	// First, as it changes nothing if it fails: an object built with a
	// perfbuf.bpf.h older than this layout has no room for cpus_per_ring.
	if err := setArrayConfig(m, scratch, name, p); err != nil {
		return nil, fmt.Errorf("%w (an object built with a perfbuf.bpf.h without cpus_per_ring has no array of ring buffers): %w", errOldConfig, err)
	}
	var rings []ringFD
	defer func() {
		if err != nil {
			closeRings(rings)
		}
	}()
	// Kernels before 5.11 charge each ring to RLIMIT_MEMLOCK. Prepare's
	// probe (libbpf_probe_bpf_map_type) went through libbpf's
	// bpf_map_create, which raises the limit to unlimited where the
	// kernel needs it and the process may; an EPERM here says what is
	// left (memlockHint).
	//
	// The template's flags (BPF_F_NUMA_NODE and, in overwrite mode,
	// BPF_F_RB_OVERWRITE are those a ring buffer takes; the kernel
	// refuses the others with EINVAL).
	flags := p.MapFlags(uint32(events.MapFlags()))
	for _, k := range keys {
		fd, err := createRingBuf(buflayout.RingName(name, k), uint32(p.Size), flags)
		if err != nil {
			return nil, memlockHint(err, len(keys), p.Size)
		}
		rings = append(rings, ringFD{k, fd})
	}
	// The inner map template: the kernel checks every slot's map against
	// it (type, flags) and the verifier types a lookup's result by it.
	outer, err := createArrayOfMaps(name, keys[len(keys)-1]+1, rings[0].fd)
	if errors.Is(err, syscall.EINVAL) || errors.Is(err, errNotSupp) {
		return nil, fmt.Errorf("the kernel takes no ring buffer in an array of maps: %w: %w", errors.ErrUnsupported, err)
	}
	if err != nil {
		return nil, memlockHint(err, len(keys), p.Size)
	}
	defer unix.Close(outer.FileDescriptor()) // libbpf keeps a duplicate
	for _, r := range rings {
		if err := updateSlot(outer, r.key, r.fd); err != nil {
			return nil, fmt.Errorf("insert ring %d: %w", r.key, err)
		}
	}
	if err := scratch.SetAutocreate(false); err != nil {
		return nil, err
	}
	// Last: libbpf takes the array's type, sizes and name from the
	// kernel, and creates no map of its own for it at load.
	if err := events.ReuseFD(outer.FileDescriptor()); err != nil {
		return nil, fmt.Errorf("have libbpf use the array: %w", err)
	}
	return rings, nil
}

// errOldConfig is asRingBufArray's error for an object whose <name>_config
// has no cpus_per_ring, wrapped with libbpfgo's: the object was built with
// a perfbuf.bpf.h older than the array of ring buffers.
var errOldConfig = errors.New("no cpus_per_ring in the config")

// errNotSupp is the kernel's ENOTSUPP (524, include/linux/errno.h), which
// x/sys/unix does not name: what bpf_map_meta_alloc answers for an inner
// map type without map_meta_equal.
const errNotSupp = syscall.Errno(524)

// setArrayConfig writes <name>_config for the array of ring buffers p. The
// whole struct is written: max_sample as compiled, which is the value size
// PERFBUF_BUFFER gave <name>_scratch. An object built with a perfbuf.bpf.h
// older than the array's layout has a shorter struct, which libbpfgo
// refuses.
func setArrayConfig(m *libbpfgo.Module, scratch *libbpfgo.BPFMap, name string, p buflayout.Plan) error {
	if err := m.InitGlobalVariable(name+"_config", p.FullConfig(uint64(scratch.ValueSize()))); err != nil {
		return fmt.Errorf("set %s_config: %w", name, err)
	}
	return nil
}

// memlockHint adds to an EPERM creating a ring the cause on kernels
// before 5.11, which charge a map's memory to RLIMIT_MEMLOCK: the limit
// and what the rings need. The errno stays wrapped.
func memlockHint(err error, rings, size int) error {
	if !errors.Is(err, syscall.EPERM) {
		return err
	}
	var lim unix.Rlimit
	if unix.Getrlimit(unix.RLIMIT_MEMLOCK, &lim) != nil {
		return err
	}
	return fmt.Errorf("%w (kernels before 5.11 charge BPF maps to RLIMIT_MEMLOCK, %s here, and %d rings of %d bytes take %d bytes of it: raise it with ulimit -l or setrlimit, which needs CAP_SYS_RESOURCE above the hard limit; on later kernels EPERM is a missing CAP_BPF)",
		err, limitString(lim.Cur), rings, size, rings*size)
}

// limitString prints a resource limit: bytes, or "unlimited".
func limitString(v uint64) string {
	if v == unix.RLIM_INFINITY {
		return "unlimited"
	}
	return fmt.Sprintf("%d bytes", v)
}

func closeRings(rings []ringFD) {
	for _, r := range rings {
		unix.Close(r.fd)
	}
}

// Maps returns the map to read the loaded buffer mapName of m with, as
// Prepare made it, and opts completed for perfbuf.NewReader or
// perfbuf.New: FailureMap set to <mapName>_failures if it is nil, and for
// RingBufPerCPU the first ring as the map and the others appended to a
// copy of opts.Maps, in slot order (a Reader's Stats().Rings[i] is the i-th
// ring: CPU i's with a ring per CPU and no gap in the possible CPUs). For
// the other kinds, and a buffer Prepare did not see (loaded as compiled,
// a ring buffer), the map is the buffer's own.
//
// The rings are descriptors that Prepare opened and keeps for the
// module's life, closed once m is garbage: pass them to NewReader while m
// is in use (it is, while its programs run), which duplicates them. The
// Reader then needs no CAP_SYS_ADMIN, which opening the rings of the
// array by ID would (a Reader given the array itself does that, when it
// may).
//
// Errors: os.ErrInvalid for a nil m; libbpfgo's for a map it does not
// have, wrapped.
func Maps(m *libbpfgo.Module, mapName string, opts perfbuf.Options) (perfbuf.Map, perfbuf.Options, error) {
	if m == nil {
		return nil, opts, fmt.Errorf("buffer %q maps: nil module: %w", mapName, os.ErrInvalid)
	}
	events, err := m.GetMap(mapName)
	if err != nil {
		return nil, opts, fmt.Errorf("buffer %q maps: %w", mapName, err)
	}
	if opts.FailureMap == nil {
		failures, err := m.GetMap(mapName + "_failures")
		if err != nil {
			return nil, opts, fmt.Errorf("buffer %q maps: not a PERFBUF_BUFFER: %w", mapName, err)
		}
		opts.FailureMap = failures
	}
	prepared.Lock()
	var rings []ringFD
	if e := prepared.m[preparedKey{weak.Make(m), mapName}]; e != nil {
		rings = e.rings
	}
	prepared.Unlock()
	if len(rings) == 0 {
		return events, opts, nil
	}
	more := slices.Clip(slices.Clone(opts.Maps))
	for _, r := range rings[1:] {
		more = append(more, perfbuf.MapFD(r.fd))
	}
	opts.Maps = more
	return perfbuf.MapFD(rings[0].fd), opts, nil
}
