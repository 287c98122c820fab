package redislock_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/go-logr/logr/funcr"
	"github.com/redis/go-redis/v9"

	"github.com/lockwarden/lockwarden/internal/redistest"
	"github.com/lockwarden/lockwarden/pkg/redislock"
)

// Traps a user could fall into, each closed: a name that is another lock's
// key, a context kept past its Unlock, a hold left for an adopter, a
// TryLock whose request arrives late, a replica check while waiting, a
// non-final Unlock in flight, a Redis that evicts.

// A name that is, or could become, another lock's key or channel is
// refused before Redis, with a message that says why: holding
// "redisson_lock_token:{orders}" would make the lock "orders" fail with
// WRONGTYPE, and "lockwarden_lock_queue:{orders}" would delete its waiters'
// places.
func TestNamesThatAreAnotherLocksKeysAreRefused(t *testing.T) {
	srv := redistest.Start(t)
	ctx := testContext(t)
	c := newClient(t, srv.Client(t), redislock.Options{})
	for _, name := range []string{
		"redisson_lock_token:{orders}",
		"redisson_lock__channel:{orders}",
		"lockwarden_lock_queue:{orders}",
		"lockwarden_lock_queue_entry:{orders}",
		"lockwarden_lock_done:{orders}",
		"lockwarden_lock_freed:{orders}",
		"lockwarden_lock__notice:{orders}:client",
		"redisson_lock_token:orders-2",
	} {
		_, err := c.NewMutex(name, nil)
		if !errors.Is(err, redislock.ErrInvalidName) || !strings.Contains(err.Error(), "another lock") {
			t.Errorf("NewMutex(%q) = %v, want ErrInvalidName saying it could be another lock's key", name, err)
		}
		if _, err := c.Inspect(ctx, name); !errors.Is(err, redislock.ErrInvalidName) {
			t.Errorf("Inspect(%q) = %v, want ErrInvalidName", name, err)
		}
		if _, err := c.ForceReleaseClient(ctx, name, c.ID()); !errors.Is(err, redislock.ErrInvalidName) {
			t.Errorf("ForceReleaseClient(%q) = %v, want ErrInvalidName", name, err)
		}
	}
	// Names that only look alike are locks of their own.
	for _, name := range []string{"orders", "redisson_lock", "lockwarden_lock_queues", "{tenant}:redisson_lock_token:x"} {
		if _, err := c.NewMutex(name, nil); err != nil {
			t.Errorf("NewMutex(%q) = %v, want it accepted", name, err)
		}
	}
	if keys := srv.Client(t).Keys(ctx, "*").Val(); len(keys) != 0 {
		t.Errorf("refused names left keys in Redis: %v", keys)
	}
}

// A context that carries a Hold is no capability to take the lock anew:
// once the Hold is unlocked, or its ownership is gone from Redis, a Lock
// with it fails with ErrNotHeld and leaves the lock as it was.
func TestWithHoldOfAnEndedHoldReentersNothing(t *testing.T) {
	srv := redistest.Start(t)
	ctx := testContext(t)
	name := lockName(t)
	c := newClient(t, srv.Client(t), quietRenewals)
	m := newMutex(t, c, name, nil)

	unlocked := mustLock(t, ctx, m)
	mustUnlock(t, ctx, unlocked)
	_, err := m.Lock(redislock.WithHold(ctx, unlocked))
	wantErr(t, err, redislock.ErrNotHeld)
	if inspect(t, c, name).Held() {
		t.Fatal("a Lock with an unlocked Hold took the lock")
	}

	// Gone from Redis while the Hold has not noticed yet: Redis refuses
	// the re-entry by the ownership's token.
	lost := mustLock(t, ctx, m)
	operator := newClient(t, srv.Client(t), redislock.Options{})
	if n, err := operator.ForceReleaseClient(ctx, name, c.ID()); err != nil || n != 1 {
		t.Fatalf("ForceReleaseClient = %d, %v", n, err)
	}
	if lost.Err() != nil {
		t.Fatalf("the Hold noticed the loss before the test could try: %v", lost.Err())
	}
	_, err = m.Lock(redislock.WithHold(ctx, lost))
	wantErr(t, err, redislock.ErrNotHeld)
	if info := inspect(t, c, name); info.Held() {
		t.Fatalf("a Lock with a Hold whose ownership Redis lost took the lock: %+v", info)
	}
	_, err = m.TryLock(redislock.WithHold(ctx, lost), 0)
	wantErr(t, err, redislock.ErrNotHeld)
}

