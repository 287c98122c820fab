package redislock

import (
	"context"
	"errors"
	"math/rand/v2"
	"net"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// How waiting works. A lock's waiters form a FIFO queue in Redis (see
// scripts/queue.lua). Only the head of the queue retries when the release
// message arrives, so a release wakes one waiter, not a herd. A waiter learns
// that it became the head from its own attempt, or from a notice on its
// client's notice channel, sent by the script that moved the queue on.
//
// Each client has one pub/sub connection, subscribed to its notice channel
// and to the release channel of every lock it waits for. A lock's channel
// stays subscribed for subscriptionLinger after its last waiter leaves, so a
// busy lock costs no SUBSCRIBE per acquisition.
//
// Messages can be missed: the connection breaks, or a Redisson client frees
// the lock while our head does not know it is the head. So a waiter never
// sleeps longer than min(the lock's remaining lease, RetryFallback ± 20%).

const (
	subscriptionLinger = 10 * time.Second
	// receiveTimeout is how long the receiver blocks before it pings the
	// connection, so a dead one is noticed, and sweeps idle subscriptions.
	receiveTimeout = time.Second
)

type waiting struct {
	c             *Client
	noticeChannel string

	mu      sync.Mutex
	closed  bool
	pubsub  *redis.PubSub // nil until the first subscription
	notices *subscription // the notice channel's subscription
	locks   map[string]*subscription
}

// subscription is one subscribed channel and the waiters that listen on it.
type subscription struct {
	confirmed chan struct{} // closed when Redis confirms the subscription
	waiters   []*waiter     // for a lock channel: the lock's waiters
	idleSince time.Time
}

func (s *subscription) isConfirmed() bool {
	select {
	case <-s.confirmed:
		return true
	default:
		return false
	}
}

// waiter is one blocked Lock call.
type waiter struct {
	name    string
	channel string // the lock's release channel
	owner   Owner
	wake    chan struct{} // buffered: one pending wake-up is enough

	// Guarded by waiting.mu.
	sub      *subscription // the lock's subscription, once the waiter is on it
	head     bool          // heads the queue, so acts on the release message
	notices  uint64        // head notices received
	releases uint64        // release messages received
	// listening is true when the client was already subscribed to both the
	// lock's channel and the notice channel when the waiter registered, so
	// it cannot have missed anything since its first attempt.
	listening bool
}

func (w *waiter) signal() {
	select {
	case w.wake <- struct{}{}:
	default:
	}
}

func newWaiting(c *Client) *waiting {
	return &waiting{
		c:             c,
		noticeChannel: noticePrefix + c.opts.ID,
		locks:         make(map[string]*subscription),
	}
}

func newWaiter(keys *lockKeys, owner Owner) *waiter {
	return &waiter{name: keys.name, channel: keys.channel, owner: owner, wake: make(chan struct{}, 1)}
}

// register adds a waiter for the lock before its first attempt, if the
// client is subscribed to the lock; otherwise it returns nil. It sends
// nothing to Redis: subscribing is left to wait, for attempts that fail.
func (ws *waiting) register(keys *lockKeys, owner Owner) *waiter {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	sub := ws.locks[keys.channel]
	if sub == nil {
		return nil
	}
	w := newWaiter(keys, owner)
	sub.add(w)
	w.listening = sub.isConfirmed() && ws.notices != nil && ws.notices.isConfirmed()
	return w
}

func (s *subscription) add(w *waiter) {
	s.waiters = append(s.waiters, w)
	w.sub = s
}

func (ws *waiting) unregister(w *waiter) {
	ws.mu.Lock()
	defer ws.mu.Unlock()
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

// subscribe makes sure the client listens on the lock's channel and its
// notice channel, and returns channels that close once Redis confirms both.
func (ws *waiting) subscribe(ctx context.Context, w *waiter) ([]chan struct{}, error) {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	if ws.closed {
		return nil, ErrClosed
	}
	var channels []string
	if ws.notices == nil {
		ws.notices = &subscription{confirmed: make(chan struct{})}
		channels = append(channels, ws.noticeChannel)
	}
	lockChannel := w.channel
	sub := ws.locks[lockChannel]
	if sub == nil {
		sub = &subscription{confirmed: make(chan struct{})}
		ws.locks[lockChannel] = sub
		channels = append(channels, lockChannel)
	}
	if w.sub == nil {
		sub.add(w)
	}
	if len(channels) > 0 {
		if ws.pubsub == nil {
			ws.pubsub = ws.c.rdb.Subscribe(ctx)
			ws.c.loops.Add(1)
			go ws.receive(ws.pubsub)
		}
		if err := ws.pubsub.Subscribe(ctx, channels...); err != nil {
			return nil, unavailable(err)
		}
	}
	return []chan struct{}{ws.notices.confirmed, sub.confirmed}, nil
}

// close ends the subscription and wakes every waiter, which then sees the
// client closed.
func (ws *waiting) close() {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	ws.closed = true
	if ws.pubsub != nil {
		_ = ws.pubsub.Close()
	}
	for _, sub := range ws.locks {
		for _, w := range sub.waiters {
			w.signal()
		}
	}
}

// receive is the client's pub/sub goroutine: it routes release messages and
// head notices to waiters. go-redis reconnects and resubscribes by itself;
// a confirmation of a channel already confirmed means a reconnection, after
// which messages may have been missed, so every waiter on it retries.
func (ws *waiting) receive(ps *redis.PubSub) {
	defer ws.c.loops.Done()
	lastSweep := time.Now()
	for {
		msg, err := ps.ReceiveTimeout(context.Background(), receiveTimeout)
		ws.mu.Lock()
		closed := ws.closed
		ws.mu.Unlock()
		if closed {
			return
		}
		if time.Since(lastSweep) > receiveTimeout {
			ws.sweep()
			lastSweep = time.Now()
		}
		if err != nil {
			var netErr net.Error
			if errors.As(err, &netErr) && netErr.Timeout() {
				_ = ps.Ping(context.Background())
				continue
			}
			// A broken connection: go-redis reconnects on the next receive.
			select {
			case <-ws.c.done:
				return
			case <-time.After(100 * time.Millisecond):
			}
			continue
		}
		switch m := msg.(type) {
		case *redis.Subscription:
			if m.Kind == "subscribe" {
				ws.confirm(m.Channel)
			}
		case *redis.Message:
			if m.Channel == ws.noticeChannel {
				ws.notice(m.Payload)
			} else if m.Payload == releaseMessage {
				ws.released(m.Channel)
			}
		}
	}
}

func (ws *waiting) confirm(channel string) {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	var sub *subscription
	if channel == ws.noticeChannel {
		sub = ws.notices
	} else {
		sub = ws.locks[channel]
	}
	if sub == nil {
		return
	}
	if !sub.isConfirmed() {
		close(sub.confirmed)
		return
	}
	// Resubscribed after a reconnection.
	subs := []*subscription{sub}
	if sub == ws.notices {
		subs = subs[:0]
		for _, s := range ws.locks {
			subs = append(subs, s)
		}
	}
	for _, s := range subs {
		for _, w := range s.waiters {
			w.signal()
		}
	}
}

// released wakes the lock's waiter at the head of the queue. Waiters further
// back stay asleep: the head takes the lock and the next one is notified.
func (ws *waiting) released(channel string) {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	if sub := ws.locks[channel]; sub != nil {
		for _, w := range sub.waiters {
			w.releases++
			if w.head {
				w.signal()
			}
		}
	}
}

// notice handles "<free> <owner> <name>": owner now heads the queue of the
// lock name, which is free ("1") or held ("0").
func (ws *waiting) notice(payload string) {
	free, rest, ok := strings.Cut(payload, " ")
	if !ok {
		return
	}
	owner, name, ok := strings.Cut(rest, " ")
	if !ok {
		return
	}
	ws.mu.Lock()
	defer ws.mu.Unlock()
	if sub := ws.locks[channelFor(name)]; sub != nil {
		for _, w := range sub.waiters {
			if w.owner == Owner(owner) {
				w.head = true
				w.notices++
				if free == "1" {
					w.signal()
				}
			}
		}
	}
}

// sweep unsubscribes lock channels nobody has waited on for a while.
func (ws *waiting) sweep() {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	var idle []string
	for channel, sub := range ws.locks {
		if len(sub.waiters) == 0 && time.Since(sub.idleSince) > subscriptionLinger {
			delete(ws.locks, channel)
			idle = append(idle, channel)
		}
	}
	if len(idle) > 0 && ws.pubsub != nil {
		_ = ws.pubsub.Unsubscribe(context.Background(), idle...)
	}
}

// attempt runs one acquire for a waiter and records whether it heads the
// queue. Messages can arrive while the attempt is in flight, before the
// waiter knows it is the head: a head notice is newer than what the attempt
// can tell, so it wins; a release message means the new head must retry at
// once rather than sleep through it.
func (ws *waiting) attempt(ctx context.Context, w *waiter, m *Mutex, owner Owner, queueTTL time.Duration) (acquireResult, error) {
	if w == nil {
		return ws.c.tryAcquire(ctx, m, owner, queueTTL)
	}
	ws.mu.Lock()
	notices, releases := w.notices, w.releases
	ws.mu.Unlock()
	res, err := ws.c.tryAcquire(ctx, m, owner, queueTTL)
	if err == nil && !res.acquired {
		ws.mu.Lock()
		w.head = res.head || w.notices != notices
		if w.head && w.releases != releases {
			w.signal()
		}
		ws.mu.Unlock()
	}
	return res, err
}

// wait blocks until w's owner holds the lock, after a first attempt that
// found it taken. It leaves the wait queue if it gives up.
func (ws *waiting) wait(ctx context.Context, w *waiter, m *Mutex, wait time.Duration, first acquireResult) (acquireResult, error) {
	c := ws.c
	ws.mu.Lock()
	listening := w.listening
	ws.mu.Unlock()

	var deadline <-chan time.Time
	if wait > 0 {
		t := time.NewTimer(wait)
		defer t.Stop()
		deadline = t.C
	}
	giveUp := func(err error) (acquireResult, error) {
		leaveCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), c.opts.RetryFallback)
		defer cancel()
		c.leaveQueue(leaveCtx, m, w.owner)
		return acquireResult{}, err
	}

	if !listening {
		confirmed, err := ws.subscribe(ctx, w)
		if err != nil {
			return giveUp(err)
		}
		for _, ch := range confirmed {
			select {
			case <-ch:
			case <-ctx.Done():
				return giveUp(ctx.Err())
			case <-deadline:
				return giveUp(ErrWaitTimeout)
			case <-c.done:
				return acquireResult{}, ErrClosed
			}
		}
	}

	res, retry := first, !listening
	sleep := time.NewTimer(0)
	defer sleep.Stop()
	for {
		if retry {
			if err := c.checkOpen(); err != nil {
				return acquireResult{}, err
			}
			var err error
			res, err = ws.attempt(ctx, w, m, w.owner, c.opts.QueueTTL)
			switch {
			case errors.Is(err, ErrUnavailable):
				// A failover or a dropped connection: keep waiting, and try
				// again after the fallback, until ctx or the wait bound ends.
				c.opts.Logger.Info("lock attempt failed while waiting; retrying", "lock", w.name, "error", err.Error())
				res = acquireResult{}
			case err != nil:
				return giveUp(err)
			case res.acquired:
				return res, nil
			}
		}
		retry = true
		sleep.Reset(c.fallback(res.pttl))
		select {
		case <-w.wake:
		case <-sleep.C:
		case <-ctx.Done():
			return giveUp(ctx.Err())
		case <-deadline:
			return giveUp(ErrWaitTimeout)
		case <-c.done:
			return acquireResult{}, ErrClosed
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

// leaveQueue takes the owner out of the lock's wait queue, passing the head
// position on. Best effort: an entry left behind expires after QueueTTL.
func (c *Client) leaveQueue(ctx context.Context, m *Mutex, owner Owner) {
	_ = leaveScript.Run(ctx, c.rdb, m.keys.leave,
		string(owner), noticePrefix, m.keys.name).Err()
}
