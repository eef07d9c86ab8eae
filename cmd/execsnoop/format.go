// SPDX-License-Identifier: Apache-2.0

package main

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"
)

// filter holds the user-space filters (uid and failed execs are filtered in
// the kernel, as in the C tool).
type filter struct {
	name       string // comm contains name
	line       string // some argument contains line
	failedOnly bool   // only execs that failed
}

func (f *filter) match(ev *event) bool {
	if f.name != "" && !strings.Contains(ev.Comm, f.name) {
		return false
	}
	if f.failedOnly && ev.Ret >= 0 {
		return false
	}
	if f.line != "" {
		for _, a := range ev.Args {
			if strings.Contains(a, f.line) {
				return true
			}
		}
		return false
	}
	return true
}

// clock turns the kernel's CLOCK_MONOTONIC timestamps into wall-clock times
// and seconds since the start.
type clock struct {
	monoStart uint64    // CLOCK_MONOTONIC at the start, ns
	wallStart time.Time // the wall clock at that moment
}

// since returns the seconds from the start to ts.
func (c clock) since(ts uint64) float64 {
	return float64(int64(ts-c.monoStart)) / 1e9
}

// wall returns the wall-clock time of ts.
func (c clock) wall(ts uint64) time.Time {
	return c.wallStart.Add(time.Duration(int64(ts - c.monoStart)))
}

// printer formats events as the C execsnoop does, or as JSON lines.
type printer struct {
	time      bool // -T: a TIME column, HH:MM:SS
	timestamp bool // -t: a TIME(s) column, seconds since the start
	printUID  bool // -U: a UID column
	quote     bool // -q: arguments in double quotes
	json      bool // -j: one JSON object per line instead of columns
	clock     clock
}

// header returns the column header line, or "" for JSON.
func (p *printer) header() string {
	if p.json {
		return ""
	}
	var b strings.Builder
	if p.time {
		fmt.Fprintf(&b, "%-8s ", "TIME")
	}
	if p.timestamp {
		fmt.Fprintf(&b, "%-8s ", "TIME(s)")
	}
	if p.printUID {
		fmt.Fprintf(&b, "%-6s ", "UID")
	}
	fmt.Fprintf(&b, "%-16s %-6s %-6s %3s %s\n", "PCOMM", "PID", "PPID", "RET", "ARGS")
	return b.String()
}

// jsonEvent is the JSON form of an event: every field, whatever the flags.
type jsonEvent struct {
	Time          string   `json:"time"` // RFC 3339, local time zone
	TS            float64  `json:"ts"`   // seconds since the start
	Comm          string   `json:"comm"`
	PID           uint32   `json:"pid"`
	PPID          uint32   `json:"ppid"`
	UID           uint32   `json:"uid"`
	Ret           int32    `json:"ret"`
	Args          []string `json:"args"`               // not UTF-8: U+FFFD in its place
	ArgsRaw       [][]byte `json:"args_raw,omitempty"` // then all args' exact bytes (base64)
	ArgsTruncated bool     `json:"args_truncated,omitempty"`
	CPU           int      `json:"cpu"`
}

// appendEvent appends ev's line, newline included, to b.
func (p *printer) appendEvent(b []byte, ev *event, cpu int) []byte {
	if p.json {
		j := jsonEvent{
			Time:          p.clock.wall(ev.TS).Format(time.RFC3339Nano),
			TS:            p.clock.since(ev.TS),
			Comm:          ev.Comm,
			PID:           ev.PID,
			PPID:          ev.PPID,
			UID:           ev.UID,
			Ret:           ev.Ret,
			Args:          ev.Args,
			ArgsTruncated: ev.Truncated,
			CPU:           cpu,
		}
		if j.Args == nil {
			j.Args = []string{}
		}
		if !allValid(j.Args) {
			for _, a := range j.Args {
				j.ArgsRaw = append(j.ArgsRaw, []byte(a))
			}
		}
		out, err := json.Marshal(&j)
		if err != nil {
			panic(err) // strings, numbers and a slice of strings always marshal
		}
		return append(append(b, out...), '\n')
	}
	if p.time {
		b = fmt.Appendf(b, "%-8s ", p.clock.wall(ev.TS).Format("15:04:05"))
	}
	if p.timestamp {
		b = fmt.Appendf(b, "%-8.3f ", p.clock.since(ev.TS))
	}
	if p.printUID {
		b = fmt.Appendf(b, "%-6d ", ev.UID)
	}
	b = fmt.Appendf(b, "%-16s %-6d %-6d %3d ", escape(ev.Comm, false), ev.PID, ev.PPID, ev.Ret)
	for i, a := range ev.Args {
		if i > 0 {
			b = append(b, ' ')
		}
		if p.quote {
			b = append(b, '"')
			b = append(b, escape(a, true)...)
			b = append(b, '"')
		} else {
			b = append(b, escape(a, false)...)
		}
	}
	if ev.Truncated {
		b = append(b, " ..."...)
	}
	return append(b, '\n')
}

// allValid reports whether every string of ss is valid UTF-8.
func allValid(ss []string) bool {
	for _, s := range ss {
		if !utf8.ValidString(s) {
			return false
		}
	}
	return true
}

// escape makes s safe to print on one line: control characters (C0, DEL
// and C1) and bidi controls become Go escapes (\n, \x1b, \u009b, \u202e),
// and bytes that are not UTF-8 become \xNN, so that an argument cannot
// break a line, send terminal escape sequences or reorder what follows it.
// In quoted form, `"` and `\` are escaped too.
func escape(s string, quoted bool) string {
	i := 0
	for i < len(s) {
		r, n := utf8.DecodeRuneInString(s[i:])
		if unsafeRune(r, n) || quoted && (r == '"' || r == '\\') {
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
		case quoted && (r == '"' || r == '\\'):
			b.WriteByte('\\')
			b.WriteRune(r)
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

// unsafeRune reports whether the rune r, n bytes long, must be escaped: a
// control or bidi control character, or a byte that is not UTF-8.
func unsafeRune(r rune, n int) bool {
	return r == utf8.RuneError && n == 1 || unicode.IsControl(r) || unicode.Is(unicode.Bidi_Control, r)
}
