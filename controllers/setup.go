package controllers

import (
	"context"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/selection"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	locksv1 "github.com/lockwarden/lockwarden/api/v1alpha1"
)

// keyIndex indexes DistributedLocks by the key they name, after defaulting,
// so the locks sharing a key are found together.
const keyIndex = ".lockwarden.key"

// DefaultMaxConcurrentReconciles is how many keys the controller settles at
// once unless told otherwise. Keys are independent, so a few workers keep a
// slow Redis round trip or API write on one key from delaying the others.
const DefaultMaxConcurrentReconciles = 4

// SetupWithManager registers the controller: it watches DistributedLocks,
// the pods they may concern, the leases it loses and the releases Redis
// publishes.
func (r *DistributedLockReconciler) SetupWithManager(mgr ctrl.Manager) error {
	if r.APIReader == nil {
		r.APIReader = mgr.GetAPIReader()
	}
	r.lost = make(chan event.GenericEvent)
	stopped := make(chan struct{})
	r.stopped = stopped
	r.keyReleases = newShardedReleases(r.Locks.Redis(), r.wake)
	if err := mgr.Add(manager.RunnableFunc(func(ctx context.Context) error {
		<-ctx.Done()
		close(stopped)
		r.keyReleases.close()
		return nil
	})); err != nil {
		return err
	}
	if err := mgr.Add(manager.RunnableFunc(r.watchReleases)); err != nil {
		return err
	}
	if err := mgr.GetFieldIndexer().IndexField(context.Background(), &locksv1.DistributedLock{}, keyIndex, func(o client.Object) []string {
		return []string{effectiveKey(o.(*locksv1.DistributedLock))}
	}); err != nil {
		return err
	}
	if err := mgr.GetFieldIndexer().IndexField(context.Background(), &locksv1.DistributedLock{}, selectsIndex, func(o client.Object) []string {
		return selectsIndexValues(o.(*locksv1.DistributedLock))
	}); err != nil {
		return err
	}
	locks, err := mgr.GetCache().GetInformer(context.Background(), &locksv1.DistributedLock{})
	if err != nil {
		return err
	}
	if _, err := locks.AddEventHandler(&selectors); err != nil {
		return err
	}
	if err := indexPods(context.Background(), mgr.GetCache(), &r.podNames); err != nil {
		return err
	}
	workers := r.MaxConcurrentReconciles
	if workers == 0 {
		workers = DefaultMaxConcurrentReconciles
	}
	return ctrl.NewControllerManagedBy(mgr).
		For(&locksv1.DistributedLock{}).
		Watches(&corev1.Pod{}, handler.EnqueueRequestsFromMapFunc(r.locksForPod), builder.WithPredicates(ignoreOwnMarks)).
		WatchesRawSource(source.Channel(r.lost, &handler.EnqueueRequestForObject{})).
		Named("distributedlock").
		// Keys are independent; reconciles of one key are serialised.
		// controller-runtime's priority queue (v0.24.1) can deadlock on
		// stop: a worker that left on shutdown still counts as waiting, so
		// the queue blocks handing it an item while holding the lock the
		// other workers' Done needs, and the manager never stops (seen in
		// TestUnsharingAKeyKeepsARunningGrant's goroutine dump). The plain
		// workqueue has no such state.
		WithOptions(controller.Options{MaxConcurrentReconciles: workers, UsePriorityQueue: ptr.To(false)}).
		Complete(r)
}

// selectsIndex indexes locks by one "key=value" label their candidate
// selector requires (in matchLabels, or In with one value), or by
// anyLabels if it requires none: a pod event then looks up the locks by the
// pod's own labels, rather than checking every lock of the namespace.
const selectsIndex = ".lockwarden.selects"

// anyLabels is the selectsIndex value of locks whose selector may select a
// pod whatever label it has; "*" is no label's key.
const anyLabels = "*"

func selectsIndexValues(lock *locksv1.DistributedLock) []string {
	selector := selectors.get(lock)
	if selector == nil {
		return nil // selects nothing
	}
	requirements, _ := selector.Requirements()
	for _, req := range requirements {
		switch values := req.Values(); req.Operator() {
		case selection.Equals, selection.DoubleEquals, selection.In:
			if values.Len() == 1 {
				return []string{req.Key() + "=" + values.UnsortedList()[0]}
			}
		}
	}
	return []string{anyLabels}
}

// locksForPod maps a pod to the locks of its namespace that select it, gate
// it or marked it. Locks in other namespaces sharing a key are settled with
// them, in the same reconcile.
func (r *DistributedLockReconciler) locksForPod(ctx context.Context, obj client.Object) []reconcile.Request {
	pod, ok := obj.(*corev1.Pod)
	if !ok {
		return nil
	}
	var requests []reconcile.Request
	seen := map[string]bool{}
	add := func(name string) {
		if !seen[name] {
			seen[name] = true
			requests = append(requests, reconcile.Request{NamespacedName: types.NamespacedName{Namespace: pod.Namespace, Name: name}})
		}
	}
	// The locks whose gate or marks the pod carries, which a reconcile of a
	// lock that does not exist ignores.
	for _, name := range locksOn(pod) {
		add(name)
	}
	// The locks that may select it, by its labels; read-only, so the
	// cache's objects are used as they are.
	for _, value := range append(podLabelPairs(pod), anyLabels) {
		var locks locksv1.DistributedLockList
		if err := r.List(ctx, &locks, client.InNamespace(pod.Namespace), client.MatchingFields{selectsIndex: value},
			client.UnsafeDisableDeepCopy); err != nil {
			return nil
		}
		for i := range locks.Items {
			if selects(&locks.Items[i], pod) {
				add(locks.Items[i].Name)
			}
		}
	}
	return requests
}

// podLabelPairs are the pod's labels as "key=value".
func podLabelPairs(pod *corev1.Pod) []string {
	pairs := make([]string, 0, len(pod.Labels)+1)
	for k, v := range pod.Labels {
		pairs = append(pairs, k+"="+v)
	}
	return pairs
}
