// SPDX-License-Identifier: Apache-2.0

package perfbuf

// The errors a user sees: the sentinels, the context that names the kind
// and the map, and a descriptor that is not a BPF map.

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"syscall"
	"testing"

	"github.com/perfbuf/perfbuf/internal/owner"
	"github.com/perfbuf/perfbuf/internal/ring"
	"github.com/perfbuf/perfbuf/internal/ringtest"
)

// kindCore returns an owner core over one fake ring, a perf ring or a
// ring buffer, named what as Open names a map of that kind.
func kindCore(t *testing.T, perf bool, what string) *owner.Core {
	t.Helper()
	var rb ring.Kind
	var fd int
	if perf {
		f := newFakeRings(t, 1, 4096)
		rb, fd = f.perf(t)[0], f.fds[0]
	} else {
		fd = ringtest.EventFD(t)
		rb = bpfReader(t, ringtest.NewRingBuf(4096))
	}
	c, err := owner.Over([]ring.Kind{rb}, []int{fd}, what, nil)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// The sentinels read the same over either kind of map, and the context of
// an error names the kind and the map: a ring buffer's errors never say
// "perf" (#29).
func TestErrorsNameTheKind(t *testing.T) {
	for _, err := range []error{ErrSampleTooLarge, ErrMapInUse, ErrBusy, ErrFlushed, ErrCorrupt, ErrReentrant} {
		if strings.Contains(err.Error(), "perf") {
			t.Errorf("sentinel %q names a kind", err)
		}
	}
	for _, kind := range []struct {
		perf       bool
		what, ring string
	}{
		{true, `perf event array "events"`, "perf ring cpu 0"},
		{false, `ring buffer "events"`, "BPF ring buffer"},
	} {
		t.Run(kind.what, func(t *testing.T) {
			check := func(call string, err, is error, want string) {
				t.Helper()
				if !errors.Is(err, is) || err.Error() != want {
					t.Errorf("%s: %v; want %q", call, err, want)
				}
				if !kind.perf && strings.Contains(err.Error(), "perf") {
					t.Errorf("%s over a ring buffer: %q names a perf kind", call, err)
				}
			}
			r := newReader(kindCore(t, kind.perf, kind.what), owner.Plan{Latency: -1})
			var s Sample
			r.Flush()
			check("ReadInto after Flush", r.ReadInto(&s), ErrFlushed, "read "+kind.what+": reader flushed")
			check("ReadInto(nil)", r.ReadInto(nil), os.ErrInvalid, "read "+kind.what+": nil sample: invalid argument")
			r.Close()
			check("ReadInto after Close", r.ReadInto(&s), os.ErrClosed, "read "+kind.what+": file already closed")
			check("Each after Close", r.Each(context.Background(), func(*Record) error { return nil }), os.ErrClosed,
				"read "+kind.what+": file already closed")
			_, err := r.Consume(func(*Record) error { return nil })
			check("Reader.Consume after Close", err, os.ErrClosed, "consume "+kind.what+": file already closed")

			rw := newRaw(kindCore(t, kind.perf, kind.what))
			held, err := rw.Buffer(0)
			if err != nil {
				t.Fatal(err)
			}
			_, err = rw.Buffer(0)
			check("Buffer of a held ring", err, ErrBusy, "raw view of ring 0 of "+kind.what+": ring held by a raw reader")
			held.Release()
			rw.Close()
			_, err = rw.Wait(0, nil)
			check("Wait after Close", err, os.ErrClosed, "wait "+kind.what+": file already closed")
			_, err = rw.EpollFD()
			check("EpollFD after Close", err, os.ErrClosed, "epoll fd of "+kind.what+": file already closed")

			pb := newPerfBuffer(kindCore(t, kind.perf, kind.what), func(int, []byte) {}, nil)
			raw := newRawBuffer(pb.pb.C.Rings[0], func() {})
			raw.Release()
			_, err = raw.Next(&Record{})
			check("Next after Release", err, os.ErrClosed, "read "+kind.ring+": released: file already closed")
			_, err = raw.Drain(func(*Record) error { return nil })
			check("Drain after Release", err, os.ErrClosed, "drain "+kind.ring+": released: file already closed")
			pb.Close()
			_, err = pb.Poll(0)
			check("Poll after Close", err, os.ErrClosed, "poll "+kind.what+": file already closed")
			_, err = pb.Consume()
			check("Consume after Close", err, os.ErrClosed, "consume "+kind.what+": file already closed")
			_, err = pb.EpollFD()
			check("EpollFD after Close", err, os.ErrClosed, "epoll fd of "+kind.what+": file already closed")
		})
	}
}

// The sentinels match through a wrap and match no other. They are all
// declared in errors.go, which every build compiles (ErrNoCgo was declared
// only in builds without cgo, so a test for it did not compile with cgo).
func TestSentinels(t *testing.T) {
	sentinels := []error{ErrMapType, ErrSampleTooLarge, ErrMapInUse, ErrBusy,
		ErrReentrant, ErrFlushed, ErrCorrupt}
	for i, e := range sentinels {
		if !errors.Is(fmt.Errorf("context: %w", e), e) {
			t.Errorf("%v: errors.Is through a wrap fails", e)
		}
		for j, o := range sentinels {
			if i != j && errors.Is(e, o) {
				t.Errorf("%v matches %v", e, o)
			}
		}
	}
}

// Tests of the map checks (map.go) that ask the kernel, in every build.

// A descriptor that is not a BPF map is refused as such, ErrMapType with
// the errno the kernel gave (BPF_OBJ_GET_INFO_BY_FD on /dev/null), before
// anything is claimed or opened.
func TestNewNotAMap(t *testing.T) {
	f, err := os.Open(os.DevNull)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	_, err = NewRaw(MapFD(f.Fd()), Options{})
	var errno syscall.Errno
	if !errors.Is(err, ErrMapType) || !errors.As(err, &errno) || !strings.Contains(err.Error(), "is not a BPF map (/dev/null)") {
		t.Errorf("New over /dev/null: %v; want ErrMapType and an errno, not a BPF map", err)
	}
	_, err = NewReader(MapFD(f.Fd()), ReaderOptions{})
	if !errors.Is(err, ErrMapType) || !errors.As(err, &errno) || !strings.HasPrefix(err.Error(), "new reader: fd ") {
		t.Errorf("NewReader over /dev/null: %v; want ErrMapType and an errno, not a BPF map", err)
	}
}
