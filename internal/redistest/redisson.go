package redistest

import (
	"context"
	"errors"
	"time"

	"github.com/redis/go-redis/v9"
)

// Redisson runs Redisson's own RLock scripts (RedissonLock
// tryLockInnerAsync and unlockInnerAsync, as quoted in the design's seed
// 001) through go-redis, and waits the way Redisson does: subscribed to the
// lock's channel, retrying on each message or when the holder's lease would
// run out. Tests and the benchmark use it to play a Java service on the same
// lock.
type Redisson struct {
	RDB   redis.UniversalClient
	Name  string
	Owner string // "<client UUID>:<thread id>"
	Lease time.Duration
	// Sharded makes it wait with SSUBSCRIBE and publish with SPUBLISH, as
	// Redisson does on a Redis 7 Cluster.
	Sharded bool
	// AnswerAfter is how long it takes to act on a release message, as a
	// Redisson client on a loaded machine does. Zero: at once.
	AnswerAfter time.Duration
}

var (
	redissonTryLock = redis.NewScript(`if ((redis.call('exists', KEYS[1]) == 0) ` +
		`or (redis.call('hexists', KEYS[1], ARGV[2]) == 1)) then ` +
		`redis.call('hincrby', KEYS[1], ARGV[2], 1); ` +
		`redis.call('pexpire', KEYS[1], ARGV[1]); ` +
		`return nil; ` +
		`end; ` +
		`return redis.call('pttl', KEYS[1]);`)
	redissonUnlock = redis.NewScript(`if (redis.call('hexists', KEYS[1], ARGV[3]) == 0) then ` +
		`return nil;` +
		`end; ` +
		`local counter = redis.call('hincrby', KEYS[1], ARGV[3], -1); ` +
		`if (counter > 0) then ` +
		`redis.call('pexpire', KEYS[1], ARGV[2]); ` +
		`return 0; ` +
		`else ` +
		`redis.call('del', KEYS[1]); ` +
		`redis.call(ARGV[4], KEYS[2], ARGV[1]); ` +
		`return 1; ` +
		`end; ` +
		`return nil;`)
	// redissonFencedTryLock is Redisson's tryLock that also takes a fencing
	// token from the lock's counter on a new acquisition, as Redisson's
	// RFencedLock does. It returns {1, token} when acquired, else {0, pttl}:
	// a PTTL can be 0 in a lease's last millisecond, so it cannot mean
	// "taken".
	redissonFencedTryLock = redis.NewScript(`if ((redis.call('exists', KEYS[1]) == 0) ` +
		`or (redis.call('hexists', KEYS[1], ARGV[2]) == 1)) then ` +
		`redis.call('hincrby', KEYS[1], ARGV[2], 1); ` +
		`redis.call('pexpire', KEYS[1], ARGV[1]); ` +
		`return {1, redis.call('incr', KEYS[2])}; ` +
		`end; ` +
		`return {0, redis.call('pttl', KEYS[1])};`)
)

// Channel is the lock's release channel.
func (r *Redisson) Channel() string { return "redisson_lock__channel:{" + r.Name + "}" }

// Subscribe subscribes to the lock's channel, as Redisson's waiters do, and
// waits for the confirmation.
func (r *Redisson) Subscribe(ctx context.Context) (*redis.PubSub, error) {
	var sub *redis.PubSub
	if r.Sharded {
		sub = r.RDB.SSubscribe(ctx, r.Channel())
	} else {
		sub = r.RDB.Subscribe(ctx, r.Channel())
	}
	if _, err := sub.Receive(ctx); err != nil { // the subscription's confirmation
		_ = sub.Close()
		return nil, err
	}
	return sub, nil
}

// FencedLock waits as Lock does, taking the lock with a fencing token. It
// returns the token and when the attempt that took the lock was sent: its
// lease started no earlier.
func (r *Redisson) FencedLock(ctx context.Context) (int64, time.Time, error) {
	sub, err := r.Subscribe(ctx)
	if err != nil {
		return 0, time.Time{}, err
	}
	defer sub.Close()
	for {
		sent := time.Now()
		reply, err := redissonFencedTryLock.Run(ctx, r.RDB, []string{r.Name, "redisson_lock_token:{" + r.Name + "}"},
			r.Lease.Milliseconds(), r.Owner).Int64Slice()
		if err != nil {
			return 0, time.Time{}, err
		}
		if reply[0] == 1 {
			return reply[1], sent, nil
		}
		r.await(ctx, sub, time.Duration(reply[1])*time.Millisecond)
		if ctx.Err() != nil {
			return 0, time.Time{}, ctx.Err()
		}
	}
}

// TryLock reports whether it took the lock (Redisson's script answers nil),
// and if not the lock's PTTL, which may be 0 in a lease's last millisecond.
func (r *Redisson) TryLock(ctx context.Context) (bool, time.Duration, error) {
	ttl, err := redissonTryLock.Run(ctx, r.RDB, []string{r.Name}, r.Lease.Milliseconds(), r.Owner).Int64()
	if errors.Is(err, redis.Nil) {
		return true, 0, nil
	}
	return false, time.Duration(ttl) * time.Millisecond, err
}

// Lock blocks until it holds the lock, subscribed for as long as it waits.
func (r *Redisson) Lock(ctx context.Context) error {
	sub, err := r.Subscribe(ctx)
	if err != nil {
		return err
	}
	defer sub.Close()
	return r.LockOn(ctx, sub)
}

// LockOn is Lock on a subscription the caller keeps (see Subscribe).
func (r *Redisson) LockOn(ctx context.Context, sub *redis.PubSub) error {
	for {
		took, ttl, err := r.TryLock(ctx)
		if err != nil || took {
			return err
		}
		r.await(ctx, sub, ttl)
		if ctx.Err() != nil {
			return ctx.Err()
		}
	}
}

// await waits for a message on the lock's channel, or at most ttl, and then
// for AnswerAfter if a message came.
func (r *Redisson) await(ctx context.Context, sub *redis.PubSub, ttl time.Duration) {
	waitCtx, cancel := context.WithTimeout(ctx, max(ttl, time.Millisecond))
	defer cancel()
	if _, err := sub.ReceiveMessage(waitCtx); err != nil || r.AnswerAfter <= 0 {
		return
	}
	select {
	case <-time.After(r.AnswerAfter):
	case <-ctx.Done():
	}
}

// Unlock undoes one level, and reports whether that freed the lock.
func (r *Redisson) Unlock(ctx context.Context) (bool, error) {
	publish := "publish"
	if r.Sharded {
		publish = "spublish"
	}
	n, err := redissonUnlock.Run(ctx, r.RDB, []string{r.Name, r.Channel()}, "0", r.Lease.Milliseconds(), r.Owner, publish).Int64()
	if errors.Is(err, redis.Nil) {
		return false, nil
	}
	return n == 1, err
}
