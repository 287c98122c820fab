package controllers

import (
	"context"
	"maps"
	"slices"
	"strconv"
	"time"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1 "github.com/lockwarden/lockwarden/api/v1alpha1"
)

// markPods brings every pod of the scope's namespaces to the marks it
// should carry for each lock there: the holder carries the marks of the
// locks that select it, gate it or marked it before, and loses those locks'
// gates if the controller holds the key for it; every other pod carries
// none, except a grantee in conflict, whose marks record its sticky grant.
// A lock's marks are its own label, annotations and gate, so locks never
// overwrite each other's.
func (r *DistributedLockReconciler) markPods(ctx context.Context, s *scope) error {
	holderPod := s.holderPod()
	for _, pod := range s.pods {
		locks := s.locksIn(pod.Namespace)
		// A pod that is not the holder only ever loses marks, so one that
		// carries none of these locks' has nothing to write: most pods of a
		// namespace are no lock's, and need not be copied.
		if (holderPod == nil || pod.UID != holderPod.UID) &&
			!slices.ContainsFunc(locks, func(l *locksv1.DistributedLock) bool { return carriesMarks(pod, l.Name) }) {
			continue
		}
		want := pod.DeepCopy()
		for _, l := range locks {
			switch {
			case holderPod != nil && pod.UID == holderPod.UID && !stopped(pod) &&
				(selects(l, pod) || hasGate(pod, locksv1.GateFor(l.Name)) || markedBy(pod, l.Name)):
				h := s.holders[0]
				setMarks(want, l.Name, string(h.owner), s.info.Token)
				if h.byController() {
					want.Spec.SchedulingGates = slices.DeleteFunc(want.Spec.SchedulingGates, func(g corev1.PodSchedulingGate) bool {
						return g.Name == locksv1.GateFor(l.Name)
					})
				}
			case s.conflict && s.grantee != nil && pod.UID == s.grantee.UID:
			default:
				clearMarks(want, l.Name)
			}
		}
		if err := r.patchPod(ctx, pod, want); err != nil {
			return err
		}
	}
	return nil
}

// patchPod writes the difference between pod and want, if any, as a merge
// patch preconditioned on the pod's resourceVersion: a gate list is
// replaced whole, so a concurrent change to it must fail the patch rather
// than be overwritten.
func (r *DistributedLockReconciler) patchPod(ctx context.Context, pod, want *corev1.Pod) error {
	if maps.Equal(pod.Labels, want.Labels) && maps.Equal(pod.Annotations, want.Annotations) &&
		slices.Equal(pod.Spec.SchedulingGates, want.Spec.SchedulingGates) {
		return nil
	}
	patch := client.MergeFromWithOptions(pod, client.MergeFromWithOptimisticLock{})
	return client.IgnoreNotFound(r.Patch(ctx, want, patch))
}

func markedBy(pod *corev1.Pod, lock string) bool {
	_, ok := pod.Annotations[locksv1.OwnerAnnotationPrefix+lock]
	return ok || pod.Labels[locksv1.HolderLabelFor(lock)] != ""
}

// setMarks marks the pod as the lock's holder. The since-time is kept while
// the ownership (owner and token) stays the same.
func setMarks(pod *corev1.Pod, lock, owner string, token int64) {
	if pod.Labels == nil {
		pod.Labels = map[string]string{}
	}
	if pod.Annotations == nil {
		pod.Annotations = map[string]string{}
	}
	t := strconv.FormatInt(token, 10)
	if pod.Annotations[locksv1.OwnerAnnotationPrefix+lock] != owner || pod.Annotations[locksv1.TokenAnnotationPrefix+lock] != t ||
		pod.Annotations[locksv1.SinceAnnotationPrefix+lock] == "" {
		pod.Annotations[locksv1.SinceAnnotationPrefix+lock] = time.Now().UTC().Format(time.RFC3339)
	}
	pod.Labels[locksv1.HolderLabelFor(lock)] = "true"
	pod.Annotations[locksv1.OwnerAnnotationPrefix+lock] = owner
	pod.Annotations[locksv1.TokenAnnotationPrefix+lock] = t
}

// carriesMarks reports whether the pod has any of the lock's marks that
// clearMarks removes.
func carriesMarks(pod *corev1.Pod, lock string) bool {
	if _, ok := pod.Labels[locksv1.HolderLabelFor(lock)]; ok {
		return true
	}
	for _, prefix := range []string{locksv1.OwnerAnnotationPrefix, locksv1.TokenAnnotationPrefix, locksv1.SinceAnnotationPrefix} {
		if _, ok := pod.Annotations[prefix+lock]; ok {
			return true
		}
	}
	return false
}

func clearMarks(pod *corev1.Pod, lock string) {
	delete(pod.Labels, locksv1.HolderLabelFor(lock))
	for _, prefix := range []string{locksv1.OwnerAnnotationPrefix, locksv1.TokenAnnotationPrefix, locksv1.SinceAnnotationPrefix} {
		delete(pod.Annotations, prefix+lock)
	}
}
