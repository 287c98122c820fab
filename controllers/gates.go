package controllers

import (
	"context"
	"fmt"
	"strings"
	"sync"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	locksv1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/controllers/decide"
)

// gateProblem is why one of a pod's lockwarden gates cannot be lifted as
// things stand. A pod with one takes no key at all: it could not start.
type gateProblem struct {
	reason, message string
	// lock is the gate's lock when it exists, to be told too.
	lock *locksv1.DistributedLock
}

// gateLocks are the locks whose gates the pod carries, and what keeps any
// of them from lifting its gate: the lock does not exist or is being
// deleted, takes no grants (mode Observe), names a key the namespace may
// not use, or does not select the pod. It reads the cache's own objects,
// which must not be written to.
func (r *DistributedLockReconciler) gateLocks(ctx context.Context, pod *corev1.Pod) ([]*locksv1.DistributedLock, []gateProblem, error) {
	names, _ := decide.OurGates(pod)
	var locks []*locksv1.DistributedLock
	var problems []gateProblem
	for _, name := range names {
		l := &locksv1.DistributedLock{}
		err := r.Get(ctx, client.ObjectKey{Namespace: pod.Namespace, Name: name}, l, client.UnsafeDisableDeepCopy)
		gate := locksv1.GateFor(name)
		switch {
		case apierrors.IsNotFound(err):
			problems = append(problems, gateProblem{reason: "LockNotFound", message: fmt.Sprintf(
				"scheduling gate %s names no DistributedLock %q in namespace %s: create the lock, or remove the gate", gate, name, pod.Namespace)})
		case err != nil:
			return nil, nil, err
		case !l.DeletionTimestamp.IsZero():
			problems = append(problems, gateProblem{reason: "LockDeleting", lock: l, message: fmt.Sprintf(
				"DistributedLock %s is being deleted and lifts no more gates: remove the gate %s, or delete the pod", name, gate)})
		case l.Spec.Observes():
			problems = append(problems, gateProblem{reason: "LockObserves", lock: l, message: fmt.Sprintf(
				"DistributedLock %s is in mode Observe, whose candidates take the lock themselves: it lifts no gate, so remove %s", name, gate)})
		case !r.Keys.Permits(l.Namespace, effectiveKey(l)):
			problems = append(problems, gateProblem{reason: "KeyNotPermitted", lock: l, message: fmt.Sprintf(
				"DistributedLock %s names key %q, which namespace %s may not use, so it lifts no gate (see the lock's Ready condition)", name, effectiveKey(l), pod.Namespace)})
		case !selects(l, pod):
			problems = append(problems, gateProblem{reason: "NotSelected", lock: l, message: fmt.Sprintf(
				"DistributedLock %s does not select this pod (its spec.candidates), so it never grants it the lock: give the pod the labels it selects, or remove the gate %s", name, gate)})
		default:
			locks = append(locks, l)
		}
	}
	return locks, problems, nil
}

// gateChecker tells each pod behind a lockwarden gate, within moments, why
// a gate of it cannot be lifted as things stand (gateLocks): a Warning Event
// on the pod, and one on the lock when there is one. A pod that waits is
// then never left waiting unexplained, even when no lock's reconcile ever
// looks at it (its gate names no lock). It tells each problem once, and
// again if it changes.
type gateChecker struct {
	r *DistributedLockReconciler
	// told are, by pod, the problems it was last told.
	told sync.Map // types.NamespacedName -> told
}

type told struct {
	uid      types.UID
	problems string
}

func (g *gateChecker) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	pod := &corev1.Pod{}
	if err := g.r.Get(ctx, req.NamespacedName, pod); err != nil {
		if apierrors.IsNotFound(err) {
			g.told.Delete(req.NamespacedName)
		}
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	if gates, _ := decide.OurGates(pod); len(gates) == 0 {
		g.told.Delete(req.NamespacedName)
		return reconcile.Result{}, nil
	}
	_, problems, err := g.r.gateLocks(ctx, pod)
	if err != nil {
		return reconcile.Result{}, err
	}
	var messages []string
	for _, p := range problems {
		messages = append(messages, p.message)
	}
	now := told{uid: pod.UID, problems: strings.Join(messages, "\n")}
	if before, ok := g.told.Load(req.NamespacedName); (ok && before.(told) == now) || (!ok && now.problems == "") {
		return reconcile.Result{}, nil
	}
	g.told.Store(req.NamespacedName, now)
	for _, p := range problems {
		g.r.Recorder.Event(pod, corev1.EventTypeWarning, p.reason, p.message)
		if p.lock != nil {
			g.r.Recorder.Eventf(p.lock, corev1.EventTypeWarning, "GatedPodNotGranted", "Pod %s carries this lock's gate and is granted nothing: %s", pod.Name, p.message)
		}
	}
	return reconcile.Result{}, nil
}

// setupWithManager registers the gate checker: it looks at a pod when a
// gated pod changes, and at the pods behind a lock's gate when the lock
// changes.
func (g *gateChecker) setupWithManager(mgr ctrl.Manager) error {
	hasGates := func(o client.Object) bool {
		pod, ok := o.(*corev1.Pod)
		gates, _ := decide.OurGates(pod)
		return ok && len(gates) > 0
	}
	// A pod that had gates and lost them, or is gone, is looked at once
	// more, so what it was told is forgotten.
	gated := predicate.Funcs{
		CreateFunc: func(e event.CreateEvent) bool { return hasGates(e.Object) },
		UpdateFunc: func(e event.UpdateEvent) bool { return hasGates(e.ObjectOld) || hasGates(e.ObjectNew) },
		DeleteFunc: func(e event.DeleteEvent) bool { return hasGates(e.Object) },
	}
	return ctrl.NewControllerManagedBy(mgr).
		Named("lockgates").
		Watches(&corev1.Pod{}, &handler.EnqueueRequestForObject{}, builder.WithPredicates(gated)).
		Watches(&locksv1.DistributedLock{}, handler.EnqueueRequestsFromMapFunc(g.podsBehind), builder.WithPredicates(lockSpecOrLifeChanged)).
		Complete(g)
}

// lockSpecOrLifeChanged passes a lock's creation, deletion, and updates of
// its spec or its deletion timestamp. A lock's status changes with every
// grant: only its spec, its coming and its going concern the pods behind
// its gate, and their other keys (keysBesideLock).
var lockSpecOrLifeChanged = predicate.Or[client.Object](predicate.GenerationChangedPredicate{}, predicate.Funcs{
	UpdateFunc: func(e event.UpdateEvent) bool {
		return e.ObjectOld.GetDeletionTimestamp().IsZero() != e.ObjectNew.GetDeletionTimestamp().IsZero()
	},
})

// podsBehind are the pods that carry the lock's gate.
func (g *gateChecker) podsBehind(ctx context.Context, obj client.Object) []reconcile.Request {
	var pods corev1.PodList
	if err := g.r.List(ctx, &pods, client.InNamespace(obj.GetNamespace()), client.MatchingFields{podLocksIndex: obj.GetName()},
		client.UnsafeDisableDeepCopy); err != nil {
		ctrl.LoggerFrom(ctx).Error(err, "cannot list the pods behind a lock's gate", "lock", client.ObjectKeyFromObject(obj))
		return nil
	}
	var out []reconcile.Request
	for i := range pods.Items {
		if decide.HasGate(&pods.Items[i], locksv1.GateFor(obj.GetName())) {
			out = append(out, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(&pods.Items[i])})
		}
	}
	return out
}
