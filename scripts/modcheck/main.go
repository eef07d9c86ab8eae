// SPDX-License-Identifier: Apache-2.0

// Command modcheck builds every module of go.work as a user gets it: each
// module alone (GOWORK=off), its requirements of this repository's
// modules served at the release version from a module proxy made of the
// working tree, everything else from GOPROXY, into an empty module cache.
// Then it makes two user modules, one that imports the root package and
// one that adds ciliumbuffer to a cilium/ebpf program at the oldest
// versions perfbuf supports, and checks what go mod tidy gives them: the
// root gains golang.org/x/sys alone; ciliumbuffer raises nothing.
//
// It runs from the repository's root (make modcheck; docs/release.md) and
// exits 1 with a line a finding. MODCHECK_KEEP=1 keeps its folder (the
// proxy, the module cache, the user modules) and prints where it is. The released go.mod files are not
// changed: each build runs on a copy of its go.mod and go.sum (-modfile).
package main

import (
	"archive/zip"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"time"
)

const module = "github.com/perfbuf/perfbuf"

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "modcheck:", err)
		os.Exit(1)
	}
}

func run() error {
	tmp, err := os.MkdirTemp("", "perfbuf-modcheck-")
	if err != nil {
		return err
	}
	defer func() {
		if os.Getenv("MODCHECK_KEEP") != "" {
			fmt.Printf("modcheck: kept %s (proxy/, modcache/, the user modules)\n", tmp)
			return
		}
		// The module cache is read-only; go clean -modcache empties it.
		_ = goCmd(tmp, env(tmp), "clean", "-modcache").Run()
		os.RemoveAll(tmp)
	}()
	dirs, err := workModules()
	if err != nil {
		return err
	}
	version, err := releaseVersion(dirs)
	if err != nil {
		return err
	}
	files, err := gitFiles()
	if err != nil {
		return err
	}
	for _, d := range dirs {
		if err := addToProxy(filepath.Join(tmp, "proxy"), d, dirs, files, version); err != nil {
			return err
		}
	}
	e := env(tmp)
	failed := false
	for _, d := range dirs {
		// A copy of go.mod and go.sum, which -mod=mod may complete.
		mod := filepath.Join(tmp, "modfiles", d, "go.mod")
		if err := os.MkdirAll(filepath.Dir(mod), 0o755); err != nil {
			return err
		}
		for _, f := range []string{"go.mod", "go.sum"} {
			b, err := os.ReadFile(filepath.Join(d, f))
			if err != nil && !os.IsNotExist(err) {
				return err
			}
			if err := os.WriteFile(filepath.Join(filepath.Dir(mod), f), b, 0o644); err != nil {
				return err
			}
		}
		for _, args := range [][]string{{"build", "-modfile=" + mod, "./..."}, {"vet", "-modfile=" + mod, "./..."}} {
			cmd := goCmd(d, e, args...)
			if out, err := cmd.CombinedOutput(); err != nil {
				fmt.Printf("%s: GOWORK=off go %s: %v\n%s", d, args[0], err, out)
				failed = true
			}
		}
		fmt.Printf("modcheck: %s builds alone, from an empty module cache\n", path.Join(module, d))
	}
	if err := userModules(tmp, e, version); err != nil {
		fmt.Println(err)
		failed = true
	}
	if failed {
		os.Exit(1)
	}
	return nil
}

// env is the environment of every go command: this repository's modules
// from the proxy in tmp, which the checksum database does not know, the
// rest from GOPROXY, into an empty module cache; no workspace.
func env(tmp string) []string {
	proxy := os.Getenv("GOPROXY")
	if proxy == "" || proxy == "off" {
		proxy = "https://proxy.golang.org,direct"
	}
	return append(os.Environ(),
		"GOWORK=off",
		"GOFLAGS=-mod=mod",
		"GOPROXY=file://"+filepath.Join(tmp, "proxy")+","+proxy,
		"GONOSUMDB="+module,
		"GOPRIVATE=",
		"GOMODCACHE="+filepath.Join(tmp, "modcache"),
	)
}

