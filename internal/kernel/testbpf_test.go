// SPDX-License-Identifier: Apache-2.0

package kernel

// The maps and programs the tests make, with plain bpf(2) calls: the
// module requires golang.org/x/sys alone, so no BPF library makes them.
// Each attribute struct is the head of union bpf_attr's part for its
// command (include/uapi/linux/bpf.h), pointers as __aligned_u64; the
// kernel treats the fields after it as zero.

import (
	"encoding/binary"
	"errors"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"
)

// testMap is a map made for a test, closed when the test ends.
type testMap struct{ fd int }

// FD returns the map's descriptor.
func (m testMap) FD() int { return m.fd }

// newMap makes the map a describes, named name, or skips (fails under CI)
// without the privileges.
func newMap(t *testing.T, a mapCreateAttr, name string) testMap {
	t.Helper()
	fd, err := createMap(a, name)
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("privileged test under CI: create map of type %d: %v", a.mapType, err)
		}
		t.Skipf("create map of type %d (needs CAP_BPF): %v", a.mapType, err)
	}
	t.Cleanup(func() { unix.Close(fd) })
	return testMap{fd}
}

// lookup reads key's value into value (BPF_MAP_LOOKUP_ELEM): for a per-CPU
// map, each possible CPU's value in turn, each rounded up to 8 bytes.
func (m testMap) lookup(key uint32, value []byte) error {
	a := mapElemAttr{mapFD: uint32(m.fd), key: unsafe.Pointer(&key), value: unsafe.Pointer(&value[0])}
	_, err := bpf(unix.BPF_MAP_LOOKUP_ELEM, &a)
	return err
}

// update writes value at key (BPF_MAP_UPDATE_ELEM, BPF_ANY).
func (m testMap) update(key uint32, value []byte) error {
	a := mapElemAttr{mapFD: uint32(m.fd), key: unsafe.Pointer(&key), value: unsafe.Pointer(&value[0]), flags: unix.BPF_ANY}
	_, err := bpf(unix.BPF_MAP_UPDATE_ELEM, &a)
	return err
}

// fdinfoMapID returns the map ID that /proc/self/fdinfo shows for fd: what
// the kernel says of the map, read another way than BPF_OBJ_GET_INFO_BY_FD.
func fdinfoMapID(t *testing.T, fd int) uint32 {
	t.Helper()
	b, err := os.ReadFile("/proc/self/fdinfo/" + strconv.Itoa(fd))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if n, ok := strings.CutPrefix(line, "map_id:"); ok {
			id, err := strconv.ParseUint(strings.TrimSpace(n), 10, 32)
			if err != nil {
				t.Fatal(err)
			}
			return uint32(id)
		}
	}
	t.Fatalf("no map_id in /proc/self/fdinfo/%d", fd)
	return 0
}

// insn is a struct bpf_insn.
type insn struct {
	code byte
	regs byte // dst_reg and src_reg, 4 bits each (regs)
	off  int16
	imm  int32
}

// The instructions the tests' programs use (include/uapi/linux/bpf.h,
// include/uapi/linux/bpf_common.h): opcode, registers, operands.
func stW(dst byte, off int16, imm int32) insn    { return insn{0x62, regs(dst, 0), off, imm} } // BPF_ST|BPF_MEM|BPF_W
func movImm(dst byte, imm int32) insn            { return insn{0xb7, regs(dst, 0), 0, imm} }   // BPF_ALU64|BPF_MOV|BPF_K
func movReg(dst, src byte) insn                  { return insn{0xbf, regs(dst, src), 0, 0} }
func addImm(dst byte, imm int32) insn            { return insn{0x07, regs(dst, 0), 0, imm} } // BPF_ALU64|BPF_ADD|BPF_K
func call(helper int32) insn                     { return insn{0x85, 0, 0, helper} }
func jeqImm(dst byte, imm int32, off int16) insn { return insn{0x15, regs(dst, 0), off, imm} }
func exit() insn                                 { return insn{0x95, 0, 0, 0} }

