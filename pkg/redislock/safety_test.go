package redislock_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/lockwarden/lockwarden/internal/redistest"
	"github.com/lockwarden/lockwarden/pkg/redislock"
)

// The tests in this file play a hostile network and a careless caller
// against one lock: replies lost after Redis ran the command, concurrent
// calls by one owner, an ACL that denies a channel. Each names the case of
// the one-holder promise it once broke.

// proxied is a Redis server reached through a proxy that can lose replies.
type proxied struct {
	srv   *redistest.Server
	proxy *redistest.Proxy
}

func startProxied(t *testing.T) proxied {
	srv := redistest.Start(t)
	return proxied{srv, redistest.StartProxy(t, srv.Addr)}
}

// client returns a go-redis client through the proxy. retries is go-redis's
// MaxRetries: -1 for none, so a lost reply reaches the lock client.
func (p proxied) client(t *testing.T, retries int) *redis.Client {
	rdb := redis.NewClient(&redis.Options{Addr: p.proxy.Addr, MaxRetries: retries})
	t.Cleanup(func() { _ = rdb.Close() })
	return rdb
}

// warm runs every script a Lock, a re-entry and their Unlocks use once, so
// that a reply lost next is a script's, not a NOSCRIPT error's.
func warm(t *testing.T, ctx context.Context, c *redislock.Client) {
	t.Helper()
	m := newMutex(t, c, lockName(t)+":warm-up", nil)
	hold := mustLock(t, ctx, m)
	mustUnlock(t, ctx, mustLock(t, redislock.WithHold(ctx, hold), m))
	mustUnlock(t, ctx, hold)
}

// direct is a client that bypasses the proxy, to look at Redis as it is.
func (p proxied) direct(t *testing.T) *redis.Client { return p.srv.Client(t) }

// count is the owner's reentry count in Redis, 0 if it holds nothing.
func count(t *testing.T, rdb *redis.Client, name string, owner redislock.Owner) int {
	t.Helper()
	n, err := rdb.HGet(context.Background(), name, string(owner)).Int()
	if err != nil && !errors.Is(err, redis.Nil) {
		t.Fatal(err)
	}
	return n
}

// Case 3: a release whose reply was lost is sent again by go-redis. It must
// undo one level, not two: a non-final Unlock must not free the lock.
func TestRetriedReleaseUndoesOneLevel(t *testing.T) {
	p := startProxied(t)
	ctx := testContext(t)
	c := newClient(t, p.client(t, 3), redislock.Options{})
	warm(t, ctx, c)
	m := newMutex(t, c, lockName(t), &redislock.MutexOptions{Lease: time.Minute})
	outer := mustLock(t, ctx, m)
	inner := mustLock(t, redislock.WithHold(ctx, outer), m)

	p.proxy.LoseReplies(1)
	mustUnlock(t, ctx, inner)
	if n := count(t, p.direct(t), m.Name(), outer.Owner()); n != 1 {
		t.Fatalf("after one Unlock whose reply was lost and resent, the owner holds %d levels, want 1", n)
	}
	if outer.Err() != nil {
		t.Fatalf("the outer hold ended: %v", outer.Err())
	}
	mustUnlock(t, ctx, outer)
	if inspect(t, c, m.Name()).Held() {
		t.Fatal("the lock is still held after the last Unlock")
	}
}

// Case 3: a final release whose reply was lost and resent reports the
// release, not a lost lease.
func TestRetriedFinalReleaseReportsReleased(t *testing.T) {
	p := startProxied(t)
	ctx := testContext(t)
	c := newClient(t, p.client(t, 3), redislock.Options{})
	warm(t, ctx, c)
	m := newMutex(t, c, lockName(t), nil)
	hold := mustLock(t, ctx, m)

	p.proxy.LoseReplies(1)
	mustUnlock(t, ctx, hold)
	if cause := context.Cause(hold.Context()); !errors.Is(cause, redislock.ErrReleased) {
		t.Fatalf("the hold ended with %v, want ErrReleased", cause)
	}
}

