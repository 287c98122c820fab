package redislock_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/lockwarden/lockwarden/internal/redistest"
	"github.com/lockwarden/lockwarden/pkg/redislock"
)

// candidate runs an election in the background and records its terms.
type candidate struct {
	terms   chan redislock.Term // each term as it starts
	stopped chan error          // each term's end cause
	done    chan error
	result  func() error // stops the election and returns what RunElection did
}

func campaign(t *testing.T, c *redislock.Client, name string) *candidate {
	ctx, cancel := context.WithCancel(context.Background())
	cand := &candidate{terms: make(chan redislock.Term, 10), stopped: make(chan error, 10), done: make(chan error, 1)}
	go func() {
		cand.done <- c.RunElection(ctx, redislock.Election{
			Name: name,
			OnStartedLeading: func(ctx context.Context, term redislock.Term) {
				cand.terms <- term
				<-ctx.Done()
			},
			OnStoppedLeading: func(term redislock.Term, cause error) { cand.stopped <- cause },
		})
	}()
	cand.result = sync.OnceValue(func() error {
		cancel()
		return <-cand.done
	})
	t.Cleanup(func() { _ = cand.result() })
	return cand
}

func (c *candidate) nextTerm(t *testing.T) redislock.Term {
	t.Helper()
	select {
	case term := <-c.terms:
		return term
	case <-time.After(10 * time.Second):
		t.Fatal("no term started")
		return redislock.Term{}
	}
}

func (c *candidate) nextStop(t *testing.T) error {
	t.Helper()
	select {
	case cause := <-c.stopped:
		return cause
	case <-time.After(10 * time.Second):
		t.Fatal("no term ended")
		return nil
	}
}

func (c *candidate) noTerm(t *testing.T, within time.Duration) {
	t.Helper()
	select {
	case term := <-c.terms:
		t.Fatalf("unexpected %v", term)
	case <-time.After(within):
	}
}

func TestElectionHandsOverOnShutdown(t *testing.T) {
	srv := redistest.Start(t)
	// A fallback longer than the test's bounds: the standby must be woken
	// by the release, not by polling.
	opts := redislock.Options{RetryFallback: time.Minute}
	name := lockName(t)
	leader := campaign(t, newClient(t, srv.Client(t), opts), name)
	first := leader.nextTerm(t)
	standby := campaign(t, newClient(t, srv.Client(t), opts), name)
	standby.noTerm(t, 200*time.Millisecond)

	if err := leader.result(); err != nil {
		t.Fatalf("RunElection returned %v after shutdown", err)
	}
	wantErr(t, leader.nextStop(t), redislock.ErrReleased)
	second := standby.nextTerm(t)
	if second.Token <= first.Token {
		t.Fatalf("term tokens %d then %d, want increasing", first.Token, second.Token)
	}
}

func TestElectionLossCancelsTheTerm(t *testing.T) {
	srv := redistest.Start(t)
	name := lockName(t)
	ctx := testContext(t)
	// A lease a loaded machine's stalls do not end before the ForceReleaseClient:
	// the term must end for the other owner found, not for a lapse.
	aClient := newClient(t, srv.Client(t), redislock.Options{WatchdogLease: 1500 * time.Millisecond})
	a := campaign(t, aClient, name)
	first := a.nextTerm(t)

	admin := newClient(t, srv.Client(t), redislock.Options{})
	if _, err := admin.ForceReleaseClient(ctx, name, aClient.ID()); err != nil {
		t.Fatal(err)
	}
	other := mustLock(t, ctx, newMutex(t, admin, name, nil))
	// The renewal finds another owner: the term's context is cancelled.
	wantErr(t, a.nextStop(t), redislock.ErrNotOwner)
	a.noTerm(t, 100*time.Millisecond)

	// a campaigns again and leads once the lock is free, with a new token.
	mustUnlock(t, ctx, other)
	second := a.nextTerm(t)
	if second.Token <= first.Token {
		t.Fatalf("term tokens %d then %d, want increasing", first.Token, second.Token)
	}
}

func TestElectionStopsWhenCallbackReturns(t *testing.T) {
	srv := redistest.Start(t)
	c := newClient(t, srv.Client(t), redislock.Options{})
	name := lockName(t)
	var mu sync.Mutex
	var causes []error
	err := c.RunElection(testContext(t), redislock.Election{
		Name:             name,
		OnStartedLeading: func(context.Context, redislock.Term) {},
		OnStoppedLeading: func(_ redislock.Term, cause error) {
			mu.Lock()
			causes = append(causes, cause)
			mu.Unlock()
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(causes) != 1 || !errors.Is(causes[0], redislock.ErrReleased) {
		t.Fatalf("terms ended with %v, want one ErrReleased", causes)
	}
	if inspect(t, c, name).Held() {
		t.Fatal("the lock is still held after the election stopped")
	}
	if err := c.RunElection(context.Background(), redislock.Election{Name: name}); err == nil {
		t.Fatal("RunElection without OnStartedLeading did not fail")
	}
}
