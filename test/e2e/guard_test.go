package e2e

import (
	"context"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/lockwarden/lockwarden/internal/plane"
)

const guarded = "e2e.lockwarden.dev/guarded"

// Three Jobs queued behind one lock run one at a time and all complete.
func TestJobsRunOneAtATime(t *testing.T) {
	ns := newLock(t, guarded)
	names := []string{"first", "second", "third"}
	for _, name := range names {
		createJob(t, ns, name, jobSpec(guarded, 2*time.Second))
	}
	for _, name := range names {
		eventually(t, 60*time.Second, "Job "+name+" complete", func() (bool, error) {
			return jobCondition(ns, name, batchv1.JobComplete)
		})
	}
	if runs := assertNoOverlap(t, ns, guarded); len(runs) != 3 {
		t.Fatalf("%d runs, want 3", len(runs))
	}
}

// A real CronJob firing on the clock, under each concurrencyPolicy, while a
// run made by hand (kubectl create job --from=cronjob/...) still runs: the
// lock keeps the runs apart whatever the policy lets through. The subtests
// share the minute boundary, so they run in parallel.
func TestCronJobPolicies(t *testing.T) {
	for _, tc := range []struct {
		policy batchv1.ConcurrencyPolicy
		// runs is how many pods run in all; jobs how many Jobs ran.
		runs int
	}{
		// Both runs happen, one after the other.
		{batchv1.AllowConcurrent, 2},
		// The scheduled run is skipped while the manual one is active.
		{batchv1.ForbidConcurrent, 1},
		// The manual run is deleted (grace 0 here; the graceful case is in
		// the e2e_guard tests) and the scheduled one runs.
		{batchv1.ReplaceConcurrent, 2},
	} {
		t.Run(string(tc.policy), func(t *testing.T) {
			t.Parallel()
			runCronJobPolicy(t, tc.policy, 0, tc.runs)
		})
	}
}

// runCronJobPolicy makes a CronJob firing every minute and, at once, a run
// by hand that lasts until 15s past the next minute, so the scheduled run
// meets it. After the scheduled time it suspends the CronJob, waits for the
// runs to end and checks them.
func runCronJobPolicy(t *testing.T, policy batchv1.ConcurrencyPolicy, grace int64, wantRuns int) {
	ctx := context.Background()
	ns := newLock(t, guarded)
	now := time.Now()
	next := now.Truncate(time.Minute).Add(time.Minute)
	cron := &batchv1.CronJob{
		ObjectMeta: metav1.ObjectMeta{Name: "nightly", Namespace: ns},
		Spec: batchv1.CronJobSpec{
			Schedule:          "* * * * *",
			ConcurrencyPolicy: policy,
			JobTemplate: batchv1.JobTemplateSpec{Spec: batchv1.JobSpec{
				BackoffLimit: ptr.To[int32](0),
				Template:     guardedTemplate(guarded, 3*time.Second, grace),
			}},
		},
	}
	cron, err := clientset.BatchV1().CronJobs(ns).Create(ctx, cron, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	manual := cron.Spec.JobTemplate.Spec.DeepCopy()
	manual.Template.Annotations[plane.CompleteDelayAnnotation] = (next.Sub(now) + 15*time.Second).Round(time.Second).String()
	job := &batchv1.Job{
		ObjectMeta: metav1.ObjectMeta{
			Name:            "nightly-manual",
			Namespace:       ns,
			Annotations:     map[string]string{"cronjob.kubernetes.io/instantiate": "manual"},
			OwnerReferences: []metav1.OwnerReference{*metav1.NewControllerRef(cron, batchv1.SchemeGroupVersion.WithKind("CronJob"))},
		},
		Spec: *manual,
	}
	if _, err := clientset.BatchV1().Jobs(ns).Create(ctx, job, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	// Past the scheduled time, with room for the CronJob controller to act
	// on it, stop further runs.
	time.Sleep(time.Until(next.Add(5 * time.Second)))
	suspend := []byte(`{"spec":{"suspend":true}}`)
	if _, err := clientset.BatchV1().CronJobs(ns).Patch(ctx, cron.Name, "application/merge-patch+json", suspend, metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 60*time.Second, "every Job finished", func() (bool, error) {
		jobs, err := clientset.BatchV1().Jobs(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err
		}
		for _, j := range jobs.Items {
			if !finished(&j) {
				return false, nil
			}
		}
		pod, err := runningPod(ns, guarded)
		return pod == nil, err
	})
	runs := assertNoOverlap(t, ns, guarded)
	if len(runs) != wantRuns {
		t.Fatalf("%d runs under %s, want %d", len(runs), policy, wantRuns)
	}
}

func finished(j *batchv1.Job) bool {
	for _, c := range j.Status.Conditions {
		if (c.Type == batchv1.JobComplete || c.Type == batchv1.JobFailed) && c.Status == corev1.ConditionTrue {
			return true
		}
	}
	return false
}

// A Job whose pod fails gets a replacement pod (backoffLimit 1); the
// replacement queues behind the lock like any candidate, and never runs
// beside another Job's pod.
func TestJobRetryAfterFailure(t *testing.T) {
	ns := newLock(t, guarded)
	failing := jobSpec(guarded, time.Second)
	failing.BackoffLimit = ptr.To[int32](1)
	failing.Template.Annotations[plane.FailAnnotation] = "true"
	createJob(t, ns, "flaky", failing)
	createJob(t, ns, "steady", jobSpec(guarded, 2*time.Second))
	eventually(t, 90*time.Second, "Job flaky failed twice", func() (bool, error) {
		return jobCondition(ns, "flaky", batchv1.JobFailed)
	})
	eventually(t, 60*time.Second, "Job steady complete", func() (bool, error) {
		return jobCondition(ns, "steady", batchv1.JobComplete)
	})
	if runs := assertNoOverlap(t, ns, guarded); len(runs) != 3 {
		t.Fatalf("%d runs, want 3: two of flaky, one of steady", len(runs))
	}
}

// The manager is killed (SIGKILL) while a guarded pod runs and another
// waits, and started again within the lease: the new manager adopts the
// lock for the running pod, and the waiting one runs only after it.
func TestManagerKilledMidRun(t *testing.T) {
	ns := newLock(t, guarded)
	createJob(t, ns, "long", jobSpec(guarded, 8*time.Second))
	waitRunning(t, ns, guarded)
	createJob(t, ns, "next", jobSpec(guarded, 2*time.Second))
	eventually(t, 10*time.Second, "Job next's pod gated", func() (bool, error) {
		n, err := gatedPods(ns, guarded)
		return n == 1, err
	})
	mgr.kill()
	time.Sleep(time.Second)
	if err := mgr.start(context.Background()); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"long", "next"} {
		eventually(t, 60*time.Second, "Job "+name+" complete", func() (bool, error) {
			return jobCondition(ns, name, batchv1.JobComplete)
		})
	}
	if runs := assertNoOverlap(t, ns, guarded); len(runs) != 2 {
		t.Fatalf("%d runs, want 2", len(runs))
	}
}

// Redis is killed and restarted empty while a guarded pod runs and another
// waits: the grant is sticky, so the lock is taken again for the running
// pod, never handed to the waiting one.
func TestRedisRestartedMidRun(t *testing.T) {
	ns := newLock(t, guarded)
	createJob(t, ns, "long", jobSpec(guarded, 8*time.Second))
	waitRunning(t, ns, guarded)
	createJob(t, ns, "next", jobSpec(guarded, 2*time.Second))
	eventually(t, 10*time.Second, "Job next's pod gated", func() (bool, error) {
		n, err := gatedPods(ns, guarded)
		return n == 1, err
	})
	redisSrv.Stop()
	time.Sleep(time.Second)
	if err := redisSrv.Restart(); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"long", "next"} {
		eventually(t, 60*time.Second, "Job "+name+" complete", func() (bool, error) {
			return jobCondition(ns, name, batchv1.JobComplete)
		})
	}
	if runs := assertNoOverlap(t, ns, guarded); len(runs) != 2 {
		t.Fatalf("%d runs, want 2", len(runs))
	}
}

