package main

import (
	"slices"
	"strings"
	"testing"
)

// run was built on Go's flag package, which takes -lock as well as --lock
// and stops at the first argument that is not a flag; job images call it
// both ways, and CMD's own flags must reach CMD.
func TestRunFlagsOneDashOrTwo(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	const name = "dashes"
	t.Run("held elsewhere", func(t *testing.T) {
		f.hold(t, name)
		for _, args := range [][]string{
			{"run", "-lock", name, "-skip", "--", "sh", "-c", "echo ran"},
			{"run", "-lock=" + name, "-wait=200ms", "sh", "-c", "echo ran"},
			{"run", "--lock", name, "-wait", "200ms", "-grace", "1s", "-lease", "2s", "sh", "-c", "echo ran"},
		} {
			p := f.start(t, args...)
			code, stderr := p.wait(t)
			wantExit(t, code, stderr, exitLocked, "held elsewhere")
			if slices.Contains(drain(p), "ran") {
				t.Fatalf("lockwarden %v ran CMD while the lock was held elsewhere", args)
			}
		}
	})
	t.Run("CMD's flags", func(t *testing.T) {
		for _, args := range [][]string{
			{"run", "-lock", name, "--", "sh", "-c", `echo "$*"`, "sh", "-lock", "x", "--wait", "y"},
			{"run", "-lock", name, "sh", "-c", `echo "$*"`, "sh", "-lock", "x", "--wait", "y"},
		} {
			p := f.start(t, args...)
			code, stderr := p.wait(t)
			wantExit(t, code, stderr, 0)
			if out := strings.Join(drain(p), "\n"); out != "-lock x --wait y" {
				t.Fatalf("lockwarden %v: CMD got %q, want its own flags", args, out)
			}
			f.wantFree(t, name)
		}
	})
	t.Run("kubectl's flags do not apply", func(t *testing.T) {
		code, stderr := f.run(t, "run", "-n", "batch", "--lock", name, "--", "true")
		wantExit(t, code, stderr, exitUsage, "unknown shorthand flag: 'n'")
		code, stderr = f.run(t, "-n", "batch", "run", "--lock", name, "--", "true")
		wantExit(t, code, stderr, exitUsage, "unknown shorthand flag: 'n'")
	})
}
