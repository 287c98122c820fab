package controllers

import (
	"context"
	"encoding/json"
	"slices"
	"strconv"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"

	locksv1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/controllers/decide"
)

// markPods brings every pod of the scope (which holds each pod that carries
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
// failure fails the key: another pod's marks are for display, and a pod its
// tenant made hard to patch (the manager-writes policy refusing it, say)
// must not hold the key back for everyone.
func (r *DistributedLockReconciler) markPods(ctx context.Context, s *scope) error {
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
		if err := r.patchPod(ctx, pod, want); err != nil {
			if pod == holderPod {
				return &podUpdateError{pod: pod, err: err}
			}
			log.FromContext(ctx).Error(err, "cannot update a pod's marks", "key", s.Key, "pod", client.ObjectKeyFromObject(pod))
		} else if len(want.Spec.SchedulingGates) < len(pod.Spec.SchedulingGates) {
			log.FromContext(ctx).Info("lifted the lock's gate", "key", s.Key, "pod", pod.Name, "uid", pod.UID, "token", s.info.Token)
		}
	}
	return nil
}

// liftGate removes the lock's gate from the pod. The lift goes in the same
// patch as the token annotation, which the admission policy checks against
// the highest token recorded for the key (recordGrant).
func liftGate(pod *corev1.Pod, lock string) {
	pod.Spec.SchedulingGates = slices.DeleteFunc(pod.Spec.SchedulingGates, func(g corev1.PodSchedulingGate) bool {
		return g.Name == locksv1.GateFor(lock)
	})
}

// patchPod writes the difference between pod and want, if any, as a merge
// patch of the labels and annotations that changed, key by key, and of
// the whole gate list if it changed, preconditioned on the pod's
// resourceVersion: a concurrent change to the gates must fail the patch
// rather than be overwritten. The cache keeps only lockwarden's own
// annotations (stripPod), so the patch must never set the annotations as a
// whole: once the marks are cleared, that would delete every other tool's.
func (r *DistributedLockReconciler) patchPod(ctx context.Context, pod, want *corev1.Pod) error {
	metadata := map[string]any{"resourceVersion": pod.ResourceVersion}
	patch := map[string]any{"metadata": metadata}
	if changes := changedKeys(pod.Labels, want.Labels); len(changes) > 0 {
		metadata["labels"] = changes
	}
	if changes := changedKeys(pod.Annotations, want.Annotations); len(changes) > 0 {
		metadata["annotations"] = changes
	}
	if !slices.Equal(pod.Spec.SchedulingGates, want.Spec.SchedulingGates) {
		patch["spec"] = map[string]any{"schedulingGates": want.Spec.SchedulingGates}
	}
	if len(metadata) == 1 && patch["spec"] == nil {
		return nil
	}
	data, err := json.Marshal(patch)
	if err != nil {
		return err
	}
	return client.IgnoreNotFound(r.Patch(ctx, want, client.RawPatch(types.MergePatchType, data)))
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
