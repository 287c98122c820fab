package controllers_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/internal/redistest"
	"github.com/lockwarden/lockwarden/pkg/redislock"
)

// The tests in this file pin the cases of issue 12, one test per case.

// bind schedules the pod onto a node, as the scheduler would once it is
// ungated, so deleting it is graceful: it stays, with a deletionTimestamp,
// until a kubelet (there is none here) confirms its containers stopped.
func bind(t *testing.T, pod *corev1.Pod) {
	t.Helper()
	binding := &corev1.Binding{ObjectMeta: metav1.ObjectMeta{Namespace: pod.Namespace, Name: pod.Name}, Target: corev1.ObjectReference{Kind: "Node", Name: "node-1"}}
	if err := k8s.SubResource("binding").Create(context.Background(), getPod(t, pod), binding); err != nil {
		t.Fatal(err)
	}
}

// setContainers sets every container's state, as a kubelet reports it,
// retrying when the controller's patch of the marks got in between.
func setContainers(t *testing.T, pod *corev1.Pod, phase corev1.PodPhase, state corev1.ContainerState) {
	t.Helper()
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		p := getPod(t, pod)
		p.Status.Phase = phase
		p.Status.ContainerStatuses = nil
		for _, c := range p.Spec.Containers {
			p.Status.ContainerStatuses = append(p.Status.ContainerStatuses, corev1.ContainerStatus{Name: c.Name, Image: c.Image, State: state})
		}
		return k8s.Status().Update(context.Background(), p)
	})
	if err != nil {
		t.Fatal(err)
	}
}

// shortenStartTimeout sets the lock's start timeout to a second, once its
// HolderStarted condition shows (by reason, and a message containing seen)
// that the controller has seen the holder's status as the test wrote it.
// Set from the lock's creation, the timeout could run out while a loaded
// machine still binds the pod and writes its status, and the controller
// would rightly find a pod that had not started yet.
func shortenStartTimeout(t *testing.T, lock *locksv1.DistributedLock, reason, seen string) {
	t.Helper()
	eventually(t, "lock "+lock.Name+"'s HolderStarted to show the holder's status (reason "+reason+", message with "+seen+")", func() bool {
		c := meta.FindStatusCondition(getLock(t, lock).Status.Conditions, locksv1.ConditionHolderStarted)
		return c != nil && c.Reason == reason && strings.Contains(c.Message, seen)
	})
	updateLock(t, lock, func(l *locksv1.DistributedLock) { l.Spec.StartTimeout = &metav1.Duration{Duration: time.Second} })
}

var (
	running = corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: metav1.Now()}}
)

func gatedWith(pod *corev1.Pod, gate string) bool {
	return slices.ContainsFunc(pod.Spec.SchedulingGates, func(g corev1.PodSchedulingGate) bool { return g.Name == gate })
}

// holds reports whether Redis has the key held by the controller for pod.
func holds(t *testing.T, key string, pod *corev1.Pod) bool {
	info := inspect(t, key)
	return len(info.Holders) == 1 && string(info.Holders[0].Owner) == string(pod.UID)+":0"
}

