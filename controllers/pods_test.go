package controllers_test

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	locksv1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/controllers"
)

// A hold an in-pod client took from a pod that no lock selects, gates or
// marks is found through the pod's UID, not a scan of the namespace, and
// released once that pod stops.
func TestHoldOfAnUnselectedPodReleasedWhenItStops(t *testing.T) {
	startManager(t)
	ns := newNamespace(t)
	sidecar := createPod(t, ns, "sidecar", "tooling")
	standby := createPod(t, ns, "standby", "api")
	key := ns + "/leader"
	lease := inPodLock(t, sidecar, key)
	lock := createLock(t, ns, "leader", "api")
	eventually(t, "the sidecar's hold to show", func() bool { return holderOf(t, lock) == "sidecar" })

	setPhase(t, getPod(t, sidecar), corev1.PodFailed)
	eventually(t, "standby to be granted the lock", func() bool { return holds(t, key, standby) })
	if lease.Token() >= inspect(t, key).Token {
		t.Fatalf("token did not advance past the sidecar's %d", lease.Token())
	}
}

// With --pod-label-selector, the manager caches only the pods carrying the
// labels: a pod without them is invisible, so it is never granted a lock
// that selects it, even as the oldest candidate, and a labelled one is. (A
// pod with a lockwarden gate always carries the opt-in label: the gating
// policy gives it; so the invisible pod here is an unguarded one.)
func TestPodLabelSelectorCachesOnlyOptedInPods(t *testing.T) {
	h := startManagerOn(t, managerConfig{redisAddr: redisAddr, pods: optInPods})
	ns := newNamespace(t)
	hidden := createPod(t, ns, "hidden", "x")
	time.Sleep(1100 * time.Millisecond) // creation timestamps have 1 s resolution
	shown := createPod(t, ns, "shown", "x", gatedBy("a"), optedIn)
	createLock(t, ns, "a", "x")
	key := ns + "/a"
	eventually(t, "the labelled pod to be granted "+key, func() bool { return holds(t, key, shown) })
	if err := h.cache.Get(context.Background(), client.ObjectKeyFromObject(hidden), &corev1.Pod{}); !apierrors.IsNotFound(err) {
		t.Fatalf("the unlabelled pod is in the cache: Get = %v", err)
	}
	if holds(t, key, hidden) {
		t.Fatal("the unlabelled pod was granted the lock")
	}
}

// optedIn labels a pod as --pod-label-selector=optInLabel=true selects.
func optedIn(p *corev1.Pod) { p.Labels[optInLabel] = "true" }

const optInLabel = "lockwarden.dev/candidate"

// optInPods is the pod cache's filter in these tests.
var optInPods = labels.SelectorFromSet(labels.Set{optInLabel: "true"})

// leaveFilter takes the opt-in label off a running pod, so the filtered
// watch reports it deleted, and waits for the manager's cache to drop it.
// Then it reconciles the lock at once, as the event would have.
func leaveFilter(t *testing.T, h *harness, pod *corev1.Pod, lock *locksv1.DistributedLock) {
	t.Helper()
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		p := getPod(t, pod)
		delete(p.Labels, optInLabel)
		return k8s.Update(context.Background(), p)
	})
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, pod.Name+" to leave the manager's cache", func() bool {
		return apierrors.IsNotFound(h.cache.Get(context.Background(), client.ObjectKeyFromObject(pod), &corev1.Pod{}))
	})
	reconcile(t, h, lock)
}

// reconcile runs the manager's reconciler on the lock at once.
func reconcile(t *testing.T, h *harness, lock *locksv1.DistributedLock) {
	t.Helper()
	reconcileKey(t, h, lockKey(lock))
}

