package plane_test

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"github.com/lockwarden/lockwarden/internal/plane"
)

// One plane serves every test here: starting one takes seconds.
var (
	pl        *plane.Plane
	clientset *kubernetes.Clientset
)

func TestMain(m *testing.M) {
	if os.Getenv(childEnv) != "" {
		runChild()
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	var err error
	start := time.Now()
	pl, err = plane.Start(ctx, plane.Options{Progress: os.Stderr})
	cancel()
	if err != nil {
		fmt.Fprintln(os.Stderr, "start the plane:", err)
		os.Exit(1)
	}
	fmt.Fprintf(os.Stderr, "plane ready in %.1fs (nodes Ready, default ServiceAccount made)\n", time.Since(start).Seconds())
	for _, p := range pl.Processes() {
		fmt.Fprintf(os.Stderr, "  %-24s pid %-7d healthy after %6.2fs  RSS %4d MiB\n", p.Name, p.PID, p.Startup.Seconds(), plane.RSS(p.PID)>>20)
	}
	if clientset, err = kubernetes.NewForConfig(pl.Config); err != nil {
		pl.Stop()
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	code := m.Run()
	pl.Stop()
	os.Exit(code)
}

// newNamespace creates a namespace for one test, ready for pods.
func newNamespace(t *testing.T) string {
	t.Helper()
	ctx := context.Background()
	ns, err := clientset.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "smoke-"}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := plane.WaitForServiceAccount(ctx, clientset, ns.Name); err != nil {
		t.Fatal(err)
	}
	return ns.Name
}

// eventually polls cond every 50ms until it holds, failing the test after
// timeout.
func eventually(t *testing.T, timeout time.Duration, what string, cond func() (bool, error)) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		ok, err := cond()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %s (last error: %v)", what, timeout, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func podTemplate(gate string, annotations map[string]string) corev1.PodTemplateSpec {
	tpl := corev1.PodTemplateSpec{
		ObjectMeta: metav1.ObjectMeta{Annotations: annotations},
		Spec: corev1.PodSpec{
			RestartPolicy: corev1.RestartPolicyNever,
			Containers:    []corev1.Container{{Name: "work", Image: "busybox"}},
		},
	}
	if gate != "" {
		tpl.Spec.SchedulingGates = []corev1.PodSchedulingGate{{Name: gate}}
	}
	return tpl
}

// jobPods lists the pods of the Job named job.
func jobPods(ctx context.Context, ns, job string) ([]corev1.Pod, error) {
	list, err := clientset.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: "batch.kubernetes.io/job-name=" + job})
	if err != nil {
		return nil, err
	}
	return list.Items, nil
}

func condition(job *batchv1.Job, t batchv1.JobConditionType) bool {
	for _, c := range job.Status.Conditions {
		if c.Type == t && c.Status == corev1.ConditionTrue {
			return true
		}
	}
	return false
}

func annotationTime(t *testing.T, pod *corev1.Pod, key string) time.Time {
	t.Helper()
	v, ok := pod.Annotations[key]
	if !ok {
		t.Fatalf("pod %s has no annotation %s: %v", pod.Name, key, pod.Annotations)
	}
	ts, err := time.Parse(time.RFC3339Nano, v)
	if err != nil {
		t.Fatal(err)
	}
	return ts
}

