package controllers

import (
	"context"
	"strings"
	"sync"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1 "github.com/lockwarden/lockwarden/api/v1alpha1"
)

// A reconcile reads only the pods that concern its key, never every pod of
// a namespace, and copies none of them. It finds them through each lock's
// candidate selector (the cache matches it against the labels of the
// namespace's pods and deep-copies none), the podLocksIndex of the cache,
// and podNames.

// podLocksIndex indexes pods by the names of the locks whose gate or marks
// they carry, in their namespace.
const podLocksIndex = ".lockwarden.locks"

// indexPods registers podLocksIndex with the manager's cache and keeps
// names up to date from the pod informer.
func indexPods(ctx context.Context, c cache.Cache, names *podNames) error {
	if err := c.IndexField(ctx, &corev1.Pod{}, podLocksIndex, func(o client.Object) []string {
		return locksOn(o.(*corev1.Pod))
	}); err != nil {
		return err
	}
	informer, err := c.GetInformer(ctx, &corev1.Pod{})
	if err != nil {
		return err
	}
	_, err = informer.AddEventHandler(names)
	return err
}

// podNames maps the UIDs of the cached pods to their names, to find the
// pods behind the owner IDs Redis shows. It is kept from the informer's
// events rather than as a cache field index, which every cached pod would
// pay for: measured with 100,000 pods, such an index (two sets of one
// element each, for the namespace and for all namespaces) costs about 700
// bytes a pod, and this map 65, plus at most the strings of a pod's first
// version that it keeps alive.
type podNames struct {
	mu sync.RWMutex
	m  map[types.UID]types.NamespacedName
}

func (n *podNames) OnAdd(obj any, _ bool) {
	if p, ok := obj.(*corev1.Pod); ok {
		n.mu.Lock()
		defer n.mu.Unlock()
		if n.m == nil {
			n.m = map[types.UID]types.NamespacedName{}
		}
		n.m[p.UID] = types.NamespacedName{Namespace: p.Namespace, Name: p.Name}
	}
}

// OnUpdate has nothing to do: a pod's UID and name never change.
func (n *podNames) OnUpdate(_, _ any) {}

func (n *podNames) OnDelete(obj any) {
	if d, ok := obj.(toolscache.DeletedFinalStateUnknown); ok {
		obj = d.Obj
	}
	if p, ok := obj.(*corev1.Pod); ok {
		n.mu.Lock()
		defer n.mu.Unlock()
		delete(n.m, p.UID)
	}
}

func (n *podNames) get(uid types.UID) (types.NamespacedName, bool) {
	n.mu.RLock()
	defer n.mu.RUnlock()
	name, ok := n.m[uid]
	return name, ok
}

// locksOn names the locks whose gate, holder label or annotations the pod
// carries, or that it names (locksv1.NamedLocks), each once.
func locksOn(pod *corev1.Pod) []string {
	names := locksv1.NamedLocks(pod.Labels, pod.Annotations)
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
		for _, prefix := range locksv1.MarkAnnotationPrefixes {
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
	name, ok := r.podNames.get(uid)
	if !ok {
		return nil, nil
	}
	pod := &corev1.Pod{}
	if err := r.Get(ctx, name, pod, client.UnsafeDisableDeepCopy); err != nil || pod.UID != uid {
		return nil, client.IgnoreNotFound(err)
	}
	return pod, nil
}
