//go:build !cgo

package perfbuf

import (
	"errors"
	"unsafe"
)

// ErrNoCgo: perfbuf opens its rings through libbpf, with cgo; this binary
// was built without it. Everything else (the ring reader, the readers over
// rings of your own) is pure Go.
var ErrNoCgo = errors.New("perfbuf needs cgo (CGO_ENABLED=1) and libbpf")

type cBuffer struct{}

func openC(fd int, cfg ringConfig, cpus []int32) (*cBuffer, error) { return nil, ErrNoCgo }

func mapInfo(fd int) (mapDesc, error) { return mapDesc{}, ErrNoCgo }

func mapTypeName(t uint32) string { return "unknown" }

func lookupPerCPU(fd int, out []uint64) error { return ErrNoCgo }

func innerMapID(fd int, key uint32) (uint32, error) { return 0, ErrNoCgo }

func updatePerCPU(fd int, key uint32, vals []uint64) error { return ErrNoCgo }

func mapFDByID(id uint32) (int, error) { return -1, ErrNoCgo }

// The methods below are unreachable: openC never returns a cBuffer.
func (c *cBuffer) close()                                  {}
func (c *cBuffer) bufferCount() int                        { return 0 }
func (c *cBuffer) bufferFD(i int) int                      { return -1 }
func (c *cBuffer) epollFD() int                            { return -1 }
func (c *cBuffer) ring(i int) (unsafe.Pointer, int, error) { return nil, 0, ErrNoCgo }