// With --pod-label-selector, a holder that loses the label while it runs
// leaves the manager's cache as if it were deleted. It has not stopped: it
// keeps the lock, and nobody else is granted it (here, leader election,
// where nothing else would hold the next pod back), until the API server
// shows it stopped. Its grant stays sticky as a watched pod's does: taken
// again if Redis loses it, adopted and renewed by a new manager, and given
// back to it after somebody else held the key meanwhile.
func TestHolderLeavingThePodFilterKeepsTheLock(t *testing.T) {
	h := startManagerOn(t, managerConfig{redisAddr: redisAddr, pods: optInPods})
	ns := newNamespace(t)
	leader := createPod(t, ns, "leader", "x", optedIn)
	time.Sleep(1100 * time.Millisecond) // creation timestamps have 1 s resolution
	standby := createPod(t, ns, "standby", "x", optedIn)
	lock := createLock(t, ns, "a", "x")
	key := ns + "/a"
	eventually(t, "the leader to be granted "+key, func() bool { return holds(t, key, leader) && holderOf(t, lock) == "leader" })

	leaveFilter(t, h, leader, lock)
	if !holds(t, key, leader) {
		t.Fatalf("the leader, still running, lost %s: %+v", key, inspect(t, key))
	}
	if got := holderOf(t, lock); got != "leader" {
		t.Fatalf("status names %q as the holder, want leader", got)
	}

	rdb := redis.NewClient(&redis.Options{Addr: redisAddr})
	defer rdb.Close()
	if err := rdb.Del(context.Background(), key).Err(); err != nil {
		t.Fatal(err)
	}
	reconcile(t, h, lock)
	if !holds(t, key, leader) {
		t.Fatalf("after Redis lost %s, it went to %+v, not back to the leader", key, inspect(t, key).Holders)
	}

	token := inspect(t, key).Token
	h.stop()
	// The key gets a minute, so that it does not run out while a loaded
	// machine starts the next manager; adopting it sets its lease back.
	if err := rdb.PExpire(context.Background(), key, time.Minute).Err(); err != nil {
		t.Fatal(err)
	}
	h = startManagerOn(t, managerConfig{redisAddr: redisAddr, pods: optInPods})
	reconcile(t, h, lock)
	lease := getLock(t, lock).Spec.LeaseDuration.Duration
	eventually(t, "the new manager to adopt "+key, func() bool { ttl := inspect(t, key).TTL; return ttl > 0 && ttl <= lease })
	time.Sleep(2*lease + 500*time.Millisecond) // only the new manager renews
	if info := inspect(t, key); !holds(t, key, leader) || info.Token != token {
		t.Fatalf("two leases after a new manager started, %s is held by %+v with token %d, want the leader's adopted hold, token %d",
			key, info.Holders, info.Token, token)
	}

	// Somebody else takes the key in Redis: a conflict, after which the
	// key goes back to the leader, not to the standby.
	takeAsOutsider(t, rdb, key)
	reconcile(t, h, lock)
	reconcile(t, h, lock) // the first reconcile to find the conflict drops the lost hold
	if err := rdb.Del(context.Background(), key).Err(); err != nil {
		t.Fatal(err)
	}
	reconcile(t, h, lock)
	if !holds(t, key, leader) {
		t.Fatalf("after a conflict, %s went to %+v, not back to the leader", key, inspect(t, key).Holders)
	}

	// The same across a new manager started during the conflict: the
	// lock's record of the grant (status.grant), not the manager's memory,
	// names the leader.
	takeAsOutsider(t, rdb, key)
	reconcile(t, h, lock)
	h.stop()
	h = startManagerOn(t, managerConfig{redisAddr: redisAddr, pods: optInPods})
	reconcile(t, h, lock)
	if err := rdb.Del(context.Background(), key).Err(); err != nil {
		t.Fatal(err)
	}
	reconcile(t, h, lock)
	if !holds(t, key, leader) {
		t.Fatalf("after a conflict across a manager restart, %s went to %+v, not back to the leader", key, inspect(t, key).Holders)
	}

	setPhase(t, getPod(t, leader), corev1.PodSucceeded)
	eventually(t, "the standby to be granted "+key+" once the leader stopped", func() bool { return holds(t, key, standby) })
	eventually(t, "the leader's marks to be cleared", func() bool { return !markedBy(getPod(t, leader), "a") })
}

// The same for an in-pod client's hold: its pod, out of the cache, still
// runs, so the hold is its own until the pod stops.
func TestInPodHolderLeavingThePodFilterKeepsItsHold(t *testing.T) {
	h := startManagerOn(t, managerConfig{redisAddr: redisAddr, pods: optInPods})
	ns := newNamespace(t)
	sidecar := createPod(t, ns, "sidecar", "tooling", optedIn)
	standby := createPod(t, ns, "standby", "api", optedIn)
	key := ns + "/leader"
	hold := inPodLock(t, sidecar, key)
	lock := createLock(t, ns, "leader", "api")
	eventually(t, "the sidecar's hold to show", func() bool { return holderOf(t, lock) == "sidecar" })

	leaveFilter(t, h, sidecar, lock)
	if err := hold.Err(); err != nil {
		t.Fatalf("the sidecar, still running, lost its hold: %v", err)
	}
	if info := inspect(t, key); len(info.Holders) != 1 || info.Holders[0].Owner != hold.Owner() {
		t.Fatalf("Redis shows %+v, want the sidecar's hold", info.Holders)
	}
	setPhase(t, getPod(t, sidecar), corev1.PodFailed)
	eventually(t, "the standby to be granted "+key+" once the sidecar stopped", func() bool { return holds(t, key, standby) })
}

