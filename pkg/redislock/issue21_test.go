package redislock_test

import (
	"context"
	"errors"
	"fmt"
	"go/doc"
	"go/parser"
	"go/token"
	"io/fs"
	"math"
	"net"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/lockwarden/lockwarden/internal/redistest"
	"github.com/lockwarden/lockwarden/pkg/redislock"
)

// Issue 21: the cases a hostile network, a Cluster operator and a Go user
// found, one test each. Every one of them failed before its fix.

// scriptHook is a go-redis hook that hands each script call of the package
// to fn, with the script's kind and owner (see redislock.ScriptCall) and a
// run function that sends it; fn may delay the call, fail it without
// sending it, or lose its reply after Redis ran it. Other commands pass.
type scriptHook struct {
	fn func(kind, owner string, args []any, run func() error) error
}

func (h *scriptHook) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *scriptHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		kind, owner := redislock.ScriptCall(cmd.Args())
		if kind == "" {
			return next(ctx, cmd)
		}
		err := h.fn(kind, owner, cmd.Args(), func() error { return next(ctx, cmd) })
		if err != nil && cmd.Err() == nil {
			cmd.SetErr(err)
		}
		return err
	}
}

func (h *scriptHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// lostReply is the error a connection reset gives after Redis ran a
// command: its outcome is unknown to the caller.
var lostReply = &net.OpError{Op: "read", Net: "tcp", Err: syscall.ECONNRESET}

// Case 1: an Unlock that is slow (here 4 s, longer than the 3 s watchdog
// lease) must not hold up the renewal of the client's other locks. It held
// the renewal loop's lock across the release, so an untouched lock was
// declared lost and taken by another owner.
func TestCase1SlowUnlockKeepsTheClientsOtherLocks(t *testing.T) {
	srv := redistest.Start(t)
	ctx := testContext(t)
	rdb := srv.Client(t)
	var slowOwner atomic.Value
	slowOwner.Store("")
	rdb.AddHook(&scriptHook{fn: func(kind, owner string, _ []any, run func() error) error {
		if kind == "release" && owner == slowOwner.Load().(string) {
			time.Sleep(4 * time.Second)
		}
		return run()
	}})
	c := newClient(t, rdb, redislock.Options{WatchdogLease: 3 * time.Second})
	rival := newMutex(t, newClient(t, srv.Client(t), redislock.Options{}), lockName(t)+":kept", nil)
	slow := mustLock(t, ctx, newMutex(t, c, lockName(t)+":slow", nil))
	kept := mustLock(t, ctx, newMutex(t, c, lockName(t)+":kept", nil))

	slowOwner.Store(string(slow.Owner()))
	start := time.Now()
	unlocked := make(chan error, 1)
	go func() { unlocked <- slow.Unlock(ctx) }()
	for time.Since(start) < 5*time.Second {
		if err := kept.Err(); err != nil {
			t.Fatalf("the untouched lock was declared lost %v into a slow Unlock of another: %v", time.Since(start).Round(time.Millisecond), err)
		}
		if h, err := rival.TryLock(ctx, 0); err == nil {
			t.Fatalf("another owner took the untouched lock %v into a slow Unlock of another (token %d)", time.Since(start).Round(time.Millisecond), h.Token())
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err := <-unlocked; err != nil {
		t.Fatalf("the slow Unlock: %v", err)
	}
	mustUnlock(t, ctx, kept)
}

// Case 2: one owner held through two Clients under different lease terms
// (MutexOptions.Owner). The second Client's short fixed lease cut the first
// one's watchdog lease in Redis, and another owner took the lock while the
// first Hold still counted as held. Unequal terms are now refused.
func TestCase2OneOwnerUnderOtherTermsCannotCutItsLease(t *testing.T) {
	srv := redistest.Start(t)
	ctx := testContext(t)
	name := lockName(t)
	owner := redislock.Owner("shared-owner:1")
	a := newClient(t, srv.Client(t), redislock.Options{WatchdogLease: 3 * time.Second})
	b := newClient(t, srv.Client(t), redislock.Options{})
	rival := newMutex(t, newClient(t, srv.Client(t), redislock.Options{}), name, nil)

	first := mustLock(t, ctx, newMutex(t, a, name, &redislock.MutexOptions{Owner: owner}))
	second, err := newMutex(t, b, name, &redislock.MutexOptions{Owner: owner, Lease: 100 * time.Millisecond}).TryLock(ctx, 0)
	if err == nil {
		defer func() { _ = second.Unlock(ctx) }()
	}
	if !errors.Is(err, redislock.ErrLeaseMismatch) {
		t.Errorf("a re-entry of the owner under other lease terms: %v, want ErrLeaseMismatch", err)
	}
	// Nor may another Client's watchdog lease of another length.
	if h, err := newMutex(t, newClient(t, srv.Client(t), redislock.Options{WatchdogLease: time.Second}), name,
		&redislock.MutexOptions{Owner: owner}).TryLock(ctx, 0); !errors.Is(err, redislock.ErrLeaseMismatch) {
		if err == nil {
			_ = h.Unlock(ctx)
		}
		t.Errorf("a re-entry of the owner under another watchdog lease: %v, want ErrLeaseMismatch", err)
	}
	for start := time.Now(); time.Since(start) < 2*time.Second; time.Sleep(20 * time.Millisecond) {
		h, err := rival.TryLock(ctx, 0)
		if err == nil {
			t.Fatalf("another owner took the lock %v after the shared owner's re-entry, while its first Hold counted as held (Err %v)",
				time.Since(start).Round(time.Millisecond), first.Err())
		}
		_ = h
	}
	if err := first.Err(); err != nil {
		t.Fatalf("the first Hold ended: %v", err)
	}
	mustUnlock(t, ctx, first)
}

// Case 3: after a failover in a Redis 7 Cluster, the node that lost the
// lock's slot drops its sharded subscriptions, and nothing subscribed again:
// every hand-over then waited for RetryFallback. Now hand-overs take as
// long as before within a second of the failover.
func TestCase3ShardedSubscriptionsComeBackAfterAFailover(t *testing.T) {
	cl := redistest.StartCluster(t, 3, 1)
	ctx := testContext(t)
	// A hand-over the release message missed waits for RetryFallback (less
	// up to a fifth, and less the wait before the release): 7.7 s or more.
	opts := redislock.Options{RetryFallback: 10 * time.Second, QueueTTL: 20 * time.Second}
	holderClient := newClient(t, cl.Client(t), opts)
	waiterClient := newClient(t, cl.Client(t), opts)
	name := lockName(t)
	holder, waiter := newMutex(t, holderClient, name, nil), newMutex(t, waiterClient, name, nil)

	// handOver times one hand-over: from the holder's Unlock to the
	// waiter's Lock returning.
	handOver := func() time.Duration {
		t.Helper()
		h := mustLock(t, ctx, holder)
		got := lockAsync(ctx, waiter)
		waitFor(t, func() bool { return len(inspect(t, holderClient, name).Waiters) == 1 }, "the waiter to queue")
		time.Sleep(300 * time.Millisecond) // its subscription and second attempt
		start := time.Now()
		mustUnlock(t, ctx, h)
		return tookAfter(t, ctx, start, got)
	}
	// Half of RetryFallback leaves a loaded machine room while telling a
	// wake from a fallback.
	bound := opts.RetryFallback / 2
	if d := handOver(); d > bound {
		t.Fatalf("a hand-over before the failover took %v", d)
	}

	rdb := cl.Client(t)
	master := masterOf(t, rdb, name)
	promoted := false
	for _, node := range nodesWithRole(t, ctx, cl, "slave") {
		info := replication(ctx, node)
		if "127.0.0.1:"+info["master_port"] != master || info["master_link_status"] != "up" {
			continue
		}
		if err := node.Do(ctx, "cluster", "failover").Err(); err != nil {
			t.Fatal(err)
		}
		waitFor(t, func() bool { return replication(ctx, node)["role"] == "master" }, "the replica to take over")
		promoted = true
		break
	}
	if !promoted {
		t.Fatalf("no replica of %s to promote", master)
	}
	time.Sleep(time.Second)
	for i := range 3 {
		if d := handOver(); d > bound {
			t.Fatalf("hand-over %d after the failover took %v (RetryFallback is %v)", i+1, d, opts.RetryFallback)
		}
	}
}

// Case 4: "X" and "{X}" are different lock hashes whose other keys
// (counter, queue, channels) are the same, so the two locks corrupted each
// other. A name that would alias another's keys is refused.
func TestCase4NamesThatWouldAliasAreRefused(t *testing.T) {
	b, _ := standalone(t)
	c := newClient(t, b.newRedis(t), redislock.Options{})
	ctx := testContext(t)
	for _, name := range []string{"{orders}", "{a:b}"} {
		if _, err := c.NewMutex(name, nil); !errors.Is(err, redislock.ErrInvalidName) {
			t.Errorf("NewMutex(%q) = %v, want ErrInvalidName: its keys are those of %q", name, err, strings.Trim(name, "{}"))
		}
		if _, err := c.Inspect(ctx, name); !errors.Is(err, redislock.ErrInvalidName) {
			t.Errorf("Inspect(%q) = %v, want ErrInvalidName", name, err)
		}
		if _, err := c.ForceReleaseClient(ctx, name, "x"); !errors.Is(err, redislock.ErrInvalidName) {
			t.Errorf("ForceReleaseClient(%q) = %v, want ErrInvalidName", name, err)
		}
	}
	for _, name := range []string{"orders", "{tenant}:orders", "a:{b}", "{t}x"} {
		if _, err := c.NewMutex(name, nil); err != nil {
			t.Errorf("NewMutex(%q) = %v, want it accepted", name, err)
		}
	}
}

// Case 5: a waiter took a hand-over with an attempt whose reply was lost
// for longer than QueueTTL. The client gave up resending, tried again with
// a new request, and that one counted a second level: the lock stayed held
// for a lease after the waiter's only Unlock.
func TestCase5AHandOverTakenThroughLostRepliesCountsOnce(t *testing.T) {
	srv := redistest.Start(t)
	ctx := testContext(t)
	name := lockName(t)
	waiterRedis := srv.Client(t)
	var losing atomic.Bool
	waiterRedis.AddHook(&scriptHook{fn: func(kind, _ string, _ []any, run func() error) error {
		err := run()
		if kind == "acquire" && losing.Load() && err == nil {
			return lostReply
		}
		return err
	}})
	waiterClient := newClient(t, waiterRedis, redislock.Options{RetryFallback: time.Second, QueueTTL: 2 * time.Second})
	holderClient := newClient(t, srv.Client(t), redislock.Options{})
	held := mustLock(t, ctx, newMutex(t, holderClient, name, nil))
	got := lockAsync(ctx, newMutex(t, waiterClient, name, nil))
	waitFor(t, func() bool { return len(inspect(t, holderClient, name).Waiters) == 1 }, "the waiter to queue")
	time.Sleep(300 * time.Millisecond)

	// The waiter misses the hand-over's notice (its pub/sub connection is
	// killed), so it takes the lock with an attempt; that attempt's
	// replies are lost for 2.5 s, longer than its QueueTTL.
	losing.Store(true)
	if err := srv.Client(t).Do(ctx, "client", "kill", "type", "pubsub").Err(); err != nil {
		t.Fatal(err)
	}
	mustUnlock(t, ctx, held)
	time.Sleep(2500 * time.Millisecond)
	losing.Store(false)

	r := <-got
	if r.err != nil {
		t.Fatalf("the waiter's Lock: %v", r.err)
	}
	if n := count(t, srv.Client(t), name, r.h.Owner()); n != 1 {
		t.Errorf("the waiter holds %d levels in Redis after one Lock, want 1", n)
	}
	mustUnlock(t, ctx, r.h)
	if info := inspect(t, holderClient, name); info.Held() {
		t.Fatalf("the lock is still held after the waiter's only Unlock: %+v", info)
	}
}

// Case 6: a client with a short QueueTTL set the wait queue's expiry to
// twice its own TTL, so the places of other clients' waiters, who refresh
// less often, expired with it: a later waiter got the lock first.
func TestCase6AShortQueueTTLKeepsOtherClientsPlaces(t *testing.T) {
	srv := redistest.Start(t)
	ctx := testContext(t)
	name := lockName(t)
	long := redislock.Options{RetryFallback: 5 * time.Second, QueueTTL: 10 * time.Second}
	holderClient := newClient(t, srv.Client(t), redislock.Options{})
	firstClient := newClient(t, srv.Client(t), long)
	lateClient := newClient(t, srv.Client(t), long)
	shortClient := newClient(t, srv.Client(t), redislock.Options{RetryFallback: 200 * time.Millisecond, QueueTTL: 300 * time.Millisecond})
	held := mustLock(t, ctx, newMutex(t, holderClient, name, nil))

	first := lockAsync(ctx, newMutex(t, firstClient, name, nil))
	waitFor(t, func() bool { return len(inspect(t, holderClient, name).Waiters) == 1 }, "the first waiter to queue")
	shortCtx, cancelShort := context.WithCancel(ctx)
	short := lockAsync(shortCtx, newMutex(t, shortClient, name, nil))
	waitFor(t, func() bool { return len(inspect(t, holderClient, name).Waiters) == 2 }, "the short-TTL waiter to queue")
	time.Sleep(300 * time.Millisecond)
	cancelShort()
	<-short
	time.Sleep(time.Second) // more than twice the short QueueTTL

	late := lockAsync(ctx, newMutex(t, lateClient, name, nil))
	waitFor(t, func() bool { return len(inspect(t, holderClient, name).Waiters) >= 1 }, "the late waiter to queue")
	time.Sleep(300 * time.Millisecond)
	if w := inspect(t, holderClient, name).Waiters; len(w) != 2 {
		t.Errorf("waiters %v, want the first and the late one", w)
	}
	mustUnlock(t, ctx, held)
	select {
	case r := <-first:
		if r.err != nil {
			t.Fatal(r.err)
		}
		mustUnlock(t, ctx, r.h)
	case r := <-late:
		t.Fatalf("the late waiter got the lock before the first (%v): the first's place expired", r.err)
	case <-time.After(3 * time.Second):
		t.Fatal("nobody got the lock within 3 s of its release")
	}
	if r := <-late; r.err == nil {
		mustUnlock(t, ctx, r.h)
	}
}

// Case 7: the fencing counter is Redisson's key, which its fenced lock
// INCRs and never expires. Lockwarden gave it a day's expiry, which INCR
// keeps, so Redisson's tokens fell back to 1 a day after lockwarden's last
// acquisition.
func TestCase7TheFencingCounterKeepsRedissonsSemantics(t *testing.T) {
	srv := redistest.Start(t)
	ctx := testContext(t)
	rdb := srv.Client(t)
	name := lockName(t)
	c := newClient(t, rdb, redislock.Options{})
	counter := "redisson_lock_token:{" + name + "}"
	mustUnlock(t, ctx, mustLock(t, ctx, newMutex(t, c, name, nil)))
	if ttl := rdb.PTTL(ctx, counter).Val(); ttl != -1 {
		t.Fatalf("after a lockwarden acquisition the counter's PTTL is %v, want none (Redisson's counter never expires)", ttl)
	}
	redisson := &redistest.Redisson{RDB: rdb, Name: name, Owner: "7d3c0d2e-fenced:1", Lease: time.Minute}
	token, _, err := redisson.FencedLock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := redisson.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if ttl := rdb.PTTL(ctx, counter).Val(); ttl != -1 {
		t.Fatalf("after Redisson's fenced lock the counter's PTTL is %v, want none", ttl)
	}
	next := mustLock(t, ctx, newMutex(t, c, name, nil))
	if next.Token() <= token {
		t.Fatalf("lockwarden's token %d after Redisson's %d", next.Token(), token)
	}
	mustUnlock(t, ctx, next)
}

// Case 8: a Redis user without PUBSUB NUMSUB passed New, and then every
// contended Unlock failed halfway: the lock was freed, handed to nobody,
// and the Unlock returned an error.
func TestCase8AUserWithoutPubsubNumsub(t *testing.T) {
	srv := redistest.Start(t)
	ctx := testContext(t)
	rules := strings.NewReplacer("+pubsub|numsub ", "", "+pubsub|shardnumsub ", "").Replace(redislock.MinimalACL)
	if err := srv.Client(t).Do(ctx, append([]any{"acl", "setuser", "nonumsub", "on", ">pw"}, fieldsAny(rules)...)...).Err(); err != nil {
		t.Fatal(err)
	}
	user := func() *redis.Client {
		rdb := redis.NewClient(&redis.Options{Addr: srv.Addr, Username: "nonumsub", Password: "pw"})
		t.Cleanup(func() { _ = rdb.Close() })
		return rdb
	}
	opts := redislock.Options{RetryFallback: time.Minute}
	holderClient, err := redislock.New(user(), opts)
	if err != nil {
		// Refusing the user up front is the other way to keep the promise.
		t.Logf("New refused the user: %v", err)
		return
	}
	t.Cleanup(func() { _ = holderClient.Close() })
	waiterClient := newClient(t, user(), opts)
	name := lockName(t)
	held := mustLock(t, ctx, newMutex(t, holderClient, name, nil))
	got := lockAsync(ctx, newMutex(t, waiterClient, name, nil))
	waitFor(t, func() bool { return len(inspect(t, holderClient, name).Waiters) == 1 }, "the waiter to queue")
	time.Sleep(300 * time.Millisecond)
	if err := held.Unlock(ctx); err != nil {
		t.Fatalf("a contended Unlock by a user without PUBSUB NUMSUB: %v", err)
	}
	select {
	case r := <-got:
		if r.err != nil {
			t.Fatal(r.err)
		}
		mustUnlock(t, ctx, r.h)
	case <-time.After(5 * time.Second):
		t.Fatal("the waiter did not get the lock within 5 s of its release")
	}
}

func fieldsAny(s string) []any {
	var out []any
	for _, f := range strings.Fields(s) {
		out = append(out, f)
	}
	return out
}

// Case 9, first half: a Lock request stuck in the network past the
// client's patience arrives after its resend took the lock and the Unlock
// freed it. It took the lock again, for an owner nobody renews or unlocks.
func TestCase9ALateCopyOfALockRequestDoesNotRetakeTheLock(t *testing.T) {
	srv := redistest.Start(t)
	ctx := testContext(t)
	rdb := srv.Client(t)
	var stuck []any
	var armed atomic.Bool
	rdb.AddHook(&scriptHook{fn: func(kind, _ string, args []any, run func() error) error {
		if kind == "acquire" && armed.CompareAndSwap(true, false) {
			stuck = append([]any(nil), args...) // held back in the network
			return &net.OpError{Op: "read", Net: "tcp", Err: os.ErrDeadlineExceeded}
		}
		return run()
	}})
	c := newClient(t, rdb, redislock.Options{})
	m := newMutex(t, c, lockName(t), nil)
	mustUnlock(t, ctx, mustLock(t, ctx, m)) // scripts loaded

	armed.Store(true)
	hold := mustLock(t, ctx, m)
	if stuck == nil {
		t.Fatal("no request was held back")
	}
	mustUnlock(t, ctx, hold)
	// The copy held back arrives now.
	_ = srv.Client(t).Do(ctx, stuck...).Err()
	if info := inspect(t, c, m.Name()); info.Held() {
		t.Fatalf("a late copy of an unlocked Lock's request took the lock again: %+v", info)
	}
}

// Case 9, second half: a re-entry whose reply was lost is sent again; if
// Redis evicted the request's latch in between, the resend counted a
// second level. Nothing the resend relies on may live apart from the lock.
func TestCase9AnEvictedLatchDoesNotCountAReentryTwice(t *testing.T) {
	srv := redistest.Start(t)
	ctx := testContext(t)
	rdb := srv.Client(t)
	admin := srv.Client(t)
	var reentrant atomic.Value
	reentrant.Store("")
	rdb.AddHook(&scriptHook{fn: func(kind, owner string, _ []any, run func() error) error {
		err := run()
		if kind != "acquire" || owner != reentrant.Load().(string) || err != nil {
			return err
		}
		reentrant.Store("")
		// Memory pressure evicts lockwarden's own keys before the resend.
		keys, _ := admin.Keys(ctx, "lockwarden_*").Result()
		for _, k := range keys {
			admin.Del(ctx, k)
		}
		return lostReply
	}})
	c := newClient(t, rdb, redislock.Options{})
	m := newMutex(t, c, lockName(t), nil)
	outer := mustLock(t, ctx, m)
	reentrant.Store(string(outer.Owner()))
	inner := mustLock(t, redislock.WithHold(ctx, outer), m)
	if n := count(t, admin, m.Name(), outer.Owner()); n != 2 {
		t.Errorf("after one re-entry whose reply was lost and resent, the owner holds %d levels, want 2", n)
	}
	mustUnlock(t, ctx, inner)
	mustUnlock(t, ctx, outer)
	if info := inspect(t, c, m.Name()); info.Held() {
		t.Fatalf("the lock is still held after every Unlock: %+v", info)
	}
}

// Case 10: on a Cluster, the client opened one pub/sub connection per lock
// waited on. Now it opens one per shard.
func TestCase10PubSubConnectionsGrowWithShardsNotLocks(t *testing.T) {
	cl := redistest.StartCluster(t, 3, 0)
	ctx, cancel := context.WithCancel(testContext(t))
	defer cancel()
	holderClient := newClient(t, cl.Client(t), redislock.Options{})
	waiterClient := newClient(t, cl.Client(t), redislock.Options{RetryFallback: 10 * time.Second, QueueTTL: time.Minute})
	const locks = 30
	var results []<-chan lockResult
	for i := range locks {
		name := fmt.Sprintf("%s:%d", lockName(t), i)
		mustLock(t, ctx, newMutex(t, holderClient, name, nil))
		results = append(results, lockAsync(ctx, newMutex(t, waiterClient, name, nil)))
	}
	for i := range locks {
		name := fmt.Sprintf("%s:%d", lockName(t), i)
		waitFor(t, func() bool { return len(inspect(t, holderClient, name).Waiters) == 1 }, "every waiter to queue")
	}
	time.Sleep(500 * time.Millisecond) // their subscriptions
	conns := 0
	for _, m := range cl.Masters {
		list, err := m.Client(t).Do(ctx, "client", "list", "type", "pubsub").Text()
		if err != nil {
			t.Fatal(err)
		}
		for _, line := range strings.Split(list, "\n") {
			if strings.TrimSpace(line) != "" {
				conns++
			}
		}
	}
	cancel()
	for _, r := range results {
		<-r
	}
	if conns > len(cl.Masters) {
		t.Fatalf("%d waits on %d locks opened %d pub/sub connections, want at most one per shard (%d)", locks, locks, conns, len(cl.Masters))
	}
}

// Case 11: a client that merely listens on Redisson's release channel (the
// project's controller does, on a Redis 7 Cluster) made every release leave
// the lock free instead of handing it over, as if Redisson clients waited:
// every waiter then needed another round trip. The hand-over works whatever
// else listens: a release races only now and then, in case the listener is
// a Redisson client waiting outside the queue: when the queue forms, a
// second later, and then at gaps that double while no Redisson client takes
// the lock, so over T seconds at most 2 + log2(1 + T) times.
func TestCase11APlainListenerDoesNotDisableTheHandOver(t *testing.T) {
	for _, tc := range []struct {
		name    string
		backend func(t *testing.T) backend
	}{
		{"standalone", func(t *testing.T) backend { b, _ := standalone(t); return b }},
		{"cluster", func(t *testing.T) backend { return cluster(t) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := tc.backend(t)
			ctx := testContext(t)
			name := lockName(t)
			listenerRedis := b.newRedis(t)
			channel := "redisson_lock__channel:{" + name + "}"
			var listener *redis.PubSub
			if cc, ok := listenerRedis.(*redis.ClusterClient); ok && redislock.ShardedPubSub(cc) {
				listener = cc.SSubscribe(ctx, channel)
			} else {
				listener = listenerRedis.Subscribe(ctx, channel)
			}
			defer listener.Close()
			if _, err := listener.Receive(ctx); err != nil {
				t.Fatal(err)
			}

			opts := redislock.Options{RetryFallback: time.Minute}
			holderClient := newClient(t, b.newRedis(t), opts)
			waiterClient, evals := countedClient(t, b, opts)
			holder, waiter := newMutex(t, holderClient, name, nil), newMutex(t, waiterClient, name, nil)
			const handOvers = 20
			start := time.Now()
			extra := extraAttempts(t, ctx, handOvers, holderClient, holder, waiter, evals)
			took := time.Since(start)
			if bound := 2 + int64(math.Log2(1+took.Seconds())); extra > bound {
				t.Fatalf("with a plain listener on the release channel, %d hand-overs in %v took %d more attempts, want at most %d",
					handOvers, took.Round(time.Millisecond), extra, bound)
			}
		})
	}
}

// Case 12, first part: a waiter queued behind a waiter that died slept
// through a release by a Redisson client: only the head acts on the
// release message, and it did not know the dead entry ahead had lapsed.
func TestCase12AWaiterBehindALapsedEntryWakesOnARelease(t *testing.T) {
	srv := redistest.Start(t)
	ctx := testContext(t)
	name := lockName(t)
	redisson := &redistest.Redisson{RDB: srv.Client(t), Name: name, Owner: "0b7e3c11-redisson:1", Lease: time.Minute}
	if took, _, err := redisson.TryLock(ctx); err != nil || !took {
		t.Fatalf("Redisson tryLock = %v, %v", took, err)
	}
	// The dead waiter queues first, then loses Redis for good.
	proxy := redistest.StartProxy(t, srv.Addr)
	deadRedis := redis.NewClient(&redis.Options{Addr: proxy.Addr, MaxRetries: -1, ReadTimeout: 200 * time.Millisecond, DialTimeout: 200 * time.Millisecond})
	t.Cleanup(func() { _ = deadRedis.Close() })
	deadClient := newClient(t, deadRedis, redislock.Options{RetryFallback: 400 * time.Millisecond, QueueTTL: time.Second})
	deadCtx, cancelDead := context.WithCancel(ctx)
	defer cancelDead()
	dead := lockAsync(deadCtx, newMutex(t, deadClient, name, nil))
	admin := newClient(t, srv.Client(t), redislock.Options{})
	waitFor(t, func() bool { return len(inspect(t, admin, name).Waiters) == 1 }, "the first waiter to queue")

	// A fallback far past the bound below, jitter and the time it already
	// waited before the release taken off.
	waiterClient := newClient(t, srv.Client(t), redislock.Options{RetryFallback: 30 * time.Second, QueueTTL: time.Minute})
	got := lockAsync(ctx, newMutex(t, waiterClient, name, nil))
	waitFor(t, func() bool { return len(inspect(t, admin, name).Waiters) == 2 }, "the second waiter to queue")
	time.Sleep(300 * time.Millisecond)
	proxy.Cut()
	waitFor(t, func() bool { return len(inspect(t, admin, name).Waiters) == 1 }, "the first waiter's entry to lapse")

	if freed, err := redisson.Unlock(ctx); err != nil || !freed {
		t.Fatalf("Redisson unlock = %v, %v", freed, err)
	}
	select {
	case r := <-got:
		if r.err != nil {
			t.Fatal(r.err)
		}
		mustUnlock(t, ctx, r.h)
	case <-time.After(5 * time.Second):
		t.Fatal("the waiter behind a lapsed entry did not take the lock within 5 s of its release (its RetryFallback is 30 s)")
	}
	cancelDead()
	<-dead
}

// Case 12, second part: Inspect and ForceReleaseClient reported a caller's own
// deadline as ErrUnavailable, as if Redis were down.
func TestCase12InspectAndForceReleaseClientReportTheCallersDeadline(t *testing.T) {
	p := startProxied(t)
	c := newClient(t, p.client(t, 3), redislock.Options{})
	name := lockName(t)
	p.proxy.Delay(300 * time.Millisecond)
	defer p.proxy.Heal()
	for what, call := range map[string]func(ctx context.Context) error{
		"Inspect":            func(ctx context.Context) error { _, err := c.Inspect(ctx, name); return err },
		"ForceReleaseClient": func(ctx context.Context) error { _, err := c.ForceReleaseClient(ctx, name, "x"); return err },
	} {
		ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
		err := call(ctx)
		cancel()
		if !errors.Is(err, context.DeadlineExceeded) || errors.Is(err, redislock.ErrUnavailable) {
			t.Errorf("%s past the caller's deadline returned %v; want context.DeadlineExceeded", what, err)
		}
	}
}

// Case 12, third part: an inner Unlock that failed (Redis unreachable) left
// its level counted; after the outer Unlock the lock stayed held and
// renewed until the Client closed. The last Unlock of the ownership now
// gives up the failed level too.
func TestCase12AFailedInnerUnlockDoesNotKeepTheLockHeld(t *testing.T) {
	srv := redistest.Start(t)
	ctx := testContext(t)
	rdb := srv.Client(t)
	var failing atomic.Bool
	rdb.AddHook(&scriptHook{fn: func(kind, _ string, _ []any, run func() error) error {
		if kind == "release" && failing.CompareAndSwap(true, false) {
			return &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}
		}
		return run()
	}})
	c := newClient(t, rdb, redislock.Options{WatchdogLease: time.Second})
	m := newMutex(t, c, lockName(t), nil)
	outer := mustLock(t, ctx, m)
	inner := mustLock(t, redislock.WithHold(ctx, outer), m)
	failing.Store(true)
	if err := inner.Unlock(ctx); !errors.Is(err, redislock.ErrUnavailable) {
		t.Fatalf("the inner Unlock with Redis unreachable: %v, want ErrUnavailable", err)
	}
	mustUnlock(t, ctx, outer)
	// Three leases: nothing renews the lock any more, so it is free by then
	// even if Redis kept the failed level.
	waitFor(t, func() bool { return !inspect(t, c, m.Name()).Held() }, "the lock to be free after the last Unlock")
	if err := outer.Err(); !errors.Is(err, redislock.ErrReleased) {
		t.Errorf("the ownership ended with %v, want ErrReleased", err)
	}
}

// Case 13: API traps.

// An owner carried in a context applied to every lock: a Lock of another
// lock with that context acted for the first lock's owner, so goroutines
// sharing the context re-entered it instead of excluding each other.
func TestCase13AnOwnerInAContextReentersOnlyItsOwnLock(t *testing.T) {
	b, _ := standalone(t)
	ctx := testContext(t)
	c := newClient(t, b.newRedis(t), redislock.Options{})
	a := mustLock(t, ctx, newMutex(t, c, lockName(t)+":a", nil))
	withA := redislock.WithHold(ctx, a)
	other := newMutex(t, c, lockName(t)+":b", nil)
	first := mustLock(t, withA, other)
	if first.Owner() == a.Owner() {
		t.Errorf("a Lock of another lock with the context of %s acted for its owner", a.Name())
	}
	if second, err := other.TryLock(withA, 0); err == nil {
		t.Errorf("two Locks of %s with one context both hold it (tokens %d and %d)", other.Name(), first.Token(), second.Token())
	}
}

// A re-entry through a Mutex with another lease replaced the whole
// ownership's terms: the first Hold's watchdog stopped, and the lock ran out
// under it. Now such a re-entry is refused with ErrLeaseMismatch.
func TestCase13AReentryUnderOtherTermsIsRefused(t *testing.T) {
	b, _ := standalone(t)
	ctx := testContext(t)
	c := newClient(t, b.newRedis(t), redislock.Options{WatchdogLease: 3 * time.Second})
	name := lockName(t)
	outer := mustLock(t, ctx, newMutex(t, c, name, nil))
	fixed := newMutex(t, c, name, &redislock.MutexOptions{Lease: 200 * time.Millisecond})
	inner, err := fixed.Lock(redislock.WithHold(ctx, outer))
	if err == nil {
		mustUnlock(t, ctx, inner)
	}
	if !errors.Is(err, redislock.ErrLeaseMismatch) {
		t.Errorf("a re-entry under a fixed lease of a watchdog ownership: %v, want ErrLeaseMismatch", err)
	}
	time.Sleep(4 * time.Second) // past the first Hold's lease
	if err := outer.Err(); err != nil || !inspect(t, c, name).Held() {
		t.Fatalf("after the re-entry, the first Hold's lock ran out (Err %v)", err)
	}
	mustUnlock(t, ctx, outer)
}

// TryLock(ctx, 0) failed on a free lock reserved for a queued waiter that
// did not take it. It now takes a lock it finds free, as Redisson's
// tryLock does; the waiter it overtakes keeps its place.
func TestCase13TryLockTakesAFreeLockAheadOfAQueue(t *testing.T) {
	srv := redistest.Start(t)
	ctx := testContext(t)
	name := lockName(t)
	redisson := &redistest.Redisson{RDB: srv.Client(t), Name: name, Owner: "0b7e3c11-redisson:2", Lease: time.Minute}
	if took, _, err := redisson.TryLock(ctx); err != nil || !took {
		t.Fatalf("Redisson tryLock = %v, %v", took, err)
	}
	proxy := redistest.StartProxy(t, srv.Addr)
	waiterRedis := redis.NewClient(&redis.Options{Addr: proxy.Addr})
	t.Cleanup(func() { _ = waiterRedis.Close() })
	waiterClient := newClient(t, waiterRedis, redislock.Options{RetryFallback: 2 * time.Second, QueueTTL: 10 * time.Second})
	got := lockAsync(ctx, newMutex(t, waiterClient, name, nil))
	c := newClient(t, srv.Client(t), redislock.Options{})
	waitFor(t, func() bool { return len(inspect(t, c, name).Waiters) == 1 }, "the waiter to queue")
	time.Sleep(300 * time.Millisecond)
	proxy.Cut() // it cannot act on the release for now
	if freed, err := redisson.Unlock(ctx); err != nil || !freed {
		t.Fatalf("Redisson unlock = %v, %v", freed, err)
	}
	hold, err := newMutex(t, c, name, nil).TryLock(ctx, 0)
	if err != nil {
		t.Fatalf("TryLock(ctx, 0) of a free lock: %v", err)
	}
	proxy.Heal()
	time.Sleep(300 * time.Millisecond)
	mustUnlock(t, ctx, hold)
	select {
	case r := <-got:
		if r.err != nil {
			t.Fatal(r.err)
		}
		mustUnlock(t, ctx, r.h)
	case <-time.After(5 * time.Second):
		t.Fatal("the overtaken waiter did not get the lock within 5 s of the TryLock's Unlock")
	}
}

// Close left the locks it held to run out their leases, so others waited
// up to a lease for a process that had shut down cleanly.
func TestCase13CloseReleasesHeldLocks(t *testing.T) {
	b, _ := standalone(t)
	ctx := testContext(t)
	c, err := redislock.New(b.newRedis(t), redislock.Options{})
	if err != nil {
		t.Fatal(err)
	}
	other := newClient(t, b.newRedis(t), redislock.Options{})
	name := lockName(t)
	m := newMutex(t, c, name, nil)
	outer := mustLock(t, ctx, m)
	mustLock(t, redislock.WithHold(ctx, outer), m)
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if err := outer.Err(); !errors.Is(err, redislock.ErrClosed) {
		t.Errorf("a Hold after Close: %v, want ErrClosed", err)
	}
	if info := inspect(t, other, name); info.Held() {
		t.Fatalf("the lock is still held after its client closed: %+v", info)
	}
}

// With KeepOnClose, Close leaves the lock held for its lease, and a Lock of
// another Client for the same owner adopts it with its token: the
// controller's grants pass from one manager to the next this way.
func TestKeepOnCloseLeavesTheLockToBeAdopted(t *testing.T) {
	b, _ := standalone(t)
	ctx := testContext(t)
	c, err := redislock.New(b.newRedis(t), redislock.Options{KeepOnClose: true})
	if err != nil {
		t.Fatal(err)
	}
	next := newClient(t, b.newRedis(t), redislock.Options{})
	name := lockName(t)
	owner := redislock.Owner("manager-a:7")
	held := mustLock(t, ctx, newMutex(t, c, name, &redislock.MutexOptions{Owner: owner}))
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if err := held.Err(); !errors.Is(err, redislock.ErrClosed) {
		t.Errorf("a Hold after Close: %v, want ErrClosed", err)
	}
	info := inspect(t, next, name)
	if len(info.Holders) != 1 || info.Holders[0].Owner != owner || info.TTL <= 0 {
		t.Fatalf("after Close with KeepOnClose: %+v, want %s still holding it with a lease", info, owner)
	}
	adopted := mustLock(t, ctx, newMutex(t, next, name, &redislock.MutexOptions{Owner: owner}))
	if adopted.Token() != held.Token() {
		t.Fatalf("the adopting Lock's token is %d, want the kept hold's %d", adopted.Token(), held.Token())
	}
}

// A lock held under an owner by a lockwarden from before the '~t' field (the
// owner's count in the hash, the token in Redisson's counter: what a
// manager before the upgrade left for each grant) is adopted by a Lock for
// that owner, with that token, and is renewed and released as this
// library's own. Before, such a re-entry was refused as one under other
// lease terms, and an upgraded manager could adopt no grant.
func TestALockHeldByAnOlderLockwardenIsAdoptedWithItsToken(t *testing.T) {
	b, srv := standalone(t)
	ctx := testContext(t)
	name := lockName(t)
	owner := redislock.Owner("pod-uid:0")
	direct := srv.Client(t)
	const token = "1795000000000007"
	if err := direct.HSet(ctx, name, string(owner), 1).Err(); err != nil {
		t.Fatal(err)
	}
	direct.PExpire(ctx, name, 30*time.Second)
	direct.Set(ctx, "redisson_lock_token:{"+name+"}", token, 0)

	c := newClient(t, b.newRedis(t), redislock.Options{})
	adopted := mustLock(t, ctx, newMutex(t, c, name, &redislock.MutexOptions{Owner: owner}))
	if got := strconv.FormatInt(adopted.Token(), 10); got != token {
		t.Fatalf("the adopting Lock's token is %s, want the older ownership's %s", got, token)
	}
	if err := adopted.Refresh(ctx); err != nil {
		t.Fatalf("renewing the adopted lock: %v", err)
	}
	if _, err := c.ForceReleaseClient(ctx, name, "pod-uid"); err != nil {
		t.Fatal(err)
	}
	if inspect(t, c, name).Held() {
		t.Fatal("the adopted lock is still held after its force release")
	}
}

// The package documentation's list of errors named neither ErrLeaseLost
// nor ErrReleased: every exported error is now in it.
func TestCase13EveryErrorIsDocumented(t *testing.T) {
	fset := token.NewFileSet()
	pkgs, err := parser.ParseDir(fset, ".", func(fi fs.FileInfo) bool { return !strings.HasSuffix(fi.Name(), "_test.go") }, parser.ParseComments)
	if err != nil {
		t.Fatal(err)
	}
	p := doc.New(pkgs["redislock"], "github.com/lockwarden/lockwarden/pkg/redislock", 0)
	_, errorsSection, ok := strings.Cut(p.Doc, "Errors\n")
	if !ok {
		t.Fatal("the package documentation has no Errors section")
	}
	for _, v := range p.Vars {
		for _, name := range v.Names {
			if strings.HasPrefix(name, "Err") && !strings.Contains(errorsSection, name) {
				t.Errorf("the package documentation's Errors section does not name %s", name)
			}
		}
	}
}

// A fixed lease could be neither extended nor read: a holder whose work ran
// long had to unlock and lock again, letting another in between. Now
// Hold.Refresh extends it to its full length, and Hold.TTL tells what is
// left.
func TestCase13AFixedLeaseCanBeRefreshedAndRead(t *testing.T) {
	b, _ := standalone(t)
	ctx := testContext(t)
	c := newClient(t, b.newRedis(t), redislock.Options{})
	rival := newMutex(t, newClient(t, b.newRedis(t), redislock.Options{}), lockName(t), nil)
	// Three seconds: a loaded machine's stalls stay well within each half.
	const lease = 3 * time.Second
	hold := mustLock(t, ctx, newMutex(t, c, lockName(t), &redislock.MutexOptions{Lease: lease}))
	for range 3 {
		time.Sleep(lease / 2)
		ttl, err := hold.TTL(ctx)
		if err != nil || ttl <= 0 || ttl > lease/2 {
			t.Fatalf("TTL half a lease in = %v, %v; want under %v", ttl, err, lease/2)
		}
		if err := hold.Refresh(ctx); err != nil {
			t.Fatalf("Refresh: %v", err)
		}
		if ttl, err := hold.TTL(ctx); err != nil || ttl <= lease/2 {
			t.Fatalf("TTL after Refresh = %v, %v; want about %v", ttl, err, lease)
		}
	}
	// A lease and a half after the Lock, it still holds, and nobody else
	// got in.
	if _, err := rival.TryLock(ctx, 0); !errors.Is(err, redislock.ErrWaitTimeout) {
		t.Fatalf("another owner's TryLock while the lease was refreshed: %v", err)
	}
	if err := hold.Err(); err != nil {
		t.Fatalf("the refreshed Hold ended: %v", err)
	}
	mustUnlock(t, ctx, hold)
	if _, err := hold.TTL(ctx); !errors.Is(err, redislock.ErrReleased) {
		t.Fatalf("TTL after Unlock: %v, want ErrReleased", err)
	}
	if err := hold.Refresh(ctx); !errors.Is(err, redislock.ErrReleased) {
		t.Fatalf("Refresh after Unlock: %v, want ErrReleased", err)
	}
}
