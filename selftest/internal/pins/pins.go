// SPDX-License-Identifier: Apache-2.0

// Package pins gives the selftests a directory in the BPF file system to
// pin maps in. It needs no cgo, so that the libbpfgo selftests and the
// cilium/ebpf ones (which run without cgo too) share it.
package pins

import (
	"fmt"
	"os"
	"testing"

	"golang.org/x/sys/unix"
)

// Root is where Dir makes its directories: the bpffs of a booted host.
const Root = "/sys/fs/bpf"

// mountLock is the file whose flock(2) makes Mount's look and mount one
// step across the test processes that go test runs at once.
const mountLock = "/run/perfbuf-test-bpffs.lock"

// Dir returns a new directory in the bpffs at Root, mounting one there if
// there is none (Mount); the directory goes at cleanup, the mount stays.
func Dir(t testing.TB) string {
	t.Helper()
	if err := Mount(); err != nil {
		t.Fatal(err)
	}
	dir, err := os.MkdirTemp(Root, "perfbuf-test-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

// Mount mounts a bpffs at Root unless one is there, and leaves it there,
// as a booted host has it. The packages' tests run in processes at once
// and share it: a test that took its mount down at cleanup took another
// package's pinned maps with it (their children's opens failed with
// ENOENT), and two that mounted at once stacked two, the second hiding
// the first's pins. The look and the mount are one step under mountLock.
func Mount() error {
	lock, err := os.OpenFile(mountLock, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return fmt.Errorf("bpffs mount lock: %w", err)
	}
	defer lock.Close() // drops the flock
	if err := unix.Flock(int(lock.Fd()), unix.LOCK_EX); err != nil {
		return fmt.Errorf("bpffs mount lock %s: %w", mountLock, err)
	}
	if isBpffs(Root) {
		return nil
	}
	if err := unix.Mount("bpf", Root, "bpf", 0, ""); err != nil {
		return fmt.Errorf("mount bpffs at %s: %w", Root, err)
	}
	return nil
}

// isBpffs reports whether path is in a bpffs.
func isBpffs(path string) bool {
	var st unix.Statfs_t
	return unix.Statfs(path, &st) == nil && st.Type == unix.BPF_FS_MAGIC
}
