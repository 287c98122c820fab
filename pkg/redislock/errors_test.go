package redislock_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/lockwarden/lockwarden/internal/redistest"
	"github.com/lockwarden/lockwarden/pkg/redislock"
)

// deadRedis is a client for an address where nothing listens, so any call
// that reaches the network fails with ErrUnavailable.
func deadRedis(t *testing.T) redis.UniversalClient {
	srv := redistest.Start(t)
	srv.Stop()
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr, MaxRetries: -1, DialTimeout: 200 * time.Millisecond})
	t.Cleanup(func() { _ = rdb.Close() })
	return rdb
}

func TestInvalidNamesRejectedBeforeRedis(t *testing.T) {
	c := newClient(t, deadRedis(t), redislock.Options{})
	// Braces are refused unless they hold a Redis Cluster hash tag: a '{',
	// a later '}', and something between.
	for _, name := range []string{"", strings.Repeat("x", redislock.MaxNameLength+1), "has space",
		"a{}c", "{}", "a{b", "a}b", "a}b{c"} {
		_, err := c.NewMutex(name, nil)
		wantErr(t, err, redislock.ErrInvalidName)
		_, err = c.Inspect(context.Background(), name)
		wantErr(t, err, redislock.ErrInvalidName)
		_, err = c.ForceReleaseClient(context.Background(), name, "uid")
		wantErr(t, err, redislock.ErrInvalidName)
		_, err = c.ForceReleaseOwnership(context.Background(), name, "uid", 1)
		wantErr(t, err, redislock.ErrInvalidName)
	}
	if _, err := c.NewMutex(strings.Repeat("x", redislock.MaxNameLength), nil); err != nil {
		t.Fatalf("a name of exactly MaxNameLength: %v", err)
	}
	for _, name := range []string{"{tenant}:orders", "a{b}c", "orders:{tenant}", "{a}}"} {
		if _, err := c.NewMutex(name, nil); err != nil {
			t.Errorf("a name with a hash tag, %q: %v", name, err)
		}
	}
	// Leases are kept in whole milliseconds, and no shorter than MinLease.
	for _, lease := range []time.Duration{redislock.MinLease - time.Millisecond, redislock.MinLease + time.Microsecond, -time.Second} {
		if _, err := c.NewMutex("ok", &redislock.MutexOptions{Lease: lease}); err == nil {
			t.Errorf("NewMutex accepted a lease of %v", lease)
		}
	}
	if _, err := c.NewMutex("ok", &redislock.MutexOptions{Lease: redislock.MinLease}); err != nil {
		t.Errorf("a lease of MinLease: %v", err)
	}
	_, err := c.NewMutex("ok", &redislock.MutexOptions{Owner: "no-separator"})
	wantErr(t, err, redislock.ErrInvalidOwner)
	_, err = c.ForceReleaseClient(context.Background(), "ok", "")
	wantErr(t, err, redislock.ErrInvalidOwner)
	_, err = c.ForceReleaseOwnership(context.Background(), "ok", "", 1)
	wantErr(t, err, redislock.ErrInvalidOwner)
}

func TestRedisUnavailable(t *testing.T) {
	c := newClient(t, deadRedis(t), redislock.Options{})
	m := newMutex(t, c, "down", nil)
	ctx := testContext(t)
	_, err := m.Lock(ctx)
	wantErr(t, err, redislock.ErrUnavailable)
	_, err = c.Inspect(ctx, "down")
	wantErr(t, err, redislock.ErrUnavailable)
}

// TestUnlockWhenRedisUnavailable: an Unlock that cannot reach Redis returns
// ErrUnavailable. One that is not the last keeps its level, under the
// watchdog, and can be retried on the same Hold; the last one ends the
// ownership anyway: renewal stops, and the lock's lease runs out in Redis.
func TestUnlockWhenRedisUnavailable(t *testing.T) {
	srv := redistest.Start(t)
	proxy := redistest.StartProxy(t, srv.Addr)
	rdb := redis.NewClient(&redis.Options{Addr: proxy.Addr, ReadTimeout: 200 * time.Millisecond, WriteTimeout: 200 * time.Millisecond})
	t.Cleanup(func() { _ = rdb.Close() })
	ctx := testContext(t)
	const leaseTime = 3 * time.Second
	c := newClient(t, rdb, redislock.Options{WatchdogLease: leaseTime, RetryFallback: 100 * time.Millisecond})
	admin := newClient(t, srv.Client(t), redislock.Options{})
	name := lockName(t)
	m := newMutex(t, c, name, nil)
	outer := mustLock(t, ctx, m)
	inner := mustLock(t, redislock.WithHold(ctx, outer), m)
	wantCount := func(when string, want int64) {
		t.Helper()
		info := inspect(t, admin, name)
		if len(info.Holders) != 1 || info.Holders[0].Owner != outer.Owner() || info.Holders[0].Count != want {
			t.Fatalf("holders %s = %+v, want %s with count %d", when, info.Holders, outer.Owner(), want)
		}
	}

	// A non-last Unlock fails: the level stays, and so does the ownership.
	proxy.Cut()
	wantErr(t, inner.Unlock(ctx), redislock.ErrUnavailable)
	proxy.Heal()
	wantCount("after a failed Unlock", 2)
	if outer.Err() != nil || inner.Err() != nil {
		t.Fatalf("the ownership ended after a failed non-last Unlock: %v, %v", outer.Err(), inner.Err())
	}
	// Retried on the same Hold, it undoes the level, once.
	mustUnlock(t, ctx, inner)
	wantCount("after the retried Unlock", 1)
	wantErr(t, inner.Unlock(ctx), redislock.ErrNotHeld)
	wantCount("after a third Unlock of the same Hold", 1)

	// The last Unlock fails: the ownership ends here all the same, and
	// nobody renews the lock any more (see TestFailedLastUnlockStopsRenewal).
	proxy.Cut()
	wantErr(t, outer.Unlock(ctx), redislock.ErrUnavailable)
	proxy.Heal()
	wantErr(t, outer.Err(), redislock.ErrReleased)
	wantErr(t, context.Cause(outer.Context()), redislock.ErrReleased)
	wantCount("after a failed last Unlock", 1)
	// Retried, it frees the lock at once rather than when the lease runs
	// out, and only once.
	mustUnlock(t, ctx, outer)
	if inspect(t, admin, name).Held() {
		t.Fatal("the lock is held after the retried last Unlock")
	}
	wantErr(t, outer.Unlock(ctx), redislock.ErrNotHeld)
	next := mustLock(t, ctx, newMutex(t, admin, name, nil))
	if next.Token() <= outer.Token() {
		t.Fatalf("the next token %d is not above %d", next.Token(), outer.Token())
	}
	mustUnlock(t, ctx, next)
}

