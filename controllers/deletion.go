package controllers

import (
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	kerrors "k8s.io/apimachinery/pkg/util/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/log"

	locksv1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/controllers/decide"
)

// finalizeDeleted lets each lock being deleted go once its promise is kept.
// A pod whose gate the lock lifted keeps its grant until it stops: a lifted
// gate cannot be put back, so the grant must go on excluding every other
// guarded pod, and the lock stays (Terminating) until then, as a
// PersistentVolumeClaim stays while a pod uses it. Then the lock releases
// the grants it leaves nobody to claim, removes its marks and lets go.
func (r *DistributedLockReconciler) finalizeDeleted(ctx context.Context, s *scope) error {
	var errs []error
	for _, d := range s.Deleting {
		if p := s.WaitsFor(d); p != nil {
			// Its failure (a conflict with this reconcile's own patch of the
			// pod, a view found stale) leaves the statuses to be written, and
			// the lift to be tried again.
			if err := r.finishLift(ctx, s, d, p); err != nil {
				log.FromContext(ctx).Error(err, "cannot finish a deleting lock's recorded lift", "lock", client.ObjectKeyFromObject(d), "pod", p.Name)
				s.requeue(time.Second)
			}
			setCondition(d, locksv1.ConditionReady, metav1.ConditionFalse, "WaitingForHolder", fmt.Sprintf(
				"being deleted: pod %s, whose gate this lock lifted, keeps %s until it stops, and the lock goes then; to end its run now, delete the pod", p.Name, s.Key))
			continue
		}
		if err := r.releaseGrantsOf(ctx, s, d); err != nil {
			errs = append(errs, err)
			continue
		}
		// One lock's failure to go does not hold the others back.
		if err := r.letGo(ctx, s, d); err != nil {
			errs = append(errs, err)
		}
	}
	return kerrors.NewAggregate(errs)
}

// finishLift lifts the deleting lock's gate from the pod its status records
// lifting it from, if the pod still carries it and the key is held for it:
// the record comes before the lift (recordGrant), and the manager that made
// it stopped in between, or its lift failed, before the lock was deleted.
// A lock being deleted makes no new grant and lifts no gate of its own
// accord, but this lift is the recorded grant's: left undone, the pod could
// never start, and the lock, which waits for it to stop, never go.
func (r *DistributedLockReconciler) finishLift(ctx context.Context, s *scope, d *locksv1.DistributedLock, pod *corev1.Pod) error {
	h, held := s.HeldBy(pod.UID)
	if !decide.HasGate(pod, locksv1.GateFor(d.Name)) || !held || !h.ByController() {
		return nil // lifted already; or the key is taken back for the pod first (keepGrants)
	}
	switch behind, err := r.confirmNoOtherGrant(ctx, s, pod); {
	case behind:
		// The pod has not started: its hold is given back and taken again
		// (keepGrants, as the record keeps the grant its own) until the
		// clock has passed the record.
		return r.tokenBehind(ctx, s, pod)
	case err != nil:
		return err
	}
	want := pod.DeepCopy()
	setMarks(want, d.Name, h.Owner, s.info.Token)
	liftGate(want, d.Name)
	if err := r.patchPod(ctx, pod, want); err != nil {
		return err
	}
	log.FromContext(ctx).Info("finished the gate lift a deleting lock recorded", "key", s.Key, "lock", d.Name, "pod", pod.Name, "token", s.info.Token)
	return nil
}

// letGo removes the lock's finalizer: it has nothing left to release.
func (r *DistributedLockReconciler) letGo(ctx context.Context, s *scope, d *locksv1.DistributedLock) error {
	patch := client.MergeFromWithOptions(d.DeepCopy(), client.MergeFromWithOptimisticLock{})
	controllerutil.RemoveFinalizer(d, locksv1.Finalizer)
	if err := r.Patch(ctx, d, patch); client.IgnoreNotFound(err) != nil {
		return err
	}
	delete(s.before, client.ObjectKeyFromObject(d)) // gone: no status to write
	r.Metrics.forget(client.ObjectKeyFromObject(d))
	return nil
}

// releaseGrantsOf releases, for a lock being deleted, the grants of its key
// to pods of its namespace that no live lock there selects, gates or marks,
// and that no other lock of the key, live or refused, records (deleting a
// lock is deleting its promise: a leader elected through it stops being
// one), and removes the lock's marks. A grant whose gate any
// lock of the key lifted is never released here while its pod runs: the
// lock that lifted it waits for it, whether it is live, refused or being
// deleted too. In-pod clients' holds are
// the pods' own. Its pods still behind its gate stay gated, and are told
// why (gates.go).
func (r *DistributedLockReconciler) releaseGrantsOf(ctx context.Context, s *scope, d *locksv1.DistributedLock) error {
	var kept []holder
	for _, h := range s.Holders {
		name := ""
		switch gone, isGone := s.gone[h.PodUID]; {
		case !h.ByController():
		case h.Pod != nil && !decide.Stopped(h.Pod) && (s.LiftedFor(h.Pod) || s.RecordedByAnother(h.Pod, d)):
		case h.Pod != nil && h.Pod.Namespace == d.Namespace && !s.Claimed(h.Pod):
			name = h.Pod.Name
		case h.Pod == nil && isGone && gone.Namespace == d.Namespace:
			name = gone.Name
		}
		if name == "" {
			kept = append(kept, h)
			continue
		}
		if _, err := s.client.ForceReleaseClient(ctx, s.Key, string(h.PodUID)); err != nil {
			return err
		}
		r.grants.drop(s.Key, h.PodUID)
		r.Recorder.Eventf(d, corev1.EventTypeNormal, "Released", "Released %s from pod %s: the DistributedLock is being deleted", s.Key, name)
		r.Metrics.transition(d, "released")
	}
	s.Holders = kept
	// A grant lost while its pod runs (kept without a hold, see keepGrants)
	// ends with the lock too, unless a lock left claims the pod.
	if g := r.grants.get(s.Key); g != nil && g.hold == nil && g.Pod.Namespace == d.Namespace {
		if p := s.ByUID[g.PodUID]; p == nil || !s.Claimed(p) {
			r.grants.drop(s.Key, g.PodUID)
		}
	}
	// The grants it ended are over: no lock of the namespace records them
	// any more, or the record would name the grantee again (a grant lost to
	// somebody else is taken back for its pod once the key is free).
	for _, l := range s.LocksIn(d.Namespace) {
		g := l.Status.Grant
		if g == nil || g.GateLifted {
			continue
		}
		if _, held := s.HeldBy(types.UID(g.PodUID)); held {
			continue
		}
		if p := s.ByUID[types.UID(g.PodUID)]; p == nil || !s.Claimed(p) {
			l.Status.Grant = nil
		}
	}
	// The marks are for display: one that cannot be cleared (a pod its
	// tenant made hard to patch) does not keep the lock from going.
	for _, p := range s.pods {
		if p.Namespace != d.Namespace || !carriesMarks(p, d.Name) {
			continue
		}
		want := p.DeepCopy()
		clearMarks(want, d.Name)
		if err := r.patchPod(ctx, p, want); err != nil {
			log.FromContext(ctx).Error(err, "cannot clear a deleted lock's marks", "lock", client.ObjectKeyFromObject(d), "pod", client.ObjectKeyFromObject(p))
		}
	}
	return nil
}
