//go:build !cgo

package perfbuf

// What perfbuf_cgo.go gives through libbpf, in a build without cgo: each
// call fails with ErrNoCgo (errors.go). Everything else (the ring reader,
// the readers over rings of your own) is pure Go.

import "unsafe"

type cBuffer struct{}

func openC(fd int, cfg ringConfig, cpus []int32) (*cBuffer, error) { return nil, ErrNoCgo }

func mapInfo(fd int) (mapDesc, error) { return mapDesc{}, ErrNoCgo }

func mapTypeName(t uint32) string { return "unknown" }

func lookupPerCPU(fd int, key uint32, out []uint64) error { return ErrNoCgo }

func innerMapID(fd int, key uint32) (uint32, error) { return 0, ErrNoCgo }

func updatePerCPU(fd int, key uint32, vals []uint64) error { return ErrNoCgo }

func mapFDByID(id uint32) (int, error) { return -1, ErrNoCgo }

// The methods below are unreachable: openC never returns a cBuffer.
func (c *cBuffer) close()                                  {}
func (c *cBuffer) bufferCount() int                        { return 0 }
func (c *cBuffer) bufferFD(i int) int                      { return -1 }
func (c *cBuffer) epollFD() int                            { return -1 }
func (c *cBuffer) ring(i int) (unsafe.Pointer, int, error) { return nil, 0, ErrNoCgo }
