package redislock_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/lockwarden/lockwarden/pkg/redislock"
)

// The release that frees a lock hands it to the head of the wait queue: these
// tests cover the hand-over, the short lease it grants and its extension, a
// hand-over to a waiter that has died, and several calls of one owner
// waiting at once.

// testHandOver: the waiter holds the lock as soon as the holder unlocks, with
// a new, higher token, and without sending another acquire.
func testHandOver(t *testing.T, b backend) {
	ctx := testContext(t)
	// No fallback retry within the test: the waiter's only news is the
	// hand-over's notice.
	opts := redislock.Options{RetryFallback: time.Minute}
	holderClient := newClient(t, b.newRedis(t), opts)
	waiterRedis := b.newRedis(t)
	evals := &evalCounter{}
	waiterRedis.AddHook(evals)
	waiterClient := newClient(t, waiterRedis, opts)
	name := lockName(t)
	holder := newMutex(t, holderClient, name, nil)
	waiter := newMutex(t, waiterClient, name, nil)
	held := mustLock(t, ctx, holder)

	got := lockInBackground(t, ctx, waiter)
	// The waiter queues, subscribes, and tries once more now that it
	// listens: two acquires, then it sleeps.
	waitFor(t, func() bool { return len(inspect(t, holderClient, name).Waiters) == 1 && evals.count() == 2 }, "the waiter to queue and listen")
	mustUnlock(t, ctx, holder)

	var l *redislock.Lease
	select {
	case l = <-got:
	case <-time.After(10 * time.Second):
		t.Fatal("the waiter did not get the lock within 10s of the release")
	}
	if l == nil {
		return
	}
	if n := evals.count(); n != 2 {
		t.Fatalf("the waiter sent %d acquires, want 2: the hand-over should need none", n)
	}
	if l.Token() <= held.Token() {
		t.Fatalf("hand-over token %d is not above the previous %d", l.Token(), held.Token())
	}
	info := inspect(t, holderClient, name)
	if len(info.Holders) != 1 || info.Holders[0].Owner != waiter.Owner() || info.Holders[0].Count != 1 || info.Token != l.Token() {
		t.Fatalf("after the hand-over the lock is %+v, want held once by %s with token %d", info, waiter.Owner(), l.Token())
	}
	mustUnlock(t, ctx, waiter)
	if inspect(t, holderClient, name).Held() {
		t.Fatal("the lock is still held after the waiter's Unlock")
	}
}

// testHandOverExtended: a hand-over grants at most the releasing client's
// QueueTTL; the new holder extends it to its full lease, watchdog or fixed,
// and keeps the lock well past the short grant.
func testHandOverExtended(t *testing.T, b backend) {
	for _, tc := range []struct {
		name  string
		lease time.Duration // 0: watchdog
	}{{"Watchdog", 0}, {"FixedLease", 5 * time.Second}} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := testContext(t)
			const grant = 300 * time.Millisecond
			holderClient := newClient(t, b.newRedis(t), redislock.Options{QueueTTL: grant})
			waiterClient := newClient(t, b.newRedis(t), redislock.Options{WatchdogLease: 5 * time.Second})
			name := lockName(t)
			holder := newMutex(t, holderClient, name, nil)
			waiter := newMutex(t, waiterClient, name, &redislock.MutexOptions{Lease: tc.lease})
			mustLock(t, ctx, holder)

			got := lockInBackground(t, ctx, waiter)
			waitFor(t, func() bool { return len(inspect(t, holderClient, name).Waiters) == 1 }, "the waiter to queue")
			mustUnlock(t, ctx, holder)
			l := <-got
			if l == nil {
				return
			}
			if ttl := inspect(t, holderClient, name).TTL; ttl > 5*time.Second {
				t.Fatalf("TTL after the hand-over = %v, above the full lease", ttl)
			}
			// Three short grants later, the waiter still holds the lock.
			time.Sleep(3 * grant)
			wantStillHolding(t, holderClient, waiter, l, grant)
			mustUnlock(t, ctx, waiter)
		})
	}
}

// testStaleHandOver: a hand-over whose short grant may have mostly run out
// by the time its notice is read (the waiter's last attempt is older than a
// third of it) is taken with an attempt that renews the full lease.
func testStaleHandOver(t *testing.T, b backend) {
	ctx := testContext(t)
	const grant = 30 * time.Millisecond
	holderClient := newClient(t, b.newRedis(t), redislock.Options{QueueTTL: grant})
	waiterClient := newClient(t, b.newRedis(t), redislock.Options{RetryFallback: time.Minute})
	name := lockName(t)
	holder := newMutex(t, holderClient, name, nil)
	waiter := newMutex(t, waiterClient, name, nil)
	mustLock(t, ctx, holder)

	got := lockInBackground(t, ctx, waiter)
	waitFor(t, func() bool { return len(inspect(t, holderClient, name).Waiters) == 1 }, "the waiter to queue")
	time.Sleep(5 * grant) // the waiter's last attempt is now older than the grant
	mustUnlock(t, ctx, holder)
	l := <-got
	if l == nil {
		return
	}
	time.Sleep(5 * grant)
	wantStillHolding(t, holderClient, waiter, l, time.Second) // the full lease, not the grant
	mustUnlock(t, ctx, waiter)
}

