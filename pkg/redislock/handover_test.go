package redislock_test

import (
	"context"
	"net"
	"sync"
	"sync/atomic"
	"syscall"
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
	waiterClient, evals := countedClient(t, b, opts)
	name := lockName(t)
	holder := newMutex(t, holderClient, name, nil)
	waiter := newMutex(t, waiterClient, name, nil)
	held := mustLock(t, ctx, holder)

	got := lockInBackground(t, ctx, waiter)
	// The waiter tries take.lua, queues with acquire.lua, subscribes, and
	// tries once more now that it listens: three attempts, then it sleeps.
	waitFor(t, func() bool { return len(inspect(t, holderClient, name).Waiters) == 1 && evals.count() == 3 }, "the waiter to queue and listen")
	mustUnlock(t, ctx, held)

	var l *redislock.Hold
	select {
	case l = <-got:
	case <-time.After(10 * time.Second):
		t.Fatal("the waiter did not get the lock within 10s of the release")
	}
	if l == nil {
		return
	}
	if n := evals.count(); n != 3 {
		t.Fatalf("the waiter sent %d acquires, want 3: the hand-over should need none", n)
	}
	if l.Token() <= held.Token() {
		t.Fatalf("hand-over token %d is not above the previous %d", l.Token(), held.Token())
	}
	info := inspect(t, holderClient, name)
	if len(info.Holders) != 1 || info.Holders[0].Owner != l.Owner() || info.Holders[0].Count != 1 || info.Token != l.Token() {
		t.Fatalf("after the hand-over the lock is %+v, want held once by %s with token %d", info, l.Owner(), l.Token())
	}
	mustUnlock(t, ctx, l)
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
			// QueueTTL must exceed 1.2 × RetryFallback.
			holderClient := newClient(t, b.newRedis(t), redislock.Options{QueueTTL: grant, RetryFallback: grant / 2})
			waiterClient := newClient(t, b.newRedis(t), redislock.Options{WatchdogLease: 5 * time.Second})
			name := lockName(t)
			holder := newMutex(t, holderClient, name, nil)
			waiter := newMutex(t, waiterClient, name, &redislock.MutexOptions{Lease: tc.lease})
			held := mustLock(t, ctx, holder)

			got := lockInBackground(t, ctx, waiter)
			waitFor(t, func() bool { return len(inspect(t, holderClient, name).Waiters) == 1 }, "the waiter to queue")
			mustUnlock(t, ctx, held)
			l := <-got
			if l == nil {
				return
			}
			if ttl := inspect(t, holderClient, name).TTL; ttl > 5*time.Second {
				t.Fatalf("TTL after the hand-over = %v, above the full lease", ttl)
			}
			// Three short grants later, the waiter still holds the lock.
			time.Sleep(3 * grant)
			wantStillHolding(t, holderClient, l, grant)
			mustUnlock(t, ctx, l)
		})
	}
}

// testStaleHandOver: a hand-over whose short grant may have mostly run out
// by the time its notice is read (the waiter's last attempt is older than a
// third of it) is taken with an attempt that renews the full lease.
func testStaleHandOver(t *testing.T, b backend) {
	ctx := testContext(t)
	const grant = 30 * time.Millisecond
	// QueueTTL must exceed 1.2 × RetryFallback.
	holderClient := newClient(t, b.newRedis(t), redislock.Options{QueueTTL: grant, RetryFallback: grant / 2})
	waiterClient := newClient(t, b.newRedis(t), redislock.Options{RetryFallback: time.Minute})
	name := lockName(t)
	holder := newMutex(t, holderClient, name, nil)
	waiter := newMutex(t, waiterClient, name, nil)
	held := mustLock(t, ctx, holder)

	got := lockInBackground(t, ctx, waiter)
	waitFor(t, func() bool { return len(inspect(t, holderClient, name).Waiters) == 1 }, "the waiter to queue")
	time.Sleep(5 * grant) // the waiter's last attempt is now older than the grant
	mustUnlock(t, ctx, held)
	l := <-got
	if l == nil {
		return
	}
	time.Sleep(5 * grant)
	wantStillHolding(t, holderClient, l, time.Second) // the full lease, not the grant
	mustUnlock(t, ctx, l)
}

