// Package controllers holds the DistributedLock controller.
//
// The reconciler is shaped like cluster-api's: each reconcile builds a scope
// once (scope.go: the locks naming one Redis key, their candidate pods, the
// holders as Redis and the pods show them, and the controller's grants), runs
// named phases over it (holders.go: release and keep grants; grant.go: grant
// the next candidate; marks.go: the pods' marks and gates), and computes the
// status from the scope at the end (status.go). The unit of work is the key,
// not the resource: every lock naming a key agrees on one holder and one
// waiting order, so one reconcile settles them all.
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
	"sigs.k8s.io/controller-runtime/pkg/log"

	locksv1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/pkg/redislock"
)

// DistributedLockReconciler grants each Redis key named by DistributedLocks
// to one candidate pod at a time and holds it in Redis on the pod's behalf.
type DistributedLockReconciler struct {
	client.Client
	// APIReader reads past the cache. Before the controller ungates a pod,
	// it confirms there that no other pod still holds a grant of the key,
	// so a stale cache cannot let two guarded pods run.
	APIReader client.Reader
	Recorder  record.EventRecorder
	Locks     *LockClients
	Metrics   *Metrics
	// Keys says which keys outside its own a namespace may use.
	Keys KeyPolicy
	// MaxConcurrentReconciles is how many keys are settled at once;
	// 0 means DefaultMaxConcurrentReconciles.
	MaxConcurrentReconciles int

	// lost carries the locks whose lease the controller lost, or whose key
	// Redis published a release of, so they are reconciled at once.
	lost chan event.GenericEvent
	// stopped closes when the manager stops, so nothing blocks on lost.
	stopped <-chan struct{}
	// keyReleases listens for single keys' releases on a Cluster with
	// sharded pub/sub, where watchReleases hears none; nil elsewhere.
	keyReleases *shardedReleases

	grants   grants
	keys     keyMutex
	podNames podNames
	backoff  redisBackoff
	// unwatchedWarned are, by key, the running pods outside the pod cache
	// that a HolderNotWatched Event was sent for (pollUnwatched).
	unwatchedWarned sync.Map // string -> map[types.UID]bool
}

// +kubebuilder:rbac:groups=locks.lockwarden.dev,resources=distributedlocks,verbs=get;list;watch;patch
// +kubebuilder:rbac:groups=locks.lockwarden.dev,resources=distributedlocks/status,verbs=get;patch
// +kubebuilder:rbac:groups=locks.lockwarden.dev,resources=distributedlocks/finalizers,verbs=update
// +kubebuilder:rbac:groups="",resources=pods,verbs=get;list;watch;patch
// +kubebuilder:rbac:groups="",resources=events,verbs=create;patch

