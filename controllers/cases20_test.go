package controllers_test

import (
	"context"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	locksv1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/internal/redistest"
)

// The tests in this file pin the cases of issue 20, "at most one guarded
// pod per key runs", one test per case; each failed on the controller
// before the fixes (b876e2d). Case 3 is
// TestUnsharingAKeyKeepsARunningGrant (keys_test.go), case 9 is
// TestAPIBackoffIsCappedAndJittered (backoff_internal_test.go), and case
// 10 is TestAPausedManagerLiftsNoGate (fencing_test.go).

// restartPolicy sets the pod's restart policy.
func restartPolicy(p corev1.RestartPolicy) podOption {
	return func(pod *corev1.Pod) { pod.Spec.RestartPolicy = p }
}

// withSidecar gives the pod a native sidecar: an init container that keeps
// running beside the app containers.
func withSidecar(pod *corev1.Pod) {
	pod.Spec.InitContainers = append(pod.Spec.InitContainers,
		corev1.Container{Name: "proxy", Image: "envoy", RestartPolicy: ptr.To(corev1.ContainerRestartPolicyAlways)})
}

// setStatus changes the pod's status as a kubelet would report it,
// retrying when the controller's patch of the marks got in between.
func setStatus(t *testing.T, pod *corev1.Pod, change func(*corev1.PodStatus)) {
	t.Helper()
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		p := getPod(t, pod)
		change(&p.Status)
		return k8s.Status().Update(context.Background(), p)
	})
	if err != nil {
		t.Fatal(err)
	}
}

// exited is a container that ran and exited with the code.
func exited(code int32) corev1.ContainerState {
	reason := "Completed"
	if code != 0 {
		reason = "Error"
	}
	return corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{
		ExitCode: code, Reason: reason, StartedAt: metav1.NewTime(time.Now().Add(-time.Second)), FinishedAt: metav1.Now()}}
}

// restarted is a container the kubelet restarted in place after it exited:
// running again, one restart more, its last run recorded.
func restarted(cs *corev1.ContainerStatus, code int32) {
	cs.LastTerminationState = exited(code)
	cs.State = running
	cs.RestartCount++
}

// kubeletSawDeletion reports the pod's status as a kubelet does once it has
// seen the pod's deletion: with the generation the deletion gave the pod as
// status.observedGeneration.
func kubeletSawDeletion(t *testing.T, pod *corev1.Pod) {
	t.Helper()
	setStatus(t, pod, func(st *corev1.PodStatus) { st.ObservedGeneration = getPod(t, pod).Generation })
}

// eventOn reports whether an Event with the reason was recorded on the
// object of the kind and name.
func eventOn(t *testing.T, ns, kind, name, reason string) bool {
	t.Helper()
	var events corev1.EventList
	if err := k8s.List(context.Background(), &events, client.InNamespace(ns)); err != nil {
		t.Fatal(err)
	}
	return slices.ContainsFunc(events.Items, func(e corev1.Event) bool {
		return e.InvolvedObject.Kind == kind && e.InvolvedObject.Name == name && e.Reason == reason
	})
}

func deleteLock(t *testing.T, lock *locksv1.DistributedLock) {
	t.Helper()
	if err := k8s.Delete(context.Background(), lock); client.IgnoreNotFound(err) != nil {
		t.Fatal(err)
	}
}

func lockGone(t *testing.T, lock *locksv1.DistributedLock) bool {
	return apierrors.IsNotFound(k8s.Get(context.Background(), client.ObjectKeyFromObject(lock), &locksv1.DistributedLock{}))
}

