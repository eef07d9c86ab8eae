// SPDX-License-Identifier: Apache-2.0

package main

import (
	"os"
	"path"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"unicode"
)

var (
	// mdLink is a relative link of a Markdown file: [text](target), the
	// target without a scheme.
	mdLink = regexp.MustCompile(`\]\(([^)\s]+)\)`)
	// inlineCode is a code span, whose brackets are not links.
	inlineCode = regexp.MustCompile("`[^`]*`")
	// htmlAnchor is an anchor that HTML in a Markdown file names.
	htmlAnchor = regexp.MustCompile(`<a (?:name|id)="([^"]+)"`)
)

// checkLinks reports every relative link of the Markdown file f that
// names a file or folder the repository does not track, or an anchor that
// the Markdown file it names has no heading for.
func checkLinks(f string, tracked []string, report func(string, ...any)) error {
	text, err := os.ReadFile(f)
	if err != nil {
		return err
	}
	for n, line := range proseLines(string(text)) {
		if line == "" {
			continue
		}
		for _, m := range mdLink.FindAllStringSubmatch(inlineCode.ReplaceAllString(line, ""), -1) {
			target := m[1]
			if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
				continue
			}
			file, anchor, _ := strings.Cut(target, "#")
			if file == "" {
				file = f
			} else {
				file = path.Join(path.Dir(f), file)
			}
			if !tracks(tracked, file) {
				report("%s:%d: link %s names %s, which is not in the repository", f, n+1, target, file)
				continue
			}
			if anchor == "" || !strings.HasSuffix(file, ".md") {
				continue
			}
			body, err := os.ReadFile(file)
			if err != nil {
				return err
			}
			if !slices.Contains(anchors(string(body)), anchor) {
				report("%s:%d: link %s: %s has no heading for #%s", f, n+1, target, file, anchor)
			}
		}
	}
	return nil
}

// tracks says whether file is a tracked file or a folder that holds one.
func tracks(tracked []string, file string) bool {
	file = strings.TrimSuffix(file, "/")
	for _, t := range tracked {
		if t == file || strings.HasPrefix(t, file+"/") {
			return true
		}
	}
	return false
}

// proseLines returns text's lines with those of fenced code blocks
// emptied, so that line numbers stay those of the file.
func proseLines(text string) []string {
	lines := strings.Split(text, "\n")
	fence := ""
	for i, l := range lines {
		t := strings.TrimSpace(l)
		switch {
		case fence == "" && (strings.HasPrefix(t, "```") || strings.HasPrefix(t, "~~~")):
			fence = t[:3]
			lines[i] = ""
		case fence != "":
			if strings.HasPrefix(t, fence) {
				fence = ""
			}
			lines[i] = ""
		}
	}
	return lines
}

// anchors returns the anchors of a Markdown file's headings as GitHub
// makes them (the text lower-cased, punctuation dropped, spaces made
// hyphens, a repeated one suffixed -1, -2, ...), and those of its HTML
// anchors.
func anchors(text string) []string {
	var out []string
	seen := map[string]int{}
	for _, l := range proseLines(text) {
		for _, m := range htmlAnchor.FindAllStringSubmatch(l, -1) {
			out = append(out, m[1])
		}
		if !strings.HasPrefix(l, "#") {
			continue
		}
		title := strings.TrimSpace(strings.TrimLeft(l, "#"))
		a := anchor(title)
		if k := seen[a]; k > 0 {
			out = append(out, a+"-"+strconv.Itoa(k))
		} else {
			out = append(out, a)
		}
		seen[a]++
	}
	return out
}

// anchor is the anchor GitHub gives a heading's text.
func anchor(title string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(title) {
		switch {
		case r == ' ':
			b.WriteByte('-')
		case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r):
			b.WriteRune(r)
		}
	}
	return b.String()
}
