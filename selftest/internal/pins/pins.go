// SPDX-License-Identifier: Apache-2.0

// Package pins gives the selftests a directory in the BPF file system to
// pin maps in. It needs no cgo, so that the libbpfgo selftests and the
// cilium/ebpf ones (which run without cgo too) share it.
package pins

import (
	"os"
	"testing"

	"golang.org/x/sys/unix"
)

// Dir returns a new directory in the bpffs at /sys/fs/bpf, mounting one
// there if there is none; both go at cleanup.
func Dir(t testing.TB) string {
	t.Helper()
	const root = "/sys/fs/bpf"
	var st unix.Statfs_t
	if err := unix.Statfs(root, &st); err != nil || st.Type != unix.BPF_FS_MAGIC {
		if err := unix.Mount("bpf", root, "bpf", 0, ""); err != nil {
			t.Fatalf("mount bpffs at %s: %v", root, err)
		}
		t.Cleanup(func() { unix.Unmount(root, unix.MNT_DETACH) })
	}
	dir, err := os.MkdirTemp(root, "perfbuf-test-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}
