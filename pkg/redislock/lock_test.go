package redislock_test

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lockwarden/lockwarden/internal/redistest"
	"github.com/lockwarden/lockwarden/pkg/redislock"
)

func TestStandalone(t *testing.T) {
	b, _ := standalone(t)
	runCoreSuite(t, b)
}

func TestCluster(t *testing.T) {
	runCoreSuite(t, cluster(t))
}

// runCoreSuite is the behaviour every topology must show.
func runCoreSuite(t *testing.T, b backend) {
	t.Run("Reentry", func(t *testing.T) { testReentry(t, b) })
	t.Run("OwnerInContext", func(t *testing.T) { testOwnerInContext(t, b) })
	t.Run("UnlockByOtherOwnerChangesNothing", func(t *testing.T) { testUnlockByOther(t, b) })
	t.Run("LeaseExpiry", func(t *testing.T) { testLeaseExpiry(t, b) })
	t.Run("WatchdogKeepsLock", func(t *testing.T) { testWatchdog(t, b) })
	t.Run("WakeOnRelease", func(t *testing.T) { testWakeOnRelease(t, b) })
	t.Run("HandOver", func(t *testing.T) { testHandOver(t, b) })
	t.Run("HandOverExtended", func(t *testing.T) { testHandOverExtended(t, b) })
	t.Run("StaleHandOver", func(t *testing.T) { testStaleHandOver(t, b) })
	t.Run("HandOverToDeadWaiter", func(t *testing.T) { testHandOverToDeadWaiter(t, b) })
	t.Run("SameOwnerWaiting", func(t *testing.T) { testSameOwnerWaiting(t, b) })
	t.Run("MissedReleaseMessage", func(t *testing.T) { testMissedMessage(t, b) })
	t.Run("WaitersServedInOrder", func(t *testing.T) { testFIFO(t, b) })
	t.Run("FencingTokens", func(t *testing.T) { testFencing(t, b) })
	t.Run("LostRepliesTakeAndUndoOneLevel", func(t *testing.T) { testLostReplies(t, b) })
	t.Run("HashTaggedName", func(t *testing.T) { testHashTaggedName(t, b) })
	t.Run("TryLockTimeout", func(t *testing.T) { testTryLockTimeout(t, b) })
	t.Run("ForceReleaseClient", func(t *testing.T) { testForceReleaseClient(t, b) })
	t.Run("ForceReleaseOwnership", func(t *testing.T) { testForceReleaseOwnership(t, b) })
	t.Run("MutualExclusion", func(t *testing.T) { testMutualExclusion(t, b) })
}

func testReentry(t *testing.T, b backend) {
	ctx := testContext(t)
	c := newClient(t, b.newRedis(t), redislock.Options{})
	name := lockName(t)
	m := newMutex(t, c, name, nil)

	first := mustLock(t, ctx, m)
	// Without an owner in the context, another Lock on the same Mutex acts
	// for a new owner and is excluded, as with sync.Mutex.
	_, err := m.TryLock(ctx, 0)
	wantErr(t, err, redislock.ErrWaitTimeout)
	// Re-entry is explicit: the context carries the hold's owner.
	second := mustLock(t, redislock.WithHold(ctx, first), m)
	if first == second || second.Owner() != first.Owner() || first.Token() != second.Token() {
		t.Fatalf("re-entry returned the same Hold (%v), or another owner or token: %s, %s; %d, %d",
			first == second, first.Owner(), second.Owner(), first.Token(), second.Token())
	}
	info := inspect(t, c, name)
	if len(info.Holders) != 1 || info.Holders[0].Owner != first.Owner() || info.Holders[0].Count != 2 {
		t.Fatalf("holders after two Locks = %+v, want %s with count 2", info.Holders, first.Owner())
	}
	if info.TTL <= 0 {
		t.Fatalf("lock TTL = %v, want a lease", info.TTL)
	}

	mustUnlock(t, ctx, second)
	if got := inspect(t, c, name).Holders; len(got) != 1 || got[0].Count != 1 {
		t.Fatalf("holders after one Unlock = %+v, want count 1", got)
	}
	if first.Err() != nil || second.Err() != nil {
		t.Fatalf("ownership ended after a non-final Unlock: %v, %v", first.Err(), second.Err())
	}
	// A Hold unlocks once: a second Unlock of it changes nothing.
	wantErr(t, second.Unlock(ctx), redislock.ErrNotHeld)
	if got := inspect(t, c, name).Holders; len(got) != 1 || got[0].Count != 1 {
		t.Fatalf("holders after a second Unlock of the same Hold = %+v, want count 1 still", got)
	}
	mustUnlock(t, ctx, first)
	if inspect(t, c, name).Held() {
		t.Fatal("lock still held after the final Unlock")
	}
	wantErr(t, first.Err(), redislock.ErrReleased)
	wantErr(t, second.Err(), redislock.ErrReleased)
	wantErr(t, first.Unlock(ctx), redislock.ErrNotHeld)
}

