package controllers_test

import (
	corev1 "k8s.io/api/core/v1"

	locksv1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/controllers"
)

// gateFor is the scheduling gate by which a pod waits for the lock.
func gateFor(lock string) string { return locksv1.SchedulingGate }

// markedBy reports whether the pod carries the lock's holder marks.
func markedBy(pod *corev1.Pod, lock string) bool { return pod.Labels[locksv1.HolderLabel] == lock }

// gatedBy puts the pod behind the gates of the named locks, as a guarded
// CronJob's pod template would.
func gatedBy(locks ...string) podOption {
	return func(p *corev1.Pod) {
		for _, l := range locks {
			p.Spec.SchedulingGates = append(p.Spec.SchedulingGates, corev1.PodSchedulingGate{Name: gateFor(l)})
		}
	}
}

// sharedKey is an explicit key that locks in ns may name.
func sharedKey(ns, name string) string { return name + "-" + ns }

// sharing lets the namespaces use the key, as the administrator would.
func sharing(key string, namespaces ...string) reconcilerOption {
	return func(*controllers.DistributedLockReconciler) {}
}
