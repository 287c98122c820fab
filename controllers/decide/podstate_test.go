package decide

import (
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func TestStarted(t *testing.T) {
	ranAt := metav1.NewTime(time.Unix(100, 0))
	for _, tc := range []struct {
		name   string
		gated  bool
		status *corev1.ContainerStatus
		want   bool
	}{
		{name: "no status yet", want: false},
		{name: "waiting to be created", status: &corev1.ContainerStatus{State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "ContainerCreating"}}}},
		{name: "running", status: &corev1.ContainerStatus{State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: ranAt}}}, want: true},
		{name: "completed", status: &corev1.ContainerStatus{State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{StartedAt: ranAt}}}, want: true},
		{name: "could not start (no start time)", status: &corev1.ContainerStatus{State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 128}}}},
		{name: "crash loop with its last state", status: &corev1.ContainerStatus{RestartCount: 1,
			State:                corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "CrashLoopBackOff"}},
			LastTerminationState: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{StartedAt: ranAt}}}, want: true},
		// V4: the kubelet may report a restart count without the last
		// state (it keeps it only for the last termination it saw).
		{name: "crash loop without its last state", status: &corev1.ContainerStatus{RestartCount: 3,
			State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "CrashLoopBackOff"}}}, want: true},
		{name: "gated", gated: true, status: &corev1.ContainerStatus{State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{}}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := pod("a", "p")
			if tc.gated {
				gated("l")(p)
			}
			if tc.status != nil {
				tc.status.Name = "app"
				p.Status.ContainerStatuses = []corev1.ContainerStatus{*tc.status}
			}
			if got := Started(p); got != tc.want {
				t.Fatalf("Started = %v, want %v", got, tc.want)
			}
		})
	}
}
