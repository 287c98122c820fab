package controllers_test

import (
	"context"
	"strings"
	"testing"

	locksv1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// eventMessage is the message of the Event with the reason on the named
// object, "" if there is none.
func eventMessage(t *testing.T, ns, name, reason string) string {
	t.Helper()
	var events corev1.EventList
	if err := k8s.List(context.Background(), &events, client.InNamespace(ns)); err != nil {
		t.Fatal(err)
	}
	for _, e := range events.Items {
		if e.InvolvedObject.Name == name && e.Reason == reason {
			return e.Message
		}
	}
	return ""
}

// No pod waits unexplained (issue 22): a guarded pod is told its place in
// the queue, the pod granted a key that waits for its next lock is told so,
// and once a selector edit leaves the gated pods out, they are told why and
// the lock lists them as blocked, still counted as waiting.
func TestWaitingPodsAreToldWhereTheyStand(t *testing.T) {
	startManager(t)
	ns := newNamespace(t)
	run1 := createPod(t, ns, "run-1", "job", gatedBy("singleton"))
	createPod(t, ns, "run-2", "job", gatedBy("singleton"))
	createPod(t, ns, "run-3", "job", gatedBy("singleton"))
	lock := createLock(t, ns, "singleton", "job")
	eventually(t, "run-1 to be granted, and the others told their places", func() bool {
		return holds(t, lockKey(lock), run1) &&
			eventMessage(t, ns, "run-2", "Queued") == "Waiting for "+lockKey(lock)+": place 1 of 2" &&
			eventMessage(t, ns, "run-3", "Queued") == "Waiting for "+lockKey(lock)+": place 2 of 2"
	})
	if msg := eventMessage(t, ns, "run-1", "Granted"); !strings.HasPrefix(msg, "Granted "+lockKey(lock)+" with fencing token ") {
		t.Fatalf("run-1's Granted Event says %q", msg)
	}

	updateLock(t, lock, func(l *locksv1.DistributedLock) { l.Spec.Candidates.MatchLabels["app"] = "other" })
	eventually(t, "run-2 and run-3 to be told the lock no longer selects them, and listed as blocked", func() bool {
		st := getLock(t, lock).Status
		return len(st.Blocked) == 2 && st.WaitingCount == 2 && len(st.Waiting) == 0 &&
			strings.Contains(st.Blocked[0].Reason, "does not select this pod") &&
			eventOn(t, ns, "Pod", "run-2", "NotSelected") && eventOn(t, ns, "Pod", "run-3", "NotSelected")
	})

	// A pod granted one key that waits for its next lock is told which.
	blocker := createPod(t, ns, "blocker", "two", gatedBy("second"))
	createLock(t, ns, "second", "two")
	eventually(t, "blocker to hold the second key", func() bool { return holds(t, ns+"/second", blocker) })
	createPod(t, ns, "both", "two", gatedBy("first", "second"))
	createLock(t, ns, "first", "two")
	eventually(t, "both to be told it holds the first key and waits for the second lock", func() bool {
		return strings.HasSuffix(eventMessage(t, ns, "both", "Granted"), "it holds it while it waits for lock second before it can start")
	})
	eventually(t, "both to be told its place for the second key", func() bool {
		return eventMessage(t, ns, "both", "Queued") == "Waiting for "+ns+"/second: place 1 of 1"
	})
}

// A renamed or deleted lock leaves the pods behind its gate waiting for
// ever: they are told so (issue 22), while the lock waits for its holder,
// and once it is gone.
func TestPodsBehindADeletedLockAreTold(t *testing.T) {
	startManager(t)
	ns := newNamespace(t)
	run1 := createPod(t, ns, "run-1", "job", gatedBy("singleton"))
	createPod(t, ns, "run-2", "job", gatedBy("singleton"))
	lock := createLock(t, ns, "singleton", "job")
	eventually(t, "run-1 to be granted", func() bool { return holds(t, lockKey(lock), run1) })
	deleteLock(t, lock)
	eventually(t, "run-2 to be told the lock is being deleted", func() bool { return eventOn(t, ns, "Pod", "run-2", "LockDeleting") })
	setContainers(t, run1, corev1.PodSucceeded, exited(0))
	eventually(t, "run-2 to be told the lock is gone", func() bool {
		return lockGone(t, lock) && eventOn(t, ns, "Pod", "run-2", "LockNotFound")
	})
}