// Case 1, a CronJob: under restartPolicy OnFailure (the Kubernetes
// documentation's CronJob example) a container that exits with an error is
// restarted in place, and the phase stays Running. The run has not stopped:
// it keeps the lock, and the next run stays gated until the first one's
// pod reaches a terminal phase.
func TestContainerRestartInPlaceKeepsTheLock(t *testing.T) {
	startManager(t)
	ns := newNamespace(t)
	run1 := createPod(t, ns, "run-1", "job", gatedBy("singleton"), restartPolicy(corev1.RestartPolicyOnFailure))
	run2 := createPod(t, ns, "run-2", "job", gatedBy("singleton"), restartPolicy(corev1.RestartPolicyOnFailure))
	lock := createLock(t, ns, "singleton", "job")
	key := lockKey(lock)
	eventually(t, "run-1 to be ungated", func() bool { return !gatedWith(getPod(t, run1), gateFor("singleton")) })
	bind(t, run1)
	setContainers(t, run1, corev1.PodRunning, running)

	// The container fails; the kubelet will restart it, so the phase stays
	// Running, every container terminated meanwhile.
	setContainers(t, run1, corev1.PodRunning, exited(1))
	settle()
	if !gatedWith(getPod(t, run2), gateFor("singleton")) || !holds(t, key, run1) {
		t.Fatalf("run-2 was ungated, or run-1 lost the key, while run-1's container waits to be restarted in place: %+v", inspect(t, key))
	}
	setStatus(t, run1, func(st *corev1.PodStatus) { restarted(&st.ContainerStatuses[0], 1) })
	settle()
	if !gatedWith(getPod(t, run2), gateFor("singleton")) || !holds(t, key, run1) {
		t.Fatal("run-2 was ungated, or run-1 lost the key, after run-1's container was restarted in place")
	}

	// The restarted container succeeds: the pod reaches phase Succeeded.
	setContainers(t, run1, corev1.PodSucceeded, exited(0))
	eventually(t, "run-2 to be granted once run-1 succeeded", func() bool {
		return holds(t, key, run2) && !gatedWith(getPod(t, run2), gateFor("singleton"))
	})
}

// Case 1, leader election: under restartPolicy Always (every Deployment) a
// leader whose container exits keeps the lock through the restart; the
// standby is not granted it.
func TestLeaderKeepsTheLockThroughAContainerRestart(t *testing.T) {
	startManager(t)
	ns := newNamespace(t)
	leader := createPod(t, ns, "leader", "web", restartPolicy(corev1.RestartPolicyAlways))
	setContainers(t, leader, corev1.PodRunning, running)
	lock := createLock(t, ns, "web", "web")
	key := lockKey(lock)
	eventually(t, "the leader to hold the lock", func() bool { return holds(t, key, leader) })
	standby := createPod(t, ns, "standby", "web", restartPolicy(corev1.RestartPolicyAlways))
	setContainers(t, standby, corev1.PodRunning, running)

	setContainers(t, leader, corev1.PodRunning, exited(137))
	settle()
	if !holds(t, key, leader) {
		t.Fatalf("the leader lost the lock when its container exited to be restarted: %+v", inspect(t, key))
	}
	setStatus(t, leader, func(st *corev1.PodStatus) { restarted(&st.ContainerStatuses[0], 137) })
	settle()
	if !holds(t, key, leader) || holderOf(t, lock) != "leader" {
		t.Fatalf("the leader lost the lock after its container was restarted in place: %+v", inspect(t, key))
	}
}

