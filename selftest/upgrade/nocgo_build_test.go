// SPDX-License-Identifier: Apache-2.0

//go:build !cgo || perfbuf_nolibbpf

package upgrade

const libbpfOpener = false
