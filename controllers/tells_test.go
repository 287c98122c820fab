package controllers_test

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	locksv1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/controllers"
	"github.com/lockwarden/lockwarden/internal/redistest"
	"github.com/lockwarden/lockwarden/pkg/redislock"
)

// A manager deposed while paused wakes with a cache that still shows the
// world before: its grant to x recorded, x running. Meanwhile another
// manager saw x stop, released it and granted y, and recorded that. The
// deposed manager's status writes are refused (each is preconditioned on
// the resourceVersion it read), and the Events that would announce what
// those statuses show must not go out either: no "Conflict: another owner
// holds the key, but pod x was granted it" while the lock shows y holding
// it without conflict.
func TestADeposedManagerAnnouncesNothingItsStatusDoesNotShow(t *testing.T) {
	ns := newNamespace(t)
	proxy := redistest.StartProxy(t, redisAddr)
	var frozen atomic.Bool
	a := startManagerOn(t, managerConfig{redisAddr: proxy.Addr, namespaces: []string{ns}, frozen: &frozen})
	lock := createLock(t, ns, "a", "job")
	key := lockKey(lock)
	x := createPod(t, ns, "x", "job", gatedBy("a"))
	eventually(t, "x to be granted and ungated", func() bool { return !gatedWith(getPod(t, x), gateFor("a")) })
	setContainers(t, x, corev1.PodRunning, corev1.ContainerState{Running: &corev1.ContainerStateRunning{}})
	eventually(t, "the lock to show x running as its holder", func() bool {
		l := getLock(t, lock)
		c := meta.FindStatusCondition(l.Status.Conditions, locksv1.ConditionHolderStarted)
		return l.Status.Holder != nil && l.Status.Holder.PodName == "x" && c != nil && c.Status == "True"
	})

	// A is paused: its cache stops here, and its Redis goes quiet while
	// the other manager acts.
	frozen.Store(true)
	proxy.Cut()
	setContainers(t, x, corev1.PodSucceeded, corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{}})
	y := createPod(t, ns, "y", "job", gatedBy("a"))
	other := lockClient(t, "other-manager")
	if _, err := other.ForceReleaseClient(context.Background(), key, string(x.UID)); err != nil {
		t.Fatal(err)
	}
	m, err := other.NewMutex(key, &redislock.MutexOptions{Owner: redislock.Owner(string(y.UID) + ":0")})
	if err != nil {
		t.Fatal(err)
	}
	hold, err := m.TryLock(context.Background(), 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := updateLockStatus(t, lock, func(l *locksv1.DistributedLock) {
		l.Status.Grant = &locksv1.LockGrant{PodName: "y", PodUID: string(y.UID), Token: hold.Token(), GateLifted: true, Since: metav1.Now()}
		l.Status.HighestToken = hold.Token()
	}); err != nil {
		t.Fatal(err)
	}
	written := getLock(t, lock).ResourceVersion

	// A wakes, deposed, and reconciles on what it saw.
	proxy.Heal()
	for range 3 {
		_, err := a.r.Reconcile(context.Background(), controllers.KeyRequest{Key: key})
		t.Logf("the deposed manager's reconcile: %v", err)
	}
	a.stop() // flushes its Events
	if rv := getLock(t, lock).ResourceVersion; rv != written {
		t.Fatalf("the deposed manager wrote the lock's status (resourceVersion %s, was %s)", rv, written)
	}
	for _, line := range strings.Split(eventText(t, ns), "\n") {
		if strings.HasPrefix(line, "Conflict:") || strings.HasPrefix(line, "RedisUnavailable:") {
			t.Errorf("the deposed manager announced what no status shows: %s", line)
		}
	}
}