// Case 2: a key is un-shared from a namespace while a pod there runs with a
// grant of it, and the namespace's lock, now refused, is deleted. The grant
// stays sticky until the pod stops: its lock's finalizer waits for it,
// and the other namespace's guarded pod stays gated meanwhile.
func TestUnsharingThenDeletingTheRefusedLockKeepsTheGrant(t *testing.T) {
	nsA, nsB := newNamespace(t), newNamespace(t)
	key := "shared-" + nsA
	first := startManager(t, sharing(key, nsA, nsB))
	pb := createPod(t, nsB, "pb", "y", gatedBy("b"))
	b := createLock(t, nsB, "b", "y", func(l *locksv1.DistributedLock) { l.Spec.Key = key })
	eventually(t, "pb to be granted and ungated", func() bool {
		return holds(t, key, pb) && !gatedWith(getPod(t, pb), gateFor("b")) && holderOf(t, b) == "pb"
	})
	bind(t, pb)
	setContainers(t, pb, corev1.PodRunning, running)
	first.stop()

	startManager(t, sharing(key, nsA))
	pa := createPod(t, nsA, "pa", "x", gatedBy("a"))
	createLock(t, nsA, "a", "x", func(l *locksv1.DistributedLock) { l.Spec.Key = key })
	eventually(t, "lock b to be refused its key", func() bool {
		c := meta.FindStatusCondition(getLock(t, b).Status.Conditions, locksv1.ConditionReady)
		return c != nil && c.Reason == "KeyNotPermitted"
	})
	deleteLock(t, b)
	// The key's next events: pa changes, and the lease runs past the old
	// manager's last renewal.
	time.Sleep(4 * time.Second)
	labelPod(t, pa, "touched", "1")
	settle()
	if !gatedWith(getPod(t, pa), gateFor("a")) || !holds(t, key, pb) {
		t.Fatalf("pa was ungated, or pb lost its grant, while pb runs: %+v", inspect(t, key))
	}
	if lockGone(t, b) {
		t.Fatal("lock b went while pb, whose gate it lifted, runs")
	}

	setContainers(t, pb, corev1.PodSucceeded, exited(0))
	eventually(t, "pa to be granted once pb stopped, and lock b to go", func() bool {
		return holds(t, key, pa) && !gatedWith(getPod(t, pa), gateFor("a")) && lockGone(t, b)
	})
}

// Case 4: a holder that started is never "not started", so never evicted
// as such: one whose container crashed and waits to be restarted, one
// with a container that completed, and one that holds its first lock
// while it waits for its second.
func TestStartedHoldersAreNeverEvictedAsNotStarted(t *testing.T) {
	startManager(t)
	ns := newNamespace(t)
	evicting := func(l *locksv1.DistributedLock) { l.Spec.DeleteUnstarted = true }
	withHelper := func(p *corev1.Pod) {
		p.Spec.Containers = append(p.Spec.Containers, corev1.Container{Name: "helper", Image: "busybox"})
	}
	crashing := createPod(t, ns, "crashing", "crash", gatedBy("crash"))
	completed := createPod(t, ns, "completed", "done", gatedBy("done"), withHelper)
	// waiting takes key ns/first, then waits for ns/second, which blocker
	// holds.
	blocker := createPod(t, ns, "blocker", "two", gatedBy("second"))
	crashLock := createLock(t, ns, "crash", "crash", evicting)
	doneLock := createLock(t, ns, "done", "done", evicting)
	createLock(t, ns, "second", "two")
	eventually(t, "blocker to hold the second key", func() bool { return holds(t, ns+"/second", blocker) })
	waiting := createPod(t, ns, "waiting", "two", gatedBy("first", "second"))
	firstLock := createLock(t, ns, "first", "two", evicting)

	eventually(t, "crashing and completed to be ungated, waiting to hold its first key", func() bool {
		return !gatedWith(getPod(t, crashing), gateFor("crash")) && !gatedWith(getPod(t, completed), gateFor("done")) &&
			holds(t, ns+"/first", waiting) && !gatedWith(getPod(t, waiting), gateFor("first"))
	})
	bind(t, crashing)
	bind(t, completed)
	setStatus(t, crashing, func(st *corev1.PodStatus) {
		st.Phase = corev1.PodRunning
		st.ContainerStatuses = []corev1.ContainerStatus{{Name: "main", Image: "busybox", RestartCount: 2,
			State:                corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "CrashLoopBackOff"}},
			LastTerminationState: exited(1)}}
	})
	setStatus(t, completed, func(st *corev1.PodStatus) {
		st.Phase = corev1.PodRunning
		st.ContainerStatuses = []corev1.ContainerStatus{
			{Name: "helper", Image: "busybox", State: exited(0)},
			{Name: "main", Image: "busybox", State: running},
		}
	})
	shortenStartTimeout(t, crashLock, "Restarting", "CrashLoopBackOff")
	shortenStartTimeout(t, doneLock, "Started", "")
	shortenStartTimeout(t, firstLock, "WaitingForGates", "")
	time.Sleep(1500 * time.Millisecond) // past the start timeout
	settle()
	for _, p := range []*corev1.Pod{crashing, completed, waiting} {
		if !getPod(t, p).DeletionTimestamp.IsZero() {
			t.Errorf("%s was evicted as not started", p.Name)
		}
	}
	for lock, want := range map[*locksv1.DistributedLock]string{crashLock: "Restarting", doneLock: "Started", firstLock: "WaitingForGates"} {
		c := meta.FindStatusCondition(getLock(t, lock).Status.Conditions, locksv1.ConditionHolderStarted)
		if c == nil || c.Reason != want || c.Status == metav1.ConditionFalse {
			t.Errorf("lock %s's HolderStarted is %+v, want reason %s", lock.Name, c, want)
		}
	}
	eventually(t, "a HolderRestarting Event to tell of the crash loop", func() bool {
		return eventOn(t, ns, "DistributedLock", "crash", "HolderRestarting")
	})
}

