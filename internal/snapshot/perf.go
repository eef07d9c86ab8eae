// SPDX-License-Identifier: Apache-2.0

package snapshot

// A backward perf ring (perf_event_attr.write_backward, kernel 4.7), mapped read-only so
// that the kernel overwrites its oldest records (rb->overwrite: kernel/events/ring_buffer.c,
// __perf_output_begin). The kernel writes each record below the last one: data_head
// starts at 0 and decreases by each record's size, a negative free-running position. The
// bytes from data_head up are the records, newest first, and 0 - data_head bytes were
// written in all; once that passes the ring's size, the oldest record in the window is
// partly overwritten.
//
//	positions:  head          head+s1        head+s1+s2 ...      head+size
//	            | newest (s1) | older (s2)   | ...   | partial    |

import (
	"encoding/binary"
	"fmt"
	"sync/atomic"
)

// PerfRing is a backward perf ring's memory.
type PerfRing struct {
	// Head is the perf_event_mmap_page's data_head.
	Head *uint64
	// Data is the data area: data_size bytes at data_offset of the mapping, a power of two.
	Data []byte
}

// PerfOptions are a perf snapshot's options.
type PerfOptions struct {
	// From leaves out the records at positions from From on: a previous snapshot's End
	// returns only the records written since. 0: every record in the ring.
	From uint64
	// Settle, if set, runs between the copy and the check, and must return only once
	// every writer that was writing when it was called has published data_head:
	// internal/kernel's WaitWriters. With it, the ring need not be paused (see Perf).
	// An error from it ends the snapshot.
	Settle func() error
	// Time says that each sample carries the kernel's time of its output before its raw
	// data (PERF_SAMPLE_TIME: u64 time, then u32 size and data), which Record.Time
	// returns.
	Time bool
}

// perfHeaderSize is sizeof(struct perf_event_header): u32 type, u16 misc, u16 size.
const perfHeaderSize = 8

