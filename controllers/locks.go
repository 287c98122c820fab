package controllers

import (
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
// pub/sub connection.
type LockClients struct {
	rdb     redis.UniversalClient
	log     logr.Logger
	metrics *redislock.Metrics

	mu      sync.Mutex
	clients map[leaseTerms]*redislock.Client
}

// NewLockClients returns LockClients on rdb, recording library metrics in
// metrics (which may be nil). Close them when done.
func NewLockClients(rdb redis.UniversalClient, log logr.Logger, metrics *redislock.Metrics) *LockClients {
	return &LockClients{rdb: rdb, log: log, metrics: metrics, clients: map[leaseTerms]*redislock.Client{}}
}

// For returns the Client for the terms, creating it on first use.
func (l *LockClients) For(terms leaseTerms) (*redislock.Client, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if c := l.clients[terms]; c != nil {
		return c, nil
	}
	c, err := redislock.New(l.rdb, redislock.Options{
		WatchdogLease: terms.lease,
		RenewInterval: terms.renew,
		Logger:        l.log.WithName("redislock"),
		Metrics:       l.metrics,
	})
	if err != nil {
		return nil, fmt.Errorf("lock client for lease %v, renewal every %v: %w", terms.lease, terms.renew, err)
	}
	l.clients[terms] = c
	return c, nil
}

// Redis returns the underlying go-redis client, for the readiness probe.
func (l *LockClients) Redis() redis.UniversalClient { return l.rdb }

// Close closes every Client. Held locks are not released: a standby manager
// adopts them before their leases run out.
func (l *LockClients) Close() {
	l.mu.Lock()
	defer l.mu.Unlock()
	for terms, c := range l.clients {
		_ = c.Close()
		delete(l.clients, terms)
	}
}
