package controllers

import (
	"context"
	"errors"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/log"

	locksv1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/pkg/redislock"
)

// granteeOf is the pod the controller granted the key to that has not
// stopped, if any: the one holding it in Redis, else the one this process
// granted it to, else the oldest pod whose marks record a grant (after a
// manager restart, or a lease lost with Redis's data). A pod of a namespace
// the key was un-shared from is found only in Redis, and only if its lock's
// status records that very grant: its marks, and a hold in Redis, are
// things its tenant can forge.
func (r *DistributedLockReconciler) granteeOf(s *scope) *corev1.Pod {
	var marked []*corev1.Pod
	for _, p := range s.pods {
		if !stopped(p) && s.granted(p) {
			marked = append(marked, p)
		}
	}
	for _, h := range s.holders {
		if h.pod != nil && h.byController() && !stopped(h.pod) && (len(s.locksIn(h.pod.Namespace)) > 0 || s.recordedGrant(h)) {
			return h.pod
		}
	}
	if g := r.grants.get(s.key); g != nil {
		if p := s.byUID[g.podUID]; p != nil && !stopped(p) && len(s.locksIn(p.Namespace)) > 0 {
			return p
		}
	}
	var oldest *corev1.Pod
	for _, p := range marked {
		if oldest == nil || p.CreationTimestamp.Before(&oldest.CreationTimestamp) {
			oldest = p
		}
	}
	return oldest
}

// recordedGrant reports whether a revoked lock's status records the hold as
// the grant it made while its namespace could still use the key: the same
// owner, with the same fencing token. A hold in Redis alone proves nothing,
// since a tenant with the Redis credentials can write one.
func (s *scope) recordedGrant(h holder) bool {
	for _, l := range s.revoked {
		st := l.Status.Holder
		if l.Namespace == h.pod.Namespace && st != nil && st.GrantedByController &&
			st.OwnerID == string(h.owner) && st.Token == s.info.Token {
			return true
		}
	}
	return false
}

// releaseStopped force-releases the holders whose pod has stopped or is
// gone, whether the controller granted them the key or they took it with
// an in-pod client. Holders that are no pod of the scope's namespaces
// (another namespace's, another cluster's, a plain client's) are left alone.
func (r *DistributedLockReconciler) releaseStopped(ctx context.Context, s *scope) error {
	var remaining []holder
	for _, h := range s.holders {
		name, namespace, why := r.releasable(s, h)
		if why == "" {
			remaining = append(remaining, h)
			continue
		}
		if _, err := s.client.ForceRelease(ctx, s.key, string(h.podUID)); err != nil {
			return err
		}
		r.grants.drop(s.key, h.podUID)
		if h.pod != nil {
			r.Metrics.observeRelease(time.Since(stopTime(h.pod)))
		}
		log.FromContext(ctx).Info("released the lock of a stopped pod", "key", s.key, "pod", name, "owner", h.owner)
		r.eventf(s, namespace, corev1.EventTypeNormal, "HolderTerminated", "Released %s: holder pod %s %s", s.key, name, why)
		for _, l := range s.locksIn(namespace) {
			r.Metrics.transition(l, "holder_terminated")
		}
	}
	s.holders = remaining
	return nil
}

// releasable says why the holder's hold may be released, or "" if not: its
// pod has stopped, or a pod this controller knew is gone. It knew the pod if
// it granted it the key, or a lock's status names it; loading the scope
// looked for such a pod past the cache (addKnownHolders), so one that is
// still not in the scope is gone.
func (r *DistributedLockReconciler) releasable(s *scope, h holder) (name, namespace, why string) {
	if h.pod != nil {
		if !stopped(h.pod) {
			return "", "", ""
		}
		why = "has stopped: every container terminated"
		if h.pod.Status.Phase == corev1.PodSucceeded || h.pod.Status.Phase == corev1.PodFailed {
			why = "reached phase " + string(h.pod.Status.Phase)
		}
		return h.pod.Name, h.pod.Namespace, why
	}
	for _, known := range r.knownHolders(s) {
		if known.uid == h.podUID {
			return known.Name, known.Namespace, "was deleted"
		}
	}
	return "", "", ""
}

