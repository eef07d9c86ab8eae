// SPDX-License-Identifier: Apache-2.0

//go:build !cgo

package nocgo

const cgo = false
