package redislock

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	mathrand "math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	"github.com/redis/go-redis/v9"
)

// Options configure a Client. The zero value is ready to use; every field
// documents its default.
type Options struct {
	// ID identifies the client in owner IDs, "<ID>:<n>". Default: a random
	// UUID. In a pod, use the pod UID so the controller can map holders to
	// pods (FromEnv does this).
	ID string

	// WatchdogLease is the lease of locks taken without an explicit lease.
	// The watchdog renews it until Unlock. A whole number of milliseconds,
	// at least MinLease. Default: 30s, as in Redisson.
	WatchdogLease time.Duration
	// RenewInterval is how often the watchdog renews. Default: WatchdogLease/3.
	RenewInterval time.Duration
	// RenewBatchSize is how many renewals go to Redis in one pipelined round
	// trip. Default: 100.
	RenewBatchSize int
	// SafetyMargin is subtracted from a lease when computing the local
	// deadline after which a holder can no longer vouch for its ownership:
	// the send time of the last successful acquire or renewal, plus the
	// lease, minus this margin. It covers clock drift between the client and
	// Redis. Default: a tenth of the lease.
	SafetyMargin time.Duration

	// RetryFallback bounds how long a waiter sleeps when it hears nothing,
	// in case a release message was missed. A waiter retries after
	// min(the lock's remaining lease, RetryFallback ± 20%). Default: 1s.
	RetryFallback time.Duration
	// QueueTTL is how long a waiter's place in the wait queue lasts without
	// being refreshed; every retry refreshes it, so it must be above
	// 1.2 × RetryFallback. It is also the longest lease an Unlock by this
	// client grants when it hands the lock to the next waiter, who then
	// extends it. Together they bound how long a crashed waiter can hold up
	// the lock: about twice QueueTTL. It also bounds how long a call whose
	// reply was lost goes on resending its request to learn what Redis did.
	// Default: 5 × RetryFallback.
	QueueTTL time.Duration

	// WaitReplicas, when above 0, makes Lock wait (Redis WAIT) until that
	// many replicas acknowledged the acquisition before reporting success,
	// like Redisson's synced-replica check. If fewer acknowledge within
	// WaitReplicasTimeout, the lock is released again and Lock fails with
	// ErrUnavailable. Default: 0, no wait.
	WaitReplicas int
	// WaitReplicasTimeout bounds the WAIT. Default: 1s.
	WaitReplicasTimeout time.Duration

	// Metrics, if set, records lock metrics. See NewMetrics.
	Metrics *Metrics
	// Logger receives renewal failures and lost leases. Default: discard.
	Logger logr.Logger
}

func (o Options) withDefaults() (Options, error) {
	if o.ID == "" {
		o.ID = newUUID()
	}
	if strings.ContainsAny(o.ID, " \t\r\n") {
		return o, fmt.Errorf("redislock: Options.ID %q must not contain whitespace", o.ID)
	}
	if o.WatchdogLease == 0 {
		o.WatchdogLease = 30 * time.Second
	}
	if o.RenewInterval == 0 {
		o.RenewInterval = o.WatchdogLease / 3
	}
	if o.RenewBatchSize == 0 {
		o.RenewBatchSize = 100
	}
	if o.RetryFallback == 0 {
		o.RetryFallback = time.Second
	}
	if o.QueueTTL == 0 {
		o.QueueTTL = 5 * o.RetryFallback
	}
	if o.WaitReplicasTimeout == 0 {
		o.WaitReplicasTimeout = time.Second
	}
	if err := validateLease("Options.WatchdogLease", o.WatchdogLease); err != nil {
		return o, err
	}
	switch {
	case o.RenewInterval <= 0 || o.RenewInterval >= o.WatchdogLease:
		return o, fmt.Errorf("redislock: Options.RenewInterval %v must be above 0 and below WatchdogLease %v", o.RenewInterval, o.WatchdogLease)
	case o.SafetyMargin < 0 || o.SafetyMargin >= o.WatchdogLease:
		return o, fmt.Errorf("redislock: Options.SafetyMargin %v must be at least 0 and below WatchdogLease %v", o.SafetyMargin, o.WatchdogLease)
	case o.RenewBatchSize < 0, o.RetryFallback < 0, o.QueueTTL < 0, o.WaitReplicas < 0, o.WaitReplicasTimeout < 0:
		return o, errors.New("redislock: Options fields must not be negative")
	case o.QueueTTL <= o.RetryFallback*6/5:
		return o, fmt.Errorf("redislock: Options.QueueTTL %v must be above 1.2 × RetryFallback (%v), or a waiter's place lapses between its retries", o.QueueTTL, o.RetryFallback*6/5)
	}
	if o.Logger.GetSink() == nil {
		o.Logger = logr.Discard()
	}
	return o, nil
}

