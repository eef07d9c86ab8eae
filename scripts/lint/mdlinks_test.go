// SPDX-License-Identifier: Apache-2.0

package main

import (
	"os"
	"path/filepath"
	"slices"
	"testing"
)

func TestAnchor(t *testing.T) {
	for title, want := range map[string]string{
		"4. From cilium/ebpf":                                                "4-from-ciliumebpf",
		"`Map`: a `*ebpf.Map` as it is":                                      "map-a-ebpfmap-as-it-is",
		"Your own tool, in this repository's image":                          "your-own-tool-in-this-repositorys-image",
		"1.3 Coming from libbpfgo's `PerfBuffer`: `Poll(300)` is not 300 ms": "13-coming-from-libbpfgos-perfbuffer-poll300-is-not-300-ms",
	} {
		if got := anchor(title); got != want {
			t.Errorf("anchor(%q) = %q, want %q", title, got, want)
		}
	}
}

func TestCheckLinks(t *testing.T) {
	dir := t.TempDir()
	t.Chdir(dir)
	os.Mkdir(filepath.Join(dir, "docs"), 0o755)
	os.WriteFile("docs/a.md", []byte("# A\n\n## Same\n\n## Same\n\n```sh\n# not a heading\n[x](gone.md)\n```\n"), 0o644)
	os.WriteFile("README.md", []byte("[a](docs/a.md) [s](docs/a.md#same-1) `[c](gone.md)`\n"+
		"[b](docs/b.md) [h](docs/a.md#not-a-heading) [w](https://example.com/x.md) [self](#readme)\n# README\n"), 0o644)
	tracked := []string{"README.md", "docs/a.md"}
	var got []string
	report := func(format string, args ...any) { got = append(got, format) }
	for _, f := range tracked {
		if err := checkLinks(f, tracked, report); err != nil {
			t.Fatal(err)
		}
	}
	// The second file is missing and #not-a-heading is in a code block: two
	// findings, nothing else.
	if len(got) != 2 || !slices.Contains(got, "%s:%d: link %s names %s, which is not in the repository") {
		t.Errorf("findings %q, want a missing file and a missing anchor", got)
	}
}