// A CronJob's Job, instantiated as `kubectl create job --from=cronjob/...`
// does, whose pod template is gated: the pod waits SchedulingGated until the
// test removes the gate, then is scheduled on a fake node, runs for the
// delay in its annotation and succeeds, and the Job completes. Deleting the
// CronJob then removes Job and pod through the garbage collector.
func TestCronJobGatedPodRunsToCompletion(t *testing.T) {
	ctx := context.Background()
	ns := newNamespace(t)
	const gate = "example.com/hold"
	cron := &batchv1.CronJob{
		ObjectMeta: metav1.ObjectMeta{Name: "report", Namespace: ns},
		Spec: batchv1.CronJobSpec{
			Schedule: "0 0 1 1 *", // never during the test: the Job is made by hand below
			JobTemplate: batchv1.JobTemplateSpec{Spec: batchv1.JobSpec{
				BackoffLimit: ptr.To[int32](0),
				Template:     podTemplate(gate, map[string]string{plane.CompleteDelayAnnotation: "2s"}),
			}},
		},
	}
	cron, err := clientset.BatchV1().CronJobs(ns).Create(ctx, cron, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	job := &batchv1.Job{
		ObjectMeta: metav1.ObjectMeta{
			Name:            "report-manual",
			Namespace:       ns,
			Annotations:     map[string]string{"cronjob.kubernetes.io/instantiate": "manual"},
			OwnerReferences: []metav1.OwnerReference{*metav1.NewControllerRef(cron, batchv1.SchemeGroupVersion.WithKind("CronJob"))},
		},
		Spec: cron.Spec.JobTemplate.Spec,
	}
	if _, err := clientset.BatchV1().Jobs(ns).Create(ctx, job, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	var pod corev1.Pod
	eventually(t, 20*time.Second, "the Job's pod SchedulingGated", func() (bool, error) {
		pods, err := jobPods(ctx, ns, job.Name)
		if err != nil || len(pods) != 1 {
			return false, err
		}
		pod = pods[0]
		for _, c := range pod.Status.Conditions {
			if c.Type == corev1.PodScheduled && c.Reason == corev1.PodReasonSchedulingGated {
				return true, nil
			}
		}
		return false, nil
	})
	// Gated pods stay so: give the scheduler and kwok time to misbehave.
	time.Sleep(time.Second)
	got, err := clientset.CoreV1().Pods(ns).Get(ctx, pod.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got.Spec.NodeName != "" || got.Status.Phase != corev1.PodPending {
		t.Fatalf("gated pod was scheduled or ran: node %q, phase %s", got.Spec.NodeName, got.Status.Phase)
	}

	ungated := time.Now()
	patch := []byte(`{"spec":{"schedulingGates":null}}`)
	if _, err := clientset.CoreV1().Pods(ns).Patch(ctx, pod.Name, types.StrategicMergePatchType, patch, metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, "the pod Running on a fake node", func() (bool, error) {
		got, err = clientset.CoreV1().Pods(ns).Get(ctx, pod.Name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		return got.Status.Phase == corev1.PodRunning || got.Status.Phase == corev1.PodSucceeded, nil
	})
	if !slices.Contains(plane.NodeNames, got.Spec.NodeName) {
		t.Fatalf("pod on node %q, not a fake node", got.Spec.NodeName)
	}
	t.Logf("Running on %s %.2fs after the gate was removed", got.Spec.NodeName, time.Since(ungated).Seconds())

	eventually(t, 20*time.Second, "the pod Succeeded and the Job Complete", func() (bool, error) {
		j, err := clientset.BatchV1().Jobs(ns).Get(ctx, job.Name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		return condition(j, batchv1.JobComplete), nil
	})
	got, err = clientset.CoreV1().Pods(ns).Get(ctx, pod.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got.Status.Phase != corev1.PodSucceeded {
		t.Fatalf("pod phase %s, want Succeeded", got.Status.Phase)
	}
	ran := annotationTime(t, got, plane.StoppedAtAnnotation).Sub(annotationTime(t, got, plane.RunningAtAnnotation))
	if ran < 2*time.Second || ran > 4*time.Second {
		t.Fatalf("pod ran %s, want its 2s delay", ran)
	}
	term := got.Status.ContainerStatuses[0].State.Terminated
	if term == nil || term.ExitCode != 0 {
		t.Fatalf("container state %+v, want terminated with exit code 0", got.Status.ContainerStatuses[0].State)
	}

	// The garbage collector follows the owner references down.
	background := metav1.DeletePropagationBackground
	if err := clientset.BatchV1().CronJobs(ns).Delete(ctx, cron.Name, metav1.DeleteOptions{PropagationPolicy: &background}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, "the Job and its pod collected", func() (bool, error) {
		_, err := clientset.BatchV1().Jobs(ns).Get(ctx, job.Name, metav1.GetOptions{})
		if !apierrors.IsNotFound(err) {
			return false, err
		}
		pods, err := jobPods(ctx, ns, job.Name)
		return err == nil && len(pods) == 0, err
	})
}

// A Job's pod annotated to fail ends Failed with exit code 1, and with no
// retries left the Job fails.
func TestJobPodFails(t *testing.T) {
	ctx := context.Background()
	ns := newNamespace(t)
	job := &batchv1.Job{
		ObjectMeta: metav1.ObjectMeta{Name: "doomed", Namespace: ns},
		Spec: batchv1.JobSpec{
			BackoffLimit: ptr.To[int32](0),
			Template: podTemplate("", map[string]string{
				plane.CompleteDelayAnnotation: "500ms",
				plane.FailAnnotation:          "true",
			}),
		},
	}
	if _, err := clientset.BatchV1().Jobs(ns).Create(ctx, job, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, "the Job Failed", func() (bool, error) {
		j, err := clientset.BatchV1().Jobs(ns).Get(ctx, job.Name, metav1.GetOptions{})
		return err == nil && condition(j, batchv1.JobFailed), err
	})
	pods, err := jobPods(ctx, ns, job.Name)
	if err != nil {
		t.Fatal(err)
	}
	if len(pods) != 1 || pods[0].Status.Phase != corev1.PodFailed {
		t.Fatalf("want one Failed pod, got %d pods", len(pods))
	}
	if term := pods[0].Status.ContainerStatuses[0].State.Terminated; term == nil || term.ExitCode != 1 {
		t.Fatalf("container state %+v, want terminated with exit code 1", pods[0].Status.ContainerStatuses[0].State)
	}
}

// Deleting a running pod takes its grace period: it stays Running with a
// deletion timestamp until then (the API server keeps that timestamp to the
// second, so the end falls up to a second early), then stops and is gone.
// The period is long enough that a loaded machine's lag in kwok and the API
// server stays well within the bounds.
func TestGracefulDeletionTakesGracePeriod(t *testing.T) {
	ctx := context.Background()
	ns := newNamespace(t)
	tpl := podTemplate("", nil)
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "server", Namespace: ns}, Spec: tpl.Spec}
	pod.Spec.TerminationGracePeriodSeconds = ptr.To[int64](10)
	if _, err := clientset.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, "the pod Running", func() (bool, error) {
		got, err := clientset.CoreV1().Pods(ns).Get(ctx, pod.Name, metav1.GetOptions{})
		return err == nil && got.Status.Phase == corev1.PodRunning, err
	})

	deleted := time.Now()
	if err := clientset.CoreV1().Pods(ns).Delete(ctx, pod.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(3 * time.Second)
	got, err := clientset.CoreV1().Pods(ns).Get(ctx, pod.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("pod gone %.1fs into its 10s grace period: %v", time.Since(deleted).Seconds(), err)
	}
	if got.DeletionTimestamp == nil || got.Status.Phase != corev1.PodRunning {
		t.Fatalf("3s into the grace period: phase %s, deletion timestamp %v; want Running and terminating", got.Status.Phase, got.DeletionTimestamp)
	}
	eventually(t, 30*time.Second, "the pod gone", func() (bool, error) {
		_, err := clientset.CoreV1().Pods(ns).Get(ctx, pod.Name, metav1.GetOptions{})
		return apierrors.IsNotFound(err), nil
	})
	if took := time.Since(deleted); took < 8*time.Second || took > 20*time.Second {
		t.Fatalf("pod gone %s after deletion; want its 10s grace period (from a second early, to late by a loaded machine's lag)", took)
	}
}

// childEnv makes the test binary a child that starts a plane, prints the
// process IDs and waits to be killed.
const childEnv = "LOCKWARDEN_PLANE_CHILD"

func runChild() {
	p, err := plane.Start(context.Background(), plane.Options{})
	if err != nil {
		fmt.Println("error:", err)
		os.Exit(1)
	}
	fmt.Println("dir", p.Dir)
	for _, proc := range p.Processes() {
		fmt.Println("pid", proc.Name, proc.PID)
	}
	fmt.Println("ready")
	select {}
}

// A plane whose parent is killed (no chance to clean up) does not outlive
// it: every process has a parent-death signal.
func TestPlaneDiesWithParent(t *testing.T) {
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), childEnv+"=1")
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var pids []int
	sc := bufio.NewScanner(out)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) == 2 && f[0] == "dir" {
			// Killed, the child cannot remove its scratch directory.
			t.Cleanup(func() { _ = os.RemoveAll(f[1]) })
		}
		if len(f) == 3 && f[0] == "pid" {
			pid, _ := strconv.Atoi(f[2])
			if pid == 0 {
				t.Errorf("no process ID found for %s", f[1])
			}
			pids = append(pids, pid)
		}
		if sc.Text() == "ready" {
			break
		}
		if strings.HasPrefix(sc.Text(), "error:") {
			t.Fatal(sc.Text())
		}
	}
	if len(pids) != 5 {
		_ = cmd.Process.Kill()
		t.Fatalf("child reported %d processes, want 5", len(pids))
	}
	_ = cmd.Process.Kill()
	_ = cmd.Wait()
	eventually(t, 10*time.Second, "every plane process gone", func() (bool, error) {
		for _, pid := range pids {
			// Signal 0 probes: ESRCH once the process is reaped.
			if pid != 0 && syscall.Kill(pid, 0) == nil && !zombie(pid) {
				return false, fmt.Errorf("pid %d still alive", pid)
			}
		}
		return true, nil
	})
}

// zombie reports whether pid has exited and awaits its reaper.
func zombie(pid int) bool {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return true
	}
	s := string(data)
	i := strings.LastIndexByte(s, ')')
	return i > 0 && len(s) > i+2 && s[i+2] == 'Z'
}
