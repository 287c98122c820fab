package decide

import (
	"slices"

	corev1 "k8s.io/api/core/v1"

	locksv1 "github.com/lockwarden/lockwarden/api/v1alpha1"
)

// PolicyLock is the lock whose per-lock policy (lease terms, start
// timeout, eviction) applies to the pod's grant of the key: of the locks of
// the pod's namespace (live, being deleted, or refused the key), in that
// order and by name, the first that records lifting its gate from the pod,
// else the first that gates it, else selects it, else marked it; nil if
// none does. Another lock of the namespace naming the same key, which
// neither gates nor selects the pod, never sets its policy.
func (v *View) PolicyLock(pod *corev1.Pod) *locksv1.DistributedLock {
	locks := append(append(v.LocksIn(pod.Namespace), v.DeletingIn(pod.Namespace)...), InNamespace(v.Revoked, pod.Namespace)...)
	for _, claims := range []func(*locksv1.DistributedLock) bool{
		func(l *locksv1.DistributedLock) bool {
			st := l.Status.Grant
			return st != nil && st.GateLifted && st.PodUID == string(pod.UID)
		},
		func(l *locksv1.DistributedLock) bool { return HasGate(pod, locksv1.GateFor(l.Name)) },
		func(l *locksv1.DistributedLock) bool { return v.Selects(l, pod) },
		func(l *locksv1.DistributedLock) bool { return MarkedBy(pod, l.Name) },
	} {
		if i := slices.IndexFunc(locks, claims); i >= 0 {
			return locks[i]
		}
	}
	return nil
}
