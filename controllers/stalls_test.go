package controllers_test

import (
	"context"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	locksv1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/internal/redistest"
)

// A Redis stall of a few seconds (a paused server, a failover), whose calls
// block and then succeed, shows on the locks whose keys the manager holds:
// Ready stays True with the reason RedisSlow and the stall's longest call,
// and a Warning Event. The holder keeps the lock. A stall met only by the
// watchdog's renewals, while nothing else happens, shows too.
func TestARedisStallShowsOnTheLocks(t *testing.T) {
	t.Run("met-by-a-reconcile", func(t *testing.T) { redisStallScenario(t, true) })
	t.Run("met-by-a-renewal", func(t *testing.T) { redisStallScenario(t, false) })
}

func redisStallScenario(t *testing.T, touch bool) {
	srv := redistest.Start(t)
	ns := newNamespace(t)
	startManagerOn(t, managerConfig{redisAddr: srv.Addr, namespaces: []string{ns}})
	lock := createLock(t, ns, "a", "web", func(l *locksv1.DistributedLock) {
		// Renewed every 2 s: a 4.5 s stall holds one back over 2 s.
		l.Spec.LeaseDuration = &metav1.Duration{Duration: 6 * time.Second}
	})
	pod := createPod(t, ns, "w1", "web", gatedBy("a"))
	eventually(t, "the pod to be granted the key", func() bool { return holderOf(t, lock) == "w1" })
	setContainers(t, pod, corev1.PodRunning, corev1.ContainerState{Running: &corev1.ContainerStateRunning{}})
	eventually(t, "the lock to show the holder started", func() bool {
		return meta.IsStatusConditionTrue(getLock(t, lock).Status.Conditions, locksv1.ConditionHolderStarted)
	})
	settle() // nothing is left to look at again: the key is held steadily
	if c := meta.FindStatusCondition(getLock(t, lock).Status.Conditions, locksv1.ConditionReady); c == nil || c.Reason != "RedisReachable" {
		t.Fatalf("Ready before the stall: %+v", c)
	}

	rdb := srv.Client(t)
	if err := rdb.Do(context.Background(), "CLIENT", "PAUSE", "4500", "ALL").Err(); err != nil {
		t.Fatal(err)
	}
	if touch {
		// A change of the lock makes the manager read the key during the stall.
		updateLock(t, lock, func(l *locksv1.DistributedLock) { l.Annotations = map[string]string{"touched": "1"} })
	}
	eventually(t, "the lock to show the stall", func() bool {
		c := meta.FindStatusCondition(getLock(t, lock).Status.Conditions, locksv1.ConditionReady)
		return c != nil && c.Status == metav1.ConditionTrue && c.Reason == "RedisSlow" && strings.Contains(c.Message, "took")
	})
	eventually(t, "a Warning Event on the lock", func() bool { return eventOn(t, ns, "DistributedLock", "a", "RedisSlow") })
	if h := holderOf(t, lock); h != "w1" {
		t.Fatalf("the holder after the stall is %q", h)
	}
}
