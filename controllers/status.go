package controllers

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/controllers/decide"
)

// computeStatuses sets each lock's status from the scope, on every exit of
// a reconcile that read Redis (redisFailed shows the others). A lock only
// ever shows pods of its own namespace: a holder elsewhere is reported as
// such, unnamed. Its Ready condition says, first, that the key holds data
// that is not a lock (KeyInUse); else why a phase failed (failure); else
// why the key is not usable though Redis answered (notReady).
func (r *DistributedLockReconciler) computeStatuses(ctx context.Context, s *scope) {
	s.described = true
	holderPod := s.HolderPod()
	waiting, blocked := r.waiting(ctx, s)
	r.tellWaiting(ctx, s, waiting, blocked)
	s.announceFailure()
	r.tellUnguarded(s)
	queued := s.queued()
	for _, l := range s.Locks {
		st := &l.Status
		st.Key = s.Key
		switch {
		case s.notALock:
			setCondition(l, locksv1.ConditionReady, metav1.ConditionFalse, keyInUse.reason, keyInUse.message)
		case s.failed != nil:
			setCondition(l, locksv1.ConditionReady, metav1.ConditionFalse, s.failed.reason, s.failed.messageFor(l.Namespace))
		case s.notReady != nil:
			setCondition(l, locksv1.ConditionReady, metav1.ConditionFalse, s.notReady.reason, s.notReady.message)
		default:
			r.showReachable(s, l)
		}
		switch {
		case s.notALock:
			st.Holder = nil
			for _, c := range []string{locksv1.ConditionHeld, locksv1.ConditionConflict, locksv1.ConditionHolderStarted} {
				meta.RemoveStatusCondition(&l.Status.Conditions, c)
			}
		case len(s.Holders) == 0:
			st.Holder = nil
			setCondition(l, locksv1.ConditionHeld, metav1.ConditionFalse, "Free", "Nobody holds the lock")
		case holderPod != nil && holderPod.Namespace == l.Namespace:
			st.Holder = s.holderStatus(st.Holder)
			setCondition(l, locksv1.ConditionHeld, metav1.ConditionTrue, "Held", "Held by pod "+holderPod.Name)
		default:
			st.Holder = nil
			setCondition(l, locksv1.ConditionHeld, metav1.ConditionTrue, "HeldElsewhere", "Held by an owner outside this namespace")
		}
		switch {
		case s.notALock:
		case s.conflict && s.grantee.Namespace == l.Namespace:
			setCondition(l, locksv1.ConditionConflict, metav1.ConditionTrue, "HeldByAnother",
				"Another owner holds the key in Redis, but pod "+s.grantee.Name+" was granted it and has not stopped; nobody else is granted the lock until it stops")
		case s.conflict:
			setCondition(l, locksv1.ConditionConflict, metav1.ConditionTrue, "HeldByAnother",
				"Another owner holds the key in Redis while a pod granted it has not stopped; nobody else is granted the lock until it stops")
		default:
			setCondition(l, locksv1.ConditionConflict, metav1.ConditionFalse, "NoConflict", "The holder in Redis is the pod granted the lock, or nobody")
		}
		st.Waiting, st.Blocked = nil, nil
		lockWaiting := waiting
		if !decide.GrantsFor(l) {
			lockWaiting = queued
		}
		for _, p := range lockWaiting {
			if p.Namespace == l.Namespace {
				st.Waiting = append(st.Waiting, p.Name)
			}
		}
		for p, why := range blocked {
			if p.Namespace == l.Namespace && decide.HasGate(p, locksv1.GateFor(l.Name)) {
				st.Blocked = append(st.Blocked, locksv1.BlockedPod{PodName: p.Name, Reason: why})
			}
		}
		slices.SortFunc(st.Blocked, func(a, b locksv1.BlockedPod) int { return strings.Compare(a.PodName, b.PodName) })
		// A lock's status stays small whatever the queue: the lists show
		// the first ones, the count all.
		st.WaitingCount = int32(len(st.Waiting) + len(st.Blocked))
		st.Waiting, st.Blocked = st.Waiting[:min(len(st.Waiting), maxListed)], st.Blocked[:min(len(st.Blocked), maxListed)]
		r.Metrics.record(l, len(s.Holders) > 0, int(st.WaitingCount))
	}
	for _, l := range s.Revoked {
		r.revokedStatus(s, l)
	}
}

