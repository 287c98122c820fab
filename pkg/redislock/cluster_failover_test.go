package redislock_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/lockwarden/lockwarden/internal/redistest"
	"github.com/lockwarden/lockwarden/pkg/redislock"
)

// TestClusterMasterFailover holds locks on one master of a 3-master,
// 3-replica Cluster, kills that master, and counts the locks that survive
// the failover and those lost: for each WAIT setting with a healthy replica,
// and with the replica stalled (SIGSTOP) while the locks are taken. A
// stalled replica still receives what fits in its socket buffer, so some of
// those locks survive and some do not. Every loss must reach its holder
// through the lost-lease signal, and every survivor must still be held: no
// holder may go on believing it holds a lock Redis no longer has.
func TestClusterMasterFailover(t *testing.T) {
	const locks = 50
	for _, tc := range []struct {
		waitReplicas int
		stalled      bool
	}{{0, false}, {1, false}, {0, true}} {
		t.Run(fmt.Sprintf("WAIT=%d,stalled=%v", tc.waitReplicas, tc.stalled), func(t *testing.T) {
			waitReplicas := tc.waitReplicas
			cluster := redistest.StartCluster(t, 3, 1)
			rdb := cluster.Client(t)
			ctx := testContext(t)
			// A lease longer than the failover, so only locks the replica
			// never received are lost.
			c := newClient(t, rdb, redislock.Options{WatchdogLease: 10 * time.Second, RenewInterval: 500 * time.Millisecond, WaitReplicas: waitReplicas})
			victim, heir := cluster.Masters[0], cluster.Replicas[0]
			if tc.stalled {
				if err := heir.Pause(); err != nil {
					t.Fatal(err)
				}
				// With WAIT, a Lock the replica cannot acknowledge is refused
				// rather than granted at risk.
				synced := newClient(t, rdb, redislock.Options{WaitReplicas: 1, WaitReplicasTimeout: 200 * time.Millisecond})
				for i := 0; ; i++ {
					name := fmt.Sprintf("%s-synced-%d", lockName(t), i)
					if masterOf(t, rdb, name) == victim.Addr {
						_, err := newMutex(t, synced, name, nil).Lock(ctx)
						wantErr(t, err, redislock.ErrUnavailable)
						break
					}
				}
			}

			var mutexes []*redislock.Mutex
			var leases []*redislock.Hold
			for i := 0; len(mutexes) < locks; i++ {
				name := fmt.Sprintf("%s-%d", lockName(t), i)
				if masterOf(t, rdb, name) != victim.Addr {
					continue
				}
				m := newMutex(t, c, name, nil)
				mutexes = append(mutexes, m)
				leases = append(leases, mustLock(t, ctx, m))
			}

			victim.Stop()
			if tc.stalled {
				if err := heir.Resume(); err != nil {
					t.Fatal(err)
				}
			}
			waitFor(t, func() bool {
				rdb.ReloadState(ctx)
				return masterOf(t, rdb, mutexes[0].Name()) == heir.Addr
			}, "the replica to take over")
			time.Sleep(2 * time.Second) // four renewal intervals on the new master

			survived, lost := 0, 0
			for i, m := range mutexes {
				info := inspect(t, c, m.Name())
				held := len(info.Holders) == 1 && info.Holders[0].Owner == leases[i].Owner()
				switch {
				case held && leases[i].Err() == nil:
					survived++
				case !held && leases[i].Err() != nil:
					lost++
				case !held:
					t.Errorf("%s is gone from Redis but its holder was not told", m.Name())
				default:
					t.Errorf("%s is still held but its holder was told it was lost: %v", m.Name(), leases[i].Err())
				}
			}
			t.Logf("WAIT=%d, replica stalled=%v: %d of %d locks survived the master's failover, %d were lost and their holders told", waitReplicas, tc.stalled, survived, locks, lost)
			for _, l := range leases {
				if l.Err() == nil {
					mustUnlock(t, ctx, l)
				}
			}
		})
	}
}

// masterOf is the address of the master serving name's slot.
func masterOf(t *testing.T, rdb *redis.ClusterClient, name string) string {
	node, err := rdb.MasterForKey(context.Background(), name)
	if err != nil {
		return ""
	}
	return node.Options().Addr
}