// Case 5: a pod gated by a lock that does not select it takes no key, not
// even the one ordered before that lock's, which it would hold for ever.
// The pod and the lock are told why, and so is a pod whose gate names no
// lock at all.
func TestPodGatedByALockThatDoesNotSelectItTakesNothing(t *testing.T) {
	startManager(t)
	ns := newNamespace(t)
	p := createPod(t, ns, "p", "job", gatedBy("first", "second"))
	q := createPod(t, ns, "q", "job", gatedBy("first"))
	createPod(t, ns, "stray", "job", gatedBy("missing"))
	createLock(t, ns, "first", "job")
	createLock(t, ns, "second", "other")
	eventually(t, "q to be granted the first key", func() bool { return holds(t, ns+"/first", q) })
	if info := inspect(t, ns+"/second"); info.Held() {
		t.Fatalf("the second key is held: %+v", info)
	}
	if !gatedWith(getPod(t, p), gateFor("first")) {
		t.Fatal("p, which the second lock does not select, lost the first lock's gate")
	}
	eventually(t, "the Events telling p, the second lock and stray why", func() bool {
		return eventOn(t, ns, "Pod", "p", "NotSelected") && eventOn(t, ns, "DistributedLock", "second", "GatedPodNotGranted") &&
			eventOn(t, ns, "Pod", "stray", "LockNotFound")
	})
}

// Case 6: a pod also behind another controller's gate (Kueue's admission
// gate, say) is not granted until lockwarden's gates are its only ones
// left; the next candidate is granted meanwhile.
func TestPodBehindAForeignGateWaitsForIt(t *testing.T) {
	startManager(t)
	ns := newNamespace(t)
	const admission = "kueue.x-k8s.io/admission"
	held := createPod(t, ns, "held", "job", gatedBy("singleton"), func(p *corev1.Pod) {
		p.Spec.SchedulingGates = append(p.Spec.SchedulingGates, corev1.PodSchedulingGate{Name: admission})
	})
	time.Sleep(1100 * time.Millisecond) // held is the oldest candidate, to the second
	free := createPod(t, ns, "free", "job", gatedBy("singleton"))
	lock := createLock(t, ns, "singleton", "job")
	key := lockKey(lock)
	eventually(t, "free to be granted", func() bool { return holds(t, key, free) && !gatedWith(getPod(t, free), gateFor("singleton")) })

	if err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		p := getPod(t, held)
		p.Spec.SchedulingGates = slices.DeleteFunc(p.Spec.SchedulingGates, func(g corev1.PodSchedulingGate) bool { return g.Name == admission })
		return k8s.Update(context.Background(), p)
	}); err != nil {
		t.Fatal(err)
	}
	setContainers(t, free, corev1.PodSucceeded, exited(0))
	eventually(t, "held to be granted once admitted", func() bool {
		return holds(t, key, held) && !gatedWith(getPod(t, held), gateFor("singleton"))
	})
}

