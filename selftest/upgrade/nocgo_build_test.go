// SPDX-License-Identifier: Apache-2.0

//go:build !cgo

package upgrade

const cgo = false