// A hold a closing client left for an adopter (Options.KeepOnClose) ends
// with the adopter's last Unlock: the lock is free, not held by the closed
// client's level until its lease runs out.
func TestAnAdoptedHoldEndsWithTheAdoptersUnlock(t *testing.T) {
	srv := redistest.Start(t)
	ctx := testContext(t)
	name := lockName(t)
	owner := redislock.Owner("pod-uid:0")
	opts := redislock.Options{KeepOnClose: true}
	before := newClient(t, srv.Client(t), opts)
	left := mustLock(t, ctx, newMutex(t, before, name, &redislock.MutexOptions{Owner: owner}))
	mustLock(t, redislock.WithHold(ctx, left), newMutex(t, before, name, &redislock.MutexOptions{Owner: owner}))
	if err := before.Close(); err != nil {
		t.Fatal(err)
	}
	if info := inspect(t, newClient(t, srv.Client(t), redislock.Options{}), name); !info.Held() || info.Holders[0].Count != 2 {
		t.Fatalf("after a Close that keeps its locks the lock is %+v, want held twice by %s", info, owner)
	}

	adopter := newClient(t, srv.Client(t), opts)
	adopted := mustLock(t, ctx, newMutex(t, adopter, name, &redislock.MutexOptions{Owner: owner}))
	if adopted.Token() != left.Token() {
		t.Fatalf("the adopter's token %d, want the left hold's %d", adopted.Token(), left.Token())
	}
	mustUnlock(t, ctx, adopted)
	if info := inspect(t, adopter, name); info.Held() {
		t.Fatalf("after the adopter's last Unlock the lock is %+v, want free", info)
	}

	// A level of a live client of the same owner is not abandoned: giving
	// back a re-entry leaves it held.
	live := newClient(t, srv.Client(t), opts)
	kept := mustLock(t, ctx, newMutex(t, live, name, &redislock.MutexOptions{Owner: owner}))
	reentry := mustLock(t, ctx, newMutex(t, adopter, name, &redislock.MutexOptions{Owner: owner}))
	mustUnlock(t, ctx, reentry)
	if info := inspect(t, adopter, name); !info.Held() || kept.Err() != nil {
		t.Fatalf("giving back a re-entry freed a live client's hold: %+v, %v", info, kept.Err())
	}
	mustUnlock(t, ctx, kept)
}

// A TryLock(ctx, 0) that found the lock held, after its request had to be
// sent again, leaves nothing a late copy of that request could use: once
// the lock is free, the copy takes nothing.
func TestALateCopyOfAFailedTryLockTakesNothing(t *testing.T) {
	srv := redistest.Start(t)
	ctx := testContext(t)
	name := lockName(t)
	holder := newClient(t, srv.Client(t), redislock.Options{})
	h := mustLock(t, ctx, newMutex(t, holder, name, nil))

	rdb := srv.Client(t)
	first := &firstCopy{}
	rdb.AddHook(first)
	trier := newClient(t, rdb, redislock.Options{})
	m := newMutex(t, trier, name, &redislock.MutexOptions{Lease: time.Minute})
	first.arm()
	_, err := m.TryLock(ctx, 0)
	wantErr(t, err, redislock.ErrWaitTimeout)
	args := first.captured()
	if args == nil {
		t.Fatal("no acquire request was captured")
	}
	mustUnlock(t, ctx, h)

	// The first copy arrives now, after the TryLock returned.
	if err := srv.Client(t).Do(ctx, args...).Err(); err != nil && !errors.Is(err, redis.Nil) {
		t.Fatal(err)
	}
	if info := inspect(t, holder, name); info.Held() {
		t.Fatalf("a late copy of a TryLock that returned ErrWaitTimeout took the lock for nobody: %+v", info)
	}
}

// firstCopy is a go-redis hook that, once armed, keeps the arguments of the
// next acquire request and loses its reply, as a connection reset after
// Redis ran it would: the client sends it again, and the test can replay
// the first copy later, as a network that held it back would.
type firstCopy struct {
	mu    sync.Mutex
	armed bool
	args  []any
}

func (f *firstCopy) arm() {
	f.mu.Lock()
	f.armed = true
	f.mu.Unlock()
}

func (f *firstCopy) captured() []any {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.args
}