// ldImm64 loads imm into dst, src saying what it is (BPF_PSEUDO_MAP_FD: a
// map descriptor; BPF_PSEUDO_FUNC: a function, as an instruction offset
// from the next instruction): two instructions.
func ldImm64(dst, src byte, imm int32) []insn {
	return []insn{{0x18, regs(dst, src), 0, imm}, {}}
}

// regs packs dst_reg and src_reg as the C bit-fields lie: dst_reg first,
// in the low nibble on a little-endian host, the high one on a big-endian.
func regs(dst, src byte) byte {
	if binary.NativeEndian.Uint16([]byte{0, 1}) == 1 {
		return dst<<4 | src
	}
	return src<<4 | dst
}

// The registers, pseudo sources and helpers used.
const (
	r0, r1, r2, r3, r4, r6, rFP = 0, 1, 2, 3, 4, 6, 10
	pseudoMapFD                 = 1 // BPF_PSEUDO_MAP_FD
	pseudoFunc                  = 4 // BPF_PSEUDO_FUNC
	helperMapLookupElem         = 1
	helperKtimeGetNs            = 5
	helperLoop                  = 181
)

// progLoadAttr is union bpf_attr's BPF_PROG_LOAD part, up to func_info_cnt.
type progLoadAttr struct {
	progType           uint32
	insnCnt            uint32
	insns              unsafe.Pointer
	license            unsafe.Pointer
	logLevel           uint32
	logSize            uint32
	logBuf             unsafe.Pointer
	kernVersion        uint32
	progFlags          uint32
	progName           [unix.BPF_OBJ_NAME_LEN]byte
	progIfindex        uint32
	expectedAttachType uint32
	progBTFFD          uint32
	funcInfoRecSize    uint32
	funcInfo           unsafe.Pointer
	funcInfoCnt        uint32
	_                  uint32
}

// btfLoadAttr is union bpf_attr's BPF_BTF_LOAD part.
type btfLoadAttr struct {
	btf         unsafe.Pointer
	btfLogBuf   unsafe.Pointer
	btfSize     uint32
	btfLogSize  uint32
	btfLogLevel uint32
	_           uint32
}

// testRunAttr is union bpf_attr's BPF_PROG_TEST_RUN part, up to duration.
type testRunAttr struct {
	progFD      uint32
	retval      uint32
	dataSizeIn  uint32
	dataSizeOut uint32
	dataIn      unsafe.Pointer
	dataOut     unsafe.Pointer
	repeat      uint32
	duration    uint32
}

// funcInfo is a struct bpf_func_info: where a function starts, and its
// BTF_KIND_FUNC.
type funcInfo struct{ insnOff, typeID uint32 }

// sysBPF makes the bpf(2) command cmd on the attribute a points at, of
// size bytes.
func sysBPF(cmd uintptr, a unsafe.Pointer, size uintptr) (int, error) {
	r, _, errno := unix.Syscall(unix.SYS_BPF, cmd, uintptr(a), size)
	if errno != 0 {
		return -1, errno
	}
	return int(r), nil
}

// loadSocketFilter loads insns as a GPL socket filter, with the function
// info funcs over the BTF blob btf if it is not nil, or skips (fails
// under CI, or on an error other than EPERM) without the privileges. The
// program is closed when the test ends.
func loadSocketFilter(t *testing.T, insns []insn, btf []byte, funcs []funcInfo) int {
	t.Helper()
	license := []byte("GPL\x00")
	log := make([]byte, 1<<16)
	a := progLoadAttr{
		progType: unix.BPF_PROG_TYPE_SOCKET_FILTER,
		insnCnt:  uint32(len(insns)),
		insns:    unsafe.Pointer(&insns[0]),
		license:  unsafe.Pointer(&license[0]),
	}
	if btf != nil {
		b := btfLoadAttr{btf: unsafe.Pointer(&btf[0]), btfSize: uint32(len(btf)),
			btfLogBuf: unsafe.Pointer(&log[0]), btfLogSize: uint32(len(log)), btfLogLevel: 1}
		fd, err := sysBPF(unix.BPF_BTF_LOAD, unsafe.Pointer(&b), unsafe.Sizeof(b))
		if err != nil {
			skipOrFail(t, err, "load BTF", log)
		}
		defer unix.Close(fd)
		a.progBTFFD = uint32(fd)
		a.funcInfoRecSize = uint32(unsafe.Sizeof(funcInfo{}))
		a.funcInfo = unsafe.Pointer(&funcs[0])
		a.funcInfoCnt = uint32(len(funcs))
	}
	fd, err := sysBPF(unix.BPF_PROG_LOAD, unsafe.Pointer(&a), unsafe.Sizeof(a))
	if err != nil {
		// Again with the verifier's log, to say why.
		a.logLevel, a.logSize, a.logBuf = 1, uint32(len(log)), unsafe.Pointer(&log[0])
		_, _ = sysBPF(unix.BPF_PROG_LOAD, unsafe.Pointer(&a), unsafe.Sizeof(a))
		skipOrFail(t, err, "load a program", log)
	}
	t.Cleanup(func() { unix.Close(fd) })
	return fd
}

