// SPDX-License-Identifier: Apache-2.0

package cpus

import (
	"reflect"
	"testing"
)

func TestParse(t *testing.T) {
	cases := map[string][]int{
		"0\n":          {0},
		"0-3\n":        {0, 1, 2, 3},
		"0-1,4,6-7\n":  {0, 1, 4, 6, 7},
		"":             nil,
		"2,0\n":        {2, 0},
		"0-0":          {0},
		"8-9,10-11\n ": {8, 9, 10, 11},
	}
	for in, want := range cases {
		got, err := Parse(in)
		if err != nil || !reflect.DeepEqual(got, want) {
			t.Errorf("Parse(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	for _, in := range []string{"a", "3-1", "-1", "1-x"} {
		if _, err := Parse(in); err == nil {
			t.Errorf("Parse(%q) succeeded", in)
		}
	}
}

// The running kernel's lists parse, and every online CPU is a possible one.
func TestOnlineWithinPossible(t *testing.T) {
	online, err := Online()
	if err != nil {
		t.Fatal(err)
	}
	possible, err := Possible()
	if err != nil {
		t.Fatal(err)
	}
	if len(online) == 0 {
		t.Fatal("no online cpu")
	}
	set := map[int]bool{}
	for _, c := range possible {
		set[c] = true
	}
	for _, c := range online {
		if !set[c] {
			t.Errorf("cpu %d online but not possible (%v)", c, possible)
		}
	}
}