func testOwnerInContext(t *testing.T, b backend) {
	ctx := testContext(t)
	c := newClient(t, b.newRedis(t), redislock.Options{})
	name := lockName(t)
	// Two Mutex values, one hold carried by the context: the second Lock
	// re-enters, even from another goroutine.
	outer, inner := newMutex(t, c, name, nil), newMutex(t, c, name, nil)
	outerHold := mustLock(t, ctx, outer)
	owner := outerHold.Owner()
	ctx = redislock.WithHold(ctx, outerHold)
	type result struct {
		hold *redislock.Hold
		err  error
	}
	done := make(chan result)
	go func() {
		h, err := inner.TryLock(ctx, 0)
		done <- result{h, err}
	}()
	r := <-done
	if r.err != nil {
		t.Fatalf("re-entry with the context's owner: %v", r.err)
	}
	innerHold := r.hold
	info := inspect(t, c, name)
	if len(info.Holders) != 1 || info.Holders[0].Owner != owner || info.Holders[0].Count != 2 {
		t.Fatalf("holders = %+v, want %s with count 2", info.Holders, owner)
	}
	// Without the context's owner, the Lock acts for a new owner and is
	// excluded.
	_, err := inner.TryLock(context.Background(), 0)
	wantErr(t, err, redislock.ErrWaitTimeout)
	mustUnlock(t, ctx, innerHold)
	mustUnlock(t, ctx, outerHold)

	_, err = c.NewMutex(name, &redislock.MutexOptions{Owner: "no-colon"})
	wantErr(t, err, redislock.ErrInvalidOwner)
}

// testUnlockByOther: a Hold whose lock was taken from it (force-released,
// then taken by another owner) cannot free the new owner's lock: its Unlock
// fails with ErrNotOwner and changes nothing.
func testUnlockByOther(t *testing.T, b backend) {
	ctx := testContext(t)
	staleClient := newClient(t, b.newRedis(t), redislock.Options{})
	c := newClient(t, b.newRedis(t), redislock.Options{})
	name := lockName(t)
	stale := mustLock(t, ctx, newMutex(t, staleClient, name, nil))
	if _, err := c.ForceReleaseClient(ctx, name, staleClient.ID()); err != nil {
		t.Fatal(err)
	}
	lease := mustLock(t, ctx, newMutex(t, c, name, nil))
	before := inspect(t, c, name)

	wantErr(t, stale.Unlock(ctx), redislock.ErrNotOwner)
	after := inspect(t, c, name)
	if fmt.Sprint(after.Holders) != fmt.Sprint(before.Holders) || after.Token != before.Token {
		t.Fatalf("a non-owner's Unlock changed the lock: %+v -> %+v", before, after)
	}
	if lease.Err() != nil {
		t.Fatalf("holder's lease ended: %v", lease.Err())
	}
	mustUnlock(t, ctx, lease)
}

