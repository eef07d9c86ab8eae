// SPDX-License-Identifier: Apache-2.0

package main

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
)

// Layout of struct event in bpf/mountsnoop.bpf.c, in the host's byte order
// (the kernel's, which the BPF program writes in). Change both together.
const (
	offTS     = 0  // __u64 ts: bpf_ktime_get_ns() at exit, for -t
	offDelta  = 8  // __u64 delta: ns from entry to exit
	offFlags  = 16 // __u64 flags
	offPID    = 24 // __u32 pid (tgid)
	offTID    = 28 // __u32 tid
	offMntNS  = 32 // __u32 mnt_ns
	offRet    = 36 // __s32 ret
	offOp     = 40 // __u32 op
	offComm   = 48 // char comm[16]
	offFS     = 64 // char fs[8]
	offSrc    = 72 // char src[4096]
	offDest   = offSrc + pathLen
	offData   = offDest + pathLen
	eventSize = offData + dataLen // 8776: every record has this size

	commLen = 16
	fsLen   = 8
	pathLen = 4096
	dataLen = 512
)

// Operations (enum op).
const (
	opMount  = 0
	opUmount = 1
)

// event is one mount or umount call, decoded.
type event struct {
	TS    uint64 // kernel CLOCK_MONOTONIC, ns, when the call returned
	Delta uint64 // ns from entry to exit
	Flags uint64
	PID   uint32
	TID   uint32
	MntNS uint32
	Ret   int32 // 0, or -errno
	Op    uint32
	Comm  string
	FS    string // mount: the file system type (at most 7 bytes, as in the C tool)
	Src   string // mount: the source
	Dest  string // mount and umount: the target
	Data  string // mount: the data, read as a string
}

var errShortEvent = errors.New("short event")

// decodeEvent parses a sample. A perf event array's samples are padded by
// the kernel (to 8776 + 4 bytes), a ring buffer's are not: any length from
// eventSize on is one event.
func decodeEvent(b []byte, ev *event) error {
	if len(b) < eventSize {
		return fmt.Errorf("decode event: %d bytes, want %d: %w", len(b), eventSize, errShortEvent)
	}
	ne := binary.NativeEndian
	*ev = event{
		TS:    ne.Uint64(b[offTS:]),
		Delta: ne.Uint64(b[offDelta:]),
		Flags: ne.Uint64(b[offFlags:]),
		PID:   ne.Uint32(b[offPID:]),
		TID:   ne.Uint32(b[offTID:]),
		MntNS: ne.Uint32(b[offMntNS:]),
		Ret:   int32(ne.Uint32(b[offRet:])),
		Op:    ne.Uint32(b[offOp:]),
		Comm:  cString(b[offComm : offComm+commLen]),
		FS:    cString(b[offFS : offFS+fsLen]),
		Src:   cString(b[offSrc : offSrc+pathLen]),
		Dest:  cString(b[offDest : offDest+pathLen]),
		Data:  cString(b[offData : offData+dataLen]),
	}
	if ev.Op != opMount && ev.Op != opUmount {
		return fmt.Errorf("decode event: op %d: %w", ev.Op, errBadOp)
	}
	return nil
}

var errBadOp = errors.New("unknown operation")

// cString returns b up to its first NUL.
func cString(b []byte) string {
	if i := bytes.IndexByte(b, 0); i >= 0 {
		b = b[:i]
	}
	return string(b)
}
