package redislock

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	mathrand "math/rand/v2"
	"strconv"
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
	// min(the lock's remaining lease, RetryFallback ± 20%). It also sets how
	// long a call whose reply was lost goes on resending its request to
	// learn what Redis did: five RetryFallbacks. Default: 1s.
	RetryFallback time.Duration
	// QueueTTL is how long a waiter keeps its place in a lock's wait queue,
	// and a lock handed to it, without being heard from: every retry
	// refreshes its place, so it must be above 1.2 × RetryFallback, and a
	// hand-over grants it at most this much lease, which it then extends.
	// A waiter that died while queued holds the lock up for at most about
	// twice its QueueTTL. It is the waiter's own: another client's QueueTTL
	// never shortens it. Default: 5 × RetryFallback.
	QueueTTL time.Duration

	// WaitReplicas, when above 0, makes Lock wait (Redis WAIT) until that
	// many replicas acknowledged the acquisition before reporting success,
	// like Redisson's synced-replica check. If fewer acknowledge within
	// WaitReplicasTimeout, the lock is released again and Lock fails with
	// ErrUnavailable, whether it took the lock at once or after waiting.
	// Default: 0, no wait.
	WaitReplicas int
	// WaitReplicasTimeout bounds the WAIT. Default: 1s.
	WaitReplicasTimeout time.Duration

	// KeepOnClose makes Close leave the locks the client holds in Redis, to
	// run out with their leases, instead of releasing them: for a process
	// whose locks another process of the same owners adopts, as lockwarden's
	// manager replicas pass the grants they hold for pods to the next
	// leader (a Lock for the same Owner re-enters, and keeps the token).
	// Like client-go's leader election without ReleaseOnCancel. Default:
	// false, Close releases.
	KeepOnClose bool

	// Metrics, if set, records lock metrics. See NewMetrics.
	Metrics *Metrics
	// Logger receives renewal failures and lost leases. Default: discard.
	Logger logr.Logger
}

