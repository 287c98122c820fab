package controllers

import (
	"context"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1 "github.com/lockwarden/lockwarden/api/v1alpha1"
)

// A reconcile reads only the pods that concern its key, found through these
// cache indexes and each lock's candidate selector, so its cost follows the
// locks' pods and not the size of their namespaces (issue 15: a reconcile
// that listed every pod of its namespace spent most of its time doing so).
const (
	// podLocksIndex indexes pods by the names of the locks whose gate or
	// marks they carry, in their namespace.
	podLocksIndex = ".lockwarden.locks"
	// podUIDIndex indexes pods by UID, to find the pods behind the owner
	// IDs Redis shows.
	podUIDIndex = ".metadata.uid"
)

// indexPods registers the pod indexes with the manager's cache.
func indexPods(ctx context.Context, indexer client.FieldIndexer) error {
	if err := indexer.IndexField(ctx, &corev1.Pod{}, podLocksIndex, func(o client.Object) []string {
		return locksOn(o.(*corev1.Pod))
	}); err != nil {
		return err
	}
	return indexer.IndexField(ctx, &corev1.Pod{}, podUIDIndex, func(o client.Object) []string {
		return []string{string(o.GetUID())}
	})
}

// locksOn names the locks whose gate, holder label or annotations the pod
// carries, each once.
func locksOn(pod *corev1.Pod) []string {
	var names []string
	add := func(name string) {
		for _, n := range names {
			if n == name {
				return
			}
		}
		names = append(names, name)
	}
	for _, g := range pod.Spec.SchedulingGates {
		if name, ok := strings.CutPrefix(g.Name, locksv1.GatePrefix); ok {
			add(name)
		}
	}
	for k := range pod.Labels {
		if name, ok := strings.CutPrefix(k, locksv1.HolderLabelPrefix); ok {
			add(name)
		}
	}
	for k := range pod.Annotations {
		for _, prefix := range []string{locksv1.OwnerAnnotationPrefix, locksv1.TokenAnnotationPrefix, locksv1.SinceAnnotationPrefix} {
			if name, ok := strings.CutPrefix(k, prefix); ok {
				add(name)
			}
		}
	}
	return names
}

// podsOf are the cached pods of the lock's namespace that it selects, or
// whose gate or marks of it they carry, each once. They are the cache's own
// objects: they must never be written to (every write starts from a
// DeepCopy of the one pod it changes, see markPods).
func (r *DistributedLockReconciler) podsOf(ctx context.Context, lock *locksv1.DistributedLock) ([]*corev1.Pod, error) {
	var out []*corev1.Pod
	seen := map[types.UID]bool{}
	add := func(list *corev1.PodList) {
		for i := range list.Items {
			if p := &list.Items[i]; !seen[p.UID] {
				seen[p.UID] = true
				out = append(out, p)
			}
		}
	}
	if sel := selectors.get(lock); sel != nil {
		var selected corev1.PodList
		if err := r.List(ctx, &selected, client.InNamespace(lock.Namespace), client.MatchingLabelsSelector{Selector: sel},
			client.UnsafeDisableDeepCopy); err != nil {
			return nil, err
		}
		add(&selected)
	}
	var carrying corev1.PodList
	if err := r.List(ctx, &carrying, client.InNamespace(lock.Namespace), client.MatchingFields{podLocksIndex: lock.Name},
		client.UnsafeDisableDeepCopy); err != nil {
		return nil, err
	}
	add(&carrying)
	return out, nil
}

// podByUID is the cached pod with the UID, or nil. Like podsOf's, it must
// never be written to.
func (r *DistributedLockReconciler) podByUID(ctx context.Context, uid types.UID) (*corev1.Pod, error) {
	var pods corev1.PodList
	if err := r.List(ctx, &pods, client.MatchingFields{podUIDIndex: string(uid)}, client.UnsafeDisableDeepCopy); err != nil {
		return nil, err
	}
	if len(pods.Items) == 0 {
		return nil, nil
	}
	return &pods.Items[0], nil
}