// A lost acquire reply, resent by go-redis, takes one level: one Unlock frees
// the lock.
func TestRetriedAcquireTakesOneLevel(t *testing.T) {
	p := startProxied(t)
	ctx := testContext(t)
	c := newClient(t, p.client(t, 3), redislock.Options{})
	warm(t, ctx, c)
	m := newMutex(t, c, lockName(t), &redislock.MutexOptions{Lease: time.Minute})

	p.proxy.LoseReplies(1)
	hold := mustLock(t, ctx, m)
	if n := count(t, p.direct(t), m.Name(), hold.Owner()); n != 1 {
		t.Fatalf("after a Lock whose reply was lost and resent, the owner holds %d levels, want 1", n)
	}
	p.proxy.LoseReplies(1)
	reentry := mustLock(t, redislock.WithHold(ctx, hold), m)
	if n := count(t, p.direct(t), m.Name(), hold.Owner()); n != 2 {
		t.Fatalf("after a re-entry, the owner holds %d levels, want 2", n)
	}
	mustUnlock(t, ctx, reentry)
	mustUnlock(t, ctx, hold)
	if inspect(t, c, m.Name()).Held() {
		t.Fatal("the lock is still held after one Unlock per Lock")
	}
}

// When go-redis does not resend (MaxRetries -1), the lock client resends the
// same request itself: the outcome of a Lock whose reply was lost is found
// out, never guessed, and an Unlock whose reply was lost is not applied twice.
func TestLostRepliesAreResolvedByTheClient(t *testing.T) {
	p := startProxied(t)
	ctx := testContext(t)
	c := newClient(t, p.client(t, -1), redislock.Options{})
	warm(t, ctx, c)
	m := newMutex(t, c, lockName(t), &redislock.MutexOptions{Lease: time.Minute})

	p.proxy.LoseReplies(1)
	hold := mustLock(t, ctx, m)
	p.proxy.LoseReplies(1)
	reentry := mustLock(t, redislock.WithHold(ctx, hold), m)
	if n := count(t, p.direct(t), m.Name(), hold.Owner()); n != 2 {
		t.Fatalf("after two Locks whose replies were lost, the owner holds %d levels, want 2", n)
	}
	p.proxy.LoseReplies(1)
	mustUnlock(t, ctx, reentry)
	if n := count(t, p.direct(t), m.Name(), hold.Owner()); n != 1 {
		t.Fatalf("after an Unlock whose reply was lost, the owner holds %d levels, want 1", n)
	}
	p.proxy.LoseReplies(1)
	mustUnlock(t, ctx, hold)
	if inspect(t, c, m.Name()).Held() {
		t.Fatal("the lock is still held after one Unlock per Lock")
	}
}

// Case 1: a waiter whose attempt took the lock, but whose reply was lost,
// must neither give the lock away nor take a hand-over it undid: exactly one
// of the waiters holds the lock after the holder leaves, and it is the one
// the lock was handed to.
func TestLostReplyWhileWaitingKeepsOneHolder(t *testing.T) {
	p := startProxied(t)
	ctx := testContext(t)
	opts := redislock.Options{RetryFallback: 50 * time.Millisecond, QueueTTL: time.Second}
	holderClient := newClient(t, p.direct(t), opts)
	lossy := newClient(t, p.client(t, -1), opts)
	other := newClient(t, p.direct(t), opts)
	name := lockName(t)
	holder := mustLock(t, ctx, newMutex(t, holderClient, name, nil))

	// The lossy waiter queues first, the other after it.
	lossyHolds, otherHolds := make(chan *redislock.Hold, 1), make(chan *redislock.Hold, 1)
	go func() { h, _ := newMutex(t, lossy, name, nil).Lock(ctx); lossyHolds <- h }()
	waitFor(t, func() bool { return len(inspect(t, holderClient, name).Waiters) == 1 }, "the waiter to queue")
	go func() { h, _ := newMutex(t, other, name, nil).Lock(ctx); otherHolds <- h }()
	waitFor(t, func() bool { return len(inspect(t, holderClient, name).Waiters) == 2 }, "the second waiter to queue")

	// Every reply to the lossy client is lost for a while: its retries run
	// in Redis but it hears nothing, and its pub/sub connection breaks.
	p.proxy.LoseRepliesAtRandom(1)
	mustUnlock(t, ctx, holder)
	time.Sleep(300 * time.Millisecond) // several of its retries, all lost
	p.proxy.Heal()

	var first *redislock.Hold
	select {
	case first = <-lossyHolds:
	case <-otherHolds:
		t.Fatal("the lock went to the second waiter while the first, to whom it was handed, still waited")
	case <-time.After(10 * time.Second):
		t.Fatal("the first waiter never got the lock")
	}
	if first == nil || first.Err() != nil {
		t.Fatalf("the first waiter's Lock failed")
	}
	info := inspect(t, holderClient, name)
	if len(info.Holders) != 1 || info.Holders[0].Owner != first.Owner() || info.Holders[0].Count != 1 {
		t.Fatalf("the lock is %+v, want held once by %s", info, first.Owner())
	}
	select {
	case <-otherHolds:
		t.Fatal("the second waiter holds the lock too")
	default:
	}
	mustUnlock(t, ctx, first)
	second := <-otherHolds
	if second == nil || second.Token() <= first.Token() {
		t.Fatalf("the second waiter's hold %v has no token above %d", second, first.Token())
	}
	mustUnlock(t, ctx, second)
}