// knownHolder is a pod the controller knows has held the key.
type knownHolder struct {
	types.NamespacedName
	uid types.UID
}

// knownHolders are the pods the controller knows have held the key: the one
// it granted the key to, and those the locks' statuses name (a status only
// ever names a pod of its lock's namespace).
func (r *DistributedLockReconciler) knownHolders(s *scope) []knownHolder {
	var out []knownHolder
	if g := r.grants.get(s.key); g != nil {
		out = append(out, knownHolder{types.NamespacedName{Namespace: g.pod.Namespace, Name: g.pod.Name}, g.podUID})
	}
	for _, l := range s.locks {
		if st := l.Status.Holder; st != nil && st.PodName != "" {
			out = append(out, knownHolder{types.NamespacedName{Namespace: l.Namespace, Name: st.PodName}, types.UID(st.PodUID)})
		}
	}
	return out
}

// addKnownHolders adds to the scope the known holders (knownHolders) of its
// namespaces that the cache did not yield. The cache can lack such a pod
// while it runs: --pod-label-selector filters it out once its label is
// taken away (the filtered watch reports it deleted), and just after a
// start the UID map (podNames) can lag the cache. A holder must never be
// released, or lose its sticky grant, on the cache's word alone, so such a
// pod is read from the API server. It is then unwatched: it keeps what it
// holds and was granted, is never a candidate, and since no event will say
// when it stops, the key is polled for it.
func (r *DistributedLockReconciler) addKnownHolders(ctx context.Context, s *scope) error {
	looked := map[types.UID]bool{}
	for _, known := range r.knownHolders(s) {
		if s.byUID[known.uid] != nil || !s.namespaces[known.Namespace] || looked[known.uid] {
			continue
		}
		looked[known.uid] = true
		pod, watched, err := r.podPastCache(ctx, known.NamespacedName, known.uid)
		if err != nil {
			return err
		}
		if pod == nil {
			continue
		}
		s.addPod(pod)
		if !watched {
			s.unwatched[pod.UID] = true
		}
	}
	return nil
}

// podPastCache is the pod with the name and UID from the cache, or else
// from the API server (watched is then false), or nil if it is gone.
func (r *DistributedLockReconciler) podPastCache(ctx context.Context, name types.NamespacedName, uid types.UID) (pod *corev1.Pod, watched bool, err error) {
	pod = &corev1.Pod{}
	switch err := r.Get(ctx, name, pod, client.UnsafeDisableDeepCopy); {
	case err == nil && pod.UID == uid:
		return pod, true, nil
	case err == nil:
		return nil, false, nil // the cache already has a newer pod of that name
	case !apierrors.IsNotFound(err):
		return nil, false, err
	}
	pod = &corev1.Pod{}
	if err := r.APIReader.Get(ctx, name, pod); apierrors.IsNotFound(err) || (err == nil && pod.UID != uid) {
		return nil, false, nil
	} else if err != nil {
		return nil, false, err
	}
	return pod, false, nil
}

// pollUnwatched asks for another look at the key while an unwatched pod of
// the scope runs, since no event will say when it stops, and tells once
// that it runs outside the pod cache.
func (r *DistributedLockReconciler) pollUnwatched(ctx context.Context, s *scope) {
	// Only this key's reconcile, one at a time, reads or writes its entry.
	before, _ := r.unwatchedWarned.Load(s.key)
	warned, _ := before.(map[types.UID]bool)
	now := map[types.UID]bool{}
	for _, p := range s.pods {
		if s.unwatched[p.UID] && !stopped(p) {
			s.requeue(pollAfter(s.info.TTL))
			now[p.UID] = true
			if !warned[p.UID] {
				r.warnUnwatched(ctx, s, p)
			}
		}
	}
	if len(now) > 0 {
		r.unwatchedWarned.Store(s.key, now)
	} else if warned != nil {
		r.unwatchedWarned.Delete(s.key)
	}
}

