// SPDX-License-Identifier: Apache-2.0

package main

import (
	"fmt"
	"io"
	"os/exec"
	"strconv"
	"time"
)

// demoCommands are what --demo runs: each shows something about the output.
var demoCommands = [][]string{
	{"/bin/echo", "hello", "from", "perfbuf"},
	{"/bin/sh", "-c", "uname -r >/dev/null; ls / >/dev/null"}, // the shell's children: PPID is the shell
	{"/usr/bin/env", "date", "+%s"},                           // env execs date: two lines, one PID
	{"/bin/echo", "two words", "tab\there"},                   // try -q
	append([]string{"/bin/echo"}, numbers(25)...),             // more than --max-args 20: " ..."
	{"/nonexistent/perfbuf-demo", "--fail"},                   // ENOENT: RET -2, shown with -x
}

func numbers(n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = strconv.Itoa(i + 1)
	}
	return out
}

// runDemo runs demoCommands one after the other, a little apart, until done
// is closed. Their output goes to /dev/null; failures are expected for the
// nonexistent path and reported for the rest.
func runDemo(done <-chan struct{}, stderr io.Writer) {
	fmt.Fprintf(stderr, "demo: running %d commands\n", len(demoCommands))
	for i, argv := range demoCommands {
		select {
		case <-done:
			return
		case <-time.After(150 * time.Millisecond):
		}
		cmd := exec.Command(argv[0], argv[1:]...)
		if err := cmd.Run(); err != nil && i != len(demoCommands)-1 {
			fmt.Fprintf(stderr, "demo: %s: %v\n", argv[0], err)
		}
	}
}
