// SPDX-License-Identifier: Apache-2.0

package cref

import (
	"encoding/binary"
	"testing"
)

func TestReadAll(t *testing.T) {
	p := make([]byte, 19)
	binary.NativeEndian.PutUint64(p[0:], 1<<40)
	binary.NativeEndian.PutUint64(p[8:], 7)
	p[16], p[17], p[18] = 1, 2, 250
	if got, want := ReadAll(p), uint64(1<<40+7+1+2+250); got != want {
		t.Errorf("ReadAll = %d, want %d", got, want)
	}
	if got := ReadAll(nil); got != 0 {
		t.Errorf("ReadAll(nil) = %d", got)
	}
}

func TestLibbpfVersion(t *testing.T) {
	if v := LibbpfVersion(); len(v) < 2 || v[0] != 'v' {
		t.Errorf("LibbpfVersion = %q", v)
	}
}
