package redislock_test

import (
	"context"
	"errors"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/lockwarden/lockwarden/internal/redistest"
	"github.com/lockwarden/lockwarden/pkg/redislock"
)

// Cases an adversarial review of the lost-reply work found: each broke the
// one-holder promise, or kept a lock held for good, before its fix.

// proxiedRedis is a go-redis client through p, closed at cleanup.
func proxiedRedis(t *testing.T, p *redistest.Proxy) *redis.Client {
	t.Helper()
	rdb := redis.NewClient(&redis.Options{Addr: p.Addr})
	t.Cleanup(func() { _ = rdb.Close() })
	return rdb
}

// lockResult is what a Lock in the background returned.
type lockResult struct {
	h   *redislock.Hold
	err error
}

// lockAsync locks m in the background, and reports what Lock returned.
func lockAsync(ctx context.Context, m *redislock.Mutex) <-chan lockResult {
	ch := make(chan lockResult, 1)
	go func() {
		h, err := m.Lock(ctx)
		ch <- lockResult{h, err}
	}()
	return ch
}

// tookAfter waits for a waiter's Lock, unlocks what it took, and returns
// how long after since it took it.
func tookAfter(t *testing.T, ctx context.Context, since time.Time, waiting <-chan lockResult) time.Duration {
	t.Helper()
	r := <-waiting
	if r.err != nil {
		t.Fatal(r.err)
	}
	took := time.Since(since)
	mustUnlock(t, ctx, r.h)
	return took
}

// Found in review (a second holder): a Lock and a TryLock of one owner
// (MutexOptions.Owner) in one client. The Lock queues; the lock comes free
// without a hand-over (the holder's lease ran out). The TryLock took it, and
// the grant record the queued call's turn wrote let that call's leave undo
// the TryLock's hold. A TryLock(ctx, 0) still takes a free lock ahead of the
// queue (case 13 of issue 21), but the level it takes is its own call's:
// the queued call's leave cannot undo it.
func TestTryLockOfAQueuedOwnerIsNotUndoneByTheQueuedCall(t *testing.T) {
	srv := redistest.Start(t)
	ctx := testContext(t)
	name := lockName(t)
	opts := redislock.Options{RetryFallback: 10 * time.Second, QueueTTL: time.Minute}
	c := newClient(t, srv.Client(t), opts)
	other := newClient(t, srv.Client(t), opts)
	direct := srv.Client(t)

	_, err := newMutex(t, other, name, &redislock.MutexOptions{Lease: time.Minute}).TryLock(ctx, 0)
	if err != nil {
		t.Fatal(err)
	}
	owned := newMutex(t, c, name, &redislock.MutexOptions{Owner: "controller:1", Lease: 30 * time.Second})

	wctx, cancelW := context.WithCancel(ctx)
	waiter := lockAsync(wctx, owned)
	waitFor(t, func() bool { return len(inspect(t, c, name).Waiters) == 1 }, "the waiter to queue")
	time.Sleep(300 * time.Millisecond) // its subscription and follow-up attempt

	// The blocker's lease runs out (Redis publishes nothing).
	if err := direct.PExpire(ctx, name, time.Millisecond).Err(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { return !inspect(t, c, name).Held() }, "the lease to run out")

	tried, err := owned.TryLock(ctx, 0)
	if err != nil {
		t.Fatalf("TryLock of a free lock: %v", err)
	}
	cancelW()
	if r := <-waiter; r.h != nil && r.err == nil {
		// It re-entered the TryLock's hold before it saw ctx end.
		mustUnlock(t, ctx, r.h)
	}
	if info := inspect(t, c, name); len(info.Holders) != 1 || info.Holders[0].Owner != tried.Owner() || info.Holders[0].Count != 1 || tried.Err() != nil {
		t.Fatalf("after the queued call gave up, the lock is %+v (the TryLock's Hold: %v), want held once by the TryLock", info, tried.Err())
	}
	mustUnlock(t, ctx, tried)
	if info := inspect(t, c, name); info.Held() || len(info.Waiters) != 0 {
		t.Fatalf("after the TryLock's Unlock the lock is %+v, want free with nobody queued", info)
	}
}