// A waiter subscribed on a master that hangs (SIGSTOP), and is failed over
// meanwhile, hears the next hand-over at once: its client finds the quiet
// connection dead (its PING goes unanswered) and subscribes again on the
// slot's new master, and the waiter retries once it listens there. Its
// client learns the new master only 9 s after the hang (lateTopology), as
// one does whose reload first asks the hung node: until then, both a
// subscription and a retry would go to the hung node, and a retry held
// there would keep the waiter from acting on the hand-over's notice.
func TestHandOverAfterAHungMasterFailsOver(t *testing.T) {
	cluster := redistest.StartCluster(t, 3, 1)
	rdb := cluster.Client(t)
	ctx := testContext(t)
	victim, heir := cluster.Masters[0], cluster.Replicas[0]
	name := lockNameOn(t, rdb, victim.Addr, "")
	// A fallback far longer than the test's bound: a waiter that missed the
	// hand-over would take the lock only at its poll.
	opts := redislock.Options{RetryFallback: 20 * time.Second}
	holderRedis := cluster.Client(t)
	holder := newClient(t, holderRedis, opts)
	waiterRedis := cluster.Client(t)
	late := newLateTopology(t, victim.Addr)
	waiterRedis.OnNewNode(func(node *redis.Client) { node.AddHook(late.on(node.Options().Addr)) })
	waiter := newClient(t, waiterRedis, opts)
	h := mustLock(t, ctx, newMutex(t, holder, name, nil))
	waiting := lockAsync(ctx, newMutex(t, waiter, name, nil))
	waitQueued(t, holder, name, 1)
	time.Sleep(200 * time.Millisecond) // subscribed on the victim

	late.staleFor(9 * time.Second)
	if err := victim.Pause(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(victim.Stop) // killed paused: it never serves again
	if err := heir.Client(t).Do(ctx, "cluster", "failover", "takeover").Err(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool {
		rdb.ReloadState(ctx)
		return masterOf(t, rdb, name) == heir.Addr
	}, "the replica to take over")
	// The holder learns the new master (a hung node sends no MOVED); the
	// waiter's client must find it out by itself: it finds the connection
	// dead within two receive timeouts of the hang, and subscribes on the
	// new master once it learns it.
	holderRedis.ReloadState(ctx)
	channel := "redisson_lock__channel:{" + name + "}"
	deadline := time.Now().Add(30 * time.Second)
	for {
		counts, err := heir.Client(t).Do(ctx, "pubsub", "shardnumsub", channel).Slice()
		if err == nil && len(counts) == 2 && counts[1] == int64(1) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the waiter did not subscribe on the new master within 30 s of the failover: it still listens on the hung one")
		}
		time.Sleep(50 * time.Millisecond)
	}
	mustUnlock(t, ctx, h)
	took := tookAfter(t, ctx, time.Now(), waiting)
	if took > time.Second {
		t.Fatalf("the waiter took the lock %v after the hand-over, want at once: it retried on the hung master, or still listened there", took.Round(time.Millisecond))
	}
	t.Logf("hand-over after a hung master's failover: %v", took.Round(time.Millisecond))
}