func TestClosedClient(t *testing.T) {
	srv := redistest.Start(t)
	ctx := testContext(t)
	c, err := redislock.New(srv.Client(t), redislock.Options{})
	if err != nil {
		t.Fatal(err)
	}
	admin := newClient(t, srv.Client(t), redislock.Options{})
	// One Mutex: its Locks act for different owners, so the second waits.
	m := newMutex(t, c, lockName(t), nil)
	lease := mustLock(t, ctx, m)
	waited := make(chan error)
	go func() {
		_, err := m.Lock(ctx)
		waited <- err
	}()
	waitFor(t, func() bool { return len(inspect(t, c, lockName(t)).Waiters) == 1 }, "the waiter to queue")

	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	// Close returned only after the waiter left the queue, and released the
	// lock it held.
	if info := inspect(t, admin, lockName(t)); len(info.Waiters) != 0 || info.Held() {
		t.Fatalf("after Close the lock is %+v, want free with nobody queued", info)
	}
	wantErr(t, <-waited, redislock.ErrClosed)
	wantErr(t, lease.Err(), redislock.ErrClosed)
	_, err = m.Lock(ctx)
	wantErr(t, err, redislock.ErrClosed)
	wantErr(t, lease.Unlock(ctx), redislock.ErrClosed)
	_, err = c.Inspect(ctx, "x")
	wantErr(t, err, redislock.ErrClosed)
	if err := c.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}

	// A client whose go-redis client was closed underneath it.
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr})
	c2 := newClient(t, rdb, redislock.Options{})
	_ = rdb.Close()
	_, err = newMutex(t, c2, "x", nil).Lock(ctx)
	wantErr(t, err, redislock.ErrClosed)
}

func TestOptionsValidated(t *testing.T) {
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"})
	defer rdb.Close()
	for _, opts := range []redislock.Options{
		{WatchdogLease: 10 * time.Second, RenewInterval: 10 * time.Second},
		{WatchdogLease: time.Second, SafetyMargin: 2 * time.Second},
		{RetryFallback: -time.Second},
		{ID: "has space"},
		{WatchdogLease: redislock.MinLease - time.Millisecond},
		{WatchdogLease: time.Second + time.Microsecond},
		{RetryFallback: time.Second, QueueTTL: 1200 * time.Millisecond},
		{QueueTTL: time.Second}, // with the default RetryFallback of 1s
	} {
		if c, err := redislock.New(rdb, opts); err == nil {
			_ = c.Close()
			t.Errorf("New accepted %+v", opts)
		}
	}
	if _, err := redislock.New(nil, redislock.Options{}); err == nil {
		t.Error("New accepted a nil redis client")
	}
}

func TestWaitForReplicas(t *testing.T) {
	primary := redistest.Start(t)
	replica := redistest.Start(t)
	ctx := testContext(t)
	rdb := replica.Client(t)
	if err := rdb.Do(ctx, "replicaof", "127.0.0.1", primary.Port).Err(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool {
		info, _ := primary.Client(t).Info(ctx, "replication").Result()
		return strings.Contains(info, "connected_slaves:1") && strings.Contains(info, "state=online")
	}, "the replica to sync")

	synced := newClient(t, primary.Client(t), redislock.Options{WaitReplicas: 1})
	m := newMutex(t, synced, lockName(t), nil)
	mustUnlock(t, ctx, mustLock(t, ctx, m))

	// Two replicas cannot acknowledge: Lock fails and leaves nothing behind.
	greedy := newClient(t, primary.Client(t), redislock.Options{WaitReplicas: 2, WaitReplicasTimeout: 100 * time.Millisecond})
	m2 := newMutex(t, greedy, lockName(t)+"-2", nil)
	_, err := m2.Lock(ctx)
	wantErr(t, err, redislock.ErrUnavailable)
	if inspect(t, greedy, m2.Name()).Held() {
		t.Fatal("a Lock that failed its replica check left the lock held")
	}
	if !errors.Is(err, redislock.ErrUnavailable) || !strings.Contains(err.Error(), "replicas") {
		t.Fatalf("error %q does not say replicas were missing", err)
	}
}