func goCmd(dir string, env []string, args ...string) *exec.Cmd {
	cmd := exec.Command("go", args...)
	cmd.Dir = dir
	cmd.Env = env
	return cmd
}

// workModules returns the folders of go.work's modules, "." first.
func workModules() ([]string, error) {
	out, err := exec.Command("go", "work", "edit", "-json").Output()
	if err != nil {
		return nil, fmt.Errorf("go work edit -json: %w", err)
	}
	var w struct{ Use []struct{ DiskPath string } }
	if err := json.Unmarshal(out, &w); err != nil {
		return nil, err
	}
	var dirs []string
	for _, u := range w.Use {
		dirs = append(dirs, path.Clean(u.DiskPath))
	}
	slices.Sort(dirs) // "." sorts first
	return dirs, nil
}

// releaseVersion returns the version at which the modules require each
// other (scripts/lint checks there is one).
func releaseVersion(dirs []string) (string, error) {
	for _, d := range dirs {
		out, err := exec.Command("go", "mod", "edit", "-json", filepath.Join(d, "go.mod")).Output()
		if err != nil {
			return "", fmt.Errorf("go mod edit -json %s/go.mod: %w", d, err)
		}
		var m struct {
			Require []struct{ Path, Version string }
		}
		if err := json.Unmarshal(out, &m); err != nil {
			return "", err
		}
		for _, r := range m.Require {
			if r.Path == module || strings.HasPrefix(r.Path, module+"/") {
				return r.Version, nil
			}
		}
	}
	return "", fmt.Errorf("no go.mod requires a module of %s", module)
}

func gitFiles() ([]string, error) {
	out, err := exec.Command("git", "ls-files").Output()
	if err != nil {
		return nil, fmt.Errorf("git ls-files: %w", err)
	}
	return strings.Fields(string(out)), nil
}

// addToProxy writes the module in dir at version into the file proxy
// (the GOPROXY protocol's files): its .info, .mod and a zip of its
// tracked files, less those of the modules nested in it and the libbpf
// submodule, which a module zip never holds.
func addToProxy(proxy, dir string, dirs, files []string, version string) error {
	modPath := module
	if dir != "." {
		modPath = module + "/" + dir
	}
	at := filepath.Join(proxy, filepath.FromSlash(modPath), "@v")
	if err := os.MkdirAll(at, 0o755); err != nil {
		return err
	}
	gomod, err := os.ReadFile(filepath.Join(dir, "go.mod"))
	if err != nil {
		return err
	}
	info := fmt.Sprintf(`{"Version":%q,"Time":%q}`, version, time.Now().UTC().Format(time.RFC3339))
	for name, b := range map[string][]byte{"list": []byte(version + "\n"), version + ".info": []byte(info), version + ".mod": gomod} {
		if err := os.WriteFile(filepath.Join(at, name), b, 0o644); err != nil {
			return err
		}
	}
	zf, err := os.Create(filepath.Join(at, version+".zip"))
	if err != nil {
		return err
	}
	defer zf.Close()
	zw := zip.NewWriter(zf)
	for _, f := range files {
		rel, ok := inModule(f, dir, dirs)
		if !ok {
			continue
		}
		st, err := os.Lstat(f)
		if err != nil || !st.Mode().IsRegular() {
			continue // the libbpf submodule's folder, a file removed
		}
		b, err := os.ReadFile(f)
		if err != nil {
			return err
		}
		w, err := zw.Create(modPath + "@" + version + "/" + rel)
		if err != nil {
			return err
		}
		if _, err := w.Write(b); err != nil {
			return err
		}
	}
	return zw.Close()
}

// inModule returns f's path within the module in dir, and whether f is
// the module's: under dir, and not under a module nested in it.
func inModule(f, dir string, dirs []string) (string, bool) {
	rel := f
	if dir != "." {
		var ok bool
		if rel, ok = strings.CutPrefix(f, dir+"/"); !ok {
			return "", false
		}
	}
	for _, d := range dirs {
		if d != dir && (dir == "." || strings.HasPrefix(d, dir+"/")) && strings.HasPrefix(f, d+"/") {
			return "", false
		}
	}
	return rel, true
}

