package redislock

import (
	"context"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"
)

// MinLease is the shortest lease accepted, fixed or watchdog: a shorter one
// leaves no room for the safety margin in whole milliseconds, the unit
// Redis keeps leases in.
const MinLease = 10 * time.Millisecond

// MutexOptions configure a Mutex. The zero value is ready to use.
type MutexOptions struct {
	// Lease, if above 0, is a fixed lease: the lock expires that long after
	// each Lock unless unlocked first, and no watchdog renews it. It must be
	// a whole number of milliseconds, at least MinLease. Default: 0, a
	// watchdog lease (Options.WatchdogLease) renewed until Unlock.
	Lease time.Duration
	// Owner, if set, is who every Lock of the Mutex acts for, unless the
	// context carries an owner (WithOwner): such Locks re-enter each other
	// rather than exclude each other. It is meant for a controller that
	// holds locks on behalf of others, under owner IDs they can be
	// recognised by. Default: none, so every Lock acts for a new owner, and
	// the Mutex excludes goroutines as sync.Mutex does.
	Owner Owner
}

// Mutex is a lock on one name. Every Lock takes the lock for a new owner,
// so goroutines that share a Mutex exclude each other, as with sync.Mutex.
// Re-entry is explicit: a Lock whose context carries the owner of a Hold
// (WithOwner(ctx, hold.Owner())) re-enters that ownership. A Mutex is safe
// for concurrent use.
type Mutex struct {
	c     *Client
	keys  lockKeys
	lease time.Duration // 0: watchdog
	owner Owner         // MutexOptions.Owner
}

// NewMutex returns a Mutex for the lock name. opts may be nil. The name and
// the options are checked here, before any call to Redis.
func (c *Client) NewMutex(name string, opts *MutexOptions) (*Mutex, error) {
	if err := validateName(name); err != nil {
		return nil, err
	}
	m := &Mutex{c: c, keys: keysFor(name)}
	if opts != nil {
		if opts.Lease != 0 {
			if err := validateLease("MutexOptions.Lease", opts.Lease); err != nil {
				return nil, err
			}
		}
		if opts.Owner != "" {
			if err := opts.Owner.Validate(); err != nil {
				return nil, err
			}
		}
		m.lease, m.owner = opts.Lease, opts.Owner
	}
	return m, nil
}

// validateLease rejects a lease Redis cannot keep as given.
func validateLease(what string, lease time.Duration) error {
	switch {
	case lease < MinLease:
		return fmt.Errorf("redislock: %s %v is below the minimum of %v", what, lease, MinLease)
	case lease%time.Millisecond != 0:
		return fmt.Errorf("redislock: %s %v is not a whole number of milliseconds, which Redis keeps leases in", what, lease)
	}
	return nil
}

// Name returns the lock name.
func (m *Mutex) Name() string { return m.keys.name }

// ownerFor returns who a Lock acts for: the context's owner, the Mutex's
// fixed owner, or else a new one.
func (m *Mutex) ownerFor(ctx context.Context) (Owner, error) {
	if o, ok := OwnerFromContext(ctx); ok {
		return o, o.Validate()
	}
	if m.owner != "" {
		return m.owner, nil
	}
	return m.c.NewOwner(), nil
}

// leaseTerms returns the lease to request and whether the watchdog keeps it.
func (m *Mutex) leaseTerms() (time.Duration, bool) {
	if m.lease > 0 {
		return m.lease, false
	}
	return m.c.opts.WatchdogLease, true
}

// Lock blocks until it holds the lock, or ctx ends (it then returns ctx's
// error), and returns the Hold whose Unlock undoes it. If ctx carries an
// owner that holds the lock, Lock re-enters at once, with the same fencing
// token. If Redis cannot be reached on the first attempt, Lock returns
// ErrUnavailable; once waiting, it rides out Redis errors (a failover, a
// dropped connection) and retries. If the lease ran out before Redis's
// answer came back (the process was paused, or the network slowed, past the
// lease), Lock returns ErrLeaseLost.
func (m *Mutex) Lock(ctx context.Context) (*Hold, error) {
	return m.lock(ctx, -1)
}

