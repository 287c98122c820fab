// These tests end a holder gracefully: its containers run on through the
// grace period after the deletion timestamp is set, so the lock must not
// move before they stop.

package e2e

import (
	"context"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// startHolderAndWaiter starts a guarded pod that runs until deleted, with a
// 5s grace period (and what shape does to its template), waits for it to
// run, and queues a Job behind it.
func startHolderAndWaiter(t *testing.T, shape ...func(*corev1.PodTemplateSpec)) (ns string, holder *corev1.Pod) {
	t.Helper()
	ns = newLock(t, guarded)
	tpl := guardedTemplate(guarded, 0, 5)
	for _, f := range shape {
		f(&tpl)
	}
	holder = &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "holder", Namespace: ns, Labels: tpl.Labels, Annotations: tpl.Annotations}, Spec: tpl.Spec}
	if _, err := clientset.CoreV1().Pods(ns).Create(context.Background(), holder, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitRunning(t, ns, guarded)
	createJob(t, ns, "next", jobSpec(guarded, time.Second))
	eventually(t, 10*time.Second, "Job next's pod gated", func() (bool, error) {
		n, err := gatedPods(ns, guarded)
		return n == 1, err
	})
	return ns, holder
}

// Deleting the holder with a 5s grace period: the next pod starts only once
// the holder's containers have stopped.
func TestGracefulDeletionNeverOverlaps(t *testing.T) {
	ns, holder := startHolderAndWaiter(t)
	if err := clientset.CoreV1().Pods(ns).Delete(context.Background(), holder.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, "Job next complete", func() (bool, error) {
		return jobCondition(ns, "next", batchv1.JobComplete)
	})
	if runs := checkKey(t, keyOf(ns)); len(runs) != 2 {
		t.Fatalf("%d runs, want 2", len(runs))
	}
}

// Evicting the holder through the Eviction API is a graceful deletion too.
func TestEvictionNeverOverlaps(t *testing.T) {
	ns, holder := startHolderAndWaiter(t)
	eviction := &policyv1.Eviction{ObjectMeta: metav1.ObjectMeta{Name: holder.Name, Namespace: ns}}
	if err := clientset.CoreV1().Pods(ns).EvictV1(context.Background(), eviction); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, "Job next complete", func() (bool, error) {
		return jobCondition(ns, "next", batchv1.JobComplete)
	})
	if runs := checkKey(t, keyOf(ns)); len(runs) != 2 {
		t.Fatalf("%d runs, want 2", len(runs))
	}
}

// concurrencyPolicy Replace deletes the running Job, whose pod then takes
// its 5s grace period: the replacement's pod must wait for it.
func TestCronJobReplaceGracefulNeverOverlaps(t *testing.T) {
	next := nextMinute()
	ns := startCronJob(t, batchv1.ReplaceConcurrent, 5, next)
	time.Sleep(time.Until(next.Add(10 * time.Second)))
	suspendCronJob(t, ns)
	finishCronJob(t, ns, 2)
}
