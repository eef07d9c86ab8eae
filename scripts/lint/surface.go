// SPDX-License-Identifier: Apache-2.0

package main

// The root package's surface: what `go doc -all .` prints, held to the
// budget that v0.1.0 set (issue 51), so that a change that grows it says
// so here and in CHANGELOG.md.

import (
	"bufio"
	"bytes"
	"fmt"
	"os/exec"
	"strings"
)

// surfaceBudget is the most `go doc -all .` of the root may print:
// lines, exported functions and methods, and exported fields (embedded
// ones counted).
var surfaceBudget = surface{lines: 495, funcs: 39, fields: 40}

// surface is what one `go doc -all` prints, counted.
type surface struct{ lines, funcs, fields int }

// checkSurface counts the root's go doc and reports what is over budget.
func checkSurface(report func(string, ...any)) error {
	out, err := exec.Command("go", "doc", "-all", ".").Output()
	if err != nil {
		return fmt.Errorf("go doc -all .: %w", err)
	}
	got := countSurface(out)
	for _, c := range []struct {
		what      string
		got, most int
	}{
		{"lines", got.lines, surfaceBudget.lines},
		{"exported functions and methods", got.funcs, surfaceBudget.funcs},
		{"exported fields", got.fields, surfaceBudget.fields},
	} {
		if c.got > c.most {
			report("go doc -all .: %d %s, the budget is %d (scripts/lint/surface.go)", c.got, c.what, c.most)
		}
	}
	return nil
}

// countSurface counts go doc's output: a line starting "func " is a
// function or method; a line inside a struct's braces that starts, after
// its tab, with an upper-case letter is an exported field.
func countSurface(doc []byte) surface {
	var s surface
	inStruct := false
	sc := bufio.NewScanner(bytes.NewReader(doc))
	for sc.Scan() {
		line := sc.Text()
		s.lines++
		switch {
		case strings.HasPrefix(line, "func "):
			s.funcs++
		case strings.HasPrefix(line, "type ") && strings.HasSuffix(line, " struct {"):
			inStruct = true
		case inStruct && line == "}":
			inStruct = false
		case inStruct && strings.HasPrefix(line, "\t") && len(line) > 1 && line[1] >= 'A' && line[1] <= 'Z':
			s.fields++
		}
	}
	return s
}
