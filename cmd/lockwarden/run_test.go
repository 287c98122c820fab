package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/lockwarden/lockwarden/pkg/redislock"
)

func TestRunHoldsLockWhileCommandRuns(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	name := redislock.LockName("batch", "nightly-report")
	p := f.start(t, "run", "--lock-resource", "nightly-report", "--",
		"sh", "-c", `echo "$LOCKWARDEN_LOCK $LOCKWARDEN_FENCING_TOKEN"; read line; echo "read $line"`)

	gotName, token, _ := strings.Cut(p.line(t), " ")
	info := f.inspect(t, name)
	if !f.heldByPod(info) {
		t.Fatalf("while CMD runs, the lock is %+v, want it held by an owner %s:<n>", info, f.podUID)
	}
	if gotName != name || token != strconv.FormatInt(info.Token, 10) {
		t.Fatalf("CMD got LOCKWARDEN_LOCK=%s LOCKWARDEN_FENCING_TOKEN=%s, want %s %d", gotName, token, name, info.Token)
	}
	if _, err := p.stdin.Write([]byte("go on\n")); err != nil {
		t.Fatal(err)
	}
	if line := p.line(t); line != "read go on" {
		t.Fatalf("CMD wrote %q", line)
	}
	code, stderr := p.wait(t)
	wantExit(t, code, stderr, 0)
	if stderr != "" {
		t.Fatalf("stderr of a clean run: %s", stderr)
	}
	f.wantFree(t, name)
}

// TestRunTwoInOnePod checks that two lockwardens of one pod, which share
// the pod UID, exclude each other rather than re-enter the lock.
func TestRunTwoInOnePod(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	const name = "one-pod"
	first := f.start(t, "run", "--lock", name, "--", "sh", "-c", "echo started; read line || true")
	first.line(t)
	p := f.start(t, "run", "--lock", name, "--skip", "--", "sh", "-c", "echo ran")
	code, stderr := p.wait(t)
	wantExit(t, code, stderr, exitLocked, "held elsewhere")
	if slices.Contains(drain(p), "ran") {
		t.Fatal("the second CMD ran while the first held the lock")
	}
	if err := first.stdin.Close(); err != nil {
		t.Fatal(err)
	}
	code, stderr = first.wait(t)
	wantExit(t, code, stderr, 0)
	f.wantFree(t, name)
}

