package redislock

import (
	"context"
	"fmt"
	"strconv"
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
	// each Lock unless unlocked first (or extended with Hold.Refresh), and
	// no watchdog renews it. It must be a whole number of milliseconds, at
	// least MinLease. Default: 0, a watchdog lease (Options.WatchdogLease)
	// renewed until Unlock. A Lock that would re-enter an ownership held
	// under other terms fails with ErrLeaseMismatch.
	Lease time.Duration
	// Owner, if set, is who every Lock of the Mutex acts for, unless the
	// context carries a hold of the lock (WithHold): such Locks re-enter
	// each other rather than exclude each other, in one Client or across
	// Clients, provided their lease terms are the same. It is meant for a
	// controller that holds locks on behalf of others, under owner IDs they
	// can be recognised by. Default: none, so every Lock acts for a new
	// owner, and the Mutex excludes goroutines as sync.Mutex does.
	Owner Owner
}

// Mutex is a lock on one name. Every Lock takes the lock for a new owner,
// so goroutines that share a Mutex exclude each other, as with sync.Mutex.
// Re-entry is explicit: a Lock whose context carries a Hold of the lock
// (WithHold(ctx, hold)) re-enters that ownership. A Mutex is safe for
// concurrent use.
type Mutex struct {
	c     *Client
	keys  lockKeys
	lease time.Duration // as requested: 0 for the watchdog
	owner Owner         // MutexOptions.Owner

	terms    time.Duration // the lease the lock is taken with
	watchdog bool
	// termsText is the lease terms as '~t' in scripts/lib.lua has them;
	// termsArg and leaseArg the terms and the lease in ms, boxed once for
	// the argument lists.
	termsText          string
	termsArg, leaseArg any
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
	m.terms, m.watchdog = m.lease, false
	if m.lease == 0 {
		m.terms, m.watchdog = c.opts.WatchdogLease, true
	}
	terms := strconv.FormatInt(m.terms.Milliseconds(), 10)
	if m.watchdog {
		terms += "w"
	}
	m.termsText, m.termsArg, m.leaseArg = terms, terms, m.terms.Milliseconds()
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

// lockCall is one Lock call: the owner it acts for, and its ticket, which
// every request of the call carries (see scripts/lib.lua). A call for an
// owner of its own uses the owner ID as its ticket.
type lockCall struct {
	owner     Owner
	ownerArg  any // string(owner), boxed once
	ticket    string
	ticketArg any
	// reentry, for a re-entry of a hold the context carries, is that
	// ownership's token, in decimal: the call re-enters it or fails (see
	// acquire.lua's ARGV[8]); emptyArg otherwise.
	reentry any
	// late is set once a request of the call may still arrive late (see
	// request.go).
	late bool
}

// newCall returns the call a Lock makes: a re-entry of the hold of the lock
// that ctx carries, for the Mutex's fixed owner, or else for a new owner. A
// carried hold that was unlocked, or whose ownership ended, re-enters
// nothing: the call fails with ErrNotHeld.
func (m *Mutex) newCall(ctx context.Context) (lockCall, error) {
	if h := carriedHold(ctx, m.keys.name); h != nil {
		if err := h.reentrable(); err != nil {
			return lockCall{}, err
		}
		ticket := m.c.newTicket()
		return lockCall{owner: h.Owner(), ownerArg: h.own.ownerArg, ticket: ticket, ticketArg: ticket,
			reentry: strconv.FormatInt(h.Token(), 10)}, nil
	}
	if m.owner != "" {
		ticket := m.c.newTicket()
		return lockCall{owner: m.owner, ownerArg: string(m.owner), ticket: ticket, ticketArg: ticket, reentry: emptyArg}, nil
	}
	owner := m.c.NewOwner()
	arg := any(string(owner))
	return lockCall{owner: owner, ownerArg: arg, ticket: string(owner), ticketArg: arg, reentry: emptyArg}, nil
}

// Lock blocks until it holds the lock, or ctx ends (it then returns ctx's
// error), and returns the Hold whose Unlock undoes it. If ctx carries a hold
// of the lock (WithHold), Lock re-enters it at once, with the same fencing
// token, or fails with ErrLeaseMismatch if the Mutex's lease terms are not
// the hold's, and with ErrNotHeld if that hold was unlocked or its
// ownership no longer holds the lock. If Redis cannot be reached on the first attempt, Lock returns
// ErrUnavailable; once waiting, it rides out Redis errors (a failover, a
// dropped connection) and retries. If the lease ran out before Redis's
// answer came back (the process was paused, or the network slowed, past
// the lease), Lock returns ErrLeaseLost; if the client's own
// ForceReleaseClient removed what it took while it was in flight,
// ErrNotOwner.
func (m *Mutex) Lock(ctx context.Context) (*Hold, error) {
	return m.lock(ctx, -1)
}

// TryLock is Lock with a wait bound: it returns ErrWaitTimeout if the lock
// is not held within wait. A wait of 0 makes a single attempt, which takes
// the lock if it is free, even if other Locks wait for it (as Redisson's
// tryLock does: the waiters keep their places and get the lock after), and
// otherwise returns ErrWaitTimeout at once.
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
	call, err := m.newCall(ctx)
	if err != nil {
		return nil, err
	}
	start, forced := time.Now(), c.forced.Load()
	if wait == 0 {
		// A single attempt, which neither queues nor waits.
		res, err := c.take(ctx, m, &call)
		if err == nil && !res.acquired {
			res, err = c.tryAcquire(ctx, m, &call, false, 0)
		}
		if err != nil {
			return nil, err
		}
		if !res.acquired {
			if call.late {
				// A copy of the request may still arrive, and take the
				// lock once it is free, for a call that has returned: Redis
				// remembers the call as finished first.
				c.undoAcquire(ctx, m, &call)
			}
			return nil, ErrWaitTimeout
		}
		return c.stillHeld(ctx, c.hold(m, &call, res, start), forced)
	}

	var (
		res    acquireResult
		queued bool
		bound  <-chan time.Time
	)
	if fresh := call.ticket == string(call.owner); fresh && !c.waits.listening(m.keys.name) {
		// The call's owner is its own, so no other call of it can be
		// waiting, and the client does not listen on the lock, so the call
		// could not hear anything yet: the first attempt goes ahead
		// without a waiter, which only a call that must wait needs, and
		// takes a free lock with take.lua. One that queues subscribes, and
		// tries again once it listens.
		if res, err = c.take(ctx, m, &call); err != nil {
			return nil, err
		}
		if !res.acquired {
			if res, err = c.tryAcquire(ctx, m, &call, true, 0); err != nil {
				return nil, err
			}
		}
		if res.acquired {
			return c.stillHeld(ctx, c.hold(m, &call, res, start), forced)
		}
		queued = true
	}
	if wait > 0 {
		t := time.NewTimer(wait)
		defer t.Stop()
		bound = t.C
	}
	w, err := c.waits.enter(ctx, &m.keys, call, bound)
	if err != nil {
		if queued {
			c.undoAcquire(ctx, m, &call) // leaves the queue
		}
		return nil, err
	}
	defer c.waits.exit(w)
	if queued {
		c.waits.record(w, res, 0, 0)
	} else if res, err = c.waits.attempt(ctx, w, m); err != nil {
		return nil, c.giveUp(ctx, m, w, err)
	}
	if !res.acquired {
		if res, err = c.waits.wait(ctx, w, m, bound, res); err != nil {
			return nil, err
		}
	}
	return c.stillHeld(ctx, c.hold(m, &w.call, res, start), forced)
}

