package controllers_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	locksv1 "github.com/lockwarden/lockwarden/api/v1alpha1"
)

// Case 6: a namespace may only use keys of its own unless the administrator
// shares one, and a lock never shows what a key that is not a lock holds.
func TestCase6KeyPolicyAndRedaction(t *testing.T) {
	startManager(t)
	ns := newNamespace(t)
	rdb := redis.NewClient(&redis.Options{Addr: redisAddr})
	defer rdb.Close()
	ctx := context.Background()
	createPod(t, ns, "web-1", "web")

	ready := func(lock *locksv1.DistributedLock) *metav1.Condition {
		return meta.FindStatusCondition(getLock(t, lock).Status.Conditions, locksv1.ConditionReady)
	}

	// A key outside the namespace, shared by nobody: squatting refused.
	squat := "payments-" + ns
	squatter := createLock(t, ns, "squatter", "web", func(l *locksv1.DistributedLock) { l.Spec.Key = squat })
	eventually(t, "the squatting lock to be refused", func() bool {
		c := ready(squatter)
		return c != nil && c.Status == metav1.ConditionFalse && c.Reason == "KeyNotPermitted" && strings.Contains(c.Message, "--shared-key")
	})
	settle()
	if inspect(t, squat).Held() {
		t.Fatal("a lock on a key not its namespace's took it in Redis")
	}

	// A key of the namespace's own that holds another application's hash.
	other := ns + "/sessions"
	if err := rdb.HSet(ctx, other, "user-secret-field", "x").Err(); err != nil {
		t.Fatal(err)
	}
	reader := createLock(t, ns, "reader", "web", func(l *locksv1.DistributedLock) { l.Spec.Key = other })
	eventually(t, "the lock on a foreign hash to be refused", func() bool {
		c := ready(reader)
		return c != nil && c.Status == metav1.ConditionFalse && c.Reason == "KeyInUse"
	})
	// A key of another type: Redis's error is not echoed.
	str := ns + "/counter"
	if err := rdb.Set(ctx, str, "42", 0).Err(); err != nil {
		t.Fatal(err)
	}
	prober := createLock(t, ns, "prober", "web", func(l *locksv1.DistributedLock) { l.Spec.Key = str })
	eventually(t, "the lock on a string key to be refused", func() bool {
		c := ready(prober)
		return c != nil && c.Status == metav1.ConditionFalse
	})
	settle()
	for _, l := range []*locksv1.DistributedLock{reader, prober} {
		shown := eventText(t, ns) + strings.Join(conditionText(getLock(t, l)), "\n")
		if h := getLock(t, l).Status.Holder; h != nil {
			t.Fatalf("%s shows a holder %+v read from a key that is not a lock", l.Name, h)
		}
		for _, leak := range []string{"user-secret-field", "WRONGTYPE", "wrong kind"} {
			if strings.Contains(shown, leak) {
				t.Fatalf("%s shows %q from Redis:\n%s", l.Name, leak, shown)
			}
		}
	}
	if v, _ := rdb.Get(ctx, str).Result(); v != "42" {
		t.Fatalf("the string key was changed to %q", v)
	}
}

func conditionText(lock *locksv1.DistributedLock) []string {
	var out []string
	for _, c := range lock.Status.Conditions {
		out = append(out, c.Type+" "+c.Reason+": "+c.Message)
	}
	return out
}

