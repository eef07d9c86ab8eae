// SPDX-License-Identifier: Apache-2.0

package bpfrun

import (
	"errors"
	"os"
	"testing"
)

func TestEmitStatsSub(t *testing.T) {
	a := EmitStats{Emitted: 10, Failed: 3, Seq: 13}
	b := EmitStats{Emitted: 4, Failed: 1, Seq: 5}
	if got, want := a.Sub(b), (EmitStats{Emitted: 6, Failed: 2, Seq: 8}); got != want {
		t.Errorf("Sub = %+v, want %+v", got, want)
	}
}

func TestCheckPrivileges(t *testing.T) {
	err := CheckPrivileges()
	if os.Geteuid() != 0 && !errors.Is(err, ErrPrivileges) {
		t.Errorf("not root, CheckPrivileges = %v", err)
	}
}

func TestLoadMissing(t *testing.T) {
	if _, err := Load("testdata/missing.bpf.o"); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("Load of a missing object: %v", err)
	}
}

func TestCopyNeedsObject(t *testing.T) {
	e := &Emitter{}
	if _, err := e.Copy(0); err == nil {
		t.Error("Copy of an emitter without an object path succeeded")
	}
	e.Obj = "testdata/missing.bpf.o"
	if _, err := e.Copy(-1); err == nil {
		t.Error("Copy(-1) succeeded")
	}
	if _, err := e.Copy(0); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("Copy of a missing object: %v", err)
	}
	e.CloseCopies() // nothing loaded: nothing to close
}