// skipOrFail skips the test for an EPERM (no CAP_BPF), and fails it under
// CI or for any other error, with the kernel's log.
func skipOrFail(t *testing.T, err error, what string, log []byte) {
	t.Helper()
	if os.Getenv("CI") == "true" || !errors.Is(err, syscall.EPERM) {
		t.Fatalf("%s: %v\n%s", what, err, cString(log))
	}
	t.Skipf("%s (needs CAP_BPF): %v", what, err)
}

// testRun runs the program prog once over data (BPF_PROG_TEST_RUN) and
// returns what it returned.
func testRun(prog int, data []byte) (uint32, error) {
	a := testRunAttr{progFD: uint32(prog), dataSizeIn: uint32(len(data)), dataIn: unsafe.Pointer(&data[0]), repeat: 1}
	if _, err := sysBPF(unix.BPF_PROG_TEST_RUN, unsafe.Pointer(&a), unsafe.Sizeof(a)); err != nil {
		return 0, err
	}
	return a.retval, nil
}

// btfBlob is a BTF blob (include/uapi/linux/btf.h) of types and the
// strings that name them.
type btfBlob struct {
	types   []uint32
	strings []byte
	count   uint32 // types added
}

// name adds s to the strings and returns its offset.
func (b *btfBlob) name(s string) uint32 {
	if len(b.strings) == 0 {
		b.strings = []byte{0}
	}
	off := uint32(len(b.strings))
	b.strings = append(append(b.strings, s...), 0)
	return off
}

// add appends a type (struct btf_type and what follows it), returning its
// ID: types are numbered from 1 in order.
func (b *btfBlob) add(words ...uint32) uint32 {
	b.types = append(b.types, words...)
	b.count++
	return b.count
}

// bytes returns the blob: the header, the types, the strings.
func (b *btfBlob) bytes() []byte {
	const hdrLen = 24
	out := binary.NativeEndian.AppendUint16(nil, 0xeb9f) // BTF_MAGIC
	out = append(out, 1, 0)                              // version, flags
	typeLen := uint32(4 * len(b.types))
	for _, w := range []uint32{hdrLen, 0, typeLen, typeLen, uint32(len(b.strings))} {
		out = binary.NativeEndian.AppendUint32(out, w)
	}
	for _, w := range b.types {
		out = binary.NativeEndian.AppendUint32(out, w)
	}
	return append(out, b.strings...)
}

// The BTF kinds used, and the info word of a type.
const (
	btfKindInt       = 1
	btfKindPtr       = 2
	btfKindFunc      = 12
	btfKindFuncProto = 13
	btfIntSigned     = 1 << 24 // BTF_INT_SIGNED in the int's encoding word
	btfFuncStatic    = 0       // linkage, in a BTF_KIND_FUNC's vlen
	btfFuncGlobal    = 1
)

func btfInfo(kind, vlen uint32) uint32 { return kind<<24 | vlen }

// cString is b up to its first NUL.
func cString(b []byte) string {
	for i, c := range b {
		if c == 0 {
			return string(b[:i])
		}
	}
	return string(b)
}
