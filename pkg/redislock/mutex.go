package redislock

import (
	"context"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"
)

// MutexOptions configure a Mutex. The zero value is ready to use.
type MutexOptions struct {
	// Lease, if above 0, is a fixed lease: the lock expires that long after
	// each Lock unless unlocked first, and no watchdog renews it. Default:
	// 0, a watchdog lease (Options.WatchdogLease) renewed until Unlock.
	Lease time.Duration
	// Owner is who the Mutex acts for when the context carries no owner
	// (see WithOwner). Default: a new owner from Client.NewOwner, so each
	// Mutex is its own owner, and locking it twice re-enters it.
	Owner Owner
}

// Mutex is a reentrant lock on one name, acting for one owner at a time.
// The owner is the one carried by the call's context (WithOwner), or else the
// Mutex's own. A Mutex is safe for concurrent use, but note that concurrent
// calls without a context owner act for the same owner and so re-enter
// rather than exclude each other: give each worker its own Mutex or owner.
type Mutex struct {
	c     *Client
	keys  lockKeys
	lease time.Duration // 0: watchdog
	owner Owner
}

// NewMutex returns a Mutex for the lock name. opts may be nil. The name is
// checked here, before any call to Redis.
func (c *Client) NewMutex(name string, opts *MutexOptions) (*Mutex, error) {
	if err := validateName(name); err != nil {
		return nil, err
	}
	m := &Mutex{c: c, keys: keysFor(name)}
	if opts != nil {
		if opts.Lease < 0 {
			return nil, fmt.Errorf("redislock: MutexOptions.Lease %v is negative", opts.Lease)
		}
		m.lease, m.owner = opts.Lease, opts.Owner
	}
	if m.owner == "" {
		m.owner = c.NewOwner()
	}
	if err := m.owner.Validate(); err != nil {
		return nil, err
	}
	return m, nil
}

// Name returns the lock name.
func (m *Mutex) Name() string { return m.keys.name }

// Owner returns who the Mutex acts for when the context carries no owner.
func (m *Mutex) Owner() Owner { return m.owner }

func (m *Mutex) ownerFor(ctx context.Context) (Owner, error) {
	if o, ok := OwnerFromContext(ctx); ok {
		return o, o.Validate()
	}
	return m.owner, nil
}

// lease returns the lease to request and whether the watchdog keeps it.
func (m *Mutex) leaseTerms() (time.Duration, bool) {
	if m.lease > 0 {
		return m.lease, false
	}
	return m.c.opts.WatchdogLease, true
}

// Lock blocks until the owner holds the lock, or ctx ends (it then returns
// ctx's error). If the owner already holds it, Lock re-enters at once and
// returns the same Lease, with the same fencing token. If Redis cannot be
// reached on the first attempt, Lock returns ErrUnavailable; once waiting,
// it rides out Redis errors (a failover, a dropped connection) and retries.
// If the lease ran out before Redis's answer came back (the process was
// paused, or the network slowed, past the lease), Lock returns ErrLeaseLost.
func (m *Mutex) Lock(ctx context.Context) (*Lease, error) {
	return m.lock(ctx, -1)
}

// TryLock is Lock with a wait bound: it returns ErrWaitTimeout if the lock
// is not held within wait. A wait of 0 makes a single attempt.
func (m *Mutex) TryLock(ctx context.Context, wait time.Duration) (*Lease, error) {
	if wait < 0 {
		return nil, fmt.Errorf("redislock: TryLock wait %v is negative", wait)
	}
	return m.lock(ctx, wait)
}