// takeAsOutsider has somebody else take the key in Redis in one step, so
// the controller cannot take it back first: Redisson's layout, a hash with
// the owner.
func takeAsOutsider(t *testing.T, rdb *redis.Client, key string) {
	t.Helper()
	if _, err := rdb.TxPipelined(context.Background(), func(p redis.Pipeliner) error {
		p.Del(context.Background(), key)
		p.HSet(context.Background(), key, "outsider:1", 1)
		p.PExpire(context.Background(), key, time.Minute)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}

// settle gives the controller time to act on the last change. It is used
// only before asserting that something did NOT happen.
func settle() { time.Sleep(700 * time.Millisecond) }

func forceDelete(t *testing.T, pod *corev1.Pod) {
	t.Helper()
	if err := k8s.Delete(context.Background(), pod, client.GracePeriodSeconds(0)); client.IgnoreNotFound(err) != nil {
		t.Fatal(err)
	}
}

// Case 1: a holder being deleted keeps the lock through its grace period,
// and the next gated pod is ungated only once the holder's containers have
// all terminated.
func TestCase1HolderKeepsLockThroughGracefulDeletion(t *testing.T) {
	startManager(t)
	ns := newNamespace(t)
	run1 := createPod(t, ns, "run-1", "job", gatedBy("singleton"))
	run2 := createPod(t, ns, "run-2", "job", gatedBy("singleton"))
	lock := createLock(t, ns, "singleton", "job")
	key := ns + "/singleton"
	eventually(t, "run-1 to be ungated", func() bool { return !gatedWith(getPod(t, run1), gateFor("singleton")) })
	bind(t, run1)
	setContainers(t, run1, corev1.PodRunning, running)

	// CronJob Replace, a drain, kubectl delete pod: all graceful.
	if err := k8s.Delete(context.Background(), run1); err != nil {
		t.Fatal(err)
	}
	if getPod(t, run1).DeletionTimestamp.IsZero() {
		t.Fatal("the bound pod was not left terminating")
	}
	settle()
	if !gatedWith(getPod(t, run2), gateFor("singleton")) {
		t.Fatal("run-2 was ungated while run-1's containers still run through their grace period")
	}
	if !holds(t, key, run1) || holderOf(t, lock) != "run-1" {
		t.Fatalf("run-1 lost the lock while still running: %+v", inspect(t, key))
	}

	// The kubelet, having seen the deletion, reports every container
	// terminated: run-1 has stopped.
	kubeletSawDeletion(t, run1)
	setContainers(t, run1, corev1.PodRunning, exited(0))
	eventually(t, "run-2 to be ungated", func() bool { return !gatedWith(getPod(t, run2), gateFor("singleton")) })
	eventually(t, "run-2 to hold the lock", func() bool { return holds(t, key, run2) })
}

// Case 1, in-pod client: a hold the pod's own process took is released only
// once the pod object is gone, not when its deletion starts.
func TestCase1InPodHoldKeptThroughGracefulDeletion(t *testing.T) {
	startManager(t)
	ns := newNamespace(t)
	app := createPod(t, ns, "app", "api", boundPod)
	createPod(t, ns, "standby", "api", boundPod)
	key := ns + "/leader"
	lease := inPodLock(t, app, key)
	lock := createLock(t, ns, "leader", "api")
	eventually(t, "the in-pod hold to show", func() bool { return holderOf(t, lock) == "app" })

	if err := k8s.Delete(context.Background(), app); err != nil {
		t.Fatal(err)
	}
	settle()
	if lease.Err() != nil || holderOf(t, lock) != "app" {
		t.Fatalf("the in-pod hold was released while its process may still run: %v", lease.Err())
	}
	forceDelete(t, app)
	eventually(t, "standby to hold the lock", func() bool { return holderOf(t, lock) == "standby" })
}

// Case 2: when Redis loses the lock of an ungated holder that has not yet
// stopped, the controller takes it again for the same pod and never ungates
// another; if someone else took it, it reports a conflict and waits.
func TestCase2LostLeaseNeverUngatesASecondPod(t *testing.T) {
	startManager(t)
	ns := newNamespace(t)
	run1 := createPod(t, ns, "run-1", "job", gatedBy("singleton"))
	run2 := createPod(t, ns, "run-2", "job", gatedBy("singleton"))
	lock := createLock(t, ns, "singleton", "job", func(l *locksv1.DistributedLock) {
		l.Spec.LeaseDuration = &metav1.Duration{Duration: time.Second}
	})
	key := ns + "/singleton"
	eventually(t, "run-1 to be ungated", func() bool { return !gatedWith(getPod(t, run1), gateFor("singleton")) })
	eventually(t, "run-1 to show as the holder", func() bool { return holderOf(t, lock) == "run-1" })
	token := getLock(t, lock).Status.Holder.Token

	// Redis forgets the lock (a restart without persistence, a failover).
	operator := lockClient(t, "operator")
	if _, err := operator.ForceReleaseClient(context.Background(), key, string(run1.UID)); err != nil {
		t.Fatal(err)
	}
	eventually(t, "run-1 to hold the lock again", func() bool { return holds(t, key, run1) })
	settle()
	if !gatedWith(getPod(t, run2), gateFor("singleton")) {
		t.Fatal("run-2 was ungated while run-1, still pending, had been granted the lock")
	}
	if st := getLock(t, lock).Status; st.Holder == nil || st.Holder.PodName != "run-1" || st.Holder.Token <= token {
		t.Fatalf("status after the loss = %+v, want run-1 with a new token above %d", st.Holder, token)
	}

	// Someone else takes the lock in Redis.
	rdb := redis.NewClient(&redis.Options{Addr: redisAddr})
	defer rdb.Close()
	takeAsOutsider(t, rdb, key)
	assertEvents(t, ns, "Conflict")
	eventually(t, "a Conflict condition", func() bool {
		c := meta.FindStatusCondition(getLock(t, lock).Status.Conditions, "Conflict")
		return c != nil && c.Status == metav1.ConditionTrue
	})
	settle()
	if !gatedWith(getPod(t, run2), gateFor("singleton")) {
		t.Fatal("run-2 was ungated while the lock was in conflict")
	}
	// The outsider lets go: the lock goes back to run-1, not to run-2.
	if _, err := operator.ForceReleaseClient(context.Background(), key, "outsider"); err != nil {
		t.Fatal(err)
	}
	eventually(t, "run-1 to hold the lock again", func() bool { return holds(t, key, run1) })
	eventually(t, "the Conflict condition to clear", func() bool {
		c := meta.FindStatusCondition(getLock(t, lock).Status.Conditions, "Conflict")
		return c == nil || c.Status == metav1.ConditionFalse
	})
	if !gatedWith(getPod(t, run2), gateFor("singleton")) {
		t.Fatal("run-2 was ungated")
	}
}

// Case 3: two locks on one pod. Each keeps its own marks, the controller
// does not fight itself, and a pod guarded by two locks starts only when it
// holds both.
func TestCase3TwoLocksOnOnePod(t *testing.T) {
	h := startManager(t)
	ns := newNamespace(t)
	web := createPod(t, ns, "web-1", "web")
	reader := createLock(t, ns, "reader", "web")
	writer := createLock(t, ns, "writer", "web")
	eventually(t, "web-1 to carry both locks' marks and statuses", func() bool {
		p := getPod(t, web)
		return markedBy(p, "reader") && markedBy(p, "writer") && holderOf(t, reader) == "web-1" && holderOf(t, writer) == "web-1"
	})
	// The grants' own writes end (how soon depends on the machine's load),
	// and then three seconds (three renewals) pass without a write; a
	// controller fighting itself, even now and then, never has them.
	for start := time.Now(); ; {
		before := h.writes.Load()
		time.Sleep(3 * time.Second)
		if n := h.writes.Load() - before; n == 0 {
			break
		} else if time.Since(start) > 8*time.Second {
			t.Fatalf("%d API writes in 3 s with both locks held steadily, %v after they were granted; want 0", n, time.Since(start).Round(time.Second))
		}
	}

	// run-b is guarded by both; run-a, older, by "b-lock" only and holds it.
	runA := createPod(t, ns, "run-a", "batch", gatedBy("b-lock"))
	createLock(t, ns, "b-lock", "batch")
	eventually(t, "run-a to be ungated", func() bool { return len(getPod(t, runA).Spec.SchedulingGates) == 0 })
	runB := createPod(t, ns, "run-b", "batch", gatedBy("a-lock", "b-lock"))
	createLock(t, ns, "a-lock", "batch")
	settle()
	if len(getPod(t, runB).Spec.SchedulingGates) == 0 {
		t.Fatal("run-b was ungated while run-a holds b-lock")
	}
	if markedBy(getPod(t, runB), "b-lock") {
		t.Fatal("run-b carries b-lock's marks while run-a holds it")
	}
	setContainers(t, runA, corev1.PodSucceeded, exited(0))
	eventually(t, "run-b to be ungated", func() bool { return len(getPod(t, runB).Spec.SchedulingGates) == 0 })
	p := getPod(t, runB)
	if !markedBy(p, "a-lock") || !markedBy(p, "b-lock") {
		t.Fatalf("run-b labels %v, want the marks of both locks", p.Labels)
	}
}

// Case 4, one namespace: two locks naming one key agree on one holder and
// one waiting order, neither re-enters the other's grant, and deleting the
// one that did not grant leaves the grant alone.
func TestCase4LocksSharingAKeyInANamespace(t *testing.T) {
	startManager(t)
	ns := newNamespace(t)
	key := sharedKey(ns, "shared")
	p1 := createPod(t, ns, "p1", "x")
	createPod(t, ns, "p2", "y")
	one := createLock(t, ns, "one", "x", func(l *locksv1.DistributedLock) { l.Spec.Key = key })
	eventually(t, "p1 to hold the key", func() bool { return holds(t, key, p1) })
	two := createLock(t, ns, "two", "y", func(l *locksv1.DistributedLock) { l.Spec.Key = key })
	eventually(t, "both locks to agree", func() bool {
		a, b := getLock(t, one).Status, getLock(t, two).Status
		return a.Holder != nil && b.Holder != nil && a.Holder.PodName == "p1" && b.Holder.PodName == "p1" &&
			slices.Equal(a.Waiting, []string{"p2"}) && slices.Equal(b.Waiting, []string{"p2"})
	})
	settle()
	if info := inspect(t, key); len(info.Holders) != 1 || info.Holders[0].Count != 1 {
		t.Fatalf("Redis = %+v, want p1 holding once", info)
	}
	if markedBy(getPod(t, p1), "two") {
		t.Fatal("lock two marked p1, which it does not select")
	}
	if err := k8s.Delete(context.Background(), two); err != nil {
		t.Fatal(err)
	}
	eventually(t, "lock two to go", func() bool {
		return apierrors.IsNotFound(k8s.Get(context.Background(), client.ObjectKeyFromObject(two), &locksv1.DistributedLock{}))
	})
	if !holds(t, key, p1) {
		t.Fatal("deleting lock two released the grant lock one made")
	}
}

// Case 4, one namespace: a grant lost to somebody else while its pod runs
// stays the pod's (sticky), but deleting the lock that made it ends it too
// when no lock left claims the pod: the key then goes to the remaining
// lock's candidate, not back to the old pod.
func TestCase4DeletingALockEndsItsGrantInConflict(t *testing.T) {
	h := startManager(t)
	ns := newNamespace(t)
	key := sharedKey(ns, "shared")
	p1 := createPod(t, ns, "p1", "x")
	p2 := createPod(t, ns, "p2", "y")
	one := createLock(t, ns, "one", "x", func(l *locksv1.DistributedLock) { l.Spec.Key = key })
	eventually(t, "p1 to hold the key", func() bool { return holds(t, key, p1) })
	two := createLock(t, ns, "two", "y", func(l *locksv1.DistributedLock) { l.Spec.Key = key })

	rdb := redis.NewClient(&redis.Options{Addr: redisAddr})
	defer rdb.Close()
	takeAsOutsider(t, rdb, key)
	eventually(t, "a Conflict condition", func() bool {
		return meta.IsStatusConditionTrue(getLock(t, two).Status.Conditions, locksv1.ConditionConflict)
	})
	if err := k8s.Delete(context.Background(), one); err != nil {
		t.Fatal(err)
	}
	eventually(t, "lock one to go", func() bool {
		return apierrors.IsNotFound(k8s.Get(context.Background(), client.ObjectKeyFromObject(one), &locksv1.DistributedLock{}))
	})
	if err := rdb.Del(context.Background(), key).Err(); err != nil {
		t.Fatal(err)
	}
	reconcileKey(t, h, key)
	eventually(t, "p2 to be granted the key", func() bool { return holds(t, key, p2) })
}

// Case 4, two namespaces sharing a key by the administrator's leave: the
// lock in B never shows A's pod, and deleting it releases nothing of A's.
func TestCase4LocksSharingAKeyAcrossNamespaces(t *testing.T) {
	nsA, nsB := newNamespace(t), newNamespace(t)
	key := "shared-" + nsA
	startManager(t, sharing(key, nsA, nsB))
	pa := createPod(t, nsA, "holder-in-a", "x")
	createLock(t, nsA, "a", "x", func(l *locksv1.DistributedLock) { l.Spec.Key = key })
	eventually(t, "pa to hold the key", func() bool { return holds(t, key, pa) })
	createPod(t, nsB, "pb", "y")
	b := createLock(t, nsB, "b", "y", func(l *locksv1.DistributedLock) { l.Spec.Key = key })
	eventually(t, "b to see the key held", func() bool {
		c := meta.FindStatusCondition(getLock(t, b).Status.Conditions, locksv1.ConditionHeld)
		return c != nil && c.Status == metav1.ConditionTrue
	})
	settle()
	st := getLock(t, b).Status
	shown := strings.Join([]string{fmt.Sprintf("%+v", st), eventText(t, nsB)}, "\n")
	for _, secret := range []string{"holder-in-a", string(pa.UID)} {
		if strings.Contains(shown, secret) {
			t.Fatalf("namespace B sees %q of namespace A's pod:\n%s", secret, shown)
		}
	}
	if err := k8s.Delete(context.Background(), b); err != nil {
		t.Fatal(err)
	}
	eventually(t, "lock b to go", func() bool {
		return apierrors.IsNotFound(k8s.Get(context.Background(), client.ObjectKeyFromObject(b), &locksv1.DistributedLock{}))
	})
	if !holds(t, key, pa) {
		t.Fatal("deleting the lock in namespace B released namespace A's holder")
	}
}

// Case 5: a lock without a spec, or with an empty selector, is refused.
func TestCase5LockWithoutSpecRefused(t *testing.T) {
	ns := newNamespace(t)
	obj := &unstructured.Unstructured{}
	obj.SetAPIVersion(locksv1.GroupVersion.String())
	obj.SetKind("DistributedLock")
	obj.SetNamespace(ns)
	obj.SetName("no-spec")
	err := k8s.Create(context.Background(), obj)
	if !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), "spec") {
		t.Fatalf("create without spec: %v; want Invalid, naming spec", err)
	}
	obj.Object["spec"] = map[string]any{"candidates": map[string]any{}}
	err = k8s.Create(context.Background(), obj)
	if !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), "must select pods") {
		t.Fatalf("create with an empty selector: %v; want Invalid", err)
	}
}

