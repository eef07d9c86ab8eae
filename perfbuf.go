// SPDX-License-Identifier: Apache-2.0

// Package perfbuf reads what BPF programs emit into perf event arrays and
// BPF ring buffers, behind one API, in pure Go. Four ways to read:
//
//   - [NewReader]: a [Reader] with blocking reads, the fullest ring first
//     or in the order of a key ([Order]);
//   - [New]: callback mode under libbpf's names ([PerfBuffer.Poll]);
//   - [NewRaw]: a [RawBuffer] per ring, zero-copy, for loops of one's own;
//   - [NewRecorder]: a flight recorder over rings the kernel overwrites.
//
// Every sample the programs output is accounted for in [Stats]. Errors
// are wrapped with context and match with errors.Is: the sentinels below,
// os.ErrInvalid, os.ErrClosed, os.ErrDeadlineExceeded; an errno from
// libbpf or the kernel stays a syscall.Errno. The guides are in docs/.
package perfbuf

import (
	"fmt"
	"os"
	"time"

	"github.com/perfbuf/perfbuf/internal/owner"
)

// PerfBuffer reads every ring of a map in callback mode, under libbpf's
// names (perf_buffer__poll is [PerfBuffer.Poll]). Its methods may be
// called from any goroutine; drains run one at a time, and one called from
// inside a callback fails with [ErrReentrant].
type PerfBuffer struct {
	Rings
	pb *owner.PerfBuffer
}

// New opens the rings of m, as [NewReader] does, for callback mode: sample
// receives each sample and lost, if not nil, each count of samples a full
// perf ring dropped, with their CPU (-1 for a ring shared by CPUs). data
// is valid only during the call. Errors: as NewReader's.
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

// Poll waits up to timeout for a wakeup (negative: no limit; zero: no
// wait), then drains every ring that holds records, and returns how many
// it delivered (perf_buffer__poll). It parks its goroutine, not a thread.
// Errors: os.ErrClosed; a *[CorruptError], once per corruption, after the
// other records; [ErrReentrant]; a syscall.Errno from epoll.
func (pb *PerfBuffer) Poll(timeout time.Duration) (int, error) { return pb.pb.Poll(timeout) }

// Consume is Poll without the wait (perf_buffer__consume).
func (pb *PerfBuffer) Consume() (int, error) { return pb.pb.Consume() }

// ConsumeBuffer is Consume of ring i alone (perf_buffer__consume_buffer).
func (pb *PerfBuffer) ConsumeBuffer(i int) (int, error) { return pb.pb.ConsumeBuffer(i) }