// Found in review (a second holder): two Clients acting for one owner both
// wait, and the lock is handed to the owner once, one grant, one level. One
// client took it from its notice and the other's retry took the same grant
// again: two Holds on one level. Now a grant is its call's alone; the other
// call re-enters, counted, or waits.
func TestTwoClientsOfOneOwnerTakeOneGrantOnce(t *testing.T) {
	srv := redistest.Start(t)
	ctx := testContext(t)
	name := lockName(t)
	opts := redislock.Options{RetryFallback: 100 * time.Millisecond, QueueTTL: 2 * time.Second}
	a := newClient(t, srv.Client(t), opts)
	b := newClient(t, srv.Client(t), opts)
	x := newClient(t, srv.Client(t), opts)
	owner := redislock.Owner("controller:7")
	mo := &redislock.MutexOptions{Owner: owner, Lease: 30 * time.Second} // fixed lease: nobody renews

	holder := mustLock(t, ctx, newMutex(t, x, name, nil))
	ra := lockAsync(ctx, newMutex(t, a, name, mo))
	rb := lockAsync(ctx, newMutex(t, b, name, mo))
	waitFor(t, func() bool { return len(inspect(t, x, name).Waiters) == 1 }, "the owner to queue")
	time.Sleep(300 * time.Millisecond)
	mustUnlock(t, ctx, holder)

	var holds []*redislock.Hold
	timeout := time.After(5 * time.Second)
	for len(holds) < 2 {
		select {
		case r := <-ra:
			if r.err != nil {
				t.Fatalf("a: %v", r.err)
			}
			holds = append(holds, r.h)
		case r := <-rb:
			if r.err != nil {
				t.Fatalf("b: %v", r.err)
			}
			holds = append(holds, r.h)
		case <-timeout:
			t.Fatalf("only %d of the owner's Lock calls returned", len(holds))
		}
	}
	info := inspect(t, x, name)
	if len(info.Holders) != 1 || info.Holders[0].Count != 2 {
		t.Fatalf("both Lock calls of %s returned, but the lock is %+v, want 2 levels", owner, info)
	}
	mustUnlock(t, ctx, holds[0])
	third, err := newMutex(t, x, name, nil).TryLock(ctx, 0)
	if err == nil && holds[1].Err() == nil {
		t.Fatalf("TWO HOLDERS: client-2's Hold of %s (token %d) reports held while %s holds (token %d); Redis count was %+v",
			owner, holds[1].Token(), third.Owner(), third.Token(), info)
	}
}

// Found in review (a level undone twice): an Unlock retried with its Hold
// resends the same request, which Redis applied at most once while it kept
// the request's result (latchTTL). A retry after that, once Redis was
// unreachable for a while, ran release.lua afresh and undid a second level:
// here another client's, for the same owner. Now the level itself records
// the call it belongs to, for as long as it is held: a retry, however late,
// undoes it at most once.
func TestUnlockRetriedLateUndoesItsLevelOnce(t *testing.T) {
	p := startProxied(t)
	ctx := testContext(t)
	name := lockName(t)
	owner := redislock.Owner("controller:9")
	mo := &redislock.MutexOptions{Owner: owner, Lease: time.Minute}

	lossyRedis := redis.NewClient(&redis.Options{Addr: p.proxy.Addr, MaxRetries: -1,
		ReadTimeout: 100 * time.Millisecond, WriteTimeout: 100 * time.Millisecond})
	t.Cleanup(func() { _ = lossyRedis.Close() })
	a := newClient(t, lossyRedis, redislock.Options{RetryFallback: 50 * time.Millisecond, QueueTTL: 100 * time.Millisecond})
	b := newClient(t, p.direct(t), redislock.Options{})
	// warm the scripts through the proxy
	warm := newMutex(t, a, name+":warm", nil)
	mustUnlock(t, ctx, mustLock(t, ctx, warm))

	bHold, err := newMutex(t, b, name, mo).TryLock(ctx, 0)
	if err != nil {
		t.Fatal(err)
	}
	am := newMutex(t, a, name, mo)
	outer := mustLock(t, ctx, am)
	inner := mustLock(t, ctx, am)
	direct := p.direct(t)
	if n := count(t, direct, name, owner); n != 3 {
		t.Fatalf("count %d, want 3", n)
	}

	p.proxy.LoseRepliesAtRandom(1) // every reply lost: the release runs, nobody hears
	err = inner.Unlock(ctx)
	p.proxy.Heal()
	if !errors.Is(err, redislock.ErrUnavailable) {
		t.Fatalf("Unlock with every reply lost: %v", err)
	}
	t.Logf("first Unlock: %v; count now %d", err, count(t, direct, name, owner))

	time.Sleep(2 * time.Second)
	if err := inner.Unlock(ctx); err != nil {
		t.Fatalf("an Unlock retried later returned %v, want success: its level is undone, once", err)
	}
	n := count(t, direct, name, owner)
	mustUnlock(t, ctx, outer)
	third, terr := newMutex(t, b, name, nil).TryLock(context.Background(), 0)
	if n != 2 || (terr == nil && bHold.Err() == nil) {
		tok := int64(0)
		if third != nil {
			tok = third.Token()
		}
		t.Fatalf("one Hold's Unlock undid two levels (count %d); b's Hold (token %d) Err=%v while a third owner's TryLock err=%v token=%d",
			n, bHold.Token(), bHold.Err(), terr, tok)
	}
}

