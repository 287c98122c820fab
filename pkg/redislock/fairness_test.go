package redislock_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lockwarden/lockwarden/internal/redistest"
	"github.com/lockwarden/lockwarden/pkg/redislock"
)

// A mixed fleet shares a lock fairly: 4 lockwarden clients and 4 clients
// running Redisson's own scripts contend for one lock, and each side gets at
// least 40% of the acquisitions (the issue 21 target for the Redisson side)
// once lockwarden's releases found the Redisson clients. Counting starts at
// the 200th acquisition, and not before a Redisson client has held the lock:
// Redisson clients that never held it are found by a race now and then
// (see races in scripts/lib.lua), which on a loaded machine took past the
// 200th, and lockwarden's hand-overs until then were counted against a
// share they do not measure. Hand-overs alone would starve the Redisson
// clients, who only take a lock they find free. Both sides also exclude each
// other throughout: the critical section counts overlaps.
func TestMixedFleetIsFair(t *testing.T) {
	srv := redistest.Start(t)
	// 1,000 acquisitions: more than testContext's 30 s on a loaded machine.
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	name := lockName(t)
	const perSide, warmup, rounds = 4, 200, 800

	var inside, overlaps atomic.Int32
	var all, ours, theirs atomic.Int64
	var found atomic.Bool        // a Redisson client has held the lock
	var countedFrom atomic.Int64 // the acquisition counting started at
	critical := func(side *atomic.Int64) {
		if inside.Add(1) != 1 {
			overlaps.Add(1)
		}
		time.Sleep(200 * time.Microsecond)
		inside.Add(-1)
		if side == &theirs {
			found.Store(true)
		}
		if n := all.Add(1); n > warmup && found.Load() {
			countedFrom.CompareAndSwap(0, n)
			side.Add(1)
		}
	}
	done := func() bool { return ours.Load()+theirs.Load() >= rounds }

	var wg sync.WaitGroup
	const think = 500 * time.Microsecond
	for i := range perSide {
		c := newClient(t, srv.Client(t), redislock.Options{RetryFallback: 100 * time.Millisecond, QueueTTL: time.Second})
		takeTurns(t, ctx, &wg, fmt.Sprintf("lockwarden client %d", i), think, done,
			lockwardenTurn(ctx, newMutex(t, c, name, nil)), func() { critical(&ours) })
		r := &redistest.Redisson{RDB: srv.Client(t), Name: name, Owner: fmt.Sprintf("0b7e3c11-redisson-%d:1", i), Lease: 30 * time.Second}
		takeTurns(t, ctx, &wg, fmt.Sprintf("Redisson client %d", i), think, done, redissonTurn(ctx, r), func() { critical(&theirs) })
	}
	wg.Wait()
	if err := ctx.Err(); err != nil {
		t.Fatalf("the fleet did not reach %d counted acquisitions: %v", rounds, err)
	}
	total := ours.Load() + theirs.Load()
	t.Logf("%d acquisitions, counted from acquisition %d on: lockwarden %d, Redisson %d", total, countedFrom.Load(), ours.Load(), theirs.Load())
	if n := overlaps.Load(); n != 0 {
		t.Fatalf("%d acquisitions overlapped another", n)
	}
	for side, n := range map[string]int64{"lockwarden": ours.Load(), "Redisson": theirs.Load()} {
		if n*10 < total*4 {
			t.Errorf("%s clients got %d of %d acquisitions, under 40%%", side, n, total)
		}
	}
}

// A Redisson client on a loaded machine acts on a release later than the
// 10 ms a race first leaves the lock to clients outside the queue, and so
// lost every race: the queue's head took the lock each time, and the
// Redisson side of a mixed fleet lost its share. A race that
// nobody outside the queue took now makes the next one wait twice as long,
// up to 80 ms. Here a Redisson client answers each release message 30 ms
// late, and every holder keeps the lock 40 ms, longer than that answer
// takes after a 10 ms race: it must still get its turns, a third of the
// acquisitions (a race it wins, the head's attempt on its release, then the
// hand-over that repays the race).
func TestARedissonClientThatAnswersLateStillWinsRaces(t *testing.T) {
	srv := redistest.Start(t)
	ctx := testContext(t)
	name := lockName(t)
	const warmup, rounds = 10, 60

	var inside, overlaps atomic.Int32
	var all, theirs atomic.Int64
	critical := func(redisson bool) {
		if inside.Add(1) != 1 {
			overlaps.Add(1)
		}
		time.Sleep(40 * time.Millisecond)
		inside.Add(-1)
		if all.Add(1) > warmup && redisson {
			theirs.Add(1)
		}
	}
	done := func() bool { return all.Load() >= warmup+rounds }

	// The Redisson client holds first, so that the waiters see a Redisson
	// holder, and releases race.
	r := &redistest.Redisson{RDB: srv.Client(t), Name: name, Owner: "0b7e3c11-loaded:1", Lease: 30 * time.Second, AnswerAfter: 30 * time.Millisecond}
	if took, _, err := r.TryLock(ctx); err != nil || !took {
		t.Fatalf("Redisson tryLock = %v, %v", took, err)
	}
	admin := newClient(t, srv.Client(t), redislock.Options{})
	var wg sync.WaitGroup
	for i := range 2 {
		m := newMutex(t, newClient(t, srv.Client(t), redislock.Options{}), name, nil)
		takeTurns(t, ctx, &wg, fmt.Sprintf("lockwarden client %d", i), 0, done, lockwardenTurn(ctx, m), func() { critical(false) })
	}
	waitFor(t, func() bool { return len(inspect(t, admin, name).Waiters) == 2 }, "both lockwarden clients to queue")
	if _, err := r.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	takeTurns(t, ctx, &wg, "Redisson client", 0, done, redissonTurn(ctx, r), func() { critical(true) })
	wg.Wait()
	if err := ctx.Err(); err != nil {
		t.Fatalf("the clients did not reach %d acquisitions: %v", warmup+rounds, err)
	}
	if n := overlaps.Load(); n != 0 {
		t.Fatalf("%d acquisitions overlapped another", n)
	}
	t.Logf("the Redisson client got %d of %d", theirs.Load(), rounds)
	if n := theirs.Load(); n*4 < rounds {
		t.Fatalf("the Redisson client that answers 30 ms late got %d of %d acquisitions, want at least a quarter", n, rounds)
	}
}