func testLeaseExpiry(t *testing.T, b backend) {
	ctx := testContext(t)
	c := newClient(t, b.newRedis(t), redislock.Options{RetryFallback: 50 * time.Millisecond})
	name := lockName(t)
	const leaseTime = 300 * time.Millisecond
	holder := newMutex(t, c, name, &redislock.MutexOptions{Lease: leaseTime})
	lease := mustLock(t, ctx, holder)

	// The holder learns that its lease is over.
	waitDone(t, lease.Done(), 10*time.Second, "lost-lease signal of an expiring lease")
	wantErr(t, lease.Err(), redislock.ErrLeaseLost)

	// The lock simply expires; nobody renews it, and another owner gets it.
	other := mustLock(t, ctx, newMutex(t, c, name, nil))
	wantErr(t, lease.Unlock(ctx), redislock.ErrNotOwner)
	mustUnlock(t, ctx, other)
}

func testWatchdog(t *testing.T, b backend) {
	ctx := testContext(t)
	// Long enough that a loaded machine's scheduling stalls do not end it.
	const leaseTime = 1500 * time.Millisecond
	c := newClient(t, b.newRedis(t), redislock.Options{WatchdogLease: leaseTime})
	name := lockName(t)
	m := newMutex(t, c, name, nil)
	lease := mustLock(t, ctx, m)

	// Past two leases, the lock is still held, with a fresh lease.
	time.Sleep(2*leaseTime + leaseTime/2)
	info := inspect(t, c, name)
	if !info.Held() || info.Holders[0].Owner != lease.Owner() || info.TTL <= 0 {
		t.Fatalf("after 2.5 leases: %+v, want held by %s with a lease", info, lease.Owner())
	}
	if lease.Err() != nil {
		t.Fatalf("lease ended while the watchdog kept it: %v", lease.Err())
	}
	mustUnlock(t, ctx, lease)
	// The watchdog stopped with the Unlock: nothing renews the freed lock.
	time.Sleep(2 * leaseTime)
	if inspect(t, c, name).Held() {
		t.Fatal("lock held again after Unlock")
	}
}

func testWakeOnRelease(t *testing.T, b backend) {
	ctx := testContext(t)
	// A fallback longer than the test's bound: only the release message can
	// wake the waiter in time.
	opts := redislock.Options{RetryFallback: time.Minute}
	holderClient := newClient(t, b.newRedis(t), opts)
	waiterClient := newClient(t, b.newRedis(t), opts)
	name := lockName(t)
	holder := newMutex(t, holderClient, name, nil)
	waiter := newMutex(t, waiterClient, name, nil)
	held := mustLock(t, ctx, holder)

	got := lockInBackground(t, ctx, waiter)
	waitFor(t, func() bool { return len(inspect(t, holderClient, name).Waiters) == 1 }, "the waiter to queue")
	mustUnlock(t, ctx, held)
	if l := receiveHold(t, got, 10*time.Second, "the waiter's wake-up on release"); l != nil {
		mustUnlock(t, ctx, l)
	}
}

func testMissedMessage(t *testing.T, b backend) {
	ctx := testContext(t)
	rdb := b.newRedis(t)
	c := newClient(t, rdb, redislock.Options{RetryFallback: 200 * time.Millisecond})
	name := lockName(t)
	holder, waiter := newMutex(t, c, name, nil), newMutex(t, c, name, nil)
	mustLock(t, ctx, holder)

	got := lockInBackground(t, ctx, waiter)
	waitFor(t, func() bool { return len(inspect(t, c, name).Waiters) == 1 }, "the waiter to queue")
	// Free the lock without a release message, as a lost message would.
	if err := rdb.Del(ctx, name).Err(); err != nil {
		t.Fatal(err)
	}
	if l := receiveHold(t, got, 10*time.Second, "the waiter's retry after a missed message"); l != nil {
		mustUnlock(t, ctx, l)
	}
}

