// SPDX-License-Identifier: Apache-2.0

package ring

import (
	"encoding/binary"
	"fmt"
	"sync/atomic"
	"testing"

	"github.com/perfbuf/perfbuf/internal/ringtest"
)

// An ordered merge's run through either kind's loop (Sink.KeyEnd): the
// samples whose key lies in [Lo, Hi] go, with Key set and Lo raised to
// each, to the function or into copies; the loop stops before the first
// record it does not deliver, which the next Next parses.

// runCase is a ring's records, the run's bounds, and what the run must
// deliver before it stops: the keys, and the key of the record the cursor
// stops on (none: the end).
type runCase struct {
	name    string
	records []runRec
	lo, hi  uint64
	want    []uint64
	stopKey string // "key N", "lost", "short", or "end"
}

// runRec is a sample with a key (lost or short: another record).
type runRec struct {
	key         uint64
	lost, short bool
}

var runCases = []runCase{
	{"all in bounds", []runRec{{key: 5}, {key: 7}, {key: 7}, {key: 8}}, 5, 8, []uint64{5, 7, 7, 8}, "end"},
	{"above the bound", []runRec{{key: 5}, {key: 9}, {key: 6}}, 5, 8, []uint64{5}, "key 9"},
	{"below the last key", []runRec{{key: 6}, {key: 5}}, 5, 8, []uint64{6}, "key 5"},
	{"below Lo at once", []runRec{{key: 4}, {key: 5}}, 5, 8, nil, "key 4"},
	{"a sample too short for the key", []runRec{{key: 5}, {short: true}, {key: 6}}, 5, 8, []uint64{5}, "short"},
}

// runOver runs the case's run over a ring of the kind, in function mode
// and in copy mode, and checks both.
func runOver(t *testing.T, c runCase, open func(t *testing.T, recs []runRec) Ring) {
	for _, copying := range []bool{false, true} {
		r := open(t, c.records)
		r.Begin()
		s := &Sink{KeyEnd: 8, Lo: c.lo, Hi: c.hi}
		if copying {
			s.Into, s.Room = make([]Copy, 16), 1<<20
		}
		var got []uint64
		var rec Record
		k, _, err := r.Each(&rec, 1<<20, new(atomic.Bool), func(rec *Record) error {
			if copying {
				t.Fatal("the function called with a copying sink")
			}
			if rec.Late || rec.Type != Sample {
				t.Errorf("%+v delivered in a run", rec)
			}
			got = append(got, rec.Key)
			return nil
		}, s)
		if copying {
			for _, cp := range s.Into[:s.N] {
				got = append(got, cp.Key)
			}
		}
		if err != nil || k != len(c.want) || fmt.Sprint(got) != fmt.Sprint(c.want) {
			t.Errorf("copying %v: %d delivered, keys %v, %v; want %v", copying, k, got, err, c.want)
		}
		if want := c.want; len(want) > 0 && s.Lo != want[len(want)-1] {
			t.Errorf("copying %v: Lo %d after the run, want %d", copying, s.Lo, want[len(want)-1])
		}
		// The cursor is on the record the run stopped before.
		stop := "end"
		if ok, err := r.Next(&rec); err != nil {
			t.Fatal(err)
		} else if ok {
			switch {
			case rec.Type == Lost:
				stop = "lost"
			case rec.Len() < 8:
				stop = "short"
			default:
				stop = fmt.Sprintf("key %d", binary.NativeEndian.Uint64(rec.AppendTo(nil)))
			}
		}
		if stop != c.stopKey {
			t.Errorf("copying %v: the cursor on %s, want %s", copying, stop, c.stopKey)
		}
	}
}

func TestPerfEachRun(t *testing.T) {
	cases := append(runCases,
		runCase{"a lost record", []runRec{{key: 5}, {lost: true}, {key: 6}}, 5, 8, []uint64{5}, "lost"},
		// The fourth sample straddles the ring's end (a ring of 256 bytes
		// from 128: 32-byte records at 128, 160 and 192, 40 at 224).
		runCase{"wrapped", []runRec{{key: 5}, {key: 5}, {key: 6}, {key: 6}, {key: 7}}, 5, 8, []uint64{5, 5, 6}, "key 6"},
	)
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			runOver(t, c, func(t *testing.T, recs []runRec) Ring {
				f := ringtest.NewPerfAt(256, 128)
				for i, rr := range recs {
					switch {
					case rr.lost:
						f.MustWrite(t, ringtest.PerfLost(1, 3))
					case rr.short:
						f.MustWrite(t, ringtest.PerfSample(ringtest.Pattern(4, byte(i))))
					case c.name == "wrapped" && i == 3:
						// Its payload from 236 to 260.
						f.MustWrite(t, ringtest.PerfSample(ringtest.Keyed(rr.key, uint64(i), 24)))
					default:
						f.MustWrite(t, ringtest.PerfSample(ringtest.Keyed(rr.key, uint64(i), 16)))
					}
				}
				return perfReader(t, f)
			})
		})
	}
}

func TestBPFRingEachRun(t *testing.T) {
	cases := append(runCases,
		// A discarded record is skipped, in a run as anywhere.
		runCase{"a discarded record", []runRec{{key: 5}, {lost: true}, {key: 6}}, 5, 8, []uint64{5, 6}, "end"},
	)
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			runOver(t, c, func(t *testing.T, recs []runRec) Ring {
				f := ringtest.NewRingBuf(4096)
				for i, rr := range recs {
					switch {
					case rr.lost: // "lost": a record the program discarded
						pos, _ := f.Reserve(16)
						f.Commit(pos, true)
					case rr.short:
						f.Output(t, ringtest.Pattern(4, byte(i)))
					default:
						f.Output(t, ringtest.Keyed(rr.key, uint64(i), 16))
					}
				}
				return fakeReader(t, f)
			})
		})
	}
}
