package redislock

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// Hold is one Lock's hold on a lock: the handle that Lock returns and whose
// Unlock undoes it. Each Lock returns its own Hold, re-entries included;
// the holds of one owner share the ownership: its fencing token and its
// Context.
type Hold struct {
	own       *ownership
	ticket    string
	ticketArg any
	// late is set when a request of the Hold's Lock may still arrive late:
	// its Unlock then has Redis remember the call as finished.
	late bool

	mu       sync.Mutex
	unlocked bool
	// failed is set while an Unlock of the Hold has failed for want of
	// Redis: its level is given up in the client, and sent again by a
	// retry, or by the ownership's last Unlock (see ownership.pending).
	failed bool
}

// Name returns the lock name.
func (h *Hold) Name() string { return h.own.key.name }

// Owner returns the owner the hold belongs to.
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
// ErrUnavailable: the Hold's level is given up in the client, and Unlock may
// be called again to send the same request, which Redis applies at most
// once, however late; the ownership's last Unlock sends it again too. The
// last Unlock ends the ownership whatever the outcome: renewal stops, and if
// Redis still has the lock, its lease runs out.
//
// A reply lost on the way is resolved by sending the request again; Redis
// tells the resend whether the first send undid the Hold's level, or freed
// the lock (see freed_by in scripts/lib.lua), and Unlock then reports
// success, whoever holds the lock since. Anything else that finds the
// ownership gone (another client's ForceReleaseClient, a Redis that lost
// the lock, a lease that ran out) is an error: ErrNotHeld or ErrNotOwner if
// the request was sent once, and ErrLeaseLost if it was sent again, since
// Redis may then have lost what would tell whether the first send freed it.
func (h *Hold) Unlock(ctx context.Context) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	o := h.own
	c := o.c
	if err := c.checkOpen(); err != nil {
		return err
	}
	if h.unlocked {
		return ErrNotHeld
	}

	c.mu.Lock()
	if current := c.held[o.key]; current != nil && current != o {
		// A newer ownership of the same owner holds the lock (it was
		// force-released and taken again): this Hold must not undo it.
		// Redis would refuse too, by the token.
		c.mu.Unlock()
		h.unlocked = true
		return ErrNotOwner
	}
	retry := h.failed
	last := !retry && o.levels <= 1
	var pending []*Hold
	if last {
		pending = o.pending
		o.pending = nil
	}
	remember := emptyArg
	switch {
	case last && len(o.late) > 0:
		remember = strings.Join(o.late, " ")
	case h.late:
		remember = h.ticket
	}
	if last {
		o.releasing++
	}
	taken := o.taken
	c.mu.Unlock()

	// Holds whose Unlock failed go first: they are given up in the client
	// already, and the last Unlock must leave none of their levels behind.
	for _, p := range pending {
		if _, _, err := c.release(ctx, o, p.ticketArg, emptyArg); err == nil {
			p.markUnlocked()
		}
	}
	var remaining int64
	var err error
	freed, late, resent := false, false, false
	if last && taken && remember == emptyArg && h.ticket == string(o.key.owner) && !c.waits.listening(o.key.name) {
		freed, late, err = c.unlock(ctx, o, h)
	}
	if !freed && err == nil {
		remaining, resent, err = c.release(ctx, o, h.ticketArg, remember)
		late = late || resent
	}

	c.mu.Lock()
	if last {
		o.releasing--
	}
	switch {
	case err != nil && !retry:
		// Given up in the client: renewal goes on for the levels left, and
		// the last Unlock sends this one again.
		h.failed = true
		o.levels--
		o.dropHold(h)
		last = o.levels == 0
		if !last {
			o.pending = append(o.pending, h)
		}
		c.mu.Unlock()
		if last {
			c.end(o, ErrReleased)
		}
		return err
	case err != nil:
		c.mu.Unlock()
		return err
	}
	h.unlocked = true
	result, cause := released(remaining, late)
	if retry {
		h.failed = false
		o.dropPending(h)
		c.mu.Unlock()
		return result
	}
	o.levels--
	o.dropHold(h)
	last = o.levels == 0
	c.mu.Unlock()
	if last || remaining <= 0 {
		// Redis may count levels this client did not take: another client
		// acts for the same owner, and renews them.
		c.end(o, cause)
	}
	return result
}

