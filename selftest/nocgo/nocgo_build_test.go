// SPDX-License-Identifier: Apache-2.0

//go:build !cgo || perfbuf_nolibbpf

package nocgo

// libbpfOpener: no libbpf in this build (no cgo, or perfbuf_nolibbpf).
const libbpfOpener = false
