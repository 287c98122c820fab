package redislock_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/lockwarden/lockwarden/internal/redistest"
	"github.com/lockwarden/lockwarden/pkg/redislock"
)

// Every answer is true: Unlock returns nil only if the Hold's ownership was
// the lock's owner when the release ran, or the same request's first send
// freed it, as Redis records; and no Hold outlives its lock with Err() ==
// nil. These tests play the adversary: a lost hold, a slow reply, a lost
// reply of a release that handed the lock over.

// quietRenewals keeps the watchdog from renewing within a test, so that the
// Hold learns of a loss only from the call under test.
var quietRenewals = redislock.Options{WatchdogLease: time.Minute, RenewInterval: 50 * time.Second}

// An Unlock of a hold that Redis lost, while another owner took the lock and
// let it go in between, is an error, and the Hold's cause says the lease was
// lost: the holder must learn that somebody else held its lock during its
// critical section.
func TestUnlockOfAHoldRedisLostIsAnError(t *testing.T) {
	for _, tc := range []struct {
		name string
		lose func(t *testing.T, srv *redistest.Server, name string, holder *redislock.Client)
	}{
		{"force-released by another client", func(t *testing.T, srv *redistest.Server, name string, holder *redislock.Client) {
			operator := newClient(t, srv.Client(t), redislock.Options{})
			if n, err := operator.ForceReleaseClient(context.Background(), name, holder.ID()); err != nil || n != 1 {
				t.Fatalf("ForceReleaseClient = %d, %v; want 1 holder removed", n, err)
			}
		}},
		{"Redis restarted without persistence", func(t *testing.T, srv *redistest.Server, _ string, _ *redislock.Client) {
			srv.Stop()
			if err := srv.Restart(); err != nil {
				t.Fatal(err)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := redistest.Start(t)
			ctx := testContext(t)
			name := lockName(t)
			holder := newClient(t, srv.Client(t), quietRenewals)
			lost := mustLock(t, ctx, newMutex(t, holder, name, nil))

			tc.lose(t, srv, name, holder)
			other := newClient(t, srv.Client(t), redislock.Options{})
			between := mustLock(t, ctx, newMutex(t, other, name, nil))
			mustUnlock(t, ctx, between)

			err := lost.Unlock(ctx)
			if !errors.Is(err, redislock.ErrNotHeld) {
				t.Fatalf("Unlock of a hold Redis lost, after another owner held the lock = %v, want ErrNotHeld", err)
			}
			if cause := context.Cause(lost.Context()); errors.Is(cause, redislock.ErrReleased) || cause == nil {
				t.Fatalf("the lost Hold ended with %v, want a lost lease", cause)
			}
		})
	}
}

// A contended final Unlock whose reply was lost, resent, reports the release
// it made: the first send freed the lock and handed it to the waiter, whom
// the resend finds holding it. No lost lease is counted.
func TestContendedFinalUnlockWhoseReplyWasLostIsARelease(t *testing.T) {
	srv := redistest.Start(t)
	ctx := testContext(t)
	name := lockName(t)
	loser := &replyLoser{}
	rdb := srv.Client(t)
	rdb.AddHook(loser)
	metrics := redislock.NewMetrics()
	holder := newClient(t, rdb, redislock.Options{Metrics: metrics})
	waiter := newClient(t, srv.Client(t), redislock.Options{})
	h := mustLock(t, ctx, newMutex(t, holder, name, nil))
	waiting := lockAsync(ctx, newMutex(t, waiter, name, nil))
	waitQueued(t, holder, name, 1)

	loser.loseNext(func(args []any) bool {
		kind, owner := redislock.ScriptCall(args)
		// release.lua names all seven of the lock's keys; unlock.lua, three.
		return kind == "release" && owner == string(h.Owner()) && fmt.Sprint(args[2]) == "7"
	})
	if err := h.Unlock(ctx); err != nil {
		t.Fatalf("a final Unlock that handed the lock over, whose reply was lost = %v, want nil", err)
	}
	if loser.count() != 1 {
		t.Fatalf("%d replies lost, want the release's", loser.count())
	}
	if cause := context.Cause(h.Context()); !errors.Is(cause, redislock.ErrReleased) {
		t.Fatalf("the Hold ended with %v, want ErrReleased", cause)
	}
	if n := lostLeases(t, metrics); n != 0 {
		t.Fatalf("%v lost leases counted for a release", n)
	}
	r := <-waiting
	if r.err != nil {
		t.Fatal(r.err)
	}
	mustUnlock(t, ctx, r.h)
}

// Close ends the client's Holds before it releases their locks in Redis: a
// waiter of another client must never hold the lock while a Hold of the
// closing client still has Err() == nil, however slow Close's reply. The
// same holds for a ForceReleaseClient of the caller's own holds.
func TestReleasingCallsEndTheirHoldsFirst(t *testing.T) {
	for _, tc := range []struct {
		name    string
		release func(c *redislock.Client, name string)
	}{
		{"Close", func(c *redislock.Client, _ string) { _ = c.Close() }},
		{"ForceReleaseClient of its own holds", func(c *redislock.Client, name string) {
			_, _ = c.ForceReleaseClient(context.Background(), name, c.ID())
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := redistest.Start(t)
			ctx := testContext(t)
			name := lockName(t)
			rdb := srv.Client(t)
			slow := &slowReplies{delay: 400 * time.Millisecond}
			rdb.AddHook(slow)
			holder := newClient(t, rdb, quietRenewals)
			warm(t, ctx, holder) // release.lua loaded: the release runs with the first send
			waiter := newClient(t, srv.Client(t), redislock.Options{})
			h := mustLock(t, ctx, newMutex(t, holder, name, nil))
			waiting := lockAsync(ctx, newMutex(t, waiter, name, nil))
			waitQueued(t, waiter, name, 1)

			slow.start()
			released := make(chan struct{})
			go func() {
				defer close(released)
				tc.release(holder, name)
			}()
			r := <-waiting
			if r.err != nil {
				t.Fatal(r.err)
			}
			if err := h.Err(); err == nil {
				t.Errorf("another client's waiter holds the lock while the %s client's Hold still has Err() == nil", tc.name)
			}
			<-released
			mustUnlock(t, ctx, r.h)
		})
	}
}

// waitQueued waits until n waiters queue for the lock.
func waitQueued(t *testing.T, c *redislock.Client, name string, n int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		if len(inspect(t, c, name).Waiters) >= n {
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Fatalf("%d waiters did not queue for %s within 10s", n, name)
}

// slowReplies is a go-redis hook that, once started, holds every reply back
// for delay after Redis ran the command: a slow network on the way back.
type slowReplies struct {
	delay time.Duration
	mu    sync.Mutex
	on    bool
}

func (s *slowReplies) start() {
	s.mu.Lock()
	s.on = true
	s.mu.Unlock()
}

func (s *slowReplies) wait() {
	s.mu.Lock()
	on := s.on
	s.mu.Unlock()
	if on {
		time.Sleep(s.delay)
	}
}

func (s *slowReplies) DialHook(next redis.DialHook) redis.DialHook { return next }

func (s *slowReplies) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		s.wait()
		return err
	}
}

func (s *slowReplies) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := next(ctx, cmds)
		s.wait()
		return err
	}
}

// lostLeases is the value of the metrics' lost-lease counter.
func lostLeases(t *testing.T, m *redislock.Metrics) float64 {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	if err := reg.Register(m); err != nil {
		t.Fatal(err)
	}
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() == "redislock_lost_leases_total" {
			return f.GetMetric()[0].GetCounter().GetValue()
		}
	}
	t.Fatal("no redislock_lost_leases_total")
	return 0
}
