package redislock_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/lockwarden/lockwarden/internal/redistest"
	"github.com/lockwarden/lockwarden/pkg/redislock"
)

// TestClusterSoak takes locks on every shard of a 3-master, 3-replica Redis
// Cluster from 8 clients while replicas are promoted (CLUSTER FAILOVER: the
// promoted node has none of the scripts cached, and the demoted one drops
// its sharded subscriptions) and masters lose their script caches, with
// plain listeners on every lock's release channel, and checks the holders
// with the soak's checker. A manual failover loses no write, and no holder
// is paused, so the checker must count no overlap, no token that fails to
// rise, no stale write accepted, no write by a Hold that outlived its lock
// and no hold lost at all; every client must go on acquiring after the last
// fault; and a second after each fault, waiters must be woken as before: no
// wait may then last as long as the RetryFallback (2 s) that a waiter
// deaf to its notices would sleep.
func TestClusterSoak(t *testing.T) {
	const (
		workers      = 8
		locks        = 12
		acquisitions = 3000
	)
	cl := redistest.StartCluster(t, 3, 1)
	checker := redistest.Start(t).Client(t)
	ctx, cancel := context.WithCancel(testContext(t))
	defer cancel()
	// One process, never restarted or paused: a holder found inside when
	// another enters is an overlap, never a dead or paused holder.
	if err := checker.HSet(ctx, "soak:procs", "inc:0", 1).Err(); err != nil {
		t.Fatal(err)
	}

	// Plain listeners on every lock's release channel, as the controller
	// is on a Redis 7 Cluster.
	for i := range locks {
		listener := cl.Client(t).SSubscribe(ctx, fmt.Sprintf("redisson_lock__channel:{cluster-soak:%d}", i))
		t.Cleanup(func() { _ = listener.Close() })
	}
	const fallback = 2 * time.Second
	var (
		wg    sync.WaitGroup
		total atomic.Int64
		lost  atomic.Int64                    // holds that ended before their Unlock
		after = make([]atomic.Int64, workers) // acquisitions after the last fault
		waits = newWaitLog()
	)
	for i := range workers {
		c := newClient(t, cl.Client(t), redislock.Options{WatchdogLease: 2 * time.Second,
			RetryFallback: fallback, QueueTTL: 5 * time.Second})
		w := &soakWorker{cfg: soakConfig{Process: 0, Incarnation: 1}, checker: checker}
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(uint64(i), 1))
			for n := 0; ctx.Err() == nil; n++ {
				m := newMutex(t, c, fmt.Sprintf("cluster-soak:%d", r.IntN(locks)), nil)
				asked := time.Now()
				hold, err := m.TryLock(ctx, 5*time.Second)
				waits.add(asked, time.Now())
				if err != nil {
					continue // a failover in progress, or the wait bound
				}
				total.Add(1)
				after[i].Add(1)
				w.critical(hold, m.Name(), fmt.Sprintf("%d.%d", i, n), "0", 1+r.IntN(2))
				if hold.Err() != nil {
					lost.Add(1)
				}
				w.unlock(hold)
			}
		}()
	}

	// Faults until enough acquisitions are made: a replica promoted, or a
	// master's scripts flushed, one every second or so.
	r := rand.New(rand.NewPCG(rand.Uint64(), rand.Uint64()))
	failovers, flushes := 0, 0
	for total.Load() < acquisitions {
		time.Sleep(time.Duration(1500+r.IntN(1000)) * time.Millisecond)
		waits.fault(time.Now())
		if r.IntN(2) == 0 {
			if promoteAReplica(t, ctx, cl, r) {
				failovers++
			}
		} else {
			flushAMaster(t, ctx, cl, r)
			flushes++
		}
		waits.fault(time.Now())
		for i := range after {
			after[i].Store(0)
		}
	}
	// Every client goes on acquiring after the last fault.
	deadline := time.Now().Add(30 * time.Second)
	for i := 0; i < workers; {
		if after[i].Load() > 0 {
			i++
			continue
		}
		if time.Now().After(deadline) {
			t.Fatalf("client %d acquired nothing in the 30 s after the last fault", i)
		}
		time.Sleep(10 * time.Millisecond)
	}
	cancel()
	wg.Wait()

	stats, err := checker.HGetAll(context.Background(), "soak:stats").Result()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("cluster soak: %d acquisitions through %d promotions and %d script flushes, %d holds lost; checker: %v",
		total.Load(), failovers, flushes, lost.Load(), stats)
	// A promoted node, or a flushed one, answers renewals with NOSCRIPT
	// until the script is sent again; the watchdog must, for every lock.
	if n := lost.Load(); n != 0 {
		t.Errorf("%d holds were lost, though no write was lost and every node stayed up", n)
	}
	for _, v := range append(soakViolations, "paused holders overlapped", "dead holders replaced") {
		if n, _ := strconv.Atoi(stats[v]); n != 0 {
			t.Errorf("checker counted %d %s", n, v)
		}
	}
	if slow := waits.slowAfterFaults(time.Second, fallback*3/4); len(slow) > 0 {
		t.Errorf("%d waits, starting a second or more after a fault, lasted as long as a waiter deaf to its notices sleeps: %v", len(slow), slow)
	}
}

