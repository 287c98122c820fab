package redislock

import (
	"context"
	"errors"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"time"
)

// How waiting works. A lock's waiters form a FIFO queue in Redis (see
// scripts/lib.lua). The release that frees the lock hands it straight to the
// live head of the queue, and tells it so with a notice on the lock's notice
// channel for the waiter's client: the waiter holds the lock when the notice arrives, without another
// round trip, and no other waiter wakes. Within a client, one Lock call per
// owner and lock waits at a time (see enter), so a hand-over to an owner
// belongs to exactly one call.
//
// The lock can also come free without a hand-over: a Redisson client
// releases it, or a holder's lease runs out. Then only the head of the queue
// may take it, and only the head retries when the release message arrives. A
// waiter learns that it became the head from its own attempt, or from a
// notice sent by the script that moved the queue on.
//
// The client listens on each lock it waits for through a subscription (see
// subscriptions.go): the lock's release channel, and its notice channel.
//
// Messages can be missed: the connection breaks, or a Redisson client frees
// the lock while our head does not know it is the head. So a waiter never
// sleeps longer than min(the lock's remaining lease, RetryFallback ± 20%).
// Its retries refresh its queue entry, and take a hand-over whose notice was
// missed.

type waiting struct {
	c *Client
	// sharded is set on a Cluster with sharded pub/sub (see
	// subscriptions.go).
	sharded bool

	mu       sync.Mutex
	closed   bool
	shared   *pubsubConn              // the one connection, unless sharded
	shards   map[string]*pubsubConn   // sharded: one per master, by address
	subs     map[string]*subscription // by lock name
	channels map[string]*subscription // by channel, both of each lock's
	slots    map[holdKey]*waiter      // the one waiting Lock call per owner and lock
}

// waiter is one Lock call that may wait.
type waiter struct {
	key holdKey
	// call carries the call's ticket, which identifies it in Redis: its
	// queue entry, and a level handed to it, are its own, not those of
	// another call of the same owner. Only the calling goroutine changes
	// it.
	call lockCall
	wake chan struct{} // buffered: one pending wake-up is enough
	done chan struct{} // closed when the call stops waiting

	// Guarded by waiting.mu.
	sub      *subscription // the lock's subscription, once the waiter is on it
	head     bool          // heads the queue, so acts on the release message
	notices  uint64        // head notices received
	releases uint64        // release messages received
	// releasesTried is releases as of the last attempt: an attempt by the
	// head after more came follows a release message (see acquire.lua's
	// ARGV[7]).
	releasesTried uint64
	// listening is true when the client was already subscribed to the
	// lock's channels when the waiter registered, so it cannot have missed
	// anything since its first attempt.
	listening bool
	// queuedSent is when the waiter's last attempt that left it queued was
	// sent; a hand-over can only have come after it. lastToken is the latest
	// token such an attempt saw: a hand-over to this call has a higher one,
	// while the notice of an earlier hand-over to the same owner, read late,
	// does not.
	queuedSent time.Time
	lastToken  int64
	handover   *handover // the latest received, not yet taken
	// aheadLapses, if set, is when every entry ahead of the waiter lapses
	// unless their waiters refresh them: then this one heads the queue, and
	// must know it to act on a release message. aheadUnseen is set while
	// the waiter has not learned it: it then acts on release messages too.
	aheadLapses time.Time
	aheadUnseen bool
	// notBefore, if set, is when a race release lets the head take the
	// lock: before that, clients outside the queue may (see races in
	// scripts/lib.lua).
	notBefore time.Time
}

// handover is the lock, handed to a waiter by the release that freed it.
type handover struct {
	token int64
	lease time.Duration // as granted, possibly shorter than asked for
}

func (w *waiter) signal() {
	select {
	case w.wake <- struct{}{}:
	default:
	}
}

func newWaiting(c *Client, sharded bool) *waiting {
	return &waiting{
		c:        c,
		sharded:  sharded,
		subs:     make(map[string]*subscription),
		channels: make(map[string]*subscription),
		shards:   make(map[string]*pubsubConn),
		slots:    make(map[holdKey]*waiter),
	}
}

// enter makes a waiter for a Lock call of owner on the lock, before its first
// attempt. If another call of the same owner is waiting for the lock in this
// client, enter first waits for it to finish: the second call then re-enters
// a lock the first took, or queues in turn. If the client is already
// subscribed to the lock, the waiter listens from the start, so no release
// message or notice sent after its first attempt can be missed. enter sends
// nothing to Redis: subscribing is left to wait, for attempts that fail.
func (ws *waiting) enter(ctx context.Context, keys *lockKeys, call lockCall, bound <-chan time.Time) (*waiter, error) {
	key := holdKey{keys.name, call.owner}
	for {
		ws.mu.Lock()
		if ws.closed {
			ws.mu.Unlock()
			return nil, ErrClosed
		}
		other := ws.slots[key]
		if other == nil {
			w := &waiter{key: key, call: call, wake: make(chan struct{}, 1), done: make(chan struct{})}
			ws.slots[key] = w
			if sub := ws.subs[keys.name]; sub != nil {
				sub.add(w)
				w.listening = sub.isConfirmed()
			}
			ws.mu.Unlock()
			return w, nil
		}
		ws.mu.Unlock()
		select {
		case <-other.done:
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-bound:
			return nil, ErrWaitTimeout
		case <-ws.c.done:
			return nil, ErrClosed
		}
	}
}

