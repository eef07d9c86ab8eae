// SPDX-License-Identifier: Apache-2.0

package child

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"
)

// echoEnv, set in a child's environment, makes TestEchoChild serve.
const echoEnv = "PERFBUF_CHILD_ECHO"

func echo(t *testing.T) *Process {
	t.Helper()
	p := MustStart(t, Spec{Name: "echo", Test: "TestEchoChild", Env: []string{echoEnv + "=1"}, Prefix: "echo"})
	if got := p.MustAnswer(t); got != "open" {
		t.Fatalf("echo: %q, want open", got)
	}
	return p
}

// A child answers each command in order, passing over what the test
// framework prints; a count is read as one; "error: " is the child's
// failure; the end of its output is an error, not a hang.
func TestEcho(t *testing.T) {
	p := echo(t)
	if got := p.MustDo(t, "say hello"); got != "hello" {
		t.Errorf("say hello: %q", got)
	}
	if got := p.Count(t, "count 42"); got != 42 {
		t.Errorf("count 42: %d", got)
	}
	if _, err := p.Do("fail boom"); err == nil || !strings.Contains(err.Error(), "echo: boom") {
		t.Errorf("fail boom: %v, want the child's error", err)
	}
	if err := p.Cmd.Wait(); err == nil {
		t.Error("the failed child exited with 0")
	}
	if ans, err := p.Answer(); err == nil {
		t.Errorf("after the child's end: %q, want an error", ans)
	}
}

// A child answers its last command and exits with 0; a killed one ends.
func TestEchoQuitAndKill(t *testing.T) {
	p := echo(t)
	if got := p.MustDo(t, "quit"); got != "bye" {
		t.Errorf("quit: %q", got)
	}
	if err := p.Cmd.Wait(); err != nil {
		t.Errorf("the child after quit: %v", err)
	}

	k := echo(t)
	if err := k.Kill(); err != nil {
		t.Fatal(err)
	}
	if _, err := k.Do("say x"); err == nil {
		t.Error("a killed child answered")
	}
}

// TestEchoChild is the child of the tests above: it answers "open", then
// "say X" with X, "count N" with N, "fail M" with the error M, and "quit"
// with "bye", then exits. A line without its prefix comes first, for
// the parent to pass over.
func TestEchoChild(t *testing.T) {
	if os.Getenv(echoEnv) == "" {
		t.Skip("the child of TestEcho")
	}
	s := Serve(t, "echo")
	fmt.Println("noise: not an answer")
	s.Answer("open")
	s.Commands(func(cmd string) bool {
		verb, arg, _ := strings.Cut(cmd, " ")
		switch verb {
		case "say", "count":
			s.Answer("%s", arg)
		case "fail":
			s.Fail(errors.New(arg))
		case "quit":
			s.Answer("bye")
			return true
		default:
			s.Fail(fmt.Errorf("unknown command %q", cmd))
		}
		return false
	})
}