// waitLog records when waits and faults began and ended.
type waitLog struct {
	mu     sync.Mutex
	waits  [][2]time.Time
	faults []time.Time // start and end of each fault, in turn
}

func newWaitLog() *waitLog { return &waitLog{} }

func (l *waitLog) add(start, end time.Time) {
	l.mu.Lock()
	l.waits = append(l.waits, [2]time.Time{start, end})
	l.mu.Unlock()
}

func (l *waitLog) fault(at time.Time) {
	l.mu.Lock()
	l.faults = append(l.faults, at)
	l.mu.Unlock()
}

// slowAfterFaults returns the waits of at least long that began at least
// settle after the last fault ended and ended before the next began.
func (l *waitLog) slowAfterFaults(settle, long time.Duration) []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var slow []string
	for _, w := range l.waits {
		if w[1].Sub(w[0]) < long {
			continue
		}
		quiet := true
		for i := 0; i+1 < len(l.faults); i += 2 {
			start, end := l.faults[i], l.faults[i+1]
			if w[0].Before(end.Add(settle)) && w[1].After(start) {
				quiet = false
				break
			}
		}
		if quiet {
			slow = append(slow, fmt.Sprintf("%s for %v", w[0].Format("15:04:05.000"), w[1].Sub(w[0]).Round(time.Millisecond)))
		}
	}
	return slow
}

// promoteAReplica runs CLUSTER FAILOVER on a random replica that is in
// sync with its master, and waits until it is a master. It reports whether
// there was one to promote and Redis promoted it.
func promoteAReplica(t *testing.T, ctx context.Context, cl *redistest.Cluster, r *rand.Rand) bool {
	t.Helper()
	var ready []*redis.Client
	for _, node := range nodesWithRole(t, ctx, cl, "slave") {
		// A replica still syncing (a master demoted by the last failover)
		// cannot take over: Redis would let the failover time out.
		info := replication(ctx, node)
		if info["master_link_status"] == "up" && info["master_sync_in_progress"] == "0" {
			ready = append(ready, node)
		}
	}
	if len(ready) == 0 {
		return false
	}
	node := ready[r.IntN(len(ready))]
	if err := node.Do(ctx, "cluster", "failover").Err(); err != nil {
		t.Fatalf("CLUSTER FAILOVER: %v", err)
	}
	for deadline := time.Now().Add(15 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if replication(ctx, node)["role"] == "master" {
			return true
		}
	}
	t.Logf("Redis did not finish a manual failover within 15 s; going on")
	return false
}

// flushAMaster empties a random master's script cache.
func flushAMaster(t *testing.T, ctx context.Context, cl *redistest.Cluster, r *rand.Rand) {
	t.Helper()
	masters := nodesWithRole(t, ctx, cl, "master")
	if err := masters[r.IntN(len(masters))].ScriptFlush(ctx).Err(); err != nil {
		t.Fatal(err)
	}
}

// nodesWithRole returns a client for each node whose role is role.
func nodesWithRole(t *testing.T, ctx context.Context, cl *redistest.Cluster, want string) []*redis.Client {
	t.Helper()
	var nodes []*redis.Client
	for _, addr := range cl.Addrs() {
		node := redis.NewClient(&redis.Options{Addr: addr})
		t.Cleanup(func() { _ = node.Close() })
		if replication(ctx, node)["role"] == want {
			nodes = append(nodes, node)
		}
	}
	return nodes
}

// replication is a node's INFO replication, field by field.
func replication(ctx context.Context, node *redis.Client) map[string]string {
	fields := map[string]string{}
	info, err := node.Info(ctx, "replication").Result()
	if err != nil {
		return fields
	}
	for _, line := range strings.Split(info, "\r\n") {
		if k, v, ok := strings.Cut(line, ":"); ok {
			fields[k] = v
		}
	}
	return fields
}