// listening reports whether the client listens on the lock's channels.
func (ws *waiting) listening(name string) bool {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	return ws.subs[name] != nil
}

// exit ends a waiter's Lock call, letting the next call of its owner in.
func (ws *waiting) exit(w *waiter) {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	if ws.slots[w.key] == w {
		delete(ws.slots, w.key)
	}
	close(w.done)
	sub := w.sub
	if sub == nil {
		return
	}
	for i, other := range sub.waiters {
		if other == w {
			sub.waiters = append(sub.waiters[:i], sub.waiters[i+1:]...)
			break
		}
	}
	if len(sub.waiters) == 0 {
		sub.idleSince = time.Now()
	}
}

// released wakes the lock's waiter at the head of the queue, one behind
// entries that have all lapsed since, or one that has not yet looked at the
// entries ahead. Waiters further back stay asleep: the head takes the lock
// and the next one is notified.
func (ws *waiting) released(sub *subscription) {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	now := time.Now()
	for _, w := range sub.waiters {
		w.releases++
		if w.head || w.aheadUnseen || !w.aheadLapses.IsZero() && now.After(w.aheadLapses) {
			w.signal()
		}
	}
}

// notice handles a notice for owner about the lock name (see notify in
// scripts/lib.lua): "1 <owner> <name>" or "0 <owner> <name>", the owner now
// heads the queue of the lock, which is free or held; "g <owner> <name>
// <token> <lease ms> <ticket>", the lock was handed to the owner's call with
// that ticket.
func (ws *waiting) notice(payload string) {
	fields := strings.Fields(payload)
	if len(fields) < 3 {
		return
	}
	kind, key := fields[0], holdKey{name: fields[2], owner: Owner(fields[1])}
	ws.mu.Lock()
	defer ws.mu.Unlock()
	w := ws.slots[key]
	if w == nil || w.sub == nil {
		// Nobody waits for it here any more. A hand-over is then undone by
		// the waiter's leave (leave.lua), or runs out with its short lease.
		return
	}
	switch kind {
	case "g":
		// A hand-over to another call of the owner (an earlier one's, read
		// late) carries another ticket.
		if len(fields) != 6 || fields[5] != w.call.ticket {
			return
		}
		token, err1 := strconv.ParseInt(fields[3], 10, 64)
		ms, err2 := strconv.ParseInt(fields[4], 10, 64)
		if err1 != nil || err2 != nil {
			return
		}
		if w.handover == nil || token > w.handover.token {
			w.handover = &handover{token: token, lease: time.Duration(ms) * time.Millisecond}
		}
		w.signal()
	case "0", "1":
		if !w.head {
			// Release messages heard before are not its races: another
			// waiter headed the queue then, and counted them.
			w.releasesTried = w.releases
		}
		w.head = true
		w.notices++
		if kind == "1" {
			if len(fields) == 4 {
				if ms, err := strconv.ParseInt(fields[3], 10, 64); err == nil {
					w.notBefore = time.Now().Add(time.Duration(ms) * time.Millisecond)
				}
			}
			w.signal()
		}
	}
}

// attempt runs one acquire for a waiter and records whether it heads the
// queue. Messages can arrive while the attempt is in flight, before the
// waiter knows it is the head: a head notice is newer than what the attempt
// can tell, so it wins; a release message means the new head must retry at
// once rather than sleep through it.
func (ws *waiting) attempt(ctx context.Context, w *waiter, m *Mutex) (acquireResult, error) {
	ws.mu.Lock()
	notices, releases := w.notices, w.releases
	var missed uint64
	if w.head {
		missed = releases - w.releasesTried
	}
	w.releasesTried = releases
	ws.mu.Unlock()
	res, err := ws.c.tryAcquire(ctx, m, &w.call, true, missed)
	if err == nil && !res.acquired {
		ws.record(w, res, notices, releases)
	}
	return res, err
}

// record notes what an attempt that left w queued told: when it was sent,
// the holder's token, whether w heads the queue, and when the entry ahead of
// it lapses. notices and releases are w's counts when the attempt was sent.
func (ws *waiting) record(w *waiter, res acquireResult, notices, releases uint64) {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	w.queuedSent = res.sent
	w.lastToken = max(w.lastToken, res.token)
	w.head = res.rank == 0 || w.notices != notices
	w.aheadLapses, w.aheadUnseen = time.Time{}, res.aheadUnseen
	if res.lapse >= 0 {
		w.aheadLapses = res.sent.Add(res.lapse)
	}
	if w.head && w.releases != releases {
		w.signal()
	}
}