// showReachable sets the Ready condition of a lock whose key Redis answered
// for: RedisReachable, or, for stallShown after Redis stalled, RedisSlow
// with the stall's longest call, announced with a Warning Event as the
// lock turns so.
func (r *DistributedLockReconciler) showReachable(s *scope, l *locksv1.DistributedLock) {
	took, at, left := r.Locks.stalls.latest()
	if left <= 0 {
		setCondition(l, locksv1.ConditionReady, metav1.ConditionTrue, "RedisReachable", "Redis answered, and the key is this namespace's to use")
		return
	}
	msg := fmt.Sprintf("Redis answered, but it stalled: a call of the manager's took %s, ending at %s; a hold is lost when no renewal succeeds within its lease (%s for this lock)",
		took.Round(100*time.Millisecond), at.UTC().Format(time.RFC3339), shortDuration(termsOf(l).lease))
	if was := meta.FindStatusCondition(s.before[client.ObjectKeyFromObject(l)].Status.Conditions, locksv1.ConditionReady); was == nil || was.Reason != "RedisSlow" {
		s.announce(announcement{about: []*locksv1.DistributedLock{l}, object: l, eventType: corev1.EventTypeWarning, reason: "RedisSlow", message: msg})
	}
	setCondition(l, locksv1.ConditionReady, metav1.ConditionTrue, "RedisSlow", msg)
	s.requeue(left)
}

// maxListed is how many pods status.waiting and status.blocked list at most.
const maxListed = 100

// holderStatus shows the key's holder, keeping the since-time of the same
// ownership.
func (s *scope) holderStatus(was *locksv1.LockHolder) *locksv1.LockHolder {
	h := s.Holders[0]
	next := &locksv1.LockHolder{PodName: h.Pod.Name, PodUID: string(h.PodUID), OwnerID: h.Owner,
		GrantedByController: h.ByController(), Token: s.info.Token, Since: metav1.Now()}
	if was != nil && was.OwnerID == next.OwnerID && was.Token == next.Token {
		next.Since = was.Since
	}
	return next
}

// revokedStatus shows that the lock's namespace may not use its key, and
// nothing of the key. A grant the lock made while it could stays recorded
// (status.grant), and kept, until its pod stops (recordedGrantee).
func (r *DistributedLockReconciler) revokedStatus(s *scope, l *locksv1.DistributedLock) {
	st := &l.Status
	st.Key = s.Key
	st.Holder, st.Waiting, st.Blocked, st.WaitingCount = nil, nil, nil, 0
	setCondition(l, locksv1.ConditionReady, metav1.ConditionFalse, "KeyNotPermitted", fmt.Sprintf(
		"spec.key %q is outside this namespace's keys (%s/...); use one of those, or ask the cluster administrator to share the key with this namespace (the manager's --shared-key flag)", s.Key, l.Namespace))
	for _, c := range []string{locksv1.ConditionHeld, locksv1.ConditionConflict, locksv1.ConditionHolderStarted} {
		meta.RemoveStatusCondition(&l.Status.Conditions, c)
	}
}

// waiting are the eligible candidates other than the holder and the
// grantee, in the order they will be granted the key, and blocked are the
// pods behind a gate of the scope's locks that are not, with why.
func (r *DistributedLockReconciler) waiting(ctx context.Context, s *scope) (waiting []*corev1.Pod, blocked map[*corev1.Pod]string) {
	blocked = map[*corev1.Pod]string{}
	for _, p := range s.pods {
		if _, holds := s.HeldBy(p.UID); holds || (s.grantee != nil && p.UID == s.grantee.UID) || !s.MayUse[p.Namespace] {
			continue
		}
		why, err := r.whyWaits(ctx, s, p)
		switch {
		case err != nil || why == stopping:
		case why == "" && isCandidate(s, p):
			waiting = append(waiting, p)
		case why != "" && s.GatedByAny(p):
			blocked[p] = why
		}
	}
	slices.SortFunc(waiting, func(a, b *corev1.Pod) int {
		return s.candidateAt[a.UID] - s.candidateAt[b.UID]
	})
	return waiting, blocked
}

func isCandidate(s *scope, p *corev1.Pod) bool {
	_, ok := s.candidateAt[p.UID]
	return ok
}

// queued are the pods whose in-pod clients wait in Redis's queue for the
// key, head first: who waits for a lock in mode Observe.
func (s *scope) queued() []*corev1.Pod {
	var out []*corev1.Pod
	for _, owner := range s.info.Waiters {
		id := string(owner)
		if i := strings.LastIndexByte(id, ':'); i > 0 {
			if p := s.ByUID[types.UID(id[:i])]; p != nil && !slices.Contains(out, p) {
				out = append(out, p)
			}
		}
	}
	return out
}
