// SPDX-License-Identifier: Apache-2.0

package main

import "testing"

func TestCountSurface(t *testing.T) {
	doc := "package p\n\ntype A struct {\n\tX int // x\n\t// Y is y.\n\tY int\n\tz int\n\tEmbedded\n}\n    A is a.\n\nfunc New() A\nfunc (a A) M()\ntype B interface {\n\tM()\n}\n"
	got := countSurface([]byte(doc))
	if want := (surface{lines: 16, funcs: 2, fields: 3}); got != want {
		t.Errorf("countSurface = %+v, want %+v", got, want)
	}
}
