package redisconn_test

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/lockwarden/lockwarden/internal/redisconn"
	"github.com/lockwarden/lockwarden/internal/redistest"
)

// Sentinels that require a password of their own, another than the
// master's: the client authenticates to each with its own credentials.
func TestSentinelWithItsOwnPassword(t *testing.T) {
	const masterPassword, sentinelPassword = "master-pw", "sentinel-pw"
	master := redistest.Start(t, "--requirepass", masterPassword)
	sentinel := startSentinel(t, master.Port, masterPassword, sentinelPassword)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	ping := func(cfg redisconn.Config) error {
		cfg.SentinelAddrs, cfg.SentinelMaster = []string{sentinel}, "lockwarden"
		rdb, err := cfg.Client()
		if err != nil {
			t.Fatal(err)
		}
		defer rdb.Close()
		return rdb.Ping(ctx).Err()
	}
	if err := ping(redisconn.Config{Password: masterPassword, SentinelPassword: sentinelPassword}); err != nil {
		t.Fatalf("with both passwords: %v", err)
	}
	if err := ping(redisconn.Config{Password: masterPassword}); err == nil {
		t.Fatal("the Sentinel let a client without its password ask for the master")
	}
}

// startSentinel runs a Sentinel requiring sentinelPassword that watches the
// master on masterPort as "lockwarden", and returns its address.
func startSentinel(t *testing.T, masterPort int, masterPassword, sentinelPassword string) string {
	t.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		t.Fatal("redis-server is not on PATH: make test installs it (hack/install-redis.sh)")
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	dir := t.TempDir()
	conf := filepath.Join(dir, "sentinel.conf")
	text := fmt.Sprintf("port %d\nbind 127.0.0.1\ndir %s\nrequirepass %s\n"+
		"sentinel monitor lockwarden 127.0.0.1 %d 1\nsentinel auth-pass lockwarden %s\n",
		port, dir, sentinelPassword, masterPort, masterPassword)
	if err := os.WriteFile(conf, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, conf, "--sentinel")
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	addr := "127.0.0.1:" + strconv.Itoa(port)
	sc := redis.NewSentinelClient(&redis.Options{Addr: addr, Password: sentinelPassword})
	defer sc.Close()
	deadline := time.Now().Add(10 * time.Second)
	for {
		_, err := sc.GetMasterAddrByName(context.Background(), "lockwarden").Result()
		if err == nil {
			return addr
		}
		if time.Now().After(deadline) || strings.Contains(err.Error(), "WRONGPASS") {
			t.Fatalf("the Sentinel does not answer: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