// Reconcile settles the key the lock names: it loads the scope, runs the
// phases, and writes the status of every lock naming the key.
func (r *DistributedLockReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	lock := &locksv1.DistributedLock{}
	if err := r.Get(ctx, req.NamespacedName, lock); err != nil {
		if apierrors.IsNotFound(err) {
			r.Metrics.forget(req.NamespacedName)
		}
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	key := effectiveKey(lock)
	// One reconcile per key at a time: locks sharing a key are settled
	// together, and two workers must not grant it to two pods.
	defer r.keys.lock(key)()

	if !lock.DeletionTimestamp.IsZero() {
		return r.reconcileDelete(ctx, lock, key)
	}
	if !controllerutil.ContainsFinalizer(lock, locksv1.Finalizer) {
		patch := client.MergeFromWithOptions(lock.DeepCopy(), client.MergeFromWithOptimisticLock{})
		controllerutil.AddFinalizer(lock, locksv1.Finalizer)
		if err := r.Patch(ctx, lock, patch); err != nil {
			return ctrl.Result{}, err
		}
	}
	if !r.Keys.Permits(lock.Namespace, key) {
		before := lock.DeepCopy()
		lock.Status.Key = key
		lock.Status.Waiting, lock.Status.WaitingCount = nil, 0
		// A grant made while the key was shared with the namespace stays
		// recorded until its pod stops: the record, which the tenant cannot
		// write, is what says the hold in Redis is that grant (granteeOf).
		if !r.grantRunning(ctx, lock) {
			lock.Status.Holder = nil
		}
		setCondition(lock, locksv1.ConditionReady, metav1.ConditionFalse, "KeyNotPermitted", fmt.Sprintf(
			"spec.key %q is outside this namespace's keys (%s/...); use one of those, or ask the cluster administrator to share the key with this namespace (the manager's --shared-key flag)", key, lock.Namespace))
		for _, c := range []string{locksv1.ConditionHeld, locksv1.ConditionConflict, locksv1.ConditionHolderStarted} {
			meta.RemoveStatusCondition(&lock.Status.Conditions, c)
		}
		if err := r.patchStatus(ctx, before, lock); err != nil {
			return ctrl.Result{}, err
		}
		// The key is still settled: a grant made to this namespace's pods
		// before the key was un-shared is kept until its pod stops, and
		// this lock's pod events are what say it has.
	}

	s, err := r.loadScope(ctx, key)
	if err != nil {
		return ctrl.Result{}, err
	}
	result, err := r.runPhases(ctx, s)
	return result, kerrors.NewAggregate([]error{err, r.patchStatuses(ctx, s)})
}

// runPhases runs the phases in order. A Redis failure stops them and is
// shown in the Ready condition; the statuses are still written.
func (r *DistributedLockReconciler) runPhases(ctx context.Context, s *scope) (ctrl.Result, error) {
	if s.redisErr != nil {
		return r.redisFailed(ctx, s, s.redisErr)
	}
	if s.notALock {
		r.backoff.succeeded(s.key)
		return ctrl.Result{}, nil // only a new key can fix it
	}
	for _, phase := range []struct {
		name string
		run  func(context.Context, *scope) error
	}{
		{"release stopped holders", r.releaseStopped},
		{"keep grants", r.keepGrants},
		{"grant", r.grantNext},
		{"mark pods", r.markPods},
		{"watch startup", r.watchStartup},
	} {
		if err := phase.run(ctx, s); err != nil {
			if isRedisError(err) {
				return r.redisFailed(ctx, s, err)
			}
			return ctrl.Result{}, fmt.Errorf("%s: %w", phase.name, err)
		}
	}
	r.backoff.succeeded(s.key)
	r.computeStatuses(s)
	// A grant the controller keeps needs no polling: its loss arrives on
	// the lost channel, and its pod's end as a pod event. Anyone else's
	// hold (even one under a controller owner ID that is no grant it
	// keeps) ends by a release, which Redis publishes (watchReleases), or
	// by its lease running out, which it does not.
	if h := s.holders; len(h) > 0 && (s.conflict || s.grantee == nil || h[0].podUID != s.grantee.UID) {
		s.requeue(pollAfter(s.info.TTL))
		r.keyReleases.watch(ctx, s.key)
	} else {
		r.keyReleases.unwatch(s.key)
	}
	// Nor does an unwatched pod's end arrive as an event.
	r.pollUnwatched(ctx, s)
	return ctrl.Result{RequeueAfter: s.after}, nil
}

func isRedisError(err error) bool {
	return errors.Is(err, redislock.ErrUnavailable) || errors.Is(err, redislock.ErrClosed)
}

// redisFailed logs the Redis error and shows a redacted one: a condition
// never echoes what Redis said, which could tell a tenant about keys that
// are not theirs.
func (r *DistributedLockReconciler) redisFailed(ctx context.Context, s *scope, err error) (ctrl.Result, error) {
	if !isRedisError(err) {
		return ctrl.Result{}, err
	}
	log.FromContext(ctx).Error(err, "Redis failed", "key", s.key)
	for _, l := range s.locks {
		setCondition(l, locksv1.ConditionReady, metav1.ConditionFalse, "RedisUnavailable",
			"Redis did not answer, or refused the lock's commands; the manager's log has the error")
	}
	return ctrl.Result{RequeueAfter: r.backoff.failed(s.key)}, nil
}

// patchStatuses writes the status of every lock in the scope that changed.
func (r *DistributedLockReconciler) patchStatuses(ctx context.Context, s *scope) error {
	var errs []error
	for _, l := range s.locks {
		errs = append(errs, r.patchStatus(ctx, s.before[client.ObjectKeyFromObject(l)], l))
	}
	return kerrors.NewAggregate(errs)
}

// patchStatus writes the status if, and only if, it changed, so holding a
// lock steadily writes nothing to the API server.
func (r *DistributedLockReconciler) patchStatus(ctx context.Context, before, lock *locksv1.DistributedLock) error {
	lock.Status.ObservedGeneration = lock.Generation
	for i := range lock.Status.Conditions {
		lock.Status.Conditions[i].ObservedGeneration = lock.Generation
	}
	if equality.Semantic.DeepEqual(before.Status, lock.Status) {
		return nil
	}
	return client.IgnoreNotFound(r.Status().Patch(ctx, lock, client.MergeFrom(before)))
}

// reconcileDelete releases the grants the lock made, unmarks its pods and
// lets the resource go. It reads the pods and Redis, never the status, so a
// lock deleted before its status was written still releases what it holds.
func (r *DistributedLockReconciler) reconcileDelete(ctx context.Context, lock *locksv1.DistributedLock, key string) (ctrl.Result, error) {
	if !controllerutil.ContainsFinalizer(lock, locksv1.Finalizer) {
		return ctrl.Result{}, nil
	}
	if r.Keys.Permits(lock.Namespace, key) {
		s, err := r.loadScope(ctx, key)
		if err != nil {
			return ctrl.Result{}, err
		}
		if s.redisErr == nil && !s.notALock {
			err = r.releaseGrantsOf(ctx, s, lock)
		} else {
			err = s.redisErr
		}
		if err != nil {
			before := lock.DeepCopy()
			if isRedisError(err) {
				log.FromContext(ctx).Error(err, "cannot release the lock being deleted", "key", key)
				setCondition(lock, locksv1.ConditionReady, metav1.ConditionFalse, "RedisUnavailable",
					"Redis did not answer, so the lock cannot be released; it is retried. If Redis is gone for good, remove the finalizer by hand (see the README)")
				return ctrl.Result{RequeueAfter: r.backoff.failed(key)}, r.patchStatus(ctx, before, lock)
			}
			return ctrl.Result{}, err
		}
		if err := r.patchStatuses(ctx, s); err != nil {
			return ctrl.Result{}, err
		}
	}
	r.backoff.succeeded(key)
	r.keyReleases.unwatch(key) // the key's other locks, if any, watch it again
	patch := client.MergeFromWithOptions(lock.DeepCopy(), client.MergeFromWithOptimisticLock{})
	controllerutil.RemoveFinalizer(lock, locksv1.Finalizer)
	return ctrl.Result{}, client.IgnoreNotFound(r.Patch(ctx, lock, patch))
}

// grantRunning reports whether the lock's status records a grant to a pod
// that still exists and has not stopped.
func (r *DistributedLockReconciler) grantRunning(ctx context.Context, lock *locksv1.DistributedLock) bool {
	h := lock.Status.Holder
	if h == nil || !h.GrantedByController || h.PodName == "" {
		return false
	}
	pod := &corev1.Pod{}
	err := r.Get(ctx, client.ObjectKey{Namespace: lock.Namespace, Name: h.PodName}, pod)
	return err == nil && string(pod.UID) == h.PodUID && !stopped(pod)
}

func setCondition(lock *locksv1.DistributedLock, condition string, status metav1.ConditionStatus, reason, message string) {
	meta.SetStatusCondition(&lock.Status.Conditions, metav1.Condition{
		Type: condition, Status: status, Reason: reason, Message: message, ObservedGeneration: lock.Generation,
	})
}

// effectiveKey is spec.key, or "<namespace>/<name>". It never comes from
// the status, which a lock naming another key could not be trusted with.
func effectiveKey(lock *locksv1.DistributedLock) string {
	if lock.Spec.Key != "" {
		return lock.Spec.Key
	}
	return lock.Namespace + "/" + lock.Name
}

// termsOf is the lock's lease and renewal interval, as the controller holds
// it. The renewal interval is bounded below by maxRenewRate: the API allows
// 100ms, and thousands of locks renewed that often would be all of Redis's
// load, for no gain in safety once a lease has room for two more renewals.
func termsOf(lock *locksv1.DistributedLock) leaseTerms {
	t := leaseTerms{lease: 30 * time.Second} // the API's default
	if lock.Spec.LeaseDuration != nil {
		t.lease = lock.Spec.LeaseDuration.Duration
	}
	t.renew = t.lease / 3
	if lock.Spec.RenewInterval != nil {
		t.renew = lock.Spec.RenewInterval.Duration
	}
	t.renew = max(t.renew, min(maxRenewRate, t.lease/3))
	return t
}

// maxRenewRate is the shortest renewal interval the controller uses, unless
// the lease is under three times as long: then a third of the lease.
const maxRenewRate = time.Second

// ownerFor is the owner ID under which the controller holds a lock for a pod.
func ownerFor(podUID types.UID) redislock.Owner {
	return redislock.Owner(fmt.Sprintf("%s:%d", podUID, controllerOwnerN))
}

// controllerOwnerN ends the owner IDs of the controller's holds, "<uid>:0".
// In-pod clients number their owners from 1.
const controllerOwnerN = 0

// eventf records an Event on each lock of the scope in the namespace, so a
// namespace only ever reads about its own pods.
func (r *DistributedLockReconciler) eventf(s *scope, namespace, eventType, reason, format string, args ...any) {
	for _, l := range s.locks {
		if l.Namespace == namespace {
			r.Recorder.Eventf(l, eventType, reason, format, args...)
		}
	}
}