// TryLock is Lock with a wait bound: it returns ErrWaitTimeout if the lock
// is not held within wait. A wait of 0 makes a single attempt.
func (m *Mutex) TryLock(ctx context.Context, wait time.Duration) (*Hold, error) {
	if wait < 0 {
		return nil, fmt.Errorf("redislock: TryLock wait %v is negative", wait)
	}
	return m.lock(ctx, wait)
}

func (m *Mutex) lock(ctx context.Context, wait time.Duration) (*Hold, error) {
	c := m.c
	if err := c.beginCall(); err != nil {
		return nil, err
	}
	defer c.endCall()
	owner, err := m.ownerFor(ctx)
	if err != nil {
		return nil, err
	}
	start := time.Now()
	if wait == 0 {
		// A single attempt, which neither queues nor waits.
		res, err := c.tryAcquire(ctx, m, owner, 0, false, "")
		if err != nil {
			return nil, err
		}
		if !res.acquired {
			return nil, ErrWaitTimeout
		}
		return c.stillHeld(ctx, c.hold(m, owner, res, start))
	}

	var bound <-chan time.Time
	if wait > 0 {
		t := time.NewTimer(wait)
		defer t.Stop()
		bound = t.C
	}
	w, err := c.waits.enter(ctx, &m.keys, owner, bound)
	if err != nil {
		return nil, err
	}
	defer c.waits.exit(w)
	res, err := c.waits.attempt(ctx, w, m)
	if err != nil {
		return nil, err
	}
	if !res.acquired {
		if res, err = c.waits.wait(ctx, w, m, bound, res); err != nil {
			return nil, err
		}
	}
	return c.stillHeld(ctx, c.hold(m, owner, res, start))
}

// acquireResult is the outcome of one acquire attempt, or of a hand-over.
type acquireResult struct {
	acquired bool
	token    int64         // when acquired; when not, the latest token taken
	pttl     time.Duration // when not: the lock's remaining lease, 0 if free but reserved, <0 if no expiry
	head     bool          // when not: this owner heads the wait queue
	// sent is when the attempt was sent: the lease started no earlier. For a
	// hand-over, it is when the waiter's last attempt that found it still
	// queued was sent, since the hand-over came after that attempt.
	sent time.Time
	// handover, above 0, is the lease a hand-over granted, which may be
	// shorter than the one asked for (see free_lock in scripts/lib.lua).
	handover time.Duration
	// ticket is the ticket of the waiting Lock call that took the lock, ""
	// for one that did not wait.
	ticket string
}

// tryAcquire runs the acquire script once: one round trip, or one pipelined
// round trip with WAIT when Options.WaitReplicas is set. If the reply is
// lost, the same request is sent again until Redis answers (see request.go).
// afterRelease is set for an attempt made on a release message (acquire.lua's
// ARGV[7]); ticket is the waiting Lock call's (ARGV[8]), whose grant the
// attempt takes. If ctx ended while the outcome was being found out and the
// lock was taken, it is released again.
func (c *Client) tryAcquire(ctx context.Context, m *Mutex, owner Owner, queueTTL time.Duration, afterRelease bool, ticket string) (acquireResult, error) {
	if err := ctx.Err(); err != nil {
		return acquireResult{}, err // nothing sent, nothing to undo
	}
	lease, _ := m.leaseTerms()
	request := newRequestID()
	keys := m.keys.withLatch(request)
	args := []any{lease.Milliseconds(), string(owner), queueTTL.Milliseconds(), m.keys.noticePrefix,
		c.latchTTL.Milliseconds(), c.opts.ID, afterRelease, ticket}

	res := acquireResult{sent: time.Now()}
	reply, err := resolved(ctx, c, func(ctx context.Context) ([]any, error) {
		if c.opts.WaitReplicas > 0 {
			return c.acquireSynced(ctx, m, keys, args)
		}
		return c.scripts.acquire.Run(ctx, c.rdb, keys, args...).Slice()
	})
	c.opts.Metrics.observeAcquire(time.Since(res.sent))
	if err != nil {
		// The outcome stays unknown: whatever Redis did, nobody renews it,
		// so a hold or a queue entry it made runs out on its own.
		return res, failure(ctx, err)
	}
	var acked int64 = -1
	if c.opts.WaitReplicas > 0 && len(reply) > 0 {
		acked, _ = reply[len(reply)-1].(int64)
		reply = reply[:len(reply)-1]
	}
	status, _ := reply[0].(int64)
	if len(reply) != 3+int(1-status) { // {1, token, count} or {0, pttl, isHead, token}
		return res, errScriptReply
	}
	value, _ := reply[1].(int64)
	third, _ := reply[2].(int64)
	if status == 1 {
		res.acquired, res.token, res.ticket = true, value, ticket
	} else {
		res.pttl, res.head = time.Duration(value)*time.Millisecond, third == 1
		res.token, _ = reply[3].(int64)
	}
	if res.acquired && acked >= 0 && acked < int64(c.opts.WaitReplicas) {
		c.undoAcquire(ctx, m, owner, res)
		return acquireResult{}, fmt.Errorf("%w: only %d of %d replicas acknowledged the lock within %v", ErrUnavailable,
			acked, c.opts.WaitReplicas, c.opts.WaitReplicasTimeout)
	}
	if res.acquired && ctx.Err() != nil {
		// The caller gave up while the outcome was being found out.
		c.undoAcquire(ctx, m, owner, res)
		return acquireResult{}, ctx.Err()
	}
	return res, nil
}

