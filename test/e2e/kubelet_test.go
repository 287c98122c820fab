// The guard judges "stopped" as the kubelet does (issue 20): a container
// that exits under restartPolicy OnFailure or Always is restarted in the
// same pod, which has not stopped; a native sidecar runs on after the app
// containers; a pod behind another controller's gate cannot start. kwok
// plays each of these (internal/plane/stages.yaml), and every test ends
// with the shared check of kwok's run stamps (checkKey).

package e2e

import (
	"context"
	"fmt"
	"os/exec"
	"slices"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/internal/plane"
)

// kubectl runs the plane's kubectl as its administrator.
func kubectl(t testing.TB, args ...string) string {
	t.Helper()
	cmd := exec.Command(pl.AssetsDir+"/kubectl", append([]string{"--kubeconfig", pl.Kubeconfig}, args...)...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("kubectl %v: %v\n%s", args, err, out)
	}
	return string(out)
}

// restartingTemplate is a guarded pod template under policy whose app
// container's runs exit with codes, each after runFor; a restart the
// policy allows comes 1s after the exit (500ms Terminated, 500ms
// CrashLoopBackOff), well within the next pod's run if the lock moved.
func restartingTemplate(policy corev1.RestartPolicy, codes string, runFor time.Duration) corev1.PodTemplateSpec {
	tpl := guardedTemplate(guarded, runFor, 5)
	tpl.Spec.RestartPolicy = policy
	tpl.Annotations[plane.ExitCodesAnnotation] = codes
	tpl.Annotations[plane.BackoffAnnotation] = "500ms"
	// Deleted, it stops at once: the tests here are not about grace.
	tpl.Annotations[plane.StopDelayAnnotation] = "100ms"
	return tpl
}

// podsWith lists the pods with label in ns.
func podsWith(ns, label string) ([]corev1.Pod, error) {
	list, err := clientset.CoreV1().Pods(ns).List(context.Background(), metav1.ListOptions{LabelSelector: label})
	if err != nil {
		return nil, err
	}
	return list.Items, nil
}

