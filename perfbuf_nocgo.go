// SPDX-License-Identifier: Apache-2.0

//go:build !cgo

package perfbuf

// A build without cgo has no libbpf: a perf event array's rings open
// through perfbuf's own opener (perfevents.go, internal/kernel), and
// everything else is pure Go in every build.

// openLibbpfEvents is nil: there is no libbpf to open rings with.
var openLibbpfEvents func(fd int, cfg ringConfig, cpus []int32) (perfEvents, error)
