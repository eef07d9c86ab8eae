// SPDX-License-Identifier: Apache-2.0

// Package tooltest holds what the tools' tests share: Stats as a closed
// reader would report them.
package tooltest

import "github.com/perfbuf/perfbuf"

// Sums returns a reader's Stats with the rings' entries rings and the
// counts of no ring rest (failures of CPUs without a ring, and for ring
// buffers their full outputs as Lost; NotRun): the sums of both, with
// Rings, as perfbuf.Stats documents them.
func Sums(rest perfbuf.Stats, rings ...perfbuf.Stats) perfbuf.Stats {
	st := rest
	st.CPU = -1
	for _, r := range rings {
		st.Samples += r.Samples
		st.Lost += r.Lost
		st.Discarded += r.Discarded
		st.Left += r.Left
		st.Found += r.Found
		st.Failed.NoEntry += r.Failed.NoEntry
		st.Failed.TooBig += r.Failed.TooBig
		st.Failed.Invalid += r.Failed.Invalid
		st.Failed.NotOnCPU += r.Failed.NotOnCPU
		st.Failed.Other += r.Failed.Other
		st.Bytes += r.Bytes
		st.Late += r.Late
		st.Corrupt += r.Corrupt
		st.Size += r.Size
		st.Fill += r.Fill
		st.MaxFill = max(st.MaxFill, r.MaxFill)
		st.Waiting = max(st.Waiting, r.Waiting)
	}
	st.Rings = rings
	return st
}
