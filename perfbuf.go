// SPDX-License-Identifier: Apache-2.0

// Package perfbuf reads what BPF programs emit, perf event arrays
// (BPF_MAP_TYPE_PERF_EVENT_ARRAY, a ring per CPU) and BPF ring buffers
// (BPF_MAP_TYPE_RINGBUF), behind one API, reading the rings' memory in pure
// Go. Four ways to read:
//
//   - [NewReader]: a [Reader] over every ring, with blocking reads
//     ([Reader.ReadBatch], [Reader.Each], [Reader.ReadInto], [Reader.All]),
//     deadlines, [Reader.Flush] and [Rings.Close]; the fullest ring first,
//     or in the order of a key ([Order]).
//   - [New]: callback mode under libbpf's names: [PerfBuffer.Poll] hands
//     each sample to a function, as perf_buffer__poll does.
//   - [NewRaw]: a [RawBuffer] per ring, for consumers of their own:
//     zero-copy records, peeking without committing, the fill level.
//   - [NewRecorder]: a flight recorder over rings that the kernel
//     overwrites (backward perf rings, ring buffers in overwrite mode):
//     nothing is read until [Recorder.Snapshot] copies the newest records.
//
// Every sample the programs output is accounted for in [Stats]: delivered,
// lost, left at Close, or failed before reaching a ring (with a
// [Options].FailureMap; docs/failures.md).
//
// Errors are wrapped with context and match with errors.Is: the sentinels
// below, os.ErrInvalid for an argument out of range, os.ErrClosed after
// Close, os.ErrDeadlineExceeded; an errno from libbpf or the kernel stays a
// syscall.Errno.
package perfbuf

import (
	"fmt"
	"os"
	"time"

	"github.com/perfbuf/perfbuf/internal/owner"
)

// PerfBuffer reads every ring of a map in callback mode, under libbpf's
// names (perf_buffer__poll is [PerfBuffer.Poll], and so on): each sample
// goes to a function, with the CPU it came from.
//
// Its methods may be called from any goroutine: drains are serialised, and
// a Poll waiting holds no lock. Close may be called from any goroutine,
// also from a callback. A call from inside a callback that would wait for
// a drain fails with [ErrReentrant].
type PerfBuffer struct {
	Rings
	pb *owner.PerfBuffer
}

// New opens the rings of m, as [NewReader] does, for callback mode: sample
// receives each sample and lost, if not nil, each count of samples a full
// perf ring dropped, with the CPU they came from (-1 for a ring shared by
// CPUs). data aliases ring memory and is valid only during the call.
//
// Errors: as NewReader's, and os.ErrInvalid for a nil sample.
func New(m Map, sample func(cpu int, data []byte), lost func(cpu int, count uint64), opts Options) (*PerfBuffer, error) {
	const op = "new PerfBuffer"
	if err := opts.check(); err != nil {
		return nil, wrap(op, err)
	}
	if sample == nil {
		return nil, fmt.Errorf("%s: nil sample function: %w", op, os.ErrInvalid)
	}
	c, err := owner.Open(m, opts.ring(), ownerMaps(opts.Maps), opts.FailureMap, opts.Programs)
	if err != nil {
		return nil, wrap(op, err)
	}
	return newPerfBuffer(c, sample, lost), nil
}

// newPerfBuffer is New over a core already open (tests pass cores over
// rings of their own).
func newPerfBuffer(c *owner.Core, sample func(int, []byte), lost func(int, uint64)) *PerfBuffer {
	return &PerfBuffer{Rings{c}, owner.NewPerfBuffer(c, sample, lost)}
}

// Poll waits up to timeout for a wakeup, then drains every ring that holds
// records, and returns how many it delivered (perf_buffer__poll). A
// negative timeout waits until a ring is ready or Close is called; zero
// does not wait. It waits in the Go runtime's netpoller, parking its
// goroutine, not a thread; concurrent Polls wait one after another.
//
// Errors: os.ErrClosed; a *[CorruptError] for a ring that held what the
// kernel never writes, got past and counted once the other records are
// delivered; [ErrReentrant]; a syscall.Errno from epoll.
func (pb *PerfBuffer) Poll(timeout time.Duration) (int, error) { return pb.pb.Poll(timeout) }

// Consume drains every ring without waiting and returns the number of
// records delivered (perf_buffer__consume). Errors: as Poll's, but for the
// wait's.
func (pb *PerfBuffer) Consume() (int, error) { return pb.pb.Consume() }

// ConsumeBuffer drains ring i without waiting and returns the number of
// records delivered (perf_buffer__consume_buffer). Errors: as Consume's,
// and os.ErrInvalid for an index out of range.
func (pb *PerfBuffer) ConsumeBuffer(i int) (int, error) { return pb.pb.ConsumeBuffer(i) }
