package main

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/debug"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/lockwarden/lockwarden/internal/redistest"
	"github.com/lockwarden/lockwarden/pkg/redislock"
)

// binary is the lockwarden binary TestMain builds, with -race when the
// tests run with it, stamped with testVersion.
var binary string

// testVersion is the version TestMain stamps into the binary, as the
// Makefile stamps VERSION.
const testVersion = "v0.0.0-clitest"

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "lockwarden-test")
	if err != nil {
		panic(err)
	}
	binary = filepath.Join(dir, "lockwarden")
	args := []string{"build", "-o", binary, "-ldflags", "-X main.version=" + testVersion}
	if raceEnabled() {
		args = append(args, "-race")
	}
	if out, err := exec.Command("go", append(args, ".")...).CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "go build: %v\n%s", err, out)
		os.Exit(1)
	}
	code := m.Run()
	stopCluster(code != 0)
	_ = os.RemoveAll(dir)
	os.Exit(code)
}

func raceEnabled() bool {
	info, _ := debug.ReadBuildInfo()
	for _, s := range info.Settings {
		if s.Key == "-race" && s.Value == "true" {
			return true
		}
	}
	return false
}

// hangGuard bounds waits that would otherwise hang a broken test; it is not
// a performance assertion.
const hangGuard = 20 * time.Second

// fixture is a test's Redis server, the pod lockwarden runs as, and a
// client of the test's own for holding and inspecting locks.
type fixture struct {
	srv    *redistest.Server
	podUID string
	client *redislock.Client
	env    []string // lockwarden's environment
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	srv := redistest.Start(t)
	client, err := redislock.New(srv.Client(t), redislock.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = client.Close() })
	f := &fixture{srv: srv, podUID: newUUID(), client: client}
	f.env = []string{
		"PATH=" + os.Getenv("PATH"),
		"REDIS_URL=redis://" + srv.Addr,
		"POD_UID=" + f.podUID,
		"POD_NAME=report-29310",
		"POD_NAMESPACE=batch",
		"GORACE=atexit_sleep_ms=0", // a race-enabled lockwarden would sleep 1s on exit 0
	}
	return f
}

func newUUID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:])
}

// proc is a running lockwarden.
type proc struct {
	cmd    *exec.Cmd
	stdin  io.WriteCloser // CMD's stdin
	stdout <-chan string  // CMD's (or the usage's) output, by line
	exit   <-chan int     // lockwarden's exit status, once it exited
	stderr *bytes.Buffer  // read only after exit
}

// start runs the lockwarden binary with args and f.env.
func (f *fixture) start(t *testing.T, args ...string) *proc {
	t.Helper()
	cmd := exec.Command(binary, args...)
	cmd.Env = f.env
	stderr := &bytes.Buffer{}
	cmd.Stderr = stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill() }) // in case a test failed before it exited
	lines := make(chan string, 100)
	exit := make(chan int, 1)
	go func() {
		scanner := bufio.NewScanner(stdout)
		for scanner.Scan() {
			lines <- scanner.Text()
		}
		close(lines)
		err := cmd.Wait()
		var exitErr *exec.ExitError
		switch {
		case err == nil:
			exit <- 0
		case errors.As(err, &exitErr):
			exit <- exitErr.ExitCode()
		default:
			exit <- -1
		}
	}()
	return &proc{cmd: cmd, stdin: stdin, stdout: lines, exit: exit, stderr: stderr}
}

// run runs lockwarden to completion and returns its exit status and stderr.
func (f *fixture) run(t *testing.T, args ...string) (int, string) {
	t.Helper()
	return f.start(t, args...).wait(t)
}

// line returns the next line of output.
func (p *proc) line(t *testing.T) string {
	t.Helper()
	select {
	case line, ok := <-p.stdout:
		if !ok {
			t.Fatal("output ended")
		}
		return line
	case <-time.After(hangGuard):
		t.Fatalf("no output within %v", hangGuard)
		return ""
	}
}

// wait returns lockwarden's exit status and stderr.
func (p *proc) wait(t *testing.T) (int, string) {
	t.Helper()
	select {
	case code := <-p.exit:
		return code, p.stderr.String()
	case <-time.After(hangGuard):
		t.Fatalf("lockwarden did not exit within %v", hangGuard)
		return 0, ""
	}
}

func (p *proc) signal(t *testing.T, sig syscall.Signal) {
	t.Helper()
	if err := p.cmd.Process.Signal(sig); err != nil {
		t.Fatal(err)
	}
}

// hold takes the lock with the fixture's client, as another pod would,
// until the test ends or it unlocks the returned Hold.
func (f *fixture) hold(t *testing.T, name string) *redislock.Hold {
	t.Helper()
	m, err := f.client.NewMutex(name, nil)
	if err != nil {
		t.Fatal(err)
	}
	hold, err := m.Lock(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = hold.Unlock(context.Background()) })
	return hold
}

func (f *fixture) inspect(t *testing.T, name string) redislock.LockInfo {
	t.Helper()
	info, err := f.client.Inspect(context.Background(), name)
	if err != nil {
		t.Fatal(err)
	}
	return info
}

// heldByPod reports whether lockwarden's pod holds the lock.
func (f *fixture) heldByPod(info redislock.LockInfo) bool {
	return len(info.Holders) == 1 && strings.HasPrefix(string(info.Holders[0].Owner), f.podUID+":")
}

func (f *fixture) wantFree(t *testing.T, name string) {
	t.Helper()
	if info := f.inspect(t, name); info.Held() || len(info.Waiters) > 0 {
		t.Fatalf("lock %s not left free: %+v", name, info)
	}
}

func wantExit(t *testing.T, code int, stderr string, want int, wantStderr ...string) {
	t.Helper()
	if code != want {
		t.Fatalf("exit status %d, want %d; stderr:\n%s", code, want, stderr)
	}
	for _, s := range wantStderr {
		if !strings.Contains(stderr, s) {
			t.Fatalf("stderr does not mention %q:\n%s", s, stderr)
		}
	}
}

// drain returns the rest of the output, after lockwarden exited.
func drain(p *proc) []string {
	var lines []string
	for line := range p.stdout {
		lines = append(lines, line)
	}
	return lines
}

func waitFor(t *testing.T, what string, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(hangGuard)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
