package controllers

import (
	"context"
	"strings"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/log"
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
			log.FromContext(ctx).V(1).Info("lock released in Redis", "key", name)
			r.wake(name)
		}
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
