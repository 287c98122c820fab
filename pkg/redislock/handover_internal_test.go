package redislock

import (
	"context"
	"testing"
	"time"

	"github.com/lockwarden/lockwarden/internal/redistest"
)

// callFor is a Lock call of owner, with a ticket of its own.
func callFor(c *Client, owner Owner) *lockCall {
	ticket := c.newTicket()
	return &lockCall{owner: owner, ownerArg: string(owner), ticket: ticket, ticketArg: ticket}
}

// queueThree takes m for a holder and queues two more calls behind it, with
// the scripts Lock runs, and returns the holder's Hold and the two calls.
func queueThree(t *testing.T, c *Client, m *Mutex) (*Hold, *lockCall, *lockCall) {
	t.Helper()
	ctx := context.Background()
	calls := []*lockCall{callFor(c, c.NewOwner()), callFor(c, c.NewOwner()), callFor(c, c.NewOwner())}
	var holder *Hold
	for i, call := range calls {
		res, err := c.tryAcquire(ctx, m, call, true, 0)
		if err != nil || res.acquired != (i == 0) {
			t.Fatalf("acquire by call %d: acquired %v, %v", i, res.acquired, err)
		}
		if i == 0 {
			holder = c.hold(m, call, res, time.Now())
		}
	}
	return holder, calls[1], calls[2]
}

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
	holder, gaveUp, next := queueThree(t, c, m)
	if err := holder.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	info, err := c.Inspect(ctx, m.Name())
	if err != nil || len(info.Holders) != 1 || info.Holders[0].Owner != gaveUp.owner {
		t.Fatalf("after the release the lock is %+v (%v), want handed to %s", info, err, gaveUp.owner)
	}

	c.leave(ctx, m, gaveUp)
	info, err = c.Inspect(ctx, m.Name())
	if err != nil || len(info.Holders) != 1 || info.Holders[0].Owner != next.owner || info.Holders[0].Count != 1 || len(info.Waiters) != 0 {
		t.Fatalf("after the late waiter left the lock is %+v (%v), want handed on to %s with nobody queued", info, err, next.owner)
	}
}

// leave.lua must undo only a level given to the call that leaves, never a
// hold the owner took by another call. Here the owner holds the lock from a
// TryLock that never queued, while a Lock of the same owner gives up
// waiting: the hold stays.
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
	if res, err := c.tryAcquire(ctx, m, callFor(c, owner), false, 0); err != nil || !res.acquired {
		t.Fatalf("acquire: acquired %v, %v", res.acquired, err)
	}
	c.leave(ctx, m, callFor(c, owner))
	info, err := c.Inspect(ctx, m.Name())
	if err != nil || len(info.Holders) != 1 || info.Holders[0].Owner != owner {
		t.Fatalf("after a leave by an owner that held the lock by itself, the lock is %+v (%v), want still held", info, err)
	}
}

// A leave sent twice (its reply lost) undoes the hand-over once: the second
// run must not take the lock from the waiter it was passed on to.
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
	holder, gaveUp, next := queueThree(t, c, m)
	if err := holder.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	c.leave(ctx, m, gaveUp)
	c.leave(ctx, m, gaveUp)
	info, err := c.Inspect(ctx, m.Name())
	if err != nil || len(info.Holders) != 1 || info.Holders[0].Owner != next.owner || info.Holders[0].Count != 1 {
		t.Fatalf("after the late waiter left twice the lock is %+v (%v), want held once by %s", info, err, next.owner)
	}
}
