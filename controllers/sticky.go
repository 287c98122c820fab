package controllers

import (
	"context"
	"errors"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"

	locksv1 "github.com/lockwarden/lockwarden/api/v1alpha1"

	"github.com/lockwarden/lockwarden/controllers/decide"
	"github.com/lockwarden/lockwarden/pkg/redislock"
)

// keepGrants keeps a grant sticky: a pod the controller granted the key to
// keeps it until the pod stops. If Redis lost the key, it is taken again for
// the same pod; if somebody else took it, the locks report a conflict and
// nobody else is granted it.
func (r *DistributedLockReconciler) keepGrants(_ context.Context, s *scope) ([]action, error) {
	var out []action
	// A grant this process holds is lost if its lease ended, or if Redis no
	// longer shows it (the watchdog may not have noticed yet). Its pod keeps
	// the grant while it runs, and a namespace that may still use the key:
	// the memory stays, without a hold, so that the pod stays known
	// (knownHolders) even if the cache lacks it, until it stops or the key
	// is held for it again.
	g := r.grants.get(s.Key)
	switch {
	case g != nil && g.hold == nil:
		if p := s.ByUID[g.PodUID]; p == nil || decide.Stopped(p) {
			out = append(out, forgetGrant{pod: g.PodUID})
		}
	case g != nil:
		if h, held := s.HeldBy(g.PodUID); g.hold.Err() != nil || !held || !h.ByController() {
			p := s.ByUID[g.PodUID]
			out = append(out, lostGrant{grant: g, pod: p, keep: p != nil && !decide.Stopped(p) && s.MayHoldGrant(p)})
		}
	}
	pod := s.grantee
	switch {
	case pod == nil:
	case s.heldByController(pod):
		// Adopted, unless this process renews that very ownership already:
		// one it renews may have been lost (Redis restarted empty) and the
		// key taken again for the pod by another manager since, whose level
		// is then all that keeps it.
		if g == nil || g.PodUID != pod.UID || g.hold == nil || g.hold.Err() != nil || g.hold.Token() != s.info.Token {
			out = append(out, adopt{pod: pod})
		}
	case len(s.Holders) == 0:
		out = append(out, take{pod: pod, again: true})
	default:
		s.markConflict(pod)
	}
	return out, nil
}

// heldByController reports whether Redis holds the key for the pod under
// the controller's owner ID.
func (s *scope) heldByController(pod *corev1.Pod) bool {
	h, ok := s.HeldBy(pod.UID)
	return ok && h.ByController()
}

// markConflict shows that somebody else holds the key while the grantee
// has not stopped: nobody else is granted it, and the locks of its
// namespace that did not show the conflict announce it.
func (s *scope) markConflict(pod *corev1.Pod) {
	s.conflict = true
	for _, l := range append(s.LocksIn(pod.Namespace), s.DeletingIn(pod.Namespace)...) {
		if !meta.IsStatusConditionTrue(s.before[client.ObjectKeyFromObject(l)].Status.Conditions, locksv1.ConditionConflict) {
			s.announce(announcement{about: []*locksv1.DistributedLock{l}, object: l, eventType: corev1.EventTypeWarning, reason: "Conflict",
				message: fmt.Sprintf("Another owner holds %s in Redis, but pod %s was granted it and has not stopped; nobody else is granted the lock until it stops", s.Key, pod.Name)})
		}
	}
}

// wake queues a reconcile of the key.
func (r *DistributedLockReconciler) wake(key string) {
	select {
	case r.lost <- event.TypedGenericEvent[string]{Object: key}:
	case <-r.stopped:
	}
}

// redactLoss names the cause of a lost lease without Redis's own words.
func redactLoss(err error) string {
	switch {
	case errors.Is(err, redislock.ErrNotOwner):
		return "another owner holds it, or Redis lost it"
	case errors.Is(err, redislock.ErrLeaseLost):
		return "no renewal succeeded within the lease"
	}
	return "the lease ended"
}

// clientFor is the Client, and its lease terms, through which the key is
// held for the pod: those of the pod's policy lock (View.PolicyLock), or the
// API's defaults without one. A grant keeps its own lock's terms: another
// tenant's lock on a shared key cannot shorten it.
func (r *DistributedLockReconciler) clientFor(s *scope, pod *corev1.Pod) (leaseTerms, *redislock.Client, error) {
	terms := defaultTerms
	if l := s.PolicyLock(pod); l != nil {
		terms = termsOf(l)
	}
	c, err := r.Locks.For(terms)
	return terms, c, err
}