func (r *DistributedLockReconciler) warnUnwatched(ctx context.Context, s *scope, pod *corev1.Pod) {
	log.FromContext(ctx).Info("a holder's pod is not in the pod cache; polling the key for its stop", "key", s.key, "pod", pod.Name)
	r.eventf(s, pod.Namespace, corev1.EventTypeWarning, "HolderNotWatched",
		"Pod %s holds %s, or was granted it, but the manager does not watch it (does it lack the --pod-label-selector labels?): it keeps the lock until it stops, which is looked for once a lease rather than seen at once", pod.Name, s.key)
}

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
	if g := r.grants.get(s.key); g != nil && g.hold == nil {
		if p := s.byUID[g.podUID]; p == nil || stopped(p) {
			r.grants.drop(s.key, g.podUID)
		}
	} else if g != nil {
		h, held := s.heldBy(g.podUID)
		if g.hold.Err() != nil || !held || !h.byController() {
			r.grants.drop(s.key, g.podUID)
			if p := s.byUID[g.podUID]; p != nil && !released(g.hold) {
				// Not for a namespace that may no longer use the key, nor
				// for a pod whose own client holds it now.
				if _, heldItself := s.heldBy(g.podUID); !stopped(p) && len(s.locksIn(p.Namespace)) > 0 && !heldItself {
					r.grants.put(s.key, &grant{podUID: g.podUID, pod: g.pod})
				}
				cause := redislock.ErrNotOwner
				if err := g.hold.Err(); err != nil {
					cause = err
				}
				log.FromContext(ctx).Info("lost a lock held for a pod", "key", s.key, "pod", p.Name, "cause", cause.Error())
				r.eventf(s, p.Namespace, corev1.EventTypeWarning, "Lost", "Lost %s held for pod %s: %s", s.key, p.Name, redactLoss(cause))
				for _, l := range s.locksIn(p.Namespace) {
					r.Metrics.transition(l, "lost")
				}
			}
		}
	}
	pod := s.grantee
	if pod == nil {
		return nil
	}
	if h, ok := s.heldBy(pod.UID); ok && h.byController() {
		return r.adopt(ctx, s, pod)
	}
	if len(s.holders) == 0 {
		hold, err := acquire(ctx, s.client, s.key, ownerFor(pod.UID))
		switch {
		case err == nil:
			r.remember(s, pod, hold)
			s.holders = []holder{{owner: ownerFor(pod.UID), podUID: pod.UID, pod: pod}}
			s.info.Token = hold.Token()
			r.eventf(s, pod.Namespace, corev1.EventTypeNormal, "Reacquired",
				"Took %s again for pod %s, which was granted it and has not stopped, with fencing token %d", s.key, pod.Name, hold.Token())
			return nil
		case errors.Is(err, redislock.ErrWaitTimeout):
			if err := s.reread(ctx); err != nil {
				return err
			}
			if h, ok := s.heldBy(pod.UID); ok && h.byController() {
				return nil
			}
		default:
			return err
		}
	}
	s.conflict = true
	for _, l := range s.locksIn(pod.Namespace) {
		if !meta.IsStatusConditionTrue(s.before[client.ObjectKeyFromObject(l)].Status.Conditions, locksv1.ConditionConflict) {
			r.Recorder.Eventf(l, corev1.EventTypeWarning, "Conflict",
				"Another owner holds %s in Redis, but pod %s was granted it and has not stopped; nobody else is granted the lock until it stops", s.key, pod.Name)
		}
	}
	return nil
}

// adopt takes over the renewal of a grant made before the manager restarted
// (or by another manager replica), keeping its fencing token.
func (r *DistributedLockReconciler) adopt(ctx context.Context, s *scope, pod *corev1.Pod) error {
	if g := r.grants.get(s.key); g != nil && g.podUID == pod.UID && g.hold != nil && g.hold.Err() == nil {
		return nil
	}
	hold, err := acquire(ctx, s.client, s.key, ownerFor(pod.UID))
	if errors.Is(err, redislock.ErrWaitTimeout) {
		return nil // lost meanwhile; the next reconcile sees who holds it
	}
	if err != nil {
		return err
	}
	r.remember(s, pod, hold)
	log.FromContext(ctx).Info("adopted a lock held in Redis", "key", s.key, "pod", pod.Name, "token", hold.Token())
	return nil
}

