package redislock_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/lockwarden/lockwarden/internal/redistest"
	"github.com/lockwarden/lockwarden/pkg/redislock"
)

// sendRecorder is a go-redis hook that remembers when the last successful
// script call (an acquire or a renewal batch) was sent. The server applied
// that call's PEXPIRE after it was sent, so the lock cannot expire on the
// server before that send time plus the lease.
type sendRecorder struct {
	mu       sync.Mutex
	lastSent time.Time
}

func (r *sendRecorder) DialHook(next redis.DialHook) redis.DialHook { return next }

func (r *sendRecorder) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		sent := time.Now()
		err := next(ctx, cmd)
		r.record(sent, []redis.Cmder{cmd})
		return err
	}
}

func (r *sendRecorder) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		sent := time.Now()
		err := next(ctx, cmds)
		r.record(sent, cmds)
		return err
	}
}

func (r *sendRecorder) record(sent time.Time, cmds []redis.Cmder) {
	for _, cmd := range cmds {
		if cmd.Name() != "evalsha" || cmd.Err() != nil {
			return
		}
	}
	r.mu.Lock()
	r.lastSent = sent
	r.mu.Unlock()
}

func (r *sendRecorder) last() time.Time {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.lastSent
}

// testLostLease holds a watchdog lock through rdb, cuts the holder off
// from Redis with fault, and checks that the lease's context is cancelled
// before the lock could have expired on the server.
func testLostLease(t *testing.T, rdb *redis.Client, fault func()) {
	const leaseTime = time.Second
	rec := &sendRecorder{}
	rdb.AddHook(rec)
	c := newClient(t, rdb, redislock.Options{WatchdogLease: leaseTime})
	m := newMutex(t, c, lockName(t), nil)
	lease := mustLock(t, testContext(t), m)
	time.Sleep(leaseTime / 2) // let a renewal or two succeed

	fault()
	waitDone(t, lease.Done(), 10*time.Second, "the lost-lease signal")
	cancelled := time.Now()
	wantErr(t, lease.Err(), redislock.ErrLeaseLost)
	if expiry := rec.last().Add(leaseTime); !cancelled.Before(expiry) {
		t.Fatalf("lease context cancelled at %v, after the earliest server expiry %v", cancelled.Sub(rec.last()), leaseTime)
	}
}

func TestLostLeaseWhenRedisSleeps(t *testing.T) {
	srv := redistest.Start(t)
	testLostLease(t, srv.Client(t), func() {
		sleeper := srv.Client(t)
		done := make(chan struct{})
		go func() {
			defer close(done)
			_ = sleeper.Do(context.Background(), "debug", "sleep", "3").Err()
		}()
		t.Cleanup(func() { <-done })
	})
}

func TestLostLeaseWhenRedisStops(t *testing.T) {
	srv := redistest.Start(t)
	testLostLease(t, srv.Client(t), srv.Stop)
}

// TestLostLeaseWhenPartitioned cuts, then slows, the network between the
// holder and Redis with a proxy; Redis itself keeps running.
func TestLostLeaseWhenPartitioned(t *testing.T) {
	for _, tc := range []struct {
		name  string
		fault func(*redistest.Proxy)
	}{
		{"cut", (*redistest.Proxy).Cut},
		{"slow", func(p *redistest.Proxy) { p.Delay(3 * time.Second) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := redistest.Start(t)
			proxy := redistest.StartProxy(t, srv.Addr)
			rdb := redis.NewClient(&redis.Options{Addr: proxy.Addr})
			t.Cleanup(func() { _ = rdb.Close() })
			testLostLease(t, rdb, func() { tc.fault(proxy) })
		})
	}
}

// TestLostLeaseWhenRedisRestartsEmpty restarts a Redis without persistence
// under a held lock: the lock is gone, and the holder's next renewal tells
// it so.
func TestLostLeaseWhenRedisRestartsEmpty(t *testing.T) {
	srv := redistest.Start(t)
	c := newClient(t, srv.Client(t), redislock.Options{WatchdogLease: time.Second})
	lease := mustLock(t, testContext(t), newMutex(t, c, lockName(t), nil))
	srv.Stop()
	if err := srv.Restart(); err != nil {
		t.Fatal(err)
	}
	waitDone(t, lease.Done(), 10*time.Second, "the lost-lease signal after a restart")
	// Either the renewal answered "not owner" or, if no renewal got
	// through in time, the deadline passed; both mean it is lost.
	if err := lease.Err(); !errors.Is(err, redislock.ErrNotOwner) && !errors.Is(err, redislock.ErrLeaseLost) {
		t.Fatalf("lease ended with %v", err)
	}
}