func TestRunExitStatus(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	notExecutable := filepath.Join(t.TempDir(), "script")
	if err := os.WriteFile(notExecutable, []byte("#!/bin/sh\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		cmd  []string
		want int
	}{
		{"exit 0", []string{"sh", "-c", "exit 0"}, 0},
		{"exit 7", []string{"sh", "-c", "exit 7"}, 7},
		{"killed by SIGKILL", []string{"sh", "-c", "kill -KILL $$"}, 128 + 9},
		{"not found", []string{"lockwarden-test-no-such-command"}, exitNotFound},
		{"not executable", []string{notExecutable}, exitCannotRun},
	} {
		t.Run(tc.name, func(t *testing.T) {
			const name = "exit-status"
			code, stderr := f.run(t, append([]string{"run", "--lock", name, "--"}, tc.cmd...)...)
			wantExit(t, code, stderr, tc.want)
			f.wantFree(t, name)
		})
	}
}

func TestRunLockHeldElsewhere(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	const name = "held-elsewhere"
	run := func(t *testing.T, flags ...string) (code int, stderr string, ran bool) {
		p := f.start(t, append(append([]string{"run", "--lock", name}, flags...), "--", "sh", "-c", "echo ran")...)
		code, stderr = p.wait(t)
		return code, stderr, slices.Contains(drain(p), "ran")
	}

	t.Run("skip", func(t *testing.T) {
		f.hold(t, name)
		code, stderr, ran := run(t, "--skip")
		wantExit(t, code, stderr, exitLocked, "held elsewhere")
		if ran {
			t.Fatal("CMD ran")
		}
	})
	t.Run("wait runs out", func(t *testing.T) {
		f.hold(t, name)
		code, stderr, ran := run(t, "--wait", "300ms")
		wantExit(t, code, stderr, exitLocked, "held elsewhere", "300ms")
		if ran {
			t.Fatal("CMD ran")
		}
		if info := f.inspect(t, name); len(info.Waiters) > 0 {
			t.Fatalf("lockwarden left a waiter behind: %+v", info)
		}
	})
	t.Run("released while waiting", func(t *testing.T) {
		hold := f.hold(t, name)
		unlocked := make(chan error, 1)
		time.AfterFunc(200*time.Millisecond, func() { unlocked <- hold.Unlock(context.Background()) })
		code, stderr, ran := run(t, "--wait", "5s")
		if err := <-unlocked; err != nil {
			t.Fatal(err)
		}
		wantExit(t, code, stderr, 0)
		if !ran {
			t.Fatal("CMD did not run")
		}
		f.wantFree(t, name)
	})
}

func TestRunLockLost(t *testing.T) {
	t.Parallel()
	forceRelease := func(t *testing.T, f *fixture, name string) {
		if n, err := f.client.ForceReleaseClient(context.Background(), name, f.podUID); err != nil || n != 1 {
			t.Fatalf("ForceReleaseClient = %d, %v", n, err)
		}
	}
	stopRedis := func(_ *testing.T, f *fixture, _ string) { f.srv.Stop() }
	// A shell that traps SIGTERM runs its trap only once its foreground
	// child ends, and a signal that reaches a child between fork and exec
	// can be lost, so scripts that trap sleep in short steps: a long sleep
	// made these tests wait out the grace period about one run in four.
	for _, tc := range []struct {
		name   string
		script string // runs after CMD printed a line
		fault  func(t *testing.T, f *fixture, name string)
		want   int
		cause  error
		killed bool // whether CMD needs SIGKILL
	}{
		{"SIGTERM", "sleep 30", forceRelease, exitLockLost, redislock.ErrNotOwner, false},
		{"exit on SIGTERM", "trap 'exit 3' TERM; while :; do sleep 0.1; done", forceRelease, 3, redislock.ErrNotOwner, false},
		{"SIGKILL after grace", "trap '' TERM; sleep 30", forceRelease, exitLockLost, redislock.ErrNotOwner, true},
		{"Redis stopped", "sleep 30", stopRedis, exitLockLost, redislock.ErrLeaseLost, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			f := newFixture(t)
			const name = "lost"
			// A lease a loaded machine's stalls do not end before the fault.
			p := f.start(t, "run", "--lock", name, "--lease", "3s", "--grace", "500ms", "--",
				"sh", "-c", "echo started; "+tc.script)
			p.line(t)
			tc.fault(t, f, name)
			code, stderr := p.wait(t)
			wantExit(t, code, stderr, tc.want, "lost lock", tc.cause.Error(), "SIGTERM")
			if strings.Contains(stderr, "SIGKILL") != tc.killed {
				t.Fatalf("SIGKILL sent: %v, want %v; stderr:\n%s", !tc.killed, tc.killed, stderr)
			}
		})
	}
}

