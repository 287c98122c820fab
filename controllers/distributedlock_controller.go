// Package controllers holds the DistributedLock controller.
package controllers

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	kerrors "k8s.io/apimachinery/pkg/util/errors"
	"k8s.io/client-go/tools/record"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/event"

	locksv1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/pkg/redislock"
)

// redisRetry is how soon a lock is looked at again after Redis failed, and
// how often a lock held by someone the controller cannot watch (an in-pod
// client, another cluster) is checked for release.
const redisRetry = 2 * time.Second

// DistributedLockReconciler grants each DistributedLock to one candidate pod
// at a time and holds it in Redis on the pod's behalf.
type DistributedLockReconciler struct {
	client.Client
	Recorder record.EventRecorder
	Locks    *LockClients
	Metrics  *Metrics

	// lost carries the locks whose lease the controller lost, so they are
	// reconciled at once.
	lost chan event.GenericEvent
	// stopped closes when the manager stops, so nothing blocks on lost.
	stopped <-chan struct{}

	mu   sync.Mutex
	held map[types.NamespacedName]*grant // leases the controller holds
}

// grant is a lease the controller holds for a pod.
type grant struct {
	mutex  *redislock.Mutex
	lease  *redislock.Hold
	podUID types.UID
}

// +kubebuilder:rbac:groups=locks.lockwarden.dev,resources=distributedlocks,verbs=get;list;watch;patch
// +kubebuilder:rbac:groups=locks.lockwarden.dev,resources=distributedlocks/status,verbs=get;patch
// +kubebuilder:rbac:groups=locks.lockwarden.dev,resources=distributedlocks/finalizers,verbs=update
// +kubebuilder:rbac:groups="",resources=pods,verbs=get;list;watch;patch
// +kubebuilder:rbac:groups="",resources=events,verbs=create;patch

