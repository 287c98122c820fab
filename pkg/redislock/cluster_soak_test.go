package redislock_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"runtime"
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
// waiter may then get a lock as long after its last holder's Unlock
// returned as the RetryFallback (2 s) that a waiter deaf to its notices
// would sleep. The gap runs from that Unlock, not from the waiter's start,
// so a holder slow to let go (an Unlock retried, the machine stalled) is
// not taken for a deaf waiter.
func TestClusterSoak(t *testing.T) {
	const (
		workers      = 8
		locks        = 6
		acquisitions = 3000
	)
	cl := redistest.StartCluster(t, 3, 1)
	checker := redistest.Start(t).Client(t)
	// Its own bound: the faults go on until enough acquisitions and
	// promotions are made, which on a loaded machine takes longer than
	// testContext's 30 s.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
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
		wakes = newWakeLog()
		// What each worker is doing, and since when, to tell why one
		// acquires nothing.
		doing = make([]atomic.Value, workers)
		soaks = make([]*soakWorker, workers)
	)
	for i := range workers {
		c := newClient(t, cl.Client(t), redislock.Options{WatchdogLease: 2 * time.Second,
			RetryFallback: fallback, QueueTTL: 5 * time.Second})
		w := &soakWorker{cfg: soakConfig{Process: 0, Incarnation: 1}, checker: checker}
		soaks[i] = w
		do := func(what, lock string) {
			doing[i].Store(fmt.Sprintf("%s %s since %s", what, lock, time.Now().Format("15:04:05.000")))
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(uint64(i), 1))
			for n := 0; ctx.Err() == nil; n++ {
				m := newMutex(t, c, fmt.Sprintf("cluster-soak:%d", r.IntN(locks)), nil)
				asked := time.Now()
				do("locking", m.Name())
				hold, err := m.TryLock(ctx, 5*time.Second)
				if err != nil {
					w.noteError("lock", err) // a failover in progress, or the wait bound
					continue
				}
				holder := wakes.acquired(m.Name(), asked, time.Now())
				total.Add(1)
				after[i].Add(1)
				do("holding", m.Name())
				w.critical(hold, m.Name(), fmt.Sprintf("%d.%d", i, n), "0", 1+r.IntN(2))
				if hold.Err() != nil {
					lost.Add(1)
				}
				do("unlocking", m.Name())
				if w.unlock(hold) {
					wakes.released(m.Name(), holder, time.Now())
				}
			}
		}()
	}

	// Faults until enough acquisitions are made through a few promotions
	// (each can leave waiters deaf): a replica promoted, or a master's
	// scripts flushed, one every second or so.
	r := rand.New(rand.NewPCG(rand.Uint64(), rand.Uint64()))
	failovers, flushes := 0, 0
	var lastFault time.Time
	for (total.Load() < acquisitions || failovers < 3) && ctx.Err() == nil {
		time.Sleep(time.Duration(1500+r.IntN(1000)) * time.Millisecond)
		wakes.fault(time.Now())
		if r.IntN(2) == 0 {
			if promoteAReplica(t, ctx, cl, r) {
				failovers++
			}
		} else if flushAMaster(t, ctx, cl, r) {
			flushes++
		}
		lastFault = time.Now()
		wakes.fault(lastFault)
		for i := range after {
			after[i].Store(0)
		}
	}
	if ctx.Err() != nil {
		t.Fatalf("the soak ran out of time after %d acquisitions and %d promotions", total.Load(), failovers)
	}
	// Every client goes on acquiring after the last fault.
	deadline := time.Now().Add(30 * time.Second)
	for i := 0; i < workers; {
		if after[i].Load() > 0 {
			i++
			continue
		}
		if time.Now().After(deadline) {
			w := soaks[i]
			w.mu.Lock()
			errs := fmt.Sprint(w.errors)
			w.mu.Unlock()
			t.Fatalf("client %d acquired nothing in the 30 s after the last fault: it is %v; its errors: %s; the goroutines in TryLock:\n%s",
				i, doing[i].Load(), errs, stacksWith("TryLock"))
		}
		time.Sleep(10 * time.Millisecond)
	}
	// And on, with no fault, for several of a deaf waiter's sleeps: the
	// faults come too close together for one to show between them.
	time.Sleep(time.Until(lastFault.Add(time.Second + 5*fallback)))
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
	if late := wakes.lateAfterFaults(time.Second, fallback*3/4); len(late) > 0 {
		t.Errorf("%d waiters, a second or more after a fault, got a lock as long after its Unlock as a waiter deaf to its notices sleeps: %v", len(late), late)
	}
}

