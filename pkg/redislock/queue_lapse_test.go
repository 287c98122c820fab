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

// A crashed waiter costs nothing but its own lapse time: nobody behind its
// queue entry spins, and nobody sleeps through a release.

// deadWaiter queues a Lock of name through a proxy, then cuts the proxy, as
// a pod that hung or lost its network would: its queue entry stays in
// Redis, unrefreshed, until it lapses after queueTTL. It returns once the
// entry is in the queue; the Lock gives up at the test's end.
func deadWaiter(t *testing.T, srv *redistest.Server, name string, queueTTL time.Duration) {
	t.Helper()
	p := redistest.StartProxy(t, srv.Addr)
	rdb := redis.NewClient(&redis.Options{Addr: p.Addr, MaxRetries: -1, ReadTimeout: 200 * time.Millisecond, WriteTimeout: 200 * time.Millisecond})
	t.Cleanup(func() { _ = rdb.Close() })
	c := newClient(t, rdb, redislock.Options{RetryFallback: queueTTL / 3, QueueTTL: queueTTL})
	queue := srv.Client(t)
	before := queue.ZCard(context.Background(), queuePrefix+"{"+name+"}").Val()
	ctx, cancel := context.WithCancel(context.Background())
	done := lockAsync(ctx, newMutex(t, c, name, nil))
	t.Cleanup(func() {
		cancel()
		<-done
	})
	waitFor(t, func() bool { return queue.ZCard(context.Background(), queuePrefix+"{"+name+"}").Val() > before }, "the waiter to queue")
	p.Cut()
}

// queuePrefix is the prefix of a lock's wait queue key.
const queuePrefix = "lockwarden_lock_queue:"

// acquireCounter counts a client's acquire script calls.
type acquireCounter struct{ n atomic.Int64 }

func (a *acquireCounter) DialHook(next redis.DialHook) redis.DialHook { return next }
func (a *acquireCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if kind, _ := redislock.ScriptCall(cmd.Args()); kind == "acquire" {
			a.n.Add(1)
		}
		return next(ctx, cmd)
	}
}
func (a *acquireCounter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// acquireGate holds a client's acquire script calls back while closed.
type acquireGate struct {
	mu   sync.Mutex
	shut chan struct{} // nil while open
}

func (g *acquireGate) close() {
	g.mu.Lock()
	g.shut = make(chan struct{})
	g.mu.Unlock()
}

func (g *acquireGate) open() {
	g.mu.Lock()
	if g.shut != nil {
		close(g.shut)
		g.shut = nil
	}
	g.mu.Unlock()
}

func (g *acquireGate) DialHook(next redis.DialHook) redis.DialHook { return next }
func (g *acquireGate) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if kind, _ := redislock.ScriptCall(cmd.Args()); kind == "acquire" {
			g.mu.Lock()
			shut := g.shut
			g.mu.Unlock()
			if shut != nil {
				<-shut
			}
		}
		return next(ctx, cmd)
	}
}
func (g *acquireGate) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// A waiter second in line behind a waiter that died while queued sleeps as
// it would behind a live one: once the dead entry has lapsed, it heads the
// queue, and waits for the release. (It ran acquire.lua thousands of times
// while the holder kept the lock: the lapsed entry ahead told it to retry
// at once, again and again.)
func TestAWaiterBehindADeadOneDoesNotSpin(t *testing.T) {
	srv := redistest.Start(t)
	ctx := testContext(t)
	name := lockName(t)
	holder := newClient(t, srv.Client(t), redislock.Options{})
	h := mustLock(t, ctx, newMutex(t, holder, name, nil))
	deadWaiter(t, srv, name, 2*time.Second)

	rdb := srv.Client(t)
	counter := &acquireCounter{}
	rdb.AddHook(counter)
	live := newClient(t, rdb, redislock.Options{})
	waiting := lockAsync(ctx, newMutex(t, live, name, nil))
	queue := queuePrefix + "{" + name + "}"
	waitFor(t, func() bool { return srv.Client(t).ZCard(ctx, queue).Val() == 2 }, "the live waiter to queue behind the dead one")
	// The dead entry lapses within 2 s; the waiter then heads the queue for
	// 3 s more.
	waitFor(t, func() bool { return len(inspect(t, holder, name).Waiters) == 1 }, "the dead entry to lapse")
	time.Sleep(3 * time.Second)
	mustUnlock(t, ctx, h)
	r := <-waiting
	if r.err != nil {
		t.Fatal(r.err)
	}
	mustUnlock(t, ctx, r.h)
	// Its first attempt, one when the entry ahead lapses, one a second
	// (RetryFallback) or so, and the hand-over's: about eight.
	if n := counter.n.Load(); n > 16 {
		t.Fatalf("the waiter behind a dead one ran %d acquire scripts while it waited, want a handful", n)
	}
	t.Logf("%d acquire scripts in all behind a dead waiter", counter.n.Load())
}

