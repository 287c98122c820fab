package controllers

import (
	"context"
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"

	"github.com/lockwarden/lockwarden/controllers/decide"
)

// grantNext decides to give the free key to the first eligible candidate,
// holding it in Redis under the owner ID "<pod UID>:0" (take). Nothing is
// granted while a grant is out (sticky until its pod stops) or in
// conflict. The grant is recorded, and checked past the cache, before any
// gate is lifted with it (recordGrant).
func (r *DistributedLockReconciler) grantNext(ctx context.Context, s *scope) ([]action, error) {
	if len(s.Holders) > 0 || s.grantee != nil || s.conflict {
		return nil, nil
	}
	for _, pod := range s.Candidates {
		why, err := r.whyWaits(ctx, s, pod)
		if err != nil {
			return nil, err
		}
		if why == "" {
			return []action{take{pod: pod}}, nil
		}
	}
	return nil, nil
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