func testFIFO(t *testing.T, b backend) {
	ctx := testContext(t)
	c := newClient(t, b.newRedis(t), redislock.Options{RetryFallback: time.Minute})
	name := lockName(t)
	holder := mustLock(t, ctx, newMutex(t, c, name, nil))

	var order []int
	var mu sync.Mutex
	var wg sync.WaitGroup
	for i := range 4 {
		m := newMutex(t, c, name, nil)
		wg.Add(1)
		go func() {
			defer wg.Done()
			l, err := m.Lock(ctx)
			if err != nil {
				t.Errorf("waiter %d: %v", i, err)
				return
			}
			mu.Lock()
			order = append(order, i)
			mu.Unlock()
			if err := l.Unlock(ctx); err != nil {
				t.Errorf("waiter %d: %v", i, err)
			}
		}()
		// Queue them one after another.
		waitFor(t, func() bool { return len(inspect(t, c, name).Waiters) == i+1 }, "the waiter to queue")
	}
	mustUnlock(t, ctx, holder)
	wg.Wait()
	if fmt.Sprint(order) != "[0 1 2 3]" {
		t.Fatalf("waiters got the lock in order %v, want arrival order", order)
	}
}

func testFencing(t *testing.T, b backend) {
	ctx := testContext(t)
	rdb := b.newRedis(t)
	c := newClient(t, rdb, redislock.Options{})
	name := lockName(t)
	var last int64
	for i := range 5 {
		m := newMutex(t, c, name, nil)
		l := mustLock(t, ctx, m)
		if l.Token() <= last {
			t.Fatalf("ownership %d has token %d, not above the previous %d", i, l.Token(), last)
		}
		again := mustLock(t, redislock.WithHold(ctx, l), m)
		if again.Token() != l.Token() {
			t.Fatalf("re-entry changed the token from %d to %d", l.Token(), again.Token())
		}
		last = l.Token()
		mustUnlock(t, ctx, again)
		mustUnlock(t, ctx, l)
	}
	counter := "redisson_lock_token:{" + name + "}"
	// The counter is Redisson's, which its fenced lock INCRs: like
	// Redisson, lockwarden never gives it an expiry (see also case 7 of
	// issue 21).
	ttl, err := rdb.PTTL(ctx, counter).Result()
	if err != nil || ttl != -1 {
		t.Fatalf("token counter PTTL = %v (%v), want none", ttl, err)
	}

	// Redis loses the counter's last increments, or the whole counter (a
	// crash, a restart without persistence, a failover): tokens still rise.
	for _, lose := range []func() error{
		func() error { return rdb.Set(ctx, counter, 1, 0).Err() },
		func() error { return rdb.Del(ctx, counter).Err() },
	} {
		if err := lose(); err != nil {
			t.Fatal(err)
		}
		l := mustLock(t, ctx, newMutex(t, c, name, nil))
		if l.Token() <= last {
			t.Fatalf("after the counter was set back, token %d is not above %d", l.Token(), last)
		}
		last = l.Token()
		mustUnlock(t, ctx, l)
	}
}

