package controllers

import (
	"context"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	locksv1 "github.com/lockwarden/lockwarden/api/v1alpha1"
)

// podUIDIndex indexes pods by UID, to map owner IDs to pods.
const podUIDIndex = "metadata.uid"

// SetupWithManager registers the controller: it watches DistributedLocks,
// the pods they may concern, and the leases it loses.
func (r *DistributedLockReconciler) SetupWithManager(mgr ctrl.Manager) error {
	r.held = map[types.NamespacedName]*grant{}
	r.lost = make(chan event.GenericEvent)
	stopped := make(chan struct{})
	r.stopped = stopped
	if err := mgr.Add(manager.RunnableFunc(func(ctx context.Context) error {
		<-ctx.Done()
		close(stopped)
		return nil
	})); err != nil {
		return err
	}
	if err := mgr.GetFieldIndexer().IndexField(context.Background(), &corev1.Pod{}, podUIDIndex, func(o client.Object) []string {
		return []string{string(o.GetUID())}
	}); err != nil {
		return err
	}
	return ctrl.NewControllerManagedBy(mgr).
		For(&locksv1.DistributedLock{}).
		Watches(&corev1.Pod{}, handler.EnqueueRequestsFromMapFunc(r.locksForPod)).
		WatchesRawSource(source.Channel(r.lost, &handler.EnqueueRequestForObject{})).
		Named("distributedlock").
		// Locks are independent; one lock is never reconciled twice at once.
		WithOptions(controller.Options{MaxConcurrentReconciles: 4}).
		Complete(r)
}

// locksForPod maps a pod to the locks it is a candidate for and the locks
// it holds.
func (r *DistributedLockReconciler) locksForPod(ctx context.Context, obj client.Object) []reconcile.Request {
	var locks locksv1.DistributedLockList
	if err := r.List(ctx, &locks); err != nil {
		return nil
	}
	var requests []reconcile.Request
	for i := range locks.Items {
		lock := &locks.Items[i]
		holds := lock.Status.Holder != nil && types.UID(lock.Status.Holder.PodUID) == obj.GetUID()
		if holds || (lock.Namespace == obj.GetNamespace() && selects(lock, obj)) {
			requests = append(requests, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(lock)})
		}
	}
	return requests
}

func selects(lock *locksv1.DistributedLock, obj client.Object) bool {
	selector, err := metav1.LabelSelectorAsSelector(lock.Spec.Candidates.LabelSelector())
	return err == nil && selector.Matches(labels.Set(obj.GetLabels()))
}
