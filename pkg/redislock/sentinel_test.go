package redislock_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lockwarden/lockwarden/internal/redistest"
	"github.com/lockwarden/lockwarden/pkg/redislock"
)

// TestSentinelFailoverWithBlockedWaiters runs the lock through a Sentinel
// failover client, then kills the master while waiters are blocked: after
// the Sentinels promote the replica, every waiter wakes and acquires on the
// new master, one at a time.
func TestSentinelFailoverWithBlockedWaiters(t *testing.T) {
	s := redistest.StartSentinel(t, 1, 3)
	ctx := testContext(t)
	opts := redislock.Options{WatchdogLease: 2 * time.Second, RetryFallback: 200 * time.Millisecond}
	c := newClient(t, s.Client(t), opts)
	name := lockName(t)

	// The basics, through Sentinel.
	holder := newMutex(t, c, name, nil)
	first := mustLock(t, ctx, holder)
	if again := mustLock(t, ctx, holder); first != again {
		t.Fatal("re-entry through Sentinel returned another lease")
	}

	// Waiters on another client block on the held lock.
	waiters := newClient(t, s.Client(t), opts)
	const n = 3
	var inside, violations, acquired atomic.Int64
	var wg sync.WaitGroup
	for range n {
		m := newMutex(t, waiters, name, nil)
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := m.Lock(ctx); err != nil {
				t.Errorf("waiter: %v", err)
				return
			}
			if inside.Add(1) != 1 {
				violations.Add(1)
			}
			acquired.Add(1)
			time.Sleep(20 * time.Millisecond)
			inside.Add(-1)
			_ = m.Unlock(ctx)
		}()
	}
	waitFor(t, func() bool { return len(inspect(t, c, name).Waiters) == n }, "the waiters to queue")

	oldMaster := s.Master.Addr
	s.Master.Stop()
	waitFor(t, func() bool {
		addr, err := s.MasterAddr(context.Background())
		return err == nil && addr != oldMaster
	}, "the Sentinels to promote the replica")

	// The holder either kept the lock (it reached the replica) and releases
	// it now, or lost it with the old master and has been told so.
	if err := holder.Unlock(ctx); err == nil {
		_ = holder.Unlock(ctx)
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	waitDone(t, done, 30*time.Second, "every waiter to acquire on the new master")
	if acquired.Load() != n || violations.Load() != 0 {
		t.Fatalf("%d of %d waiters acquired, %d overlapping holds", acquired.Load(), n, violations.Load())
	}
}
