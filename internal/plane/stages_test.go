// The pod stages play what a kubelet does (getPhase and
// convertToAPIContainerStatuses in k8s.io/kubernetes/pkg/kubelet/kubelet_pods.go):
// these tests hold them to it, from every version of the pods the API
// server published.

package plane_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/utils/ptr"

	"github.com/lockwarden/lockwarden/internal/plane"
)

// history records every version of every pod of a namespace, in order.
type history struct {
	mu       sync.Mutex
	versions map[string][]*corev1.Pod
	gone     map[string]bool
	stop     func()
}

func watchPods(t *testing.T, ns string) *history {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	w, err := clientset.CoreV1().Pods(ns).Watch(ctx, metav1.ListOptions{})
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	h := &history{versions: map[string][]*corev1.Pod{}, gone: map[string]bool{}, stop: cancel}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ev := range w.ResultChan() {
			pod, ok := ev.Object.(*corev1.Pod)
			if !ok {
				continue
			}
			h.mu.Lock()
			h.versions[pod.Name] = append(h.versions[pod.Name], pod)
			if ev.Type == watch.Deleted {
				h.gone[pod.Name] = true
			}
			h.mu.Unlock()
		}
	}()
	t.Cleanup(func() { cancel(); w.Stop(); <-done })
	return h
}

func (h *history) of(name string) []*corev1.Pod {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Clone(h.versions[name])
}

func (h *history) last(name string) *corev1.Pod {
	v := h.of(name)
	if len(v) == 0 {
		return nil
	}
	return v[len(v)-1]
}

func (h *history) isGone(name string) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.gone[name]
}

func createPod(t *testing.T, pod *corev1.Pod) {
	t.Helper()
	if _, err := clientset.CoreV1().Pods(pod.Namespace).Create(context.Background(), pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

func appPod(ns, name string, policy corev1.RestartPolicy, annotations map[string]string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Annotations: annotations},
		Spec: corev1.PodSpec{
			RestartPolicy:                 policy,
			TerminationGracePeriodSeconds: ptr.To[int64](10),
			Containers:                    []corev1.Container{{Name: "work", Image: "busybox"}},
		},
	}
}

func runsOf(t *testing.T, pod *corev1.Pod) []plane.Run {
	t.Helper()
	runs, err := plane.Runs(pod)
	if err != nil {
		t.Fatal(err)
	}
	return runs
}

// describe is the runs as "container exit-code", "container running".
func describe(runs []plane.Run) string {
	var s []string
	for _, r := range runs {
		if r.End.IsZero() {
			s = append(s, r.Container+" running")
		} else {
			s = append(s, fmt.Sprintf("%s %d", r.Container, r.ExitCode))
		}
	}
	return strings.Join(s, ", ")
}

// A container that exits is restarted in the same pod, or not, as the
// kubelet decides by the restart policy; the phase follows getPhase.
func TestRestartPolicies(t *testing.T) {
	ns := newNamespace(t)
	h := watchPods(t, ns)
	cases := []struct {
		name   string
		policy corev1.RestartPolicy
		codes  string
		// what kwok played in the end
		runs     string
		phase    corev1.PodPhase
		restarts int32
	}{
		{"onfailure-fails-once", corev1.RestartPolicyOnFailure, "1,0", "work 1, work 0", corev1.PodSucceeded, 1},
		{"onfailure-succeeds", corev1.RestartPolicyOnFailure, "0", "work 0", corev1.PodSucceeded, 0},
		{"always", corev1.RestartPolicyAlways, "1,0", "work 1, work 0, work running", corev1.PodRunning, 2},
		{"never-fails", corev1.RestartPolicyNever, "1", "work 1", corev1.PodFailed, 0},
		{"never-succeeds", corev1.RestartPolicyNever, "0", "work 0", corev1.PodSucceeded, 0},
	}
	for _, tc := range cases {
		createPod(t, appPod(ns, tc.name, tc.policy, map[string]string{
			plane.ExitCodesAnnotation:     tc.codes,
			plane.CompleteDelayAnnotation: "1s",
			plane.BackoffAnnotation:       "1s",
		}))
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			eventually(t, 30*time.Second, "kwok done with the pod", func() (bool, error) {
				p := h.last(tc.name)
				return p != nil && describe(runsOf(t, p)) == tc.runs && p.Status.Phase == tc.phase, nil
			})
			p := h.last(tc.name)
			cs := p.Status.ContainerStatuses[0]
			if cs.RestartCount != tc.restarts {
				t.Errorf("restartCount %d, want %d", cs.RestartCount, tc.restarts)
			}
			versions := h.of(tc.name)
			running := false
			for _, v := range versions {
				if v.Status.Phase == corev1.PodRunning {
					running = true
				}
				// Between its first start and its last stop, a pod whose
				// container the policy restarts is Running all along.
				if running && v.Status.Phase != corev1.PodRunning && v.Status.Phase != tc.phase {
					t.Errorf("phase %s after Running, want Running until %s", v.Status.Phase, tc.phase)
				}
			}
			if tc.restarts == 0 {
				return
			}
			// The restart as the kubelet shows it: Terminated, then Waiting
			// in CrashLoopBackOff with the termination as lastState, both
			// with the pod Running, then Running with restartCount + 1.
			var seen []string
			for _, v := range versions {
				c := v.Status.ContainerStatuses
				if len(c) == 0 {
					continue
				}
				var state string
				switch s := c[0].State; {
				case s.Running != nil:
					state = fmt.Sprintf("running#%d", c[0].RestartCount)
				case s.Terminated != nil:
					state = fmt.Sprintf("terminated(%d)#%d", s.Terminated.ExitCode, c[0].RestartCount)
				case s.Waiting != nil && s.Waiting.Reason == "CrashLoopBackOff" && c[0].LastTerminationState.Terminated != nil:
					state = fmt.Sprintf("backoff(last %d)#%d", c[0].LastTerminationState.Terminated.ExitCode, c[0].RestartCount)
				default:
					state = fmt.Sprintf("%+v", s)
				}
				if v.Status.Phase != corev1.PodRunning && v.Status.Phase != tc.phase {
					state += "/" + string(v.Status.Phase)
				}
				if len(seen) == 0 || seen[len(seen)-1] != state {
					seen = append(seen, state)
				}
			}
			want := []string{"running#0", "terminated(1)#0", "backoff(last 1)#0", "running#1"}
			if got := seen; len(got) < len(want) || !slices.Equal(got[:len(want)], want) {
				t.Errorf("container states %v, want them to begin %v", got, want)
			}
			if last := cs.LastTerminationState.Terminated; last == nil || last.ExitCode != 1 && tc.policy == corev1.RestartPolicyOnFailure {
				t.Errorf("lastState %+v, want the first run's exit", cs.LastTerminationState)
			}
		})
	}
}