// acquireResult is the outcome of one acquire attempt, or of a hand-over.
type acquireResult struct {
	acquired bool
	token    int64         // when acquired; when not, the holder's token
	pttl     time.Duration // when not: the lock's remaining lease, 0 if free but reserved, <0 if no expiry
	rank     int64         // when not: the call's place in the queue, from 0; -1 if not queued
	// lapse, when not acquired and the call is queued behind others, is how
	// soon every entry ahead of it lapses unless refreshed; -1 otherwise.
	// aheadUnseen is set instead when the attempt, which queued the call,
	// did not look at the entries ahead (see acquire.lua).
	lapse       time.Duration
	aheadUnseen bool
	// sent is when the attempt was sent: the lease started no earlier. For a
	// hand-over, it is when the waiter's last attempt that found it still
	// queued was sent, since the hand-over came after that attempt.
	sent time.Time
	// handover, above 0, is the lease a hand-over granted, which may be
	// shorter than the one asked for (see free_lock in scripts/lib.lua).
	handover time.Duration
	// taken is set when take.lua took the lock.
	taken bool
}

// Pre-boxed arguments.
var (
	emptyArg any = ""
	oneArg   any = "1"
	zeroArg  any = "0"
)

// tryAcquire runs the acquire script once: one round trip, or one pipelined
// round trip with WAIT when Options.WaitReplicas is set. If the reply is
// lost, the same request is sent again until Redis answers (see request.go).
// queue makes a call that waits (acquire.lua's ARGV[5]); missed counts the
// release messages the head of the queue heard since its last attempt
// (ARGV[7]). If ctx ended while the
// outcome was being found out and the lock was taken, it is given up again.
func (c *Client) tryAcquire(ctx context.Context, m *Mutex, call *lockCall, queue bool, missed uint64) (acquireResult, error) {
	if err := ctx.Err(); err != nil {
		return acquireResult{}, err // nothing sent, nothing to undo
	}
	queueTTL, after := zeroArg, zeroArg
	if queue {
		queueTTL = c.opts.QueueTTL.Milliseconds()
	}
	if missed > 0 {
		after = int64(missed)
	}
	args := scriptArgs(c.scripts.acquire, m.keys.keyArgs, 8)
	args = append(args, call.ownerArg, call.ticketArg, time.Now().UnixMicro(), m.termsArg, queueTTL, c.clientIDArg, after, call.reentry)

	res := acquireResult{sent: time.Now()}
	reply, err := c.sendAcquire(ctx, m, args)
	late := time.Since(res.sent) >= c.lateAfter
	if outcomeUnknown(err) {
		reply, late, err = resolved(ctx, c, err, func(ctx context.Context) (any, error) { return c.sendAcquire(ctx, m, args) })
	}
	call.late = call.late || late
	c.opts.Metrics.observeAcquire(time.Since(res.sent))
	if err != nil {
		// The outcome stays unknown: whatever Redis did, nobody renews it,
		// so a level or a queue entry it made runs out on its own.
		return res, failure(ctx, err)
	}
	var acked int64 = -1
	if c.opts.WaitReplicas > 0 {
		synced := reply.([]any)
		reply, acked = synced[0], synced[1].(int64)
	}
	switch r := reply.(type) {
	case int64:
		switch {
		case r > 0:
			res.acquired, res.token = true, r
		case r == -1:
			return acquireResult{}, ErrLeaseMismatch
		case r == -3:
			return acquireResult{}, fmt.Errorf("%w: the hold the context carries (WithHold) no longer holds the lock", ErrNotHeld)
		default:
			// -2, a finished call: only a copy of a request that its
			// call no longer waits for gets it.
			return acquireResult{}, unexpectedReply("acquire", reply)
		}
	case []any:
		if len(r) != 4 {
			return acquireResult{}, unexpectedReply("acquire", reply)
		}
		pttl, _ := r[0].(int64)
		res.pttl = time.Duration(pttl) * time.Millisecond
		res.rank, _ = r[1].(int64)
		res.token, _ = r[2].(int64)
		lapse, _ := r[3].(int64)
		res.lapse = time.Duration(lapse) * time.Millisecond
		if lapse < 0 {
			res.lapse, res.aheadUnseen = -1, lapse == -2
		}
	default:
		return acquireResult{}, unexpectedReply("acquire", reply)
	}
	if res.acquired && acked >= 0 && acked < int64(c.opts.WaitReplicas) {
		// The call ends here, waiting or not: its level is undone, and
		// Redis may remember the call as finished.
		c.undoAcquire(ctx, m, call)
		return acquireResult{}, &replicaShortfall{acked: acked, want: c.opts.WaitReplicas, within: c.opts.WaitReplicasTimeout}
	}
	if res.acquired && ctx.Err() != nil {
		// The caller gave up while the outcome was being found out.
		c.undoAcquire(ctx, m, call)
		return acquireResult{}, ctx.Err()
	}
	return res, nil
}