// userModules makes the two user modules and checks what they require
// after go mod tidy.
func userModules(tmp string, env []string, version string) error {
	var findings []string
	// A module that imports only the root package.
	root, err := user(tmp, env, "root-user", version, `import "github.com/perfbuf/perfbuf"

var _ perfbuf.Options
`, nil)
	if err != nil {
		return err
	}
	fmt.Printf("modcheck: a module that imports only the root, after go mod tidy:\n%s", root.text)
	for p := range root.require {
		if p != module && p != "golang.org/x/sys" {
			findings = append(findings, fmt.Sprintf("a module that imports only the root requires %s", p))
		}
	}
	// A cilium/ebpf program at the oldest versions perfbuf supports that
	// adds ciliumbuffer.
	oldest, err := requires(filepath.Join("bpfbuffer", "ciliumbuffer", "go.mod"))
	if err != nil {
		return err
	}
	pinned := map[string]string{"github.com/cilium/ebpf": oldest["github.com/cilium/ebpf"], "golang.org/x/sys": oldest["golang.org/x/sys"]}
	cil, err := user(tmp, env, "cilium-user", version, `import (
	"github.com/cilium/ebpf"
	"github.com/perfbuf/perfbuf"
	"github.com/perfbuf/perfbuf/bpfbuffer/ciliumbuffer"
	"golang.org/x/sys/unix"
)

var _ = ciliumbuffer.Map((*ebpf.Map)(nil))
var _ perfbuf.Options
var _ = unix.Getpid
`, pinned)
	if err != nil {
		return err
	}
	fmt.Printf("modcheck: a cilium/ebpf module at %v that adds ciliumbuffer, after go mod tidy:\n%s", pinned, cil.text)
	for p, v := range pinned {
		if cil.require[p] != v {
			findings = append(findings, fmt.Sprintf("ciliumbuffer raises %s from %s to %s", p, v, cil.require[p]))
		}
	}
	if len(findings) > 0 {
		return fmt.Errorf("modcheck: %s", strings.Join(findings, "; "))
	}
	return nil
}

type userMod struct {
	text    string            // go.mod after tidy
	require map[string]string // its requirements
}

// user makes the module name in tmp with the source src, requiring the
// repository's modules at version and the modules of pinned at theirs,
// runs go mod tidy and go build, and returns its go.mod.
func user(tmp string, env []string, name, version, src string, pinned map[string]string) (userMod, error) {
	dir := filepath.Join(tmp, name)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return userMod{}, err
	}
	gomod := "module example.com/" + name + "\n\ngo 1.25.0\n"
	for p, v := range pinned {
		gomod += fmt.Sprintf("\nrequire %s %s\n", p, v)
	}
	if err := os.WriteFile(filepath.Join(dir, "go.mod"), []byte(gomod), 0o644); err != nil {
		return userMod{}, err
	}
	if err := os.WriteFile(filepath.Join(dir, "main.go"), []byte("package main\n\n"+src+"\nfunc main() {}\n"), 0o644); err != nil {
		return userMod{}, err
	}
	for _, args := range [][]string{{"get", module + "@" + version}, {"mod", "tidy"}, {"build", "./..."}} {
		if out, err := goCmd(dir, env, args...).CombinedOutput(); err != nil {
			return userMod{}, fmt.Errorf("%s: go %s: %v\n%s", name, strings.Join(args, " "), err, out)
		}
	}
	b, err := os.ReadFile(filepath.Join(dir, "go.mod"))
	if err != nil {
		return userMod{}, err
	}
	req, err := requires(filepath.Join(dir, "go.mod"))
	return userMod{text: string(b), require: req}, err
}

// requires returns the requirements of the go.mod file f.
func requires(f string) (map[string]string, error) {
	out, err := exec.Command("go", "mod", "edit", "-json", f).Output()
	if err != nil {
		return nil, fmt.Errorf("go mod edit -json %s: %w", f, err)
	}
	var m struct {
		Require []struct{ Path, Version string }
	}
	if err := json.Unmarshal(out, &m); err != nil {
		return nil, err
	}
	req := map[string]string{}
	for _, r := range m.Require {
		req[r.Path] = r.Version
	}
	return req, nil
}