// testHandOverToDeadWaiter: a waiter whose client is gone without leaving
// the queue (a crashed process) still gets the lock handed over, but only
// for the short grant; the waiter behind it gets the lock after that.
func testHandOverToDeadWaiter(t *testing.T, b backend) {
	ctx := testContext(t)
	const grant = 500 * time.Millisecond
	holderClient := newClient(t, b.newRedis(t), redislock.Options{QueueTTL: grant})
	name := lockName(t)
	holder := newMutex(t, holderClient, name, nil)
	mustLock(t, ctx, holder)

	// The dead waiter: it queues, then its client closes, which leaves the
	// queue entry behind (Close does not clean up, as a crash would not).
	deadClient, err := redislock.New(b.newRedis(t), redislock.Options{QueueTTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	dead := newMutex(t, deadClient, name, nil)
	deadDone := make(chan error, 1)
	go func() {
		_, err := dead.Lock(ctx)
		deadDone <- err
	}()
	waitFor(t, func() bool { return len(inspect(t, holderClient, name).Waiters) == 1 }, "the dead waiter to queue")
	_ = deadClient.Close()
	wantErr(t, <-deadDone, redislock.ErrClosed)

	// A live waiter queues behind it.
	live := newMutex(t, newClient(t, b.newRedis(t), redislock.Options{}), name, nil)
	got := make(chan struct{})
	go func() {
		defer close(got)
		if _, err := live.Lock(ctx); err != nil {
			t.Errorf("live waiter: %v", err)
		}
	}()
	waitFor(t, func() bool { return len(inspect(t, holderClient, name).Waiters) == 2 }, "the live waiter to queue")

	mustUnlock(t, ctx, holder)
	info := inspect(t, holderClient, name)
	if info.Held() && (info.Holders[0].Owner != dead.Owner() || info.TTL > grant) {
		t.Fatalf("after the release the lock is %+v, want handed to the dead waiter %s for at most %v", info, dead.Owner(), grant)
	}
	waitDone(t, got, 10*time.Second, "the live waiter to get the lock once the dead waiter's grant ran out")
	mustUnlock(t, ctx, live)
}

// testSameOwnerWaiting: two calls of one owner wait for a lock held by
// another; once it is released, both hold it, as two levels of one hold.
func testSameOwnerWaiting(t *testing.T, b backend) {
	ctx := testContext(t)
	c := newClient(t, b.newRedis(t), redislock.Options{RetryFallback: time.Minute})
	name := lockName(t)
	holder := newMutex(t, c, name, nil)
	mustLock(t, ctx, holder)

	m := newMutex(t, c, name, nil)
	ownerCtx := redislock.WithOwner(ctx, c.NewOwner())
	var wg sync.WaitGroup
	tokens := make([]int64, 2)
	for i := range tokens {
		wg.Add(1)
		go func() {
			defer wg.Done()
			l, err := m.Lock(ownerCtx)
			if err != nil {
				t.Errorf("call %d: %v", i, err)
				return
			}
			tokens[i] = l.Token()
		}()
	}
	waitFor(t, func() bool { return len(inspect(t, c, name).Waiters) == 1 }, "the owner to queue")
	mustUnlock(t, ctx, holder)
	wg.Wait()
	if tokens[0] == 0 || tokens[0] != tokens[1] {
		t.Fatalf("the two calls got tokens %v, want one token", tokens)
	}
	owner, _ := redislock.OwnerFromContext(ownerCtx)
	if info := inspect(t, c, name); len(info.Holders) != 1 || info.Holders[0].Owner != owner || info.Holders[0].Count != 2 {
		t.Fatalf("the lock is %+v, want held twice by %s", info, owner)
	}
	mustUnlock(t, ownerCtx, m)
	mustUnlock(t, ownerCtx, m)
	if inspect(t, c, name).Held() {
		t.Fatal("the lock is still held after both Unlocks")
	}
}

// lockInBackground runs m.Lock on its own goroutine and sends the lease, or
// nil after reporting the error.
func lockInBackground(t *testing.T, ctx context.Context, m *redislock.Mutex) <-chan *redislock.Lease {
	got := make(chan *redislock.Lease, 1)
	go func() {
		l, err := m.Lock(ctx)
		if err != nil {
			t.Errorf("%s: Lock: %v", m.Owner(), err)
		}
		got <- l
	}()
	return got
}

// wantStillHolding fails the test unless m's owner alone holds the lock in
// Redis with more than minTTL left, and its lease l has not ended.
func wantStillHolding(t *testing.T, c *redislock.Client, m *redislock.Mutex, l *redislock.Lease, minTTL time.Duration) {
	t.Helper()
	info := inspect(t, c, m.Name())
	if len(info.Holders) != 1 || info.Holders[0].Owner != m.Owner() || info.TTL <= minTTL {
		t.Fatalf("the lock is %+v, want held by %s with more than %v left", info, m.Owner(), minTTL)
	}
	if err := l.Err(); err != nil {
		t.Fatalf("lease ended: %v", err)
	}
}

// evalCounter is a go-redis hook that counts EVALSHA and EVAL calls.
type evalCounter struct{ n atomic.Int64 }

func (e *evalCounter) DialHook(next redis.DialHook) redis.DialHook { return next }

func (e *evalCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if name := cmd.Name(); name == "evalsha" || name == "eval" {
			e.n.Add(1)
		}
		return next(ctx, cmd)
	}
}

func (e *evalCounter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

func (e *evalCounter) count() int64 { return e.n.Load() }
