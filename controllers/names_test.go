package controllers_test

import (
	"context"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/controllers"
)

// gateFor is the scheduling gate by which a pod waits for the lock.
func gateFor(lock string) string { return "gate.lockwarden.dev/" + lock }

// markedBy reports whether the pod carries the lock's holder label.
func markedBy(pod *corev1.Pod, lock string) bool {
	return pod.Labels["holder.lockwarden.dev/"+lock] == "true"
}

// gatedBy puts the pod behind the gates of the named locks, as a guarded
// CronJob's pod template would.
func gatedBy(locks ...string) podOption {
	return func(p *corev1.Pod) {
		for _, l := range locks {
			p.Spec.SchedulingGates = append(p.Spec.SchedulingGates, corev1.PodSchedulingGate{Name: gateFor(l)})
		}
	}
}

// sharedKey is an explicit key that locks in ns may name: one under the
// namespace's own name.
func sharedKey(ns, name string) string { return ns + "/" + name }

// sharing lets the namespaces use the key, as the administrator's
// --shared-key flag does.
func sharing(key string, namespaces ...string) reconcilerOption {
	return func(r *controllers.DistributedLockReconciler) {
		if err := r.Keys.Share(key + "=" + strings.Join(namespaces, ",")); err != nil {
			panic(err)
		}
	}
}

// marked reports whether the pod carries any lock's marks.
func marked(pod *corev1.Pod) bool {
	for k := range pod.Labels {
		if strings.HasPrefix(k, locksv1.HolderLabelPrefix) {
			return true
		}
	}
	for k := range pod.Annotations {
		if strings.HasPrefix(k, locksv1.OwnerAnnotationPrefix) || strings.HasPrefix(k, locksv1.TokenAnnotationPrefix) {
			return true
		}
	}
	return false
}

// gated reports whether the pod waits behind any lock's gate.
func gated(pod *corev1.Pod) bool {
	for _, g := range pod.Spec.SchedulingGates {
		if strings.HasPrefix(g.Name, locksv1.GatePrefix) {
			return true
		}
	}
	return false
}

// The manager caches every pod of the cluster, so it keeps only the fields
// the controller reads: of the containers their names, no managedFields.
func TestCacheKeepsPodsStripped(t *testing.T) {
	h := startManager(t)
	ns := newNamespace(t)
	pod := createPod(t, ns, "big", "web", gatedBy("l"))
	cached := &corev1.Pod{}
	eventually(t, "the pod to be cached", func() bool {
		return h.cache.Get(context.Background(), client.ObjectKeyFromObject(pod), cached) == nil
	})
	if len(cached.Spec.Containers) != 1 || cached.Spec.Containers[0].Name != "main" || cached.Spec.Containers[0].Image != "" || len(cached.ManagedFields) != 0 {
		t.Fatalf("the cached pod keeps containers %+v and %d managedFields entries, want the names only and none", cached.Spec.Containers, len(cached.ManagedFields))
	}
	if cached.Labels["app"] != "web" || !gatedWith(cached, gateFor("l")) || cached.UID != pod.UID {
		t.Fatalf("the cached pod lost what the controller reads: %+v", cached.ObjectMeta)
	}
}
