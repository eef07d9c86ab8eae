// SPDX-License-Identifier: Apache-2.0

// Package kernel makes perfbuf's plain system calls in Go, through
// golang.org/x/sys/unix and without cgo: the bpf(2) map commands it needs
// (map info and type names, slots, per-CPU values, inner maps, a map by
// ID) and its own opener of perf rings (OpenPerfRings), for builds without
// cgo and hosts where libbpf's perf_buffer refuses to open them.
//
// Nothing here reads a ring: it opens, maps, publishes, pauses and closes.
// The rings' reader is perfbuf's (internal/ring); overwritable rings (backward
// perf rings, ring buffers in overwrite mode: overwrite.go) are parsed by
// internal/snapshot.
package kernel