// testHandOverToDeadWaiter: a waiter whose process died without leaving the
// queue (a crash) still gets the lock handed over, but only for the short
// grant, its own QueueTTL; the waiter behind it gets the lock after that.
func testHandOverToDeadWaiter(t *testing.T, b backend) {
	ctx := testContext(t)
	const grant = 2 * time.Second
	holderClient := newClient(t, b.newRedis(t), redislock.Options{})
	name := lockName(t)
	held := mustLock(t, ctx, newMutex(t, holderClient, name, nil))

	// The dead waiter: it queues, then its process loses Redis for good and
	// its client closes. Close would take a live waiter out of the queue;
	// this one cannot reach Redis, so its entry stays behind, as a crash
	// would leave it.
	deadRedis := b.newRedis(t)
	crash, evals := &crasher{}, &evalCounter{}
	deadRedis.AddHook(crash)
	deadRedis.AddHook(evals)
	deadClient, err := redislock.New(deadRedis, redislock.Options{QueueTTL: grant})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = deadClient.Close() })
	dead := newMutex(t, deadClient, name, nil)
	deadDone := make(chan error, 1)
	go func() {
		_, err := dead.Lock(ctx)
		deadDone <- err
	}()
	// It tries take.lua, queues, subscribes and tries once more: then it
	// sleeps, waiting.
	waitFor(t, func() bool { return len(inspect(t, holderClient, name).Waiters) == 1 && evals.count() == 3 }, "the dead waiter to queue and listen")
	deadOwner := inspect(t, holderClient, name).Waiters[0]
	crash.crash()
	_ = deadClient.Close()
	wantErr(t, <-deadDone, redislock.ErrClosed)
	if w := inspect(t, holderClient, name).Waiters; len(w) != 1 || w[0] != deadOwner {
		t.Fatalf("waiters after the dead waiter's client closed = %v, want its entry %s left behind", w, deadOwner)
	}

	// A live waiter queues behind it.
	live := newMutex(t, newClient(t, b.newRedis(t), redislock.Options{}), name, nil)
	got := lockInBackground(t, ctx, live)
	waitFor(t, func() bool { return len(inspect(t, holderClient, name).Waiters) == 2 }, "the live waiter to queue")

	mustUnlock(t, ctx, held)
	info := inspect(t, holderClient, name)
	if info.Held() && (info.Holders[0].Owner != deadOwner || info.TTL > grant) {
		t.Fatalf("after the release the lock is %+v, want handed to the dead waiter %s for at most %v", info, deadOwner, grant)
	}
	if l := receiveHold(t, got, 10*time.Second, "the live waiter to get the lock once the dead waiter's grant ran out"); l != nil {
		mustUnlock(t, ctx, l)
	}
}

// crasher is a go-redis hook that, once crash is called, fails every
// command without sending it, as if the process had lost Redis for good.
type crasher struct{ crashed atomic.Bool }

func (c *crasher) crash() { c.crashed.Store(true) }

func (c *crasher) DialHook(next redis.DialHook) redis.DialHook { return next }

func (c *crasher) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if c.crashed.Load() {
			err := &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}
			cmd.SetErr(err)
			return err
		}
		return next(ctx, cmd)
	}
}

func (c *crasher) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if c.crashed.Load() {
			err := &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}
			for _, cmd := range cmds {
				cmd.SetErr(err)
			}
			return err
		}
		return next(ctx, cmds)
	}
}