// Found in review (a leadership kept for good): RunElection stopped just as
// the lock was handed to it. Lock returned the hand-over although ctx had
// ended, and RunElection returned without releasing it, so the watchdog
// renewed it for as long as the Client lived. The race is random; it showed
// within 27 and 43 iterations of 400 before the fix.
func TestElectionStoppedAsItWinsLeavesNoLeader(t *testing.T) {
	srv := redistest.Start(t)
	opts := redislock.Options{RetryFallback: 50 * time.Millisecond, QueueTTL: time.Second, WatchdogLease: 300 * time.Millisecond}
	leaderC := newClient(t, srv.Client(t), opts)
	standbyC := newClient(t, srv.Client(t), opts)
	name := lockName(t)
	for i := range 30 {
		ctx := context.Background()
		leader := mustLock(t, ctx, newMutex(t, leaderC, name, nil))
		sctx, cancel := context.WithCancel(ctx)
		led := make(chan struct{}, 1)
		done := make(chan error, 1)
		go func() {
			done <- standbyC.RunElection(sctx, redislock.Election{Name: name,
				OnStartedLeading: func(c context.Context, _ redislock.Term) { led <- struct{}{}; <-c.Done() }})
		}()
		waitFor(t, func() bool { return len(inspect(t, leaderC, name).Waiters) == 1 }, "standby queued")
		time.Sleep(20 * time.Millisecond)
		go func() {
			time.Sleep(time.Duration(rand.N(1500)) * time.Microsecond)
			cancel()
		}()
		_ = leader.Unlock(ctx)
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		select {
		case <-led:
		default:
		}
		// RunElection has returned: after a full lease, nobody should hold it.
		time.Sleep(600 * time.Millisecond)
		info := inspect(t, leaderC, name)
		if info.Held() {
			for _, h := range info.Holders {
				if strings.HasPrefix(string(h.Owner), standbyC.ID()) {
					time.Sleep(3 * time.Second) // ten leases
					t.Logf("3s (10 leases) later: %+v", inspect(t, leaderC, name))
					t.Fatalf("iteration %d: RunElection returned, yet its client still holds (and renews) the lock: %+v", i, info)
				}
			}
			t.Fatalf("iteration %d: lock held after all returned: %+v", i, info)
		}
	}
}

// Found in a second review (a second holder): two Clients act for one
// owner. B's Lock heads the queue and its retry takes the lock as its lease
// runs out, while B's context ends and A re-enters. B's give-up undid its
// level, but left its grant while A's level remained, and its leave then
// undid that grant: A's level. Now a release with the call's ticket clears
// its grant at any level.
func TestGiveUpAfterAnUndoneTakeKeepsTheOwnersOtherLevel(t *testing.T) {
	srv := redistest.Start(t)
	p := redistest.StartProxy(t, srv.Addr)
	ctx := testContext(t)
	name := lockName(t)
	opts := redislock.Options{RetryFallback: 5 * time.Second, QueueTTL: 30 * time.Second}
	direct := srv.Client(t)
	cX := newClient(t, srv.Client(t), opts)
	cA := newClient(t, srv.Client(t), opts)
	cB := newClient(t, proxiedRedis(t, p), opts)
	cZ := newClient(t, srv.Client(t), opts)
	const owner = redislock.Owner("shared:1")

	if _, err := newMutex(t, cX, name, &redislock.MutexOptions{Lease: 2 * time.Second}).TryLock(ctx, 0); err != nil {
		t.Fatal(err)
	}
	mB := newMutex(t, cB, name, &redislock.MutexOptions{Owner: owner, Lease: 30 * time.Second})
	mA := newMutex(t, cA, name, &redislock.MutexOptions{Owner: owner, Lease: 30 * time.Second})

	bctx, cancelB := context.WithCancel(ctx)
	defer cancelB()
	resB := lockAsync(bctx, mB)
	waitFor(t, func() bool { return len(inspect(t, cZ, name).Waiters) == 1 }, "B to queue")
	time.Sleep(500 * time.Millisecond) // subscription and follow-up attempt
	p.Delay(600 * time.Millisecond)

	// B's attempt after the lease ran out takes the lock in Redis.
	waitFor(t, func() bool {
		info := inspect(t, cZ, name)
		return len(info.Holders) == 1 && info.Holders[0].Owner == owner
	}, "B's attempt to take the lock")
	cancelB()
	hA := mustLock(t, ctx, mA) // re-entry: count 2
	t.Logf("after A's re-entry: count=%d entry=%q", count(t, direct, name, owner),
		direct.HGet(ctx, "lockwarden_lock_queue_entry:{"+name+"}", string(owner)).Val())
	r := <-resB
	t.Logf("B's Lock: hold=%v err=%v", r.h != nil, r.err)
	p.Heal()
	if r.err == nil {
		// B's reply came before it saw ctx end: it holds a level of its
		// own, which it gives back; A's must remain either way.
		mustUnlock(t, ctx, r.h)
	}
	time.Sleep(200 * time.Millisecond)

	n := count(t, direct, name, owner)
	t.Logf("after B gave up: count=%d, A's Hold.Err()=%v", n, hA.Err())
	z, err := newMutex(t, cZ, name, nil).TryLock(ctx, 0)
	if err == nil && hA.Err() == nil {
		t.Fatalf("TWO HOLDERS: Z took the lock (token %d) while A's Hold (token %d) still holds; B's give-up undid A's level (count now %d)",
			z.Token(), hA.Token(), n)
	}
	if !errors.Is(err, redislock.ErrWaitTimeout) {
		t.Fatalf("Z TryLock: %v", err)
	}
	if n != 1 {
		t.Fatalf("owner's count = %d, want 1 (A's level)", n)
	}
	mustUnlock(t, ctx, hA)
}

