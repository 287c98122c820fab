package controllers_test

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	locksv1 "github.com/lockwarden/lockwarden/api/v1alpha1"
)

// refuseStatusWrites installs a ValidatingAdmissionPolicy that refuses
// every status write of a lock of the namespace labelled refuse-status, and
// waits until the API server enforces it.
func refuseStatusWrites(t *testing.T, ns string) {
	t.Helper()
	refuseUpdates(t, ns, admissionregistrationv1.Rule{APIGroups: []string{locksv1.GroupVersion.Group}, APIVersions: []string{locksv1.GroupVersion.Version},
		Resources: []string{"distributedlocks/status"}}, "refuse-status", metav1.StatusReasonForbidden)
	probe := createLock(t, ns, "probe", "probe", func(l *locksv1.DistributedLock) { l.Labels = map[string]string{"refuse-status": "true"} })
	seq := int64(0)
	eventually(t, "the policy refusing status writes to be enforced", func() bool {
		seq++
		return updateLockStatus(t, probe, func(l *locksv1.DistributedLock) { l.Status.HighestToken = seq }) != nil
	})
}

// V8: Redis lost the key of a grantee that runs; the controller takes it
// again for the pod, and cannot record the new hold (a status write
// refused). It keeps the hold and tries the record again: giving the take
// back would publish a release on the key's channel while the holder runs,
// waking every waiter outside the controller.
func TestARetakeWhoseRecordFailsKeepsItsHold(t *testing.T) {
	ns := newNamespace(t)
	refuseStatusWrites(t, ns)
	startManager(t)
	ctx := context.Background()
	rdb := redis.NewClient(&redis.Options{Addr: redisAddr})
	defer rdb.Close()
	lock := createLock(t, ns, "a", "web")
	key := lockKey(lock)
	pod := createPod(t, ns, "w1", "web", gatedBy("a"))
	eventually(t, "w1 to be ungated", func() bool { return !gatedWith(getPod(t, pod), gateFor("a")) })
	bind(t, pod)
	setContainers(t, pod, corev1.PodRunning, running)
	updateLock(t, lock, func(l *locksv1.DistributedLock) { l.Labels = map[string]string{"refuse-status": "true"} })

	sub := rdb.Subscribe(ctx, "redisson_lock__channel:{"+key+"}")
	defer sub.Close()
	if _, err := sub.Receive(ctx); err != nil { // the subscription's confirmation
		t.Fatal(err)
	}
	if err := rdb.Del(ctx, key).Err(); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the key to be taken again for w1", func() bool { return eventOn(t, ns, "DistributedLock", "a", "Reacquired") })
	select {
	case msg := <-sub.Channel():
		t.Fatalf("a release was published on %s while w1 runs: %q", msg.Channel, msg.Payload)
	case <-time.After(3 * time.Second):
	}
	if !holds(t, key, pod) {
		t.Fatalf("w1 does not hold the key: %+v", inspect(t, key))
	}
}

// V3: a lock's start policy (startTimeout, deleteUnstarted) applies to the
// pods it gates or selects, not to another lock's holder on the same key:
// lock a2 evicts unstarted holders after a second, lock a does not, and a
// pod only a gates and selects is never evicted by a2.
func TestAnotherLocksStartPolicyDoesNotEvictTheHolder(t *testing.T) {
	ns := newNamespace(t)
	startManager(t)
	key := ns + "/shared"
	createLock(t, ns, "a", "web", func(l *locksv1.DistributedLock) { l.Spec.Key = key })
	createLock(t, ns, "a2", "other", func(l *locksv1.DistributedLock) {
		l.Spec.Key = key
		l.Spec.DeleteUnstarted = true
		l.Spec.StartTimeout = &metav1.Duration{Duration: time.Second}
	})
	pod := createPod(t, ns, "w1", "web", gatedBy("a"))
	eventually(t, "w1 to be ungated", func() bool { return !gatedWith(getPod(t, pod), gateFor("a")) })
	bind(t, pod)
	time.Sleep(3 * time.Second) // a2's timeout, thrice
	settle()
	if p := getPod(t, pod); !p.DeletionTimestamp.IsZero() || eventOn(t, ns, "DistributedLock", "a2", "Evicted") {
		t.Fatal("lock a2's deleteUnstarted evicted the holder that only lock a gates and selects")
	}
}

// V5: a key no lock names (another application's Redisson lock) is not
// looked at again: its releases and leases are none of the controller's
// business.
func TestAKeyNoLockNamesIsNotPolled(t *testing.T) {
	ns := newNamespace(t)
	h := startManager(t)
	rdb := redis.NewClient(&redis.Options{Addr: redisAddr})
	defer rdb.Close()
	key := ns + "/not-a-lock-of-ours"
	takeAsOutsider(t, rdb, key)
	if res := reconcileKey(t, h, key); res.RequeueAfter != 0 {
		t.Fatalf("a key no lock names is looked at again in %v", res.RequeueAfter)
	}
}

// V7: the finalizer of a lock waiting for its holder, on a key another
// namespace's lock shares, removed by hand: the hold the manager renews for
// the pod is released once the pod stops, not renewed for ever.
func TestAHoldLeftByARemovedFinalizerEndsWithItsPod(t *testing.T) {
	nsA, nsB := newNamespace(t), newNamespace(t)
	key := "shared-" + nsA
	startManager(t, sharing(key, nsA, nsB))
	pa := createPod(t, nsA, "pa", "x", gatedBy("a"))
	a := createLock(t, nsA, "a", "x", func(l *locksv1.DistributedLock) { l.Spec.Key = key })
	createLock(t, nsB, "b", "y", func(l *locksv1.DistributedLock) { l.Spec.Key = key })
	eventually(t, "pa to be ungated", func() bool { return !gatedWith(getPod(t, pa), gateFor("a")) })
	bind(t, pa)
	setContainers(t, pa, corev1.PodRunning, running)
	deleteLock(t, a)
	eventually(t, "a to wait for its holder", func() bool {
		c := meta.FindStatusCondition(getLock(t, a).Status.Conditions, locksv1.ConditionReady)
		return c != nil && c.Reason == "WaitingForHolder"
	})
	updateLock(t, a, func(l *locksv1.DistributedLock) { controllerutil.RemoveFinalizer(l, locksv1.Finalizer) })
	eventually(t, "a to be gone", func() bool { return lockGone(t, a) })
	settle()
	if !holds(t, key, pa) {
		t.Fatalf("pa lost the key while it runs: %+v", inspect(t, key))
	}
	setContainers(t, pa, corev1.PodSucceeded, exited(0))
	eventually(t, "pa's hold to be released once it stopped", func() bool { return !inspect(t, key).Held() })
}