// Un-sharing a key while a pod of the namespace holds a grant of it: the
// administrator restarts the manager without the namespace in --shared-key.
// The grant stays sticky until its pod stops, as every grant does: the
// namespace is granted nothing new, but a pod already ungated keeps the key,
// and nobody else is ungated while it runs.
func TestUnsharingAKeyKeepsARunningGrant(t *testing.T) {
	nsA, nsB := newNamespace(t), newNamespace(t)
	key := "shared-" + nsA
	first := startManager(t, sharing(key, nsA, nsB))
	pb := createPod(t, nsB, "pb", "y", gatedBy("b"))
	b := createLock(t, nsB, "b", "y", func(l *locksv1.DistributedLock) { l.Spec.Key = key })
	eventually(t, "pb to be granted, ungated and shown", func() bool {
		return holds(t, key, pb) && !gatedWith(getPod(t, pb), gateFor("b")) && holderOf(t, b) == "pb"
	})
	setPhase(t, getPod(t, pb), corev1.PodRunning)
	first.stop()

	second := startManager(t, sharing(key, nsA))
	pa := createPod(t, nsA, "pa", "x", gatedBy("a"))
	createLock(t, nsA, "a", "x", func(l *locksv1.DistributedLock) { l.Spec.Key = key })
	eventually(t, "lock b to be refused its key", func() bool {
		c := meta.FindStatusCondition(getLock(t, b).Status.Conditions, locksv1.ConditionReady)
		return c != nil && c.Reason == "KeyNotPermitted"
	})
	time.Sleep(4 * time.Second) // past the 3 s lease the old manager renewed
	if !gatedWith(getPod(t, pa), gateFor("a")) {
		t.Fatal("pa was ungated while pb, granted the key before it was un-shared, still runs")
	}
	if !holds(t, key, pb) {
		t.Fatalf("pb's grant lapsed while pb runs: %+v", inspect(t, key))
	}

	// Redis loses pb's grant (issue 20, case 3): the grant is sticky all
	// the same, as lock b's status records it, so the key is taken again
	// for pb and pa stays gated.
	rdb := redis.NewClient(&redis.Options{Addr: redisAddr})
	defer rdb.Close()
	if err := rdb.Del(context.Background(), key).Err(); err != nil {
		t.Fatal(err)
	}
	reconcileKey(t, second, key)
	if !holds(t, key, pb) {
		t.Fatalf("pb's grant was not taken again after Redis lost it: %+v", inspect(t, key))
	}
	settle()
	if !gatedWith(getPod(t, pa), gateFor("a")) {
		t.Fatal("pa was ungated while pb, whose grant Redis lost, still runs")
	}

	// pb ends: its grant is released, and pa, in a namespace that may use
	// the key, is granted it.
	setPhase(t, getPod(t, pb), corev1.PodSucceeded)
	eventually(t, "pa to be granted the key", func() bool {
		return holds(t, key, pa) && !gatedWith(getPod(t, pa), gateFor("a"))
	})
}

// A pod behind the gates of two locks is granted the first key only once
// the second lock could grant it too (whyWaits). So a change to one lock
// (here its selector, which now selects the pod) must look again at the
// keys of the other locks gating its pods: nothing else would, and in a
// fault run a pod waited for ever, every key free.
func TestAChangeToOneLockLooksAgainAtItsPodsOtherKeys(t *testing.T) {
	startManager(t)
	ns := newNamespace(t)
	p := createPod(t, ns, "p", "job", gatedBy("first", "second"))
	first := createLock(t, ns, "first", "job")
	second := createLock(t, ns, "second", "other")
	eventually(t, "p to be blocked on the first key, as the second lock does not select it", func() bool {
		st := getLock(t, first).Status
		return len(st.Blocked) == 1 && st.Blocked[0].PodName == "p" && strings.Contains(st.Blocked[0].Reason, "does not select")
	})
	settle()
	updateLock(t, second, func(l *locksv1.DistributedLock) {
		l.Spec.Candidates.MatchLabels["app"] = "job"
	})
	eventually(t, "p to be granted both keys and ungated", func() bool {
		return holds(t, ns+"/first", p) && holds(t, ns+"/second", p) && len(getPod(t, p).Spec.SchedulingGates) == 0
	})
}

// The same for a pod that holds its first key and waits behind the second
// lock's gate: once that lock no longer selects it, the gate can never be
// lifted, and the pod is late to start rather than waiting (watchStartup),
// which the first lock's status must say (and, with deleteUnstarted, act
// on), though nothing happened to the first key.
func TestAChangeToOneLockLooksAgainAtTheKeysItsPodsHold(t *testing.T) {
	startManager(t)
	ns := newNamespace(t)
	blocker := createPod(t, ns, "blocker", "job", gatedBy("second"))
	second := createLock(t, ns, "second", "job")
	eventually(t, "blocker to hold the second key", func() bool { return holds(t, ns+"/second", blocker) })
	p := createPod(t, ns, "p", "job", gatedBy("first", "second"))
	first := createLock(t, ns, "first", "job")
	holderStarted := func() *metav1.Condition {
		return meta.FindStatusCondition(getLock(t, first).Status.Conditions, locksv1.ConditionHolderStarted)
	}
	eventually(t, "p to hold the first key and wait behind the second lock's gate", func() bool {
		c := holderStarted()
		return holds(t, ns+"/first", p) && c != nil && c.Reason == "WaitingForGates"
	})
	time.Sleep(3 * time.Second) // past any look at the first key the grant asked for
	updateLock(t, second, func(l *locksv1.DistributedLock) { l.Spec.Candidates.MatchLabels["app"] = "other" })
	eventually(t, "the first lock to say p is late to start, behind a gate no lock can lift", func() bool {
		c := holderStarted()
		return c != nil && c.Reason == "Starting" && strings.Contains(c.Message, "does not select")
	})
}