// A CronJob's two runs, made as `kubectl create job --from=cronjob/...`
// does, one right after the other. Each run's container fails once:
//   - OnFailure: the kubelet restarts it in the same pod, which then
//     succeeds. The pod never stopped, so the second run must not start
//     before it has succeeded.
//   - Never: the pod fails; the Job retries with a new pod (backoffLimit 1),
//     which queues behind the lock like any candidate.
func TestCronJobRunsUnderEachRestartPolicy(t *testing.T) {
	for _, tc := range []struct {
		policy  corev1.RestartPolicy
		codes   string
		backoff int32
		pods    int // that run, in all
	}{
		// One restart counts against backoffLimit under OnFailure; 2 lets
		// the Job succeed after it.
		{corev1.RestartPolicyOnFailure, "1,0", 2, 2},
		{corev1.RestartPolicyNever, "1", 1, 4},
	} {
		t.Run(string(tc.policy), func(t *testing.T) {
			ctx := context.Background()
			ns := newLock(t, guarded)
			cron := &batchv1.CronJob{
				ObjectMeta: metav1.ObjectMeta{Name: "report", Namespace: ns},
				Spec: batchv1.CronJobSpec{
					Schedule: "0 0 1 1 *", // not during the test: the runs are made by hand
					JobTemplate: batchv1.JobTemplateSpec{Spec: batchv1.JobSpec{
						BackoffLimit: ptr.To(tc.backoff),
						Template:     restartingTemplate(tc.policy, tc.codes, 2*time.Second),
					}},
				},
			}
			if _, err := clientset.BatchV1().CronJobs(ns).Create(ctx, cron, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
			kubectl(t, "-n", ns, "create", "job", "--from=cronjob/report", "run-1")
			kubectl(t, "-n", ns, "create", "job", "--from=cronjob/report", "run-2")
			for _, name := range []string{"run-1", "run-2"} {
				eventually(t, 90*time.Second, "Job "+name+" finished", func() (bool, error) {
					job, err := clientset.BatchV1().Jobs(ns).Get(ctx, name, metav1.GetOptions{})
					return err == nil && finished(job), err
				})
			}
			runs := checkKey(t, keyOf(ns))
			if len(runs) != tc.pods {
				t.Fatalf("%d pods ran, want %d", len(runs), tc.pods)
			}
			if tc.policy == corev1.RestartPolicyOnFailure {
				// The scenario happened as meant: each run's pod ran its
				// container twice, and both Jobs succeeded.
				for _, r := range runs {
					if len(r.runs) != 2 || r.runs[0].ExitCode != 1 || r.runs[1].ExitCode != 0 {
						t.Errorf("%s ran %+v, want a failed run, then a successful one in the same pod", r.pod, r.runs)
					}
				}
				for _, name := range []string{"run-1", "run-2"} {
					if ok, err := jobCondition(ns, name, batchv1.JobComplete); !ok {
						t.Errorf("Job %s not Complete (err %v)", name, err)
					}
				}
			}
		})
	}
}

// Leader election among guarded pods: the leader's container exits.
//   - Always (a Deployment) and OnFailure: the kubelet restarts it in the
//     same pod, which keeps the lock; no other pod runs until the leader is
//     deleted.
//   - Never: the leader pod fails; that is a stop, and the lock goes to the
//     next pod.
func TestLeaderElectionUnderEachRestartPolicy(t *testing.T) {
	for _, tc := range []struct {
		policy     corev1.RestartPolicy
		codes      string
		deployment bool
		restarts   int32 // of the leader before it is deleted
	}{
		{policy: corev1.RestartPolicyAlways, codes: "1,0", deployment: true, restarts: 2},
		{policy: corev1.RestartPolicyOnFailure, codes: "1", restarts: 1},
		{policy: corev1.RestartPolicyNever, codes: "1"},
	} {
		t.Run(string(tc.policy), func(t *testing.T) {
			ctx := context.Background()
			ns := newLock(t, guarded)
			tpl := restartingTemplate(tc.policy, tc.codes, 2*time.Second)
			if tc.deployment {
				deploy := &appsv1.Deployment{
					ObjectMeta: metav1.ObjectMeta{Name: "leader", Namespace: ns},
					Spec: appsv1.DeploymentSpec{
						Replicas: ptr.To[int32](2),
						Selector: &metav1.LabelSelector{MatchLabels: tpl.Labels},
						Template: tpl,
					},
				}
				if _, err := clientset.AppsV1().Deployments(ns).Create(ctx, deploy, metav1.CreateOptions{}); err != nil {
					t.Fatal(err)
				}
			} else {
				for i := range 2 {
					pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("member-%d", i), Namespace: ns, Labels: tpl.Labels, Annotations: tpl.Annotations}, Spec: tpl.Spec}
					if _, err := clientset.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
						t.Fatal(err)
					}
				}
			}

			if tc.policy == corev1.RestartPolicyNever {
				// Each pod leads until its container fails; then the next.
				eventually(t, 60*time.Second, "both pods ran and failed", func() (bool, error) {
					list, err := podsWith(ns, guarded)
					if err != nil || len(list) != 2 {
						return false, err
					}
					return list[0].Status.Phase == corev1.PodFailed && list[1].Status.Phase == corev1.PodFailed, nil
				})
				if runs := checkKey(t, keyOf(ns)); len(runs) != 2 {
					t.Fatalf("%d pods ran, want 2, one after the other", len(runs))
				}
				return
			}

			// The leader restarts in place, as often as planned, and runs on.
			var leader corev1.Pod
			eventually(t, 60*time.Second, fmt.Sprintf("the leader restarted %d times and running", tc.restarts), func() (bool, error) {
				list, err := podsWith(ns, guarded)
				if err != nil {
					return false, err
				}
				for _, p := range list {
					if len(p.Status.ContainerStatuses) == 1 && p.Status.ContainerStatuses[0].RestartCount == tc.restarts &&
						p.Status.ContainerStatuses[0].State.Running != nil && p.DeletionTimestamp == nil {
						leader = p
						return true, nil
					}
				}
				return false, nil
			})
			// No hand-over: only the leader ran, and it is the same pod.
			runs := checkKey(t, keyOf(ns))
			if len(runs) != 1 || runs[0].uid != leader.UID {
				t.Fatalf("pods that ran: %s; want only the leader %s, restarted in place", describeRuns(runs), leader.Name)
			}
			// Its end hands the lock over.
			if err := clientset.CoreV1().Pods(ns).Delete(ctx, leader.Name, metav1.DeleteOptions{}); err != nil {
				t.Fatal(err)
			}
			eventually(t, 60*time.Second, "another pod leading", func() (bool, error) {
				pod, err := runningPod(ns, guarded)
				return pod != nil && pod.UID != leader.UID, err
			})
		})
	}
}