// Case 7: in mode Observe, an in-pod client that takes a free key is shown
// in the lock's status and marked, though nobody publishes a take.
func TestObserveShowsAnInPodClientsNewHold(t *testing.T) {
	startManager(t)
	ns := newNamespace(t)
	w := createPod(t, ns, "w", "web")
	lock := createLock(t, ns, "leader", "web", func(l *locksv1.DistributedLock) { l.Spec.Mode = locksv1.ModeObserve })
	eventually(t, "the lock to be shown free", func() bool {
		return meta.FindStatusCondition(getLock(t, lock).Status.Conditions, locksv1.ConditionHeld) != nil
	})
	settle() // nothing is left for the controller to do: no reconcile is due
	taken := time.Now()
	inPodLock(t, w, lockKey(lock))
	eventually(t, "the in-pod client's hold to be shown and marked", func() bool {
		return holderOf(t, lock) == "w" && markedBy(getPod(t, w), "leader")
	})
	t.Logf("shown %v after the take", time.Since(taken).Round(time.Millisecond))
}

// Case 8: a grant keeps the lease terms of the lock that made it. On a key
// shared by two namespaces, the other tenant's lock, first by namespace and
// name, has a 1 s lease; the grant made through the 30 s lock keeps 30 s.
func TestAGrantKeepsItsOwnLocksLease(t *testing.T) {
	nsShort, nsLong := newNamespace(t), newNamespace(t)
	if nsShort > nsLong {
		nsShort, nsLong = nsLong, nsShort // the short lease sorts first
	}
	key := "shared-" + nsShort
	startManager(t, sharing(key, nsShort, nsLong))
	createLock(t, nsShort, "short", "nobody", func(l *locksv1.DistributedLock) {
		l.Spec.Key, l.Spec.LeaseDuration = key, &metav1.Duration{Duration: time.Second}
	})
	pod := createPod(t, nsLong, "run", "job", gatedBy("long"))
	createLock(t, nsLong, "long", "job", func(l *locksv1.DistributedLock) {
		l.Spec.Key, l.Spec.LeaseDuration = key, &metav1.Duration{Duration: 30 * time.Second}
	})
	eventually(t, "the pod to be granted", func() bool { return holds(t, key, pod) })
	rdb := redis.NewClient(&redis.Options{Addr: redisAddr})
	defer rdb.Close()
	ttl, err := rdb.PTTL(context.Background(), key).Result()
	if err != nil {
		t.Fatal(err)
	}
	if ttl < 5*time.Second {
		t.Fatalf("the grant made through the 30 s lock has a lease of %v in Redis, the other tenant's", ttl)
	}
}