// margin is the safety margin for a lease of the given length.
func (o *Options) margin(lease time.Duration) time.Duration {
	if o.SafetyMargin > 0 && o.SafetyMargin < lease {
		return o.SafetyMargin
	}
	return lease / 10
}

// Client takes and holds locks on one Redis deployment. It runs one renewal
// loop for all the locks it holds and one pub/sub subscription for all its
// waiters. A Client is safe for concurrent use; Close it when done.
type Client struct {
	rdb  redis.UniversalClient
	opts Options
	pod  Pod // set by FromEnv
	// ownedRedis is the Redis client FromEnv opened, closed by Close.
	ownedRedis redis.UniversalClient

	// scripts are the scripts for rdb: classic or sharded pub/sub.
	scripts *scriptSet
	// latchTTL is how long Redis keeps a request's result (see request.go);
	// resolveWindow is how long a call resends a request whose reply was
	// lost.
	latchTTL      time.Duration
	resolveWindow time.Duration

	ownerSeq atomic.Uint64
	closed   atomic.Bool
	done     chan struct{} // closed by Close
	// closing is cancelled by Close, for the Redis calls in progress.
	closing     context.Context
	stopClosing context.CancelFunc
	loops       sync.WaitGroup
	// calls is held shared by every Lock and Unlock in progress, and
	// exclusively by Close, which so waits for them to finish: a waiter
	// leaves the wait queue before Close returns.
	calls sync.RWMutex

	mu    sync.Mutex
	held  map[holdKey]*ownership // every ownership this client holds
	waits *waiting
	// confirms are leases shortened by a hand-over, due for extension;
	// confirmNow tells the renewal loop.
	confirms   []*ownership
	confirmNow chan struct{}

	// renewing is held by the renewal loop while a batch is in flight, so a
	// final Unlock can wait for it and no renewal follows a release.
	renewing sync.RWMutex
}

// New returns a Client on rdb, which may be a standalone, Sentinel (failover)
// or Cluster client. The Client does not own rdb: Close does not close it.
// In a pod, FromEnv builds both from the environment. New fails if the Redis
// user lacks a permission the locks need (see checkPermissions); if Redis
// cannot be reached yet, it succeeds, and calls fail until it can.
func New(rdb redis.UniversalClient, opts Options) (*Client, error) {
	if rdb == nil {
		return nil, errors.New("redislock: New needs a redis client")
	}
	opts, err := opts.withDefaults()
	if err != nil {
		return nil, err
	}
	sharded := ShardedPubSub(rdb)
	if err := checkPermissions(rdb, opts.ID, sharded); err != nil {
		return nil, err
	}
	c := &Client{
		rdb:           rdb,
		opts:          opts,
		resolveWindow: opts.QueueTTL,
		latchTTL:      latchTTL(rdb, opts.QueueTTL),
		done:          make(chan struct{}),
		held:          make(map[holdKey]*ownership),
		confirmNow:    make(chan struct{}, 1),
		scripts:       classicScripts,
	}
	if sharded {
		c.scripts = shardedScripts
	}
	c.closing, c.stopClosing = context.WithCancel(context.Background())
	// Owner numbers start at a random point, so that two processes with
	// the same ID (two containers of one pod, or a restarted container whose
	// lease still runs) never share an owner ID and re-enter each other's
	// locks. They never start at 0, the controller's own suffix.
	c.ownerSeq.Store(mathrand.Uint64N(1 << 62))
	c.waits = newWaiting(c, sharded)
	c.loops.Add(1)
	go c.renewLoop()
	return c, nil
}