// sidecarJobSpec is a guarded Job whose pod runs a plain init container,
// then its app container beside a native sidecar; the app exits 0 after
// 2s, and the sidecar stops sidecarStop after it.
func sidecarJobSpec(sidecarStop time.Duration) batchv1.JobSpec {
	spec := jobSpec(guarded, 2*time.Second)
	spec.Template.Annotations[plane.InitDelayAnnotation] = "1s"
	spec.Template.Annotations[plane.SidecarStopDelayAnnotation] = sidecarStop.String()
	spec.Template.Spec.InitContainers = []corev1.Container{
		{Name: "fetch", Image: "busybox"},
		{Name: "proxy", Image: "busybox", RestartPolicy: ptr.To(corev1.ContainerRestartPolicyAlways)},
	}
	return spec
}

// A Job's pod with an init container and a native sidecar: the pod runs
// from its init container's start until its sidecar stops, 2s after the
// app container completed (the kubelet stops sidecars once the app
// containers are done, and the phase stays Running until then). The next
// Job's pod must not start before.
func TestJobWithSidecarRunsUntilSidecarStops(t *testing.T) {
	ns := newLock(t, guarded)
	createJob(t, ns, "first", sidecarJobSpec(2*time.Second))
	waitRunning(t, ns, guarded)
	createJob(t, ns, "second", sidecarJobSpec(2*time.Second))
	for _, name := range []string{"first", "second"} {
		eventually(t, 60*time.Second, "Job "+name+" complete", func() (bool, error) {
			return jobCondition(ns, name, batchv1.JobComplete)
		})
	}
	runs := checkKey(t, keyOf(ns))
	if len(runs) != 2 {
		t.Fatalf("%d pods ran, want 2", len(runs))
	}
	for _, r := range runs {
		byName := map[string]plane.Run{}
		for _, c := range r.runs {
			byName[c.Container] = c
		}
		if fetch, work, proxy := byName["fetch"], byName["work"], byName["proxy"]; work.Start.Before(fetch.End) || proxy.End.Sub(work.End) < time.Second {
			t.Errorf("%s: the init container, app and sidecar ran %+v; want the app after the init container and the sidecar on 2s after the app", r.pod, r.runs)
		}
	}
}

// The holder has a native sidecar and is deleted: its app container exits
// on SIGTERM after 500ms, its sidecar 3s later. The pod runs until the
// sidecar stops, so the next candidate must wait that long.
func TestDeletedHolderRunsUntilSidecarStops(t *testing.T) {
	ctx := context.Background()
	ns, holder := startHolderAndWaiter(t, func(tpl *corev1.PodTemplateSpec) {
		tpl.Annotations[plane.StopDelayAnnotation] = "500ms"
		tpl.Annotations[plane.SidecarStopDelayAnnotation] = "3s"
		tpl.Spec.RestartPolicy = corev1.RestartPolicyAlways
		tpl.Spec.TerminationGracePeriodSeconds = ptr.To[int64](10)
		tpl.Spec.InitContainers = []corev1.Container{{Name: "proxy", Image: "busybox", RestartPolicy: ptr.To(corev1.ContainerRestartPolicyAlways)}}
	})
	if err := clientset.CoreV1().Pods(ns).Delete(ctx, holder.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, "Job next complete and the holder gone", func() (bool, error) {
		if _, err := clientset.CoreV1().Pods(ns).Get(ctx, holder.Name, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			return false, err
		}
		return jobCondition(ns, "next", batchv1.JobComplete)
	})
	if runs := checkKey(t, keyOf(ns)); len(runs) != 2 {
		t.Fatalf("%d pods ran, want 2", len(runs))
	}
}