// Exclusion first: goroutines sharing one Mutex exclude each other, as with
// sync.Mutex. Each Lock is a new owner.
func TestGoroutinesSharingAMutexExclude(t *testing.T) {
	b, _ := standalone(t)
	ctx := testContext(t)
	c := newClient(t, b.newRedis(t), redislock.Options{RetryFallback: 50 * time.Millisecond, QueueTTL: time.Second})
	m := newMutex(t, c, lockName(t), nil)
	// inside is the critical section: a Lock that finds it taken overlaps.
	var inside, overlaps sync.Mutex
	n := 0
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 20 {
				hold, err := m.Lock(ctx)
				if err != nil {
					t.Error(err)
					return
				}
				if !inside.TryLock() {
					overlaps.Lock()
					n++
					overlaps.Unlock()
				} else {
					time.Sleep(100 * time.Microsecond)
					inside.Unlock()
				}
				if err := hold.Unlock(ctx); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	if n != 0 {
		t.Fatalf("%d Locks on one Mutex overlapped another", n)
	}
}

// Case 4: the last Unlock of one Hold must not wipe a re-entry that another
// goroutine of the same owner made meanwhile.
func TestLastUnlockKeepsAConcurrentReentry(t *testing.T) {
	b, _ := standalone(t)
	ctx := testContext(t)
	c := newClient(t, b.newRedis(t), redislock.Options{})
	m := newMutex(t, c, lockName(t), nil)
	for range 50 {
		first := mustLock(t, ctx, m)
		var second *redislock.Hold
		var wg sync.WaitGroup
		wg.Add(2)
		go func() {
			defer wg.Done()
			second, _ = m.Lock(redislock.WithHold(ctx, first))
		}()
		go func() {
			defer wg.Done()
			_ = first.Unlock(ctx)
		}()
		wg.Wait()
		info := inspect(t, c, m.Name())
		if second != nil && second.Err() == nil {
			// The re-entry came before the release: it must still hold.
			if len(info.Holders) != 1 || info.Holders[0].Count != 1 {
				t.Fatalf("after a re-entry raced the first Hold's Unlock, the lock is %+v, want held once", info)
			}
			mustUnlock(t, ctx, second)
		} else if info.Held() {
			t.Fatalf("the re-entry failed, yet the lock is %+v", info)
		}
	}
}

// Case 2: one owner from two Clients (MutexOptions.Owner) counts each
// client's level; neither adopts the other's hold uncounted, so the lock is
// held until both unlocked.
func TestOneOwnerFromTwoClientsCountsLevels(t *testing.T) {
	b, _ := standalone(t)
	ctx := testContext(t)
	owner := redislock.Owner("shared-owner:1")
	a := newClient(t, b.newRedis(t), redislock.Options{})
	bc := newClient(t, b.newRedis(t), redislock.Options{})
	name := lockName(t)
	ha, err := newMutex(t, a, name, &redislock.MutexOptions{Owner: owner}).TryLock(ctx, 0)
	if err != nil {
		t.Fatal(err)
	}
	hb, err := newMutex(t, bc, name, &redislock.MutexOptions{Owner: owner}).TryLock(ctx, 0)
	if err != nil {
		t.Fatal(err)
	}
	if info := inspect(t, a, name); len(info.Holders) != 1 || info.Holders[0].Count != 2 {
		t.Fatalf("the lock is %+v, want one owner with 2 levels", info)
	}
	mustUnlock(t, ctx, ha)
	if !inspect(t, a, name).Held() {
		t.Fatal("the first client's Unlock freed the second client's hold")
	}
	mustUnlock(t, ctx, hb)
	if inspect(t, a, name).Held() {
		t.Fatal("the lock is held after both clients unlocked")
	}
}

// Case 6: a last Unlock that fails leaves no renewal behind: the lock runs
// out with its lease instead of being renewed for good.
func TestFailedLastUnlockStopsRenewal(t *testing.T) {
	p := startProxied(t)
	ctx := testContext(t)
	// Timeouts short enough that the Unlock fails well within the lease,
	// long enough that a loaded machine's Lock and renewals do not.
	rdb := redis.NewClient(&redis.Options{Addr: p.proxy.Addr, MaxRetries: -1,
		ReadTimeout: 250 * time.Millisecond, WriteTimeout: 250 * time.Millisecond})
	t.Cleanup(func() { _ = rdb.Close() })
	c := newClient(t, rdb, redislock.Options{WatchdogLease: 3 * time.Second, RetryFallback: 50 * time.Millisecond, QueueTTL: 100 * time.Millisecond})
	m := newMutex(t, c, lockName(t), nil)
	hold := mustLock(t, ctx, m)

	p.proxy.Cut()
	if err := hold.Unlock(ctx); !errors.Is(err, redislock.ErrUnavailable) {
		t.Fatalf("Unlock in a partition returned %v, want ErrUnavailable", err)
	}
	if hold.Err() == nil {
		t.Fatal("the hold still counts as held after its last Unlock")
	}
	p.proxy.Heal()
	if info := inspect(t, newClient(t, p.direct(t), redislock.Options{}), m.Name()); !info.Held() {
		t.Fatal("the partition should have kept the lock from being released")
	}
	// The watchdog renews every lease/3; had it gone on, the lock would
	// never run out.
	waitFor(t, func() bool { return !inspect(t, newClient(t, p.direct(t), redislock.Options{}), m.Name()).Held() }, "the lock to run out")
	if err := hold.Unlock(ctx); !errors.Is(err, redislock.ErrNotHeld) {
		t.Fatalf("a second Unlock of the Hold returned %v, want ErrNotHeld", err)
	}
}

// Case 7: a user whose ACL denies the notice channel is refused by New, with
// the ACL it needs, instead of half-applying every hand-over.
func TestNewRefusesAUserThatCannotPublish(t *testing.T) {
	srv := redistest.Start(t)
	admin := srv.Client(t)
	ctx := testContext(t)
	if err := admin.Do(ctx, "acl", "setuser", "narrow", "on", ">pw", "+@all", "~*", "resetchannels", "&redisson_lock__channel:*").Err(); err != nil {
		t.Fatal(err)
	}
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr, Username: "narrow", Password: "pw"})
	t.Cleanup(func() { _ = rdb.Close() })
	_, err := redislock.New(rdb, redislock.Options{})
	if !errors.Is(err, redislock.ErrPermission) || !strings.Contains(err.Error(), redislock.MinimalACL) {
		t.Fatalf("New for a user that may not publish notices returned %v, want ErrPermission naming the ACL it needs", err)
	}
}