// testLostReplies: an acquire or a release that ran in Redis but whose
// reply was lost is sent again as the same request, and Redis answers it from
// the request's latch: each Lock takes exactly one level and each Unlock
// undoes exactly one, so no level is left that no Hold accounts for.
func testLostReplies(t *testing.T, b backend) {
	ctx := testContext(t)
	rdb := b.newRedis(t)
	loser := &replyLoser{}
	rdb.AddHook(loser)
	c := newClient(t, rdb, redislock.Options{RetryFallback: 100 * time.Millisecond})
	name := lockName(t)
	owner := c.NewOwner()
	m := newMutex(t, c, name, &redislock.MutexOptions{Owner: owner})
	octx := ctx
	wantCount := func(when string, want int64) {
		t.Helper()
		info := inspect(t, c, name)
		if len(info.Holders) != 1 || info.Holders[0].Owner != owner || info.Holders[0].Count != want {
			t.Fatalf("holders %s = %+v, want %s with count %d", when, info.Holders, owner, want)
		}
	}

	// The first Lock's reply is lost: sent again, it must not count as a
	// re-entry of the hold it took.
	loser.loseNext(acquireOf(owner))
	first := mustLock(t, octx, m)
	wantCount("after a Lock whose reply was lost", 1)
	loser.loseNext(acquireOf(owner))
	second := mustLock(t, octx, m)
	wantCount("after a re-entry whose reply was lost", 2)
	if second.Token() != first.Token() {
		t.Fatalf("re-entry changed the token from %d to %d", first.Token(), second.Token())
	}

	// An Unlock whose reply was lost undoes one level, not two.
	loser.loseNext(releaseOf(owner))
	mustUnlock(t, ctx, second)
	wantCount("after an Unlock whose reply was lost", 1)
	if first.Err() != nil {
		t.Fatalf("ownership ended after a non-final Unlock: %v", first.Err())
	}
	if n := loser.count(); n != 3 {
		t.Fatalf("%d replies lost, want 3", n)
	}
	mustUnlock(t, ctx, first)
	if inspect(t, c, name).Held() {
		t.Fatal("lock still held after the Unlock of the last Hold")
	}
}

// testHashTaggedName: a name with a Redis Cluster hash tag is used as it is,
// and every key of the lock lands in the tag's slot (on a Cluster, a script
// whose keys spanned slots would fail).
func testHashTaggedName(t *testing.T, b backend) {
	ctx := testContext(t)
	rdb := b.newRedis(t)
	c := newClient(t, rdb, redislock.Options{RetryFallback: 100 * time.Millisecond})
	name := "{" + lockName(t) + "}:orders"
	m := newMutex(t, c, name, nil)
	held := mustLock(t, ctx, m)
	if n, err := rdb.Exists(ctx, name).Result(); err != nil || n != 1 {
		t.Fatalf("EXISTS %s = %d, %v; want the lock hash under the name as it is", name, n, err)
	}
	got := lockInBackground(t, ctx, m)
	waitFor(t, func() bool { return len(inspect(t, c, name).Waiters) == 1 }, "the waiter to queue")
	mustUnlock(t, ctx, held)
	if l := receiveHold(t, got, 10*time.Second, "the hand-over on a hash-tagged name"); l != nil {
		if l.Token() <= held.Token() {
			t.Fatalf("hand-over token %d is not above the previous %d", l.Token(), held.Token())
		}
		mustUnlock(t, ctx, l)
	}
}

func testTryLockTimeout(t *testing.T, b backend) {
	ctx := testContext(t)
	c := newClient(t, b.newRedis(t), redislock.Options{})
	name := lockName(t)
	holder, waiter := newMutex(t, c, name, nil), newMutex(t, c, name, nil)
	held := mustLock(t, ctx, holder)
	_, err := waiter.TryLock(ctx, 100*time.Millisecond)
	wantErr(t, err, redislock.ErrWaitTimeout)
	if w := inspect(t, c, name).Waiters; len(w) != 0 {
		t.Fatalf("a waiter that timed out is still queued: %v", w)
	}
	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	_, err = waiter.Lock(cancelled)
	wantErr(t, err, context.Canceled)
	mustUnlock(t, ctx, held)
}