// Init containers run in order before the app containers, a native sidecar
// (an init container with restartPolicy Always) runs on beside them, and
// stops once they have exited for good; then the pod ends.
func TestInitContainersAndSidecar(t *testing.T) {
	ns := newNamespace(t)
	h := watchPods(t, ns)
	pod := appPod(ns, "job", corev1.RestartPolicyNever, map[string]string{
		plane.ExitCodesAnnotation:        "0",
		plane.CompleteDelayAnnotation:    "1s",
		plane.InitDelayAnnotation:        "300ms",
		plane.SidecarStopDelayAnnotation: "1s",
	})
	pod.Spec.InitContainers = []corev1.Container{
		{Name: "setup", Image: "busybox"},
		{Name: "proxy", Image: "busybox", RestartPolicy: ptr.To(corev1.ContainerRestartPolicyAlways)},
		{Name: "migrate", Image: "busybox"},
	}
	createPod(t, pod)
	eventually(t, 30*time.Second, "the pod Succeeded", func() (bool, error) {
		p := h.last("job")
		return p != nil && p.Status.Phase == corev1.PodSucceeded, nil
	})
	p := h.last("job")
	runs := runsOf(t, p)
	if got := describe(runs); got != "setup 0, proxy 0, migrate 0, work 0" {
		t.Fatalf("runs %s", got)
	}
	setup, proxy, migrate, work := runs[0], runs[1], runs[2], runs[3]
	switch {
	case proxy.Start.Before(setup.End):
		t.Errorf("the sidecar started before the first init container completed")
	case migrate.Start.Before(proxy.Start):
		t.Errorf("the second plain init container started before the sidecar")
	case work.Start.Before(migrate.End):
		t.Errorf("the app container started before the init containers completed")
	case proxy.End.Sub(work.End) < 900*time.Millisecond:
		t.Errorf("the sidecar stopped %v after the app container, want its 1s stop delay", proxy.End.Sub(work.End))
	}
	if n := len(p.Status.InitContainerStatuses); n != 3 {
		t.Fatalf("%d initContainerStatuses, want 3", n)
	}
	for _, s := range p.Status.InitContainerStatuses {
		if s.State.Terminated == nil {
			t.Errorf("init container %s: %+v, want terminated", s.Name, s.State)
		}
	}
	// While the app container ran, the sidecar ran too, and while the
	// init containers ran the pod was Pending; after the app container
	// exited, the sidecar kept the pod Running.
	for _, v := range h.of("job") {
		app := v.Status.ContainerStatuses
		if len(app) == 0 {
			continue
		}
		var sidecar *corev1.ContainerStatus
		for i := range v.Status.InitContainerStatuses {
			if v.Status.InitContainerStatuses[i].Name == "proxy" {
				sidecar = &v.Status.InitContainerStatuses[i]
			}
		}
		switch {
		case app[0].State.Waiting != nil && v.Status.Phase != corev1.PodPending:
			t.Errorf("phase %s during initialisation, want Pending", v.Status.Phase)
		case app[0].State.Running != nil && (sidecar == nil || sidecar.State.Running == nil):
			t.Errorf("the app container ran without its sidecar: %+v", sidecar)
		case app[0].State.Terminated != nil && sidecar != nil && sidecar.State.Running != nil && v.Status.Phase != corev1.PodRunning:
			t.Errorf("phase %s while the sidecar still runs, want Running", v.Status.Phase)
		}
	}
}

