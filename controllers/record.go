package controllers

import (
	"context"
	"fmt"
	"slices"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/controllers/decide"
)

// recordGrant decides to record the controller's hold of the key in the
// statuses of the locks naming it, before markPods may lift a gate with
// it: the highest fencing token on each (status.highestToken, which the API
// server keeps from decreasing), and the grant itself (status.grant) on the
// locks of its pod's namespace. Before a gate is lifted, it checks past the
// cache that no other grant of the key is out and no higher token is
// recorded (confirm).
//
// Timing alone cannot keep a manager that lost its grant, or decided on a
// stale view, from lifting a gate: it may be paused between any check and
// its write, for longer than its leader Lease and the lock's lease, while
// another manager grants the key again. So the order is: take the key, check
// past the cache, record, lift; and every status write is preconditioned on
// the lock's resourceVersion. A manager paused before its check finds the
// other grant when it wakes; one paused after it finds its record refused
// (the other manager wrote the lock since, with a higher token); and the
// admission policy of config/admission refuses a lift whose token is below
// the lock's record.
//
// A new grant and a re-take fail apart (writeRecord): only a take that a
// gate would be lifted with is ever given back when it cannot be checked
// or recorded; a take with no gate to lift keeps its hold while the record
// is retried.
func (r *DistributedLockReconciler) recordGrant(_ context.Context, s *scope) ([]action, error) {
	var pod *corev1.Pod
	if len(s.Holders) > 0 && s.Holders[0].ByController() && s.Holders[0].Pod != nil {
		pod = s.Holders[0].Pod
	}
	lifting := pod != nil && s.Lifting(pod)
	var out []action
	if lifting {
		out = append(out, confirm{pod: pod})
	}
	token := s.info.Token
	for _, l := range append(slices.Clip(s.Locks), s.Deleting...) {
		if !s.MayUse[l.Namespace] {
			continue // a lock of a namespace that may not use the key learns nothing of it
		}
		status := map[string]any{}
		if l.Status.HighestToken < token {
			status["highestToken"] = token
		}
		if pod != nil && l.Namespace == pod.Namespace && l.DeletionTimestamp.IsZero() {
			if grant, ok := s.grantRecord(l, pod); ok && !equality.Semantic.DeepEqual(grant, l.Status.Grant) {
				status["grant"] = grant
			}
		}
		if len(status) > 0 {
			out = append(out, writeRecord{lock: l, fields: status, pod: pod, lifting: lifting})
		}
	}
	if s.newGrant && pod != nil {
		out = append(out, granted{pod: pod, token: token})
	}
	return out, nil
}

// grantRecord is the lock's record of the controller's grant to the pod:
// the same grant with its latest token, the lift of this lock's gate
// remembered once it happened; or a new one, unless the lock still records
// another pod's grant that is not over (which forgetEndedGrants clears once
// the API server shows it is).
func (s *scope) grantRecord(l *locksv1.DistributedLock, pod *corev1.Pod) (*locksv1.LockGrant, bool) {
	was := l.Status.Grant
	switch {
	case was == nil:
		return &locksv1.LockGrant{PodName: pod.Name, PodUID: string(pod.UID), Token: s.info.Token,
			GateLifted: s.LiftsGate(l, pod), Since: metav1.Now()}, true
	case was.PodUID == string(pod.UID):
		next := *was
		next.Token = max(was.Token, s.info.Token)
		next.GateLifted = was.GateLifted || s.LiftsGate(l, pod)
		return &next, true
	}
	return nil, false
}

// confirmNoOtherGrant reads the key's locks past the cache and fails if one
// records a grant to another pod that has not stopped, or a fencing token
// above the grant's (behind is then true): the view this grant was decided
// on is stale.
func (r *DistributedLockReconciler) confirmNoOtherGrant(ctx context.Context, s *scope, pod *corev1.Pod) (behind bool, err error) {
	for _, known := range s.All() {
		l := &locksv1.DistributedLock{}
		if err := r.APIReader.Get(ctx, client.ObjectKeyFromObject(known), l); apierrors.IsNotFound(err) {
			continue
		} else if err != nil {
			return false, err
		}
		if l.Status.HighestToken > s.info.Token {
			return true, fmt.Errorf("lock %s/%s records fencing token %d, above this grant's %d", l.Namespace, l.Name, l.Status.HighestToken, s.info.Token)
		}
		g := l.Status.Grant
		if g == nil || g.PodUID == string(pod.UID) {
			continue
		}
		other, _, err := r.podPastCache(ctx, types.NamespacedName{Namespace: l.Namespace, Name: g.PodName}, types.UID(g.PodUID))
		if err != nil {
			return false, err
		}
		if other != nil && !decide.Stopped(other) {
			return false, fmt.Errorf("pod %s/%s still has a grant of %s (fencing token %d) that the cache did not show", l.Namespace, g.PodName, s.Key, g.Token)
		}
	}
	return false, nil
}

// ungatedPastCache reports whether the API server shows the pod without the
// gates that the grant would lift (those of the key's live locks that the
// scope saw it carry).
func (r *DistributedLockReconciler) ungatedPastCache(ctx context.Context, s *scope, pod *corev1.Pod) (bool, error) {
	now := &corev1.Pod{}
	if err := r.APIReader.Get(ctx, client.ObjectKeyFromObject(pod), now); err != nil {
		return false, client.IgnoreNotFound(err)
	}
	if now.UID != pod.UID {
		return false, nil
	}
	for _, l := range s.LocksIn(pod.Namespace) {
		if s.LiftsGate(l, pod) && decide.HasGate(now, locksv1.GateFor(l.Name)) {
			return false, nil
		}
	}
	return true, nil
}