func eventText(t *testing.T, ns string) string {
	t.Helper()
	var events corev1.EventList
	if err := k8s.List(context.Background(), &events, client.InNamespace(ns)); err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	for _, e := range events.Items {
		b.WriteString(e.Reason + ": " + e.Message + "\n")
	}
	return b.String()
}

// Case 7: a holder that does not start is reported after the lock's start
// timeout; it keeps the lock unless the lock opts in to evicting it, and
// then the next pod gets the lock only once it is gone.
func TestCase7HolderThatDoesNotStart(t *testing.T) {
	startManager(t)
	ns := newNamespace(t)
	run1 := createPod(t, ns, "run-1", "job", gatedBy("singleton"))
	run2 := createPod(t, ns, "run-2", "job", gatedBy("singleton"))
	lock := createLock(t, ns, "singleton", "job")
	eventually(t, "run-1 to be ungated", func() bool { return !gatedWith(getPod(t, run1), gateFor("singleton")) })
	bind(t, run1)
	setContainers(t, run1, corev1.PodPending, corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "ImagePullBackOff"}})
	shortenStartTimeout(t, lock, "Starting", "ImagePullBackOff")

	want := "run-1 has not started for 1s: ImagePullBackOff"
	eventually(t, "the HolderStarted condition to say why", func() bool {
		c := meta.FindStatusCondition(getLock(t, lock).Status.Conditions, "HolderStarted")
		return c != nil && c.Status == metav1.ConditionFalse && c.Message == want
	})
	assertEvents(t, ns, "NotStarted")
	if !strings.Contains(eventText(t, ns), want) {
		t.Fatalf("no Warning Event says %q:\n%s", want, eventText(t, ns))
	}
	settle()
	if !holds(t, ns+"/singleton", run1) || !gatedWith(getPod(t, run2), gateFor("singleton")) {
		t.Fatal("a holder that did not start lost the lock, though the lock does not opt in to evicting it")
	}

	// Opting in: the controller evicts run-1, and releases the lock only
	// once the pod is gone.
	updateLock(t, lock, func(l *locksv1.DistributedLock) { l.Spec.DeleteUnstarted = true })
	eventually(t, "run-1 to be evicted", func() bool { return !getPod(t, run1).DeletionTimestamp.IsZero() })
	assertEvents(t, ns, "Evicted")
	settle()
	if !holds(t, ns+"/singleton", run1) || !gatedWith(getPod(t, run2), gateFor("singleton")) {
		t.Fatal("the lock was released before the evicted pod was gone")
	}
	forceDelete(t, run1) // the kubelet confirms
	eventually(t, "run-2 to be ungated", func() bool { return !gatedWith(getPod(t, run2), gateFor("singleton")) })
}

