package controllers_test

import (
	"context"
	"fmt"
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	locksv1 "github.com/lockwarden/lockwarden/api/v1alpha1"
)

// namingLocks creates a pod that opts in by naming its locks, with the
// label lockwarden.dev/lock (label, if not "") and the annotation
// lockwarden.dev/locks (listed, if not ""), as a pod template would: no
// gate is written by hand.
func namingLocks(t *testing.T, ns, name, label, listed string) *corev1.Pod {
	t.Helper()
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: map[string]string{}, Annotations: map[string]string{}},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "main", Image: "busybox"}}},
	}
	if label != "" {
		pod.Labels[locksv1.LockLabel] = label
	}
	if listed != "" {
		pod.Annotations[locksv1.LocksAnnotation] = listed
	}
	if err := k8s.Create(context.Background(), pod); err != nil {
		t.Fatal(err)
	}
	return pod
}

func gateNames(pod *corev1.Pod) []string {
	var names []string
	for _, g := range pod.Spec.SchedulingGates {
		names = append(names, g.Name)
	}
	return names
}

// waitForGating waits until the API server applies the gating policy,
// which it does a moment after the policy is created.
func waitForGating(t *testing.T) {
	t.Helper()
	ns := newNamespace(t)
	seq := 0
	eventually(t, "the gating policy to be applied", func() bool {
		seq++
		return len(namingLocks(t, ns, fmt.Sprint("probe-", seq), "probe", "").Spec.SchedulingGates) == 1
	})
}

// One label guards a workload (issue 22): a pod created with the label
// lockwarden.dev/lock gets that lock's gate and the candidate label at
// admission, and a lock without spec.candidates selects the pods that name
// it, so a singleton needs nothing else. A pod naming several locks in the
// annotation gets each gate once, the label's too.
func TestOneLabelGuardsAPod(t *testing.T) {
	waitForGating(t)
	startManager(t)
	ns := newNamespace(t)
	run1 := namingLocks(t, ns, "run-1", "singleton", "")
	run2 := namingLocks(t, ns, "run-2", "singleton", "")
	if got := gateNames(run1); !slices.Equal(got, []string{gateFor("singleton")}) || run1.Labels[locksv1.CandidateLabel] != "true" {
		t.Fatalf("run-1 was admitted with gates %v and labels %v", got, run1.Labels)
	}
	lock := &locksv1.DistributedLock{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "singleton"},
		Spec:       locksv1.DistributedLockSpec{LeaseDuration: &metav1.Duration{Duration: 3e9}},
	}
	if err := k8s.Create(context.Background(), lock); err != nil {
		t.Fatal(err)
	}
	eventually(t, "run-1 to be granted, and run-2 to wait", func() bool {
		st := getLock(t, lock).Status
		return holds(t, lockKey(lock), run1) && !gatedWith(getPod(t, run1), gateFor("singleton")) &&
			slices.Equal(st.Waiting, []string{"run-2"})
	})
	if !gatedWith(getPod(t, run2), gateFor("singleton")) {
		t.Fatal("run-2 was ungated while run-1 holds the lock")
	}

	both := namingLocks(t, ns, "both", "first", "first, second,")
	if got := gateNames(both); !slices.Equal(got, []string{gateFor("first"), gateFor("second")}) {
		t.Fatalf("a pod naming first (label) and first, second (annotation) got gates %v", got)
	}
}
