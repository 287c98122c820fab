package redislock

import (
	"context"
	"errors"
	"fmt"
	"net"

	"github.com/redis/go-redis/v9"
)

var (
	// ErrNotHeld is returned by Unlock when nobody holds the lock (its
	// lease expired), or when the Hold was already unlocked.
	ErrNotHeld = errors.New("redislock: lock not held")
	// ErrNotOwner is returned by Unlock when another owner holds the lock.
	// Nothing is changed. It is also the cause of a lost lease when a
	// renewal finds that the owner no longer holds the lock.
	ErrNotOwner = errors.New("redislock: lock held by another owner")
	// ErrWaitTimeout is returned by TryLock when the wait bound passes
	// before the lock could be taken.
	ErrWaitTimeout = errors.New("redislock: timed out waiting for the lock")
	// ErrUnavailable wraps errors talking to Redis: a refused or broken
	// connection, a timeout, a server error. errors.Is works on both it and
	// the underlying error.
	ErrUnavailable = errors.New("redislock: redis unavailable")
	// ErrLeaseLost is the cause of a lease's context when the local deadline
	// passed: no renewal succeeded in time, so the lease may have expired on
	// the server.
	ErrLeaseLost = errors.New("redislock: lease lost: no renewal succeeded before the local deadline")
	// ErrInvalidName is returned, before any call to Redis, for a lock name
	// that is empty, longer than MaxNameLength or otherwise unusable.
	ErrInvalidName = errors.New("redislock: invalid lock name")
	// ErrInvalidOwner is returned, before any call to Redis, for an owner ID
	// that is not of the form "<id>:<n>".
	ErrInvalidOwner = errors.New("redislock: invalid owner ID")
	// ErrClosed is returned by every call on a closed Client, and is the
	// cause of a lease's context when its client closed.
	ErrClosed = errors.New("redislock: client closed")
	// ErrLeaseMismatch is returned by a Lock that would re-enter an
	// ownership held under other lease terms: another lease length, or a
	// fixed lease where the ownership has a watchdog (or the other way
	// round), whether through another Mutex or another Client. Nothing is
	// changed: one owner's holds share one lease in Redis, and a re-entry
	// under other terms would cut it short, or let it outlive its holder.
	ErrLeaseMismatch = errors.New("redislock: the ownership is held under other lease terms")
	// ErrPermission is returned by New when the Redis user may not run a
	// command the lock scripts run, or publish where they publish: its
	// message names what is missing and MinimalACL, the rules to grant.
	ErrPermission = errors.New("redislock: the Redis user lacks a permission the lock scripts need")
	// ErrUnexpectedReply is returned when a lock script answers with a
	// reply none of its documented outcomes has: a bug, or another script
	// loaded under the same SHA1. Nothing is known of what it changed.
	ErrUnexpectedReply = errors.New("redislock: unexpected script reply")
)

// unavailable classifies an error from go-redis. Context errors pass through
// unchanged so callers can tell their own cancellation from a Redis outage.
func unavailable(err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		var netErr net.Error
		if errors.As(err, &netErr) && netErr.Timeout() {
			return fmt.Errorf("%w: %w", ErrUnavailable, err)
		}
		return err
	case errors.Is(err, redis.ErrClosed):
		return fmt.Errorf("%w: %w", ErrClosed, err)
	}
	return fmt.Errorf("%w: %w", ErrUnavailable, err)
}

// failure classifies the error of a call made with ctx: the caller's own
// cancellation or deadline, if ctx ended, else as unavailable does. A
// deadline that struck a Redis read is the caller's, not an outage.
func failure(ctx context.Context, err error) error {
	if err != nil && ctx.Err() != nil {
		return ctx.Err()
	}
	return unavailable(err)
}

// ErrReleased is the cause of a lease's context after its final Unlock.
var ErrReleased = errors.New("redislock: lock released")

// neverSent reports whether err shows that a command never reached Redis:
// the connection could not even be made.
func neverSent(err error) bool {
	var opErr *net.OpError
	return errors.As(err, &opErr) && opErr.Op == "dial"
}
