// SPDX-License-Identifier: Apache-2.0

package failures

import (
	"os"
	"testing"

	"github.com/perfbuf/perfbuf/internal/kernel"
	"github.com/perfbuf/perfbuf/internal/owner"
	"github.com/perfbuf/perfbuf/selftest/internal/bpftest"
	"golang.org/x/sys/unix"
)

// nohzFullEnv, set to 1 by scripts/vmtest.sh in the guest it boots with
// nohz_full, says that this kernel has nohz_full CPUs.
const nohzFullEnv = "PERFBUF_VMTEST_NOHZ_FULL"

// In a nohz_full guest the kernel refuses membarrier's global command, and
// leaves it out of its query (else the guest shows nothing): Close's grace
// period is still waited for, through the array of maps, and
// owner.CloseExact says so. The guest runs the Pause, Close and Snapshot
// selftests besides. Runs only where nohzFullEnv says the kernel is
// nohz_full.
func TestNohzFull(t *testing.T) {
	if os.Getenv(nohzFullEnv) != "1" {
		t.Skipf("%s is not 1: not a nohz_full guest of scripts/vmtest.sh", nohzFullEnv)
	}
	bpftest.RequirePrivileges(t)
	b, _ := os.ReadFile("/sys/devices/system/cpu/nohz_full")
	t.Logf("nohz_full CPUs: %s", b)
	const query, global = 0, 1 // MEMBARRIER_CMD_QUERY, MEMBARRIER_CMD_GLOBAL
	mask, _, errno := unix.Syscall(unix.SYS_MEMBARRIER, query, 0, 0)
	if errno != 0 {
		t.Fatalf("membarrier query: %v", errno)
	}
	if mask&global != 0 {
		t.Fatalf("membarrier query %#x lists MEMBARRIER_CMD_GLOBAL: this kernel is not nohz_full", mask)
	}
	if _, _, errno := unix.Syscall(unix.SYS_MEMBARRIER, global, 0, 0); errno != unix.EINVAL {
		t.Errorf("membarrier global: %v, want EINVAL", errno)
	}
	if err := kernel.WaitWriters(); err != nil {
		t.Errorf("WaitWriters: %v", err)
	}
	if !owner.CloseExact() {
		t.Error("CloseExact false: the grace period is not waited for")
	}
}
