package redislock

import (
	"context"
	"fmt"
	"sync"
	"time"
)

// Hold is one Lock's hold on a lock: the handle that Lock returns and whose
// Unlock undoes it. Each Lock returns its own Hold, re-entries included;
// the holds of one owner share the ownership: its fencing token and its
// Context.
type Hold struct {
	own *ownership

	mu       sync.Mutex
	unlocked bool
	// request is the release in flight: an Unlock that failed for want of
	// Redis is retried with the same request, so it cannot undo two levels,
	// for as long as Redis keeps the request's result (requestSent is when
	// it was first sent).
	request     string
	requestSent time.Time
}

// Name returns the lock name.
func (h *Hold) Name() string { return h.own.key.name }

// Owner returns the owner the hold belongs to. Pass it to WithOwner to
// re-enter the lock.
func (h *Hold) Owner() Owner { return h.own.key.owner }

// Token returns the fencing token of the ownership: strictly greater than
// that of every earlier ownership of the lock, and the same across
// re-entries. Pass it to the protected resource, which should refuse writes
// with a token lower than one it has seen.
func (h *Hold) Token() int64 { return h.own.token }

// Context returns a context that is cancelled when the ownership ends or can
// no longer be vouched for. context.Cause tells why: ErrReleased after the
// final Unlock, ErrNotOwner when a renewal found the lock taken from the
// owner, ErrLeaseLost when no renewal succeeded before the local deadline,
// ErrClosed when the client closed.
func (h *Hold) Context() context.Context { return h.own.ctx }

// Done is Context().Done().
func (h *Hold) Done() <-chan struct{} { return h.own.ctx.Done() }

// Err returns nil while the ownership holds, and afterwards why it ended (see
// Context). It reads the clock itself rather than trusting the deadline timer
// to have fired: in a process just resumed from a pause, the timer may not
// have run yet, but Err already reports the loss.
func (h *Hold) Err() error { return h.own.err() }

// Unlock undoes this Hold's Lock. The last Unlock of an ownership frees the
// lock, hands it to the next waiter, and stops the watchdog's renewal of it
// before returning.
//
// It returns ErrNotHeld if nobody holds the lock (its lease ran out) or if
// this Hold was already unlocked, and ErrNotOwner if another owner, or a
// newer ownership of the same owner, holds the lock; it changes nothing in
// Redis in those cases. If Redis cannot be reached it returns
// ErrUnavailable. An Unlock that is not the last keeps its level then, under
// the watchdog: call Unlock again, and it resends the same request, which
// Redis applies at most once, if called again within the time Redis keeps
// the request's result (see Options.QueueTTL and request.go; 49 s with
// go-redis's defaults); later, the level is given up without a resend. The
// last Unlock ends the ownership whatever the outcome: renewal stops, and if
// Redis still has the lock, its lease runs out.
func (h *Hold) Unlock(ctx context.Context) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.unlocked {
		return ErrNotHeld
	}
	o := h.own
	c := o.c
	if err := c.checkOpen(); err != nil {
		return err
	}
	switch {
	case h.request == "":
		h.request, h.requestSent = newRequestID(), time.Now()
	case time.Since(h.requestSent) > c.latchTTL-c.resolveWindow:
		// Redis may have forgotten what the first attempt did: sent again,
		// it could undo a second level. So the level is given up here.
		h.unlocked = true
		c.giveUpLevel(o)
		return fmt.Errorf("%w: this Unlock's first attempt is too old to learn what it did; its level is given up, and runs out with the lease if Redis kept it", ErrUnavailable)
	}

	// Shared with other Unlocks, exclusive with a renewal batch: a renewal
	// in flight completes before the release, and none starts during it.
	c.renewing.RLock()
	defer c.renewing.RUnlock()

	c.mu.Lock()
	replaced := c.held[o.key] != nil && c.held[o.key] != o
	last, ticket, lease := o.levels <= 1, o.ticket, o.lease
	c.mu.Unlock()
	if replaced {
		// A newer ownership of the same owner holds the lock (it was
		// force-released and taken again): this Hold must not undo it.
		// Redis would refuse too, by the token, unless the counter expired.
		h.unlocked = true
		return ErrNotOwner
	}

	sent := time.Now()
	remaining, err := c.release(ctx, o.keys, o.key.owner, o.token, lease, h.request, ticket)
	if err != nil {
		if !last {
			return err
		}
		h.unlocked = true
		c.end(o, ErrReleased)
		return err
	}
	h.unlocked = true
	switch {
	case remaining > 0:
		c.mu.Lock()
		o.levels--
		last = o.levels == 0
		if !last {
			c.extendLocked(o, sent, lease)
		}
		c.mu.Unlock()
		if last {
			// Redis counts levels this client did not take: another
			// client acts for the same owner (WithOwner), and renews them.
			c.end(o, ErrReleased)
		}
		return nil
	case remaining == 0:
		c.end(o, ErrReleased)
		return nil
	case remaining == -2:
		c.end(o, ErrNotOwner)
		return ErrNotOwner
	default:
		c.end(o, ErrLeaseLost)
		return ErrNotHeld
	}
}

