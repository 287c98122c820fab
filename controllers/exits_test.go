package controllers_test

import (
	"context"
	"fmt"
	"net"
	"slices"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"

	"github.com/redis/go-redis/v9"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1 "github.com/lockwarden/lockwarden/api/v1alpha1"
)

// The status is computed on every exit of a reconcile: a failed phase or a
// key that holds non-lock data still shows who holds the key and who waits,
// with a reason and a Warning Event.

// refusePodUpdates installs a ValidatingAdmissionPolicy that refuses every
// update of a pod of the namespace labelled refuse-updates, as another
// tool's webhook or a policy engine could, and waits until the API server
// enforces it.
func refusePodUpdates(t *testing.T, ns string) {
	t.Helper()
	refuseUpdates(t, ns, admissionregistrationv1.Rule{APIGroups: []string{""}, APIVersions: []string{"v1"}, Resources: []string{"pods"}}, "refuse-updates", "")
	probe := createPod(t, ns, "probe", "probe", withLabels(map[string]string{"app": "probe", "refuse-updates": "true"}))
	seq := 0
	eventually(t, "the refusing policy to be enforced", func() bool {
		seq++
		patch := []byte(fmt.Sprintf(`{"metadata":{"annotations":{"probe":"%d"}}}`, seq))
		return k8s.Patch(context.Background(), getPod(t, probe), client.RawPatch("application/merge-patch+json", patch)) != nil
	})
}

// refuseUpdates installs a ValidatingAdmissionPolicy that refuses every
// update of an object of the rule's resources in the namespace that carries
// the label (after the update), with the reason given ("" for the API
// server's default, Invalid).
func refuseUpdates(t *testing.T, ns string, rule admissionregistrationv1.Rule, label string, reason metav1.StatusReason) {
	t.Helper()
	ctx := context.Background()
	inNamespace := &metav1.LabelSelector{MatchLabels: map[string]string{"kubernetes.io/metadata.name": ns}}
	var why *metav1.StatusReason
	if reason != "" {
		why = &reason
	}
	policy := &admissionregistrationv1.ValidatingAdmissionPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: strings.ReplaceAll("refuse-"+rule.Resources[0]+"-updates-"+ns, "/", "-")},
		Spec: admissionregistrationv1.ValidatingAdmissionPolicySpec{
			FailurePolicy: ptr.To(admissionregistrationv1.Fail),
			MatchConstraints: &admissionregistrationv1.MatchResources{
				NamespaceSelector: inNamespace,
				ResourceRules: []admissionregistrationv1.NamedRuleWithOperations{{RuleWithOperations: admissionregistrationv1.RuleWithOperations{
					Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Update},
					Rule:       rule,
				}}},
			},
			MatchConditions: []admissionregistrationv1.MatchCondition{{
				Name: "labelled", Expression: fmt.Sprintf("has(object.metadata.labels) && '%s' in object.metadata.labels", label),
			}},
			Validations: []admissionregistrationv1.Validation{{Expression: "false", Message: "this object's updates are refused", Reason: why}},
		},
	}
	binding := &admissionregistrationv1.ValidatingAdmissionPolicyBinding{
		ObjectMeta: metav1.ObjectMeta{Name: policy.Name},
		Spec: admissionregistrationv1.ValidatingAdmissionPolicyBindingSpec{
			PolicyName:        policy.Name,
			ValidationActions: []admissionregistrationv1.ValidationAction{admissionregistrationv1.Deny},
			MatchResources:    &admissionregistrationv1.MatchResources{NamespaceSelector: inNamespace},
		},
	}
	for _, obj := range []client.Object{policy, binding} {
		if err := k8s.Create(ctx, obj); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = k8s.Delete(context.Background(), obj) })
	}
}

// V2: when the API server refuses the manager's update of the pod it
// granted the key to, the lock still shows the holder and who waits, is
// not Ready with the reason PodUpdateRefused, and a Warning Event tells the
// lock and the pod; the status describes this generation.
func TestARefusedPodUpdateShowsOnTheLock(t *testing.T) {
	ns := newNamespace(t)
	refusePodUpdates(t, ns)
	startManager(t)
	lock := createLock(t, ns, "a", "web")
	first := createPod(t, ns, "w1", "web", gatedBy("a"), withLabels(map[string]string{"app": "web", "refuse-updates": "true"}))
	createPod(t, ns, "w2", "web", gatedBy("a"))
	eventually(t, "the lock to show the refused update, the holder and the waiting pod", func() bool {
		l := getLock(t, lock)
		ready := meta.FindStatusCondition(l.Status.Conditions, locksv1.ConditionReady)
		held := meta.FindStatusCondition(l.Status.Conditions, locksv1.ConditionHeld)
		return ready != nil && ready.Status == metav1.ConditionFalse && ready.Reason == "PodUpdateRefused" &&
			strings.Contains(ready.Message, "w1") && held != nil && held.Status == metav1.ConditionTrue &&
			l.Status.Holder != nil && l.Status.Holder.PodName == "w1" && l.Status.WaitingCount == 1 &&
			l.Status.ObservedGeneration == l.Generation && ready.ObservedGeneration == l.Generation
	})
	eventually(t, "a Warning Event on the lock and on the pod", func() bool {
		return eventOn(t, ns, "DistributedLock", "a", "PodUpdateRefused") && eventOn(t, ns, "Pod", "w1", "PodUpdateRefused")
	})
	eventually(t, "the waiting pod to be told its place", func() bool { return eventOn(t, ns, "Pod", "w2", "Queued") })
	if !gatedWith(getPod(t, first), gateFor("a")) {
		t.Fatal("the refused pod lost its gate")
	}
}