func (f *firstCopy) DialHook(next redis.DialHook) redis.DialHook { return next }
func (f *firstCopy) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		f.mu.Lock()
		take := false
		if kind, _ := redislock.ScriptCall(cmd.Args()); f.armed && kind == "acquire" {
			f.armed, take = false, true
			f.args = append([]any(nil), cmd.Args()...)
		}
		f.mu.Unlock()
		if !take {
			return next(ctx, cmd)
		}
		// Not sent: the test sends this copy once the TryLock returned.
		err := &net.OpError{Op: "read", Net: "tcp", Err: syscall.ECONNRESET}
		cmd.SetErr(err)
		return err
	}
}
func (f *firstCopy) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// A waiting Lock whose replicas do not acknowledge the hand-over fails with
// ErrUnavailable, saying so, and leaves the lock free: it neither waits on
// with a call it gave up, nor answers an untyped error.
func TestAWaitingLockWithTooFewReplicasFailsTyped(t *testing.T) {
	b, _ := standalone(t)
	ctx := testContext(t)
	name := lockName(t)
	holder := newClient(t, b.newRedis(t), redislock.Options{})
	synced := newClient(t, b.newRedis(t), redislock.Options{WaitReplicas: 1, WaitReplicasTimeout: time.Second})
	h := mustLock(t, ctx, newMutex(t, holder, name, nil))
	waiting := lockAsync(ctx, newMutex(t, synced, name, nil))
	waitQueued(t, holder, name, 1)
	mustUnlock(t, ctx, h)
	r := <-waiting
	wantErr(t, r.err, redislock.ErrUnavailable)
	if !strings.Contains(r.err.Error(), "replicas") {
		t.Fatalf("error %q does not say replicas were missing", r.err)
	}
	if info := inspect(t, holder, name); info.Held() || len(info.Waiters) != 0 {
		t.Fatalf("after the failed Lock the lock is %+v, want free", info)
	}
}

// A renewal that finds the lock gone ends the Hold at once, even while a
// non-final Unlock of the same ownership is in flight: only a last Unlock
// may free the lock, so only it explains the lock being gone.
func TestANonFinalUnlockInFlightHidesNoLoss(t *testing.T) {
	srv := redistest.Start(t)
	ctx := testContext(t)
	name := lockName(t)
	rdb := srv.Client(t)
	slow := &slowReleases{delay: 6 * time.Second}
	rdb.AddHook(slow)
	c := newClient(t, rdb, redislock.Options{WatchdogLease: 9 * time.Second, RenewInterval: 500 * time.Millisecond})
	m := newMutex(t, c, name, nil)
	outer := mustLock(t, ctx, m)
	inner := mustLock(t, redislock.WithHold(ctx, outer), m)
	unlocked := make(chan error, 1)
	go func() { unlocked <- inner.Unlock(ctx) }()
	waitFor(t, slow.inFlight, "the inner Unlock's release to run, its reply held back")

	operator := newClient(t, srv.Client(t), redislock.Options{})
	if n, err := operator.ForceReleaseClient(ctx, name, c.ID()); err != nil || n != 1 {
		t.Fatalf("ForceReleaseClient = %d, %v", n, err)
	}
	lostAt := time.Now()
	waitDone(t, outer.Done(), 15*time.Second, "the lost-lease signal")
	if took := time.Since(lostAt); took > 3*time.Second {
		t.Fatalf("the Hold learned of the loss %v after it, want within a renewal or two (500 ms each), not at its deadline", took.Round(time.Millisecond))
	}
	if err := <-unlocked; err != nil {
		t.Fatalf("the inner Unlock, a level of a lock force-released meanwhile = %v, want nil: its level was undone first", err)
	}
}

// slowReleases holds the replies of release scripts back for delay, once
// Redis has run them; inFlight reports one so held.
type slowReleases struct {
	delay time.Duration
	mu    sync.Mutex
	n     int
}

func (s *slowReleases) inFlight() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.n > 0
}

func (s *slowReleases) DialHook(next redis.DialHook) redis.DialHook { return next }
func (s *slowReleases) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		kind, _ := redislock.ScriptCall(cmd.Args())
		err := next(ctx, cmd)
		if kind != "release" || err != nil {
			return err
		}
		s.mu.Lock()
		s.n++
		s.mu.Unlock()
		time.Sleep(s.delay)
		return err
	}
}
func (s *slowReleases) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// New warns when Redis may evict lock keys: an evicted lock is taken from
// its holder unseen, and an evicted record of finished calls lets a late
// copy of a request take a lock for nobody.
func TestNewWarnsOfARedisThatEvicts(t *testing.T) {
	for _, tc := range []struct {
		policy string
		warn   bool
	}{{"allkeys-lru", true}, {"volatile-ttl", true}, {"noeviction", false}} {
		t.Run(tc.policy, func(t *testing.T) {
			srv := redistest.Start(t, "--maxmemory-policy", tc.policy)
			var mu sync.Mutex
			var logged []string
			logger := funcr.New(func(prefix, args string) {
				mu.Lock()
				logged = append(logged, args)
				mu.Unlock()
			}, funcr.Options{})
			newClient(t, srv.Client(t), redislock.Options{Logger: logger})
			mu.Lock()
			defer mu.Unlock()
			warned := strings.Contains(fmt.Sprint(logged), "noeviction")
			if warned != tc.warn {
				t.Fatalf("maxmemory-policy %s: warned %v (logged %v), want %v", tc.policy, warned, logged, tc.warn)
			}
		})
	}
}
