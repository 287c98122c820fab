package redislock

import (
	"context"
	"testing"

	"github.com/lockwarden/lockwarden/internal/redistest"
)

// TestLeaveUndoesALateHandOver: a waiter that gave up just as the lock was
// handed to it leaves with leave.lua, which undoes the hand-over and passes
// the lock on to the next waiter. The race is made by hand here, with the
// scripts the Lock and Unlock calls run.
func TestLeaveUndoesALateHandOver(t *testing.T) {
	ctx := context.Background()
	c, err := New(redistest.Start(t).Client(t), Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	m, err := c.NewMutex("late-hand-over", nil)
	if err != nil {
		t.Fatal(err)
	}
	lease, _ := m.leaseTerms()
	holder, gaveUp, next := c.NewOwner(), c.NewOwner(), c.NewOwner()
	for i, owner := range []Owner{holder, gaveUp, next} {
		res, err := c.tryAcquire(ctx, m, owner, c.opts.QueueTTL, false, string(owner))
		if err != nil || res.acquired != (i == 0) {
			t.Fatalf("acquire by owner %d: acquired %v, %v", i, res.acquired, err)
		}
	}

	if n, err := c.release(ctx, &m.keys, holder, 0, lease, newRequestID(), ""); err != nil || n != 0 {
		t.Fatalf("release = %d, %v; want 0", n, err)
	}
	info, err := c.Inspect(ctx, m.Name())
	if err != nil || len(info.Holders) != 1 || info.Holders[0].Owner != gaveUp {
		t.Fatalf("after the release the lock is %+v (%v), want handed to %s", info, err, gaveUp)
	}

	c.leaveQueue(ctx, m, &waiter{key: holdKey{m.Name(), gaveUp}, ticket: string(gaveUp)})
	info, err = c.Inspect(ctx, m.Name())
	if err != nil || len(info.Holders) != 1 || info.Holders[0].Owner != next || info.Holders[0].Count != 1 || len(info.Waiters) != 0 {
		t.Fatalf("after the late waiter left the lock is %+v (%v), want handed on to %s with nobody queued", info, err, next)
	}
}

// Case 2: leave.lua must undo only a grant, never a hold the owner took by
// itself. Here the owner holds the lock from a TryLock that never queued,
// while a Lock of the same owner gives up waiting: the hold stays.
func TestLeaveKeepsAHoldThatWasNotGranted(t *testing.T) {
	ctx := context.Background()
	c, err := New(redistest.Start(t).Client(t), Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	m, err := c.NewMutex("not-granted", nil)
	if err != nil {
		t.Fatal(err)
	}
	owner := c.NewOwner()
	if res, err := c.tryAcquire(ctx, m, owner, 0, false, ""); err != nil || !res.acquired {
		t.Fatalf("acquire: acquired %v, %v", res.acquired, err)
	}
	c.leaveQueue(ctx, m, &waiter{key: holdKey{m.Name(), owner}, ticket: "a Lock call of the owner"})
	info, err := c.Inspect(ctx, m.Name())
	if err != nil || len(info.Holders) != 1 || info.Holders[0].Owner != owner {
		t.Fatalf("after a leave by an owner that held the lock by itself, the lock is %+v (%v), want still held", info, err)
	}
}

// A leave sent twice (its reply lost) undoes the grant once: the second run
// must not take the lock from the waiter it was passed on to.
func TestLeaveTwiceUndoesOneGrant(t *testing.T) {
	ctx := context.Background()
	c, err := New(redistest.Start(t).Client(t), Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	m, err := c.NewMutex("leave-twice", nil)
	if err != nil {
		t.Fatal(err)
	}
	lease, _ := m.leaseTerms()
	holder, gaveUp, next := c.NewOwner(), c.NewOwner(), c.NewOwner()
	for i, owner := range []Owner{holder, gaveUp, next} {
		if res, err := c.tryAcquire(ctx, m, owner, c.opts.QueueTTL, false, string(owner)); err != nil || res.acquired != (i == 0) {
			t.Fatalf("acquire by owner %d: acquired %v, %v", i, res.acquired, err)
		}
	}
	if n, err := c.release(ctx, &m.keys, holder, 0, lease, newRequestID(), ""); err != nil || n != 0 {
		t.Fatalf("release = %d, %v; want 0", n, err)
	}
	c.leaveQueue(ctx, m, &waiter{key: holdKey{m.Name(), gaveUp}, ticket: string(gaveUp)})
	c.leaveQueue(ctx, m, &waiter{key: holdKey{m.Name(), gaveUp}, ticket: string(gaveUp)})
	info, err := c.Inspect(ctx, m.Name())
	if err != nil || len(info.Holders) != 1 || info.Holders[0].Owner != next || info.Holders[0].Count != 1 {
		t.Fatalf("after the late waiter left twice the lock is %+v (%v), want held once by %s", info, err, next)
	}
}
