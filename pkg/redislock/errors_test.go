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
	for _, name := range []string{"", strings.Repeat("x", redislock.MaxNameLength+1), "a{b}c", "has space"} {
		_, err := c.NewMutex(name, nil)
		wantErr(t, err, redislock.ErrInvalidName)
		_, err = c.Inspect(context.Background(), name)
		wantErr(t, err, redislock.ErrInvalidName)
		_, err = c.ForceRelease(context.Background(), name, "uid")
		wantErr(t, err, redislock.ErrInvalidName)
	}
	if _, err := c.NewMutex(strings.Repeat("x", redislock.MaxNameLength), nil); err != nil {
		t.Fatalf("a name of exactly MaxNameLength: %v", err)
	}
	_, err := c.NewMutex("ok", &redislock.MutexOptions{Owner: "no-separator"})
	wantErr(t, err, redislock.ErrInvalidOwner)
	_, err = c.ForceRelease(context.Background(), "ok", "")
	wantErr(t, err, redislock.ErrInvalidOwner)
}

func TestRedisUnavailable(t *testing.T) {
	c := newClient(t, deadRedis(t), redislock.Options{})
	m := newMutex(t, c, "down", nil)
	ctx := testContext(t)
	_, err := m.Lock(ctx)
	wantErr(t, err, redislock.ErrUnavailable)
	wantErr(t, m.Unlock(ctx), redislock.ErrUnavailable)
	_, err = c.Inspect(ctx, "down")
	wantErr(t, err, redislock.ErrUnavailable)
}

func TestClosedClient(t *testing.T) {
	srv := redistest.Start(t)
	ctx := testContext(t)
	c, err := redislock.New(srv.Client(t), redislock.Options{})
	if err != nil {
		t.Fatal(err)
	}
	holder, waiter := newMutex(t, c, lockName(t), nil), newMutex(t, c, lockName(t), nil)
	lease := mustLock(t, ctx, holder)
	waited := make(chan error)
	go func() {
		_, err := waiter.Lock(ctx)
		waited <- err
	}()
	waitFor(t, func() bool { return len(inspect(t, c, lockName(t)).Waiters) == 1 }, "the waiter to queue")

	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	wantErr(t, <-waited, redislock.ErrClosed)
	wantErr(t, lease.Err(), redislock.ErrClosed)
	_, err = holder.Lock(ctx)
	wantErr(t, err, redislock.ErrClosed)
	wantErr(t, holder.Unlock(ctx), redislock.ErrClosed)
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
	mustLock(t, ctx, m)
	mustUnlock(t, ctx, m)

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
