// Package envtestassets finds the envtest binaries (etcd, kube-apiserver,
// kubectl) for tests, benchmarks and the demo.
package envtestassets

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// Dir returns $KUBEBUILDER_ASSETS if set, or else runs the repository's
// hack/setup-envtest.sh, which builds the binaries from source into bin/k8s
// the first time (minutes) and returns at once after that. root is the
// repository's root; the script's progress goes to progress.
func Dir(ctx context.Context, root string, progress io.Writer) (string, error) {
	if dir := os.Getenv("KUBEBUILDER_ASSETS"); dir != "" {
		return dir, nil
	}
	// The script's path is resolved against cmd.Dir, so a relative root
	// (a test's "..") must be made absolute first.
	root, err := filepath.Abs(root)
	if err != nil {
		return "", err
	}
	cmd := exec.CommandContext(ctx, filepath.Join(root, "hack", "setup-envtest.sh"))
	cmd.Dir = root
	cmd.Stderr = progress
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("hack/setup-envtest.sh: %w", err)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	return lines[len(lines)-1], nil
}
