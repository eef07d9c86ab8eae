//go:build !cgo

package perfbuf

import (
	"errors"
	"unsafe"
)

// ErrNoCgo: perfbuf wraps libbpf through cgo; this binary was built without it.
var ErrNoCgo = errors.New("perfbuf needs cgo (CGO_ENABLED=1) and libbpf")

type cBuffer struct{ arena []byte }

func openC(fd, pages, wakeupEvents, wakeupBytes int, cpus []int32, arenaCap, reserve int) (*cBuffer, error) {
	return nil, ErrNoCgo
}

func mapInfo(fd int) (mapDesc, error) { return mapDesc{}, ErrNoCgo }

func mapTypeName(t uint32) string { return "unknown" }

// The methods below are unreachable: openC never returns a cBuffer.
func (c *cBuffer) close()                                        {}
func (c *cBuffer) bufferCount() int                              { return 0 }
func (c *cBuffer) bufferFD(i int) int                            { return -1 }
func (c *cBuffer) epollFD() int                                  { return -1 }
func (c *cBuffer) drain(idxs []int32, pos int) (int, int, error) { return 0, len(idxs), ErrNoCgo }
func (c *cBuffer) ring(i int) (unsafe.Pointer, int, error)       { return nil, 0, ErrNoCgo }
