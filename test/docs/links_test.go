// Package docs checks the documentation: every relative link of the README
// and of docs/ resolves, anchors included, and the API reference is what
// its generator makes of api/v1alpha1. Nothing here reaches the network.
package docs

import (
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"unicode"
)

// root is the repository.
var root = filepath.Join("..", "..")

// TestLinksResolve checks every link of README.md and docs/*.md that is not a
// URL: the file or directory it names exists, and the anchor, if any, is a
// heading of the Markdown page it points to (as GitHub makes anchors).
func TestLinksResolve(t *testing.T) {
	pages := markdownPages(t)
	if len(pages) < 2 {
		t.Fatalf("found %d pages; the test runs in test/docs", len(pages))
	}
	anchors := map[string][]string{} // page → its anchors, read on demand
	anchorsOf := func(page string) []string {
		if a, ok := anchors[page]; ok {
			return a
		}
		data, err := os.ReadFile(filepath.Join(root, page))
		if err != nil {
			t.Fatal(err)
		}
		anchors[page] = headingAnchors(string(data))
		return anchors[page]
	}
	checked := 0
	for _, page := range pages {
		data, err := os.ReadFile(filepath.Join(root, page))
		if err != nil {
			t.Fatal(err)
		}
		for _, l := range links(string(data)) {
			if isURL(l.target) {
				continue
			}
			checked++
			path, anchor, _ := strings.Cut(l.target, "#")
			target := page
			if path != "" {
				target = filepath.ToSlash(filepath.Clean(filepath.Join(filepath.Dir(page), path)))
				if strings.HasPrefix(target, "../") {
					t.Errorf("%s:%d: %s leaves the repository", page, l.line, l.target)
					continue
				}
				if _, err := os.Stat(filepath.Join(root, target)); err != nil {
					t.Errorf("%s:%d: %s: %s does not exist", page, l.line, l.target, target)
					continue
				}
			}
			if anchor == "" {
				continue
			}
			if !strings.HasSuffix(target, ".md") {
				t.Errorf("%s:%d: %s: an anchor into a file that is not Markdown", page, l.line, l.target)
				continue
			}
			if !slices.Contains(anchorsOf(target), anchor) {
				t.Errorf("%s:%d: %s: %s has no heading with the anchor #%s (it has: %s)", page, l.line, l.target, target, anchor, strings.Join(anchorsOf(target), " "))
			}
		}
	}
	t.Logf("%d relative links checked in %d pages", checked, len(pages))
}

// markdownPages is README.md and every Markdown file under docs/, relative to
// the repository.
func markdownPages(t *testing.T) []string {
	t.Helper()
	pages := []string{"README.md"}
	err := filepath.WalkDir(filepath.Join(root, "docs"), func(path string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(path, ".md") {
			return err
		}
		rel, err := filepath.Rel(root, path)
		pages = append(pages, filepath.ToSlash(rel))
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return pages
}

type link struct {
	target string
	line   int
}

var (
	inlineLink    = regexp.MustCompile(`\]\(([^)\s]+)(?:\s+"[^"]*")?\)`)
	referenceLink = regexp.MustCompile(`^\s*\[[^\]]+\]:\s*(\S+)`)
	inlineCode    = regexp.MustCompile("`[^`]*`")
	htmlAnchor    = regexp.MustCompile(`<a\s+(?:name|id)="([^"]+)"`)
)

// links returns the link targets of a Markdown page, outside code blocks and
// inline code.
func links(page string) []link {
	var out []link
	for i, line := range proseLines(page) {
		if line == "" {
			continue
		}
		line = inlineCode.ReplaceAllString(line, "")
		for _, m := range inlineLink.FindAllStringSubmatch(line, -1) {
			out = append(out, link{target: m[1], line: i + 1})
		}
		if m := referenceLink.FindStringSubmatch(line); m != nil {
			out = append(out, link{target: m[1], line: i + 1})
		}
	}
	return out
}

// proseLines returns the page's lines with those of fenced code blocks
// blanked, so line numbers stay those of the file.
func proseLines(page string) []string {
	lines := strings.Split(page, "\n")
	fence := ""
	for i, line := range lines {
		trimmed := strings.TrimLeft(strings.TrimPrefix(strings.TrimLeft(line, " "), ">"), " ")
		switch {
		case fence == "" && (strings.HasPrefix(trimmed, "```") || strings.HasPrefix(trimmed, "~~~")):
			fence = trimmed[:3]
			lines[i] = ""
		case fence != "":
			if strings.HasPrefix(trimmed, fence) {
				fence = ""
			}
			lines[i] = ""
		}
	}
	return lines
}

// headingAnchors returns the anchors GitHub gives the page's headings (with
// -1, -2... for repeats), and those of explicit <a name> or <a id> tags.
func headingAnchors(page string) []string {
	var out []string
	seen := map[string]int{}
	for _, line := range proseLines(page) {
		for _, m := range htmlAnchor.FindAllStringSubmatch(line, -1) {
			out = append(out, m[1])
		}
		if !strings.HasPrefix(line, "#") {
			continue
		}
		text := strings.TrimLeft(line, "#")
		if text == "" || text[0] != ' ' {
			continue
		}
		slug := slugify(text)
		if n := seen[slug]; n > 0 {
			out = append(out, slug+"-"+strconv.Itoa(n))
		} else {
			out = append(out, slug)
		}
		seen[slug]++
	}
	return out
}

var linkText = regexp.MustCompile(`\[([^\]]*)\]\([^)]*\)`)

// slugify makes a heading's anchor as GitHub does: the text of links kept,
// lower case, letters, digits, hyphens and underscores kept, spaces made
// hyphens, everything else dropped.
func slugify(heading string) string {
	heading = linkText.ReplaceAllString(strings.TrimSpace(heading), "$1")
	var b strings.Builder
	for _, r := range heading {
		switch {
		case unicode.IsLetter(r) || unicode.IsDigit(r) || r == '-' || r == '_':
			b.WriteRune(unicode.ToLower(r))
		case r == ' ':
			b.WriteByte('-')
		}
	}
	return b.String()
}

func isURL(target string) bool {
	return strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:")
}