// A waiter behind two waiters that died while queued acts on the release
// message of a Redisson holder as soon as it comes, as the head of the queue
// would: it learned, from the attempt it made when the entries ahead of it
// lapsed, that it heads the queue.
func TestAWaiterBehindTwoDeadOnesHearsARedissonRelease(t *testing.T) {
	srv := redistest.Start(t)
	ctx := testContext(t)
	name := lockName(t)
	redisson := &redistest.Redisson{RDB: srv.Client(t), Name: name, Owner: "java-service:1", Lease: time.Minute}
	if err := redisson.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	// A long fallback: a waiter that sleeps through the release is not
	// rescued by a poll within the test.
	live := newClient(t, srv.Client(t), redislock.Options{RetryFallback: 10 * time.Second})
	deadWaiter(t, srv, name, 2*time.Second)
	deadWaiter(t, srv, name, 2*time.Second)
	waiting := lockAsync(ctx, newMutex(t, live, name, nil))
	queue := queuePrefix + "{" + name + "}"
	waitFor(t, func() bool { return srv.Client(t).ZCard(ctx, queue).Val() == 3 }, "the live waiter to queue behind the dead ones")
	waitFor(t, func() bool { return len(inspect(t, live, name).Waiters) == 1 }, "both dead entries to lapse")
	time.Sleep(100 * time.Millisecond) // the waiter's attempt once they lapsed
	released := time.Now()
	if ok, err := redisson.Unlock(ctx); err != nil || !ok {
		t.Fatalf("Redisson's unlock = %v, %v", ok, err)
	}
	took := tookAfter(t, ctx, released, waiting)
	if took > time.Second {
		t.Fatalf("the waiter behind two dead ones took the lock %v after the Redisson release, want it at once", took)
	}
	t.Logf("took the lock %v after the Redisson release", took.Round(time.Millisecond))
}

// A release that races (a Redisson holder was seen lately) puts its sole
// waiter back in a queue that still expires: a waiter that dies then leaves
// no key behind for ever.
func TestARaceReleaseKeepsTheQueueExpiring(t *testing.T) {
	srv := redistest.Start(t)
	ctx := testContext(t)
	name := lockName(t)
	direct := srv.Client(t)
	redisson := &redistest.Redisson{RDB: srv.Client(t), Name: name, Owner: "java-service:1", Lease: time.Minute}
	if err := redisson.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	first := newClient(t, srv.Client(t), redislock.Options{})
	waitingFirst := lockAsync(ctx, newMutex(t, first, name, nil))
	waitQueued(t, first, name, 1) // seen the Redisson holder: releases race for 10 s
	if ok, err := redisson.Unlock(ctx); err != nil || !ok {
		t.Fatalf("Redisson's unlock = %v, %v", ok, err)
	}
	r := <-waitingFirst
	if r.err != nil {
		t.Fatal(r.err)
	}
	secondRedis := srv.Client(t)
	held := &acquireGate{}
	secondRedis.AddHook(held)
	second := newClient(t, secondRedis, redislock.Options{})
	waitingSecond := lockAsync(ctx, newMutex(t, second, name, nil))
	waitQueued(t, first, name, 1)

	held.close() // the waiter does not take the lock before the check
	mustUnlock(t, ctx, r.h)
	queue := queuePrefix + "{" + name + "}"
	// Within ten seconds of a Redisson holder, owed no turn, the release
	// races: the waiter is back in the queue, not handed the lock.
	if n, err := direct.ZCard(ctx, queue).Result(); err != nil || n != 1 {
		t.Fatalf("after the release the queue holds %d, %v; want the racing waiter", n, err)
	}
	if ttl, err := direct.PTTL(ctx, queue).Result(); err != nil || ttl < 0 {
		t.Fatalf("after a race release the wait queue's expiry is %v, %v: a waiter that dies now leaves it for ever", ttl, err)
	}
	held.open()
	s := <-waitingSecond
	if s.err != nil {
		t.Fatal(s.err)
	}
	mustUnlock(t, ctx, s.h)
}
