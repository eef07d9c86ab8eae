//go:build !cgo

package nocgo

const cgo = false