// V1: the pods behind a lock whose key holds data that is not a lock are
// told so, with a Warning Event, and the lock counts them as waiting.
func TestPodsBehindAKeyInUseAreTold(t *testing.T) {
	ns := newNamespace(t)
	startManager(t)
	rdb := redis.NewClient(&redis.Options{Addr: redisAddr})
	defer rdb.Close()
	key := ns + "/counter"
	if err := rdb.Set(context.Background(), key, "42", 0).Err(); err != nil {
		t.Fatal(err)
	}
	lock := createLock(t, ns, "a", "web", func(l *locksv1.DistributedLock) { l.Spec.Key = key })
	createPod(t, ns, "w1", "web", gatedBy("a"))
	eventually(t, "the lock to count the waiting pod, not Ready with KeyInUse", func() bool {
		l := getLock(t, lock)
		ready := meta.FindStatusCondition(l.Status.Conditions, locksv1.ConditionReady)
		return ready != nil && ready.Reason == "KeyInUse" && l.Status.WaitingCount == 1 && l.Status.Holder == nil
	})
	eventually(t, "the pod to be told why it waits", func() bool { return eventOn(t, ns, "Pod", "w1", "KeyInUse") })
}

// V6: a lock refused its key (the key is another namespace's) shows the
// same status whatever the key holds in Redis, so a tenant cannot probe a
// key it may not use for data.
func TestARefusedLockShowsNothingOfItsKey(t *testing.T) {
	owner, tenant := newNamespace(t), newNamespace(t)
	startManager(t)
	rdb := redis.NewClient(&redis.Options{Addr: redisAddr})
	defer rdb.Close()
	ctx := context.Background()
	if err := rdb.HSet(ctx, owner+"/sessions", "user-secret-field", "x").Err(); err != nil {
		t.Fatal(err)
	}
	if err := rdb.Set(ctx, owner+"/counter", "42", 0).Err(); err != nil {
		t.Fatal(err)
	}
	var locks []*locksv1.DistributedLock
	for _, name := range []string{"sessions", "counter", "absent"} {
		locks = append(locks, createLock(t, tenant, name, "web", func(l *locksv1.DistributedLock) { l.Spec.Key = owner + "/" + name }))
	}
	shown := func(l *locksv1.DistributedLock) string {
		l = getLock(t, l)
		var out []string
		for _, c := range l.Status.Conditions {
			out = append(out, fmt.Sprintf("%s=%s %s %s", c.Type, c.Status, c.Reason, strings.ReplaceAll(c.Message, l.Spec.Key, "KEY")))
		}
		return fmt.Sprintf("%v holder=%v waiting=%d", out, l.Status.Holder, l.Status.WaitingCount)
	}
	eventually(t, "every refused lock to show KeyNotPermitted", func() bool {
		for _, l := range locks {
			c := meta.FindStatusCondition(getLock(t, l).Status.Conditions, locksv1.ConditionReady)
			if c == nil || c.Reason != "KeyNotPermitted" {
				return false
			}
		}
		return true
	})
	settle()
	want := shown(locks[2])
	for _, l := range locks[:2] {
		if got := shown(l); got != want {
			t.Errorf("lock %s on a key holding data shows\n%s\nand on an absent key\n%s", l.Name, got, want)
		}
	}
	for _, reason := range []string{"KeyInUse", "RedisUnavailable"} {
		if eventOn(t, tenant, "DistributedLock", "sessions", reason) || eventOn(t, tenant, "DistributedLock", "counter", reason) {
			t.Errorf("a refused lock was told %s", reason)
		}
	}
}

