// SPDX-License-Identifier: Apache-2.0

package main

import (
	"fmt"
	"strconv"
	"strings"
	"syscall"
	"time"
	"unicode"
	"unicode/utf8"

	"golang.org/x/sys/unix"
)

// mountFlagNames are the MS_* flags by bit (<linux/mount.h>); bit 9 has
// none. The C tool's table (mnt_flags_names in libbpf-tools'
// mountsnoop.c) leaves no gap at bit 9, so it names bits 10 to 14 one
// flag off: MS_REC (bit 14) as MS_VERBOSE, MS_BIND (bit 12) as MS_MOVE.
// These are the right names (TestMountFlagNames checks them against
// x/sys/unix).
var mountFlagNames = [32]string{
	"MS_RDONLY", "MS_NOSUID", "MS_NODEV", "MS_NOEXEC",
	"MS_SYNCHRONOUS", "MS_REMOUNT", "MS_MANDLOCK", "MS_DIRSYNC",
	"MS_NOSYMFOLLOW", "", "MS_NOATIME", "MS_NODIRATIME",
	"MS_BIND", "MS_MOVE", "MS_REC", "MS_SILENT",
	"MS_POSIXACL", "MS_UNBINDABLE", "MS_PRIVATE", "MS_SLAVE",
	"MS_SHARED", "MS_RELATIME", "MS_KERNMOUNT", "MS_I_VERSION",
	"MS_STRICTATIME", "MS_LAZYTIME", "MS_SUBMOUNT", "MS_NOREMOTELOCK",
	"MS_NOSEC", "MS_BORN", "MS_ACTIVE", "MS_NOUSER",
}

// mountFlags names the bits of flags joined by " | ", "0x0" for none, as
// the C tool's strmountflags does, and adds the bits that have no name in
// hex ("MS_BIND | 0x200"), which the C tool drops (bit 9) or shows as
// MS_NOUSER (bits 32 to 63).
func mountFlags(flags uint64) string {
	if flags == 0 {
		return "0x0"
	}
	var b strings.Builder
	rest := flags
	for i, name := range mountFlagNames {
		bit := uint64(1) << i
		if flags&bit == 0 || name == "" {
			continue
		}
		rest &^= bit
		if b.Len() > 0 {
			b.WriteString(" | ")
		}
		b.WriteString(name)
	}
	if rest != 0 {
		if b.Len() > 0 {
			b.WriteString(" | ")
		}
		fmt.Fprintf(&b, "%#x", rest)
	}
	return b.String()
}

// errnoText is the C tool's strerrno: "0", "-ENOENT" (glibc's
// strerrorname_np), or the number when the value has no name.
func errnoText(ret int32) string {
	if ret == 0 {
		return "0"
	}
	if ret < 0 {
		if name := unix.ErrnoName(syscall.Errno(-int64(ret))); name != "" {
			return "-" + name
		}
	}
	return strconv.Itoa(int(ret))
}

// opNames are the OP values of the detailed output.
var opNames = map[uint32]string{opMount: "MOUNT", opUmount: "UMOUNT"}

// clock turns the kernel's CLOCK_MONOTONIC timestamps into wall-clock times.
type clock struct {
	monoStart uint64    // CLOCK_MONOTONIC at the start, ns
	wallStart time.Time // the wall clock at that moment
}

// wall returns the wall-clock time of ts.
func (c clock) wall(ts uint64) time.Time {
	return c.wallStart.Add(time.Duration(int64(ts - c.monoStart)))
}

// printer formats events as the C mountsnoop does.
type printer struct {
	timestamp bool // -t: the time, HH:MM:SS
	detailed  bool // -d: one line per field
	clock     clock
}

// header returns the column header line: "" in detailed mode.
func (p *printer) header() string {
	if p.detailed {
		return ""
	}
	s := ""
	if p.timestamp {
		s = fmt.Sprintf("%-8s ", "TIME")
	}
	return s + fmt.Sprintf("%-16s %-7s %-7s %-11s %s\n", "COMM", "PID", "TID", "MNT_NS", "CALL")
}

// call returns the call as the C tool's gen_call writes it:
// mount("src", "dest", "fs", FLAGS, "data") = RET.
func call(ev *event) string {
	switch ev.Op {
	case opMount:
		return fmt.Sprintf(`mount("%s", "%s", "%s", %s, "%s") = %s`, escape(ev.Src), escape(ev.Dest),
			escape(ev.FS), mountFlags(ev.Flags), escape(ev.Data), errnoText(ev.Ret))
	case opUmount:
		return fmt.Sprintf(`umount("%s", %s) = %s`, escape(ev.Dest), mountFlags(ev.Flags), errnoText(ev.Ret))
	}
	return ""
}

// appendEvent appends ev's line (or, detailed, its block of lines) to b.
func (p *printer) appendEvent(b []byte, ev *event) []byte {
	indent := ""
	if p.timestamp {
		b = append(b, p.clock.wall(ev.TS).Format("15:04:05 ")...)
		indent = "    "
	}
	if !p.detailed {
		return fmt.Appendf(b, "%-16s %-7d %-7d %-11d %s\n", escape(ev.Comm), ev.PID, ev.TID, ev.MntNS, call(ev))
	}
	if p.timestamp {
		b = append(b, '\n')
	}
	field := func(name, value string) {
		b = fmt.Appendf(b, "%s%-8s%s\n", indent, name+":", value)
	}
	field("PID", strconv.FormatUint(uint64(ev.PID), 10))
	field("TID", strconv.FormatUint(uint64(ev.TID), 10))
	field("COMM", escape(ev.Comm))
	field("OP", opNames[ev.Op])
	field("RET", errnoText(ev.Ret))
	field("LAT", strconv.FormatUint(ev.Delta/1000, 10)+"us")
	field("MNT_NS", strconv.FormatUint(uint64(ev.MntNS), 10))
	switch ev.Op {
	case opMount:
		field("FS", escape(ev.FS))
		field("SOURCE", escape(ev.Src))
		field("TARGET", escape(ev.Dest))
		field("DATA", escape(ev.Data))
		field("FLAGS", mountFlags(ev.Flags))
	case opUmount:
		field("TARGET", escape(ev.Dest))
		field("FLAGS", mountFlags(ev.Flags))
	}
	return append(b, '\n')
}

// escape makes s safe to print on one line: control characters (C0, DEL
// and C1) and bidi controls become Go escapes (\n, \x1b, \u202e), and
// bytes that are not UTF-8 become \xNN, so that a path cannot break a line,
// send terminal escape sequences or reorder what follows it. (The C tool
// prints the bytes as they are; the two differ only for such strings.)
func escape(s string) string {
	i := 0
	for i < len(s) {
		r, n := utf8.DecodeRuneInString(s[i:])
		if unsafeRune(r, n) {
			break
		}
		i += n
	}
	if i == len(s) {
		return s
	}
	var b strings.Builder
	b.WriteString(s[:i])
	for i < len(s) {
		r, n := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && n == 1:
			fmt.Fprintf(&b, `\x%02x`, s[i])
		case unsafeRune(r, n):
			q := strconv.QuoteRune(r) // '\n', '\x1b', '\u009b'
			b.WriteString(q[1 : len(q)-1])
		default:
			b.WriteString(s[i : i+n])
		}
		i += n
	}
	return b.String()
}

// unsafeRune reports whether the rune r, n bytes long, must be escaped.
func unsafeRune(r rune, n int) bool {
	return r == utf8.RuneError && n == 1 || unicode.IsControl(r) || unicode.Is(unicode.Bidi_Control, r)
}
