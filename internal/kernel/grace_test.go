// SPDX-License-Identifier: Apache-2.0

package kernel

import (
	"encoding/binary"
	"errors"
	"os"
	"runtime"
	"syscall"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
)

// refuseMembarrier makes membarrier refuse MEMBARRIER_CMD_GLOBAL, and leave
// it out of its query, as a kernel with nohz_full CPUs does, until the test
// ends; it counts the refusals.
func refuseMembarrier(t *testing.T) *int {
	t.Helper()
	refused := new(int)
	real := membarrier
	membarrier = func(cmd int) (int, error) {
		mask, err := real(cmd)
		switch cmd {
		case membarrierCmdQuery:
			return mask &^ membarrierCmdGlobal, err
		case membarrierCmdGlobal:
			*refused++
			return 0, syscall.EINVAL
		}
		return mask, err
	}
	t.Cleanup(func() { membarrier = real })
	return refused
}

// requireGraceMaps skips (fails under CI) when the array of maps cannot be
// made: no CAP_BPF.
func requireGraceMaps(t *testing.T) {
	t.Helper()
	if _, _, err := graceMaps.fds(); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("privileged test under CI: %v", err)
		}
		t.Skipf("needs CAP_BPF: %v", err)
	}
}

// WaitWriters returns (a grace period) on this kernel.
func TestWaitWriters(t *testing.T) {
	if err := WaitWriters(); err != nil {
		t.Fatal(err)
	}
	if !CanWaitWriters() {
		t.Error("CanWaitWriters false after a WaitWriters that waited")
	}
}

// Where membarrier is refused (nohz_full), WaitWriters waits through the
// array of maps, and CanWaitWriters says it can; membarrier is not needed.
func TestWaitWritersMembarrierRefused(t *testing.T) {
	requireGraceMaps(t)
	refused := refuseMembarrier(t)
	if mask, err := membarrier(membarrierCmdQuery); err != nil || mask&membarrierCmdGlobal != 0 {
		t.Fatalf("the fake query says %#x, %v; want the global command left out", mask, err)
	}
	if err := WaitWriters(); err != nil {
		t.Fatalf("WaitWriters with membarrier refused: %v", err)
	}
	if !CanWaitWriters() {
		t.Error("CanWaitWriters false with membarrier refused, though the array of maps can wait")
	}
	if *refused != 0 {
		t.Errorf("membarrier asked %d times, want none: the array of maps waits", *refused)
	}
}

// spinIterations is how many times spinProgram calls bpf_ktime_get_ns: the
// verifier walks every iteration (4 instructions each) within its 1M.
const spinIterations = 150_000

// spinProgram is a socket filter that sets word 0 of the array m's value,
// calls bpf_ktime_get_ns spinIterations times (milliseconds), then sets
// word 1: a program that runs for a while inside its RCU read-side section
// (BPF_PROG_TEST_RUN runs it within rcu_read_lock).
func spinProgram(t *testing.T, m *ebpf.Map) *ebpf.Program {
	t.Helper()
	insns := asm.Instructions{
		asm.StoreImm(asm.RFP, -4, 0, asm.Word),
		asm.LoadMapPtr(asm.R1, m.FD()),
		asm.Mov.Reg(asm.R2, asm.RFP),
		asm.Add.Imm(asm.R2, -4),
		asm.FnMapLookupElem.Call(),
		asm.JEq.Imm(asm.R0, 0, "out"),
		asm.Mov.Reg(asm.R7, asm.R0),
		asm.StoreImm(asm.R7, 0, 1, asm.Word),
		asm.Mov.Imm(asm.R8, 0),
		asm.FnKtimeGetNs.Call().WithSymbol("loop"),
		asm.Add.Imm(asm.R8, 1),
		asm.JLT.Imm(asm.R8, spinIterations, "loop"),
		asm.StoreImm(asm.R7, 8, 1, asm.Word),
		asm.Mov.Imm(asm.R0, 0).WithSymbol("out"),
		asm.Return(),
	}
	p, err := ebpf.NewProgram(&ebpf.ProgramSpec{Type: ebpf.SocketFilter, License: "GPL", Instructions: insns})
	if err != nil {
		if os.Getenv("CI") == "true" || !errors.Is(err, syscall.EPERM) {
			t.Fatalf("load the spinning program: %v", err)
		}
		t.Skipf("load the spinning program (needs CAP_BPF): %v", err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}

// The array of maps' update waits for a BPF program that was running when
// it began: the program is seen started and not ended, then mapGrace
// returns, and by then the program has ended. With no wait the program,
// milliseconds long, would still be running.
func TestMapGraceWaitsForProgram(t *testing.T) {
	if runtime.NumCPU() < 2 {
		t.Skip("needs 2 CPUs: one runs the program while another waits")
	}
	requireGraceMaps(t)
	m := newMap(t, &ebpf.MapSpec{Type: ebpf.Array, KeySize: 4, ValueSize: 16, MaxEntries: 1})
	p := spinProgram(t, m)
	state := func() (started, ended bool) {
		v := make([]byte, 16)
		if err := m.Lookup(uint32(0), &v); err != nil {
			t.Fatal(err)
		}
		return binary.NativeEndian.Uint64(v) != 0, binary.NativeEndian.Uint64(v[8:]) != 0
	}
	const attempts = 50
	for range attempts {
		if err := m.Put(uint32(0), make([]byte, 16)); err != nil {
			t.Fatal(err)
		}
		ran := make(chan error, 1)
		go func() {
			_, _, err := p.Test(make([]byte, 14))
			ran <- err
		}()
		caught := false
		for {
			started, ended := state()
			if ended {
				break // over before it was seen running: again
			}
			if !started {
				runtime.Gosched()
				continue
			}
			// Running now, inside its read-side section.
			if err := mapGrace(); err != nil {
				t.Fatal(err)
			}
			if _, ended := state(); !ended {
				t.Fatal("mapGrace returned while the program it found running still ran")
			}
			caught = true
			break
		}
		if err := <-ran; err != nil {
			t.Fatal(err)
		}
		if caught {
			return
		}
	}
	t.Fatalf("the program was never seen running in %d runs of %d iterations", attempts, spinIterations)
}

// The cost of one grace period each way, on this host: membarrier's and the
// array of maps' update.
func BenchmarkGrace(b *testing.B) {
	b.Run("membarrier", func(b *testing.B) {
		if _, err := membarrier(membarrierCmdGlobal); err != nil {
			b.Skipf("membarrier global: %v", err)
		}
		for b.Loop() {
			_, _ = membarrier(membarrierCmdGlobal)
		}
	})
	b.Run("map", func(b *testing.B) {
		if err := mapGrace(); err != nil {
			b.Skip(err)
		}
		for b.Loop() {
			_ = mapGrace()
		}
	})
}
