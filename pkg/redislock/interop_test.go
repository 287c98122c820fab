package redislock_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/lockwarden/lockwarden/internal/redistest"
	"github.com/lockwarden/lockwarden/pkg/redislock"
)

// redissonLock runs Redisson's own RLock scripts (RedissonLock
// tryLockInnerAsync and unlockInnerAsync, as quoted in the design's seed
// 001) through go-redis, and waits the way Redisson does: subscribed to the
// lock's channel, retrying on each message or after the lock's TTL.
type redissonLock struct {
	rdb   redis.UniversalClient
	name  string
	owner string // "<client UUID>:<thread id>"
	lease time.Duration
	// sharded makes it wait with SSUBSCRIBE and publish with SPUBLISH, as
	// Redisson does on a Redis 7 Cluster.
	sharded bool
}

var (
	redissonTryLock = redis.NewScript(`if ((redis.call('exists', KEYS[1]) == 0) ` +
		`or (redis.call('hexists', KEYS[1], ARGV[2]) == 1)) then ` +
		`redis.call('hincrby', KEYS[1], ARGV[2], 1); ` +
		`redis.call('pexpire', KEYS[1], ARGV[1]); ` +
		`return nil; ` +
		`end; ` +
		`return redis.call('pttl', KEYS[1]);`)
	redissonUnlock = redis.NewScript(`if (redis.call('hexists', KEYS[1], ARGV[3]) == 0) then ` +
		`return nil;` +
		`end; ` +
		`local counter = redis.call('hincrby', KEYS[1], ARGV[3], -1); ` +
		`if (counter > 0) then ` +
		`redis.call('pexpire', KEYS[1], ARGV[2]); ` +
		`return 0; ` +
		`else ` +
		`redis.call('del', KEYS[1]); ` +
		`redis.call(ARGV[4], KEYS[2], ARGV[1]); ` +
		`return 1; ` +
		`end; ` +
		`return nil;`)
)

// redissonFencedTryLock is Redisson's tryLock that also takes a fencing
// token from the lock's counter on a new acquisition, as Redisson's
// RFencedLock does. It returns {1, token} when acquired, else {0, pttl}: a
// PTTL can be 0 in a lease's last millisecond, so it cannot mean "taken".
var redissonFencedTryLock = redis.NewScript(`if ((redis.call('exists', KEYS[1]) == 0) ` +
	`or (redis.call('hexists', KEYS[1], ARGV[2]) == 1)) then ` +
	`redis.call('hincrby', KEYS[1], ARGV[2], 1); ` +
	`redis.call('pexpire', KEYS[1], ARGV[1]); ` +
	`return {1, redis.call('incr', KEYS[2])}; ` +
	`end; ` +
	`return {0, redis.call('pttl', KEYS[1])};`)

func (r *redissonLock) channel() string { return "redisson_lock__channel:{" + r.name + "}" }

// fencedLock waits as lock does, taking the lock with a fencing token. It
// returns the token and when the attempt that took the lock was sent: its
// lease started no earlier.
func (r *redissonLock) fencedLock(ctx context.Context) (int64, time.Time, error) {
	sub := r.rdb.Subscribe(ctx, r.channel())
	defer sub.Close()
	if _, err := sub.Receive(ctx); err != nil {
		return 0, time.Time{}, err
	}
	for {
		sent := time.Now()
		reply, err := redissonFencedTryLock.Run(ctx, r.rdb, []string{r.name, "redisson_lock_token:{" + r.name + "}"},
			r.lease.Milliseconds(), r.owner).Int64Slice()
		if err != nil {
			return 0, time.Time{}, err
		}
		if reply[0] == 1 {
			return reply[1], sent, nil
		}
		waitCtx, cancel := context.WithTimeout(ctx, time.Duration(max(reply[1], 1))*time.Millisecond)
		_, _ = sub.ReceiveMessage(waitCtx)
		cancel()
		if ctx.Err() != nil {
			return 0, time.Time{}, ctx.Err()
		}
	}
}

// tryLock reports whether it took the lock (Redisson's script answers nil),
// and if not the lock's PTTL, which may be 0 in a lease's last millisecond.
func (r *redissonLock) tryLock(ctx context.Context) (bool, time.Duration, error) {
	ttl, err := redissonTryLock.Run(ctx, r.rdb, []string{r.name}, r.lease.Milliseconds(), r.owner).Int64()
	if errors.Is(err, redis.Nil) {
		return true, 0, nil
	}
	return false, time.Duration(ttl) * time.Millisecond, err
}

func (r *redissonLock) lock(ctx context.Context) error {
	var sub *redis.PubSub
	if r.sharded {
		sub = r.rdb.SSubscribe(ctx, r.channel())
	} else {
		sub = r.rdb.Subscribe(ctx, r.channel())
	}
	defer sub.Close()
	if _, err := sub.Receive(ctx); err != nil { // the subscription's confirmation
		return err
	}
	for {
		took, ttl, err := r.tryLock(ctx)
		if err != nil || took {
			return err
		}
		waitCtx, cancel := context.WithTimeout(ctx, max(ttl, time.Millisecond))
		_, err = sub.ReceiveMessage(waitCtx)
		cancel()
		if ctx.Err() != nil {
			return ctx.Err()
		}
	}
}

func (r *redissonLock) unlock(ctx context.Context) (bool, error) {
	publish := "publish"
	if r.sharded {
		publish = "spublish"
	}
	n, err := redissonUnlock.Run(ctx, r.rdb, []string{r.name, r.channel()}, "0", r.lease.Milliseconds(), r.owner, publish).Int64()
	if errors.Is(err, redis.Nil) {
		return false, nil
	}
	return n == 1, err
}

