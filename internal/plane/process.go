package plane

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"time"
)

// process is one child of the plane, or a step of its shutdown: stop stops
// what envtest started, closer closes a log file envtest writes to.
type process struct {
	name    string
	health  string // URL that answers 200 once it is up
	cmd     *exec.Cmd
	logPath string
	exited  chan struct{}
	started time.Time
	startup time.Duration // from started to the first healthy answer

	stop   func() error
	closer io.Closer
}

// startProcess starts a binary with its output in logPath, in a process
// group of its own (a Ctrl-C at a terminal reaches only its parent, which
// stops it in order) and with a parent-death signal, so it never outlives
// a parent that is killed.
func startProcess(path string, args []string, logPath string) (*process, error) {
	log, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	defer log.Close() // the child has its own descriptor
	cmd := exec.Command(path, args...)
	cmd.Stdout, cmd.Stderr = log, log
	cmd.SysProcAttr = childAttrs()
	started := time.Now()
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", path, err)
	}
	p := &process{cmd: cmd, logPath: logPath, exited: make(chan struct{}), started: started}
	go func() { _ = cmd.Wait(); close(p.exited) }()
	return p, nil
}

// waitHealthy polls the health URL until it answers 200, and records how
// long after its start the process got there.
func (p *process) waitHealthy(ctx context.Context, timeout time.Duration) error {
	// The controller manager and the scheduler serve /healthz over TLS with
	// a self-signed certificate made at start-up; this is a liveness probe
	// of a child on loopback, not a trust decision.
	client := &http.Client{
		Timeout:   time.Second,
		Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}, //nolint:gosec // see above
	}
	defer client.CloseIdleConnections()
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	for {
		if healthy(client, p.health) {
			p.startup = time.Since(p.started)
			return nil
		}
		select {
		case <-p.exited:
			return fmt.Errorf("%s exited at start-up:\n%s", p.name, tail(p.logPath, 30))
		case <-ctx.Done():
			return ctx.Err()
		case <-deadline.C:
			return fmt.Errorf("%s not healthy within %s:\n%s", p.name, timeout, tail(p.logPath, 30))
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// stopAndClose stops the process with SIGTERM, then SIGKILL after 10s.
func (p *process) stopAndClose() {
	if p.stop != nil {
		_ = p.stop()
	}
	if p.closer != nil {
		_ = p.closer.Close()
	}
	if p.cmd == nil {
		return
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.exited:
	case <-time.After(10 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.exited
	}
}

// tail is the last n lines of the file at path.
func tail(path string, n int) string {
	data, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	lines := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
