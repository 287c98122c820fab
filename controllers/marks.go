package controllers

import (
	"context"
	"slices"
	"strconv"
	"time"

	corev1 "k8s.io/api/core/v1"

	locksv1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/controllers/decide"
)

// markPods decides to bring every pod of the scope (which holds each pod that carries
// a mark or gate of its locks) to the marks it should carry for each live
// lock of its namespace: the holder carries the marks of the locks that
// select it, gate it or marked it before, and if the controller holds the
// key for it, loses those locks' gates (recordGrant recorded the grant
// first); every other pod carries none, except a grantee in
// conflict, whose marks record its sticky grant. A lock's marks are its own
// label, annotations and gate, so locks never overwrite each other's. The
// pods of namespaces that may not use the key are never written, and the
// marks of a lock being deleted are finalizeDeleted's.
//
// The holder's patch, which lifts its gates, is written first, and only its
// failure fails the key (mark): another pod's marks are for display, and a
// pod its tenant made hard to patch (the manager-writes policy refusing
// it, say) must not hold the key back for everyone.
func (r *DistributedLockReconciler) markPods(_ context.Context, s *scope) ([]action, error) {
	var out []action
	holderPod := s.HolderPod()
	pods := s.pods
	if i := slices.Index(pods, holderPod); i > 0 {
		pods = append([]*corev1.Pod{holderPod}, slices.Delete(slices.Clone(pods), i, i+1)...)
	}
	for _, pod := range pods {
		if !s.MayUse[pod.Namespace] {
			continue
		}
		locks := s.LocksIn(pod.Namespace)
		// A pod that is not the holder only ever loses marks, so one that
		// carries none of these locks' has nothing to write, and need not be
		// copied.
		if (holderPod == nil || pod.UID != holderPod.UID) &&
			!slices.ContainsFunc(locks, func(l *locksv1.DistributedLock) bool { return carriesMarks(pod, l.Name) }) {
			continue
		}
		want := pod.DeepCopy()
		for _, l := range locks {
			switch {
			case holderPod != nil && pod.UID == holderPod.UID && !decide.Stopped(pod) &&
				(selects(l, pod) || decide.HasGate(pod, locksv1.GateFor(l.Name)) || decide.MarkedBy(pod, l.Name)):
				h := s.Holders[0]
				setMarks(want, l.Name, h.Owner, s.info.Token)
				if s.LiftsGate(l, pod) && decide.RecordsLift(l, pod) {
					liftGate(want, l.Name)
				}
			case s.conflict && s.grantee != nil && pod.UID == s.grantee.UID:
			default:
				clearMarks(want, l.Name)
			}
		}
		out = append(out, mark{pod: pod, want: want, holder: pod == holderPod})
	}
	return out, nil
}

// liftGate removes the lock's gate from the pod. The lift goes in the same
// patch as the token annotation, which the admission policy checks against
// the highest token recorded for the key (recordGrant).
func liftGate(pod *corev1.Pod, lock string) {
	pod.Spec.SchedulingGates = slices.DeleteFunc(pod.Spec.SchedulingGates, func(g corev1.PodSchedulingGate) bool {
		return g.Name == locksv1.GateFor(lock)
	})
}

// changedKeys is the merge patch from before to after: each new or changed
// key with its value, each removed key with null.
func changedKeys(before, after map[string]string) map[string]any {
	changes := map[string]any{}
	for k, v := range after {
		if was, ok := before[k]; !ok || was != v {
			changes[k] = v
		}
	}
	for k := range before {
		if _, kept := after[k]; !kept {
			changes[k] = nil
		}
	}
	return changes
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
	for _, prefix := range locksv1.MarkAnnotationPrefixes {
		if _, ok := pod.Annotations[prefix+lock]; ok {
			return true
		}
	}
	return false
}

func clearMarks(pod *corev1.Pod, lock string) {
	delete(pod.Labels, locksv1.HolderLabelFor(lock))
	for _, prefix := range locksv1.MarkAnnotationPrefixes {
		delete(pod.Annotations, prefix+lock)
	}
}