func testForceReleaseClient(t *testing.T, b backend) {
	ctx := testContext(t)
	c := newClient(t, b.newRedis(t), redislock.Options{})
	name := lockName(t)
	podUID := "0e9f6f1c-5b5e-4c1e-9d42-3f8c2a1b7d10"
	pod := newMutex(t, c, name, &redislock.MutexOptions{Owner: redislock.Owner(podUID + ":1")})
	podLease := mustLock(t, ctx, pod)
	// Locks of a Mutex with a fixed owner re-enter each other.
	podAgain := mustLock(t, ctx, pod)
	if info := inspect(t, c, name); len(info.Holders) != 1 || info.Holders[0].Owner != podLease.Owner() || info.Holders[0].Count != 2 {
		t.Fatalf("holders after two Locks of a fixed owner = %+v, want %s:1 with count 2", info.Holders, podUID)
	}

	got := lockInBackground(t, ctx, newMutex(t, c, name, nil))
	waitFor(t, func() bool { return len(inspect(t, c, name).Waiters) == 1 }, "the waiter to queue")

	// Another UID sharing a prefix is not touched.
	if n, err := c.ForceReleaseClient(ctx, name, podUID[:8]); err != nil || n != 0 {
		t.Fatalf("ForceReleaseClient of a prefix = %d, %v; want 0", n, err)
	}
	n, err := c.ForceReleaseClient(ctx, name, podUID)
	if err != nil || n != 1 {
		t.Fatalf("ForceReleaseClient = %d, %v; want 1 holder removed", n, err)
	}
	l := receiveHold(t, got, 10*time.Second, "the waiter's wake-up after a forced release")
	wantErr(t, podLease.Err(), redislock.ErrReleased)
	wantErr(t, podAgain.Err(), redislock.ErrReleased)
	if l != nil {
		mustUnlock(t, ctx, l)
	}
}

// testForceReleaseOwnership: a forced release judged by a fencing token
// leaves alone an ownership taken since under the same owner ID, and Redis
// as it was; with the current ownership's token it is a ForceReleaseClient.
func testForceReleaseOwnership(t *testing.T, b backend) {
	ctx := testContext(t)
	rdb := b.newRedis(t)
	loser := &replyLoser{}
	rdb.AddHook(loser)
	c := newClient(t, rdb, redislock.Options{})
	admin := newClient(t, rdb, redislock.Options{})
	name := lockName(t)
	podUID := "5d0c7a2e-9b3f-4e61-8a0d-2f4b6c8e1a37"
	pod := newMutex(t, c, name, &redislock.MutexOptions{Owner: redislock.Owner(podUID + ":0")})
	first := mustLock(t, ctx, pod)
	if n, err := admin.ForceReleaseClient(ctx, name, podUID); err != nil || n != 1 {
		t.Fatalf("ForceReleaseClient = %d, %v; want 1 holder removed", n, err)
	}
	second := mustLock(t, ctx, pod)
	if second.Token() <= first.Token() {
		t.Fatalf("the second ownership's token %d is not above the first's %d", second.Token(), first.Token())
	}

	before := inspect(t, admin, name)
	for _, token := range []int64{first.Token(), second.Token() + 1, 0, -1} {
		if n, err := admin.ForceReleaseOwnership(ctx, name, podUID, token); err != nil || n != 0 {
			t.Fatalf("ForceReleaseOwnership with token %d, not the ownership's %d = %d, %v; want 0", token, second.Token(), n, err)
		}
	}
	if after := inspect(t, admin, name); !reflect.DeepEqual(before.Holders, after.Holders) || after.Token != before.Token {
		t.Fatalf("the lock after forced releases with other tokens: %+v, want it as it was: %+v", after, before)
	}
	// Through the client that holds it too: its hold goes on.
	if n, err := c.ForceReleaseOwnership(ctx, name, podUID, first.Token()); err != nil || n != 0 {
		t.Fatalf("ForceReleaseOwnership through the holding client with the first token = %d, %v; want 0", n, err)
	}
	if err := second.Err(); err != nil {
		t.Fatalf("the second ownership's hold after forced releases with other tokens: %v", err)
	}
	if err := second.Refresh(ctx); err != nil {
		t.Fatalf("the second ownership after forced releases with other tokens: %v", err)
	}

	if n, err := c.ForceReleaseOwnership(ctx, name, podUID, second.Token()); err != nil || n != 1 {
		t.Fatalf("ForceReleaseOwnership with the ownership's token = %d, %v; want 1 holder removed", n, err)
	}
	wantErr(t, second.Err(), redislock.ErrReleased)
	if info := inspect(t, admin, name); info.Held() {
		t.Fatalf("the lock after its ownership was force-released: %+v, want it free", info)
	}
	// A second run, as go-redis sends when a reply was lost, removes nothing.
	if n, err := c.ForceReleaseOwnership(ctx, name, podUID, second.Token()); err != nil || n != 0 {
		t.Fatalf("ForceReleaseOwnership again = %d, %v; want 0", n, err)
	}

	// A release whose reply is lost, sent again by its caller, finds
	// nothing left to remove, and the hold it ended is over all the same.
	third := mustLock(t, ctx, pod)
	loser.loseNext(func(args []any) bool { kind, _ := redislock.ScriptCall(args); return kind == "force_release" })
	if _, err := c.ForceReleaseOwnership(ctx, name, podUID, third.Token()); !errors.Is(err, redislock.ErrUnavailable) {
		t.Fatalf("ForceReleaseOwnership whose reply was lost = %v, want ErrUnavailable", err)
	}
	if n, err := c.ForceReleaseOwnership(ctx, name, podUID, third.Token()); err != nil || n != 0 {
		t.Fatalf("ForceReleaseOwnership sent again after a lost reply = %d, %v; want 0", n, err)
	}
	wantErr(t, third.Err(), redislock.ErrReleased)
	if info := inspect(t, admin, name); info.Held() {
		t.Fatalf("the lock after a forced release whose reply was lost: %+v, want it free", info)
	}
}

