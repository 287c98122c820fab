package controllers

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"github.com/redis/go-redis/v9"

	"github.com/lockwarden/lockwarden/pkg/redislock"
)

// leaseTerms are a lock's lease and renewal interval.
type leaseTerms struct {
	lease, renew time.Duration
}

// LockClients hands out redislock Clients on one Redis, one per set of lease
// terms, because a Client's watchdog renews all its locks on one schedule.
// Locks with the same terms share a Client, its renewal loop and its
// pub/sub connection. A Client that holds nothing and has not been used for
// idleClientTTL is closed, so terms no lock uses any more cost nothing.
type LockClients struct {
	rdb     redis.UniversalClient
	log     logr.Logger
	metrics *redislock.Metrics
	now     func() time.Time

	// stalls times the calls sent through rdb (stalls.go).
	stalls *stallWatch

	mu      sync.Mutex
	clients map[leaseTerms]*lockClient
}

// lockClient is one Client and what says whether it is still needed.
type lockClient struct {
	client   *redislock.Client
	holds    int // live holds taken through it
	lastUsed time.Time
}

// idleClientTTL is how long a Client that holds nothing is kept for reuse.
const idleClientTTL = 5 * time.Minute

// NewLockClients returns LockClients on rdb, recording library metrics in
// metrics (which may be nil). Close them when done.
// It times every call sent through rdb, to show Redis's stalls on the
// locks.
func NewLockClients(rdb redis.UniversalClient, log logr.Logger, metrics *redislock.Metrics) *LockClients {
	stalls := newStallWatch()
	rdb.AddHook(stalls)
	return &LockClients{rdb: rdb, log: log, metrics: metrics, now: time.Now, stalls: stalls, clients: map[leaseTerms]*lockClient{}}
}

// For returns the Client for the terms, creating it on first use. It also
// closes the Clients that are no longer needed.
func (l *LockClients) For(terms leaseTerms) (*redislock.Client, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := l.now()
	l.reclaimLocked(now)
	if lc := l.clients[terms]; lc != nil {
		lc.lastUsed = now
		return lc.client, nil
	}
	c, err := redislock.New(l.rdb, redislock.Options{
		WatchdogLease: terms.lease,
		RenewInterval: terms.renew,
		// A grant is the pod's, not this process's: the next leader adopts
		// it (Close).
		KeepOnClose: true,
		Logger:      l.log.WithName("redislock"),
		Metrics:     l.metrics,
	})
	if err != nil {
		return nil, fmt.Errorf("lock client for lease %v, renewal every %v: %w", terms.lease, terms.renew, err)
	}
	l.clients[terms] = &lockClient{client: c, lastUsed: now}
	return c, nil
}

// track counts the hold, taken through the Client for the terms, until it
// ends: a Client is never closed under a live hold, whose renewals would
// stop.
func (l *LockClients) track(terms leaseTerms, hold *handle) {
	l.mu.Lock()
	lc := l.clients[terms]
	if lc != nil {
		lc.holds++
	}
	l.mu.Unlock()
	if lc == nil {
		return
	}
	context.AfterFunc(hold.Context(), func() {
		l.mu.Lock()
		lc.holds--
		lc.lastUsed = l.now()
		l.mu.Unlock()
	})
}

// reclaimLocked closes the Clients that hold nothing and have been idle for
// idleClientTTL.
func (l *LockClients) reclaimLocked(now time.Time) {
	for terms, lc := range l.clients {
		if lc.holds == 0 && now.Sub(lc.lastUsed) > idleClientTTL {
			_ = lc.client.Close()
			delete(l.clients, terms)
		}
	}
}

// Redis returns the underlying go-redis client, for the readiness probe.
func (l *LockClients) Redis() redis.UniversalClient { return l.rdb }

// Close closes every Client. Held locks are not released: a standby manager
// adopts them before their leases run out.
func (l *LockClients) Close() {
	l.mu.Lock()
	defer l.mu.Unlock()
	for terms, lc := range l.clients {
		_ = lc.client.Close()
		delete(l.clients, terms)
	}
}
