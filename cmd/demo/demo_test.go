package main

import (
	"bytes"
	"context"
	"os"
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
	var out bytes.Buffer
	err := run(ctx, &out, options{})
	text := out.String()
	if err != nil || t.Failed() || testing.Verbose() {
		t.Logf("demo output:\n%s", text)
	}
	if err != nil {
		t.Fatalf("demo: %v", err)
	}

	facts := []struct{ what, pattern string }{
		{"web-1 is granted leader", `(?m)^leader\s+demo/leader\s+web-1\s+\d+\s+2\s`},
		{"web-1 is labelled as holder", `(?m)^web-1\s.*\sapp=web,holder\.lockwarden\.dev/leader=true$`},
		{"web-1 is annotated", `(?m)^token\.lockwarden\.dev/leader=\d+$`},
		{"run-1 holds nightly, ungated", `(?m)^run-1\s+<none>\s+true\s+Pending$`},
		{"run-2 is still gated while run-1 holds", `(?m)^run-2\s+gate\.lockwarden\.dev/nightly\s+<none>\s+Pending$`},
		{"run-2 is ungated after run-1", `(?m)^run-2\s+<none>\s+true\s+Pending$`},
		{"web-2 takes over", `(?m)^leader\s+demo/leader\s+web-2\s+\d+\s+1\s`},
		{"the in-pod holder is shown", `(?m)^jobs\s+worker\s+[0-9a-f-]{36}:[0-9]+\s+false\s+\d+$`},
		{"the in-pod hold is released", `(?m)^jobs\s+demo/jobs\s+\S+$`},
		{"Redis shows it released", `-> Redis: demo/jobs is free`},
		{"the worker learns it", `the worker's hold\.Context\(\) ended: `},
		{"the summary", `All checks passed in `},
	}
	for _, f := range facts {
		if !regexp.MustCompile(f.pattern).MatchString(text) {
			t.Errorf("%s: no match for %s", f.what, f.pattern)
		}
	}
	m := regexp.MustCompile(`✓ web-2 took over leader (-?\d+)ms after web-1's deletion`).FindStringSubmatch(text)
	if m == nil {
		t.Fatal("no handover time in the output")
	}
	if ms, _ := strconv.Atoi(m[1]); ms >= 1000 {
		t.Errorf("handover took %dms, want under 1s", ms)
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
