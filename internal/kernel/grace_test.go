// SPDX-License-Identifier: Apache-2.0

package kernel

import (
	"encoding/binary"
	"os"
	"runtime"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
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
func spinProgram(t *testing.T, m testMap) int {
	t.Helper()
	if major, minor, err := Version(); err != nil || major < 5 || major == 5 && minor < 17 {
		t.Skipf("kernel %d.%d (%v): bpf_loop needs 5.17", major, minor, err)
	}
	// bpf_loop's callback is a function of its own, which the verifier
	// finds by the program's BTF function info: int spin(void *ctx), and
	// static long tick(u64 i, void *ctx).
	var b btfBlob
	intT := b.add(b.name("int"), btfInfo(btfKindInt, 0), 4, btfIntSigned|32)
	voidPtr := b.add(0, btfInfo(btfKindPtr, 0), 0)
	spinProto := b.add(0, btfInfo(btfKindFuncProto, 1), intT, b.name("ctx"), voidPtr)
	spin := b.add(b.name("spin"), btfInfo(btfKindFunc, btfFuncGlobal), spinProto)
	u64T := b.add(b.name("u64"), btfInfo(btfKindInt, 0), 8, 64)
	longT := b.add(b.name("long"), btfInfo(btfKindInt, 0), 8, btfIntSigned|64)
	tickProto := b.add(0, btfInfo(btfKindFuncProto, 2), longT, b.name("i"), u64T, b.name("ctx"), voidPtr)
	tick := b.add(b.name("tick"), btfInfo(btfKindFunc, btfFuncStatic), tickProto)
	const tickAt = 18 // the instruction tick starts at
	var insns []insn
	insns = append(insns, stW(rFP, -4, 0))
	insns = append(insns, ldImm64(r1, pseudoMapFD, int32(m.FD()))...)
	insns = append(insns,
		movReg(r2, rFP),
		addImm(r2, -4),
		call(helperMapLookupElem),
		jeqImm(r0, 0, 9), // to out
		movReg(r6, r0),
		stW(r6, 0, 1), // started
		movImm(r1, spinLoops),
	)
	insns = append(insns, ldImm64(r2, pseudoFunc, tickAt-11)...) // from the next instruction
	insns = append(insns,
		movImm(r3, 0),
		movImm(r4, 0),
		call(helperLoop),
		stW(r6, 8, 1), // ended
		movImm(r0, 0), // out
		exit(),
		call(helperKtimeGetNs), // tick
		movImm(r0, 0),          // go on
		exit(),
	)
	if len(insns) != 21 {
		t.Fatalf("%d instructions, the jumps count 21", len(insns))
	}
	return loadSocketFilter(t, insns, b.bytes(), []funcInfo{{0, spin}, {tickAt, tick}})
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
	m := newMap(t, mapCreateAttr{mapType: unix.BPF_MAP_TYPE_ARRAY, keySize: 4, valueSize: 16, maxEntries: 1}, "")
	p := spinProgram(t, m)
	state := func() (started, ended bool) {
		v := make([]byte, 16)
		if err := m.lookup(0, v); err != nil {
			t.Fatal(err)
		}
		return binary.NativeEndian.Uint64(v) != 0, binary.NativeEndian.Uint64(v[8:]) != 0
	}
	const attempts = 10
	for attempt := range attempts {
		if err := m.update(0, make([]byte, 16)); err != nil {
			t.Fatal(err)
		}
		ran := make(chan error, 1)
		go func() {
			_, err := testRun(p, make([]byte, 14))
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
