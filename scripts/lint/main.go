// SPDX-License-Identifier: Apache-2.0

// Command lint holds the checks of make lint that gofmt, go vet and
// staticcheck do not make:
//
//   - the layering: which of the repository's packages each library
//     package may import (layers below), in every module of go.work;
//   - the modules: the root requires golang.org/x/sys alone, no go.mod
//     has a replace directive, and the modules require each other at one
//     version, which go.work replaces with the copies here;
//   - cgo in one place: only the files in cgoFiles import "C";
//   - comments that name a file of this repository name one that exists;
//   - the relative links of the Markdown files name files, and headings,
//     that exist (mdlinks.go);
//   - the root's go doc stays within its budget (surface.go).
//
// It runs from the repository's root and prints one line a finding;
// it exits 1 if there is any.
package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
)

const module = "github.com/perfbuf/perfbuf"

// layers lists, for each library package (relative to the module's
// root), the module's packages its non-test files may import. A library
// package missing here fails the check: a new one says where it sits.
// The tools above the library (cmd/, bench/, selftest/) may import any
// package, and no library package may import them.
var layers = map[string][]string{
	// The leaves: kernel interfaces, the ring kinds, CPU lists, snapshots.
	"internal/cpus":     nil,
	"internal/kernel":   nil,
	"internal/ring":     nil,
	"internal/snapshot": nil,
	// What a loader's Prepare made of a buffer, which the reader checks.
	"internal/prepared": nil,
	// The fakes of the ring kinds, for tests.
	"internal/ringtest": nil,
	// The wait and the delivery policies, over the ring kinds.
	"internal/wait":   {"internal/ring"},
	"internal/policy": {"internal/ring"},
	// The owner of the rings: opening, lifetime, pause, the openers, the
	// failure map, the claims, and the read loops of each mode.
	"internal/owner": {"internal/cpus", "internal/kernel", "internal/policy", "internal/prepared", "internal/ring", "internal/snapshot", "internal/wait"},
	// The public package: the types a user reads, over the owner.
	".": {"internal/kernel", "internal/owner", "internal/policy", "internal/prepared", "internal/ring", "internal/wait"},
	// Above the public package, in the root module: the loaders' contract.
	"buflayout": {".", "internal/cpus", "internal/kernel", "internal/prepared"},
	// Modules of their own, over the root's public packages only: the
	// loaders and the metrics.
	"prom":                   {"."},
	"bpfbuffer":              {".", "buflayout"},
	"bpfbuffer/ciliumbuffer": {".", "buflayout"},
	// A module of its own that only the tools require: loads the tests'
	// and benchmarks' BPF objects.
	"internal/bpfrun": {"internal/cpus"},
	// The loaders' tests of their probe, shared by both modules' tests:
	// generic over the kind, so below buflayout.
	"internal/probetest": {},
}

// tools are the trees above the library, and this check's own.
var tools = []string{"cmd", "bench", "selftest", "scripts"}

// cgoFiles are the files that may import "C": the library's one cgo file,
// and the C reference and the BPF loader of the tests and benchmarks.
var cgoFiles = []string{"perfbuf_cgo.go", "bench/internal/cref/cref.go", "internal/bpfrun/libbpf.go"}

// externalRefs are the prefixes of files that comments name in other
// trees: the kernel's, libbpf's (src/), the UAPI headers as included.
var externalRefs = []string{"kernel/", "include/", "tools/", "linux/", "src/", "arch/", "mm/", "bpf/bpf_helpers.h", "vmlinux.h", "mountsnoop.c"}