// Deleting a pod: its app container exits on SIGTERM after its stop delay
// (143), the sidecar later, and only then is the pod Failed and gone. One
// that ignores SIGTERM is killed at the deletion timestamp (137).
func TestGracefulDeletionStopsSidecarLast(t *testing.T) {
	ns := newNamespace(t)
	h := watchPods(t, ns)
	withSidecar := appPod(ns, "sigterm", corev1.RestartPolicyAlways, map[string]string{
		plane.StopDelayAnnotation:        "500ms",
		plane.SidecarStopDelayAnnotation: "1s",
	})
	withSidecar.Spec.InitContainers = []corev1.Container{{Name: "proxy", Image: "busybox", RestartPolicy: ptr.To(corev1.ContainerRestartPolicyAlways)}}
	createPod(t, withSidecar)
	stubborn := appPod(ns, "stubborn", corev1.RestartPolicyAlways, nil)
	stubborn.Spec.TerminationGracePeriodSeconds = ptr.To[int64](2)
	createPod(t, stubborn)
	for _, name := range []string{"sigterm", "stubborn"} {
		eventually(t, 20*time.Second, name+" Running", func() (bool, error) {
			p := h.last(name)
			return p != nil && p.Status.Phase == corev1.PodRunning, nil
		})
	}
	deleted := time.Now()
	for _, name := range []string{"sigterm", "stubborn"} {
		if err := clientset.CoreV1().Pods(ns).Delete(context.Background(), name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	for _, name := range []string{"sigterm", "stubborn"} {
		eventually(t, 20*time.Second, name+" gone", func() (bool, error) { return h.isGone(name), nil })
	}
	p := h.last("sigterm")
	runs := runsOf(t, p)
	if got := describe(runs); got != "proxy 143, work 143" {
		t.Fatalf("runs %s, want the app and the sidecar stopped by SIGTERM", got)
	}
	proxy, work := runs[0], runs[1]
	// Upper bounds below the 10 s grace period, and above a loaded
	// machine's lag.
	if d := work.End.Sub(deleted); d < 400*time.Millisecond || d > 6*time.Second {
		t.Errorf("the app container stopped %v after the deletion, want its 500ms stop delay", d)
	}
	if d := proxy.End.Sub(work.End); d < 900*time.Millisecond {
		t.Errorf("the sidecar stopped %v after the app container, want its 1s", d)
	}
	var phases []corev1.PodPhase
	for _, v := range h.of("sigterm") {
		if len(phases) == 0 || phases[len(phases)-1] != v.Status.Phase {
			phases = append(phases, v.Status.Phase)
		}
	}
	if !slices.Equal(phases, []corev1.PodPhase{corev1.PodPending, corev1.PodRunning, corev1.PodFailed}) {
		t.Errorf("phases %v, want Pending, Running, Failed", phases)
	}
	runs = runsOf(t, h.last("stubborn"))
	if got := describe(runs); got != "work 137" {
		t.Fatalf("runs %s, want the app killed", got)
	}
	if d := runs[0].End.Sub(deleted); d < time.Second || d > 6*time.Second {
		t.Errorf("killed %v after the deletion, want its 2s grace period (to the second)", d)
	}
}

// A pod deleted while its container waits in CrashLoopBackOff has nothing
// running: it ends at once, and its container does not start again.
func TestDeletedInCrashLoop(t *testing.T) {
	ns := newNamespace(t)
	h := watchPods(t, ns)
	createPod(t, appPod(ns, "crashing", corev1.RestartPolicyAlways, map[string]string{
		plane.ExitCodesAnnotation:     "1",
		plane.CompleteDelayAnnotation: "300ms",
		plane.BackoffAnnotation:       "20s",
	}))
	eventually(t, 20*time.Second, "the container in CrashLoopBackOff", func() (bool, error) {
		p := h.last("crashing")
		return p != nil && len(p.Status.ContainerStatuses) == 1 && p.Status.ContainerStatuses[0].State.Waiting != nil &&
			p.Status.ContainerStatuses[0].State.Waiting.Reason == "CrashLoopBackOff", nil
	})
	if err := clientset.CoreV1().Pods(ns).Delete(context.Background(), "crashing", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 5*time.Second, "the pod gone well within its grace period", func() (bool, error) {
		_, err := clientset.CoreV1().Pods(ns).Get(context.Background(), "crashing", metav1.GetOptions{})
		return apierrors.IsNotFound(err), nil
	})
	if got := describe(runsOf(t, h.last("crashing"))); got != "work 1" {
		t.Fatalf("runs %s, want the one run", got)
	}
}