// Case 11: deleting a lock ends no grant whose gate it lifted until that pod
// stops. A pod behind two locks holds the first key, its gate for it lifted,
// and waits for the second; the first lock is renamed (created anew under
// another name, the old one deleted). The old lock stays until the pod
// stops, and the new one grants the key to nobody else meanwhile.
func TestDeletingALockKeepsAGrantWhoseGateItLifted(t *testing.T) {
	startManager(t)
	ns := newNamespace(t)
	blocker := createPod(t, ns, "blocker", "job", gatedBy("second"))
	createLock(t, ns, "second", "job")
	eventually(t, "blocker to hold the second key", func() bool { return holds(t, ns+"/second", blocker) })
	both := createPod(t, ns, "both", "job", gatedBy("first", "second"))
	first := createLock(t, ns, "first", "job")
	eventually(t, "both to hold the first key, and wait for the second", func() bool {
		p := getPod(t, both)
		return holds(t, ns+"/first", both) && !gatedWith(p, gateFor("first")) && gatedWith(p, gateFor("second"))
	})

	deleteLock(t, first)
	createLock(t, ns, "first-v2", "other", func(l *locksv1.DistributedLock) { l.Spec.Key = ns + "/first" })
	other := createPod(t, ns, "other", "other", gatedBy("first-v2"))
	eventually(t, "the old lock to say it waits for both", func() bool {
		c := meta.FindStatusCondition(getLock(t, first).Status.Conditions, locksv1.ConditionReady)
		return c != nil && c.Reason == "WaitingForHolder"
	})
	settle()
	if !holds(t, ns+"/first", both) || !gatedWith(getPod(t, other), gateFor("first-v2")) {
		t.Fatalf("the renamed lock granted the first key away from both, whose gate the old lock lifted: %+v", inspect(t, ns+"/first"))
	}

	// both gets its second key and starts: still nobody else runs.
	setContainers(t, blocker, corev1.PodSucceeded, exited(0))
	eventually(t, "both to hold the second key and start", func() bool {
		return holds(t, ns+"/second", both) && !gatedWith(getPod(t, both), gateFor("second"))
	})
	bind(t, both)
	setContainers(t, both, corev1.PodRunning, running)
	settle()
	if !gatedWith(getPod(t, other), gateFor("first-v2")) {
		t.Fatal("other was ungated while both runs with the first key")
	}

	setContainers(t, both, corev1.PodSucceeded, exited(0))
	eventually(t, "the old lock to go, and other to be granted", func() bool {
		return lockGone(t, first) && holds(t, ns+"/first", other) && !gatedWith(getPod(t, other), gateFor("first-v2"))
	})
}

// Case 12: deleting a lock while its holder is in its grace period, on a
// key shared with another namespace, releases nothing until the holder's
// containers have terminated: the other namespace's guarded pod waits.
func TestDeletingALockWaitsForAHolderInItsGracePeriod(t *testing.T) {
	nsA, nsB := newNamespace(t), newNamespace(t)
	key := "shared-" + nsA
	startManager(t, sharing(key, nsA, nsB))
	pa := createPod(t, nsA, "pa", "x", gatedBy("a"))
	a := createLock(t, nsA, "a", "x", func(l *locksv1.DistributedLock) { l.Spec.Key = key })
	eventually(t, "pa to be ungated", func() bool { return !gatedWith(getPod(t, pa), gateFor("a")) })
	bind(t, pa)
	setContainers(t, pa, corev1.PodRunning, running)
	pb := createPod(t, nsB, "pb", "y", gatedBy("b"))
	createLock(t, nsB, "b", "y", func(l *locksv1.DistributedLock) { l.Spec.Key = key })

	if err := k8s.Delete(context.Background(), pa); err != nil {
		t.Fatal(err)
	}
	deleteLock(t, a)
	settle()
	if !gatedWith(getPod(t, pb), gateFor("b")) || !holds(t, key, pa) {
		t.Fatalf("pb was ungated, or pa lost the key, while pa runs through its grace period: %+v", inspect(t, key))
	}
	setContainers(t, pa, corev1.PodFailed, exited(137))
	eventually(t, "pb to be granted once pa stopped", func() bool {
		return holds(t, key, pb) && !gatedWith(getPod(t, pb), gateFor("b")) && lockGone(t, a)
	})
}

// Case 12: a native sidecar runs on after the app containers of a pod
// being deleted have terminated: the pod has not stopped until it has too.
func TestASidecarStillRunningKeepsTheLock(t *testing.T) {
	startManager(t)
	ns := newNamespace(t)
	run1 := createPod(t, ns, "run-1", "job", gatedBy("singleton"), withSidecar)
	run2 := createPod(t, ns, "run-2", "job", gatedBy("singleton"))
	lock := createLock(t, ns, "singleton", "job")
	key := lockKey(lock)
	eventually(t, "run-1 to be ungated", func() bool { return !gatedWith(getPod(t, run1), gateFor("singleton")) })
	bind(t, run1)
	setStatus(t, run1, func(st *corev1.PodStatus) {
		st.Phase = corev1.PodRunning
		st.InitContainerStatuses = []corev1.ContainerStatus{{Name: "proxy", Image: "envoy", State: running}}
		st.ContainerStatuses = []corev1.ContainerStatus{{Name: "main", Image: "busybox", State: running}}
	})
	if err := k8s.Delete(context.Background(), run1); err != nil {
		t.Fatal(err)
	}
	kubeletSawDeletion(t, run1)
	setStatus(t, run1, func(st *corev1.PodStatus) { st.ContainerStatuses[0].State = exited(0) })
	settle()
	if !gatedWith(getPod(t, run2), gateFor("singleton")) || !holds(t, key, run1) {
		t.Fatalf("run-2 was ungated while run-1's sidecar still runs: %+v", inspect(t, key))
	}
	setStatus(t, run1, func(st *corev1.PodStatus) { st.InitContainerStatuses[0].State = exited(0) })
	eventually(t, "run-2 to be granted once the sidecar terminated too", func() bool {
		return holds(t, key, run2) && !gatedWith(getPod(t, run2), gateFor("singleton"))
	})
}

