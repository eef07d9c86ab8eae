// SPDX-License-Identifier: Apache-2.0

package policy

// The window's arena: the copies' payloads.

// arena holds the copies' payloads: chunks filled in the order the copies
// are made, each freed for reuse once its last copy is released. The
// window releases its copies in key order, about the order they came in,
// so that chunks empty in turn; a copy held long (rule 3 bounds how long)
// keeps only its chunk.
type arena struct {
	chunks [][]byte
	live   []int32 // copies not released, per chunk
	spare  []int32 // empty chunks of chunkSize, for reuse
	cur    int32   // the chunk being filled; -1: none
	off    int     // where its free space starts
	bytes  int     // the chunks' bytes, but the spare ones'
	used   int     // the payloads' bytes, each rounded up to 8
}

// chunkSize is an arena chunk's size; a larger payload gets a chunk of
// its own.
const chunkSize = 64 << 10

// arenaRef is where a payload lies: its chunk, offset and length.
type arenaRef struct {
	chunk int32
	off   int32
	n     int32
}

// reserve adds spare chunks for n bytes (rounded down). It makes the
// arena: it is called once, before the first alloc.
func (a *arena) reserve(n int) {
	a.cur = -1
	for range n / chunkSize {
		a.spare = append(a.spare, int32(len(a.chunks)))
		a.chunks, a.live = append(a.chunks, make([]byte, chunkSize)), append(a.live, 0)
	}
}

// alloc returns room for n bytes and where it lies.
func (a *arena) alloc(n int) (arenaRef, []byte) {
	if a.cur < 0 || a.off+n > len(a.chunks[a.cur]) {
		a.next(n)
	}
	ref := arenaRef{chunk: a.cur, off: int32(a.off), n: int32(n)}
	a.live[a.cur]++
	a.off += (n + 7) &^ 7
	a.used += (n + 7) &^ 7
	return ref, a.chunks[a.cur][ref.off : int(ref.off)+n : int(ref.off)+n]
}

// next starts a chunk with room for n bytes.
func (a *arena) next(n int) {
	old := a.cur
	switch k := len(a.spare); {
	case n <= chunkSize && k > 0:
		a.cur, a.spare = a.spare[k-1], a.spare[:k-1]
	default:
		a.cur = int32(len(a.chunks))
		for i, c := range a.chunks {
			if c == nil { // a slot freed by a large chunk
				a.cur = int32(i)
				break
			}
		}
		mem := make([]byte, max(n, chunkSize))
		if int(a.cur) == len(a.chunks) {
			a.chunks, a.live = append(a.chunks, mem), append(a.live, 0)
		} else {
			a.chunks[a.cur] = mem
		}
	}
	a.off = 0
	a.bytes += len(a.chunks[a.cur])
	if old >= 0 && a.live[old] == 0 {
		a.drop(old) // (emptied while it was being filled)
	}
}

// bytesOf returns the payload at ref.
func (a *arena) bytesOf(ref arenaRef) []byte {
	return a.chunks[ref.chunk][ref.off : ref.off+ref.n : ref.off+ref.n]
}

// release frees the payload at ref; its chunk, once empty and no longer
// being filled, is kept for reuse (or dropped, if larger than chunkSize).
func (a *arena) release(ref arenaRef) {
	a.used -= (int(ref.n) + 7) &^ 7
	if a.live[ref.chunk]--; a.live[ref.chunk] == 0 && ref.chunk != a.cur {
		a.drop(ref.chunk)
	}
}

// drop takes empty chunk c out of use.
func (a *arena) drop(c int32) {
	a.bytes -= len(a.chunks[c])
	if len(a.chunks[c]) == chunkSize {
		a.spare = append(a.spare, c)
	} else {
		a.chunks[c] = nil
	}
}
