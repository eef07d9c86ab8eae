// SPDX-License-Identifier: Apache-2.0

package pins

import (
	"os"
	"runtime"
	"testing"

	"golang.org/x/sys/unix"
)

// cleanups is a testing.TB whose Cleanup functions the test runs itself,
// on its own goroutine (the thread in a mount namespace of its own).
type cleanups struct {
	testing.TB
	fns []func()
}

func (c *cleanups) Cleanup(fn func()) { c.fns = append(c.fns, fn) }

func (c *cleanups) run() {
	for i := len(c.fns) - 1; i >= 0; i-- {
		c.fns[i]()
	}
}

// On a host without a bpffs at Root, Dir mounts one and leaves it mounted
// at its cleanup, which takes only its directory: another package's test
// may be using the mount. (Dir unmounted it at cleanup: on such a host,
// make test's packages running at once lost each other's pinned maps.)
// The test runs in a mount namespace of its own, with Root unmounted.
func TestDirLeavesTheMount(t *testing.T) {
	if os.Geteuid() != 0 {
		if os.Getenv("CI") == "true" {
			t.Fatal("mounts need root, which CI has")
		}
		t.Skip("mounts need root")
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		runtime.LockOSThread() // never unlocked: the thread exits with the goroutine
		if err := unix.Unshare(unix.CLONE_NEWNS); err != nil {
			t.Errorf("unshare: %v", err)
			return
		}
		if err := unix.Mount("none", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
			t.Errorf("make / private: %v", err)
			return
		}
		for isBpffs(Root) {
			if err := unix.Unmount(Root, unix.MNT_DETACH); err != nil {
				t.Errorf("unmount %s: %v", Root, err)
				return
			}
		}
		c := &cleanups{TB: t}
		dir := Dir(c)
		if !isBpffs(dir) {
			t.Errorf("%s: not in a bpffs", dir)
		}
		c.run()
		if _, err := os.Stat(dir); !os.IsNotExist(err) {
			t.Errorf("%s after cleanup: %v, want it gone", dir, err)
		}
		if !isBpffs(Root) {
			t.Errorf("%s after Dir's cleanup: no bpffs, want the mount left", Root)
		}
	}()
	<-done
}
