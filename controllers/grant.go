package controllers

import (
	"context"
	"errors"
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"

	"github.com/lockwarden/lockwarden/controllers/decide"
	"github.com/lockwarden/lockwarden/pkg/redislock"
)

// grantNext gives the free key to the first eligible candidate, holding it
// in Redis under the owner ID "<pod UID>:0". Nothing is granted while a
// grant is out (sticky until its pod stops) or in conflict. The grant is
// recorded, and checked past the cache, before any gate is lifted with it
// (recordGrant).
func (r *DistributedLockReconciler) grantNext(ctx context.Context, s *scope) error {
	if len(s.Holders) > 0 || s.grantee != nil || s.conflict {
		return nil
	}
	for _, pod := range s.Candidates {
		why, err := r.whyWaits(ctx, s, pod)
		if err != nil {
			return err
		}
		if why != "" {
			continue
		}
		terms, c, err := r.clientFor(s, pod)
		if err != nil {
			return err
		}
		hold, err := acquire(ctx, c, s.Key, ownerFor(pod.UID))
		if errors.Is(err, redislock.ErrWaitTimeout) {
			return s.reread(ctx) // taken meanwhile
		}
		if err != nil {
			return err
		}
		r.remember(s, pod, terms, hold)
		s.Holders = []holder{{Owner: string(ownerFor(pod.UID)), PodUID: pod.UID, Pod: pod}}
		s.info.Token = hold.Token()
		s.grantee, s.taken, s.newGrant = pod, hold, true
		return nil
	}
	return nil
}

// whyWaits says why a candidate may not be granted the key now, or "" if
// it may. It must not be stopped or being deleted. An unguarded pod (no
// lock's gate) must be Running. A guarded pod waits behind its gates, and
// is granted only once lockwarden's gates are the only ones it has left
// (another controller's, such as Kueue's admission gate, may never be
// lifted, and the pod could not start meanwhile), and only if every lock
// whose gate it carries exists and could lift it (gateLocks): a
// misconfigured pod takes nothing. If it is gated by other locks too, it
// takes them in the order of their keys, so two pods guarded by the same
// locks never each hold one and wait for the other.
func (r *DistributedLockReconciler) whyWaits(ctx context.Context, s *scope, pod *corev1.Pod) (string, error) {
	if decide.Stopped(pod) || !pod.DeletionTimestamp.IsZero() {
		return stopping, nil
	}
	gates, foreign := decide.OurGates(pod)
	if len(foreign) > 0 {
		return fmt.Sprintf("behind another controller's scheduling gate %s: it is granted locks once lockwarden's gates are its only ones",
			strings.Join(foreign, ", ")), nil
	}
	if len(gates) == 0 {
		if pod.Status.Phase != corev1.PodRunning {
			return "not running", nil
		}
		return "", nil
	}
	locks, problems, err := s.gateLocksOf(ctx, r, pod)
	if err != nil {
		return "", err
	}
	if len(problems) > 0 {
		var messages []string
		for _, p := range problems {
			messages = append(messages, p.message)
		}
		return strings.Join(messages, "; "), nil
	}
	for _, l := range locks {
		if effectiveKey(l) < s.Key {
			return fmt.Sprintf("takes key %s of lock %s first", effectiveKey(l), l.Name), nil
		}
	}
	if !s.Guards(pod) {
		return "behind the gates of locks on other keys", nil
	}
	return "", nil
}

// stopping is why a pod that has stopped, or is being deleted, waits for
// nothing any more.
const stopping = "stopping"
