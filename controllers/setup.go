package controllers

import (
	"context"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/selection"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/source"

	locksv1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/controllers/decide"
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
// publishes, each event queueing the keys it concerns. It also registers
// the gate checker (gates.go).
func (r *DistributedLockReconciler) SetupWithManager(mgr ctrl.Manager) error {
	if r.APIReader == nil {
		r.APIReader = mgr.GetAPIReader()
	}
	r.lost = make(chan event.TypedGenericEvent[string])
	stopped := make(chan struct{})
	r.stopped = stopped
	r.keyReleases = newShardedReleases(r.Locks.Redis(), r.wake)
	// A stall shows at once on the locks whose keys this process holds:
	// no other event would wake them while they are held steadily.
	r.Locks.stalls.notify(func() {
		for _, key := range r.grants.keys() {
			r.wake(key)
		}
	})
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
	err = builder.TypedControllerManagedBy[KeyRequest](mgr).
		Named("distributedlock").
		Watches(&locksv1.DistributedLock{}, handler.TypedEnqueueRequestsFromMapFunc(keyOfLock)).
		Watches(&locksv1.DistributedLock{}, handler.TypedEnqueueRequestsFromMapFunc(r.keysBesideLock), builder.WithPredicates(lockSpecOrLifeChanged)).
		Watches(&corev1.Pod{}, handler.TypedEnqueueRequestsFromMapFunc(r.keysForPod), builder.WithPredicates(ignoreOwnMarks)).
		WatchesRawSource(source.TypedChannel(r.lost, handler.TypedFuncs[string, KeyRequest]{
			GenericFunc: func(_ context.Context, e event.TypedGenericEvent[string], q workqueue.TypedRateLimitingInterface[KeyRequest]) {
				q.Add(KeyRequest{Key: e.Object})
			},
		})).
		// Keys are independent; the queue never runs one key twice at once.
		// controller-runtime's priority queue (v0.24.1) can deadlock on
		// stop: a worker that left on shutdown still counts as waiting, so
		// the queue blocks handing it an item while holding the lock the
		// other workers' Done needs, and the manager never stops. The plain
		// workqueue has no such state.
		WithOptions(controller.TypedOptions[KeyRequest]{
			MaxConcurrentReconciles: workers, UsePriorityQueue: ptr.To(false), RateLimiter: newAPIBackoff(),
			LogConstructor: func(req *KeyRequest) logr.Logger {
				l := mgr.GetLogger().WithValues("controller", "distributedlock")
				if req != nil {
					l = l.WithValues("key", req.Key)
				}
				return l
			},
		}).
		Complete(r)
	if err != nil {
		return err
	}
	return (&gateChecker{r: r}).setupWithManager(mgr)
}

// keyOfLock queues the key a lock names.
func keyOfLock(_ context.Context, obj client.Object) []KeyRequest {
	lock, ok := obj.(*locksv1.DistributedLock)
	if !ok {
		return nil
	}
	return []KeyRequest{{Key: effectiveKey(lock)}}
}

// keysBesideLock queues the keys of the locks of the pods behind the lock's
// gate (its own among them, which keyOfLock queues anyway): those they wait
// for, and those they hold while they wait.
// Whether such a pod may be granted a key, or is waiting rather than late
// to start, depends on this lock (whether it exists, is being deleted, is
// in mode Grant, may use its key, selects the pod: gateLocks), and nothing
// else looks at those keys again when this lock changes: a pod waited,
// every key free, until something else happened to them.
func (r *DistributedLockReconciler) keysBesideLock(ctx context.Context, obj client.Object) []KeyRequest {
	var pods corev1.PodList
	if err := r.List(ctx, &pods, client.InNamespace(obj.GetNamespace()), client.MatchingFields{podLocksIndex: obj.GetName()},
		client.UnsafeDisableDeepCopy); err != nil {
		log.FromContext(ctx).Error(err, "cannot list the pods behind a lock's gate", "lock", client.ObjectKeyFromObject(obj))
		return nil
	}
	var keys keyRequests
	for i := range pods.Items {
		if p := &pods.Items[i]; decide.HasGate(p, locksv1.GateFor(obj.GetName())) {
			keys.addNamed(ctx, r, p.Namespace, locksOn(p))
		}
	}
	return keys.list
}

// keyRequests gathers the keys of locks, each once.
type keyRequests struct {
	seen map[string]bool
	list []KeyRequest
}

func (k *keyRequests) add(lock *locksv1.DistributedLock) {
	if k.seen == nil {
		k.seen = map[string]bool{}
	}
	if key := effectiveKey(lock); !k.seen[key] {
		k.seen[key] = true
		k.list = append(k.list, KeyRequest{Key: key})
	}
}

// addNamed adds the keys of the locks of the namespace with these names
// that exist; read-only, so the cache's objects are used as they are.
func (k *keyRequests) addNamed(ctx context.Context, r *DistributedLockReconciler, namespace string, names []string) {
	for _, name := range names {
		lock := &locksv1.DistributedLock{}
		err := r.Get(ctx, client.ObjectKey{Namespace: namespace, Name: name}, lock, client.UnsafeDisableDeepCopy)
		switch {
		case err == nil:
			k.add(lock)
		case !apierrors.IsNotFound(err):
			log.FromContext(ctx).Error(err, "cannot read a lock a pod names", "lock", client.ObjectKey{Namespace: namespace, Name: name})
		}
	}
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

// keysForPod maps a pod to the keys of the locks of its namespace that
// select it, gate it or marked it. Locks in other namespaces sharing a key
// are settled with them, in the same reconcile.
func (r *DistributedLockReconciler) keysForPod(ctx context.Context, obj client.Object) []KeyRequest {
	pod, ok := obj.(*corev1.Pod)
	if !ok {
		return nil
	}
	// The locks whose gate or marks the pod carries.
	var keys keyRequests
	keys.addNamed(ctx, r, pod.Namespace, locksOn(pod))
	// The locks that may select it, by its labels; read-only, so the
	// cache's objects are used as they are.
	for _, value := range append(podLabelPairs(pod), anyLabels) {
		var locks locksv1.DistributedLockList
		if err := r.List(ctx, &locks, client.InNamespace(pod.Namespace), client.MatchingFields{selectsIndex: value},
			client.UnsafeDisableDeepCopy); err != nil {
			log.FromContext(ctx).Error(err, "cannot list the locks that may select a pod", "pod", client.ObjectKeyFromObject(pod))
			continue
		}
		for i := range locks.Items {
			if selects(&locks.Items[i], pod) {
				keys.add(&locks.Items[i])
			}
		}
	}
	return keys.list
}

// podLabelPairs are the pod's labels as "key=value".
func podLabelPairs(pod *corev1.Pod) []string {
	pairs := make([]string, 0, len(pod.Labels)+1)
	for k, v := range pod.Labels {
		pairs = append(pairs, k+"="+v)
	}
	return pairs
}