// released maps a release's answer (see release.lua) to Unlock's result,
// and to why the ownership ends if that was its last level here: a count
// of 0 or more, the release ran (this send or the first); -1, nobody holds
// the lock and this release freed nothing: the ownership was lost; -2 or
// -3, another ownership holds it. A negative answer is sure only if no copy
// of the request may have run before the one that answered (resent false):
// a copy that freed the lock leaves the ownership's hash for the resend to
// find (see freed_key in scripts/lib.lua), but a Redis that lost its data
// meanwhile, or a lease that ran out since, leaves nothing. Then whether the
// Unlock freed the lock is unknown, and the result is ErrLeaseLost.
func released(remaining int64, resent bool) (result, cause error) {
	switch {
	case remaining >= 0:
		return nil, ErrReleased
	case remaining < -3:
		return unexpectedReply("release", remaining), ErrNotOwner
	case resent:
		return fmt.Errorf("%w: the release was sent more than once and Redis no longer has the ownership, so whether this Unlock freed the lock is unknown", ErrLeaseLost), ErrLeaseLost
	case remaining == -1:
		return ErrNotHeld, ErrLeaseLost
	default:
		return ErrNotOwner, ErrNotOwner
	}
}

// reentrable reports why a Lock may not re-enter h's ownership: h was
// unlocked, or its ownership ended (ErrNotHeld, wrapping why).
func (h *Hold) reentrable() error {
	h.mu.Lock()
	unlocked := h.unlocked || h.failed
	h.mu.Unlock()
	if unlocked {
		return fmt.Errorf("%w: the hold the context carries (WithHold) was unlocked", ErrNotHeld)
	}
	if err := h.Err(); err != nil {
		return fmt.Errorf("%w: the hold the context carries (WithHold) has ended: %w", ErrNotHeld, err)
	}
	return nil
}

// markUnlocked records that a failed Unlock's level was undone by another.
func (h *Hold) markUnlocked() {
	h.mu.Lock()
	h.unlocked, h.failed = true, false
	h.mu.Unlock()
}

// Refresh extends the ownership's lease now: to its full length from now,
// as the watchdog's renewal does, for a fixed lease too. It returns why the
// ownership ended if it has (see Context), or ErrNotOwner, and ends the
// ownership, if it no longer holds the lock; ErrUnavailable if Redis cannot
// be reached.
func (h *Hold) Refresh(ctx context.Context) error {
	o := h.own
	if err := o.err(); err != nil {
		return err
	}
	sent := time.Now()
	renewed, err := o.c.renew(ctx, o)
	if err != nil {
		return failure(ctx, err)
	}
	if !renewed {
		o.c.end(o, ErrNotOwner)
		return ErrNotOwner
	}
	o.c.extend(o, sent, o.lease)
	return nil
}

// TTL returns the ownership's remaining lease as Redis has it: -1 if it has
// no expiry. It returns why the ownership ended if it has (see Context), or
// ErrNotOwner, and ends the ownership, if it no longer holds the lock;
// ErrUnavailable if Redis cannot be reached.
func (h *Hold) TTL(ctx context.Context) (time.Duration, error) {
	o := h.own
	if err := o.err(); err != nil {
		return 0, err
	}
	args := scriptArgs(ttlScript, o.keys.nameArgs, 2)
	args = append(args, o.ownerArg, o.tokenArg)
	ms, err := run(ctx, o.c.rdb, ttlScript, args).Int64()
	switch {
	case err != nil:
		return 0, failure(ctx, err)
	case ms == -2:
		o.c.end(o, ErrNotOwner)
		return 0, ErrNotOwner
	case ms < 0:
		return -1, nil
	}
	return time.Duration(ms) * time.Millisecond, nil
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
	// Boxed once for the argument lists: the owner ID, the ownership's
	// '~t' (see scripts/lib.lua) and its lease in ms.
	ownerArg, tokenArg, leaseArg any
	lease                        time.Duration
	watchdog                     bool

	// Guarded by Client.mu.
	// taken is set when take.lua took the lock: nobody waited then.
	taken  bool
	levels int // Holds not yet unlocked, nor given up
	// first and more are the Holds not yet unlocked, nor given up; pending
	// are Holds whose Unlock failed: their levels may still be in Redis,
	// and the last Unlock releases them first, as Close does with all
	// (unless Options.KeepOnClose).
	first   *Hold
	more    []*Hold
	pending []*Hold
	// late are the tickets of the ownership's calls whose requests may
	// still arrive late: the release that frees the lock remembers them.
	late []string
	// releasing counts last Unlocks in flight, which may free the lock: a
	// renewal that finds the lock gone then is no loss. Any other release
	// leaves the lock held, so a renewal that finds it gone meanwhile is.
	releasing   int
	deadline    time.Time // local monotonic deadline of the ownership
	deadlineSet time.Time // send time of the call that set deadline
	// confirmBy, if set, is when a lease shortened by its hand-over gets
	// extended to the full lease; confirming is set once that is asked of
	// the renewal loop.
	confirmBy  time.Time
	confirming bool
	timer      *time.Timer
}

