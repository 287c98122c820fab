package redisconn_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/lockwarden/lockwarden/internal/redisconn"
	"github.com/lockwarden/lockwarden/internal/redistest"
)

func TestClientFromURLWithCredentials(t *testing.T) {
	srv := redistest.Start(t, "--requirepass", "s3cret")
	ctx := context.Background()

	good := redisconn.Config{URL: "redis://" + srv.Addr + "/0", Password: "s3cret"}
	rdb, err := good.Client()
	if err != nil {
		t.Fatal(err)
	}
	defer rdb.Close()
	if err := rdb.Ping(ctx).Err(); err != nil {
		t.Fatalf("ping with the password: %v", err)
	}
	if target := good.Target(); strings.Contains(target, "s3cret") || !strings.Contains(target, srv.Addr) {
		t.Fatalf("Target() = %q", target)
	}

	wrong := redisconn.Config{URL: "redis://:wrong@" + srv.Addr}
	rdb2, err := wrong.Client()
	if err != nil {
		t.Fatal(err)
	}
	defer rdb2.Close()
	if err := rdb2.Ping(ctx).Err(); err == nil || !strings.Contains(err.Error(), "WRONGPASS") {
		t.Fatalf("ping with a wrong password: %v, want WRONGPASS", err)
	}
	if strings.Contains(wrong.Target(), "wrong") {
		t.Fatalf("Target() leaks the password: %q", wrong.Target())
	}
}

func TestConfigErrors(t *testing.T) {
	for _, c := range []redisconn.Config{
		{},
		{URL: "redis://x:1", ClusterAddrs: []string{"y:2"}},
		{SentinelAddrs: []string{"s:26379"}},
		{URL: "http://user:hunter2@host"},
		{URL: "redis://h:1", CAFile: "/nonexistent/ca.pem"},
	} {
		_, err := c.Client()
		if err == nil {
			t.Errorf("Client() accepted %+v", c)
			continue
		}
		if strings.Contains(err.Error(), "hunter2") {
			t.Errorf("error leaks the password: %v", err)
		}
	}
}

func TestSplitList(t *testing.T) {
	got := redisconn.SplitList(" a:1, b:2 ,,")
	if len(got) != 2 || got[0] != "a:1" || got[1] != "b:2" {
		t.Fatalf("SplitList = %q", got)
	}
}

func TestReadPasswordFile(t *testing.T) {
	file := filepath.Join(t.TempDir(), "password")
	if err := os.WriteFile(file, []byte("s3 cret\r\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if got, err := redisconn.ReadPasswordFile(file); err != nil || got != "s3 cret" {
		t.Fatalf("ReadPasswordFile = %q, %v; want \"s3 cret\" (inner space kept, line end dropped)", got, err)
	}
	if _, err := redisconn.ReadPasswordFile(filepath.Join(t.TempDir(), "absent")); err == nil {
		t.Fatal("no error for a missing file")
	}
}