// A race's wait grows only for clients that still listen. For ten seconds
// after a Redisson holder was seen every release races, and each race that
// nobody outside the queue took doubles the next one's wait, up to 80 ms,
// while clients that are not lockwarden's listen on the release channel:
// they may be Redisson waiters too slow for it. Once nobody listens, it
// starts over at 10 ms, so that the queue does not pay 80 ms a release
// after the Redisson clients left. The waits are read from the head
// notices the races send ("1 <owner> <name> <ms>").
func TestARaceWaitsLongerOnlyWhileSomebodyOutsideListens(t *testing.T) {
	srv := redistest.Start(t)
	ctx := testContext(t)
	name := lockName(t)
	admin := newClient(t, srv.Client(t), redislock.Options{})
	notices := srv.Client(t).PSubscribe(ctx, "lockwarden_lock__notice:{"+name+"}:*")
	defer notices.Close()
	if _, err := notices.Receive(ctx); err != nil {
		t.Fatal(err)
	}
	listener, err := (&redistest.Redisson{RDB: srv.Client(t), Name: name}).Subscribe(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer listener.Close()

	// A Redisson holder, seen by a queued waiter.
	r := &redistest.Redisson{RDB: srv.Client(t), Name: name, Owner: "0b7e3c11-seen:1", Lease: time.Minute}
	if took, _, err := r.TryLock(ctx); err != nil || !took {
		t.Fatalf("Redisson tryLock = %v, %v", took, err)
	}
	holder, waiter := newMutex(t, newClient(t, srv.Client(t), redislock.Options{}), name, nil), newMutex(t, newClient(t, srv.Client(t), redislock.Options{}), name, nil)
	next := lockAsync(ctx, holder)
	waitFor(t, func() bool { return len(inspect(t, admin, name).Waiters) == 1 }, "the first waiter to queue")
	if _, err := r.Unlock(ctx); err != nil {
		t.Fatal(err)
	}

	// race hands the lock from one waiter to the other with a release that
	// races, which nobody outside the queue takes, and returns the wait
	// its head notice carried.
	race := func() string {
		t.Helper()
		got := <-next
		if got.err != nil {
			t.Fatal(got.err)
		}
		next = lockAsync(ctx, waiter)
		holder, waiter = waiter, holder
		waitFor(t, func() bool { return len(inspect(t, admin, name).Waiters) == 1 }, "the waiter to queue")
		time.Sleep(100 * time.Millisecond) // its subscription
		mustUnlock(t, ctx, got.h)
		for {
			msg, err := notices.ReceiveMessage(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if fields := strings.Fields(msg.Payload); len(fields) == 4 && fields[0] == "1" {
				return fields[3]
			}
		}
	}
	var waits []string
	for range 5 {
		waits = append(waits, race())
	}
	if err := listener.Close(); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		waits = append(waits, race())
	}
	got := <-next
	if got.err != nil {
		t.Fatal(got.err)
	}
	mustUnlock(t, ctx, got.h)
	// The fifth race's head takes the lock after the listener left.
	if want := "10 20 40 80 80 10 10"; strings.Join(waits, " ") != want {
		t.Fatalf("the races waited %v ms, want %s: doubling up to 80 while a listener stays, and 10 again once it left", waits, want)
	}
}

// The queue is owed one hand-over for each Redisson acquisition its head
// lost, and no more. A waiter that became the head counted as lost races
// every release message it had heard since its last attempt, while others
// headed the queue and had counted them already: the queue was owed those
// turns twice, and lockwarden took more than its share of a mixed fleet's
// acquisitions. Here the head loses 4 releases to Redisson clients (its
// attempts wait until another one took the lock), then leaves; the waiter
// behind it, which heard those 4 releases, heads
// the queue and takes the lock on the next one. Then lockwarden waiters
// must get exactly 4 hand-overs before a release leaves the lock free for
// Redisson clients again, as a Redisson client's tryLock right after each
// release finds.
func TestTheQueueIsOwedOnlyTheRacesItsHeadLost(t *testing.T) {
	srv := redistest.Start(t)
	ctx := testContext(t)
	name := lockName(t)
	admin := newClient(t, srv.Client(t), redislock.Options{})
	queued := func(n int) {
		t.Helper()
		waitFor(t, func() bool { return len(inspect(t, admin, name).Waiters) == n }, fmt.Sprintf("%d waiters to queue", n))
		time.Sleep(300 * time.Millisecond) // their subscriptions, and the attempt after
	}
	redisson := func(i int) *redistest.Redisson {
		return &redistest.Redisson{RDB: srv.Client(t), Name: name, Owner: fmt.Sprintf("0b7e3c11-owed-%d:1", i), Lease: time.Minute}
	}
	holder := redisson(1)
	if took, _, err := holder.TryLock(ctx); err != nil || !took {
		t.Fatalf("Redisson tryLock = %v, %v", took, err)
	}

	// The head's attempts wait at a gate while gating is set.
	headRedis := srv.Client(t)
	var gating atomic.Bool
	arrived, proceed, ran := make(chan struct{}), make(chan struct{}), make(chan struct{})
	headRedis.AddHook(&scriptHook{fn: func(kind, _ string, _ []any, run func() error) error {
		if kind != "acquire" || !gating.Load() {
			return run()
		}
		arrived <- struct{}{}
		<-proceed
		defer func() { ran <- struct{}{} }()
		return run()
	}})
	opts := redislock.Options{RetryFallback: time.Minute}
	headCtx, headLeaves := context.WithCancel(ctx)
	head := lockAsync(headCtx, newMutex(t, newClient(t, headRedis, opts), name, nil))
	queued(1)
	second := newMutex(t, newClient(t, srv.Client(t), opts), name, nil)
	third := newMutex(t, newClient(t, srv.Client(t), opts), name, nil)
	nextHold := lockAsync(ctx, second)
	queued(2)

	gating.Store(true)
	const lost = 4
	for i := range lost {
		if _, err := holder.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
		<-arrived
		holder = redisson(2 + i)
		if took, _, err := holder.TryLock(ctx); err != nil || !took {
			t.Fatalf("Redisson tryLock after release %d = %v, %v", i+1, took, err)
		}
		proceed <- struct{}{}
		<-ran
	}
	headLeaves()
	if r := <-head; r.err == nil {
		t.Fatal("the head got the lock while a Redisson client held it")
	}
	queued(1)
	if _, err := holder.Unlock(ctx); err != nil {
		t.Fatal(err)
	}

	// The second waiter now takes the lock; the third and the second then
	// take turns, each release handing the lock over while the queue is
	// owed a turn.
	handOvers := 0
	for {
		r := <-nextHold
		if r.err != nil {
			t.Fatal(r.err)
		}
		nextHold = lockAsync(ctx, third)
		queued(1)
		second, third = third, second
		mustUnlock(t, ctx, r.h)
		raced, _, err := redisson(9).TryLock(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if raced {
			if _, err := redisson(9).Unlock(ctx); err != nil {
				t.Fatal(err)
			}
		}
		if raced || handOvers >= 2*lost {
			if r := <-nextHold; r.err == nil {
				mustUnlock(t, ctx, r.h)
			}
			break
		}
		handOvers++
	}
	if handOvers != lost {
		t.Fatalf("after the head lost %d releases to Redisson clients, the queue got %d hand-overs before a release raced, want %d", lost, handOvers, lost)
	}
}

// takeTurns starts a worker on wg that, until done or ctx ends, takes the
// lock with lock, runs critical, gives the lock up with the unlock function
// lock returned, and pauses for think. An error fails t, but for one that
// ends the worker because ctx did.
func takeTurns(t *testing.T, ctx context.Context, wg *sync.WaitGroup, who string, think time.Duration, done func() bool,
	lock func() (unlock func() error, err error), critical func()) {
	wg.Add(1)
	go func() {
		defer wg.Done()
		for !done() && ctx.Err() == nil {
			unlock, err := lock()
			if err != nil {
				if ctx.Err() == nil {
					t.Errorf("%s: %v", who, err)
				}
				return
			}
			critical()
			if err := unlock(); err != nil {
				t.Errorf("%s: %v", who, err)
				return
			}
			time.Sleep(think)
		}
	}()
}

// lockwardenTurn and redissonTurn take a lock for takeTurns.
func lockwardenTurn(ctx context.Context, m *redislock.Mutex) func() (func() error, error) {
	return func() (func() error, error) {
		hold, err := m.Lock(ctx)
		if err != nil {
			return nil, err
		}
		return func() error { return hold.Unlock(ctx) }, nil
	}
}

func redissonTurn(ctx context.Context, r *redistest.Redisson) func() (func() error, error) {
	return func() (func() error, error) {
		if err := r.Lock(ctx); err != nil {
			return nil, err
		}
		return func() error { _, err := r.Unlock(ctx); return err }, nil
	}
}
