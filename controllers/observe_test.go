package controllers_test

import (
	"context"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	locksv1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/pkg/redislock"
)

// `lockwarden run --lock-resource` in a CronJob's pods: the pods take the
// lock themselves. A lock in mode Grant would grant it to the first Running
// candidate, under the controller's owner ID, and that pod's own Lock would
// then wait for itself for as long as it runs. In mode Observe the
// controller never takes the key: it shows and marks whichever pod's client
// holds it, lists the pods queued in Redis, and releases the hold of a pod
// that has stopped, so the next run goes on at once.
func TestObserveModeLetsPodsTakeTheLockThemselves(t *testing.T) {
	startManager(t)
	ns := newNamespace(t)
	run1 := createPod(t, ns, "run-1", "nightly")
	run2 := createPod(t, ns, "run-2", "nightly")
	setPhase(t, run1, corev1.PodRunning)
	setPhase(t, run2, corev1.PodRunning)
	lock := createLock(t, ns, "billing", "nightly", func(l *locksv1.DistributedLock) { l.Spec.Mode = locksv1.ModeObserve })
	key := redislock.LockName(ns, "billing")

	// run-1's process takes the lock, as `lockwarden run` does.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	m1, err := lockClient(t, string(run1.UID)).NewMutex(key, nil)
	if err != nil {
		t.Fatal(err)
	}
	hold1, err := m1.Lock(ctx)
	if err != nil {
		t.Fatalf("run-1's own Lock: %v (the controller took the key first?)", err)
	}
	eventually(t, "run-1's hold to show", func() bool {
		st := getLock(t, lock).Status
		return st.Holder != nil && st.Holder.PodName == "run-1" && !st.Holder.GrantedByController
	})
	eventually(t, "run-1 to be marked", func() bool {
		return getPod(t, run1).Labels[locksv1.HolderLabelFor("billing")] == "true"
	})

	// run-2 queues behind it.
	m2, err := lockClient(t, string(run2.UID)).NewMutex(key, nil)
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		hold, err := m2.Lock(ctx)
		if err == nil {
			defer hold.Unlock(context.Background())
		}
		got <- err
	}()
	eventually(t, "run-2 to be listed as waiting", func() bool {
		return slices.Equal(getLock(t, lock).Status.Waiting, []string{"run-2"})
	})

	// run-1's process dies without letting go; the pod fails. Its hold is
	// released once the pod has stopped, and run-2's Lock returns.
	setContainers(t, run1, corev1.PodFailed, exited(0))
	select {
	case err := <-got:
		if err != nil {
			t.Fatalf("run-2's Lock after run-1 stopped: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("run-2 did not get the lock after run-1 stopped")
	}
	select {
	case <-hold1.Done(): // its next renewal found it gone
	case <-time.After(5 * time.Second):
		t.Fatal("run-1's hold still looks live after the controller released it")
	}
	for _, h := range inspect(t, key).Holders {
		if h.Owner == redislock.Owner(string(run1.UID)+":0") || h.Owner == redislock.Owner(string(run2.UID)+":0") {
			t.Fatalf("the controller took the key in mode Observe: %+v", h)
		}
	}
}
