// SPDX-License-Identifier: Apache-2.0

package ring

import (
	"bytes"
	"testing"

	"golang.org/x/sys/unix"
)

// TestCopyData copies every length from 0 to 80 bytes into memory too
// small, just large enough and larger, from a source that ends where an
// inaccessible page begins (a read past the payload faults), and checks the
// copy, that the memory is reused when large enough, and that nothing past
// the payload is written.
func TestCopyData(t *testing.T) {
	page := unix.Getpagesize()
	m, err := unix.Mmap(-1, 0, 2*page, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(m)
	if err := unix.Mprotect(m[page:], unix.PROT_NONE); err != nil {
		t.Fatal(err)
	}
	for i := range page {
		m[i] = byte(i*7 + 1)
	}
	const guard = 0xa5
	for n := 0; n <= 80; n++ {
		src := m[page-n : page]
		for _, c := range []int{n - 1, n, n + 16} {
			if c < 0 {
				continue
			}
			backing := bytes.Repeat([]byte{guard}, c+8)
			dst := backing[:min(3, c):c] // (a length of its own, which the copy replaces)
			got := CopyData(dst, src)
			if !bytes.Equal(got, src) {
				t.Fatalf("%d bytes into cap %d: got %x, want %x", n, c, got, src)
			}
			if reused := c >= n && n > 0; reused && &got[0] != &backing[0] {
				t.Errorf("%d bytes into cap %d: memory not reused", n, c)
			}
			if c >= n {
				for i, b := range backing[n:] {
					if b != guard {
						t.Fatalf("%d bytes into cap %d: byte %d past the payload written (%#x)", n, c, i, b)
					}
				}
			}
		}
	}
}

func TestRecordTypeString(t *testing.T) {
	if Sample.String() != "sample" || Lost.String() != "lost" || RecordType(9).String() != "RecordType(9)" {
		t.Fatal("RecordType.String")
	}
}