// Inspect reports the holder's fencing token from the hold itself, which
// outlives the counter it came from: a Redis that loses the counter (an
// eviction, say) still shows whose ownership holds the lock.
func TestInspectShowsTheHoldersTokenWithoutItsCounter(t *testing.T) {
	ctx := testContext(t)
	b, srv := standalone(t)
	c := newClient(t, b.newRedis(t), redislock.Options{})
	name := lockName(t)
	hold := mustLock(t, ctx, newMutex(t, c, name, nil))
	if err := srv.Client(t).Del(ctx, "redisson_lock_token:{"+name+"}").Err(); err != nil {
		t.Fatal(err)
	}
	if info := inspect(t, c, name); info.Token != hold.Token() {
		t.Fatalf("Inspect without the counter: token %d, want the holder's %d", info.Token, hold.Token())
	}
	mustUnlock(t, ctx, hold)
}

// testMutualExclusion runs several clients, each with several goroutines
// sharing one Mutex, through one lock, and counts every overlap a checker
// sees and every token that does not rise.
func testMutualExclusion(t *testing.T, b backend) {
	ctx := testContext(t)
	name := lockName(t)
	const clients, workers, rounds = 3, 4, 25
	var inside, violations, acquisitions atomic.Int64
	var tokenMu sync.Mutex
	var lastToken int64
	var wg sync.WaitGroup
	for range clients {
		c := newClient(t, b.newRedis(t), redislock.Options{RetryFallback: 100 * time.Millisecond})
		m := newMutex(t, c, name, nil)
		for range workers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for range rounds {
					l, err := m.Lock(ctx)
					if err != nil {
						t.Errorf("Lock: %v", err)
						return
					}
					if inside.Add(1) != 1 {
						violations.Add(1)
					}
					tokenMu.Lock()
					if l.Token() <= lastToken {
						violations.Add(1)
					}
					lastToken = l.Token()
					tokenMu.Unlock()
					acquisitions.Add(1)
					time.Sleep(100 * time.Microsecond)
					inside.Add(-1)
					if err := l.Unlock(ctx); err != nil {
						t.Errorf("Unlock: %v", err)
						return
					}
				}
			}()
		}
	}
	wg.Wait()
	if v := violations.Load(); v != 0 {
		t.Fatalf("%d mutual-exclusion violations in %d acquisitions", v, acquisitions.Load())
	}
	if n := acquisitions.Load(); n != clients*workers*rounds {
		t.Fatalf("%d acquisitions, want %d", n, clients*workers*rounds)
	}
}

