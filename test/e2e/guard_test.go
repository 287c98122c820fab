package e2e

import (
	"context"
	"fmt"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
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
	if runs := checkKey(t, keyOf(ns)); len(runs) != 3 {
		t.Fatalf("%d runs, want 3", len(runs))
	}
}

// A real CronJob firing on the clock, under each concurrencyPolicy, while
// its previous run still runs: the lock keeps the runs apart whatever the
// policy lets through. The three CronJobs share one minute boundary.
func TestCronJobPolicies(t *testing.T) {
	cases := []struct {
		policy batchv1.ConcurrencyPolicy
		runs   int // how many pods run in all
		ns     string
	}{
		// Both runs happen, one after the other.
		{policy: batchv1.AllowConcurrent, runs: 2},
		// The second run is skipped while the first is active.
		{policy: batchv1.ForbidConcurrent, runs: 1},
		// The first run is deleted and the second runs. The first pod's
		// grace period is 0 here; TestCronJobReplaceGracefulNeverOverlaps
		// gives it one of 5 s.
		{policy: batchv1.ReplaceConcurrent, runs: 2},
	}
	next := nextMinute()
	for i := range cases {
		cases[i].ns = startCronJob(t, cases[i].policy, 0, next)
	}
	// 10s leave the CronJob controller room to act on the schedule, even
	// on a busy machine. Then all are suspended at once, before the first
	// runs end at 15s: under Forbid, the controller would start the
	// skipped run late, as soon as the first one ends.
	time.Sleep(time.Until(next.Add(10 * time.Second)))
	for _, tc := range cases {
		suspendCronJob(t, tc.ns)
	}
	for _, tc := range cases {
		t.Run(string(tc.policy), func(t *testing.T) { finishCronJob(t, tc.ns, tc.runs) })
	}
}

// nextMinute is the next minute boundary, at least 20s away so there is
// time to set CronJobs up before it: when the boundary is nearer, it waits
// until just past it. No boundary may pass during the set-up, or the
// CronJobs would fire an extra run.
func nextMinute() time.Time {
	now := time.Now()
	next := now.Truncate(time.Minute).Add(time.Minute)
	if next.Sub(now) < 20*time.Second {
		time.Sleep(time.Until(next.Add(2 * time.Second)))
		next = next.Add(time.Minute)
	}
	return next
}