// Reconcile loads the lock, defers its status patch, and dispatches.
func (r *DistributedLockReconciler) Reconcile(ctx context.Context, req ctrl.Request) (result ctrl.Result, retErr error) {
	lock := &locksv1.DistributedLock{}
	if err := r.Get(ctx, req.NamespacedName, lock); err != nil {
		if apierrors.IsNotFound(err) {
			r.forget(req.NamespacedName)
			r.Metrics.forget(req.NamespacedName)
		}
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	before := lock.DeepCopy()
	defer func() {
		if err := r.patchStatus(ctx, before, lock); err != nil {
			retErr = kerrors.NewAggregate([]error{retErr, err})
		}
	}()

	if !lock.DeletionTimestamp.IsZero() {
		return r.reconcileDelete(ctx, lock)
	}
	if !controllerutil.ContainsFinalizer(lock, locksv1.Finalizer) {
		patch := client.MergeFromWithOptions(lock.DeepCopy(), client.MergeFromWithOptimisticLock{})
		controllerutil.AddFinalizer(lock, locksv1.Finalizer)
		if err := r.Patch(ctx, lock, patch); err != nil {
			return ctrl.Result{}, err
		}
	}
	return r.reconcileLock(ctx, lock)
}

// reconcileLock brings Redis, the pods and the status in line: it releases
// holders whose pods terminated, grants the lock to the next candidate, and
// marks the holder pod.
func (r *DistributedLockReconciler) reconcileLock(ctx context.Context, lock *locksv1.DistributedLock) (ctrl.Result, error) {
	lock.Status.Key = effectiveKey(lock)
	locks, err := r.Locks.For(termsOf(lock))
	if err != nil {
		setCondition(lock, locksv1.ConditionReady, metav1.ConditionFalse, "InvalidLeaseTerms", err.Error())
		return ctrl.Result{}, nil // only a new spec can fix it
	}
	pods, err := r.candidates(ctx, lock)
	if err != nil {
		return ctrl.Result{}, err
	}
	info, err := locks.Inspect(ctx, lock.Status.Key)
	if err != nil {
		setCondition(lock, locksv1.ConditionReady, metav1.ConditionFalse, "RedisUnavailable", err.Error())
		return ctrl.Result{RequeueAfter: redisRetry}, nil
	}
	setCondition(lock, locksv1.ConditionReady, metav1.ConditionTrue, "RedisReachable", "Redis answered, and the spec is valid")

	r.checkLost(ctx, lock)
	holders, err := r.resolveHolders(ctx, lock, info)
	if err != nil {
		return ctrl.Result{}, err
	}
	if holders, err = r.releaseTerminated(ctx, lock, locks, holders); err != nil {
		return r.redisFailed(lock, err)
	}
	if len(holders) == 0 {
		if holders, err = r.grantNext(ctx, lock, locks, pods); err != nil {
			return r.redisFailed(lock, err)
		}
	} else if err := r.adopt(ctx, lock, locks, holders[0]); err != nil {
		return r.redisFailed(lock, err)
	}
	if err := r.markPods(ctx, lock, holders); err != nil {
		return ctrl.Result{}, err
	}
	r.updateStatus(lock, holders, pods)

	// A controller-granted lease needs no polling: its loss arrives on the
	// lost channel, and its pod's end as a pod event. Anyone else's hold
	// may end without an event the controller can see.
	if len(holders) > 0 && !holders[0].grantedByController() {
		return ctrl.Result{RequeueAfter: redisRetry}, nil
	}
	return ctrl.Result{}, nil
}

func (r *DistributedLockReconciler) redisFailed(lock *locksv1.DistributedLock, err error) (ctrl.Result, error) {
	if errors.Is(err, redislock.ErrUnavailable) || errors.Is(err, redislock.ErrClosed) {
		setCondition(lock, locksv1.ConditionReady, metav1.ConditionFalse, "RedisUnavailable", err.Error())
		return ctrl.Result{RequeueAfter: redisRetry}, nil
	}
	return ctrl.Result{}, err
}

// reconcileDelete releases the controller's hold in Redis, unmarks the
// holder pod and lets the resource go.
func (r *DistributedLockReconciler) reconcileDelete(ctx context.Context, lock *locksv1.DistributedLock) (ctrl.Result, error) {
	if !controllerutil.ContainsFinalizer(lock, locksv1.Finalizer) {
		return ctrl.Result{}, nil
	}
	locks, err := r.Locks.For(termsOf(lock))
	if err == nil && lock.Status.Key != "" && lock.Status.Holder != nil && lock.Status.Holder.GrantedByController {
		if _, err := locks.ForceRelease(ctx, lock.Status.Key, lock.Status.Holder.PodUID); err != nil {
			return r.redisFailed(lock, err)
		}
		r.Recorder.Eventf(lock, corev1.EventTypeNormal, "Released", "Released %s from pod %s: the DistributedLock is being deleted", lock.Status.Key, lock.Status.Holder.PodName)
		r.Metrics.transition(lock, "released")
	}
	r.forget(client.ObjectKeyFromObject(lock))
	if err := r.markPods(ctx, lock, nil); err != nil {
		return ctrl.Result{}, err
	}
	patch := client.MergeFromWithOptions(lock.DeepCopy(), client.MergeFromWithOptimisticLock{})
	controllerutil.RemoveFinalizer(lock, locksv1.Finalizer)
	return ctrl.Result{}, client.IgnoreNotFound(r.Patch(ctx, lock, patch))
}

// patchStatus writes the status if, and only if, it changed, so holding a
// lock steadily writes nothing to the API server.
func (r *DistributedLockReconciler) patchStatus(ctx context.Context, before, lock *locksv1.DistributedLock) error {
	if !lock.DeletionTimestamp.IsZero() && !controllerutil.ContainsFinalizer(lock, locksv1.Finalizer) {
		return nil // gone
	}
	lock.Status.ObservedGeneration = lock.Generation
	for i := range lock.Status.Conditions {
		lock.Status.Conditions[i].ObservedGeneration = lock.Generation
	}
	if equality.Semantic.DeepEqual(before.Status, lock.Status) {
		return nil
	}
	return client.IgnoreNotFound(r.Status().Patch(ctx, lock, client.MergeFrom(before)))
}

func setCondition(lock *locksv1.DistributedLock, condition string, status metav1.ConditionStatus, reason, message string) {
	meta.SetStatusCondition(&lock.Status.Conditions, metav1.Condition{
		Type: condition, Status: status, Reason: reason, Message: message, ObservedGeneration: lock.Generation,
	})
}

// effectiveKey is spec.key, or "<namespace>/<name>".
func effectiveKey(lock *locksv1.DistributedLock) string {
	if lock.Spec.Key != "" {
		return lock.Spec.Key
	}
	return lock.Namespace + "/" + lock.Name
}

func termsOf(lock *locksv1.DistributedLock) leaseTerms {
	t := leaseTerms{lease: 30 * time.Second} // the API's default
	if lock.Spec.LeaseDuration != nil {
		t.lease = lock.Spec.LeaseDuration.Duration
	}
	t.renew = t.lease / 3
	if lock.Spec.RenewInterval != nil {
		t.renew = lock.Spec.RenewInterval.Duration
	}
	return t
}

// ownerFor is the owner ID under which the controller holds a lock for a pod.
func ownerFor(podUID types.UID) redislock.Owner {
	return redislock.Owner(fmt.Sprintf("%s:%d", podUID, controllerOwnerN))
}

// controllerOwnerN ends the owner IDs of the controller's holds, "<uid>:0".
// In-pod clients number their owners from 1.
const controllerOwnerN = 0