// ID returns the client's ID, the first part of the owner IDs it creates.
func (c *Client) ID() string { return c.opts.ID }

// Close stops the renewal loop and the subscription, and waits for them to
// exit. Waiting Locks leave the wait queue and return ErrClosed, and Close
// waits for every call in progress. A call's Redis command already sent is
// not interrupted (go-redis reads its reply until its read timeout, and
// retries): on a dead connection, Close takes up to go-redis's MaxRetries ×
// ReadTimeout, 9 s with its defaults. Locks still held are not released:
// their leases run out, and their contexts are cancelled with ErrClosed.
// Calls on a closed client return ErrClosed.
func (c *Client) Close() error {
	if !c.closed.CompareAndSwap(false, true) {
		return nil
	}
	close(c.done)
	c.stopClosing()
	c.waits.close()
	// Wait for the calls in progress: waiters wake on done and leave.
	c.calls.Lock()
	c.calls.Unlock()
	c.loops.Wait()

	c.mu.Lock()
	owned := make([]*ownership, 0, len(c.held))
	for _, o := range c.held {
		owned = append(owned, o)
	}
	c.mu.Unlock()
	for _, o := range owned {
		c.end(o, ErrClosed)
	}
	if c.ownedRedis != nil {
		return c.ownedRedis.Close()
	}
	return nil
}

func (c *Client) checkOpen() error {
	if c.closed.Load() {
		return ErrClosed
	}
	return nil
}

// beginCall registers a call that Close must wait for, unless the client is
// closed; endCall ends it.
func (c *Client) beginCall() error {
	c.calls.RLock()
	if c.closed.Load() {
		c.calls.RUnlock()
		return ErrClosed
	}
	return nil
}

func (c *Client) endCall() { c.calls.RUnlock() }

// untilClosed returns ctx, also cancelled when the Client closes.
func (c *Client) untilClosed(ctx context.Context) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(ctx)
	stop := context.AfterFunc(c.closing, cancel)
	return ctx, func() {
		stop()
		cancel()
	}
}

// Owner identifies who holds a lock: an owner ID "<id>:<n>". A Lock whose
// context carries the owner of a lock re-enters it; each Lock's Hold needs
// its Unlock.
type Owner string

// NewOwner returns an owner ID unique to this client: "<client ID>:<n>",
// with n never 0 and unique across processes that share the client ID.
func (c *Client) NewOwner() Owner {
	return Owner(fmt.Sprintf("%s:%d", c.opts.ID, c.ownerSeq.Add(1)))
}

// Validate reports whether o has the form "<id>:<n>" with no whitespace.
func (o Owner) Validate() error {
	s := string(o)
	i := strings.LastIndexByte(s, ':')
	if i <= 0 || i == len(s)-1 || strings.ContainsAny(s, " \t\r\n") {
		return fmt.Errorf("%w: %q is not of the form <id>:<n>", ErrInvalidOwner, s)
	}
	return nil
}

type ownerKey struct{}

// WithOwner returns a context that carries owner. A Lock made with it acts
// for that owner, so code that passes the context along re-enters a lock its
// caller holds (WithOwner(ctx, hold.Owner())), on any goroutine. Calls that
// share an owner share its hold: give goroutines that must exclude each
// other no owner, or owners of their own.
func WithOwner(ctx context.Context, owner Owner) context.Context {
	return context.WithValue(ctx, ownerKey{}, owner)
}

// OwnerFromContext returns the owner carried by ctx, if any.
func OwnerFromContext(ctx context.Context) (Owner, bool) {
	o, ok := ctx.Value(ownerKey{}).(Owner)
	return o, ok
}

func newUUID() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails on supported platforms
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	h := hex.EncodeToString(b[:])
	return h[0:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:]
}