// Case 12: marks a lock left on a pod (its finalizer removed by hand) are
// no grant of a new lock of the same name: the new lock grants its own
// candidate, not the old lock's holder.
func TestMarksLeftByAGoneLockAreNoGrant(t *testing.T) {
	h := startManager(t)
	ns := newNamespace(t)
	old := createPod(t, ns, "old", "job", gatedBy("singleton"))
	lock := createLock(t, ns, "singleton", "job")
	key := lockKey(lock)
	eventually(t, "old to be granted and marked", func() bool {
		return holds(t, key, old) && markedBy(getPod(t, old), "singleton")
	})
	setContainers(t, old, corev1.PodRunning, running)
	h.stop()
	rdb := redis.NewClient(&redis.Options{Addr: redisAddr})
	defer rdb.Close()
	if err := rdb.Del(context.Background(), key).Err(); err != nil { // its lease ran out
		t.Fatal(err)
	}
	updateLock(t, lock, func(l *locksv1.DistributedLock) { controllerutil.RemoveFinalizer(l, locksv1.Finalizer) })
	deleteLock(t, lock)
	eventually(t, "the lock to go", func() bool { return lockGone(t, lock) })
	time.Sleep(1100 * time.Millisecond) // marks are timed to the second

	fresh := createPod(t, ns, "fresh", "fresh", gatedBy("singleton"))
	createLock(t, ns, "singleton", "fresh")
	startManager(t)
	eventually(t, "the new lock to grant its own candidate", func() bool { return holds(t, key, fresh) })
}

// Case 12: while Redis cannot be read, who holds the lock is unknown: Held
// is Unknown, not True, since the hold may lapse meanwhile.
func TestHeldIsUnknownWhileRedisCannotBeRead(t *testing.T) {
	srv := redistest.Start(t)
	// A paused Redis answers nothing: give up on it soon, as a manager
	// with tighter timeouts would, rather than after go-redis's retries.
	startManagerOn(t, managerConfig{rdb: redis.NewClient(&redis.Options{Addr: srv.Addr, ReadTimeout: 500 * time.Millisecond, MaxRetries: 1})})
	ns := newNamespace(t)
	pod := createPod(t, ns, "a", "web")
	lock := createLock(t, ns, "leader", "web")
	eventually(t, "the lock to be held", func() bool {
		return meta.IsStatusConditionTrue(getLock(t, lock).Status.Conditions, locksv1.ConditionHeld)
	})
	if err := srv.Pause(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = srv.Resume() }()
	// A pod event makes the controller look at the key.
	labelPod(t, pod, "touched", strconv.Itoa(1))
	eventually(t, "Held to be Unknown", func() bool {
		c := meta.FindStatusCondition(getLock(t, lock).Status.Conditions, locksv1.ConditionHeld)
		return c != nil && c.Status == metav1.ConditionUnknown
	})
	if err := srv.Resume(); err != nil {
		t.Fatal(err)
	}
	eventually(t, "Held to be True again", func() bool {
		return meta.IsStatusConditionTrue(getLock(t, lock).Status.Conditions, locksv1.ConditionHeld)
	})
}
