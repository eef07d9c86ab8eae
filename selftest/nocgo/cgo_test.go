// SPDX-License-Identifier: Apache-2.0

//go:build cgo && !perfbuf_nolibbpf

package nocgo

// libbpfOpener says whether this build has libbpf's opener: cgo without
// the tag perfbuf_nolibbpf.
const libbpfOpener = true
