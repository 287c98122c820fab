package main

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestDemo plays the whole story against a real control plane, redis-server
// and manager, and checks its facts in what it printed.
func TestDemo(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	// A manager of this tree's sources, built for the test: bin/manager may
	// be shared with other checkouts (bin/ can be a symlink) and hold
	// another tree's build, newer than these sources.
	root, err := findRoot()
	if err != nil {
		t.Fatal(err)
	}
	manager := filepath.Join(t.TempDir(), "manager")
	build := exec.CommandContext(ctx, goTool(), "build", "-o", manager, "./cmd/manager")
	build.Dir = root
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build ./cmd/manager: %v\n%s", err, out)
	}
	var out bytes.Buffer
	err = run(ctx, &out, options{manager: manager})
	text := out.String()
	if err != nil || t.Failed() || testing.Verbose() {
		t.Logf("demo output:\n%s", text)
	}
	if err != nil {
		t.Fatalf("demo: %v", err)
	}

	facts := []struct{ what, pattern string }{
		{"a web pod is granted leader", `(?m)^leader\s+demo/leader\s+True\s+web-\S+\s+\d+\s+2\s+False\s`},
		{"the leader is labelled as holder", `(?m)^web-\S+\s.*\sapp=web,holder\.lockwarden\.dev/leader=true,pod-template-hash=\S+$`},
		{"the leader is annotated", `(?m)^token\.lockwarden\.dev/leader=\d+$`},
		{"run-1 holds nightly, ungated", `(?m)^run-1-\S+\s+<none>\s+true\s+(Pending|Running)\s`},
		{"run-2 is still gated while run-1 holds", `(?m)^run-2-\S+\s+gate\.lockwarden\.dev/nightly\s+<none>\s+Pending\s`},
		{"both runs succeed", `(?m)^run-2-\S+\s+<none>\s+<none>\s+Succeeded\s+kwok-node-\d$`},
		{"the runs never overlap", `✓ the runs never overlapped: run-2's pod started \d+ms after run-1's stopped`},
		{"the in-pod holder is shown", `(?m)^jobs\s+worker-\S+\s+[0-9a-f-]{36}:[0-9]+\s+false\s+\d+$`},
		{"the worker fails by itself", `(?m)^worker-\S+\s+Failed\s+1$`},
		{"the in-pod hold is released", `(?m)^jobs\s+demo/jobs\s+True\s+False\s+\S+$`},
		{"Redis shows it released", `-> Redis: demo/jobs is free`},
		{"the worker learns it", `the worker's hold\.Context\(\) ended: `},
		{"the summary", `All checks passed in `},
	}
	for _, f := range facts {
		if !regexp.MustCompile(f.pattern).MatchString(text) {
			t.Errorf("%s: no match for %s", f.what, f.pattern)
		}
	}
	m := regexp.MustCompile(`✓ web-\S+ took over leader \(fencing token \d+ -> \d+\) \d+ms after the deletion request, ([-+]\d+)ms from web-\S+ being gone`).FindStringSubmatch(text)
	if m == nil {
		t.Fatal("no handover time in the output")
	}
	if ms, _ := strconv.Atoi(m[1]); ms >= 1000 {
		t.Errorf("handover %dms after the old leader was gone, want under 1s", ms)
	}
	if !strings.Contains(text, "Stopping the manager, redis and the control plane... done.") {
		t.Error("no clean-up in the output")
	}
	if runtime.GOOS == "linux" {
		if kids := children(t); len(kids) > 0 {
			t.Errorf("processes the demo started are still there: %v", kids)
		}
	}
}

// children lists this process's child processes, as "pid name".
func children(t *testing.T) []string {
	t.Helper()
	stats, err := filepath.Glob("/proc/[0-9]*/stat")
	if err != nil {
		t.Fatal(err)
	}
	self := strconv.Itoa(os.Getpid())
	var kids []string
	for _, path := range stats {
		data, err := os.ReadFile(path)
		if err != nil {
			continue // exited meanwhile
		}
		// pid (comm) state ppid ...; comm may contain spaces and parentheses.
		s := string(data)
		open, end := strings.IndexByte(s, '('), strings.LastIndexByte(s, ')')
		if open < 0 || end < open {
			continue
		}
		if f := strings.Fields(s[end+1:]); len(f) > 1 && f[1] == self {
			kids = append(kids, strings.TrimSpace(s[:open])+" "+s[open+1:end])
		}
	}
	return kids
}