func (o Options) withDefaults() (Options, error) {
	if o.ID == "" {
		o.ID = newUUID()
	}
	if strings.ContainsAny(o.ID, " \t\r\n") || strings.HasPrefix(o.ID, "~") {
		return o, fmt.Errorf("redislock: Options.ID %q must not contain whitespace or start with '~'", o.ID)
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
// loop for all the locks it holds, and its waiters share one pub/sub
// connection, or on a sharded Cluster one per shard. A Client is safe for
// concurrent use; Close it when done.
type Client struct {
	rdb  redis.UniversalClient
	opts Options
	pod  Pod // set by FromEnv
	// ownedRedis is the Redis client FromEnv opened, closed by Close.
	ownedRedis redis.UniversalClient

	// scripts are the scripts for rdb: classic or sharded pub/sub.
	scripts *scriptSet
	// resolveWindow is how long a call resends a request whose reply was
	// lost; lateAfter, how long a request may take before a copy of it
	// may arrive late; rememberFor, how long Redis keeps a finished call's
	// ticket for such copies (see request.go).
	resolveWindow, lateAfter, rememberFor time.Duration
	rememberArg                           any // rememberFor in ms, boxed once
	clientIDArg                           any // opts.ID, boxed once
	ownerPrefix                           string

	ownerSeq  atomic.Uint64
	ticketSeq atomic.Uint64
	closed    atomic.Bool
	done      chan struct{} // closed by Close
	// closing is cancelled by Close, for the Redis calls in progress.
	closing     context.Context
	stopClosing context.CancelFunc
	loops       sync.WaitGroup
	// calls is held shared by every Lock in progress, and exclusively by
	// Close, which so waits for them to finish: a waiter leaves the wait
	// queue before Close returns.
	calls sync.RWMutex

	mu    sync.Mutex
	held  map[holdKey]*ownership // every ownership this client holds
	waits *waiting
	// confirms are leases shortened by a hand-over, due for extension;
	// confirmNow tells the renewal loop.
	confirms   []*ownership
	confirmNow chan struct{}
}

// New returns a Client on rdb, which may be a standalone, Sentinel (failover)
// or Cluster client. The Client does not own rdb: Close does not close it.
// In a pod, FromEnv builds both from the environment. New fails if the Redis
// user lacks a command or channel the locks need (see MinimalACL); if Redis
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
	c := &Client{
		rdb:           rdb,
		opts:          opts,
		resolveWindow: 5 * opts.RetryFallback,
		lateAfter:     lateAfter(rdb),
		done:          make(chan struct{}),
		held:          make(map[holdKey]*ownership),
		confirmNow:    make(chan struct{}, 1),
		scripts:       classicScripts,
		clientIDArg:   opts.ID,
		ownerPrefix:   opts.ID + ":",
	}
	if sharded {
		c.scripts = shardedScripts
	}
	c.rememberFor = retryHorizon(rdb) + c.resolveWindow
	c.rememberArg = c.rememberFor.Milliseconds()
	if err := checkPermissions(rdb, c, sharded); err != nil {
		return nil, err
	}
	warnOfEviction(rdb, c)
	c.closing, c.stopClosing = context.WithCancel(context.Background())
	// Owner numbers start at a random point, so that two processes with
	// the same ID (two containers of one pod, or a restarted container whose
	// lease still runs) never share an owner ID and re-enter each other's
	// locks. They never start at 0, the controller's own suffix. Tickets
	// start at random too: calls of one owner from two clients must not
	// share one.
	c.ownerSeq.Store(mathrand.Uint64N(1 << 62))
	c.ticketSeq.Store(mathrand.Uint64())
	c.waits = newWaiting(c, sharded)
	c.loops.Add(1)
	go c.renewLoop()
	return c, nil
}

// ID returns the client's ID, the first part of the owner IDs it creates.
func (c *Client) ID() string { return c.opts.ID }

// Close releases the locks the client holds, the levels its own Locks took,
// in one pipelined round trip bounded by RetryFallback (unless
// Options.KeepOnClose), and ends their contexts with ErrClosed; a lock Redis
// could not be told about runs out with its lease. It stops the renewal loop and the subscriptions, and waits
// for them to exit. Waiting Locks leave the wait queue and return ErrClosed,
// and Close waits for every Lock in progress. A call's Redis command already
// sent is not interrupted (go-redis reads its reply until its read timeout,
// and retries): on a dead connection, Close takes up to go-redis's
// MaxRetries × ReadTimeout, 9 s with its defaults. Calls on a closed client
// return ErrClosed.
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

	c.releaseAll()
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

// Owner identifies who holds a lock: an owner ID "<id>:<n>". Locks of one
// owner re-enter each other; each Lock's Hold needs its Unlock.
type Owner string

// NewOwner returns an owner ID unique to this client: "<client ID>:<n>",
// with n never 0 and unique across processes that share the client ID.
func (c *Client) NewOwner() Owner {
	var buf [80]byte
	b := append(buf[:0], c.ownerPrefix...)
	return Owner(strconv.AppendUint(b, c.ownerSeq.Add(1), 10))
}

// newTicket returns the ID of a Lock call whose owner is not its own.
func (c *Client) newTicket() string {
	return strconv.FormatUint(c.ticketSeq.Add(1), 36)
}

// Validate reports whether o has the form "<id>:<n>" with no whitespace,
// and does not start with '~' (lockwarden's own fields in a lock's hash).
func (o Owner) Validate() error {
	s := string(o)
	i := strings.LastIndexByte(s, ':')
	if i <= 0 || i == len(s)-1 || strings.ContainsAny(s, " \t\r\n") || s[0] == '~' {
		return fmt.Errorf("%w: %q is not of the form <id>:<n>", ErrInvalidOwner, s)
	}
	return nil
}

// heldKey is the context key of WithHold.
type heldKey struct{}

// heldRef is a hold a context carries, and those it carried before.
type heldRef struct {
	hold *Hold
	next *heldRef
}

// WithHold returns a context that carries h, so that a Lock of h's lock made
// with it re-enters h's ownership at once, with its fencing token, on any
// goroutine and through any Mutex or Client of that lock, and returns a
// Hold of its own. Once h is unlocked, or its ownership has ended, such a
// Lock fails with ErrNotHeld: the context is no capability to take the
// lock anew. Locks of other names are unaffected: each acts for an owner of
// its own, unless the context carries a hold of that lock too. Calls that
// share a context share its holds: give goroutines that must exclude each
// other contexts without the hold.
func WithHold(ctx context.Context, h *Hold) context.Context {
	next, _ := ctx.Value(heldKey{}).(*heldRef)
	return context.WithValue(ctx, heldKey{}, &heldRef{hold: h, next: next})
}

// carriedHold returns the hold of lock name that ctx carries, or nil.
func carriedHold(ctx context.Context, name string) *Hold {
	for r, _ := ctx.Value(heldKey{}).(*heldRef); r != nil; r = r.next {
		if r.hold.Name() == name {
			return r.hold
		}
	}
	return nil
}

func newUUID() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails on supported platforms
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	h := hex.EncodeToString(b[:])
	return h[0:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:]
}