// refuseLockUpdates installs a ValidatingAdmissionPolicy that refuses every
// update of a lock of the namespace labelled refuse-updates, and waits until
// the API server enforces it.
func refuseLockUpdates(t *testing.T, ns string) {
	t.Helper()
	refuseUpdates(t, ns, admissionregistrationv1.Rule{APIGroups: []string{locksv1.GroupVersion.Group}, APIVersions: []string{"*"}, Resources: []string{"distributedlocks"}}, "refuse-updates", "")
	probe := createLock(t, ns, "probe", "probe", func(l *locksv1.DistributedLock) { l.Labels = map[string]string{"refuse-updates": "true"} })
	seq := 0
	eventually(t, "the refusing policy to be enforced", func() bool {
		seq++
		patch := []byte(fmt.Sprintf(`{"metadata":{"annotations":{"probe":"%d"}}}`, seq))
		return k8s.Patch(context.Background(), getLock(t, probe), client.RawPatch("application/merge-patch+json", patch)) != nil
	})
}

// A lock whose finalizer the API server refuses to add (another tool's
// webhook, a policy engine) is granted nothing, since deleting it would
// release nothing. Its status shows the key as read (its waiting pod), not
// Ready with the reason LockUpdateRefused, with a Warning Event; once the
// update is accepted, the pod is granted the key.
func TestARefusedFinalizerShowsOnTheLock(t *testing.T) {
	ns := newNamespace(t)
	refuseLockUpdates(t, ns)
	startManager(t)
	lock := createLock(t, ns, "a", "web", func(l *locksv1.DistributedLock) { l.Labels = map[string]string{"refuse-updates": "true"} })
	pod := createPod(t, ns, "w1", "web", gatedBy("a"))
	eventually(t, "the lock to show the refused update and the waiting pod", func() bool {
		l := getLock(t, lock)
		ready := meta.FindStatusCondition(l.Status.Conditions, locksv1.ConditionReady)
		return ready != nil && ready.Status == metav1.ConditionFalse && ready.Reason == "LockUpdateRefused" &&
			strings.Contains(ready.Message, "finalizer") && l.Status.WaitingCount == 1 && l.Status.ObservedGeneration == l.Generation
	})
	eventually(t, "a Warning Event on the lock", func() bool { return eventOn(t, ns, "DistributedLock", "a", "LockUpdateRefused") })
	if !gatedWith(getPod(t, pod), gateFor("a")) || len(getLock(t, lock).Finalizers) > 0 {
		t.Fatal("a lock without its finalizer granted its key")
	}
	updateLock(t, lock, func(l *locksv1.DistributedLock) { l.Labels = nil })
	eventually(t, "the pod to be granted the key once the lock has its finalizer", func() bool {
		return !gatedWith(getPod(t, pod), gateFor("a"))
	})
}

// The statuses written when a lock's finalizer is refused show the key as
// read, a conflict included: a second lock of the key, refused its
// finalizer, shows the conflict, and does not make the first lock show it
// gone, while the pod granted the key has not stopped and an outsider
// holds the key in Redis.
func TestARefusedFinalizerShowsTheKeysConflict(t *testing.T) {
	ns := newNamespace(t)
	refuseLockUpdates(t, ns)
	startManagerOn(t, managerConfig{redisAddr: redisAddr, namespaces: []string{ns}})
	first := createLock(t, ns, "first", "job")
	key := lockKey(first)
	run := createPod(t, ns, "run", "job", gatedBy("first"))
	eventually(t, "run to be granted the key", func() bool { return holderOf(t, first) == "run" })
	bind(t, run) // scheduled, pulling its image: granted, not stopped
	rdb := redis.NewClient(&redis.Options{Addr: redisAddr})
	defer rdb.Close()
	takeAsOutsider(t, rdb, key)
	conflict := func(l *locksv1.DistributedLock) bool {
		return meta.IsStatusConditionTrue(getLock(t, l).Status.Conditions, locksv1.ConditionConflict)
	}
	eventually(t, "the first lock to show the conflict", func() bool { return conflict(first) })

	second := createLock(t, ns, "second", "job", func(l *locksv1.DistributedLock) {
		l.Spec.Key = key
		l.Labels = map[string]string{"refuse-updates": "true"}
	})
	eventually(t, "the second lock to show its refused finalizer", func() bool {
		ready := meta.FindStatusCondition(getLock(t, second).Status.Conditions, locksv1.ConditionReady)
		return ready != nil && ready.Reason == "LockUpdateRefused"
	})
	settle()
	if !conflict(second) || !conflict(first) {
		t.Fatalf("with the finalizer refused, the conflict shows on the second lock: %v, on the first: %v\n%s\n%s",
			conflict(second), conflict(first), conditionText(getLock(t, second)), conditionText(getLock(t, first)))
	}
}