// A user made from MinimalACL before the scripts ran HMGET and ZRANK (an
// install from before the library's rewrite) is refused by New with
// ErrPermission, naming what it lacks.
func TestNewRefusesAUserWithoutACommandTheScriptsRun(t *testing.T) {
	srv := redistest.Start(t)
	admin := srv.Client(t)
	ctx := testContext(t)
	older := strings.NewReplacer("+hmget ", "", "+zrank ", "").Replace(redislock.MinimalACL)
	args := []any{"acl", "setuser", "older", "on", ">pw"}
	for _, rule := range strings.Fields(older) {
		args = append(args, rule)
	}
	if err := admin.Do(ctx, args...).Err(); err != nil {
		t.Fatal(err)
	}
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr, Username: "older", Password: "pw"})
	t.Cleanup(func() { _ = rdb.Close() })
	_, err := redislock.New(rdb, redislock.Options{})
	if !errors.Is(err, redislock.ErrPermission) || !strings.Contains(err.Error(), "hmget") {
		t.Fatalf("New for a user without HMGET returned %v, want ErrPermission naming hmget", err)
	}
}

// Case 7: a waiter whose subscription is never confirmed (here, the ACL
// denies SUBSCRIBE) still gets the lock by polling, even with a context that
// never ends.
func TestWaiterWithoutSubscriptionPolls(t *testing.T) {
	srv := redistest.Start(t)
	admin := srv.Client(t)
	ctx := context.Background()
	if err := admin.Do(ctx, "acl", "setuser", "nosub", "on", ">pw", "+@all", "-subscribe", "~*", "allchannels").Err(); err != nil {
		t.Fatal(err)
	}
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr, Username: "nosub", Password: "pw"})
	t.Cleanup(func() { _ = rdb.Close() })
	opts := redislock.Options{RetryFallback: 50 * time.Millisecond, QueueTTL: time.Second}
	holderClient := newClient(t, admin, opts)
	waiterClient := newClient(t, rdb, opts)
	name := lockName(t)
	holder := mustLock(t, testContext(t), newMutex(t, holderClient, name, nil))

	// context.Background: no bound but the library's own.
	handOver(t, ctx, holderClient, holder, newMutex(t, waiterClient, name, nil), "the lock reaching a waiter without a confirmed subscription")
}