// Perf copies the whole records of a backward perf ring into buf and returns them, oldest
// first (a lost record before the output it was written with, as the kernel writes
// them), appended to recs[:0] (which it reuses). The newest records are kept when buf
// cannot hold them all (the older ones are counted in NoRoom); when the newest alone does
// not fit, the error is a *ShortBufferError. Samples and lost records are returned;
// records of other types are counted in Other.
//
// The walk starts at data_head and stops at the first of: what was written (0 - data_head
// bytes), the ring's size (where the oldest record is partly overwritten), o.From, or a
// record that cannot be valid (a size under 8 or not a multiple of 8, a payload too short
// for its type, or, in a ring never wrapped, a record running past what was written:
// Counts.Corrupt).
//
// Consistency: the kernel publishes data_head only after the record's bytes are written
// (perf_output_put_handle: smp_wmb, then the store of data_head), so a writer in flight
// is invisible to data_head while it writes. Either the caller stops the writers before
// the call (PERF_EVENT_IOC_PAUSE_OUTPUT, then a wait for the writers that had passed the
// pause check: internal/kernel's WaitWriters, an RCU grace period, which
// perf_output_begin..end, run with preemption off, cannot span), or o.Settle waits for
// them after the copy: a writer that wrote any byte the copy loaded was writing when
// Settle began, so it has published its data_head when Settle returns. Perf then loads
// data_head again and drops the records whose bytes a writer that published meanwhile
// reused (Overwritten). The copy's atomic loads keep the check's load of data_head after
// them (see the package comment); Settle's system call is a full barrier besides.
func Perf(r PerfRing, buf []byte, recs []Record, o PerfOptions) (Snapshot, error) {
	if err := checkData(r.Data); err != nil {
		return Snapshot{}, err
	}
	size := uint64(len(r.Data))
	mask := size - 1
	s := Snapshot{Records: recs[:0]}
	// Acquire: pairs with the smp_wmb before the kernel's store of data_head in
	// perf_output_put_handle, so the records from head up are written.
	head := atomic.LoadUint64(r.Head)
	s.End = head
	if head&7 != 0 {
		s.Corrupt = true // the kernel's records are 8-byte aligned, so is its head
		return s, nil
	}
	written := -head
	wrapped := written > size
	end := head + min(written, size)
	if o.From-head < end-head {
		end = o.From
	}
	fixed := 4 // a sample's fields before its raw data: u32 size, and u64 time first with o.Time
	if o.Time {
		fixed = 12
	}
	free := len(buf) // the records fill buf from its end down: the newest last
	full := false
	var shortErr error
	pos := head
	for pos != end {
		left := end - pos
		if left < perfHeaderSize {
			s.Corrupt = !wrapped && o.From == 0
			break
		}
		var h [perfHeaderSize]byte
		binary.NativeEndian.PutUint64(h[:], word(r.Data, pos&mask))
		typ := binary.NativeEndian.Uint32(h[0:4])
		rsize := uint64(binary.NativeEndian.Uint16(h[6:8]))
		if rsize < perfHeaderSize || rsize&7 != 0 {
			s.Corrupt = true
			break
		}
		if rsize > left {
			// The oldest record of a wrapped ring, partly overwritten; in a ring
			// never wrapped, a record past what was written.
			s.Corrupt = !wrapped && end-head == written
			break
		}
		body := int(rsize - perfHeaderSize)
		switch {
		case typ == PerfRecordSample && body < fixed, typ == PerfRecordLost && body < 16:
			s.Corrupt = true
		case typ != PerfRecordSample && typ != PerfRecordLost:
			s.Other++
			pos += rsize
			continue
		case full || body > free:
			if len(s.Records) == 0 && shortErr == nil && !full {
				shortErr = &ShortBufferError{Need: body, Have: len(buf)}
			}
			full = true
			s.NoRoom++
			pos += rsize
			continue
		}
		if s.Corrupt {
			break
		}
		dst := buf[free-body : free]
		copyWords(dst, r.Data, (pos+perfHeaderSize)&mask, body)
		rec := Record{Pos: pos, Type: typ, size: uint32(rsize)}
		if typ == PerfRecordLost {
			rec.Lost = binary.NativeEndian.Uint64(dst[8:16]) // struct {u64 id; u64 lost}
		} else {
			if o.Time {
				rec.Time = binary.NativeEndian.Uint64(dst[0:8])
			}
			// PERF_SAMPLE_RAW: u32 size, data.
			raw := int(binary.NativeEndian.Uint32(dst[fixed-4 : fixed]))
			if raw > body-fixed {
				s.Corrupt = true
				break
			}
			rec.Data = dst[fixed : fixed+raw]
		}
		free -= body
		s.Records = append(s.Records, rec)
		pos += rsize
	}
	if o.Settle != nil {
		if err := o.Settle(); err != nil {
			s.Records = s.Records[:0]
			return s, fmt.Errorf("settle perf ring writers: %w", err)
		}
	}
	// The check: data_head again, after the copy's atomic loads (and Settle). A writer that published
	// a record since wrote from head2 up to head, the same ring bytes as from
	// head2+size up to head+size: drop the records reaching past head2+size (a suffix,
	// the oldest), and any corruption seen past it was that writer's bytes.
	head2 := atomic.LoadUint64(r.Head)
	if head2 != head {
		limit := head2 + size // records must end at or before it (wrap-safe below)
		keep := len(s.Records)
		for keep > 0 && after(s.Records[keep-1].Pos+uint64(s.Records[keep-1].size), limit) {
			keep--
		}
		s.Overwritten += uint64(len(s.Records) - keep)
		s.Records = s.Records[:keep]
		if !after(limit, pos) {
			s.Corrupt = false
		}
		if head-head2 >= size || after(head2, head) {
			s.Overwritten += uint64(keep)
			s.Records = s.Records[:0]
		}
	}
	if shortErr != nil && len(s.Records) == 0 {
		return s, shortErr
	}
	// Oldest first.
	for i, j := 0, len(s.Records)-1; i < j; i, j = i+1, j-1 {
		s.Records[i], s.Records[j] = s.Records[j], s.Records[i]
	}
	// The kernel writes a lost record with the output that follows the refused ones, in
	// one reservation, the lost record first: in a backward ring, below the output
	// (__perf_output_begin). Each such pair is put back in the order it was written.
	for i := 1; i < len(s.Records); i++ {
		r := &s.Records[i]
		if r.Type == PerfRecordLost && s.Records[i-1].Pos == r.Pos+uint64(r.size) {
			s.Records[i-1], s.Records[i] = s.Records[i], s.Records[i-1]
			i++
		}
	}
	return s, nil
}