// waitFor polls cond, for test set-up only (never to assert timing).
func waitFor(t testing.TB, cond func() bool, what string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestSameIDDifferentProcesses: two clients with one ID, as two containers
// of one pod built by FromEnv would be, do not share owners, so they
// exclude each other instead of re-entering.
func TestSameIDDifferentProcesses(t *testing.T) {
	srv := redistest.Start(t)
	ctx := testContext(t)
	const podUID = "5b0e3f7a-1c2d-4e5f-8a9b-0c1d2e3f4a5b"
	first := newClient(t, srv.Client(t), redislock.Options{ID: podUID})
	second := newClient(t, srv.Client(t), redislock.Options{ID: podUID})
	a, b := newMutex(t, first, lockName(t), nil), newMutex(t, second, lockName(t), nil)
	if oa, ob := first.NewOwner(), second.NewOwner(); oa == ob || strings.HasSuffix(string(oa), ":0") || strings.HasSuffix(string(ob), ":0") {
		t.Fatalf("owners %s and %s", oa, ob)
	}
	held := mustLock(t, ctx, a)
	if !strings.HasPrefix(string(held.Owner()), podUID+":") || strings.HasSuffix(string(held.Owner()), ":0") {
		t.Fatalf("owner %s", held.Owner())
	}
	_, err := b.TryLock(ctx, 0)
	wantErr(t, err, redislock.ErrWaitTimeout)
	mustUnlock(t, ctx, held)
}

// TestRetakenAfterForcedRelease: an owner's hold is force-released behind
// its back and the owner locks again before its watchdog noticed. That is a
// new ownership, not a re-entry: a new hold with a new token, and the old
// hold ends as lost. Its Unlock cannot undo the new ownership.
func TestRetakenAfterForcedRelease(t *testing.T) {
	srv := redistest.Start(t)
	ctx := testContext(t)
	c := newClient(t, srv.Client(t), redislock.Options{})
	owner := redislock.Owner("3c9d0f4e-8b1a-4f6e-9d2c-7a5b3e1f0c8d:7")
	m := newMutex(t, c, lockName(t), &redislock.MutexOptions{Owner: owner})
	old := mustLock(t, ctx, m)

	admin := newClient(t, srv.Client(t), redislock.Options{})
	if _, err := admin.ForceReleaseClient(ctx, m.Name(), "3c9d0f4e-8b1a-4f6e-9d2c-7a5b3e1f0c8d"); err != nil {
		t.Fatal(err)
	}
	renewed := mustLock(t, ctx, m)
	if renewed.Token() <= old.Token() {
		t.Fatalf("lock after a forced release: tokens %d then %d", old.Token(), renewed.Token())
	}
	wantErr(t, old.Err(), redislock.ErrNotOwner)
	if renewed.Err() != nil {
		t.Fatalf("the new lease ended: %v", renewed.Err())
	}
	if info := inspect(t, c, m.Name()); info.Holders[0].Count != 1 {
		t.Fatalf("reentry count %d, want 1", info.Holders[0].Count)
	}
	// The old Hold's Lock was undone by the forced release: unlocking it
	// must not undo the new ownership's level.
	if err := old.Unlock(ctx); err == nil {
		t.Error("Unlock of the Hold whose ownership was force-released succeeded")
	}
	if info := inspect(t, c, m.Name()); !info.Held() || info.Holders[0].Owner != owner || info.Holders[0].Count != 1 || info.Token != renewed.Token() {
		t.Fatalf("after the old Hold's Unlock the lock is %+v, want still held once by %s with token %d", info, owner, renewed.Token())
	}
	if renewed.Err() != nil {
		t.Fatalf("the new hold ended after the old Hold's Unlock: %v", renewed.Err())
	}
	mustUnlock(t, ctx, renewed)
}
