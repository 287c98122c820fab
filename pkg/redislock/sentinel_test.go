package redislock_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

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
	again := mustLock(t, redislock.WithHold(ctx, first), holder)
	if again.Token() != first.Token() {
		t.Fatalf("re-entry through Sentinel changed the token from %d to %d", first.Token(), again.Token())
	}

	// Waiters on another client block on the held lock. The hook tells
	// when each waiter's first attempt has returned to it: only then is it
	// waiting, rather than still inside its first call.
	waitersRedis := s.Client(t)
	answered := &answeredOwners{}
	waitersRedis.AddHook(answered)
	waiters := newClient(t, waitersRedis, opts)
	const n = 3
	var inside, violations, acquired atomic.Int64
	var wg sync.WaitGroup
	for range n {
		m := newMutex(t, waiters, name, nil)
		wg.Add(1)
		go func() {
			defer wg.Done()
			l, err := m.Lock(ctx)
			if err != nil {
				t.Errorf("waiter: %v", err)
				return
			}
			if inside.Add(1) != 1 {
				violations.Add(1)
			}
			acquired.Add(1)
			time.Sleep(20 * time.Millisecond)
			inside.Add(-1)
			_ = l.Unlock(ctx)
		}()
	}
	waitFor(t, func() bool { return len(inspect(t, c, name).Waiters) == n && answered.count() == n }, "the waiters to queue")

	oldMaster := s.Master.Addr
	s.Master.Stop()
	waitFor(t, func() bool {
		addr, err := s.MasterAddr(context.Background())
		return err == nil && addr != oldMaster
	}, "the Sentinels to promote the replica")

	// The holder either kept the lock (it reached the replica) and releases
	// it now, or lost it with the old master and has been told so.
	if err := again.Unlock(ctx); err == nil {
		_ = first.Unlock(ctx)
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	waitDone(t, done, 30*time.Second, "every waiter to acquire on the new master")
	if acquired.Load() != n || violations.Load() != 0 {
		t.Fatalf("%d of %d waiters acquired, %d overlapping holds", acquired.Load(), n, violations.Load())
	}
}

// answeredOwners is a go-redis hook that records the owners whose script
// calls got an answer.
type answeredOwners struct {
	mu     sync.Mutex
	owners map[string]bool
}

func (a *answeredOwners) DialHook(next redis.DialHook) redis.DialHook { return next }

func (a *answeredOwners) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		if kind, owner := redislock.ScriptCall(cmd.Args()); err == nil && kind == "acquire" {
			a.mu.Lock()
			if a.owners == nil {
				a.owners = map[string]bool{}
			}
			a.owners[owner] = true
			a.mu.Unlock()
		}
		return err
	}
}

func (a *answeredOwners) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

func (a *answeredOwners) count() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(a.owners)
}