func TestRedissonInterop(t *testing.T) {
	srv := redistest.Start(t)
	ctx := testContext(t)
	// A fallback longer than the test's bounds: only the release message
	// can wake our waiter in time.
	c := newClient(t, srv.Client(t), redislock.Options{RetryFallback: time.Minute})

	t.Run("RedissonExcludesAndWakesUs", func(t *testing.T) {
		name := lockName(t)
		redisson := &redissonLock{rdb: srv.Client(t), name: name, owner: "7d3c0d2e-2f43-4a8e-9d0c-5b7e0b7e3c11:42", lease: 30 * time.Second}
		if took, _, err := redisson.tryLock(ctx); err != nil || !took {
			t.Fatalf("Redisson tryLock = %v, %v", took, err)
		}
		ours := newMutex(t, c, name, nil)
		_, err := ours.TryLock(ctx, 0)
		wantErr(t, err, redislock.ErrWaitTimeout)

		got := lockInBackground(t, ctx, ours)
		waitFor(t, func() bool { return len(inspect(t, c, name).Waiters) == 1 }, "our waiter to queue")
		if freed, err := redisson.unlock(ctx); err != nil || !freed {
			t.Fatalf("Redisson unlock = %v, %v", freed, err)
		}
		held := receiveHold(t, got, 10*time.Second, "our waiter's wake-up on Redisson's release")
		if held == nil {
			return
		}
		if took, ttl, err := redisson.tryLock(ctx); err != nil || took {
			t.Fatalf("Redisson tryLock while we hold = %v (TTL %v), %v; want excluded", took, ttl, err)
		}
		mustUnlock(t, ctx, held)
	})

	t.Run("WeExcludeAndWakeRedisson", func(t *testing.T) {
		name := lockName(t)
		ours := newMutex(t, c, name, nil)
		held := mustLock(t, ctx, ours)
		redisson := &redissonLock{rdb: srv.Client(t), name: name, owner: "7d3c0d2e-2f43-4a8e-9d0c-5b7e0b7e3c11:43", lease: 30 * time.Second}
		got := make(chan error, 1)
		go func() { got <- redisson.lock(ctx) }()
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
		if len(info.Holders) != 1 || info.Holders[0].Owner != redislock.Owner(redisson.owner) {
			t.Fatalf("holders = %+v, want Redisson's owner", info.Holders)
		}
		_, err := ours.TryLock(ctx, 0)
		wantErr(t, err, redislock.ErrWaitTimeout)
		// Our spent Hold cannot touch Redisson's hold.
		wantErr(t, held.Unlock(ctx), redislock.ErrNotHeld)
		if info := inspect(t, c, name); len(info.Holders) != 1 || info.Holders[0].Owner != redislock.Owner(redisson.owner) || info.Holders[0].Count != 1 {
			t.Fatalf("holders after our second Unlock = %+v, want Redisson's owner once", info.Holders)
		}
		if freed, err := redisson.unlock(ctx); err != nil || !freed {
			t.Fatalf("Redisson unlock = %v, %v", freed, err)
		}
	})

	t.Run("OurLapsedHoldLeavesRedissonsLock", func(t *testing.T) {
		name := lockName(t)
		ours := newMutex(t, c, name, &redislock.MutexOptions{Lease: 100 * time.Millisecond})
		held := mustLock(t, ctx, ours)
		waitDone(t, held.Done(), 10*time.Second, "the end of our short lease")
		redisson := &redissonLock{rdb: srv.Client(t), name: name, owner: "7d3c0d2e-2f43-4a8e-9d0c-5b7e0b7e3c11:44", lease: 30 * time.Second}
		waitFor(t, func() bool {
			if _, _, err := redisson.tryLock(ctx); err != nil {
				t.Fatal(err)
			}
			info := inspect(t, c, name)
			return len(info.Holders) == 1 && info.Holders[0].Owner == redislock.Owner(redisson.owner)
		}, "Redisson to take the lock once our lease ran out")
		// Our Unlock finds Redisson's owner there and changes nothing.
		wantErr(t, held.Unlock(ctx), redislock.ErrNotOwner)
		if info := inspect(t, c, name); len(info.Holders) != 1 || info.Holders[0].Owner != redislock.Owner(redisson.owner) || info.Holders[0].Count != 1 {
			t.Fatalf("holders after our Unlock = %+v, want Redisson's owner once", info.Holders)
		}
		if freed, err := redisson.unlock(ctx); err != nil || !freed {
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
	redisson := &redissonLock{rdb: cl.Client(t), name: name, owner: "5b7e0b7e-sharded:1", lease: 30 * time.Second, sharded: true}

	// Redisson holds; our waiter is woken by its SPUBLISH.
	if took, ttl, err := redisson.tryLock(ctx); err != nil || !took {
		t.Fatalf("Redisson tryLock = %v, %v", ttl, err)
	}
	got := lockInBackground(t, ctx, newMutex(t, c, name, nil))
	waitFor(t, func() bool { return len(inspect(t, c, name).Waiters) == 1 }, "our waiter to queue")
	if freed, err := redisson.unlock(ctx); err != nil || !freed {
		t.Fatalf("Redisson unlock = %v, %v", freed, err)
	}
	held := receiveHold(t, got, 10*time.Second, "our waiter's wake-up on Redisson's sharded release")
	if held == nil {
		return
	}

	// We hold; Redisson's sharded waiter is woken by our release.
	woken := make(chan error, 1)
	go func() { woken <- redisson.lock(ctx) }()
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
	if freed, err := redisson.unlock(ctx); err != nil || !freed {
		t.Fatalf("Redisson unlock = %v, %v", freed, err)
	}
}
