// SPDX-License-Identifier: Apache-2.0

//go:build cgo

package upgrade

// cgo says whether this build has cgo, and so libbpf's opener.
const cgo = true