func (o *ownership) dropPending(h *Hold) { o.pending = without(o.pending, h) }

// addHold and dropHold keep the ownership's Holds not yet unlocked; the
// first needs no slice.
func (o *ownership) addHold(h *Hold) {
	if o.first == nil {
		o.first = h
		return
	}
	o.more = append(o.more, h)
}

func (o *ownership) dropHold(h *Hold) {
	if o.first == h {
		o.first = nil
		return
	}
	o.more = without(o.more, h)
}

func without(holds []*Hold, h *Hold) []*Hold {
	for i, p := range holds {
		if p == h {
			return append(holds[:i], holds[i+1:]...)
		}
	}
	return holds
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
func (c *Client) hold(m *Mutex, call *lockCall, res acquireResult, start time.Time) *Hold {
	key := holdKey{m.keys.name, call.owner}
	c.opts.Metrics.observeWait(time.Since(start))

	c.mu.Lock()
	o := c.held[key]
	var lapsed *ownership
	if o != nil && o.token != res.token {
		// A new token: the old ownership ended (say, force-released) before
		// this client noticed, and this is a new one, not a re-entry.
		lapsed, o = o, nil
		delete(c.held, key)
	}
	if o == nil {
		o = &ownership{c: c, key: key, keys: &m.keys, token: res.token, acquired: res.sent,
			ownerArg: call.ownerArg, tokenArg: strconv.FormatInt(res.token, 10) + " " + m.termsText,
			leaseArg: m.leaseArg, lease: m.terms, watchdog: m.watchdog}
		o.ctx, o.cancel = context.WithCancelCause(context.Background())
		o.timer = time.AfterFunc(time.Hour, func() { c.checkDeadline(o) })
		c.held[key] = o
	}
	o.levels++
	o.taken = o.taken || res.taken
	if call.late {
		o.late = append(o.late, call.ticket)
	}
	granted := m.terms
	if res.handover > 0 && res.handover < m.terms {
		granted = res.handover
	}
	c.extendLocked(o, res.sent, granted)
	h := &Hold{own: o, ticket: call.ticket, ticketArg: call.ticketArg, late: call.late}
	o.addHold(h)
	c.mu.Unlock()
	if lapsed != nil {
		c.finish(lapsed, ErrNotOwner)
	}
	return h
}

// stillHeld returns h, once Lock has its answer. Its deadline counts from
// the first send of the acquire request, the earliest the lease can have
// started; if the reply was slow, or lost and the request resent, that
// deadline may have passed although Redis still has the lock. Then one
// renewal tells: it extends the lease only if the ownership still holds the
// lock, and the hold counts from its send. Otherwise Lock returns
// ErrLeaseLost: the process was paused, or the network slowed, past the
// lease.
//
// A ForceReleaseClient of this client that began while the Lock was in
// flight (forced is the count of those begun when it started) may have
// removed what the Lock took after it ended the client's Holds: the Lock
// then waits for it to finish, and one renewal tells whether the ownership
// is still in Redis; if not, Lock returns ErrNotOwner.
func (c *Client) stillHeld(ctx context.Context, h *Hold, forced uint64) (*Hold, error) {
	o := h.own
	if c.forced.Load() != forced {
		c.forcing.RLock()
		renewed, err := c.renew(context.WithoutCancel(ctx), o)
		c.forcing.RUnlock()
		if err == nil && !renewed {
			c.end(o, ErrNotOwner)
		}
	}
	c.mu.Lock()
	overdue := c.held[o.key] == o && !time.Now().Before(o.deadline)
	c.mu.Unlock()
	if overdue && ctx.Err() == nil {
		sent := time.Now()
		if renewed, err := c.renew(ctx, o); err == nil && renewed {
			c.extend(o, sent, o.lease)
		}
	}
	if err := h.Err(); err != nil {
		return nil, err
	}
	return h, nil
}

// unlock runs unlock.lua, the last Unlock of an uncontended ownership of an
// owner of its own, for a Hold whose call was that owner's: it frees the
// lock if nobody is queued and nothing else holds a level, and otherwise
// changes nothing and reports it, for release.lua to decide. It is tried
// only where it likely succeeds: the client took the lock with take.lua,
// and does not listen on the lock for waiters of its own.
func (c *Client) unlock(ctx context.Context, o *ownership, h *Hold) (freed, late bool, err error) {
	s := c.scripts.unlock
	args := scriptArgs(s, o.keys.unlockArgs, 2)
	args = append(args, o.ownerArg, o.tokenArg)
	sent := time.Now()
	n, err := run(ctx, c.rdb, s, args).Int64()
	late = time.Since(sent) >= c.lateAfter
	if outcomeUnknown(err) {
		n, late, err = resolved(ctx, c, err, func(ctx context.Context) (int64, error) { return run(ctx, c.rdb, s, args).Int64() })
	}
	return err == nil && n == 0, late, failure(ctx, err)
}

// releaseAll ends every ownership the client holds with ErrClosed, then
// releases the levels its own Locks took in Redis, or with
// Options.KeepOnClose marks them left for an adopter (see abandon.lua), in
// one pipelined round trip bounded by RetryFallback: Close's last step. The
// Holds end first, so that no Hold still vouches for a lock that another
// client may already have taken.
func (c *Client) releaseAll() {
	type level struct {
		o    *ownership
		hold *Hold
	}
	var all []level
	var owned []*ownership
	c.mu.Lock()
	for _, o := range c.held {
		owned = append(owned, o)
		for _, h := range append(append([]*Hold{o.first}, o.more...), o.pending...) {
			if h != nil {
				all = append(all, level{o, h})
			}
		}
	}
	c.mu.Unlock()
	for _, o := range owned {
		c.end(o, ErrClosed)
	}
	if len(all) > 0 {
		s, keys, argc := c.scripts.release, func(o *ownership) []any { return o.keys.keyArgs }, 6
		if c.opts.KeepOnClose {
			s, keys, argc = abandonScript, func(o *ownership) []any { return o.keys.nameArgs }, 3
		}
		ctx, cancel := context.WithTimeout(context.Background(), c.opts.RetryFallback)
		send := func(todo []level, eval bool) []level {
			pipe := c.rdb.Pipeline()
			cmds := make([]*redis.Cmd, len(todo))
			for i, r := range todo {
				args := scriptArgs(s, keys(r.o), argc)
				args = append(args, r.o.ownerArg, r.hold.ticketArg, r.o.tokenArg)
				if !c.opts.KeepOnClose {
					args = append(args, emptyArg, c.rememberArg, time.Now().UnixMicro())
				}
				if eval {
					args[0], args[1] = "eval", s.body
				}
				cmds[i] = pipe.Do(ctx, args...)
			}
			_, _ = pipe.Exec(ctx)
			var again []level
			for i, cmd := range cmds {
				if isNoScript(cmd.Err()) {
					again = append(again, todo[i])
				}
			}
			return again
		}
		if again := send(all, false); len(again) > 0 {
			send(again, true)
		}
		cancel()
	}
	for _, r := range all {
		r.hold.markUnlocked()
	}
}

// release runs the release script for the Hold with the ticket given (see
// release.lua); remember names the calls to remember as finished. A lost
// reply is resolved by sending the same request again.
//
// late reports whether a copy of the request may have run before the one
// that answered: it was resent, or took long enough for go-redis to resend
// it (see request.go).
func (c *Client) release(ctx context.Context, o *ownership, ticketArg, remember any) (n int64, late bool, err error) {
	args := scriptArgs(c.scripts.release, o.keys.keyArgs, 6)
	args = append(args, o.ownerArg, ticketArg, o.tokenArg, remember, c.rememberArg, time.Now().UnixMicro())
	sent := time.Now()
	n, err = run(ctx, c.rdb, c.scripts.release, args).Int64()
	late = time.Since(sent) >= c.lateAfter
	if outcomeUnknown(err) {
		n, late, err = resolved(ctx, c, err, func(ctx context.Context) (int64, error) {
			return run(ctx, c.rdb, c.scripts.release, args).Int64()
		})
	}
	return n, late, failure(ctx, err)
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
