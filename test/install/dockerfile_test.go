package install

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// TestDockerfileMatchesImage checks the Dockerfile, which cannot run here
// (no docker, no network), against the image make image builds and against
// the module: the same entrypoint, user, working directory and labels; a
// static build stamped with the version; a Go as new as go.mod asks for;
// both bases pinned by digest, the builder on the build platform
// cross-compiling for the target's; and every directory the manager's
// packages live in copied into the build.
func TestDockerfileMatchesImage(t *testing.T) {
	data, err := os.ReadFile(filepath.Join(root, "Dockerfile"))
	if err != nil {
		t.Fatal(err)
	}
	// Continuation lines joined, comments dropped: one instruction a line.
	text := regexp.MustCompile(`\\\n\s*`).ReplaceAllString(string(data), "")
	var stages [][]string // instructions of each stage
	for _, line := range strings.Split(text, "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		if strings.HasPrefix(line, "FROM ") {
			stages = append(stages, nil)
		}
		if len(stages) == 0 {
			t.Fatalf("instruction before FROM: %s", line)
		}
		stages[len(stages)-1] = append(stages[len(stages)-1], line)
	}
	if len(stages) != 2 {
		t.Fatalf("%d stages, want a builder and the image", len(stages))
	}
	builder, final := stages[0], stages[1]

	mod, err := os.ReadFile(filepath.Join(root, "go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	goVersion := regexp.MustCompile(`(?m)^go (\d+\.\d+)`).FindSubmatch(mod)
	if goVersion == nil {
		t.Fatal("no go directive in go.mod")
	}
	// The builder: go.mod's Go, pinned by digest, on the build machine's
	// platform, cross-compiling for the target's.
	if want := regexp.MustCompile(`^FROM --platform=\$BUILDPLATFORM golang:` + regexp.QuoteMeta(string(goVersion[1])) + `@sha256:[0-9a-f]{64} AS builder$`); !want.MatchString(builder[0]) {
		t.Errorf("builder stage %q, want %s (go.mod's go directive, a digest, the build platform)", builder[0], want)
	}
	for _, arg := range []string{"ARG TARGETOS", "ARG TARGETARCH"} {
		if !slices.Contains(builder, arg) {
			t.Errorf("the builder lacks %q", arg)
		}
	}
	build := ""
	for _, line := range builder {
		if strings.Contains(line, "go build") {
			build = line
		}
	}
	for _, want := range []string{"CGO_ENABLED=0", "GOOS=${TARGETOS:-linux} GOARCH=${TARGETARCH}", `-ldflags "-s -w -X main.version=${VERSION}"`, "-o manager ./cmd/manager"} {
		if !strings.Contains(build, want) {
			t.Errorf("the build %q lacks %s", build, want)
		}
	}

	// Every main-module package the manager builds from lies in a copied
	// directory.
	var copied []string
	for _, line := range builder {
		if f := strings.Fields(line); f[0] == "COPY" && !strings.HasPrefix(f[1], "--") {
			for _, src := range f[1 : len(f)-1] {
				copied = append(copied, strings.TrimSuffix(src, "/"))
			}
		}
	}
	cmd := exec.Command("go", "list", "-deps", "-f", "{{if .Module}}{{if .Module.Main}}{{.Dir}}{{end}}{{end}}", "./cmd/manager")
	cmd.Dir = root
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	for _, dir := range strings.Fields(string(out)) {
		rel, err := filepath.Rel(root, dir)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Contains(copied, strings.SplitN(filepath.ToSlash(rel), "/", 2)[0]) {
			t.Errorf("the manager builds from %s, which the Dockerfile does not copy (it copies %v)", rel, copied)
		}
	}
	for _, f := range []string{"go.mod", "go.sum"} {
		if !slices.Contains(copied, f) {
			t.Errorf("the Dockerfile does not copy %s", f)
		}
	}

	// The final stage, against make image's config.
	cfg := img.config.Config
	if !regexp.MustCompile(`^FROM gcr\.io/distroless/static:nonroot@sha256:[0-9a-f]{64}$`).MatchString(final[0]) {
		t.Errorf("final stage %q, want distroless static nonroot pinned by digest", final[0])
	}
	entrypoint, _ := json.Marshal(cfg.Entrypoint)
	for _, want := range []string{
		"USER " + cfg.User,
		"WORKDIR " + cfg.WorkingDir,
		"ENTRYPOINT " + strings.ReplaceAll(string(entrypoint), ",", ", "),
		"COPY --from=builder /workspace/manager .",
	} {
		if !slices.Contains(final, want) {
			t.Errorf("the final stage lacks %q: %q", want, final)
		}
	}
	labels := map[string]string{}
	for _, line := range final {
		if rest, ok := strings.CutPrefix(line, "LABEL "); ok {
			for _, m := range regexp.MustCompile(`(\S+)="([^"]*)"`).FindAllStringSubmatch(rest, -1) {
				labels[m[1]] = m[2]
			}
		}
	}
	for key := range cfg.Labels {
		if _, ok := labels[key]; !ok {
			t.Errorf("the Dockerfile lacks the label %s that make image sets", key)
		}
	}
	if labels["org.opencontainers.image.version"] != "${VERSION}" || labels["org.opencontainers.image.revision"] != "${REVISION}" ||
		labels["org.opencontainers.image.source"] != cfg.Labels["org.opencontainers.image.source"] ||
		labels["org.opencontainers.image.licenses"] != cfg.Labels["org.opencontainers.image.licenses"] || len(labels) != len(cfg.Labels) {
		t.Errorf("Dockerfile labels %v, make image's %v", labels, cfg.Labels)
	}
}