// giveUpLevel forgets one level of o without telling Redis. The last one
// ends o, so renewal stops and whatever Redis still holds runs out.
func (c *Client) giveUpLevel(o *ownership) {
	c.mu.Lock()
	o.levels--
	last := o.levels <= 0
	c.mu.Unlock()
	if last {
		c.end(o, ErrReleased)
	}
}

// ownership is one owner's hold on a lock in one client, from the Lock that
// took it to the Unlock that freed it, shared by the Holds of its
// re-entries.
type ownership struct {
	c        *Client
	key      holdKey
	keys     *lockKeys
	token    int64
	acquired time.Time
	ctx      context.Context
	cancel   context.CancelCauseFunc

	// Guarded by Client.mu.
	levels   int // Holds not yet unlocked
	lease    time.Duration
	watchdog bool
	// ticket is that of the Lock call the ownership began with, if it
	// waited: a grant to it still recorded (see scripts/lib.lua) is cleared
	// by the release.
	ticket      string
	deadline    time.Time // local monotonic deadline of the ownership
	deadlineSet time.Time // send time of the call that set deadline
	// confirmBy, if set, is when a lease shortened by its hand-over gets
	// extended to the full lease; confirming is set once that is asked of
	// the renewal loop.
	confirmBy  time.Time
	confirming bool
	timer      *time.Timer
}

func (o *ownership) err() error {
	if err := context.Cause(o.ctx); err != nil {
		return err
	}
	c := o.c
	c.mu.Lock()
	overdue := c.held[o.key] == o && !time.Now().Before(o.deadline)
	c.mu.Unlock()
	if overdue {
		c.end(o, ErrLeaseLost)
	}
	return context.Cause(o.ctx)
}

// holdKey identifies one owner's hold on one lock within a client.
type holdKey struct {
	name  string
	owner Owner
}

// hold records a successful acquisition, arms its deadline, and returns a
// new Hold for it. A re-entry joins the ownership already held; one that was
// lost is replaced.
func (c *Client) hold(m *Mutex, owner Owner, res acquireResult, start time.Time) *Hold {
	lease, watchdog := m.leaseTerms()
	key := holdKey{m.keys.name, owner}
	c.opts.Metrics.observeWait(time.Since(start))

	c.mu.Lock()
	o := c.held[key]
	var lapsed *ownership
	if o != nil && res.token != 0 && o.token != res.token {
		// A new token: the old ownership ended (say, force-released) before
		// this client noticed, and this is a new one, not a re-entry.
		lapsed, o = o, nil
		delete(c.held, key)
	}
	if o == nil {
		o = &ownership{c: c, key: key, keys: &m.keys, token: res.token, acquired: res.sent, ticket: res.ticket}
		o.ctx, o.cancel = context.WithCancelCause(context.Background())
		o.timer = time.AfterFunc(time.Hour, func() { c.checkDeadline(o) })
		c.held[key] = o
	}
	o.levels++
	o.lease, o.watchdog = lease, watchdog
	granted := lease
	if res.handover > 0 && res.handover < lease {
		granted = res.handover
	}
	c.extendLocked(o, res.sent, granted)
	c.mu.Unlock()
	if lapsed != nil {
		c.finish(lapsed, ErrNotOwner)
	}
	return &Hold{own: o}
}

// stillHeld returns h, once Lock has its answer. Its deadline counts from
// the first send of the acquire request, the earliest the lease can have
// started; if the reply was slow, or lost and the request resent, that
// deadline may have passed although Redis still has the lock. Then one
// renewal tells: it extends the lease only if the owner still holds the lock,
// and the hold counts from its send. Otherwise Lock returns ErrLeaseLost: the
// process was paused, or the network slowed, past the lease.
func (c *Client) stillHeld(ctx context.Context, h *Hold) (*Hold, error) {
	o := h.own
	c.mu.Lock()
	overdue := c.held[o.key] == o && !time.Now().Before(o.deadline)
	lease := o.lease
	c.mu.Unlock()
	if overdue && ctx.Err() == nil {
		sent := time.Now()
		renewed, err := renewScript.Run(ctx, c.rdb, []string{o.key.name}, lease.Milliseconds(), string(o.key.owner)).Int()
		if err == nil && renewed == 1 {
			c.extend(o, sent, lease)
		}
	}
	if err := h.Err(); err != nil {
		return nil, err
	}
	return h, nil
}

// end forgets o and ends its context with cause, if o is still held, after
// recording the hold time or the loss, so whoever sees the context end also
// sees the metrics. It reports whether o was still held.
func (c *Client) end(o *ownership, cause error) bool {
	c.mu.Lock()
	current := c.held[o.key] == o
	if current {
		delete(c.held, o.key)
	}
	c.mu.Unlock()
	if current {
		c.finish(o, cause)
	}
	return current
}

// finish stops an ownership that is no longer held and ends its context with
// cause, after recording the hold time or the loss.
func (c *Client) finish(o *ownership, cause error) {
	o.timer.Stop()
	switch cause {
	case ErrReleased:
		c.opts.Metrics.observeHold(time.Since(o.acquired))
	case ErrClosed:
	default:
		c.opts.Metrics.lostLease()
		c.opts.Logger.Info("lock lease lost", "lock", o.key.name, "owner", string(o.key.owner), "cause", cause.Error())
	}
	o.cancel(cause)
}
