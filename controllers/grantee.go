package controllers

import (
	"slices"

	corev1 "k8s.io/api/core/v1"
)

// granteeOf is the pod the controller granted the key to that has not
// stopped, if any: the one holding it in Redis under "<pod UID>:0", else the
// one this process granted it to, else the oldest pod whose marks, or whose
// lock's status, record a grant (after a manager restart, or a lease lost
// with Redis's data). Each must be of a namespace that may hold the grant
// (mayHoldGrant).
func (r *DistributedLockReconciler) granteeOf(s *scope) *corev1.Pod {
	for _, h := range s.holders {
		if h.pod != nil && h.byController() && !stopped(h.pod) && s.mayHoldGrant(h.pod) {
			return h.pod
		}
	}
	// This process's record of its grant is a cache: it may name the
	// grantee, never release anything.
	if g := r.grants.get(s.key); g != nil {
		if p := s.byUID[g.podUID]; p != nil && !stopped(p) && s.mayHoldGrant(p) {
			return p
		}
	}
	var oldest *corev1.Pod
	for _, p := range s.pods {
		if !stopped(p) && (s.granted(p) || s.recordedGrant(p)) && (oldest == nil || p.CreationTimestamp.Before(&oldest.CreationTimestamp)) {
			oldest = p
		}
	}
	return oldest
}

// mayHoldGrant reports whether the pod may hold a grant of the key: its
// namespace may use the key and has a lock naming it (live, or being
// deleted), or a lock of its namespace that may no longer use the key
// records the grant in its status (recordedGrant).
func (s *scope) mayHoldGrant(pod *corev1.Pod) bool {
	if s.mayUse[pod.Namespace] {
		return len(s.locksIn(pod.Namespace)) > 0 || len(s.deletingIn(pod.Namespace)) > 0
	}
	return s.recordedGrant(pod)
}

// recordedGrant reports whether a lock of a namespace that may no longer
// use the key (un-shared by the administrator) records in its status a
// grant to the pod, made while the namespace could. Only the status counts
// there: the pod's marks, and a hold in Redis, are things its tenant can
// forge, but a status only the controller writes. Such a grant is kept, and
// taken again if Redis loses it, until the pod stops: un-sharing a key
// never ends a running grant.
func (s *scope) recordedGrant(pod *corev1.Pod) bool {
	if s.mayUse[pod.Namespace] {
		return false
	}
	for _, l := range append(slices.Clip(s.revoked), s.deleting...) {
		if st := l.Status.Holder; l.Namespace == pod.Namespace && st != nil && st.GrantedByController && st.PodUID == string(pod.UID) {
			return true
		}
	}
	return false
}
