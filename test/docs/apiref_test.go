package docs

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// TestAPIReferenceIsGenerated runs the API reference's generator, as make
// api-docs does, into a scratch file and fails when docs/api-reference.md
// differs from it: a change to api/v1alpha1 must come with the page.
func TestAPIReferenceIsGenerated(t *testing.T) {
	gen, err := filepath.Abs(filepath.Join(root, "bin", "crd-ref-docs"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(gen); err != nil {
		t.Fatalf("the generator is missing (make crd-ref-docs builds it): %v", err)
	}
	out := filepath.Join(t.TempDir(), "api-reference.md")
	cmd := exec.Command(gen, "--source-path=api/v1alpha1", "--config=hack/api-docs/config.yaml",
		"--renderer=markdown", "--output-path="+out, "--log-level=WARN")
	cmd.Dir = root
	if msg, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("crd-ref-docs: %v\n%s", err, msg)
	}
	want, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(filepath.Join(root, "docs", "api-reference.md"))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("docs/api-reference.md is not what make api-docs writes from api/v1alpha1; run make api-docs.\nFirst difference:\n%s", firstDifference(string(got), string(want)))
	}
	// The page documents every field of the spec, by its JSON name.
	for _, field := range []string{"key", "leaseDuration", "renewInterval", "candidates", "mode", "startTimeout", "deleteUnstarted", "holder", "highestToken"} {
		if !strings.Contains(string(got), "| `"+field+"` ") {
			t.Errorf("docs/api-reference.md has no row for the field %s", field)
		}
	}
}

// firstDifference shows the first line where the two texts differ.
func firstDifference(got, want string) string {
	g, w := strings.Split(got, "\n"), strings.Split(want, "\n")
	for i := 0; i < len(g) || i < len(w); i++ {
		var gl, wl string
		if i < len(g) {
			gl = g[i]
		}
		if i < len(w) {
			wl = w[i]
		}
		if gl != wl {
			return "line " + strconv.Itoa(i+1) + ":\n  committed: " + gl + "\n  generated: " + wl
		}
	}
	return "(none: the files differ in their line endings)"
}

// TestEveryAlertHasARunbook checks that each alert of
// config/alerts/prometheusrule.yaml has a section in docs/operating.md whose
// anchor is the alert's name in lower case: the alerts' runbook_url points
// there.
func TestEveryAlertHasARunbook(t *testing.T) {
	rules, err := os.ReadFile(filepath.Join(root, "config", "alerts", "prometheusrule.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	alerts := regexp.MustCompile(`(?m)^\s*- alert: (\S+)\s*$`).FindAllStringSubmatch(string(rules), -1)
	if len(alerts) == 0 {
		t.Fatal("found no alert in config/alerts/prometheusrule.yaml")
	}
	page, err := os.ReadFile(filepath.Join(root, "docs", "operating.md"))
	if err != nil {
		t.Fatal(err)
	}
	anchors := headingAnchors(string(page))
	for _, a := range alerts {
		want := strings.ToLower(a[1])
		if !slices.Contains(anchors, want) {
			t.Errorf("docs/operating.md has no section for the alert %s (anchor #%s)", a[1], want)
		}
	}
}