func main() {
	var findings []string
	report := func(format string, args ...any) {
		if f := fmt.Sprintf(format, args...); !slices.Contains(findings, f) {
			findings = append(findings, f)
		}
	}
	tracked, err := gitFiles()
	if err != nil {
		fmt.Fprintln(os.Stderr, "lint:", err)
		os.Exit(2)
	}
	if err := checkModules(tracked, report); err != nil {
		fmt.Fprintln(os.Stderr, "lint:", err)
		os.Exit(2)
	}
	if err := checkLayers(report); err != nil {
		fmt.Fprintln(os.Stderr, "lint:", err)
		os.Exit(2)
	}
	if err := checkSurface(report); err != nil {
		fmt.Fprintln(os.Stderr, "lint:", err)
		os.Exit(2)
	}
	for _, f := range tracked {
		if strings.HasPrefix(f, "libbpf/") {
			continue
		}
		switch filepath.Ext(f) {
		case ".go", ".c", ".h":
			if err := checkFile(f, tracked, report); err != nil {
				fmt.Fprintln(os.Stderr, "lint:", err)
				os.Exit(2)
			}
		case ".md":
			if err := checkLinks(f, tracked, report); err != nil {
				fmt.Fprintln(os.Stderr, "lint:", err)
				os.Exit(2)
			}
		}
	}
	for _, f := range findings {
		fmt.Println(f)
	}
	if len(findings) > 0 {
		os.Exit(1)
	}
}

func gitFiles() ([]string, error) {
	out, err := exec.Command("git", "ls-files").Output()
	if err != nil {
		return nil, fmt.Errorf("git ls-files: %w", err)
	}
	return strings.Fields(string(out)), nil
}

// checkLayers lists the packages of every module of go.work with their
// imports (go list, non-test files of the default build and of the other
// cgo setting) and reports every import the layers do not allow.
func checkLayers(report func(string, ...any)) error {
	for _, cgo := range []string{"1", "0"} {
		// The import path pattern spans the workspace; ./... would stop at
		// the root module's boundary.
		cmd := exec.Command("go", "list", "-f", `{{.ImportPath}}{{range .Imports}} {{.}}{{end}}`, module+"/...")
		cmd.Env = append(os.Environ(), "CGO_ENABLED="+cgo)
		out, err := cmd.Output()
		if err != nil {
			return fmt.Errorf("go list (CGO_ENABLED=%s): %w", cgo, err)
		}
		for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
			fields := strings.Fields(line)
			pkg := rel(fields[0])
			if isTool(pkg) {
				continue
			}
			allowed, known := layers[pkg]
			if !known {
				report("layers: package %s is not in scripts/lint's layers: say which packages it may import", pkg)
				continue
			}
			for _, imp := range fields[1:] {
				if imp != module && !strings.HasPrefix(imp, module+"/") {
					continue
				}
				if r := rel(imp); !slices.Contains(allowed, r) {
					report("layers: %s imports %s; it may import %v", pkg, r, allowed)
				}
			}
		}
	}
	return nil
}

// goMod is what checkModules reads of a go.mod or go.work file (go mod
// edit -json, go work edit -json).
type goMod struct {
	Module  struct{ Path string }
	Require []struct{ Path, Version string }
	Use     []struct{ DiskPath string }
	Replace []struct {
		Old struct{ Path, Version string }
		New struct{ Path string }
	}
}

// checkModules reports a go.mod that go.work does not use, a root module
// that requires more than golang.org/x/sys, a replace directive in a
// go.mod (a released go.mod must build alone: docs/release.md), and
// requirements of the repository's modules at more than one version or
// at one that go.work does not replace with the copy here.
func checkModules(tracked []string, report func(string, ...any)) error {
	var work goMod
	if err := editJSON(&work, "go", "work", "edit", "-json"); err != nil {
		return err
	}
	used := map[string]bool{}
	for _, u := range work.Use {
		used[path.Clean(u.DiskPath)] = true
	}
	replaced := map[string]string{} // module@version: directory
	for _, r := range work.Replace {
		replaced[r.Old.Path+"@"+r.Old.Version] = path.Clean(r.New.Path)
	}
	versions := map[string]bool{}
	for _, f := range tracked {
		if path.Base(f) != "go.mod" || strings.HasPrefix(f, "libbpf/") {
			continue
		}
		dir := path.Dir(f)
		if !used[dir] {
			report("%s: a module that go.work does not use", f)
		}
		var m goMod
		if err := editJSON(&m, "go", "mod", "edit", "-json", f); err != nil {
			return err
		}
		if want := path.Join(module, dir); m.Module.Path != want {
			report("%s: module %s, want %s (its folder)", f, m.Module.Path, want)
		}
		for _, r := range m.Replace {
			report("%s: replace %s: a released go.mod has none (go.work replaces the repository's modules)", f, r.Old.Path)
		}
		for _, r := range m.Require {
			switch {
			case dir == "." && r.Path != "golang.org/x/sys":
				report("%s: requires %s: the root module requires golang.org/x/sys alone, so that a user who imports it gains nothing else", f, r.Path)
			case r.Path == module || strings.HasPrefix(r.Path, module+"/"):
				versions[r.Version] = true
				if got, want := replaced[r.Path+"@"+r.Version], path.Clean(strings.TrimPrefix(strings.TrimPrefix(r.Path, module), "/")); got != want {
					report("%s: requires %s %s, which go.work does not replace with the folder %s", f, r.Path, r.Version, want)
				}
			}
		}
	}
	if len(versions) > 1 {
		report("go.mod files require the repository's modules at %d versions: one release, one version", len(versions))
	}
	return nil
}