// remember records a grant and arranges for its loss to wake the locks
// naming its key.
func (r *DistributedLockReconciler) remember(s *scope, pod *corev1.Pod, hold *handle) {
	r.grants.put(s.key, &grant{podUID: pod.UID, pod: client.ObjectKeyFromObject(pod), hold: hold})
	r.Locks.track(s.terms, hold)
	key := s.key
	context.AfterFunc(hold.Context(), func() {
		if !released(hold) {
			r.wake(key)
		}
	})
}

// wake queues a reconcile of the locks naming the key.
func (r *DistributedLockReconciler) wake(key string) {
	var list locksv1.DistributedLockList
	if err := r.List(context.Background(), &list, client.MatchingFields{keyIndex: key}); err != nil {
		return
	}
	for i := range list.Items {
		select {
		case r.lost <- event.GenericEvent{Object: &list.Items[i]}:
		case <-r.stopped:
			return
		}
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

// releaseGrantsOf releases, for a lock being deleted, the grants of its key
// to pods of its namespace that no other lock there selects, gates or
// marks, and removes its marks. In-pod clients' holds are the pods' own.
func (r *DistributedLockReconciler) releaseGrantsOf(ctx context.Context, s *scope, lock *locksv1.DistributedLock) error {
	remaining := s.locksIn(lock.Namespace)
	claimed := func(p *corev1.Pod) bool {
		for _, l := range remaining {
			if selects(l, p) || hasGate(p, locksv1.GateFor(l.Name)) || markedBy(p, l.Name) {
				return true
			}
		}
		return false
	}
	var unwatched []*corev1.Pod
	for _, h := range s.holders {
		if !h.byController() {
			continue
		}
		pod, err := r.podByUID(ctx, h.podUID)
		if err != nil {
			return err
		}
		if pod != nil && pod.Namespace != lock.Namespace {
			pod = nil
		}
		gone := false
		if st := lock.Status.Holder; pod == nil && st != nil && st.PodUID == string(h.podUID) {
			name := types.NamespacedName{Namespace: lock.Namespace, Name: st.PodName}
			var watched bool
			if pod, watched, err = r.podPastCache(ctx, name, h.podUID); err != nil {
				return err
			}
			gone = pod == nil
			if pod != nil && !watched {
				unwatched = append(unwatched, pod) // podsOf will not find it
			}
		}
		ours := pod != nil && !claimed(pod)
		if !ours && !gone {
			continue
		}
		if _, err := s.client.ForceRelease(ctx, s.key, string(h.podUID)); err != nil {
			return err
		}
		r.grants.drop(s.key, h.podUID)
		name := string(h.podUID)
		if pod != nil {
			name = pod.Name
		} else if lock.Status.Holder != nil {
			name = lock.Status.Holder.PodName
		}
		r.Recorder.Eventf(lock, corev1.EventTypeNormal, "Released", "Released %s from pod %s: the DistributedLock is being deleted", s.key, name)
		r.Metrics.transition(lock, "released")
	}
	// A grant lost while its pod runs (kept without a hold, see keepGrants)
	// ends with the lock too, unless a lock left claims the pod.
	if g := r.grants.get(s.key); g != nil && g.hold == nil && g.pod.Namespace == lock.Namespace {
		pod, watched, err := r.podPastCache(ctx, g.pod, g.podUID)
		if err != nil {
			return err
		}
		if pod == nil || !claimed(pod) {
			r.grants.drop(s.key, g.podUID)
		}
		if pod != nil && !watched && !slices.ContainsFunc(unwatched, func(p *corev1.Pod) bool { return p.UID == pod.UID }) {
			unwatched = append(unwatched, pod)
		}
	}
	marked, err := r.podsOf(ctx, lock)
	if err != nil {
		return err
	}
	for _, p := range append(marked, unwatched...) {
		if !carriesMarks(p, lock.Name) {
			continue
		}
		want := p.DeepCopy()
		clearMarks(want, lock.Name)
		if err := r.patchPod(ctx, p, want); err != nil {
			return err
		}
	}
	// The locks left on the key take over the marks of a grant they keep.
	go r.wake(s.key)
	return nil
}
