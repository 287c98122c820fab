package redistest

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// Cluster is a Redis Cluster of real redis-server processes on loopback.
type Cluster struct {
	Masters  []*Server
	Replicas []*Server // Replicas[i] replicates Masters[i % len(Masters)]
}

// StartCluster starts a Cluster with the given number of masters, each with
// replicasPerMaster replicas, with the 16384 slots split evenly, and waits
// until every node reports the cluster ok. It stops the nodes at cleanup.
func StartCluster(t testing.TB, masters, replicasPerMaster int) *Cluster {
	t.Helper()
	c := &Cluster{}
	t.Cleanup(c.Stop)
	start := func() *Server {
		s, err := StartServer(t.TempDir(), "--cluster-enabled", "yes",
			"--cluster-config-file", "nodes.conf", "--cluster-node-timeout", "2000")
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	for range masters {
		c.Masters = append(c.Masters, start())
	}
	for range masters * replicasPerMaster {
		c.Replicas = append(c.Replicas, start())
	}
	if err := c.form(context.Background()); err != nil {
		t.Fatal(err)
	}
	return c
}

// Addrs returns the address of every node.
func (c *Cluster) Addrs() []string {
	var addrs []string
	for _, s := range c.nodes() {
		addrs = append(addrs, s.Addr)
	}
	return addrs
}

// Client returns a go-redis Cluster client, closed at cleanup.
func (c *Cluster) Client(t testing.TB) *redis.ClusterClient {
	rdb := redis.NewClusterClient(&redis.ClusterOptions{Addrs: c.Addrs()})
	t.Cleanup(func() { _ = rdb.Close() })
	return rdb
}

// Stop kills every node.
func (c *Cluster) Stop() {
	for _, s := range c.nodes() {
		s.Stop()
	}
}

func (c *Cluster) nodes() []*Server {
	return append(append([]*Server{}, c.Masters...), c.Replicas...)
}

// form assigns slots, joins the nodes and attaches the replicas.
func (c *Cluster) form(ctx context.Context) error {
	nodes := c.nodes()
	clients := make([]*redis.Client, len(nodes))
	for i, s := range nodes {
		clients[i] = redis.NewClient(&redis.Options{Addr: s.Addr})
		defer clients[i].Close()
	}
	const slots = 16384
	for i := range c.Masters {
		first, last := i*slots/len(c.Masters), (i+1)*slots/len(c.Masters)-1
		if err := clients[i].Do(ctx, "cluster", "addslotsrange", first, last).Err(); err != nil {
			return fmt.Errorf("redistest: assign slots: %w", err)
		}
	}
	for i := 1; i < len(nodes); i++ {
		if err := clients[i].ClusterMeet(ctx, "127.0.0.1", fmt.Sprint(nodes[0].Port)).Err(); err != nil {
			return fmt.Errorf("redistest: cluster meet: %w", err)
		}
	}
	if err := waitFor(func() bool {
		for _, rdb := range clients {
			out, err := rdb.ClusterNodes(ctx).Result()
			if err != nil || strings.Count(strings.TrimSpace(out), "\n")+1 != len(nodes) || strings.Contains(out, "handshake") {
				return false
			}
		}
		return true
	}); err != nil {
		return fmt.Errorf("redistest: nodes did not meet: %w", err)
	}
	for j := range c.Replicas {
		master := clients[j%len(c.Masters)]
		id, err := master.ClusterMyID(ctx).Result()
		if err != nil {
			return err
		}
		if err := clients[len(c.Masters)+j].ClusterReplicate(ctx, id).Err(); err != nil {
			return fmt.Errorf("redistest: replicate: %w", err)
		}
	}
	return waitFor(func() bool {
		for _, rdb := range clients {
			info, err := rdb.ClusterInfo(ctx).Result()
			if err != nil || !strings.Contains(info, "cluster_state:ok") || !strings.Contains(info, fmt.Sprintf("cluster_known_nodes:%d", len(nodes))) {
				return false
			}
		}
		// Replicas count only once in sync: before that, WAIT cannot be
		// acknowledged and a failover cannot promote them.
		for _, rdb := range clients[len(c.Masters):] {
			info, err := rdb.Info(ctx, "replication").Result()
			if err != nil || !strings.Contains(info, "master_link_status:up") {
				return false
			}
		}
		return true
	})
}

func waitFor(ok func() bool) error {
	deadline := time.Now().Add(30 * time.Second)
	for !ok() {
		if time.Now().After(deadline) {
			return fmt.Errorf("timed out after 30s")
		}
		time.Sleep(50 * time.Millisecond)
	}
	return nil
}
