package controllers

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1 "github.com/lockwarden/lockwarden/api/v1alpha1"
)

// recordGrant records the controller's hold of the key in the statuses of
// the locks naming it, before markPods may lift a gate with it: the highest
// fencing token on each (status.highestToken, which the API server keeps
// from decreasing), and the grant itself as the holder of the locks of its
// pod's namespace. Before a gate is lifted, it also checks past the cache
// that no other grant of the key is out.
//
// Timing alone cannot keep a manager that lost its grant, or decided on a
// stale view, from lifting a gate: it may be paused between any check and
// its write, for longer than its leader Lease and the lock's lease, while
// another manager grants the key again. So the order is: take the key, check
// past the cache, record, lift. A manager paused before its check finds the
// other grant when it wakes; one paused after it finds its record or its
// lift refused, since the other manager's later grant has a higher token,
// recorded first; and the admission policy of config/admission refuses a
// lift whose token is below the lock's record.
func (r *DistributedLockReconciler) recordGrant(ctx context.Context, s *scope) error {
	token := s.info.Token
	var pod *corev1.Pod
	if len(s.holders) > 0 && s.holders[0].byController() && s.holders[0].pod != nil {
		pod = s.holders[0].pod
	}
	if pod != nil && s.lifting(pod) {
		if err := r.confirmNoOtherGrant(ctx, s, pod); err != nil {
			return r.giveBack(ctx, s, pod, err)
		}
	}
	// Live and deleting locks only: a lock of a namespace that may not use
	// the key learns nothing of its grants.
	for _, l := range append(slices.Clip(s.locks), s.deleting...) {
		status := map[string]any{}
		if l.Status.HighestToken < token {
			status["highestToken"] = token
		}
		var holder *locksv1.LockHolder
		if pod != nil && l.Namespace == pod.Namespace && l.DeletionTimestamp.IsZero() {
			if holder = s.holderStatus(l, l.Status.Holder); !equality.Semantic.DeepEqual(holder, l.Status.Holder) {
				status["holder"] = holder
			}
		}
		if len(status) == 0 {
			continue
		}
		data, err := json.Marshal(map[string]any{"status": status})
		if err != nil {
			return err
		}
		err = r.Status().Patch(ctx, l.DeepCopy(), client.RawPatch(types.MergePatchType, data))
		switch {
		case apierrors.IsNotFound(err):
			continue
		case apierrors.IsInvalid(err) && s.fresh:
			// A higher token is recorded: Redis hands out tokens below one
			// it handed out before (a restart without its data, on a host
			// whose clock is behind). Tokens follow Redis's clock, so the
			// grant is given back and tried again in a moment.
			s.notReady = &condition{"FencingTokenBehind", fmt.Sprintf(
				"a fencing token above %d, the one Redis gave this grant, is recorded for the key: the grant was given back, and is tried again every second", token)}
			s.requeue(time.Second)
			return r.giveBack(ctx, s, pod, nil)
		case apierrors.IsInvalid(err):
			return fmt.Errorf("lock %s/%s records a fencing token above %d, the held grant's: %w", l.Namespace, l.Name, token, err)
		case err != nil:
			return err
		}
		l.Status.HighestToken = max(l.Status.HighestToken, token)
		if _, ok := status["holder"]; ok {
			l.Status.Holder = holder
		}
		if before := s.before[client.ObjectKeyFromObject(l)]; before != nil {
			before.Status.HighestToken, before.Status.Holder = l.Status.HighestToken, l.Status.Holder.DeepCopy()
		}
	}
	return nil
}

// lifting reports whether markPods will lift a gate from the pod.
func (s *scope) lifting(pod *corev1.Pod) bool {
	for _, l := range s.locksIn(pod.Namespace) {
		if s.liftsGate(l, pod) {
			return true
		}
	}
	return false
}

// confirmNoOtherGrant reads the key's locks past the cache and fails if
// one records a grant to another pod that has not stopped, or a fencing
// token above the grant's: the view this grant was decided on is stale.
func (r *DistributedLockReconciler) confirmNoOtherGrant(ctx context.Context, s *scope, pod *corev1.Pod) error {
	for _, known := range s.all() {
		l := &locksv1.DistributedLock{}
		if err := r.APIReader.Get(ctx, client.ObjectKeyFromObject(known), l); apierrors.IsNotFound(err) {
			continue
		} else if err != nil {
			return err
		}
		if l.Status.HighestToken > s.info.Token {
			return fmt.Errorf("lock %s/%s records fencing token %d, above this grant's %d", l.Namespace, l.Name, l.Status.HighestToken, s.info.Token)
		}
		st := l.Status.Holder
		if st == nil || !st.GrantedByController || st.PodUID == string(pod.UID) {
			continue
		}
		other, _, err := r.podPastCache(ctx, types.NamespacedName{Namespace: l.Namespace, Name: st.PodName}, types.UID(st.PodUID))
		if err != nil {
			return err
		}
		if other != nil && !stopped(other) {
			return fmt.Errorf("pod %s/%s still has a grant of %s (fencing token %d) that the cache did not show", l.Namespace, st.PodName, s.key, st.Token)
		}
	}
	return nil
}

// giveBack releases a hold this reconcile took, which must not be used, and
// returns why (nil if it is no failure).
func (r *DistributedLockReconciler) giveBack(ctx context.Context, s *scope, pod *corev1.Pod, why error) error {
	if !s.fresh || pod == nil {
		return why
	}
	if _, err := s.client.ForceRelease(ctx, s.key, string(pod.UID)); err != nil {
		return errors.Join(why, fmt.Errorf("giving the hold back failed: %w", err))
	}
	r.grants.drop(s.key, pod.UID)
	s.holders, s.grantee = nil, nil
	return why
}