// startCronJob makes a CronJob that fires every minute and gets it to fire
// at once, with a run that lasts until 15s past next, so the run scheduled
// at next meets it. It returns the namespace.
func startCronJob(t *testing.T, policy batchv1.ConcurrencyPolicy, grace int64, next time.Time) string {
	t.Helper()
	ctx := context.Background()
	ns := newLock(t, guarded)
	now := time.Now()
	cron := &batchv1.CronJob{
		ObjectMeta: metav1.ObjectMeta{Name: "nightly", Namespace: ns},
		Spec: batchv1.CronJobSpec{
			Schedule:          "* * * * *",
			ConcurrencyPolicy: policy,
			JobTemplate: batchv1.JobTemplateSpec{Spec: batchv1.JobSpec{
				BackoffLimit: ptr.To[int32](0),
				Template:     guardedTemplate(guarded, next.Sub(now).Round(time.Second)+15*time.Second, grace),
			}},
		},
	}
	cron, err := clientset.BatchV1().CronJobs(ns).Create(ctx, cron, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// A last run two minutes ago makes the minute just past a missed
	// schedule, which the CronJob controller runs at once: the first run
	// is the controller's own, as a run left from the previous minute
	// would be (a Job made with kubectl create job --from is not counted
	// as active by Forbid and Replace).
	lastRun := fmt.Sprintf(`{"status":{"lastScheduleTime":%q}}`, now.Truncate(time.Minute).Add(-time.Minute).UTC().Format(time.RFC3339))
	if _, err := clientset.BatchV1().CronJobs(ns).Patch(ctx, cron.Name, types.MergePatchType, []byte(lastRun), metav1.PatchOptions{}, "status"); err != nil {
		t.Fatal(err)
	}
	eventually(t, 20*time.Second, "the first run active", func() (bool, error) {
		got, err := clientset.BatchV1().CronJobs(ns).Get(ctx, cron.Name, metav1.GetOptions{})
		return err == nil && len(got.Status.Active) == 1, err
	})
	// The next run is short.
	short := fmt.Sprintf(`{"spec":{"jobTemplate":{"spec":{"template":{"metadata":{"annotations":{%q:"3s"}}}}}}}`, plane.CompleteDelayAnnotation)
	if _, err := clientset.BatchV1().CronJobs(ns).Patch(ctx, cron.Name, types.MergePatchType, []byte(short), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	return ns
}

// suspendCronJob suspends the CronJob in ns, after its second scheduled
// time, so it starts no more runs.
func suspendCronJob(t *testing.T, ns string) {
	t.Helper()
	suspend := []byte(`{"spec":{"suspend":true}}`)
	if _, err := clientset.BatchV1().CronJobs(ns).Patch(context.Background(), "nightly", types.MergePatchType, suspend, metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
}

// finishCronJob waits for the runs of the suspended CronJob in ns to end
// and checks them.
func finishCronJob(t *testing.T, ns string, wantRuns int) {
	ctx := context.Background()
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
	if runs := checkKey(t, keyOf(ns)); len(runs) != wantRuns {
		t.Fatalf("%d runs, want %d", len(runs), wantRuns)
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
	if runs := checkKey(t, keyOf(ns)); len(runs) != 3 {
		t.Fatalf("%d runs, want 3: two of flaky, one of steady", len(runs))
	}
}

// The manager is killed (SIGKILL) while a guarded pod runs and another
// waits, and started again within the lease: the new manager adopts the
// lock for the running pod, and the waiting one runs only after it.
func TestManagerKilledMidRun(t *testing.T) {
	disruptMidRun(t, func() {
		mgr.kill()
		time.Sleep(time.Second)
		if err := mgr.start(context.Background()); err != nil {
			t.Fatal(err)
		}
	})
}

// Redis is killed and restarted empty while a guarded pod runs and another
// waits: the grant is sticky, so the lock is taken again for the running
// pod, never handed to the waiting one.
func TestRedisRestartedMidRun(t *testing.T) {
	disruptMidRun(t, func() {
		redisSrv.Stop()
		time.Sleep(time.Second)
		if err := redisSrv.Restart(); err != nil {
			t.Fatal(err)
		}
	})
}

// disruptMidRun runs disrupt while one guarded Job's pod runs and another's
// waits behind the gate, and checks that both complete, one after the other.
func disruptMidRun(t *testing.T, disrupt func()) {
	t.Helper()
	ns := newLock(t, guarded)
	createJob(t, ns, "long", jobSpec(guarded, 8*time.Second))
	waitRunning(t, ns, guarded)
	createJob(t, ns, "next", jobSpec(guarded, 2*time.Second))
	eventually(t, 10*time.Second, "Job next's pod gated", func() (bool, error) {
		n, err := gatedPods(ns, guarded)
		return n == 1, err
	})
	disrupt()
	for _, name := range []string{"long", "next"} {
		eventually(t, 60*time.Second, "Job "+name+" complete", func() (bool, error) {
			return jobCondition(ns, name, batchv1.JobComplete)
		})
	}
	if runs := checkKey(t, keyOf(ns)); len(runs) != 2 {
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
	runs := checkKey(t, keyOf(ns))
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
	eventually(t, 20*time.Second, "the waiting Job's pod, gated", func() (bool, error) {
		n, err := gatedPods(ns, guarded)
		return n == 1, err
	})
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
	if runs := checkKey(t, keyOf(ns)); len(runs) != 1 {
		t.Fatalf("%d runs, want 1", len(runs))
	}
}