// Case 8: a waiter whose owner ID does not start with its client's ID still
// gets its hand-over notice: the notice goes to the client that queued it.
// With a RetryFallback of a minute, only the notice can wake it in time.
func TestHandOverReachesAnOwnerOfAnotherPrefix(t *testing.T) {
	b, _ := standalone(t)
	ctx := testContext(t)
	opts := redislock.Options{RetryFallback: time.Minute, QueueTTL: 2 * time.Minute}
	holderClient := newClient(t, b.newRedis(t), opts)
	waiterClient := newClient(t, b.newRedis(t), opts)
	name := lockName(t)
	holder := mustLock(t, ctx, newMutex(t, holderClient, name, nil))

	waiter := newMutex(t, waiterClient, name, &redislock.MutexOptions{Owner: "pod-uid-of-someone-else:7"})
	handOver(t, ctx, holderClient, holder, waiter, "the hand-over notice reaching a waiter whose owner has another prefix")
}

// handOver queues a Lock of waiter behind holder, unlocks holder, and fails
// the test unless the lock reaches the waiter within 10 s, a bound only the
// messages the test is about can meet; the waiter's hold is then unlocked.
func handOver(t *testing.T, ctx context.Context, c *redislock.Client, holder *redislock.Hold, waiter *redislock.Mutex, what string) {
	t.Helper()
	got := lockInBackground(t, ctx, waiter)
	waitFor(t, func() bool { return len(inspect(t, c, holder.Name()).Waiters) == 1 }, "the waiter to queue")
	mustUnlock(t, ctx, holder)
	if h := receiveHold(t, got, 10*time.Second, what); h != nil {
		mustUnlock(t, ctx, h)
	}
}

// Case 9: with WaitReplicas, a Lock that ends by a hand-over also waits for
// the replicas. This Redis has none, so no Lock may succeed.
func TestWaitReplicasCoversHandOvers(t *testing.T) {
	b, _ := standalone(t)
	ctx := testContext(t)
	holderClient := newClient(t, b.newRedis(t), redislock.Options{})
	synced := newClient(t, b.newRedis(t), redislock.Options{WaitReplicas: 1, WaitReplicasTimeout: 10 * time.Millisecond,
		RetryFallback: 50 * time.Millisecond, QueueTTL: time.Second})
	name := lockName(t)
	holder := mustLock(t, ctx, newMutex(t, holderClient, name, nil))

	result := make(chan error, 1)
	go func() {
		h, err := newMutex(t, synced, name, nil).TryLock(ctx, time.Second)
		if h != nil {
			_ = h.Unlock(ctx)
		}
		result <- err
	}()
	waitFor(t, func() bool { return len(inspect(t, holderClient, name).Waiters) == 1 }, "the waiter to queue")
	mustUnlock(t, ctx, holder)
	if err := <-result; err == nil {
		t.Fatal("a Lock ended by a hand-over succeeded without the replica it must wait for")
	}
	if info := inspect(t, holderClient, name); info.Held() || len(info.Waiters) != 0 {
		t.Fatalf("after the failed Lock the lock is %+v, want free", info)
	}
}

