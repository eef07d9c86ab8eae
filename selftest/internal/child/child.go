// SPDX-License-Identifier: Apache-2.0

// Package child runs a test binary's own test as a child process, driven
// over a pipe: the parent writes a command a line on the child's stdin,
// the child answers a line on its stdout. An answer line starts with a
// prefix of the test's choosing, so that what the test framework prints
// between answers is passed over; an answer "error: <msg>" is the
// child's failure.
//
// The parent side is [Start] and [Process]; the child side is [Serve]
// and [Server], in a test function that skips unless its environment
// says it is the child.
package child

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
)

// Spec says which child to start.
type Spec struct {
	// Name names the child in errors.
	Name string
	// Test is the test function the child runs (the binary is re-run
	// with -test.run=^Test$).
	Test string
	// Env is added to the child's environment.
	Env []string
	// Prefix starts every answer line of the child (without the ": "
	// that follows it).
	Prefix string
	// Start starts the command; nil is (*exec.Cmd).Start. A test that
	// starts the child with less privilege sets it.
	Start func(*exec.Cmd) error
	// KillAtCleanup kills the child at the test's cleanup, after its
	// stdin is closed, rather than waiting for it to end.
	KillAtCleanup bool
}

// Process is a child process, started by [Start].
type Process struct {
	Name   string
	Cmd    *exec.Cmd
	in     io.WriteCloser
	out    *bufio.Scanner
	prefix string
}

// Start starts the child s names, its stderr the parent's. Its stdin is
// closed and the process waited for at t's cleanup. It reads no answer:
// a child that answers once it is ready is waited for with
// [Process.Answer].
func Start(t testing.TB, s Spec) (*Process, error) {
	cmd := exec.Command(os.Args[0], "-test.run=^"+s.Test+"$", "-test.count=1")
	cmd.Env = append(os.Environ(), s.Env...)
	cmd.Stderr = os.Stderr
	in, err := cmd.StdinPipe()
	if err != nil {
		return nil, fmt.Errorf("start %s: %w", s.Name, err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, fmt.Errorf("start %s: %w", s.Name, err)
	}
	start := s.Start
	if start == nil {
		start = (*exec.Cmd).Start
	}
	if err := start(cmd); err != nil {
		return nil, fmt.Errorf("start %s: %w", s.Name, err)
	}
	t.Cleanup(func() {
		in.Close()
		if s.KillAtCleanup {
			cmd.Process.Kill()
		}
		cmd.Wait()
	})
	return &Process{Name: s.Name, Cmd: cmd, in: in, out: bufio.NewScanner(out), prefix: s.Prefix + ": "}, nil
}

// MustStart is [Start], failing the test on an error.
func MustStart(t testing.TB, s Spec) *Process {
	t.Helper()
	p, err := Start(t, s)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// Do sends the command cmd and returns the answer.
func (p *Process) Do(cmd string) (string, error) {
	if _, err := fmt.Fprintln(p.in, cmd); err != nil {
		return "", fmt.Errorf("%s: %s: %w", p.Name, cmd, err)
	}
	return p.Answer()
}

// Answer returns the child's next answer line, passing over what the
// test framework prints. An answer "error: <msg>" returns an error
// naming msg; so does the end of the child's output.
func (p *Process) Answer() (string, error) {
	for p.out.Scan() {
		if ans, ok := strings.CutPrefix(p.out.Text(), p.prefix); ok {
			if msg, failed := strings.CutPrefix(ans, "error: "); failed {
				return "", fmt.Errorf("%s: %s", p.Name, msg)
			}
			return ans, nil
		}
	}
	return "", fmt.Errorf("%s ended: %v", p.Name, p.out.Err())
}

// MustDo is [Process.Do], failing the test on an error.
func (p *Process) MustDo(t testing.TB, cmd string) string {
	t.Helper()
	ans, err := p.Do(cmd)
	if err != nil {
		t.Fatal(err)
	}
	return ans
}

// MustAnswer is [Process.Answer], failing the test on an error.
func (p *Process) MustAnswer(t testing.TB) string {
	t.Helper()
	ans, err := p.Answer()
	if err != nil {
		t.Fatal(err)
	}
	return ans
}

// Count sends cmd and returns the number the child answers, failing the
// test if the answer is no number.
func (p *Process) Count(t testing.TB, cmd string) uint64 {
	t.Helper()
	ans := p.MustDo(t, cmd)
	n, err := strconv.ParseUint(ans, 10, 64)
	if err != nil {
		t.Fatalf("%s: %q after %s, want a count", p.Name, ans, cmd)
	}
	return n
}

// Kill kills the child with SIGKILL and waits for its end.
func (p *Process) Kill() error {
	if err := p.Cmd.Process.Kill(); err != nil {
		return fmt.Errorf("kill %s: %w", p.Name, err)
	}
	p.Cmd.Wait()
	return nil
}

// Server is the child's side: it answers on stdout, a line each, and
// reads commands from stdin.
type Server struct {
	t      testing.TB
	prefix string
}

// Serve returns the child's side of a test t, answering with prefix.
func Serve(t testing.TB, prefix string) *Server {
	return &Server{t: t, prefix: prefix}
}

// Answer writes an answer line.
func (s *Server) Answer(format string, args ...any) {
	fmt.Printf(s.prefix+": "+format+"\n", args...)
}

// Fail answers "error: <err>" and fails the test at once.
func (s *Server) Fail(err error) {
	s.t.Helper()
	s.Answer("error: %v", err)
	s.t.Fatal(err)
}

// Commands calls handle with each command line read from stdin until
// handle returns true; if stdin ends first, it fails the test (the
// parent has gone).
func (s *Server) Commands(handle func(cmd string) (done bool)) {
	s.t.Helper()
	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
		if handle(in.Text()) {
			return
		}
	}
	s.Fail(errors.New("stdin closed"))
}
