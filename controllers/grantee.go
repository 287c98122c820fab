package controllers

import (
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	locksv1 "github.com/lockwarden/lockwarden/api/v1alpha1"
)

// The record of a grant is status.grant of the locks naming the key: the
// controller writes it there (recordGrant) before it lifts a gate with the
// grant, and clears it only once the API server shows the pod stopped or
// gone (forgetEndedGrants); only the controller writes a lock's status. A
// pod's marks, and status.holder, are for display: its tenant can write the
// marks, and Redis can lose a hold or show somebody else's meanwhile.

// granteeOf is the pod the controller granted the key to that has not
// stopped, if any: the one the locks' statuses record (the latest grant, by
// fencing token), else the one holding it in Redis under "<pod UID>:0" in a
// namespace that may hold it (a grant with no gate to lift, or not recorded
// yet), else the one this process granted it to.
func (r *DistributedLockReconciler) granteeOf(s *scope) *corev1.Pod {
	if p, _ := s.recordedGrantee(); p != nil {
		return p
	}
	for _, h := range s.holders {
		if h.pod != nil && h.byController() && !stopped(h.pod) && s.mayUse[h.pod.Namespace] && s.hasLockIn(h.pod.Namespace) {
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
	return nil
}

// recordedGrantee is the pod of the latest grant the statuses of the key's
// locks record (the highest token), if it has not stopped, and that record.
// A lock's status only ever records a pod of its own namespace. A lock
// being deleted keeps a grant whose gate it lifted, or whose pod a live
// lock of its namespace claims (finalizeDeleted); its record of any other
// grant is over once it released it, though the cache may show the lock a
// while longer.
func (s *scope) recordedGrantee() (*corev1.Pod, *locksv1.LockGrant) {
	var pod *corev1.Pod
	var record *locksv1.LockGrant
	for _, l := range s.all() {
		st := l.Status.Grant
		if st == nil {
			continue
		}
		p := s.byUID[types.UID(st.PodUID)]
		if p == nil || p.Namespace != l.Namespace || stopped(p) {
			continue
		}
		if !l.DeletionTimestamp.IsZero() && !st.GateLifted && !s.claimed(p) {
			continue
		}
		if record == nil || st.Token > record.Token {
			pod, record = p, st
		}
	}
	return pod, record
}

// mayHoldGrant reports whether the pod may hold a grant of the key: its
// namespace may use the key and has a lock naming it (live, or being
// deleted), or a lock of its namespace records the grant in its status.
func (s *scope) mayHoldGrant(pod *corev1.Pod) bool {
	if s.mayUse[pod.Namespace] && s.hasLockIn(pod.Namespace) {
		return true
	}
	p, _ := s.recordedGrantee()
	return p != nil && p.UID == pod.UID
}

// hasLockIn reports whether a live or deleting lock of the namespace may
// hold the key.
func (s *scope) hasLockIn(namespace string) bool {
	return len(s.locksIn(namespace)) > 0 || len(s.deletingIn(namespace)) > 0
}

// liftedFor reports whether a lock of the key records that it lifted its
// gate from the pod: such a grant is kept until the pod stops, whatever
// happens to the lock.
func (s *scope) liftedFor(pod *corev1.Pod) bool {
	for _, l := range s.all() {
		if st := l.Status.Grant; st != nil && st.GateLifted && st.PodUID == string(pod.UID) && l.Namespace == pod.Namespace {
			return true
		}
	}
	return false
}
