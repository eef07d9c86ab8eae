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
	"github.com/cilium/ebpf/btf"
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

// spinLoops is how many times spinProgram's bpf_loop calls
// bpf_ktime_get_ns: the most bpf_loop allows (1 << 23), about 200 ms.
const spinLoops = 1 << 23

// spinProgram is a socket filter that sets word 0 of the array m's value,
// calls bpf_ktime_get_ns spinLoops times through bpf_loop (5.17), then
// sets word 1: a program that runs for a while inside its RCU read-side
// section (BPF_PROG_TEST_RUN runs it within rcu_read_lock).
func spinProgram(t *testing.T, m *ebpf.Map) *ebpf.Program {
	t.Helper()
	if major, minor, err := Version(); err != nil || major < 5 || major == 5 && minor < 17 {
		t.Skipf("kernel %d.%d (%v): bpf_loop needs 5.17", major, minor, err)
	}
	// bpf_loop's callback is a function of its own, which the verifier
	// finds by the program's BTF function info.
	voidPtr := &btf.Pointer{Target: &btf.Void{}}
	spin := &btf.Func{Name: "spin", Linkage: btf.GlobalFunc, Type: &btf.FuncProto{
		Return: &btf.Int{Name: "int", Size: 4, Encoding: btf.Signed},
		Params: []btf.FuncParam{{Name: "ctx", Type: voidPtr}},
	}}
	tick := &btf.Func{Name: "tick", Linkage: btf.StaticFunc, Type: &btf.FuncProto{
		Return: &btf.Int{Name: "long", Size: 8, Encoding: btf.Signed},
		Params: []btf.FuncParam{{Name: "i", Type: &btf.Int{Name: "u64", Size: 8}}, {Name: "ctx", Type: voidPtr}},
	}}
	insns := asm.Instructions{
		btf.WithFuncMetadata(asm.StoreImm(asm.RFP, -4, 0, asm.Word), spin),
		asm.LoadMapPtr(asm.R1, m.FD()),
		asm.Mov.Reg(asm.R2, asm.RFP),
		asm.Add.Imm(asm.R2, -4),
		asm.FnMapLookupElem.Call(),
		asm.JEq.Imm(asm.R0, 0, "out"),
		asm.Mov.Reg(asm.R6, asm.R0),
		asm.StoreImm(asm.R6, 0, 1, asm.Word), // started
		asm.Mov.Imm(asm.R1, spinLoops),
		asm.Instruction{OpCode: asm.LoadImmOp(asm.DWord), Dst: asm.R2, Src: asm.PseudoFunc, Constant: -1}.WithReference("tick"),
		asm.Mov.Imm(asm.R3, 0),
		asm.Mov.Imm(asm.R4, 0),
		asm.FnLoop.Call(),
		asm.StoreImm(asm.R6, 8, 1, asm.Word), // ended
		asm.Mov.Imm(asm.R0, 0).WithSymbol("out"),
		asm.Return(),
		btf.WithFuncMetadata(asm.FnKtimeGetNs.Call().WithSymbol("tick"), tick),
		asm.Mov.Imm(asm.R0, 0), // go on
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
// a fifth of a second long, would still be running.
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
	const attempts = 10
	for attempt := range attempts {
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
			t.Logf("caught running at run %d", attempt+1)
			return
		}
	}
	t.Fatalf("the program was never seen running in %d runs", attempts)
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