// foreignGate is another controller's scheduling gate: Kueue's, which it
// removes once it admits the workload.
const foreignGate = "kueue.x-k8s.io/admission"

func hasGate(pod *corev1.Pod, gate string) bool {
	return slices.ContainsFunc(pod.Spec.SchedulingGates, func(g corev1.PodSchedulingGate) bool { return g.Name == gate })
}

// A candidate behind a second, foreign gate cannot start, so it is not
// granted the lock (its lockwarden gate stays) until that gate is gone;
// candidates after it, free to start, go first. Once Kueue (here the test)
// removes its gate, it is granted the lock like any candidate.
func TestForeignGateWaitsForItsRemoval(t *testing.T) {
	ctx := context.Background()
	ns := newLock(t, guarded)
	tpl := guardedTemplate(guarded, time.Second, 0)
	tpl.Annotations[plane.ExitCodesAnnotation] = "0"
	tpl.Spec.SchedulingGates = append(tpl.Spec.SchedulingGates, corev1.PodSchedulingGate{Name: foreignGate})
	queued := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "queued", Namespace: ns, Labels: tpl.Labels, Annotations: tpl.Annotations}, Spec: tpl.Spec}
	if _, err := clientset.CoreV1().Pods(ns).Create(ctx, queued, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// The controller has seen the queued pod, first of all candidates: its
	// status names it (as holder, waiting or blocked).
	eventually(t, 30*time.Second, "the lock's status naming the queued pod", func() (bool, error) {
		lock := &locksv1.DistributedLock{}
		if err := k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: lockName}, lock); err != nil {
			return false, err
		}
		if h := lock.Status.Holder; h != nil && h.PodName == queued.Name {
			return true, nil
		}
		return slices.Contains(lock.Status.Waiting, queued.Name) ||
			slices.ContainsFunc(lock.Status.Blocked, func(b locksv1.BlockedPod) bool { return b.PodName == queued.Name }), nil
	})
	stillQueued := func(when string) {
		t.Helper()
		pod, err := clientset.CoreV1().Pods(ns).Get(ctx, queued.Name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if !hasGate(pod, locksv1.GateFor(lockName)) {
			t.Fatalf("%s: the pod behind Kueue's gate was granted the lock (its gates: %v)", when, pod.Spec.SchedulingGates)
		}
	}
	for _, name := range []string{"free-1", "free-2"} {
		createJob(t, ns, name, jobSpec(guarded, time.Second))
		eventually(t, 30*time.Second, "Job "+name+" complete, ahead of the pod behind Kueue's gate", func() (bool, error) {
			stillQueued("while Job " + name + " waited")
			return jobCondition(ns, name, batchv1.JobComplete)
		})
		stillQueued("once Job " + name + " completed")
	}

	remove := []byte(fmt.Sprintf(`{"spec":{"schedulingGates":[{"name":%q}]}}`, locksv1.GateFor(lockName)))
	if _, err := clientset.CoreV1().Pods(ns).Patch(ctx, queued.Name, types.MergePatchType, remove, metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, "the once-queued pod Succeeded", func() (bool, error) {
		pod, err := clientset.CoreV1().Pods(ns).Get(ctx, queued.Name, metav1.GetOptions{})
		return err == nil && pod.Status.Phase == corev1.PodSucceeded, err
	})
	if runs := checkKey(t, keyOf(ns)); len(runs) != 3 {
		t.Fatalf("%d pods ran, want 3", len(runs))
	}
}