// takeHandover returns the hand-over w received, if any, as an acquisition.
// A hand-over is taken as it stands only while the lease it granted has more
// than two thirds left, counted from w's last attempt; an older one is taken
// with an attempt instead, which renews the full lease, as is every one when
// Options.WaitReplicas is set.
func (ws *waiting) takeHandover(w *waiter) (res acquireResult, ok, retry bool) {
	ws.mu.Lock()
	h, sent, last := w.handover, w.queuedSent, w.lastToken
	w.handover = nil
	ws.mu.Unlock()
	if h == nil || h.token <= last {
		return acquireResult{}, false, false
	}
	if time.Since(sent) >= h.lease/3 || ws.c.opts.WaitReplicas > 0 {
		// With WaitReplicas, the attempt is what waits for the replicas to
		// have the hand-over.
		return acquireResult{}, false, true
	}
	return acquireResult{acquired: true, token: h.token, sent: sent, handover: h.lease}, true, false
}

// wait blocks until w's call holds the lock, after a first attempt that
// found it taken and queued the call: until the lock is handed over, or a
// retry takes it. It leaves the wait queue if it gives up, undoing a
// hand-over that came too late. A waiter that cannot subscribe (Redis
// unreachable, or a shard failing over) polls, and subscribes again when it
// can.
func (ws *waiting) wait(ctx context.Context, w *waiter, m *Mutex, bound <-chan time.Time, first acquireResult) (acquireResult, error) {
	c := ws.c
	giveUp := func(err error) (acquireResult, error) { return acquireResult{}, c.giveUp(ctx, m, w, err) }

	// A retry that finds the call's level in Redis, a hand-over whose
	// notice was missed or came too late, takes it.
	res, retry := first, false
	sleep := time.NewTimer(0)
	defer sleep.Stop()
	for {
		ws.mu.Lock()
		subscribed := w.sub != nil && (w.sub.conn != nil || w.sub.subscribing)
		listening := w.listening
		ws.mu.Unlock()
		if !subscribed || !listening {
			confirmed, err := ws.subscribe(ctx, w, &m.keys)
			if err != nil {
				c.opts.Logger.Info("subscribing to a lock's channels failed; polling", "lock", w.key.name, "error", err.Error())
			} else if !listening {
				// A confirmation that does not come (a dead connection, an
				// ACL that denies the channel) is waited for no longer than
				// a retry would be: the waiter then polls, as it does after
				// a missed message. Once listening, it tries again, since
				// it may have missed news before.
				unconfirmed := time.NewTimer(c.fallback(0))
				select {
				case <-confirmed:
				case <-unconfirmed.C:
				case <-ctx.Done():
					unconfirmed.Stop()
					return giveUp(ctx.Err())
				case <-bound:
					unconfirmed.Stop()
					return giveUp(ErrWaitTimeout)
				case <-c.done:
					unconfirmed.Stop()
					return giveUp(ErrClosed)
				}
				unconfirmed.Stop()
				ws.mu.Lock()
				w.listening = true
				ws.mu.Unlock()
				retry = true
			}
		}
		handed, took, stale := ws.takeHandover(w)
		if took {
			if err := ctx.Err(); err != nil {
				// The caller is gone: the hand-over must not outlive it.
				return giveUp(err)
			}
			return handed, nil
		}
		ws.mu.Lock()
		grace := time.Until(w.notBefore)
		ws.mu.Unlock()
		if (retry || stale) && grace <= 0 {
			if err := c.checkOpen(); err != nil {
				return giveUp(err)
			}
			var err error
			res, err = ws.attempt(ctx, w, m)
			var shortfall *replicaShortfall
			switch {
			case errors.As(err, &shortfall):
				// The attempt gave its level up: the call is over.
				return giveUp(err)
			case errors.Is(err, ErrUnavailable):
				// A failover or a dropped connection: keep waiting, and try
				// again after the fallback, until ctx or the wait bound ends.
				c.opts.Logger.Info("lock attempt failed while waiting; retrying", "lock", w.key.name, "error", err.Error())
				res = acquireResult{}
			case err != nil:
				return giveUp(err)
			case res.acquired:
				return res, nil
			}
		}
		retry = true
		nap := c.fallback(res.pttl)
		ws.mu.Lock()
		if lapses := time.Until(w.aheadLapses); lapses > 0 {
			// Once the entries ahead lapse, unless refreshed, the call
			// heads the queue: its next attempt, then, tells it so.
			nap = min(nap, lapses+time.Millisecond)
		}
		if grace > 0 {
			nap = min(nap, grace)
		}
		ws.mu.Unlock()
		sleep.Reset(max(nap, 0))
		select {
		case <-w.wake:
		case <-sleep.C:
		case <-ctx.Done():
			return giveUp(ctx.Err())
		case <-bound:
			return giveUp(ErrWaitTimeout)
		case <-c.done:
			return giveUp(ErrClosed)
		}
		if !sleep.Stop() {
			select {
			case <-sleep.C:
			default:
			}
		}
	}
}

// fallback is how long a waiter sleeps without news: RetryFallback ± 20%,
// or less if the lock's lease runs out sooner.
func (c *Client) fallback(pttl time.Duration) time.Duration {
	base := c.opts.RetryFallback
	d := base*4/5 + rand.N(base*2/5+1)
	if pttl > 0 && pttl < d {
		return pttl
	}
	return d
}
