package controllers_test

import (
	"context"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/labels"
	"sigs.k8s.io/controller-runtime/pkg/client"
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
// that selects it, even as the oldest candidate, and a labelled one is.
func TestPodLabelSelectorCachesOnlyOptedInPods(t *testing.T) {
	optIn, err := labels.Parse("lockwarden.dev/candidate=true")
	if err != nil {
		t.Fatal(err)
	}
	h := startManagerOn(t, managerConfig{redisAddr: redisAddr, pods: optIn})
	ns := newNamespace(t)
	hidden := createPod(t, ns, "hidden", "x", gatedBy("a"))
	time.Sleep(1100 * time.Millisecond) // creation timestamps have 1 s resolution
	shown := createPod(t, ns, "shown", "x", gatedBy("a"), func(p *corev1.Pod) { p.Labels["lockwarden.dev/candidate"] = "true" })
	createLock(t, ns, "a", "x")
	key := ns + "/a"
	eventually(t, "the labelled pod to be granted "+key, func() bool { return holds(t, key, shown) })
	if err := h.cache.Get(context.Background(), client.ObjectKeyFromObject(hidden), &corev1.Pod{}); !apierrors.IsNotFound(err) {
		t.Fatalf("the unlabelled pod is in the cache: Get = %v", err)
	}
	if !gatedWith(getPod(t, hidden), gateFor("a")) {
		t.Fatal("the unlabelled pod was ungated")
	}
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