// A Job whose activeDeadlineSeconds runs out while its pod waits behind the
// gate fails with DeadlineExceeded; its pod never runs, and the lock goes
// on to the next candidate once the holder is done.
func TestActiveDeadlineWhileGated(t *testing.T) {
	ns := newLock(t, guarded)
	createJob(t, ns, "holder", jobSpec(guarded, 6*time.Second))
	waitRunning(t, ns, guarded)
	late := jobSpec(guarded, time.Second)
	late.ActiveDeadlineSeconds = ptr.To[int64](2)
	createJob(t, ns, "late", late)
	eventually(t, 20*time.Second, "Job late failed", func() (bool, error) {
		return jobCondition(ns, "late", batchv1.JobFailed)
	})
	eventually(t, 30*time.Second, "Job holder complete", func() (bool, error) {
		return jobCondition(ns, "holder", batchv1.JobComplete)
	})
	createJob(t, ns, "after", jobSpec(guarded, time.Second))
	eventually(t, 30*time.Second, "Job after complete", func() (bool, error) {
		return jobCondition(ns, "after", batchv1.JobComplete)
	})
	runs := assertNoOverlap(t, ns, guarded)
	if len(runs) != 2 {
		t.Fatalf("%d runs, want 2: holder and after; late's pod must never run", len(runs))
	}
}

// A pod ungated with the lock but that no node accepts stays Pending; it
// keeps the lock (a gate cannot be put back), so the next candidate waits
// until that pod is deleted.
func TestPendingAfterUngating(t *testing.T) {
	ctx := context.Background()
	ns := newLock(t, guarded)
	stuck := jobSpec(guarded, time.Second)
	stuck.Template.Spec.NodeSelector = map[string]string{"e2e.lockwarden.dev/no-such-node": "true"}
	createJob(t, ns, "stuck", stuck)
	eventually(t, 20*time.Second, "Job stuck's pod ungated and unschedulable", func() (bool, error) {
		list, err := clientset.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: "batch.kubernetes.io/job-name=stuck"})
		if err != nil || len(list.Items) != 1 {
			return false, err
		}
		for _, c := range list.Items[0].Status.Conditions {
			if c.Type == corev1.PodScheduled && c.Reason == corev1.PodReasonUnschedulable {
				return true, nil
			}
		}
		return false, nil
	})
	createJob(t, ns, "waiting", jobSpec(guarded, time.Second))
	time.Sleep(3 * time.Second)
	if n, err := gatedPods(ns, guarded); err != nil || n != 1 {
		t.Fatalf("%d gated pods (err %v), want 1: the waiting Job's, behind the stuck holder", n, err)
	}
	background := metav1.DeletePropagationBackground
	if err := clientset.BatchV1().Jobs(ns).Delete(ctx, "stuck", metav1.DeleteOptions{PropagationPolicy: &background}); err != nil && !apierrors.IsNotFound(err) {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, "Job waiting complete", func() (bool, error) {
		return jobCondition(ns, "waiting", batchv1.JobComplete)
	})
	if runs := assertNoOverlap(t, ns, guarded); len(runs) != 1 {
		t.Fatalf("%d runs, want 1", len(runs))
	}
}
