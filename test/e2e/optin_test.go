package e2e

import (
	"context"
	"strings"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
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

// The manager may change only lockwarden's own marks (issue 22), on the
// plane's kube-apiserver with the policies an install ships: the manager's
// ServiceAccount (impersonated, and bound to cluster-admin so that RBAC lets
// each request reach admission) is refused a change of a pod's image, of
// another tool's label, and a pod's deletion, and admitted its marks and
// the lift of its gate.
func TestTheManagerMayChangeOnlyItsMarks(t *testing.T) {
	ctx := context.Background()
	ns := newNamespace(t)
	user := "system:serviceaccount:" + ns + ":lockwarden-controller-manager"
	kubectl(t, "create", "clusterrolebinding", "manager-writes-"+ns, "--clusterrole=cluster-admin", "--user="+user)
	t.Cleanup(func() { kubectl(t, "delete", "clusterrolebinding", "manager-writes-"+ns) })
	cfg := rest.CopyConfig(pl.Config)
	cfg.Impersonate = rest.ImpersonationConfig{UserName: user, Groups: []string{"system:serviceaccounts", "system:authenticated"}}
	manager, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	newPod := func(name string) *corev1.Pod {
		pod := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: map[string]string{"team": "payments"}},
			Spec: corev1.PodSpec{
				SchedulingGates: []corev1.PodSchedulingGate{{Name: locksv1.GateFor("jobs")}},
				Containers:      []corev1.Container{{Name: "work", Image: "busybox"}},
			},
		}
		pod, err := clientset.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return pod
	}
	// Refusals, each on a fresh pod, since a change let through would
	// change the pod for good.
	for what, mutate := range map[string]func(*corev1.Pod){
		"the image":            func(p *corev1.Pod) { p.Spec.Containers[0].Image = "evil:latest" },
		"another tool's label": func(p *corev1.Pod) { p.Labels["team"] = "other" },
	} {
		p := newPod("refused-" + strings.ReplaceAll(strings.ReplaceAll(what, " ", "-"), "'", ""))
		mutate(p)
		if _, err := manager.CoreV1().Pods(ns).Update(ctx, p, metav1.UpdateOptions{}); !apierrors.IsForbidden(err) && !apierrors.IsInvalid(err) {
			t.Errorf("the manager changing %s: %v, want refused by the policy", what, err)
		}
	}
	p := newPod("marked")
	if err := manager.CoreV1().Pods(ns).Delete(ctx, p.Name, metav1.DeleteOptions{}); err == nil {
		t.Error("the manager deleted a pod")
	}
	p.Labels[locksv1.HolderLabelFor("jobs")] = "true"
	p.Annotations = map[string]string{locksv1.OwnerAnnotationPrefix + "jobs": string(p.UID) + ":0", locksv1.TokenAnnotationPrefix + "jobs": "7"}
	p.Spec.SchedulingGates = nil
	if _, err := manager.CoreV1().Pods(ns).Update(ctx, p, metav1.UpdateOptions{}); err != nil {
		t.Fatalf("the manager's marks and the lift of its gate were refused: %v", err)
	}
}
