package redislock_test

import (
	"testing"
	"time"

	"github.com/lockwarden/lockwarden/internal/redistest"
	"github.com/lockwarden/lockwarden/pkg/redislock"
)

func TestRedissonInterop(t *testing.T) {
	srv := redistest.Start(t)
	ctx := testContext(t)
	// A fallback longer than the test's bounds: only the release message
	// can wake our waiter in time.
	c := newClient(t, srv.Client(t), redislock.Options{RetryFallback: time.Minute})

	t.Run("RedissonExcludesAndWakesUs", func(t *testing.T) {
		name := lockName(t)
		redisson := &redistest.Redisson{RDB: srv.Client(t), Name: name, Owner: "7d3c0d2e-2f43-4a8e-9d0c-5b7e0b7e3c11:42", Lease: 30 * time.Second}
		if took, _, err := redisson.TryLock(ctx); err != nil || !took {
			t.Fatalf("Redisson tryLock = %v, %v", took, err)
		}
		ours := newMutex(t, c, name, nil)
		_, err := ours.TryLock(ctx, 0)
		wantErr(t, err, redislock.ErrWaitTimeout)

		got := lockInBackground(t, ctx, ours)
		waitFor(t, func() bool { return len(inspect(t, c, name).Waiters) == 1 }, "our waiter to queue")
		if freed, err := redisson.Unlock(ctx); err != nil || !freed {
			t.Fatalf("Redisson unlock = %v, %v", freed, err)
		}
		held := receiveHold(t, got, 10*time.Second, "our waiter's wake-up on Redisson's release")
		if held == nil {
			return
		}
		if took, ttl, err := redisson.TryLock(ctx); err != nil || took {
			t.Fatalf("Redisson tryLock while we hold = %v (TTL %v), %v; want excluded", took, ttl, err)
		}
		mustUnlock(t, ctx, held)
	})

	t.Run("WeExcludeAndWakeRedisson", func(t *testing.T) {
		name := lockName(t)
		ours := newMutex(t, c, name, nil)
		held := mustLock(t, ctx, ours)
		redisson := &redistest.Redisson{RDB: srv.Client(t), Name: name, Owner: "7d3c0d2e-2f43-4a8e-9d0c-5b7e0b7e3c11:43", Lease: 30 * time.Second}
		got := make(chan error, 1)
		go func() { got <- redisson.Lock(ctx) }()
		// Redisson waits the lock's TTL (30s) unless the release message
		// wakes it.
		time.Sleep(50 * time.Millisecond)
		mustUnlock(t, ctx, held)
		select {
		case err := <-got:
			if err != nil {
				t.Fatal(err)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("Redisson's waiter was not woken by our release")
		}
		info := inspect(t, c, name)
		if len(info.Holders) != 1 || info.Holders[0].Owner != redislock.Owner(redisson.Owner) {
			t.Fatalf("holders = %+v, want Redisson's owner", info.Holders)
		}
		_, err := ours.TryLock(ctx, 0)
		wantErr(t, err, redislock.ErrWaitTimeout)
		// Our spent Hold cannot touch Redisson's hold.
		wantErr(t, held.Unlock(ctx), redislock.ErrNotHeld)
		if info := inspect(t, c, name); len(info.Holders) != 1 || info.Holders[0].Owner != redislock.Owner(redisson.Owner) || info.Holders[0].Count != 1 {
			t.Fatalf("holders after our second Unlock = %+v, want Redisson's owner once", info.Holders)
		}
		if freed, err := redisson.Unlock(ctx); err != nil || !freed {
			t.Fatalf("Redisson unlock = %v, %v", freed, err)
		}
	})

	t.Run("OurLapsedHoldLeavesRedissonsLock", func(t *testing.T) {
		name := lockName(t)
		ours := newMutex(t, c, name, &redislock.MutexOptions{Lease: 100 * time.Millisecond})
		held := mustLock(t, ctx, ours)
		waitDone(t, held.Done(), 10*time.Second, "the end of our short lease")
		redisson := &redistest.Redisson{RDB: srv.Client(t), Name: name, Owner: "7d3c0d2e-2f43-4a8e-9d0c-5b7e0b7e3c11:44", Lease: 30 * time.Second}
		waitFor(t, func() bool {
			if _, _, err := redisson.TryLock(ctx); err != nil {
				t.Fatal(err)
			}
			info := inspect(t, c, name)
			return len(info.Holders) == 1 && info.Holders[0].Owner == redislock.Owner(redisson.Owner)
		}, "Redisson to take the lock once our lease ran out")
		// Our Unlock finds Redisson's owner there and changes nothing.
		wantErr(t, held.Unlock(ctx), redislock.ErrNotOwner)
		if info := inspect(t, c, name); len(info.Holders) != 1 || info.Holders[0].Owner != redislock.Owner(redisson.Owner) || info.Holders[0].Count != 1 {
			t.Fatalf("holders after our Unlock = %+v, want Redisson's owner once", info.Holders)
		}
		if freed, err := redisson.Unlock(ctx); err != nil || !freed {
			t.Fatalf("Redisson unlock = %v, %v", freed, err)
		}
	})
}

// On a Redis 7 Cluster, Redisson waits with SSUBSCRIBE and its unlock
// publishes with SPUBLISH; lockwarden does the same there, so each side's
// release wakes the other's waiter. The fallbacks are longer than the test's
// bounds: only the messages can wake the waiters in time.
func TestRedissonShardedInterop(t *testing.T) {
	cl := redistest.StartCluster(t, 3, 0)
	ctx := testContext(t)
	c := newClient(t, cl.Client(t), redislock.Options{RetryFallback: time.Minute, QueueTTL: 2 * time.Minute})
	name := lockName(t)
	redisson := &redistest.Redisson{RDB: cl.Client(t), Name: name, Owner: "5b7e0b7e-Sharded:1", Lease: 30 * time.Second, Sharded: true}

	// Redisson holds; our waiter is woken by its SPUBLISH.
	if took, ttl, err := redisson.TryLock(ctx); err != nil || !took {
		t.Fatalf("Redisson tryLock = %v, %v", ttl, err)
	}
	got := lockInBackground(t, ctx, newMutex(t, c, name, nil))
	waitFor(t, func() bool { return len(inspect(t, c, name).Waiters) == 1 }, "our waiter to queue")
	if freed, err := redisson.Unlock(ctx); err != nil || !freed {
		t.Fatalf("Redisson unlock = %v, %v", freed, err)
	}
	held := receiveHold(t, got, 10*time.Second, "our waiter's wake-up on Redisson's sharded release")
	if held == nil {
		return
	}

	// We hold; Redisson's sharded waiter is woken by our release.
	woken := make(chan error, 1)
	go func() { woken <- redisson.Lock(ctx) }()
	time.Sleep(50 * time.Millisecond) // let it subscribe and find the lock held
	mustUnlock(t, ctx, held)
	select {
	case err := <-woken:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Redisson's sharded waiter was not woken by our release")
	}
	if freed, err := redisson.Unlock(ctx); err != nil || !freed {
		t.Fatalf("Redisson unlock = %v, %v", freed, err)
	}
}
