package main

import (
	"context"
	"errors"
	"fmt"
	"time"

	bsm "github.com/bsm/redislock"
	"github.com/go-redsync/redsync/v4"
	"github.com/go-redsync/redsync/v4/redis/goredis/v9"
	lw "github.com/lockwarden/lockwarden/pkg/redislock"
	"github.com/redis/go-redis/v9"
)

// peerTTL is the lock TTL given to the peers (they have no watchdog).
const peerTTL = 10 * time.Second

// bsmRetry is the retry strategy of bsm/redislock's Obtain in the contended
// scenario: retry every millisecond (its most eager built-in strategy; the
// library's default is not to retry at all).
func bsmRetry() bsm.RetryStrategy { return bsm.LinearBackoff(time.Millisecond) }

const bsmRetryDesc = "bsm/redislock Obtain with RetryStrategy LinearBackoff(1ms), TTL 10s (Obtain gives up after the TTL; the caller retries)"
const redsyncDesc = "redsync v4 single pool (goredis/v9), tuned to its best: WithRetryDelay(1ms), WithTries(1000) (each failed try also sends the release script), expiry 10s (LockContext returns ErrFailed after 1000 tries; the caller retries)"
const oursDesc = "lockwarden Mutex.Lock (FIFO wait queue; the release hands the lock to the head of the queue and tells it on its pub/sub notice channel), default Options (watchdog lease 30s)"

// locker is one owner's handle on one lock name.
type locker interface {
	// lock blocks until the lock is held; failed reports acquire calls that
	// gave up and were retried.
	lock(ctx context.Context) (failed int, err error)
	unlock(ctx context.Context) error
}

// library makes lock clients of one library on a go-redis client.
type library struct {
	name string
	// client returns a lock client on rdb and a function that closes it.
	client func(rdb *redis.Client) (newLocker func(name string) (locker, error), closeFn func(), err error)
}

var libraries = []library{
	{name: "lockwarden", client: newOurs},
	{name: "redsync", client: newRedsync},
	{name: "bsm/redislock", client: newBSM},
}

// lockwarden

type oursLocker struct {
	m    *lw.Mutex
	hold *lw.Hold // the Lock's hold, which unlock undoes
}

func newOurs(rdb *redis.Client) (func(string) (locker, error), func(), error) {
	c, err := lw.New(rdb, lw.Options{})
	if err != nil {
		return nil, nil, err
	}
	return func(name string) (locker, error) {
		m, err := c.NewMutex(name, nil)
		if err != nil {
			return nil, err
		}
		return &oursLocker{m: m}, nil
	}, func() { _ = c.Close() }, nil
}

func (l *oursLocker) lock(ctx context.Context) (int, error) {
	hold, err := l.m.Lock(ctx)
	if err != nil {
		return 0, err
	}
	l.hold = hold
	return 0, nil
}

func (l *oursLocker) unlock(ctx context.Context) error {
	if l.hold == nil {
		return fmt.Errorf("lockwarden: %s not held", l.m.Name())
	}
	err := l.hold.Unlock(ctx)
	l.hold = nil
	return err
}

// redsync

type redsyncLocker struct{ m *redsync.Mutex }

func newRedsync(rdb *redis.Client) (func(string) (locker, error), func(), error) {
	rs := redsync.New(goredis.NewPool(rdb))
	return func(name string) (locker, error) {
		return &redsyncLocker{m: rs.NewMutex(name, redsync.WithExpiry(peerTTL),
			redsync.WithRetryDelay(time.Millisecond), redsync.WithTries(1000))}, nil
	}, func() {}, nil
}

func (l *redsyncLocker) lock(ctx context.Context) (int, error) {
	failed := 0
	for {
		err := l.m.LockContext(ctx)
		if err == nil {
			return failed, nil
		}
		if ctx.Err() != nil {
			return failed, ctx.Err()
		}
		var taken *redsync.ErrTaken
		if errors.Is(err, redsync.ErrFailed) || errors.As(err, &taken) {
			failed++
			continue
		}
		return failed, err
	}
}

func (l *redsyncLocker) unlock(ctx context.Context) error {
	ok, err := l.m.UnlockContext(ctx)
	if err == nil && !ok {
		err = errors.New("redsync: unlock reported not held")
	}
	return err
}

// bsm/redislock

type bsmLocker struct {
	c    *bsm.Client
	name string
	held *bsm.Lock
}

func newBSM(rdb *redis.Client) (func(string) (locker, error), func(), error) {
	c := bsm.New(rdb)
	return func(name string) (locker, error) {
		return &bsmLocker{c: c, name: name}, nil
	}, func() {}, nil
}

func (l *bsmLocker) lock(ctx context.Context) (int, error) {
	failed := 0
	for {
		lk, err := l.c.Obtain(ctx, l.name, peerTTL, &bsm.Options{RetryStrategy: bsmRetry()})
		if err == nil {
			l.held = lk
			return failed, nil
		}
		if ctx.Err() != nil {
			return failed, ctx.Err()
		}
		if errors.Is(err, bsm.ErrNotObtained) || errors.Is(err, context.DeadlineExceeded) {
			failed++
			continue
		}
		return failed, err
	}
}

// tryOnce makes a single attempt (used to take many locks).
func (l *bsmLocker) tryOnce(ctx context.Context) error {
	lk, err := l.c.Obtain(ctx, l.name, peerTTL, nil)
	if err != nil {
		return err
	}
	l.held = lk
	return nil
}

func (l *bsmLocker) unlock(ctx context.Context) error {
	if l.held == nil {
		return fmt.Errorf("bsm/redislock: %s not held", l.name)
	}
	err := l.held.Release(ctx)
	l.held = nil
	return err
}