// Case 7, with a PodDisruptionBudget: a crash-looping holder (phase
// Running, so the budget applies) that the budget does not let go yet is
// not an error to back off from: the controller says so in a Warning Event,
// keeps the statuses current, and tries again as kubectl drain does.
func TestCase7EvictionRefusedByABudget(t *testing.T) {
	h := startManager(t)
	ns := newNamespace(t)
	run1 := createPod(t, ns, "run-1", "job", gatedBy("singleton"))
	budget := &policyv1.PodDisruptionBudget{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "job"},
		Spec: policyv1.PodDisruptionBudgetSpec{
			MinAvailable: ptr.To(intstr.FromInt32(1)),
			Selector:     &metav1.LabelSelector{MatchLabels: map[string]string{"app": "job"}},
		},
	}
	if err := k8s.Create(context.Background(), budget); err != nil {
		t.Fatal(err)
	}
	// The budget's status, as the disruption controller (not run here)
	// writes it: the crash-looping pod is not healthy, so the budget is not
	// met and allows no disruption, not even of an unhealthy pod. Without a
	// status, the API server waits for that controller on each eviction
	// before refusing it.
	budget.Status = policyv1.PodDisruptionBudgetStatus{ObservedGeneration: budget.Generation,
		ExpectedPods: 1, CurrentHealthy: 0, DesiredHealthy: 1, DisruptionsAllowed: 0}
	if err := k8s.Status().Update(context.Background(), budget); err != nil {
		t.Fatal(err)
	}
	lock := createLock(t, ns, "singleton", "job", func(l *locksv1.DistributedLock) { l.Spec.DeleteUnstarted = true })
	eventually(t, "run-1 to be ungated", func() bool { return !gatedWith(getPod(t, run1), gateFor("singleton")) })
	bind(t, run1)
	setContainers(t, run1, corev1.PodRunning, corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "CrashLoopBackOff"}})
	shortenStartTimeout(t, lock, "Starting", "CrashLoopBackOff")
	time.Sleep(time.Second) // the start timeout

	res := reconcileKey(t, h, lockKey(lock))
	if res.RequeueAfter <= 0 {
		t.Fatal("no retry of the refused eviction was asked for")
	}
	assertEvents(t, ns, "EvictionRefused")
	if !getPod(t, run1).DeletionTimestamp.IsZero() {
		t.Fatal("run-1 was evicted against its budget")
	}

	// The budget goes: the next try evicts run-1.
	if err := k8s.Delete(context.Background(), budget); err != nil {
		t.Fatal(err)
	}
	eventually(t, "run-1 to be evicted", func() bool { return !getPod(t, run1).DeletionTimestamp.IsZero() })
	forceDelete(t, run1) // the kubelet confirms
}

