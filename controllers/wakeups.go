package controllers

import (
	"context"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"

	locksv1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/pkg/redislock"
)

// releaseChannelPattern matches the channels on which a lock's release is
// published, "redisson_lock__channel:{<name>}": Redisson's protocol, which
// the library, in-pod clients and Redisson applications all follow.
const releaseChannelPattern = "redisson_lock__channel:*"

// expiryPollCap bounds how long a lock held by someone the controller does
// not renew for goes unexamined. Releases arrive by pub/sub at once; this
// only catches a missed message (pub/sub delivers at most once).
const expiryPollCap = 30 * time.Second

// watchReleases wakes the locks naming a key whenever its release is
// published, so a lock freed outside the controller (an in-pod client, a
// Redisson application, another cluster, an operator) is granted again at
// once rather than at the next poll. It runs until ctx ends, resubscribing
// after a lost connection (go-redis does so itself).
func (r *DistributedLockReconciler) watchReleases(ctx context.Context) error {
	sub := r.Locks.Redis().PSubscribe(ctx, releaseChannelPattern)
	defer sub.Close()
	ch := sub.Channel()
	for {
		select {
		case <-ctx.Done():
			return nil
		case msg, ok := <-ch:
			if !ok {
				return nil
			}
			name := strings.TrimPrefix(msg.Channel, strings.TrimSuffix(releaseChannelPattern, "*"))
			name = strings.TrimSuffix(strings.TrimPrefix(name, "{"), "}")
			// A release of a key no lock names wakes nothing: every
			// Redisson lock's release is published here.
			if r.named(ctx, name) {
				log.FromContext(ctx).V(1).Info("lock released in Redis", "key", name)
				r.wake(name)
			}
		}
	}
}

// shardedReleases listens for the releases of single keys on a Redis
// Cluster with sharded pub/sub, where a release is SPUBLISHed to its lock's
// shard only and watchReleases' pattern subscription hears nothing. There
// the controller subscribes, with SSUBSCRIBE, to the release channel of each
// key somebody else holds: the only keys whose release it waits for.
type shardedReleases struct {
	rdb  *redis.ClusterClient
	wake func(key string)

	mu   sync.Mutex
	subs map[string]*redis.PubSub // by key
}

// newShardedReleases returns the per-key listener rdb needs, or nil when
// watchReleases hears every release.
func newShardedReleases(rdb redis.UniversalClient, wake func(string)) *shardedReleases {
	cc, ok := rdb.(*redis.ClusterClient)
	if !ok || !redislock.ShardedPubSub(rdb) {
		return nil
	}
	return &shardedReleases{rdb: cc, wake: wake, subs: map[string]*redis.PubSub{}}
}

// watch listens for the key's release, if it does not already. The
// subscription is made before watch returns, so a release published after
// the reconcile that asked for it is heard.
func (w *shardedReleases) watch(ctx context.Context, key string) {
	if w == nil {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.subs[key] != nil {
		return
	}
	channel := strings.TrimSuffix(releaseChannelPattern, "*") + "{" + key + "}"
	ps := w.rdb.SSubscribe(ctx)
	// The SSUBSCRIBE opens the connection, on the master of the channel's
	// slot, before anything receives on it (see redislock's subscriptions).
	if err := ps.SSubscribe(ctx, channel); err != nil {
		_ = ps.Close()
		log.FromContext(ctx).Error(err, "cannot listen for a key's release; it is polled", "key", key)
		return
	}
	w.subs[key] = ps
	go func() {
		for range ps.Channel() {
			w.wake(key)
		}
	}()
}

// unwatch stops listening for the key's release.
func (w *shardedReleases) unwatch(key string) {
	if w == nil {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if ps := w.subs[key]; ps != nil {
		_ = ps.Close()
		delete(w.subs, key)
	}
}

// close stops every subscription.
func (w *shardedReleases) close() {
	if w == nil {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	for key, ps := range w.subs {
		_ = ps.Close()
		delete(w.subs, key)
	}
}

// pollAfter is how soon to look again at a key someone other than the
// controller holds: when its lease runs out, for an expiry publishes
// nothing, and at most expiryPollCap.
func pollAfter(ttl time.Duration) time.Duration {
	if ttl <= 0 || ttl > expiryPollCap {
		return expiryPollCap
	}
	return ttl + 50*time.Millisecond
}

// named reports whether a lock names the key, as the cache shows, or this
// process holds it for a pod.
func (r *DistributedLockReconciler) named(ctx context.Context, key string) bool {
	if r.grants.get(key) != nil {
		return true
	}
	var locks locksv1.DistributedLockList
	if err := r.List(ctx, &locks, client.MatchingFields{keyIndex: key}, client.UnsafeDisableDeepCopy); err != nil {
		log.FromContext(ctx).Error(err, "cannot list the locks naming a released key; waking it", "key", key)
		return true
	}
	return len(locks.Items) > 0
}