// replicaShortfall is the error of a Lock whose acquisition fewer replicas
// acknowledged than Options.WaitReplicas: ErrUnavailable, and final, since
// the call gave its level up.
type replicaShortfall struct {
	acked  int64
	want   int
	within time.Duration
}

func (e *replicaShortfall) Error() string {
	return fmt.Sprintf("%v: only %d of %d replicas acknowledged the lock within %v", ErrUnavailable, e.acked, e.want, e.within)
}

func (e *replicaShortfall) Unwrap() error { return ErrUnavailable }

// take runs take.lua, the uncontended Lock of an owner of its own, if the
// call is one and Options.WaitReplicas is not set: it takes the lock if it
// is free with nobody queued, and otherwise changes nothing and reports it
// not acquired, for acquire.lua to decide. A lost reply is resolved by
// sending it again, as tryAcquire does.
func (c *Client) take(ctx context.Context, m *Mutex, call *lockCall) (acquireResult, error) {
	if call.ticket != string(call.owner) || c.opts.WaitReplicas > 0 {
		return acquireResult{}, nil
	}
	if err := ctx.Err(); err != nil {
		return acquireResult{}, err
	}
	s := c.scripts.take
	args := scriptArgs(s, m.keys.takeArgs, 3)
	args = append(args, call.ownerArg, time.Now().UnixMicro(), m.termsArg)
	res := acquireResult{sent: time.Now()}
	token, err := takeReply(run(ctx, c.rdb, s, args))
	late := time.Since(res.sent) >= c.lateAfter
	if outcomeUnknown(err) {
		token, late, err = resolved(ctx, c, err, func(ctx context.Context) (int64, error) { return takeReply(run(ctx, c.rdb, s, args)) })
	}
	call.late = call.late || late
	c.opts.Metrics.observeAcquire(time.Since(res.sent))
	if err != nil {
		return res, failure(ctx, err)
	}
	if token > 0 {
		res.acquired, res.token, res.taken = true, token, true
		if ctx.Err() != nil {
			c.undoAcquire(ctx, m, call)
			return acquireResult{}, ctx.Err()
		}
	}
	return res, nil
}