// Deleting one of two locks on a key releases a grant only if no lock left
// claims its pod; a holder out of the cache is looked up for that, not
// taken for gone, and loses the deleted lock's marks.
func TestDeletingALockKeepsTheGrantOfAHolderOutsideThePodFilter(t *testing.T) {
	h := startManagerOn(t, managerConfig{redisAddr: redisAddr, pods: optInPods})
	ns := newNamespace(t)
	key := sharedKey(ns, "shared")
	leader := createPod(t, ns, "leader", "x", optedIn)
	time.Sleep(1100 * time.Millisecond) // creation timestamps have 1 s resolution
	createPod(t, ns, "standby", "x", optedIn)
	one := createLock(t, ns, "one", "x", func(l *locksv1.DistributedLock) { l.Spec.Key = key })
	two := createLock(t, ns, "two", "x", func(l *locksv1.DistributedLock) { l.Spec.Key = key })
	eventually(t, "both locks to show the leader, each with its finalizer", func() bool {
		return holds(t, key, leader) && holderOf(t, one) == "leader" && holderOf(t, two) == "leader" &&
			controllerutil.ContainsFinalizer(getLock(t, two), locksv1.Finalizer)
	})

	leaveFilter(t, h, leader, one)
	if err := k8s.Delete(context.Background(), two); err != nil {
		t.Fatal(err)
	}
	eventually(t, "lock two to go", func() bool {
		return apierrors.IsNotFound(k8s.Get(context.Background(), client.ObjectKeyFromObject(two), &locksv1.DistributedLock{}))
	})
	if !holds(t, key, leader) {
		t.Fatalf("deleting lock two released the leader, which lock one still selects: %+v", inspect(t, key))
	}
	if markedBy(getPod(t, leader), "two") {
		t.Fatal("the deleted lock's marks are still on the leader")
	}
}

// A deleted lock's parsed selector is dropped by the lock informer's
// delete event, which standbys see too, not by a reconcile, which they
// never run.
func TestDeletedLocksSelectorIsForgotten(t *testing.T) {
	startManager(t)
	ns := newNamespace(t)
	createPod(t, ns, "p", "x")
	lock := createLock(t, ns, "a", "x")
	name := client.ObjectKeyFromObject(lock)
	eventually(t, "the lock's selector to be cached", func() bool { return controllers.SelectorCached(name) })
	if err := k8s.Delete(context.Background(), lock); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the deleted lock's selector to be forgotten", func() bool { return !controllers.SelectorCached(name) })
}

// The cache keeps only lockwarden's own annotations, so clearing the marks
// of a pod must remove those keys alone: a patch that set the annotations
// to what the cache shows, once empty, wiped every other tool's (kwok's run
// stamps in `make demo`).
func TestClearingMarksKeepsOtherAnnotations(t *testing.T) {
	startManager(t)
	ns := newNamespace(t)
	first := createPod(t, ns, "first", "x", func(p *corev1.Pod) { p.Annotations = map[string]string{"team.example/owner": "billing"} })
	time.Sleep(1100 * time.Millisecond) // creation timestamps have 1 s resolution
	second := createPod(t, ns, "second", "x")
	createLock(t, ns, "a", "x")
	key := ns + "/a"
	eventually(t, "first marked as the holder", func() bool { return holds(t, key, first) && markedBy(getPod(t, first), "a") })
	setPhase(t, getPod(t, first), corev1.PodSucceeded)
	eventually(t, "second granted and first unmarked", func() bool {
		return holds(t, key, second) && !markedBy(getPod(t, first), "a")
	})
	if got := getPod(t, first).Annotations; got["team.example/owner"] != "billing" {
		t.Fatalf("first's annotations after its marks were cleared: %v", got)
	}
}
