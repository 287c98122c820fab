package main

import (
	"bytes"
	"debug/elf"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/lockwarden/lockwarden/internal/podrun"
)

// managerBin is the manager binary TestMain builds with `make manager`, as
// the image gets it, for tests that run it as a pod would: its whole output
// is what lands in the pod log.
var managerBin string

// testVersion is the VERSION TestMain passes to make.
const testVersion = "v0.0.0-manager-test"

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "manager-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	managerBin = filepath.Join(dir, "manager")
	out, err := exec.Command("make", "-C", filepath.Join("..", ".."), "manager", "MANAGER_BIN="+managerBin, "VERSION="+testVersion).CombinedOutput()
	if err != nil {
		fmt.Fprintf(os.Stderr, "make manager: %v\n%s", err, out)
		os.RemoveAll(dir)
		os.Exit(1)
	}
	code := m.Run()
	envStop()
	os.RemoveAll(dir)
	os.Exit(code)
}

// runManager runs the binary with args and extra environment, and returns
// stdout and stderr together.
func runManager(t *testing.T, env []string, args ...string) string {
	t.Helper()
	out, _ := runManagerCode(t, env, args...)
	return out
}

// runManagerCode is runManager that also returns the exit code.
func runManagerCode(t *testing.T, env []string, args ...string) (string, int) {
	t.Helper()
	cmd := exec.Command(managerBin, args...)
	// No KUBECONFIG or REDIS_* from the test's own environment.
	cmd.Env = append([]string{"HOME=" + t.TempDir(), "KUBECONFIG=" + filepath.Join(t.TempDir(), "absent")}, env...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	code := podrun.Run(t, cmd, 30*time.Second, &out)
	return out.String(), code
}

// A Redis URL carrying a password reaches the pod log neither through a
// flag's usage text (a mistyped flag prints every flag's default) nor
// through the start-up log, nor through a rejected URL or a bad flag.
func TestRedisPasswordNeverPrinted(t *testing.T) {
	const password = "hunter2-Zq9"
	for _, tc := range []struct {
		name string
		url  string
		args []string
	}{
		{"mistyped flag", "redis://user:" + password + "@127.0.0.1:1/0", []string{"--leader-elekt"}},
		{"help", "redis://user:" + password + "@127.0.0.1:1/0", []string{"--help"}},
		{"invalid flag value", "redis://user:" + password + "@127.0.0.1:1/0", []string{"--leader-elect-lease-duration=soon"}},
		{"start-up log", "redis://user:" + password + "@127.0.0.1:1/0", []string{"--leader-elect"}},
		{"invalid URL", "redis://user:" + password + "@127.0.0.1:notaport/0", nil},
		{"wrong scheme", "http://user:" + password + "@127.0.0.1:1/0", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out := runManager(t, []string{"REDIS_URL=" + tc.url}, tc.args...)
			if out == "" {
				t.Fatal("no output at all; the test would prove nothing")
			}
			if strings.Contains(out, password) {
				t.Fatalf("the password is in the manager's output:\n%s", out)
			}
		})
	}
	// The start-up log names the target, so the URL was read and redacted,
	// not ignored.
	out := runManager(t, []string{"REDIS_URL=redis://user:" + password + "@127.0.0.1:1/0"})
	if !strings.Contains(out, "redis://127.0.0.1:1/0") {
		t.Fatalf("the start-up log does not name the redacted target:\n%s", out)
	}
}

func TestVersion(t *testing.T) {
	out, code := runManagerCode(t, nil, "--version")
	if code != 0 || out != testVersion+"\n" {
		t.Fatalf("manager --version: exit %d, output %q; want %q", code, out, testVersion+"\n")
	}
}

// The manager binary is static: no ELF interpreter (the dynamic loader) and
// no shared libraries, so it runs in a scratch or distroless image.
func TestBinaryIsStatic(t *testing.T) {
	f, err := elf.Open(managerBin)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			t.Error("the manager binary has an interpreter (PT_INTERP): it is dynamically linked")
		}
	}
	if libs, err := f.ImportedLibraries(); err != nil || len(libs) > 0 {
		t.Errorf("the manager binary needs shared libraries %v (%v)", libs, err)
	}
}