// Found in a second review (a level nobody renews): a Lock's first attempt
// queues it, its reply is lost, and the lock is handed to the call before
// the request is resent. The resend counted a re-entry on top of the grant,
// as the first attempt did not count as queued; now the call's ticket alone
// decides that it takes the grant.
func TestLostFirstReplyAndAHandOverTakeOneLevel(t *testing.T) {
	srv := redistest.Start(t)
	p := redistest.StartProxy(t, srv.Addr)
	ctx := testContext(t)
	name := lockName(t)
	opts := redislock.Options{RetryFallback: 5 * time.Second, QueueTTL: 30 * time.Second}
	direct := srv.Client(t)
	cX := newClient(t, srv.Client(t), opts)
	cB := newClient(t, proxiedRedis(t, p), opts)

	hX, err := newMutex(t, cX, name, &redislock.MutexOptions{Lease: time.Minute}).TryLock(ctx, 0)
	if err != nil {
		t.Fatal(err)
	}
	mB := newMutex(t, cB, name, &redislock.MutexOptions{Lease: 20 * time.Second})

	p.Delay(400 * time.Millisecond)
	resB := lockAsync(ctx, mB)
	waitFor(t, func() bool { return len(inspect(t, cX, name).Waiters) == 1 }, "B's first attempt to run")
	p.LoseReplies(1)       // the reply, still in the proxy, is lost
	mustUnlock(t, ctx, hX) // hands the lock to B's call

	r := <-resB
	p.Heal()
	if r.err != nil {
		t.Fatalf("B's Lock: %v", r.err)
	}
	n := count(t, direct, name, r.h.Owner())
	t.Logf("B holds with 1 Hold; Redis count=%d", n)
	mustUnlock(t, ctx, r.h)
	info := inspect(t, cX, name)
	if info.Held() {
		t.Fatalf("after B's only Unlock, the lock is still held: %+v (count in Redis before Unlock was %d); nobody renews it, it stays until its lease runs out",
			info, n)
	}
}

// Found by the soak (an overlap): a waiter that missed the notice of a
// hand-over takes the lock with an attempt, which finds its level there.
// The hand-over's lease is short (at most the waiter's QueueTTL) and began
// at the release, but the client counts the full lease from the attempt's
// send: the attempt must renew the lease, or the lock runs out under a Hold
// that still counts as held.
func TestAHandOverTakenByAnAttemptGetsItsLease(t *testing.T) {
	srv := redistest.Start(t)
	ctx := testContext(t)
	name := lockName(t)
	holderClient := newClient(t, srv.Client(t), redislock.Options{})
	waiterClient := newClient(t, srv.Client(t), redislock.Options{RetryFallback: 400 * time.Millisecond, QueueTTL: time.Second})
	held := mustLock(t, ctx, newMutex(t, holderClient, name, nil))
	got := lockAsync(ctx, newMutex(t, waiterClient, name, nil))
	waitFor(t, func() bool { return len(inspect(t, holderClient, name).Waiters) == 1 }, "the waiter to queue")
	time.Sleep(300 * time.Millisecond)
	// The waiter misses the hand-over's notice: its pub/sub connection is
	// killed just before the release.
	if err := srv.Client(t).Do(ctx, "client", "kill", "type", "pubsub").Err(); err != nil {
		t.Fatal(err)
	}
	mustUnlock(t, ctx, held)
	r := <-got
	if r.err != nil {
		t.Fatal(r.err)
	}
	time.Sleep(1500 * time.Millisecond) // past the hand-over's lease of 1 s
	if err := r.h.Err(); err != nil {
		t.Fatalf("the waiter's Hold ended: %v", err)
	}
	if info := inspect(t, holderClient, name); len(info.Holders) != 1 || info.Holders[0].Owner != r.h.Owner() {
		t.Fatalf("the waiter's Hold counts as held, but the lock is %+v", info)
	}
	mustUnlock(t, ctx, r.h)
}