// takeReply reads take.lua's reply: the token as a string, or 0.
func takeReply(cmd *redis.Cmd) (int64, error) {
	switch v := cmd.Val().(type) {
	case string:
		return strconv.ParseInt(v, 10, 64)
	case int64:
		return v, nil
	}
	if err := cmd.Err(); err != nil {
		return 0, err
	}
	return 0, unexpectedReply("take", cmd.Val())
}

// sendAcquire sends an acquire request once.
func (c *Client) sendAcquire(ctx context.Context, m *Mutex, args []any) (any, error) {
	if c.opts.WaitReplicas > 0 {
		return c.acquireSynced(ctx, m, args)
	}
	return run(ctx, c.rdb, c.scripts.acquire, args).Result()
}

// acquireSynced sends the acquire script and WAIT in one pipeline on the
// lock's master, so WAIT covers exactly this write. It returns the script's
// reply and the number of replicas that acknowledged it. A reply answered
// from the call's level already in Redis may come with a WAIT that covers no
// write of this connection; it then reports replicas that had already
// acknowledged everything before it.
func (c *Client) acquireSynced(ctx context.Context, m *Mutex, args []any) (any, error) {
	var node interface {
		doer
		Pipeline() redis.Pipeliner
		ScriptLoad(ctx context.Context, script string) *redis.StringCmd
	} = c.rdb
	if cc, ok := c.rdb.(*redis.ClusterClient); ok {
		master, err := cc.MasterForKey(ctx, m.keys.name)
		if err != nil {
			return nil, err
		}
		node = master
	}
	s := c.scripts.acquire
	exec := func() (*redis.Cmd, *redis.Cmd, error) {
		pipe := node.Pipeline()
		eval := pipe.Do(ctx, args...)
		wait := pipe.Do(ctx, "wait", c.opts.WaitReplicas, c.opts.WaitReplicasTimeout.Milliseconds())
		_, err := pipe.Exec(ctx)
		return eval, wait, err
	}
	eval, wait, err := exec()
	if isNoScript(eval.Err()) {
		if err := node.ScriptLoad(ctx, s.body.(string)).Err(); err != nil {
			return nil, err
		}
		eval, wait, err = exec()
	}
	if err != nil {
		return nil, err
	}
	acked, _ := wait.Int64()
	return []any{eval.Val(), acked}, nil
}

// undoAcquire gives up the level a call took, when the caller will not get
// its Hold. Best effort: if Redis does not answer, the level runs out with
// its lease, since nobody renews it.
func (c *Client) undoAcquire(ctx context.Context, m *Mutex, call *lockCall) {
	uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), c.opts.RetryFallback)
	defer cancel()
	c.leave(uctx, m, call)
}

// leave takes a call out of the lock's wait queue, passing the head position
// on, and undoes a level the lock was given to it with (see leave.lua). It
// remembers the call as finished if a request of it may still arrive late.
func (c *Client) leave(ctx context.Context, m *Mutex, call *lockCall) {
	late := zeroArg
	if call.late {
		late = oneArg
	}
	args := scriptArgs(c.scripts.leave, m.keys.keyArgs, 4)
	args = append(args, call.ownerArg, call.ticketArg, late, c.rememberArg)
	_, _, _ = resolved(ctx, c, nil, func(ctx context.Context) (any, error) {
		return run(ctx, c.rdb, c.scripts.leave, args).Result()
	})
}

// giveUp ends a waiting call that failed: it leaves the queue, undoing a
// hand-over that came too late, so a Lock that fails, or a Client that
// closes, leaves nothing behind. It returns err.
func (c *Client) giveUp(ctx context.Context, m *Mutex, w *waiter, err error) error {
	leaveCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), c.opts.RetryFallback)
	defer cancel()
	c.leave(leaveCtx, m, &w.call)
	return err
}
