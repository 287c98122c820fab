package controllers

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"

	locksv1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/controllers/decide"
)

// recordGrant records the controller's hold of the key in the statuses of
// the locks naming it, before markPods may lift a gate with it: the highest
// fencing token on each (status.highestToken, which the API server keeps
// from decreasing), and the grant itself (status.grant) on the locks of its
// pod's namespace. Before a gate is lifted, it checks past the cache that
// no other grant of the key is out and no higher token is recorded.
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
// A new grant and a re-take fail apart: only a take that a gate would be
// lifted with is ever given back when it cannot be checked or recorded; a
// take with no gate to lift keeps its hold while the record is retried.
func (r *DistributedLockReconciler) recordGrant(ctx context.Context, s *scope) error {
	var pod *corev1.Pod
	if len(s.Holders) > 0 && s.Holders[0].ByController() && s.Holders[0].Pod != nil {
		pod = s.Holders[0].Pod
	}
	lifting := pod != nil && s.Lifting(pod)
	if lifting {
		switch behind, err := r.confirmNoOtherGrant(ctx, s, pod); {
		case behind:
			return r.tokenBehind(ctx, s, pod)
		case err != nil:
			// Another grant may be out: neither this reconcile's take nor
			// its level of an adopted hold is kept (only one of them is set).
			return r.giveBack(ctx, s, pod, cmp.Or(s.taken, s.adopted), err)
		}
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
		if len(status) == 0 {
			continue
		}
		err := r.patchStatusFields(ctx, s, l, status)
		switch {
		case apierrors.IsNotFound(err) && lifting:
			// Deleted since the scope was read: the view is stale, and a gate
			// of a lock that is gone is not lifted.
			return r.giveBack(ctx, s, pod, s.taken, fmt.Errorf("lock %s/%s is gone: %w", l.Namespace, l.Name, err))
		case apierrors.IsNotFound(err):
			continue
		case apierrors.IsInvalid(err) && lifting:
			return r.tokenBehind(ctx, s, pod)
		case err != nil && lifting:
			// A pod whose gate was lifted already, as the API server shows,
			// holds a recorded grant (no gate is lifted before its record):
			// the take is kept for it, as a re-take's is. Decided on a view
			// in which it was still gated, the take is otherwise given back.
			if ungated, readErr := r.ungatedPastCache(ctx, s, pod); readErr != nil || !ungated {
				return r.giveBack(ctx, s, pod, s.taken, errors.Join(err, readErr))
			}
			return err
		case err != nil:
			// A take no gate is lifted with (a re-take for a grantee that
			// may run, a grant to a pod without a gate) keeps its hold, and
			// the record is tried again: giving it back would publish a
			// release under a pod that may run, and wake every waiter
			// outside the controller.
			return err
		}
	}
	if s.newGrant && pod != nil {
		log.FromContext(ctx).Info("granted the lock", "key", s.Key, "pod", pod.Name, "uid", pod.UID, "token", token)
		r.tellGranted(s, pod, token)
	}
	return nil
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

// patchStatusFields writes the status fields to the lock, preconditioned on
// its resourceVersion, and keeps the scope's copies in step with the result.
func (r *DistributedLockReconciler) patchStatusFields(ctx context.Context, s *scope, l *locksv1.DistributedLock, status map[string]any) error {
	data, err := json.Marshal(map[string]any{"metadata": map[string]any{"resourceVersion": l.ResourceVersion}, "status": status})
	if err != nil {
		return err
	}
	written := l.DeepCopy()
	if err := r.Status().Patch(ctx, written, client.RawPatch(types.MergePatchType, data)); err != nil {
		return err
	}
	l.ResourceVersion = written.ResourceVersion
	l.Status.HighestToken, l.Status.Grant = written.Status.HighestToken, written.Status.Grant
	if before := s.before[client.ObjectKeyFromObject(l)]; before != nil {
		before.ResourceVersion = written.ResourceVersion
		before.Status.HighestToken, before.Status.Grant = written.Status.HighestToken, written.Status.Grant.DeepCopy()
	}
	return nil
}

// tokenBehind gives back the pod's hold of the key, whose token is below
// one recorded for the key: Redis hands out tokens below one it handed out
// before (a restart that lost the counter, while this manager's clock is
// behind the clock of the client that took the last grant). Tokens follow
// the clock: the key is tried again every second, and taken once this clock
// has passed the recorded token. The whole ownership goes, whoever took it
// (this reconcile, or another manager, before a restart or beside this
// one): the admission policy refuses a lift with its token, so no gate was
// lifted with it, and none could be. Only that ownership, judged by its
// token: another manager may have taken the key again for the pod since,
// with a token above the record, and lifted the gate with it.
func (r *DistributedLockReconciler) tokenBehind(ctx context.Context, s *scope, pod *corev1.Pod) error {
	s.notReady = &condition{"FencingTokenBehind", fmt.Sprintf(
		"a fencing token above %d, the one Redis gave the latest grant, is recorded for the key: the grant was given back, and is tried again every second", s.info.Token)}
	s.requeue(time.Second)
	if _, err := s.client.ForceReleaseOwnership(ctx, s.Key, string(pod.UID), s.info.Token); err != nil {
		return err
	}
	r.grants.drop(s.Key, pod.UID)
	s.Holders, s.grantee, s.taken, s.adopted = nil, nil, nil, nil
	return nil
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

// giveBack undoes the level of the pod's hold that this reconcile took,
// hold, which must not be used, if it is not nil; it returns why (nil if it
// is no failure). It undoes that level only: the owner ID is the pod's, so
// another manager that took the key for the same pod meanwhile re-entered
// the same ownership, and may have recorded its grant and lifted the gate
// with it.
func (r *DistributedLockReconciler) giveBack(ctx context.Context, s *scope, pod *corev1.Pod, hold *handle, why error) error {
	if hold == nil {
		return why
	}
	if err := giveUp(ctx, hold); err != nil {
		return errors.Join(why, fmt.Errorf("giving the hold back failed: %w", err))
	}
	r.grants.drop(s.Key, pod.UID)
	s.Holders, s.grantee, s.taken, s.adopted = nil, nil, nil, nil
	return why
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