// testSameOwnerWaiting: two calls of one owner wait for a lock held by
// another; once it is released, both hold it, as two levels of one hold.
func testSameOwnerWaiting(t *testing.T, b backend) {
	ctx := testContext(t)
	c := newClient(t, b.newRedis(t), redislock.Options{RetryFallback: time.Minute})
	name := lockName(t)
	held := mustLock(t, ctx, newMutex(t, c, name, nil))

	owner := c.NewOwner()
	m := newMutex(t, c, name, &redislock.MutexOptions{Owner: owner})
	ownerCtx := ctx
	var wg sync.WaitGroup
	holds := make([]*redislock.Hold, 2)
	for i := range holds {
		wg.Add(1)
		go func() {
			defer wg.Done()
			l, err := m.Lock(ownerCtx)
			if err != nil {
				t.Errorf("call %d: %v", i, err)
				return
			}
			holds[i] = l
		}()
	}
	waitFor(t, func() bool { return len(inspect(t, c, name).Waiters) == 1 }, "the owner to queue")
	mustUnlock(t, ctx, held)
	wg.Wait()
	if holds[0] == nil || holds[1] == nil {
		return
	}
	if holds[0].Token() == 0 || holds[0].Token() != holds[1].Token() {
		t.Fatalf("the two calls got tokens %d and %d, want one token", holds[0].Token(), holds[1].Token())
	}
	if info := inspect(t, c, name); len(info.Holders) != 1 || info.Holders[0].Owner != owner || info.Holders[0].Count != 2 {
		t.Fatalf("the lock is %+v, want held twice by %s", info, owner)
	}
	mustUnlock(t, ownerCtx, holds[0])
	if info := inspect(t, c, name); len(info.Holders) != 1 || info.Holders[0].Count != 1 || holds[1].Err() != nil {
		t.Fatalf("after one Unlock the lock is %+v (the other Hold's error: %v), want held once", info, holds[1].Err())
	}
	mustUnlock(t, ownerCtx, holds[1])
	if inspect(t, c, name).Held() {
		t.Fatal("the lock is still held after both Unlocks")
	}
}

// lockInBackground runs m.Lock on its own goroutine and sends the Hold, or
// nil after reporting the error.
func lockInBackground(t *testing.T, ctx context.Context, m *redislock.Mutex) <-chan *redislock.Hold {
	got := make(chan *redislock.Hold, 1)
	go func() {
		l, err := m.Lock(ctx)
		if err != nil {
			t.Errorf("%s: Lock: %v", m.Name(), err)
		}
		got <- l
	}()
	return got
}

// wantStillHolding fails the test unless l's owner alone holds the lock in
// Redis with more than minTTL left, and l has not ended.
func wantStillHolding(t *testing.T, c *redislock.Client, l *redislock.Hold, minTTL time.Duration) {
	t.Helper()
	info := inspect(t, c, l.Name())
	if len(info.Holders) != 1 || info.Holders[0].Owner != l.Owner() || info.TTL <= minTTL {
		t.Fatalf("the lock is %+v, want held by %s with more than %v left", info, l.Owner(), minTTL)
	}
	if err := l.Err(); err != nil {
		t.Fatalf("lease ended: %v", err)
	}
}

// countedClient returns a Client whose lock script calls are counted.
func countedClient(t *testing.T, b backend, opts redislock.Options) (*redislock.Client, *evalCounter) {
	rdb := b.newRedis(t)
	evals := &evalCounter{}
	rdb.AddHook(evals)
	return newClient(t, rdb, opts), evals
}

// evalCounter is a go-redis hook that counts the lock scripts' calls.
type evalCounter struct{ n atomic.Int64 }

func (e *evalCounter) DialHook(next redis.DialHook) redis.DialHook { return next }

func (e *evalCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if kind, _ := redislock.ScriptCall(cmd.Args()); kind != "" {
			e.n.Add(1)
		}
		return next(ctx, cmd)
	}
}

func (e *evalCounter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

func (e *evalCounter) count() int64 { return e.n.Load() }

// extraAttempts hands the lock n times from holder to waiter, queued
// behind it and given time to subscribe, and returns how many scripts the
// waiter's client (counted by evals) ran from each release until its Lock
// returned, summed: a hand-over needs none, a race at least one.
func extraAttempts(t *testing.T, ctx context.Context, n int, admin *redislock.Client, holder, waiter *redislock.Mutex, evals *evalCounter) int64 {
	t.Helper()
	extra := int64(0)
	for range n {
		held := mustLock(t, ctx, holder)
		got := lockAsync(ctx, waiter)
		waitFor(t, func() bool { return len(inspect(t, admin, holder.Name()).Waiters) == 1 }, "the waiter to queue")
		time.Sleep(100 * time.Millisecond)
		queued := evals.count()
		mustUnlock(t, ctx, held)
		r := <-got
		if r.err != nil {
			t.Fatal(r.err)
		}
		extra += evals.count() - queued
		mustUnlock(t, ctx, r.h)
	}
	return extra
}