// Case 8: a lock freed outside the controller wakes it through Redis's
// release message, not a poll.
func TestCase8ReleaseOutsideWakesTheController(t *testing.T) {
	startManager(t)
	ns := newNamespace(t)
	app := createPod(t, ns, "app", "api")
	standby := createPod(t, ns, "standby", "api")
	key := ns + "/leader"
	// A minute's lease, renewed every 20 s: its TTL stays above 40 s, so
	// the controller polls the key only 30 s (expiryPollCap) after each
	// reconcile, far past the bound below.
	rdb := redis.NewClient(&redis.Options{Addr: redisAddr})
	defer rdb.Close()
	inPod, err := redislock.New(rdb, redislock.Options{ID: string(app.UID), WatchdogLease: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	defer inPod.Close()
	m, err := inPod.NewMutex(key, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m.Lock(context.Background()); err != nil {
		t.Fatal(err)
	}
	lock := createLock(t, ns, "leader", "api")
	eventually(t, "the in-pod hold to show", func() bool { return holderOf(t, lock) == "app" })
	time.Sleep(2500 * time.Millisecond) // past any poll the first reconciles set

	// The application lets go of the lock itself, as on a step-down.
	released := time.Now()
	if _, err := inPod.ForceReleaseClient(context.Background(), key, string(app.UID)); err != nil {
		t.Fatal(err)
	}
	// The controller grants it to the oldest candidate, the same pod,
	// now on its behalf.
	eventually(t, "the controller to grant the lock", func() bool { return holds(t, key, app) || holds(t, key, standby) })
	if d := time.Since(released); d > 3*time.Second {
		t.Fatalf("the lock was granted %v after its release, want well under the 30 s a poll would wait for", d)
	}
}

// Finalizer: deleting a lock releases what it holds even when its status
// never recorded it.
func TestFinalizerReleasesWithEmptyStatus(t *testing.T) {
	first := startManager(t)
	ns := newNamespace(t)
	a := createPod(t, ns, "a", "web")
	lock := createLock(t, ns, "leader", "web")
	key := ns + "/leader"
	eventually(t, "pod a to hold the lock", func() bool { return holds(t, key, a) && holderOf(t, lock) == "a" })
	first.stop()

	// The status is lost (say, its write failed before the manager died),
	// but for the fencing record, which never decreases.
	l := getLock(t, lock)
	l.Status = locksv1.DistributedLockStatus{HighestToken: l.Status.HighestToken}
	if err := k8s.Status().Update(context.Background(), l); err != nil {
		t.Fatal(err)
	}
	if err := k8s.Delete(context.Background(), l); err != nil {
		t.Fatal(err)
	}
	startManager(t)
	eventually(t, "the lock resource to go", func() bool {
		return apierrors.IsNotFound(k8s.Get(context.Background(), client.ObjectKeyFromObject(lock), &locksv1.DistributedLock{}))
	})
	if inspect(t, key).Held() {
		t.Fatal("the lock is still held in Redis after its resource, with an empty status, was deleted")
	}
	eventually(t, "pod a to be unmarked", func() bool { return !marked(getPod(t, a)) })
}

// Case 8 on a Redis Cluster with sharded pub/sub: a release is SPUBLISHed
// to the lock's shard only, which the controller's pattern subscription
// never hears. It listens on each key somebody else holds instead, so the
// in-pod client's release still wakes it at once rather than at the lease's
// end.
func TestCase8ReleaseOutsideWakesTheControllerOnACluster(t *testing.T) {
	cluster := redistest.StartCluster(t, 3, 0)
	startManagerOn(t, managerConfig{rdb: cluster.Client(t)})
	ns := newNamespace(t)
	app := createPod(t, ns, "app", "api")
	standby := createPod(t, ns, "standby", "api")
	key := ns + "/leader"
	// As above: a poll would come 30 s after a reconcile.
	inPod, err := redislock.New(cluster.Client(t), redislock.Options{ID: string(app.UID), WatchdogLease: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	defer inPod.Close()
	m, err := inPod.NewMutex(key, nil)
	if err != nil {
		t.Fatal(err)
	}
	hold, err := m.Lock(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	lock := createLock(t, ns, "leader", "api")
	eventually(t, "the in-pod hold to show", func() bool { return holderOf(t, lock) == "app" })
	settle() // the controller listens on the key once it has seen the hold

	released := time.Now()
	if err := hold.Unlock(context.Background()); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the controller to grant the lock", func() bool {
		info, err := inPod.Inspect(context.Background(), key)
		if err != nil {
			t.Fatal(err)
		}
		return len(info.Holders) == 1 && (string(info.Holders[0].Owner) == string(app.UID)+":0" || string(info.Holders[0].Owner) == string(standby.UID)+":0")
	})
	if d := time.Since(released); d > 3*time.Second {
		t.Fatalf("the lock was granted %v after its release, want well under the 30 s a poll would wait for", d)
	}
}