// editJSON runs the command args (go mod edit -json or go work edit
// -json) and decodes its output into v.
func editJSON(v any, args ...string) error {
	out, err := exec.Command(args[0], args[1:]...).Output()
	if err != nil {
		return fmt.Errorf("%s: %w", strings.Join(args, " "), err)
	}
	return json.Unmarshal(out, v)
}

func rel(importPath string) string {
	if importPath == module {
		return "."
	}
	return strings.TrimPrefix(importPath, module+"/")
}

func isTool(pkg string) bool {
	for _, t := range tools {
		if pkg == t || strings.HasPrefix(pkg, t+"/") {
			return true
		}
	}
	return false
}

var (
	importC = regexp.MustCompile(`^\s*import\s+"C"|^\s*"C"\s*$`)
	// A file name in a comment: a path of words ending in a source or
	// doc extension, optionally with a line number.
	fileRef = regexp.MustCompile(`(?:^|[\s("'\x60\[])((?:[\w.-]+/)*[\w-]+(?:\.bpf)?\.(?:go|md|h|c|sh))\b`)
)

// checkFile reports an import of "C" outside cgoFiles, and every file
// that a comment of f names and that exists neither from the root, nor
// from f's folder, nor (a bare name) anywhere in the repository.
func checkFile(f string, tracked []string, report func(string, ...any)) error {
	fh, err := os.Open(f)
	if err != nil {
		return err
	}
	defer fh.Close()
	inBlock := false
	sc := bufio.NewScanner(fh)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		if strings.HasSuffix(f, ".go") && importC.MatchString(line) && !slices.Contains(cgoFiles, f) {
			report("%s:%d: imports \"C\": cgo stays in %v", f, n, cgoFiles)
		}
		var comment string
		switch {
		case inBlock:
			comment = line
		case strings.Contains(line, "//"):
			comment = line[strings.Index(line, "//"):]
		case strings.Contains(line, "/*"):
			comment = line[strings.Index(line, "/*"):]
			inBlock = true
		}
		if inBlock && strings.Contains(line, "*/") {
			inBlock = false
		}
		if strings.HasPrefix(strings.TrimSpace(line), "#include") {
			continue
		}
		for _, m := range fileRef.FindAllStringSubmatch(comment, -1) {
			if ref := m[1]; !exists(ref, f, tracked) {
				report("%s:%d: comment names %s, which is not in the repository", f, n, ref)
			}
		}
	}
	return sc.Err()
}

func exists(ref, from string, tracked []string) bool {
	for _, p := range externalRefs {
		if strings.HasPrefix(ref, p) {
			return true
		}
	}
	if slices.Contains(tracked, ref) || slices.Contains(tracked, path.Join(path.Dir(from), ref)) {
		return true
	}
	if !strings.Contains(ref, "/") {
		for _, t := range tracked {
			if path.Base(t) == ref {
				return true
			}
		}
	}
	// A folder's file that the build makes (build/vmlinux.h) or a tree
	// that is not tracked file by file (the libbpf submodule).
	return strings.HasPrefix(ref, "build/") || strings.HasPrefix(ref, "libbpf/")
}