// acquireSynced sends the acquire script and WAIT in one pipeline on the
// lock's master, so WAIT covers exactly this write. It returns the script's
// reply followed by the number of replicas that acknowledged it. A reply
// answered from the request's latch may come with a WAIT that covers no
// write of this connection; it then reports replicas that had already
// acknowledged everything before it.
func (c *Client) acquireSynced(ctx context.Context, m *Mutex, keys []string, args []any) ([]any, error) {
	var node redis.Cmdable = c.rdb
	if cc, ok := c.rdb.(*redis.ClusterClient); ok {
		master, err := cc.MasterForKey(ctx, m.keys.name)
		if err != nil {
			return nil, err
		}
		node = master
	}
	run := func() (*redis.Cmd, *redis.Cmd, error) {
		pipe := node.Pipeline()
		eval := c.scripts.acquire.EvalSha(ctx, pipe, keys, args...)
		wait := pipe.Do(ctx, "wait", c.opts.WaitReplicas, c.opts.WaitReplicasTimeout.Milliseconds())
		_, err := pipe.Exec(ctx)
		return eval, wait, err
	}
	eval, wait, err := run()
	if isNoScript(eval.Err()) {
		if err := c.scripts.acquire.Load(ctx, node).Err(); err != nil {
			return nil, err
		}
		eval, wait, err = run()
	}
	if err != nil {
		return nil, err
	}
	reply, err := eval.Slice()
	if err != nil {
		return nil, err
	}
	acked, _ := wait.Int64()
	return append(reply, acked), nil
}

// undoAcquire releases the level an acquisition took, when the caller will
// not get its Hold. Best effort: if Redis does not answer, the level runs out
// with its lease, since nobody renews it.
func (c *Client) undoAcquire(ctx context.Context, m *Mutex, owner Owner, res acquireResult) {
	uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), c.opts.RetryFallback)
	defer cancel()
	lease, _ := m.leaseTerms()
	_, _ = c.release(uctx, &m.keys, owner, res.token, lease, newRequestID(), res.ticket)
}

// release runs the release script: it undoes one level of the owner's hold
// of the ownership with the fencing token given (0: whichever), and when
// that frees the lock hands it to the next live waiter. lease is restored
// while levels remain. A lost reply is resolved by sending the same
// request again. It returns the script's reply (see release.lua).
func (c *Client) release(ctx context.Context, keys *lockKeys, owner Owner, token int64, lease time.Duration, request, ticket string) (int64, error) {
	latched := keys.withLatch(request)
	n, err := resolved(ctx, c, func(ctx context.Context) (int64, error) {
		return c.scripts.release.Run(ctx, c.rdb, latched, string(owner), lease.Milliseconds(),
			keys.noticePrefix, c.opts.QueueTTL.Milliseconds(), c.latchTTL.Milliseconds(), ticket, token).Int64()
	})
	return n, failure(ctx, err)
}
