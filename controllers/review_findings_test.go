package controllers_test

import (
	"context"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/pkg/redislock"
)

// The tests in this file pin what an adversarial review of the Observe mode,
// un-sharing and pod-cache changes found.

// A gate of a lock in mode Observe is never lifted, so a pod behind one is
// never granted anything, whatever the key order: granted, it could never
// start, and the next candidate would wait behind it forever.
func TestPodBehindAnObserveGateIsNotGranted(t *testing.T) {
	startManager(t)
	ns := newNamespace(t)
	createLock(t, ns, "zz-observe", "other", func(l *locksv1.DistributedLock) { l.Spec.Mode = locksv1.ModeObserve })
	p1 := createPod(t, ns, "p1", "x", gatedBy("a", "zz-observe"))
	time.Sleep(10 * time.Millisecond)
	p2 := createPod(t, ns, "p2", "x", gatedBy("a"))
	createLock(t, ns, "a", "x")
	key := ns + "/a"
	eventually(t, "someone to be granted "+key, func() bool { return holds(t, key, p1) || holds(t, key, p2) })
	settle()
	if holds(t, key, p1) {
		t.Fatalf("p1, behind the never-lifted gate of Observe lock zz-observe, was granted %s (gates now %v); p2 still gated: %v",
			key, getPod(t, p1).Spec.SchedulingGates, gatedWith(getPod(t, p2), gateFor("a")))
	}
}

// A grantee's marks are what recovers its grant after the manager was away
// longer than the lease. Marks someone removes (`kubectl label/annotate
// ...-`) must be written back at once, though updates that only set marks
// are ignored; else after a restart past the lease the next guarded pod is
// ungated while the first still runs.
func TestDeletedMarksAreRestored(t *testing.T) {
	first := startManager(t)
	ns := newNamespace(t)
	// p2 is the older pod, held back at first by a gate of a lock that does
	// not exist yet, so p1 is granted the key first.
	p2 := createPod(t, ns, "p2", "x", gatedBy("a", "later"))
	time.Sleep(1100 * time.Millisecond) // creation timestamps have 1 s resolution
	p1 := createPod(t, ns, "p1", "x", gatedBy("a"))
	createLock(t, ns, "a", "x")
	key := ns + "/a"
	eventually(t, "p1 granted and ungated", func() bool {
		return holds(t, key, p1) && !gatedWith(getPod(t, p1), gateFor("a"))
	})
	bind(t, p1)
	setContainers(t, p1, corev1.PodRunning, running)
	ungate := []byte(`{"spec":{"schedulingGates":[{"name":"gate.lockwarden.dev/a"}]}}`)
	if err := k8s.Patch(context.Background(), getPod(t, p2), client.RawPatch(types.MergePatchType, ungate)); err != nil {
		t.Fatal(err)
	}
	eventually(t, "p1 marked", func() bool { return markedBy(getPod(t, p1), "a") })
	settle()
	if g := getPod(t, p2).Spec.SchedulingGates; len(g) != 1 || g[0].Name != gateFor("a") {
		t.Fatalf("setup: p2's gates are %v, want only a's", g)
	}

	// Somebody removes the marks (the labels and annotations lockwarden owns).
	patch := []byte(`{"metadata":{"labels":{"holder.lockwarden.dev/a":null},"annotations":{"owner.lockwarden.dev/a":null,"token.lockwarden.dev/a":null,"since.lockwarden.dev/a":null}}}`)
	if err := k8s.Patch(context.Background(), getPod(t, p1), client.RawPatch(types.MergePatchType, patch)); err != nil {
		t.Fatal(err)
	}
	// Nothing polls a grant the controller keeps: only the pod's update
	// can bring the marks back.
	eventually(t, "p1's deleted marks to be written back", func() bool { return markedBy(getPod(t, p1), "a") })

	// The manager is away longer than the 3 s lease, and comes back.
	first.stop()
	time.Sleep(4 * time.Second)
	startManager(t)
	time.Sleep(3 * time.Second)
	p2now := getPod(t, p2)
	if !gatedWith(p2now, gateFor("a")) {
		t.Errorf("p2 was ungated while p1, granted %s, still runs; Redis: %+v", key, inspect(t, key))
	}
}

// A namespace that may not use a key cannot make the controller hold it for
// one of its pods: a hold in Redis under "<own pod UID>:0" is as forgeable
// as marks, by a tenant whose pods hold Redis credentials (lockwarden run).
// Only a grant its lock's status records, made while the key was shared, is
// kept (TestUnsharingAKeyKeepsARunningGrant).
func TestForgedGrantOfANotPermittedNamespaceIsNotAdopted(t *testing.T) {
	nsA, nsN := newNamespace(t), newNamespace(t)
	key := "shared-" + nsA
	startManager(t, sharing(key, nsA))
	pn := createPod(t, nsN, "squatter", "s")
	createLock(t, nsN, "squat", "s", func(l *locksv1.DistributedLock) { l.Spec.Key = key })

	// The tenant of nsN writes a hold in Redis as if the controller had
	// granted its pod the key, and lets it lapse (3 s lease, never renewed).
	c := lockClient(t, "tenant")
	m, err := c.NewMutex(key, &redislock.MutexOptions{Owner: redislock.Owner(string(pn.UID) + ":0")})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m.TryLock(context.Background(), 0); err != nil {
		t.Fatal(err)
	}
	_ = c.Close()

	pa := createPod(t, nsA, "pa", "x", gatedBy("a"))
	createLock(t, nsA, "a", "x", func(l *locksv1.DistributedLock) { l.Spec.Key = key })
	deadline := time.Now().Add(12 * time.Second)
	for !holds(t, key, pa) {
		if time.Now().After(deadline) {
			t.Fatalf("nsA, which may use %s, was never granted it: the controller keeps renewing nsN's forged hold: %+v", key, inspect(t, key))
		}
		time.Sleep(100 * time.Millisecond)
	}
}
