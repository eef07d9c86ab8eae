// SPDX-License-Identifier: Apache-2.0

package kernel

// The kernel's count of the outputs a perf ring refused. A full ring (or a
// paused one) refuses an output: bpf_perf_event_output returns -ENOSPC and
// the kernel adds one to the ring's pending loss (rb->lost), which it
// reports only in a PERF_RECORD_LOST written before the next output that
// fits. Losses of a ring that stays full until its reader closes are
// reported nowhere. Since 6.0 the kernel also adds one to the event's
// lost_samples at the same two places (__perf_output_begin: the paused
// ring, and its fail label), which read(2) returns with PERF_FORMAT_LOST:
// every output refused since the event opened, reported or not. (An
// output to an event whose ring is unmapped counts in neither.)

import (
	"encoding/binary"
	"errors"
	"fmt"
	"sync"
	"unsafe"

	"golang.org/x/sys/unix"
)

// FormatLost reports whether the kernel opens events with PERF_FORMAT_LOST
// (6.0): it opens a software event of the calling thread with it, and
// earlier kernels refuse the unknown read_format bit (EINVAL). Where the
// open is refused otherwise (perf_event_paranoid), the kernel's version
// decides. Asked once per process.
var FormatLost = sync.OnceValue(func() bool {
	attr := unix.PerfEventAttr{
		Type:        unix.PERF_TYPE_SOFTWARE,
		Size:        uint32(unsafe.Sizeof(unix.PerfEventAttr{})),
		Config:      unix.PERF_COUNT_SW_DUMMY,
		Read_format: unix.PERF_FORMAT_LOST,
		Bits:        unix.PerfBitDisabled | unix.PerfBitExcludeKernel | unix.PerfBitExcludeHv,
	}
	fd, err := unix.PerfEventOpen(&attr, 0, -1, -1, unix.PERF_FLAG_FD_CLOEXEC)
	if err == nil {
		unix.Close(fd)
		return true
	}
	if errors.Is(err, unix.EINVAL) {
		return false
	}
	major, _, verr := Version()
	return verr == nil && major >= 6
})

// LostSamples reads the perf event fd (read(2)) and returns how many
// outputs its ring refused since it opened, full or paused, reported in a
// lost record or not: ok is false for an event opened without
// PERF_FORMAT_LOST (the kernel returns its count alone). The error wraps
// the kernel's errno.
func LostSamples(fd int) (lost uint64, ok bool, err error) {
	var buf [16]byte // u64 value; u64 lost with PERF_FORMAT_LOST (perf_read_one)
	n, err := unix.Read(fd, buf[:])
	if err != nil {
		return 0, false, fmt.Errorf("read perf event count: %w", err)
	}
	if n < len(buf) {
		return 0, false, nil
	}
	return binary.NativeEndian.Uint64(buf[8:]), true, nil
}