func TestRunSignals(t *testing.T) {
	t.Parallel()
	t.Run("while CMD runs", func(t *testing.T) {
		t.Parallel()
		f := newFixture(t)
		const name = "signalled"
		// Short sleeps, so the trap is sure to run: see TestRunLockLost.
		p := f.start(t, "run", "--lock", name, "--", "sh", "-c", "trap 'exit 5' TERM; echo started; while :; do sleep 0.1; done")
		p.line(t)
		if !f.heldByPod(f.inspect(t, name)) {
			t.Fatal("lock not held while CMD runs")
		}
		p.signal(t, syscall.SIGTERM)
		code, stderr := p.wait(t)
		wantExit(t, code, stderr, 5, "got SIGTERM; passing it on")
		f.wantFree(t, name)
	})
	t.Run("while waiting", func(t *testing.T) {
		t.Parallel()
		f := newFixture(t)
		const name = "signalled-waiting"
		f.hold(t, name)
		p := f.start(t, "run", "--lock", name, "--", "sh", "-c", "echo ran")
		waitFor(t, "lockwarden to queue for the lock", func() bool {
			return slices.ContainsFunc(f.inspect(t, name).Waiters, func(o redislock.Owner) bool {
				return strings.HasPrefix(string(o), f.podUID+":")
			})
		})
		p.signal(t, syscall.SIGTERM)
		code, stderr := p.wait(t)
		wantExit(t, code, stderr, 128+int(syscall.SIGTERM), "got SIGTERM while waiting for lock")
		if slices.Contains(drain(p), "ran") {
			t.Fatal("CMD ran")
		}
		if info := f.inspect(t, name); len(info.Waiters) > 0 {
			t.Fatalf("lockwarden left a waiter behind: %+v", info)
		}
	})
}

func TestRunEnvironmentErrors(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, unset, set, wantStderr string
	}{
		{"no POD_UID", "POD_UID", "", "POD_UID"},
		{"malformed POD_UID", "POD_UID", "POD_UID=report-29310", "POD_UID"},
		{"no REDIS_URL", "REDIS_URL", "", "REDIS_URL"},
		{"Redis unreachable", "REDIS_URL", "REDIS_URL=redis://127.0.0.1:1", "cannot take lock"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			f := newFixture(t)
			f.env = slices.DeleteFunc(f.env, func(kv string) bool { return strings.HasPrefix(kv, tc.unset+"=") })
			if tc.set != "" {
				f.env = append(f.env, tc.set)
			}
			p := f.start(t, "run", "--lock", "env", "--", "sh", "-c", "echo ran")
			code, stderr := p.wait(t)
			wantExit(t, code, stderr, exitUnavailable, tc.wantStderr)
			if slices.Contains(drain(p), "ran") {
				t.Fatal("CMD ran")
			}
		})
	}
}

func TestUsage(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	for _, tc := range []struct {
		args       []string
		want       int
		wantStdout string
		wantStderr string
	}{
		{[]string{"--help"}, 0, "Exit status:", ""},
		{[]string{"run", "--help"}, 0, "-lock-resource", ""},
		{nil, exitUsage, "", "Usage: lockwarden run"},
		{[]string{"stop"}, exitUsage, "", "Usage: lockwarden run"},
		{[]string{"run", "--", "true"}, exitUsage, "", "--lock"},
		{[]string{"run", "--lock", "a", "--lock-resource", "b", "--", "true"}, exitUsage, "", "--lock"},
		{[]string{"run", "--lock", "a"}, exitUsage, "", "no command"},
		{[]string{"run", "--lock", "a", "--skip", "--wait", "1s", "--", "true"}, exitUsage, "", "not both"},
		{[]string{"run", "--lock", "a", "--wait", "soon", "--", "true"}, exitUsage, "", "-wait"},
		{[]string{"run", "--lock", "a", "--lease", "1500us", "--", "true"}, exitUsage, "", "--lease must be a whole number of milliseconds"},
		{[]string{"run", "--lock", "a", "--lease", "5ms", "--", "true"}, exitUsage, "", "--lease must be a whole number of milliseconds"},
		{[]string{"run", "--lock", "a{b", "--", "true"}, exitUsage, "", redislock.ErrInvalidName.Error()},
	} {
		t.Run(fmt.Sprint(tc.args), func(t *testing.T) {
			p := f.start(t, tc.args...)
			code, stderr := p.wait(t)
			wantExit(t, code, stderr, tc.want, tc.wantStderr)
			if stdout := strings.Join(drain(p), "\n"); !strings.Contains(stdout, tc.wantStdout) {
				t.Fatalf("stdout does not mention %q:\n%s", tc.wantStdout, stdout)
			}
		})
	}
}
