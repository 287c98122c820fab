package controllers

import (
	"context"
	"errors"
	"fmt"
	"slices"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/log"

	locksv1 "github.com/lockwarden/lockwarden/api/v1alpha1"

	"github.com/lockwarden/lockwarden/controllers/decide"
	"github.com/lockwarden/lockwarden/pkg/redislock"
)

// keepGrants keeps a grant sticky: a pod the controller granted the key to
// keeps it until the pod stops. If Redis lost the key, it is taken again for
// the same pod; if somebody else took it, the locks report a conflict and
// nobody else is granted it.
func (r *DistributedLockReconciler) keepGrants(ctx context.Context, s *scope) error {
	// A grant this process holds is lost if its lease ended, or if Redis no
	// longer shows it (the watchdog may not have noticed yet). Its pod keeps
	// the grant while it runs: the record stays, without a hold, so that the
	// pod stays known (knownHolders) even if the cache lacks it, until it
	// stops or the key is held for it again.
	if g := r.grants.get(s.Key); g != nil && g.hold == nil {
		if p := s.ByUID[g.PodUID]; p == nil || decide.Stopped(p) {
			r.grants.drop(s.Key, g.PodUID)
		}
	} else if g != nil {
		h, held := s.HeldBy(g.PodUID)
		if g.hold.Err() != nil || !held || !h.ByController() {
			r.grants.drop(s.Key, g.PodUID)
			if p := s.ByUID[g.PodUID]; p != nil && !released(g.hold) {
				// Not for a namespace that may no longer use the key.
				if !decide.Stopped(p) && s.MayHoldGrant(p) {
					r.grants.put(s.Key, &grant{PodUID: g.PodUID, Pod: g.Pod})
				}
				cause := redislock.ErrNotOwner
				if err := g.hold.Err(); err != nil {
					cause = err
				}
				log.FromContext(ctx).Info("lost a lock held for a pod", "key", s.Key, "pod", p.Name, "cause", cause.Error())
				r.eventf(s, p.Namespace, corev1.EventTypeWarning, "Lost", "Lost %s held for pod %s: %s", s.Key, p.Name, redactLoss(cause))
				for _, l := range s.LocksIn(p.Namespace) {
					r.Metrics.transition(l, "lost")
				}
			}
		}
	}
	pod := s.grantee
	if pod == nil {
		return nil
	}
	if h, ok := s.HeldBy(pod.UID); ok && h.ByController() {
		return r.adopt(ctx, s, pod)
	}
	if len(s.Holders) == 0 {
		terms, c, err := r.clientFor(s, pod)
		if err != nil {
			return err
		}
		hold, err := acquire(ctx, c, s.Key, ownerFor(pod.UID))
		switch {
		case err == nil:
			r.remember(s, pod, terms, hold)
			s.Holders = []holder{{Owner: string(ownerFor(pod.UID)), PodUID: pod.UID, Pod: pod}}
			s.info.Token, s.taken = hold.Token(), hold
			r.eventf(s, pod.Namespace, corev1.EventTypeNormal, "Reacquired",
				"Took %s again for pod %s, which was granted it and has not stopped, with fencing token %d", s.Key, pod.Name, hold.Token())
			return nil
		case errors.Is(err, redislock.ErrWaitTimeout):
			if err := s.reread(ctx); err != nil {
				return err
			}
			if h, ok := s.HeldBy(pod.UID); ok && h.ByController() {
				return nil
			}
		default:
			return err
		}
	}
	s.conflict = true
	for _, l := range append(s.LocksIn(pod.Namespace), s.DeletingIn(pod.Namespace)...) {
		if !meta.IsStatusConditionTrue(s.before[client.ObjectKeyFromObject(l)].Status.Conditions, locksv1.ConditionConflict) {
			s.announce(announcement{about: []*locksv1.DistributedLock{l}, object: l, eventType: corev1.EventTypeWarning, reason: "Conflict",
				message: fmt.Sprintf("Another owner holds %s in Redis, but pod %s was granted it and has not stopped; nobody else is granted the lock until it stops", s.Key, pod.Name)})
		}
	}
	return nil
}

