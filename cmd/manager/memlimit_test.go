package main

import (
	"os"
	"path/filepath"
	"runtime/debug"
	"testing"
)

func TestSetMemoryLimit(t *testing.T) {
	defer debug.SetMemoryLimit(debug.SetMemoryLimit(-1)) // put the test binary's limit back
	dir := t.TempDir()
	file := func(name, content string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	noEnv := func(string) string { return "" }
	v2, unlimited, v1Unlimited := file("v2", "268435456\n"), file("max", "max\n"), file("v1", "9223372036854771712\n")

	const mib = 1 << 20
	if limit, ok := setMemoryLimit(noEnv, []string{filepath.Join(dir, "absent"), v2}); !ok || limit != 192*mib {
		t.Fatalf("256 MiB container: %d, %v; want 192 MiB", limit, ok)
	}
	if got := debug.SetMemoryLimit(-1); got != 192*mib {
		t.Fatalf("runtime limit %d", got)
	}
	for container, want := range map[string]int64{"134217728": 96 * mib, "1073741824": 960 * mib} {
		if limit, _ := setMemoryLimit(noEnv, []string{file("c", container)}); limit != want {
			t.Errorf("%s-byte container: %d MiB, want %d MiB", container, limit/mib, want/mib)
		}
	}
	for name, files := range map[string][]string{"v2 max": {unlimited, v2}, "v1 unlimited": {v1Unlimited}, "no cgroup": {filepath.Join(dir, "absent")}} {
		if limit, ok := setMemoryLimit(noEnv, files); ok {
			t.Errorf("%s: set %d", name, limit)
		}
	}
	if _, ok := setMemoryLimit(func(k string) string { return map[string]string{"GOMEMLIMIT": "100MiB"}[k] }, []string{v2}); ok {
		t.Error("overrode GOMEMLIMIT")
	}
}
