// Package redistest starts real redis-server processes on loopback for tests:
// a single server, or a Redis Cluster. Each gets a free port and a temporary
// directory, and stops when the test (or the caller) is done.
//
// redis-server must be on PATH; `make test` installs it (hack/install-redis.sh).
package redistest

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// Server is one redis-server process.
type Server struct {
	Addr string
	Port int

	dir  string
	args []string
	cmd  *exec.Cmd
	exit chan struct{}
	// tls is the client TLS configuration of a TLS-only server.
	tls *tls.Config
}

// Start starts a redis-server for the test and stops it at cleanup. extra
// are additional redis-server arguments, such as "--appendonly", "yes".
func Start(t testing.TB, extra ...string) *Server {
	t.Helper()
	s, err := StartServer(t.TempDir(), extra...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Stop)
	return s
}

// StartServer starts a redis-server with its files in dir, for callers
// without a testing.TB, such as TestMain or the demo. Call Stop when done;
// on Linux the server also dies with its parent.
func StartServer(dir string, extra ...string) (*Server, error) {
	return startServer(dir, nil, func(port int) []string {
		return append([]string{"--port", strconv.Itoa(port)}, extra...)
	})
}

// startServer starts redis-server with the common arguments and those
// portArgs gives for the chosen port; clientTLS, if set, is how to reach it.
func startServer(dir string, clientTLS *tls.Config, portArgs func(port int) []string) (*Server, error) {
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		return nil, errors.New("redistest: redis-server is not on PATH; run `make test`, or hack/install-redis.sh, to install it")
	}
	var lastErr error
	for range 5 { // a free port can be taken between probing and binding
		port, err := freePort()
		if err != nil {
			return nil, err
		}
		s := &Server{Addr: "127.0.0.1:" + strconv.Itoa(port), Port: port, dir: dir, tls: clientTLS}
		s.args = append([]string{
			"--bind", "127.0.0.1",
			"--dir", dir, "--save", "", "--appendonly", "no",
			"--enable-debug-command", "yes", "--protected-mode", "no",
			"--logfile", filepath.Join(dir, fmt.Sprintf("redis-%d.log", port)),
		}, portArgs(port)...)
		if lastErr = s.start(bin); lastErr == nil {
			return s, nil
		}
	}
	return nil, lastErr
}

func (s *Server) start(bin string) error {
	s.cmd = exec.Command(bin, s.args...)
	s.cmd.Dir = s.dir
	s.cmd.SysProcAttr = childAttrs()
	if err := s.cmd.Start(); err != nil {
		return fmt.Errorf("redistest: start redis-server: %w", err)
	}
	s.exit = make(chan struct{})
	go func(cmd *exec.Cmd, exit chan struct{}) {
		_ = cmd.Wait()
		close(exit)
	}(s.cmd, s.exit)
	return s.waitReady(10 * time.Second)
}

func (s *Server) waitReady(timeout time.Duration) error {
	rdb := redis.NewClient(&redis.Options{Addr: s.Addr, MaxRetries: -1, TLSConfig: s.tls})
	defer rdb.Close()
	deadline := time.Now().Add(timeout)
	for {
		select {
		case <-s.exit:
			log, _ := os.ReadFile(filepath.Join(s.dir, fmt.Sprintf("redis-%d.log", s.Port)))
			return fmt.Errorf("redistest: redis-server on %s exited:\n%s", s.Addr, log)
		default:
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		err := rdb.Ping(ctx).Err()
		cancel()
		var reply redis.Error
		if err == nil || errors.As(err, &reply) { // any reply, even NOAUTH, means it is up
			return nil
		}
		if time.Now().After(deadline) {
			s.Stop()
			return fmt.Errorf("redistest: redis-server on %s not ready: %w", s.Addr, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Client returns a go-redis client for the server, closed at cleanup.
func (s *Server) Client(t testing.TB) *redis.Client {
	rdb := redis.NewClient(&redis.Options{Addr: s.Addr, TLSConfig: s.tls})
	t.Cleanup(func() { _ = rdb.Close() })
	return rdb
}

// Stop kills the server (SIGKILL, as a crash would) and waits for it to exit.
func (s *Server) Stop() {
	if s.cmd == nil || s.cmd.Process == nil {
		return
	}
	_ = s.cmd.Process.Signal(syscall.SIGCONT) // a paused process cannot die
	_ = s.cmd.Process.Kill()
	<-s.exit
}

// Restart starts the server again on the same port and directory, after
// Stop. What survives depends on the persistence arguments.
func (s *Server) Restart() error {
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		return err
	}
	return s.start(bin)
}

// Pause stops the server process (SIGSTOP): connections stay open, nothing
// is answered. Resume undoes it.
func (s *Server) Pause() error { return s.cmd.Process.Signal(syscall.SIGSTOP) }

// Resume continues a paused server (SIGCONT).
func (s *Server) Resume() error { return s.cmd.Process.Signal(syscall.SIGCONT) }

// freePort returns a loopback port that was free a moment ago, low enough
// that port+10000 (a Cluster node's bus port) is valid, and free as well.
func freePort() (int, error) {
	for range 50 {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return 0, err
		}
		port := l.Addr().(*net.TCPAddr).Port
		_ = l.Close()
		if port+10000 > 65535 {
			continue
		}
		bus, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(port+10000))
		if err != nil {
			continue
		}
		_ = bus.Close()
		return port, nil
	}
	return 0, errors.New("redistest: no free port pair found")
}