// adopt takes over the renewal of a grant made before the manager restarted
// (or by another manager replica), keeping its fencing token. It re-enters
// the ownership Redis shows unless this process renews that one already:
// one it renews may have been lost (Redis restarted empty) and the key taken
// again for the pod by another manager since, whose level is then all that
// keeps it. The level it adds is given back (giveBack) if the check past the
// cache finds another grant of the key out. A grant held under
// other lease terms (the lock's leaseDuration changed since) cannot be
// re-entered under the lock's: the library refuses it, so as not to cut
// another holder's lease. Nobody else renews the controller's grants, so it
// takes the key again for the pod under the lock's terms, with a new token.
func (r *DistributedLockReconciler) adopt(ctx context.Context, s *scope, pod *corev1.Pod) error {
	if g := r.grants.get(s.Key); g != nil && g.PodUID == pod.UID && g.hold != nil && g.hold.Err() == nil && g.hold.Token() == s.info.Token {
		return nil
	}
	terms, c, err := r.clientFor(s, pod)
	if err != nil {
		return err
	}
	hold, err := acquire(ctx, c, s.Key, ownerFor(pod.UID))
	retaken := false
	if errors.Is(err, redislock.ErrLeaseMismatch) {
		// Only the ownership the scope saw: one taken since is re-entered.
		n, releaseErr := s.client.ForceReleaseOwnership(ctx, s.Key, string(pod.UID), s.info.Token)
		if releaseErr != nil {
			return releaseErr
		}
		hold, err = acquire(ctx, c, s.Key, ownerFor(pod.UID))
		retaken = n > 0
	}
	if errors.Is(err, redislock.ErrWaitTimeout) {
		// Lost meanwhile, and somebody else holds the key: what the scope
		// read of Redis is over, and nothing may be lifted with it.
		return s.reread(ctx)
	}
	if err != nil {
		return err
	}
	r.remember(s, pod, terms, hold)
	// The token is the ownership's, which may be newer than the one the
	// scope read.
	s.info.Token = hold.Token()
	if retaken {
		s.taken = hold
		r.eventf(s, pod.Namespace, corev1.EventTypeNormal, "Reacquired",
			"Took %s again for pod %s under the lock's new lease terms, with fencing token %d", s.Key, pod.Name, hold.Token())
		return nil
	}
	s.adopted = hold
	log.FromContext(ctx).Info("adopted a lock held in Redis", "key", s.Key, "pod", pod.Name, "token", hold.Token())
	return nil
}

// remember records a grant and arranges for its loss to wake the locks
// naming its key.
func (r *DistributedLockReconciler) remember(s *scope, pod *corev1.Pod, terms leaseTerms, hold *handle) {
	r.grants.put(s.Key, &grant{PodUID: pod.UID, Pod: client.ObjectKeyFromObject(pod), hold: hold})
	r.Locks.track(terms, hold)
	key := s.Key
	context.AfterFunc(hold.Context(), func() {
		if !released(hold) {
			r.wake(key)
		}
	})
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
// held for the pod: those of the pod's policy lock (policyLock), or the
// API's defaults without one. A grant keeps its own lock's terms: another
// tenant's lock on a shared key cannot shorten it.
func (r *DistributedLockReconciler) clientFor(s *scope, pod *corev1.Pod) (leaseTerms, *redislock.Client, error) {
	terms := defaultTerms
	if l := s.policyLock(pod); l != nil {
		terms = termsOf(l)
	}
	c, err := r.Locks.For(terms)
	return terms, c, err
}

// policyLock is the lock whose per-lock policy (lease terms, start timeout,
// eviction) applies to the pod's grant of the key: the first by name of its
// namespace's locks that records lifting its gate from the pod, else gates
// it, else selects it, else marked it; nil if none does. Another lock of
// the namespace naming the same key, which neither gates nor selects the
// pod, never sets its policy.
func (s *scope) policyLock(pod *corev1.Pod) *locksv1.DistributedLock {
	locks := append(append(s.LocksIn(pod.Namespace), s.DeletingIn(pod.Namespace)...), decide.InNamespace(s.Revoked, pod.Namespace)...)
	for _, claims := range []func(*locksv1.DistributedLock) bool{
		func(l *locksv1.DistributedLock) bool {
			st := l.Status.Grant
			return st != nil && st.GateLifted && st.PodUID == string(pod.UID)
		},
		func(l *locksv1.DistributedLock) bool { return decide.HasGate(pod, locksv1.GateFor(l.Name)) },
		func(l *locksv1.DistributedLock) bool { return selects(l, pod) },
		func(l *locksv1.DistributedLock) bool { return decide.MarkedBy(pod, l.Name) },
	} {
		if i := slices.IndexFunc(locks, claims); i >= 0 {
			return locks[i]
		}
	}
	return nil
}
