package redistest

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"
)

// SentinelMaster is the master name the Sentinels of StartSentinel watch.
const SentinelMaster = "lockwarden"

// Sentinel is a master, its replicas and the Sentinels watching them.
type Sentinel struct {
	Master    *Server
	Replicas  []*Server
	Sentinels []*Server
}

// StartSentinel starts a master with replicas and the given number of
// Sentinels (quorum: a majority). A master is judged down after 1s. It
// waits until the replicas are in sync and every Sentinel knows the others,
// and stops everything at cleanup.
func StartSentinel(t testing.TB, replicas, sentinels int) *Sentinel {
	t.Helper()
	s := &Sentinel{Master: Start(t)}
	for range replicas {
		s.Replicas = append(s.Replicas, Start(t, "--replicaof", "127.0.0.1", fmt.Sprint(s.Master.Port)))
	}
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		t.Fatal(err)
	}
	for range sentinels {
		sentinel, err := startSentinel(bin, t.TempDir(), s.Master.Port, sentinels/2+1)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(sentinel.Stop)
		s.Sentinels = append(s.Sentinels, sentinel)
	}
	ctx := context.Background()
	err = waitFor(func() bool {
		info, err := s.Master.Client(t).Info(ctx, "replication").Result()
		if err != nil || strings.Count(info, "state=online") != replicas {
			return false
		}
		for _, sentinel := range s.Sentinels {
			sc := redis.NewSentinelClient(&redis.Options{Addr: sentinel.Addr})
			known, err := sc.Sentinels(ctx, SentinelMaster).Result()
			reps, err2 := sc.Replicas(ctx, SentinelMaster).Result()
			_ = sc.Close()
			if err != nil || err2 != nil || len(known) != sentinels-1 || len(reps) != replicas {
				return false
			}
		}
		return true
	})
	if err != nil {
		t.Fatalf("redistest: Sentinel set-up: %v", err)
	}
	return s
}

func startSentinel(bin, dir string, masterPort, quorum int) (*Server, error) {
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	conf := filepath.Join(dir, "sentinel.conf")
	text := fmt.Sprintf("port %d\nbind 127.0.0.1\ndir %s\nlogfile %s\n"+
		"sentinel monitor %s 127.0.0.1 %d %d\n"+
		"sentinel down-after-milliseconds %[4]s 1000\nsentinel failover-timeout %[4]s 5000\n",
		port, dir, filepath.Join(dir, fmt.Sprintf("redis-%d.log", port)), SentinelMaster, masterPort, quorum)
	if err := os.WriteFile(conf, []byte(text), 0o600); err != nil {
		return nil, err
	}
	s := &Server{Addr: fmt.Sprintf("127.0.0.1:%d", port), Port: port, dir: dir, args: []string{conf, "--sentinel"}}
	return s, s.start(bin)
}

// Addrs returns the Sentinels' addresses.
func (s *Sentinel) Addrs() []string {
	var addrs []string
	for _, sentinel := range s.Sentinels {
		addrs = append(addrs, sentinel.Addr)
	}
	return addrs
}

// Client returns a go-redis failover client that follows the master through
// the Sentinels, closed at cleanup.
func (s *Sentinel) Client(t testing.TB) *redis.Client {
	rdb := redis.NewFailoverClient(&redis.FailoverOptions{MasterName: SentinelMaster, SentinelAddrs: s.Addrs()})
	t.Cleanup(func() { _ = rdb.Close() })
	return rdb
}

// MasterAddr asks a Sentinel where the master is now.
func (s *Sentinel) MasterAddr(ctx context.Context) (string, error) {
	for _, sentinel := range s.Sentinels {
		sc := redis.NewSentinelClient(&redis.Options{Addr: sentinel.Addr})
		addr, err := sc.GetMasterAddrByName(ctx, SentinelMaster).Result()
		_ = sc.Close()
		if err == nil {
			return addr[0] + ":" + addr[1], nil
		}
	}
	return "", fmt.Errorf("redistest: no Sentinel knows the master")
}