// A hung master holds up no other shard's hand-over. The waiters' client
// finds its connection to the hung master dead and subscribes that shard's
// lock again; not knowing of any new master yet (lateTopology), it dials
// the hung node again, which takes go-redis's timeouts. A hand-over on
// another shard meanwhile reaches its waiter in the same client at once.
func TestAHungMasterHoldsUpNoOtherShardsHandOver(t *testing.T) {
	cluster := redistest.StartCluster(t, 3, 1)
	rdb := cluster.Client(t)
	ctx := testContext(t)
	victim := cluster.Masters[0]
	hungName := lockNameOn(t, rdb, victim.Addr, "hung")
	otherName := lockNameOn(t, rdb, cluster.Masters[1].Addr, "other")
	opts := redislock.Options{RetryFallback: 20 * time.Second}
	holder := newClient(t, cluster.Client(t), opts)
	waiterRedis := cluster.Client(t)
	late := newLateTopology(t, victim.Addr)
	waiterRedis.OnNewNode(func(node *redis.Client) { node.AddHook(late.on(node.Options().Addr)) })
	waiter := newClient(t, waiterRedis, opts)
	mustLock(t, ctx, newMutex(t, holder, hungName, nil))
	other := mustLock(t, ctx, newMutex(t, holder, otherName, nil))
	waitCtx, stopWaiting := context.WithCancel(ctx)
	defer stopWaiting()
	lockAsync(waitCtx, newMutex(t, waiter, hungName, nil))
	otherWaiting := lockAsync(ctx, newMutex(t, waiter, otherName, nil))
	waitQueued(t, holder, hungName, 1)
	waitQueued(t, holder, otherName, 1)
	time.Sleep(200 * time.Millisecond) // subscribed on both masters

	late.staleFor(20 * time.Second)
	if err := victim.Pause(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(victim.Stop) // killed paused: the holder's Close then fails at once
	select {
	case <-late.hungDialed():
	case <-time.After(10 * time.Second):
		t.Fatal("the waiters' client did not dial the hung node again within 10 s")
	}
	time.Sleep(200 * time.Millisecond) // inside the dial's timeouts
	mustUnlock(t, ctx, other)
	took := tookAfter(t, ctx, time.Now(), otherWaiting)
	if took > time.Second {
		t.Fatalf("the other shard's waiter took its lock %v after the hand-over, want at once: the hung shard's subscription held it up", took.Round(time.Millisecond))
	}
	t.Logf("hand-over on another shard while a hung master is dialed: %v", took.Round(time.Millisecond))
}

// lockNameOn is a lock name of the test whose slot the master at addr
// serves.
func lockNameOn(t *testing.T, rdb *redis.ClusterClient, addr, suffix string) string {
	for i := 0; ; i++ {
		name := fmt.Sprintf("%s-%s%d", lockName(t), suffix, i)
		if masterOf(t, rdb, name) == addr {
			return name
		}
	}
}

// lateTopology delays a cluster client's view of a failover: its CLUSTER
// SLOTS calls wait until a set time, and the hung node's fail at once, so
// the client learns the new master at that time, neither earlier nor later.
type lateTopology struct {
	hung   string
	ended  chan struct{} // closed when the test ends: no call waits longer
	mu     sync.Mutex
	until  time.Time
	dialed chan struct{} // closed at the first dial to the hung node once stale
}

func newLateTopology(t *testing.T, hung string) *lateTopology {
	l := &lateTopology{hung: hung, ended: make(chan struct{}), dialed: make(chan struct{})}
	t.Cleanup(func() { close(l.ended) })
	return l
}

// hungDialed is closed once the client dials the hung node after staleFor.
func (l *lateTopology) hungDialed() <-chan struct{} { return l.dialed }

func (l *lateTopology) staleFor(d time.Duration) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.until = time.Now().Add(d)
}

// on is the hook of the client of the node at addr.
func (l *lateTopology) on(addr string) redis.Hook { return lateTopologyHook{l, addr} }

type lateTopologyHook struct {
	*lateTopology
	addr string
}

func (h lateTopologyHook) DialHook(next redis.DialHook) redis.DialHook {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		if h.addr == h.hung {
			h.mu.Lock()
			if !h.until.IsZero() {
				select {
				case <-h.dialed:
				default:
					close(h.dialed)
				}
			}
			h.mu.Unlock()
		}
		return next(ctx, network, addr)
	}
}

func (h lateTopologyHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if args := cmd.Args(); len(args) == 2 && fmt.Sprint(args[0]) == "cluster" && fmt.Sprint(args[1]) == "slots" {
			h.mu.Lock()
			until := h.until
			h.mu.Unlock()
			select {
			case <-time.After(time.Until(until)):
			case <-h.ended:
			}
			if h.addr == h.hung && !until.IsZero() {
				err := errors.New("lateTopology: the node hangs")
				cmd.SetErr(err)
				return err
			}
		}
		return next(ctx, cmd)
	}
}

func (h lateTopologyHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
