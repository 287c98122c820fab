package e2e

import (
	"context"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	locksv1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/internal/plane"
)

// lockNamedByPods creates a DistributedLock without spec.candidates: it
// selects the pods that name it.
func lockNamedByPods(t *testing.T, ns, name string) {
	t.Helper()
	lock := &locksv1.DistributedLock{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec:       locksv1.DistributedLockSpec{LeaseDuration: &metav1.Duration{Duration: 5 * time.Second}},
	}
	if err := k8s.Create(context.Background(), lock); err != nil {
		t.Fatal(err)
	}
	declareLock(ns, name, ns+"/"+name)
	guardKey(t, ns+"/"+name)
}

// One label guards a workload (issue 22), on the plane's kube-apiserver
// with the gating policy an install ships: a CronJob whose pod template
// carries only the label lockwarden.dev/lock runs one pod at a time (its
// two runs, made at once, each restart a failed container in place), and a
// Job whose pods name two locks in the annotation holds both while it runs.
func TestOneLabelGuardsACronJob(t *testing.T) {
	ctx := context.Background()
	ns := newNamespace(t)
	lockNamedByPods(t, ns, "nightly")
	template := corev1.PodTemplateSpec{
		ObjectMeta: metav1.ObjectMeta{
			Labels: map[string]string{locksv1.LockLabel: "nightly"},
			Annotations: map[string]string{
				plane.CompleteDelayAnnotation: "2s", plane.ExitCodesAnnotation: "1,0",
				plane.BackoffAnnotation: "500ms", plane.StopDelayAnnotation: "100ms",
			},
		},
		Spec: corev1.PodSpec{
			RestartPolicy: corev1.RestartPolicyOnFailure,
			Containers:    []corev1.Container{{Name: "work", Image: "busybox"}},
		},
	}
	cron := &batchv1.CronJob{
		ObjectMeta: metav1.ObjectMeta{Name: "nightly", Namespace: ns},
		Spec: batchv1.CronJobSpec{
			Schedule:    "0 0 1 1 *", // not during the test: the runs are made by hand
			JobTemplate: batchv1.JobTemplateSpec{Spec: batchv1.JobSpec{BackoffLimit: ptr.To[int32](2), Template: template}},
		},
	}
	if _, err := clientset.BatchV1().CronJobs(ns).Create(ctx, cron, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	kubectl(t, "-n", ns, "create", "job", "--from=cronjob/nightly", "run-1")
	kubectl(t, "-n", ns, "create", "job", "--from=cronjob/nightly", "run-2")

	// A Job naming two locks in the annotation.
	lockNamedByPods(t, ns, "first")
	lockNamedByPods(t, ns, "second")
	both := corev1.PodTemplateSpec{
		ObjectMeta: metav1.ObjectMeta{Annotations: map[string]string{
			locksv1.LocksAnnotation: "first,second", plane.CompleteDelayAnnotation: "1s",
		}},
		Spec: corev1.PodSpec{RestartPolicy: corev1.RestartPolicyNever, Containers: []corev1.Container{{Name: "work", Image: "busybox"}}},
	}
	createJob(t, ns, "both", batchv1.JobSpec{BackoffLimit: ptr.To[int32](0), Template: both})

	for _, name := range []string{"run-1", "run-2", "both"} {
		eventually(t, 90*time.Second, "Job "+name+" complete", func() (bool, error) { return jobCondition(ns, name, batchv1.JobComplete) })
	}
	runs := checkKey(t, ns+"/nightly")
	if len(runs) != 2 {
		t.Fatalf("%d pods ran under nightly, want 2: %s", len(runs), describeRuns(runs))
	}
	for _, key := range []string{ns + "/first", ns + "/second"} {
		if runs := checkKey(t, key); len(runs) != 1 {
			t.Fatalf("%d pods ran under %s, want the Job's one", len(runs), key)
		}
	}
}