// When the manager cannot read the key's pods (the API server fails its
// reads), the lock shows it, not Ready with the reason ReadFailed and who
// holds the key unknown, and recovers once the reads do.
func TestAFailedReadShowsOnTheLock(t *testing.T) {
	ns := newNamespace(t)
	var failing atomic.Bool
	startManagerOn(t, managerConfig{redisAddr: redisAddr, namespaces: []string{ns}, failPodLists: &failing})
	lock := createLock(t, ns, "a", "web")
	createPod(t, ns, "w1", "web", gatedBy("a"))
	eventually(t, "the pod to be granted the key", func() bool { return holderOf(t, lock) == "w1" })
	failing.Store(true)
	// Any change wakes the key; its reconcile cannot read the pods.
	updateLock(t, lock, func(l *locksv1.DistributedLock) { l.Annotations = map[string]string{"touched": "1"} })
	eventually(t, "the lock to show the failed read", func() bool {
		l := getLock(t, lock)
		ready := meta.FindStatusCondition(l.Status.Conditions, locksv1.ConditionReady)
		held := meta.FindStatusCondition(l.Status.Conditions, locksv1.ConditionHeld)
		return ready != nil && ready.Reason == "ReadFailed" && held != nil && held.Status == metav1.ConditionUnknown
	})
	eventually(t, "a Warning Event on the lock", func() bool { return eventOn(t, ns, "DistributedLock", "a", "ReadFailed") })
	failing.Store(false)
	eventually(t, "the lock to be Ready again, held by w1", func() bool {
		l := getLock(t, lock)
		return meta.IsStatusConditionTrue(l.Status.Conditions, locksv1.ConditionReady) && holderOf(t, lock) == "w1"
	})
}

// Two locks of a namespace deleted together both end the grant of a pod
// that no lock left claims. While Redis fails that release, neither lock
// goes: a deleting lock goes only once the grants it ends are released,
// whichever of them made the release.
func TestDeletingLocksGoOnlyOnceTheirReleaseIsMade(t *testing.T) {
	ns := newNamespace(t)
	key := sharedKey(ns, "k")
	first := createLock(t, ns, "first", "job", func(l *locksv1.DistributedLock) { l.Spec.Key = key })
	second := createLock(t, ns, "second", "job", func(l *locksv1.DistributedLock) { l.Spec.Key = key })
	run := createPod(t, ns, "run", "job") // a candidate no gate holds back
	releases, everything, failed := &atomic.Bool{}, &atomic.Bool{}, &atomic.Int32{}
	rdb := redis.NewClient(&redis.Options{Addr: redisAddr})
	rdb.AddHook(failCalls{releases: releases, everything: everything, failed: failed, prefix: string(run.UID) + ":"})
	startManagerOn(t, managerConfig{rdb: rdb, namespaces: []string{ns}})
	eventually(t, "run to be granted the key", func() bool { return holds(t, key, run) })

	// Both deletions are seen together: while the first alone is, the
	// second lock, live, still claims run, and the first rightly goes
	// without a release. Redis fails every call meanwhile.
	everything.Store(true)
	deleteLock(t, first)
	deleteLock(t, second)
	eventually(t, "both locks to be deleting", func() bool {
		return getLock(t, first).DeletionTimestamp != nil && getLock(t, second).DeletionTimestamp != nil
	})
	settle()
	releases.Store(true)
	everything.Store(false)
	eventually(t, "the manager to try the release", func() bool { return failed.Load() > 0 })
	settle()
	for _, l := range []*locksv1.DistributedLock{first, second} {
		if lockGone(t, l) && holds(t, key, run) {
			t.Fatalf("lock %s went while Redis still holds the key for run, whose grant it ends", l.Name)
		}
	}
	releases.Store(false)
	eventually(t, "both locks to go, with run's grant released", func() bool {
		return lockGone(t, first) && lockGone(t, second) && !holds(t, key, run)
	})
}

// failCalls fails the manager's calls: while releases is set, those that
// carry the owner prefix (its forced releases of a pod's holds), counted in
// failed; while everything is set, all. Each fails as a connection reset
// before Redis answered.
type failCalls struct {
	releases, everything *atomic.Bool
	failed               *atomic.Int32
	prefix               string
}

func (f failCalls) DialHook(next redis.DialHook) redis.DialHook { return next }

func (f failCalls) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		release := f.releases.Load() && slices.Contains(cmd.Args(), any(f.prefix))
		if release {
			f.failed.Add(1)
		}
		if f.everything.Load() || release {
			err := &net.OpError{Op: "read", Net: "tcp", Err: syscall.ECONNRESET}
			cmd.SetErr(err)
			return err
		}
		return next(ctx, cmd)
	}
}

func (f failCalls) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if f.everything.Load() {
			err := &net.OpError{Op: "read", Net: "tcp", Err: syscall.ECONNRESET}
			for _, cmd := range cmds {
				cmd.SetErr(err)
			}
			return err
		}
		return next(ctx, cmds)
	}
}
