package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"
)

// redisServer is the one redis-server process the benchmark runs against.
type redisServer struct {
	Addr    string
	Version string

	dir  string
	stop chan struct{} // closed by Stop: the owner goroutine kills the server
	exit chan struct{} // closed when the process has exited and been reaped
}

// startRedis starts redis-server on a free loopback port, with persistence
// off, and waits until it answers PING.
//
// The process is started and waited for by one goroutine locked to its OS
// thread, so PR_SET_PDEATHSIG (which Linux ties to the thread that forked the
// child) kills the server if this program dies without running Stop.
func startRedis(ctx context.Context, bin string) (*redisServer, error) {
	if bin == "" {
		bin = "redis-server"
	}
	path, err := exec.LookPath(bin)
	if err != nil {
		return nil, fmt.Errorf("redis-server not found (%v); install Redis 7 or pass -redis-server", err)
	}
	dir, err := os.MkdirTemp("", "lockbench-redis-")
	if err != nil {
		return nil, err
	}
	var lastErr error
	for range 5 { // a free port can be taken between probing and binding
		port, err := freePort()
		if err != nil {
			_ = os.RemoveAll(dir)
			return nil, err
		}
		s := &redisServer{Addr: "127.0.0.1:" + strconv.Itoa(port), dir: dir}
		if lastErr = s.start(ctx, path, port); lastErr == nil {
			return s, nil
		}
		if ctx.Err() != nil {
			break
		}
	}
	_ = os.RemoveAll(dir)
	return nil, lastErr
}

func (s *redisServer) logPath() string { return filepath.Join(s.dir, "redis.log") }

func (s *redisServer) start(ctx context.Context, path string, port int) error {
	args := []string{
		"--port", strconv.Itoa(port), "--bind", "127.0.0.1",
		"--save", "", "--appendonly", "no",
		"--dir", s.dir, "--logfile", s.logPath(),
	}
	s.stop = make(chan struct{})
	s.exit = make(chan struct{})
	started := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: keeps the parent thread alive for PDEATHSIG
		defer close(s.exit)
		cmd := exec.Command(path, args...)
		cmd.Dir = s.dir
		cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		if err := cmd.Start(); err != nil {
			started <- fmt.Errorf("start redis-server: %w", err)
			return
		}
		started <- nil
		waited := make(chan struct{})
		go func() { _ = cmd.Wait(); close(waited) }()
		select {
		case <-s.stop:
			_ = cmd.Process.Kill()
			<-waited
		case <-waited:
		}
	}()
	if err := <-started; err != nil {
		return err
	}

	rdb := redis.NewClient(&redis.Options{Addr: s.Addr, MaxRetries: -1})
	defer rdb.Close()
	deadline := time.Now().Add(10 * time.Second)
	for {
		select {
		case <-s.exit:
			log, _ := os.ReadFile(s.logPath())
			return fmt.Errorf("redis-server on %s exited:\n%s", s.Addr, log)
		default:
		}
		pctx, cancel := context.WithTimeout(ctx, time.Second)
		err := rdb.Ping(pctx).Err()
		cancel()
		if err == nil {
			info, err := rdb.Info(ctx, "server").Result()
			if err == nil {
				s.Version = infoField(info, "redis_version")
			}
			return nil
		}
		if ctx.Err() != nil || time.Now().After(deadline) {
			s.kill()
			return fmt.Errorf("redis-server on %s not ready: %w", s.Addr, errors.Join(ctx.Err(), err))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (s *redisServer) kill() {
	select {
	case <-s.stop:
	default:
		close(s.stop)
	}
	<-s.exit
}

// Stop kills the server, waits for it to exit and removes its directory.
func (s *redisServer) Stop() {
	s.kill()
	_ = os.RemoveAll(s.dir)
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}