func (m *Mutex) lock(ctx context.Context, wait time.Duration) (*Lease, error) {
	c := m.c
	if err := c.checkOpen(); err != nil {
		return nil, err
	}
	owner, err := m.ownerFor(ctx)
	if err != nil {
		return nil, err
	}
	start := time.Now()
	if wait == 0 {
		// A single attempt, which neither queues nor waits.
		res, err := c.tryAcquire(ctx, m, owner, 0, false)
		if err != nil {
			return nil, err
		}
		if !res.acquired {
			return nil, ErrWaitTimeout
		}
		return stillHeld(c.hold(m, owner, res, start))
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
	res, err := c.waits.attempt(ctx, w, m, false)
	if err != nil {
		return nil, err
	}
	if !res.acquired {
		if res, err = c.waits.wait(ctx, w, m, bound, res); err != nil {
			return nil, err
		}
	}
	return stillHeld(c.hold(m, owner, res, start))
}

// Unlock undoes one Lock by the owner. The final Unlock frees the lock,
// wakes waiters and stops the watchdog's renewal of it before returning. It
// returns ErrNotHeld if nobody holds the lock, ErrNotOwner if another owner
// does, and changes nothing in either case. If Redis cannot be reached it
// returns ErrUnavailable and the hold stays as it was, kept by the watchdog:
// retry the Unlock (or Close the Client, which stops every renewal), or the
// lock stays held.
func (m *Mutex) Unlock(ctx context.Context) error {
	c := m.c
	if err := c.checkOpen(); err != nil {
		return err
	}
	owner, err := m.ownerFor(ctx)
	if err != nil {
		return err
	}
	lease, _ := m.leaseTerms()
	key := holdKey{m.keys.name, owner}

	// Shared with other Unlocks, exclusive with a renewal batch: a renewal
	// in flight completes before the release, and none starts during it.
	c.renewing.RLock()
	defer c.renewing.RUnlock()

	// The Unlock that undoes the last Lock this client handed out releases
	// every level Redis has for the owner: levels this client never handed
	// out are left over from an acquisition whose reply was lost, and would
	// otherwise keep the lock held under the watchdog for good.
	c.mu.Lock()
	l := c.held[key]
	final := l == nil || l.levels <= 1
	c.mu.Unlock()

	sent := time.Now()
	remaining, err := c.release(ctx, m, owner, lease, final)
	if err != nil {
		return unavailable(err)
	}

	switch {
	case remaining > 0:
		if l != nil {
			c.mu.Lock()
			l.levels--
			c.extendLocked(l, sent, lease)
			c.mu.Unlock()
		}
		return nil
	case remaining == 0:
		if l != nil {
			c.end(l, ErrReleased)
		}
		return nil
	case remaining == -2:
		if l != nil {
			c.end(l, ErrNotOwner)
		}
		return ErrNotOwner
	default:
		if l != nil {
			c.end(l, ErrLeaseLost)
		}
		return ErrNotHeld
	}
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
}

// tryAcquire runs the acquire script once: one round trip, or one pipelined
// round trip with WAIT when Options.WaitReplicas is set. takeHandover is set
// for an owner already queued (see acquire.lua's ARGV[5]).
func (c *Client) tryAcquire(ctx context.Context, m *Mutex, owner Owner, queueTTL time.Duration, takeHandover bool) (acquireResult, error) {
	if err := ctx.Err(); err != nil {
		return acquireResult{}, err // nothing sent, nothing to undo
	}
	lease, _ := m.leaseTerms()
	keys := m.keys.all
	args := []any{lease.Milliseconds(), string(owner), queueTTL.Milliseconds(), noticePrefix, takeHandover}

	res := acquireResult{sent: time.Now()}
	var reply []any
	var err error
	if c.opts.WaitReplicas > 0 {
		reply, err = c.acquireSynced(ctx, m, owner, keys, args)
	} else {
		reply, err = acquireScript.Run(ctx, c.rdb, keys, args...).Slice()
	}
	c.opts.Metrics.observeAcquire(time.Since(res.sent))
	if err != nil {
		if !neverSent(err) {
			c.compensate(m, owner)
		}
		return res, unavailable(err)
	}
	status, _ := reply[0].(int64)
	if len(reply) != 3+int(1-status) { // {1, token, count} or {0, pttl, isHead, token}
		return res, errScriptReply
	}
	value, _ := reply[1].(int64)
	third, _ := reply[2].(int64)
	if status == 1 {
		res.acquired, res.token = true, value
	} else {
		res.pttl, res.head = time.Duration(value)*time.Millisecond, third == 1
		res.token, _ = reply[3].(int64)
	}
	return res, nil
}

// acquireSynced sends the acquire script and WAIT in one pipeline on the
// lock's master, so WAIT covers exactly this write. If too few replicas
// acknowledge, a successful acquisition is undone.
func (c *Client) acquireSynced(ctx context.Context, m *Mutex, owner Owner, keys []string, args []any) ([]any, error) {
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
		eval := acquireScript.EvalSha(ctx, pipe, keys, args...)
		wait := pipe.Do(ctx, "wait", c.opts.WaitReplicas, c.opts.WaitReplicasTimeout.Milliseconds())
		_, err := pipe.Exec(ctx)
		return eval, wait, err
	}
	eval, wait, err := run()
	if isNoScript(eval.Err()) {
		if err := acquireScript.Load(ctx, node).Err(); err != nil {
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
	if acked, _ := wait.Int64(); acked < int64(c.opts.WaitReplicas) {
		if status, _ := reply[0].(int64); status == 1 {
			lease, _ := m.leaseTerms()
			_, _ = c.release(ctx, m, owner, lease, false)
		}
		return nil, fmt.Errorf("only %d of %d replicas acknowledged the lock within %v", acked, c.opts.WaitReplicas, c.opts.WaitReplicasTimeout)
	}
	return reply, nil
}

// compensate undoes an acquire attempt whose reply was lost (the call may
// still have run), so a failed Lock leaves nothing behind: it releases an
// acquisition and leaves the wait queue. It only runs when the owner held
// nothing before: then a release either undoes exactly that acquisition or
// finds nothing to undo. If Redis stays unreachable, the lease and the queue
// entry run out on their own.
func (c *Client) compensate(m *Mutex, owner Owner) {
	c.mu.Lock()
	_, heldBefore := c.held[holdKey{m.keys.name, owner}]
	c.mu.Unlock()
	if heldBefore {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), c.opts.RetryFallback)
	defer cancel()
	lease, _ := m.leaseTerms()
	_, _ = c.release(ctx, m, owner, lease, false)
	c.leaveQueue(ctx, m, owner)
}

// release runs the release script: it undoes one level of the owner's hold,
// or every level if all is set, and when that frees the lock hands it to the
// next live waiter. lease is restored while levels remain. It returns the
// script's reply (see release.lua).
func (c *Client) release(ctx context.Context, m *Mutex, owner Owner, lease time.Duration, all bool) (int64, error) {
	return releaseScript.Run(ctx, c.rdb, m.keys.all, string(owner), lease.Milliseconds(), all,
		noticePrefix, c.opts.QueueTTL.Milliseconds()).Int64()
}

// holdKey identifies one owner's hold on one lock within a client.
type holdKey struct {
	name  string
	owner Owner
}

// Lease is an owner's hold on a lock, from the Lock that took it to the
// Unlock that freed it. Re-entries share the Lease.
type Lease struct {
	c        *Client
	key      holdKey
	token    int64
	acquired time.Time
	ctx      context.Context
	cancel   context.CancelCauseFunc

	// Guarded by Client.mu.
	levels      int // Locks not yet undone by an Unlock
	lease       time.Duration
	watchdog    bool
	deadline    time.Time // local monotonic deadline of the ownership
	deadlineSet time.Time // send time of the call that set deadline
	// confirmBy, if set, is when a lease shortened by its hand-over gets
	// extended to the full lease; confirming is set once that is asked of
	// the renewal loop.
	confirmBy  time.Time
	confirming bool
	timer      *time.Timer
}

// Name returns the lock name.
func (l *Lease) Name() string { return l.key.name }

// Owner returns the holder.
func (l *Lease) Owner() Owner { return l.key.owner }

// Token returns the fencing token of this ownership: strictly greater than
// that of every earlier ownership of the lock, and the same across
// re-entries. Pass it to the protected resource, which should refuse writes
// with a token lower than one it has seen.
func (l *Lease) Token() int64 { return l.token }

// Context returns a context that is cancelled when the ownership ends or can
// no longer be vouched for. context.Cause tells why: ErrReleased after the
// final Unlock, ErrNotOwner when a renewal found the lock taken from the
// owner, ErrLeaseLost when no renewal succeeded before the local deadline,
// ErrClosed when the client closed.
func (l *Lease) Context() context.Context { return l.ctx }

// Done is Context().Done().
func (l *Lease) Done() <-chan struct{} { return l.ctx.Done() }

// Err returns nil while the lease is held, and afterwards why it ended (see
// Context). It reads the clock itself rather than trusting the deadline timer
// to have fired: in a process just resumed from a pause, the timer may not
// have run yet, but Err already reports the loss.
func (l *Lease) Err() error {
	if err := context.Cause(l.ctx); err != nil {
		return err
	}
	c := l.c
	c.mu.Lock()
	overdue := c.held[l.key] == l && !time.Now().Before(l.deadline)
	c.mu.Unlock()
	if overdue {
		c.end(l, ErrLeaseLost)
	}
	return context.Cause(l.ctx)
}

// stillHeld returns l, or ErrLeaseLost if its deadline passed before Lock
// could return it: the process was paused, or the reply slowed, past the
// lease.
func stillHeld(l *Lease) (*Lease, error) {
	if err := l.Err(); err != nil {
		return nil, err
	}
	return l, nil
}

// hold records a successful acquisition and arms its deadline. A re-entry
// returns the Lease already held; one that was lost is replaced.
func (c *Client) hold(m *Mutex, owner Owner, res acquireResult, start time.Time) *Lease {
	lease, watchdog := m.leaseTerms()
	key := holdKey{m.keys.name, owner}
	c.opts.Metrics.observeWait(time.Since(start))

	c.mu.Lock()
	l := c.held[key]
	var lapsed *Lease
	if l != nil && l.token != res.token {
		// A new token: the old ownership ended (say, force-released) before
		// this client noticed, and this is a new one, not a re-entry.
		lapsed, l = l, nil
		delete(c.held, key)
	}
	if l == nil {
		l = &Lease{c: c, key: key, token: res.token, acquired: res.sent}
		l.ctx, l.cancel = context.WithCancelCause(context.Background())
		l.timer = time.AfterFunc(time.Hour, func() { c.checkDeadline(l) })
		c.held[key] = l
	}
	l.levels++
	l.lease, l.watchdog = lease, watchdog
	granted := lease
	if res.handover > 0 && res.handover < lease {
		granted = res.handover
	}
	c.extendLocked(l, res.sent, granted)
	c.mu.Unlock()
	if lapsed != nil {
		c.finish(lapsed, ErrNotOwner)
	}
	return l
}

// end forgets l and ends its context with cause, if l is still held, after
// recording the hold time or the loss, so whoever sees the context end also
// sees the metrics. It reports whether l was still held.
func (c *Client) end(l *Lease, cause error) bool {
	c.mu.Lock()
	current := c.held[l.key] == l
	if current {
		delete(c.held, l.key)
	}
	c.mu.Unlock()
	if current {
		c.finish(l, cause)
	}
	return current
}

// finish stops a lease that is no longer held and ends its context with
// cause, after recording the hold time or the loss.
func (c *Client) finish(l *Lease, cause error) {
	l.timer.Stop()
	switch cause {
	case ErrReleased:
		c.opts.Metrics.observeHold(time.Since(l.acquired))
	case ErrClosed:
	default:
		c.opts.Metrics.lostLease()
		c.opts.Logger.Info("lock lease lost", "lock", l.key.name, "owner", string(l.key.owner), "cause", cause.Error())
	}
	l.cancel(cause)
}