// stacksWith returns the stacks of the goroutines that mention what.
func stacksWith(what string) string {
	buf := make([]byte, 1<<22)
	buf = buf[:runtime.Stack(buf, true)]
	var out []string
	for _, g := range strings.Split(string(buf), "\n\n") {
		if strings.Contains(g, what) {
			out = append(out, g)
		}
	}
	return strings.Join(out, "\n\n")
}

// wakeLog records, for each lock, when each holder got it and when its
// Unlock returned, and when faults began and ended.
type wakeLog struct {
	mu     sync.Mutex
	next   int64                // the last holder's number
	locks  map[string]*lockLife // by lock name
	wakes  []wake
	faults []time.Time // start and end of each fault, in turn
}

// lockLife is a lock's last holder, and when its Unlock returned (zero
// while it holds the lock, or if its Unlock failed).
type lockLife struct {
	holder   int64
	released time.Time
}

// wake is a waiter getting a lock: from is when both the waiter was asking
// and the holder before it had let go, at when it got the lock.
type wake struct {
	lock     string
	from, at time.Time
}

func newWakeLog() *wakeLog { return &wakeLog{locks: map[string]*lockLife{}} }

// acquired records that a waiter which asked at asked got lock at at, and
// returns its holder number for released.
func (l *wakeLog) acquired(lock string, asked, at time.Time) int64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	life := l.locks[lock]
	if life == nil {
		life = &lockLife{}
		l.locks[lock] = life
	}
	// Only a release seen end to end dates the wait's end: none before the
	// lock's first holder, none from a failed Unlock, and none while the
	// last holder's Unlock is still returning.
	if !life.released.IsZero() {
		from := life.released
		if asked.After(from) {
			from = asked
		}
		l.wakes = append(l.wakes, wake{lock: lock, from: from, at: at})
	}
	l.next++
	life.holder, life.released = l.next, time.Time{}
	return l.next
}

// released records that holder's Unlock of lock returned at at.
func (l *wakeLog) released(lock string, holder int64, at time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if life := l.locks[lock]; life.holder == holder {
		life.released = at
	}
}

func (l *wakeLog) fault(at time.Time) {
	l.mu.Lock()
	l.faults = append(l.faults, at)
	l.mu.Unlock()
}

// lateAfterFaults returns the wakes that came at least long late, and whose
// wait for a free lock began at least settle after the last fault ended and
// ended before the next began.
func (l *wakeLog) lateAfterFaults(settle, long time.Duration) []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var late []string
	for _, w := range l.wakes {
		if w.at.Sub(w.from) < long {
			continue
		}
		quiet := true
		for i := 0; i+1 < len(l.faults); i += 2 {
			start, end := l.faults[i], l.faults[i+1]
			if w.from.Before(end.Add(settle)) && w.at.After(start) {
				quiet = false
				break
			}
		}
		if quiet {
			late = append(late, fmt.Sprintf("%s free from %s, taken %v later", w.lock, w.from.Format("15:04:05.000"), w.at.Sub(w.from).Round(time.Millisecond)))
		}
	}
	return late
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

// flushAMaster empties a random master's script cache. It reports whether
// it found a master: on a loaded machine no node may answer INFO in time.
func flushAMaster(t *testing.T, ctx context.Context, cl *redistest.Cluster, r *rand.Rand) bool {
	t.Helper()
	masters := nodesWithRole(t, ctx, cl, "master")
	if len(masters) == 0 {
		t.Logf("no master answered INFO; no flush this time")
		return false
	}
	if err := masters[r.IntN(len(masters))].ScriptFlush(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	return true
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