// Case 10: a term lasts as long as the leader holds on, well past one lease.
func TestElectionTermOutlivesItsLease(t *testing.T) {
	b, _ := standalone(t)
	ctx, cancel := context.WithCancel(testContext(t))
	// Long enough that a loaded machine's scheduling stalls do not end it.
	lease := 1500 * time.Millisecond
	c := newClient(t, b.newRedis(t), redislock.Options{WatchdogLease: lease})
	ended := make(chan error, 1)
	done := make(chan error, 1)
	go func() {
		done <- c.RunElection(ctx, redislock.Election{
			Name: lockName(t),
			OnStartedLeading: func(termCtx context.Context, _ redislock.Term) {
				select {
				case <-termCtx.Done():
					ended <- context.Cause(termCtx)
				case <-time.After(3 * lease):
					ended <- nil
				}
				<-termCtx.Done()
			},
		})
	}()
	if cause := <-ended; cause != nil {
		t.Fatalf("the term ended after less than 3 leases: %v", cause)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// Case 5: after one Cluster shard lost its script cache (a restart or a
// failover), the renewals of the locks on every shard go on: each refused
// renewal loads the script on its node, not only the batch's first.
func TestRenewalsSurviveAShardLosingItsScripts(t *testing.T) {
	cl := redistest.StartCluster(t, 3, 0)
	ctx := testContext(t)
	// Long enough that a loaded machine's stalls do not end one of 30 leases.
	lease := 1500 * time.Millisecond
	rdb := cl.Client(t)
	c := newClient(t, rdb, redislock.Options{WatchdogLease: lease})
	var holds []*redislock.Hold
	for i := range 30 {
		holds = append(holds, mustLock(t, ctx, newMutex(t, c, fmt.Sprintf("%s-%d", lockName(t), i), nil)))
	}
	masters := cl.Addrs() // no replicas: every node is a master
	for round := range 3 {
		// One master per round loses its scripts, a different one each time.
		node := redis.NewClient(&redis.Options{Addr: masters[round%len(masters)]})
		err := node.ScriptFlush(ctx).Err()
		_ = node.Close()
		if err != nil {
			t.Fatal(err)
		}
		time.Sleep(lease) // three renewals
	}
	for _, h := range holds {
		if err := h.Err(); err != nil {
			t.Fatalf("%s was lost after a shard lost its scripts: %v", h.Name(), err)
		}
		mustUnlock(t, ctx, h)
	}
}

// Closing a client takes its waiters out of the wait queue: a graceful
// shutdown leaves nothing behind for the others to wait out.
func TestCloseLeavesTheQueue(t *testing.T) {
	b, _ := standalone(t)
	ctx := testContext(t)
	holderClient := newClient(t, b.newRedis(t), redislock.Options{})
	waiterClient, err := redislock.New(b.newRedis(t), redislock.Options{})
	if err != nil {
		t.Fatal(err)
	}
	name := lockName(t)
	holder := mustLock(t, ctx, newMutex(t, holderClient, name, nil))
	result := make(chan error, 1)
	go func() {
		_, err := newMutex(t, waiterClient, name, nil).Lock(ctx)
		result <- err
	}()
	waitFor(t, func() bool { return len(inspect(t, holderClient, name).Waiters) == 1 }, "the waiter to queue")
	if err := waiterClient.Close(); err != nil {
		t.Fatal(err)
	}
	wantErr(t, <-result, redislock.ErrClosed)
	if info := inspect(t, holderClient, name); len(info.Waiters) != 0 {
		t.Fatalf("after Close the queue still holds %v", info.Waiters)
	}
	mustUnlock(t, ctx, holder)
}

// A caller's own deadline is reported as such, not as Redis being down,
// also when it strikes while a reply is on its way.
func TestCallerDeadlineIsNotUnavailable(t *testing.T) {
	p := startProxied(t)
	c := newClient(t, p.client(t, 3), redislock.Options{})
	m := newMutex(t, c, lockName(t), nil)
	p.proxy.Delay(200 * time.Millisecond)
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	hold, err := m.TryLock(ctx, 0)
	if hold != nil || !errors.Is(err, context.DeadlineExceeded) || errors.Is(err, redislock.ErrUnavailable) {
		t.Fatalf("TryLock past the caller's deadline returned %v, %v; want context.DeadlineExceeded", hold, err)
	}
	p.proxy.Heal()
	// Whatever the late request did was found out and undone.
	waitFor(t, func() bool { return !inspect(t, newClient(t, p.direct(t), redislock.Options{}), m.Name()).Held() }, "the lock to be free")
}

// Options that Redis could not honour are refused with a clear error.
func TestOptionsThatCannotWorkAreRefused(t *testing.T) {
	b, _ := standalone(t)
	rdb := b.newRedis(t)
	for _, tc := range []struct {
		opts redislock.Options
		want string
	}{
		{redislock.Options{RetryFallback: time.Second, QueueTTL: time.Second}, "QueueTTL"},
		{redislock.Options{WatchdogLease: 500 * time.Microsecond}, "WatchdogLease"},
		{redislock.Options{WatchdogLease: 5500 * time.Microsecond}, "WatchdogLease"},
	} {
		if _, err := redislock.New(rdb, tc.opts); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("New(%+v) = %v, want an error about %s", tc.opts, err, tc.want)
		}
	}
	c := newClient(t, rdb, redislock.Options{})
	for _, lease := range []time.Duration{time.Microsecond, 9 * time.Millisecond, 10*time.Millisecond + time.Microsecond} {
		if _, err := c.NewMutex("x", &redislock.MutexOptions{Lease: lease}); err == nil {
			t.Errorf("NewMutex with a lease of %v succeeded", lease)
		}
	}
}

// Redis memory stays bounded: the keys a lock leaves behind all expire, but
// Redisson's fencing counter, which Redisson's fenced lock never expires
// either (case 7 of issue 21).
func TestLockKeysExpire(t *testing.T) {
	b, srv := standalone(t)
	ctx := testContext(t)
	opts := redislock.Options{RetryFallback: 50 * time.Millisecond, QueueTTL: time.Second}
	a := newClient(t, b.newRedis(t), opts)
	w := newClient(t, b.newRedis(t), opts)
	name := lockName(t)
	holder := mustLock(t, ctx, newMutex(t, a, name, nil))
	got := lockInBackground(t, ctx, newMutex(t, w, name, nil))
	waitFor(t, func() bool { return len(inspect(t, a, name).Waiters) == 1 }, "the waiter to queue")
	mustUnlock(t, ctx, holder)
	mustUnlock(t, ctx, receiveHold(t, got, 10*time.Second, "the hand-over"))

	rdb := srv.Client(t)
	keys, err := rdb.Keys(ctx, "*").Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, key := range keys {
		if strings.HasPrefix(key, "redisson_lock_token:") {
			continue
		}
		if ttl := rdb.PTTL(ctx, key).Val(); ttl < 0 {
			t.Errorf("key %s has no expiry", key)
		}
	}
}

// Names with a hash tag of their own work as Redisson's do: the lock's keys
// share that tag, so they stay in one Cluster slot.
func TestHashTaggedNames(t *testing.T) {
	b := cluster(t)
	ctx := testContext(t)
	c := newClient(t, b.newRedis(t), redislock.Options{})
	for _, name := range []string{"{tenant}:orders", "orders:{tenant}"} {
		m := newMutex(t, c, name, nil)
		hold := mustLock(t, ctx, m)
		if hold.Token() <= 0 {
			t.Fatalf("%s: token %d", name, hold.Token())
		}
		mustUnlock(t, ctx, hold)
	}
	for _, name := range []string{"{}orders", "a{b", "a}b"} {
		if _, err := c.NewMutex(name, nil); !errors.Is(err, redislock.ErrInvalidName) {
			t.Errorf("NewMutex(%q) = %v, want ErrInvalidName", name, err)
		}
	}
}
