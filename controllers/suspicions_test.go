package controllers_test

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"k8s.io/apimachinery/pkg/api/meta"

	locksv1 "github.com/lockwarden/lockwarden/api/v1alpha1"
)

// Suspicion 2 of issue 29: in a namespace the key was un-shared from, two
// refused locks record one grant of a running pod; deleting one of them
// must not release the grant the other still records (the grant made
// while the namespace could use the key is kept until its pod stops).
func TestDeletingOneOfTwoRefusedLocksKeepsTheGrantTheOtherRecords(t *testing.T) {
	nsA, nsB := newNamespace(t), newNamespace(t)
	key := "shared-" + nsA
	first := startManager(t, sharing(key, nsA, nsB))
	q := createPod(t, nsB, "q", "y") // unguarded: running, granted while it runs
	b1 := createLock(t, nsB, "b1", "y", func(l *locksv1.DistributedLock) { l.Spec.Key = key })
	b2 := createLock(t, nsB, "b2", "y", func(l *locksv1.DistributedLock) { l.Spec.Key = key })
	eventually(t, "q's grant to be recorded on both locks", func() bool {
		g1, g2 := getLock(t, b1).Status.Grant, getLock(t, b2).Status.Grant
		return holds(t, key, q) && g1 != nil && g1.PodName == "q" && g2 != nil && g2.PodName == "q"
	})
	first.stop()

	startManager(t, sharing(key, nsA))
	eventually(t, "both locks to be refused their key", func() bool {
		for _, l := range []*locksv1.DistributedLock{b1, b2} {
			if c := meta.FindStatusCondition(getLock(t, l).Status.Conditions, locksv1.ConditionReady); c == nil || c.Reason != "KeyNotPermitted" {
				return false
			}
		}
		return true
	})
	rdb := redis.NewClient(&redis.Options{Addr: redisAddr})
	defer rdb.Close()
	ctx := context.Background()
	sub := rdb.Subscribe(ctx, "redisson_lock__channel:{"+key+"}")
	defer sub.Close()
	if _, err := sub.Receive(ctx); err != nil {
		t.Fatal(err)
	}
	deleteLock(t, b1)
	select {
	case msg := <-sub.Channel():
		t.Fatalf("deleting b1 released the key (%q) while b2 records q's grant and q runs", msg.Payload)
	case <-time.After(3 * time.Second):
	}
	if !holds(t, key, q) || eventOn(t, nsB, "DistributedLock", "b1", "Released") {
		t.Fatalf("q lost the key b2 records for it: %+v", inspect(t, key))
	}
}

// Suspicion 3 of issue 29: without the gating policy active when a pod is
// created (not installed yet, or Kubernetes 1.34-1.35 without the feature
// gate), a pod with only the lockwarden.dev/lock label carries no gate: an
// unguarded candidate. The policy gates only at creation, so labelling an
// existing pod plays it. The pod and the lock are warned.
func TestAPodNamingALockWithoutItsGateIsWarned(t *testing.T) {
	ns := newNamespace(t)
	startManager(t)
	createLock(t, ns, "singleton", "", func(l *locksv1.DistributedLock) { l.Spec.Candidates = nil })
	pod := createPod(t, ns, "run-1", "job")
	labelPod(t, pod, locksv1.LockLabel, "singleton")
	if len(getPod(t, pod).Spec.SchedulingGates) != 0 {
		t.Fatal("the pod was gated after its creation")
	}
	eventually(t, "the pod and the lock to be warned", func() bool {
		return eventOn(t, ns, "Pod", "run-1", "NotGuarded") && eventOn(t, ns, "DistributedLock", "singleton", "NotGuarded")
	})
}
