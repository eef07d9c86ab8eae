// SPDX-License-Identifier: Apache-2.0

package bpfrun

// libbpfgo leaves linking libbpf to its user (its cgo flags name only
// libelf and zlib), so a binary that imports this package without perfbuf
// (its tests, for one) links the libbpf perfbuf links: the system one
// through pkg-config, or the static one with the perfbuf_static tag.

/*
#cgo !perfbuf_static pkg-config: libbpf
#cgo perfbuf_static LDFLAGS: -l:libbpf.a -lelf -lz
*/
import "C"
