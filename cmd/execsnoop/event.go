// SPDX-License-Identifier: Apache-2.0

package main

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
)

// Layout of struct event in bpf/execsnoop.bpf.c, in the host's byte order
// (the kernel's, which the BPF program writes in). Change both together.
const (
	offTS        = 0  // __u64 ts: bpf_ktime_get_ns() at exit, the ordering key
	offPID       = 8  // __u32 pid (tgid)
	offPPID      = 12 // __u32 ppid
	offUID       = 16 // __u32 uid
	offRet       = 20 // __s32 retval
	offArgsCount = 24 // __u32 args_count
	offArgsSize  = 28 // __u32 args_size
	offFlags     = 32 // __u32 flags
	offComm      = 36 // char comm[16]
	offArgs      = 52 // char args[argsBufSize]; only args_size bytes are sent

	commLen      = 16
	totalMaxArgs = 60  // TOTAL_MAX_ARGS: the largest --max-args
	argSize      = 128 // ARGSIZE: the longest argument kept, NUL included
	argsBufSize  = totalMaxArgs * argSize

	// eventMaxSize is the largest sample the program outputs.
	eventMaxSize = offArgs + argsBufSize

	flagArgsTruncated = 1 // EVENT_ARGS_TRUNCATED
)

// event is one execve, decoded.
type event struct {
	TS        uint64 // kernel CLOCK_MONOTONIC, ns, taken when execve returned
	PID       uint32
	PPID      uint32
	UID       uint32
	Ret       int32  // 0, or -errno when the exec failed
	Comm      string // command name after the exec (before it, if it failed)
	Args      []string
	Truncated bool // argv had more entries than --max-args
}

var errShortEvent = errors.New("short event")

// decodeEvent parses a sample. The kernel pads samples to keep its records
// 8-byte aligned, so the true size comes from args_size, not len(b).
func decodeEvent(b []byte, ev *event) error {
	if len(b) < offArgs {
		return fmt.Errorf("decode event: %d bytes, want at least %d: %w", len(b), offArgs, errShortEvent)
	}
	ne := binary.NativeEndian
	size := ne.Uint32(b[offArgsSize:])
	if size > argsBufSize || int(size) > len(b)-offArgs {
		return fmt.Errorf("decode event: args_size %d in a %d-byte sample: %w", size, len(b), errShortEvent)
	}
	ev.TS = ne.Uint64(b[offTS:])
	ev.PID = ne.Uint32(b[offPID:])
	ev.PPID = ne.Uint32(b[offPPID:])
	ev.UID = ne.Uint32(b[offUID:])
	ev.Ret = int32(ne.Uint32(b[offRet:]))
	ev.Truncated = ne.Uint32(b[offFlags:])&flagArgsTruncated != 0
	ev.Comm = cString(b[offComm : offComm+commLen])

	count := ne.Uint32(b[offArgsCount:])
	args := b[offArgs : offArgs+int(size)]
	ev.Args = ev.Args[:0]
	for len(args) > 0 && uint32(len(ev.Args)) < count {
		s, rest, _ := bytes.Cut(args, []byte{0})
		ev.Args = append(ev.Args, string(s))
		args = rest
	}
	return nil
}

// cString returns b up to its first NUL.
func cString(b []byte) string {
	if i := bytes.IndexByte(b, 0); i >= 0 {
		b = b[:i]
	}
	return string(b)
}
